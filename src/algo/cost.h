// The seed cost model's per-algorithm terms: what one all-reduce of each algorithm costs, in
// microseconds, from inputs derived from the topology (select/dispatch.cc, costInputs). Each
// registry row (algo/registry.h) names its entry here; the fused kernels' entries take their
// all-reduce's time and the epilogue's. A seed, not a measurement: tuning replaces every
// choice it makes. Pure host arithmetic.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace anyr {

// Inputs derived from the topology: the slowest pair's measured numbers (nominal ones where a
// pair was not measured), and PCIe switch groups (GPUs whose pairs meet below the host bridge)
// whose uplinks all-to-all traffic between groups must share.
struct CostInputs {
  int nranks = 0;
  double latencyUs = 2.0;  // one-way flag latency of the slowest pair, idle
  // One synchronisation round of the peer kernels under load: every rank raises a flag at every
  // peer and waits for all of theirs. Measured (Topology::load) at this world size, else the
  // idle latency plus a per-peer term of the slowest link type (kLoadedPerPeerUs): flags queue
  // behind each other and behind data on PCIe, where an idle 0.4 us becomes 6-7 us at 8 GPUs.
  double syncUs = 2.0;
  // NCCL's ring hop: a flag passed to the neighbour, all ranks at once (a fixture's figure, else
  // NCCL's by link type).
  double ringHopUs = 0.75;
  // Our kernels' round with one partner (the staged and doubling pushes' round, the ring's
  // hand-off): 1 KB and a flag to one peer and a wait for one, every rank at once. Measured at
  // init (Topology::load, hopUs; hopMeasured), else NCCL's hop on that link; never less than
  // the slowest pair's idle latency.
  double hopUs = 0.8;
  bool hopMeasured = false;
  // Per GPU, storing into every peer at once (measured all-to-all; 0: derived from the pairs).
  double allToAllGBps = 0;
  bool loadMeasured = false;  // syncUs / allToAllGBps / ringHopUs / hopUs came from Topology::load
  double writeGBps = 0;       // slowest pair, peer stores (0: no peer path)
  double readGBps = 0;        // slowest pair, peer loads
  double ringGBps = 0;        // what NCCL's ring gets per hop (better direction, or host path)
  // The ring algorithm's: per GPU, storing to its ring neighbours with every GPU doing so (the
  // ring measured under load, else the slowest neighbour pair's stores x kEffRing).
  double ringWriteGBps = 0;
  // ring-copy's: per GPU, its copy engine pulling from the ring neighbour with every GPU doing
  // so (measured under load; 0: not measured, derived from the peer reads).
  double ringCopyGBps = 0;
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
  // The two-level all-reduce (islands.cu) over its islands (topology/islands.h): how many, the
  // ranks of the smallest and the largest, the most ranks of other islands one rank writes to,
  // the slowest pair's peer writes inside an island and between islands, the per-GPU rate of
  // storing into every peer of its island at once where measured at this world size
  // (Topology::load, islandGBps; else 0), and the most bytes one launch carries.
  int islandCount = 0;
  int islandMin = 0, islandMax = 0;
  int islandCrossPeers = 0;
  double islandWriteGBps = 0, islandCrossWriteGBps = 0;
  double islandLoadGBps = 0;
  uint64_t islandLaunchBytes = 0;
  // The doubling push (doubling_push.cu): its partner order (algo/doubling_schedule.h, from the
  // islands), and each rank's PCIe switch group (the one whose uplink its flows out of the group
  // share; one group per GPU where none was found), so that a round's flows across uplinks are
  // counted as the kernel sends them.
  uint32_t doublingOrder = 0;
  std::vector<int> groupOf;
  // Per round of the doubling push, the slowest peer-write rate among the pairs that round
  // writes over (its partners; 0: not known, the slowest pair's writeGBps is used).
  std::vector<double> doublingRoundGBps;
  std::string summary;  // one line, for explain
};

// Model constants shared with the inputs' derivation and the fused operations' terms.
// Latency of a kernel launch inside a graph.
constexpr double kLaunchUs = 2.0;
// A second kernel right behind the first in the same graph (the composition's epilogue).
constexpr double kSecondKernelUs = 1.5;
// The add + RMSNorm epilogue's fixed cost (a block-wide reduction per row, the weight's load),
// in the standalone kernel and inside the fused ones alike.
constexpr double kEpilogueUs = 1.6;
// Idle one-way flag latency by link type where no pair was measured.
constexpr double kNvlinkLatencyUs = 0.8;
constexpr double kPcieLatencyUs = 0.45;
// What each further peer adds to a synchronisation round under load, by the slowest link
// type among the peer paths. PCIe: published 8 x RTX PRO 6000 figures, 0.36-0.45 us idle
// against 6.0-7.4 us at 8 GPUs and 2.1-4.1 at 4 (tests/fixtures/rtxpro6000_8gpu_switches.json).
constexpr double kLoadedPerPeerPcieUs = 0.85;
constexpr double kLoadedPerPeerNvlinkUs = 0.05;
// NCCL's ring hop (LL protocol) by link type where none was measured.
constexpr double kNcclHopNvlinkUs = 0.75;
constexpr double kNcclHopPcieUs = 1.3;
constexpr double kNcclHopHostUs = 2.3;
// Fraction of a link's bandwidth NCCL's pipelined ring reaches with every rank moving data:
// its LL protocol (8 bytes of data in 16) and its LL128 / simple protocols.
constexpr double kEffNcclLL = 0.3;
constexpr double kEffNccl = 0.7;
// Fraction of a pair's store bandwidth, measured alone, that each GPU keeps when every GPU
// stores to its ring neighbours at once (where the ring was not measured under load): taken as
// the two-shot's all-at-once fraction for lack of a measurement of its own.
constexpr double kEffRing = 0.8;
// The fused epilogue reads x, the residual and writes residual and output: 4 bytes of local
// memory traffic per byte of message. The topology records no local memory bandwidth, so a
// nominal one is used; it weighs only fused kernel against composition.
constexpr double kLocalGBps = 3000.0;
// Host memory, as NCCL's ring through host memory sees the link (costInputs derates the
// nominal PCIe bandwidth by it), and one step: a PCIe round trip plus a flag in host memory.
constexpr double kEffHost = 0.85;
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
double stagedPushUs(double bytes, const CostInputs& in);
double stagedPullUs(double bytes, const CostInputs& in);
double islandsUs(double bytes, const CostInputs& in);
double doublingPushUs(double bytes, const CostInputs& in);
double hostOneShotUs(double bytes, const CostInputs& in);
double hostTwoShotUs(double bytes, const CostInputs& in);
double hostCopyUs(double bytes, const CostInputs& in);
double ringUs(double bytes, const CostInputs& in);
double ringCopyUs(double bytes, const CostInputs& in);
double ncclUs(double bytes, const CostInputs& in);

// A fused kernel (all-reduce and epilogue in one kernel) from its all-reduce's time and the
// epilogue's local traffic time (`localUs`, kLocalGBps); kEpilogueUs is added by the caller.
double fusedOneShotPushUs(double allReduceUs, double localUs, double bytes);
double fusedTwoShotPushUs(double allReduceUs, double localUs, double bytes);
double fusedOneShotPullUs(double allReduceUs, double localUs, double bytes);
double fusedTwoShotPullUs(double allReduceUs, double localUs, double bytes);

}  // namespace anyr
