// The seed cost model's per-algorithm terms: what one all-reduce of each algorithm costs, in
// microseconds, from inputs derived from the topology (select/dispatch.cc, costInputs). Each
// registry row (algo/registry.h) names its entry here; the fused kernels' entries take their
// all-reduce's time and the epilogue's. A seed, not a measurement: tuning replaces every
// choice it makes. Pure host arithmetic.
#pragma once

#include <cstdint>
#include <string>

namespace anyr {

// Inputs derived from the topology: the slowest pair's measured numbers (nominal ones where a
// pair was not measured), and PCIe switch groups (GPUs whose pairs meet below the host bridge)
// whose uplinks all-to-all traffic between groups must share.
struct CostInputs {
  int nranks = 0;
  double latencyUs = 2.0;    // one-way flag latency, slowest pair
  double writeGBps = 0;      // slowest pair, peer stores (0: no peer path)
  double readGBps = 0;       // slowest pair, peer loads
  double ringGBps = 0;       // what NCCL's ring gets per hop (better direction, or host path)
  bool ncclViaHost = false;  // some pair has no peer path: NCCL's ring goes through host memory
  double crossWriteGBps = 0, crossReadGBps = 0;  // slowest pair between groups (0: one group)
  int largestGroup = 0;                          // GPUs in the largest switch group
  uint64_t pushSlotBytes = 0;                    // one-shot push capacity per launch
  uint64_t chunkBytes = 0;                       // pull / two-shot staging per launch
  // Host-memory algorithms: every rank's traffic crosses its own PCIe link to host memory
  // (writes up, reads down). Per direction, from the slowest GPU's probed PCIe generation and
  // width (nominal, derated); latency of one PCIe round trip plus a flag. Larger messages than
  // hostLaunchBytes (the agreed ANYR_HOST_LAUNCH_BYTES) run as several launches.
  double hostGBps = 0;
  double hostLatencyUs = 0;
  uint64_t hostLaunchBytes = 0;
  uint64_t hostLowLatencyBytes = 0;  // host one-shot messages up to this take one step
  uint64_t hostCopyChunkBytes = 0;   // host-copy's configured chunk
  std::string summary;               // one line, for explain
};

// Model constants shared with the inputs' derivation and the fused operations' terms.
// Latency of a kernel launch inside a graph.
constexpr double kLaunchUs = 2.0;
// Fraction of a link's bandwidth NCCL's pipelined ring reaches with every rank moving data.
constexpr double kEffNccl = 0.85;
// The fused epilogue reads x, the residual and writes residual and output: 4 bytes of local
// memory traffic per byte of message. The topology records no local memory bandwidth, so a
// nominal one is used; it weighs only fused kernel against composition.
constexpr double kLocalGBps = 3000.0;
// Host memory, as NCCL's ring through host memory sees the link (costInputs derates the
// nominal PCIe bandwidth by it), and one step: a PCIe round trip plus a flag in host memory.
constexpr double kEffHost = kEffNccl;
constexpr double kHostStepUs = 3.0;

// Time for the all-to-all traffic of one call, in microseconds: `perFlowBytes` from every rank
// to every other rank, at efficiency `eff` of the slowest pair's stores (write) or loads; each
// GPU's own link carries (n-1) flows, and each switch uplink carries g x (n - g) of them.
// < 0 when there is no such peer path.
double allToAllUs(const CostInputs& in, double perFlowBytes, bool write, double eff);

// One all-reduce of `bytes` by each algorithm, microseconds; < 0 when the model has no number
// (no bandwidth for that path).
double oneShotPushUs(double bytes, const CostInputs& in);
double oneShotPullUs(double bytes, const CostInputs& in);
double twoShotPushUs(double bytes, const CostInputs& in);
double twoShotUs(double bytes, const CostInputs& in);
double hostOneShotUs(double bytes, const CostInputs& in);
double hostTwoShotUs(double bytes, const CostInputs& in);
double hostCopyUs(double bytes, const CostInputs& in);
double ncclUs(double bytes, const CostInputs& in);

// A fused kernel (all-reduce and epilogue in one kernel) from its all-reduce's time and the
// epilogue's local traffic time (`localUs`, kLocalGBps).
double fusedOneShotPushUs(double allReduceUs, double localUs, double bytes);
double fusedTwoShotPushUs(double allReduceUs, double localUs, double bytes);

}  // namespace anyr
