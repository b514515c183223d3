// Dispatch: for every operation and message-size bucket, the path a call takes.
//
// Three layers, kept apart (docs/DESIGN.md, "Dispatch"):
//   1. candidates()  - admission: which paths the probed capabilities allow, each rejected one
//                      with its reason. A capability question; tuning cannot change it.
//   2. seedTimeUs()  - the seed cost model: latency + bytes / bandwidth per link, from the
//                      topology's measured (or nominal) numbers. A default, not a measurement.
//   3. TuningTable   - measured choices (select/tuning.h), agreed by every rank.
// The DispatchTable holds the result: an O(1) lookup per call by (operation, log2 bucket).
// Everything here is a pure function of agreed inputs, so every rank computes the same answer,
// and every function can be tested on a machine without GPUs. No architecture names.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "algo/cost.h"
#include "algo/registry.h"
#include "anyreduce/anyreduce.h"
#include "base/config.h"
#include "select/admission.h"
#include "topology/topology.h"

namespace anyr {

enum class Op : int { AllReduce = 0, AddRmsNorm = 1, AddRmsNormQuant = 2 };
constexpr int kNumOps = 3;
const char* opName(Op op);  // "allreduce", "add-rmsnorm", "add-rmsnorm-quant"
bool parseOp(const std::string& name, Op* out);

// One way to run an operation. For all-reduce, the algorithm. For the fused operation, the
// all-reduce algorithm and whether its fused kernel (all-reduce and epilogue in one kernel) or
// the composition (all-reduce, then the standalone add+RMSNorm kernel) runs; for a fused
// kernel also the thread-block cluster size, where a measurement chose one (fused_algo.h:
// 0 = the automatic rule, 1 = a block per row, 2/4/8 = clusters of that many blocks).
struct Path {
  anyrAlgo_t algo = anyrAlgoAuto;
  bool fusedKernel = false;
  int cluster = 0;
  bool operator==(const Path& o) const {
    return algo == o.algo && fusedKernel == o.fusedKernel && cluster == o.cluster;
  }
  bool operator!=(const Path& o) const { return !(*this == o); }
  bool sameKernel(const Path& o) const { return algo == o.algo && fusedKernel == o.fusedKernel; }
};
// The cluster sizes a Path may carry besides 0 (the rule): 1, 2, 4, 8.
bool pathClusterValid(int cluster);
// "twoshot-push" (all-reduce); "fused:oneshot-push" / "nccl+epilogue" (fused operations);
// "fused:oneshot-push/c2" (a fused kernel in clusters of 2; "/c1": a block per row).
std::string pathName(Op op, Path p);
bool parsePath(Op op, const std::string& name, Path* out);

// Size buckets: bucket b holds sizes in (2^(b-1), 2^b] bytes; bucket 0 holds 0 and 1.
constexpr int kNumBuckets = 41;  // up to 1 TiB; larger sizes use the last bucket
inline int bucketOf(uint64_t bytes) {
  if (bytes <= 1) return 0;
  int b = 64 - __builtin_clzll(bytes - 1);
  return b < kNumBuckets ? b : kNumBuckets - 1;
}
inline uint64_t bucketBytes(int b) { return 1ull << b; }  // the size a bucket is measured at

// The candidates of an operation, admitted or rejected (with reasons), in a fixed order
// (the order breaks ties, so it is part of the agreement).
struct Candidate {
  Path path;
  bool admitted = false;
  std::string reason;
};
std::vector<Candidate> candidates(Op op, const Topology& rankTopo, const Admission& adm);

// ---- Seed cost model -------------------------------------------------------------------------
// CostInputs and the per-algorithm terms: algo/cost.h (each registry row names its entry).
CostInputs costInputs(const Topology& rankTopo, const Config& cfg, int nranks);

// Modelled time of one call, microseconds; < 0 when the model has no number (path not
// admitted: no bandwidth).
double seedTimeUs(Op op, Path p, uint64_t bytes, const CostInputs& in);

// ---- The table a call looks up ---------------------------------------------------------------
// Where a bucket's choice came from: the cost model, configured thresholds, a measurement of
// this bucket, or the measurement of the nearest measured bucket ("nearest").
enum class Source : uint8_t { Seed = 0, Thresholds = 1, Measured = 2, NearestMeasured = 3 };
const char* sourceName(Source s);

struct DispatchTable {
  std::array<std::array<Path, kNumBuckets>, kNumOps> path{};
  std::array<std::array<Source, kNumBuckets>, kNumOps> source{};
  // O(1), no allocation, no synchronization: what every call does.
  Path lookup(Op op, uint64_t bytes) const {
    return path[static_cast<size_t>(op)][static_cast<size_t>(bucketOf(bytes))];
  }
};

// The seed table: per bucket the admitted candidate with the least modelled time (host-memory
// candidates only where no peer path is admitted), or, when
// the configuration sets size thresholds (oneShotMaxBytes / twoShotMaxBytes), the threshold
// ladder of chooseAlgo() for every operation (the fused ones then use their fused kernel where
// the ladder picks one-shot push, as before the cost model).
DispatchTable seedTable(const Topology& rankTopo, const Admission& adm, const Config& cfg,
                        int nranks);

// The path a forced algorithm (config, ANYR_ALGO, anyrCommSetAlgorithm, --algo) gives `op`.
Path forcedPath(Op op, anyrAlgo_t forced);

// "" if `algo` may be forced on this communicator, else the error: why it is not admitted.
std::string overrideError(const Admission& adm, anyrAlgo_t algo);

// ---- Agreement -------------------------------------------------------------------------------
// perRank[r][c]: rank r's time for candidate c at one point (< 0: failed or not measured).
// A candidate counts with its slowest rank's time; one that failed on any rank is out. Returns
// the index of the fastest, ties to the lowest index; -1 if none was measured on every rank.
// A pure function: ranks given the same gathered timings choose the same candidate.
int agreeChoice(const std::vector<std::vector<double>>& perRank, std::vector<double>* slowest);
// The same, where candidate 0 is a baseline that stays unless another beats it by more than
// `margin` (a fraction of the baseline's time): a variant measured no faster than the spread
// is not taken. Returns agreeChoice's answer where the baseline failed on some rank.
int agreeOverBaseline(const std::vector<std::vector<double>>& perRank, double margin,
                      std::vector<double>* slowest);

}  // namespace anyr
