// Tuning's measurements: measures each admitted path of each operation at a plan of sizes (every
// rank; the slowest rank counts, rank 0 decides and broadcasts) and installs the result in the
// selector. Also loads the tuning table at init (config.tuningFile), or tunes then
// (config.tuneBudgetMs). Runs the communicator's own calls, so it lives above the selector.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "select/dispatch.h"
#include "select/tuning.h"

namespace anyr {

class Communicator;
struct CommContext;
class Selector;
class Capabilities;

struct TuneOptions {
  uint64_t minBytes = 1024, maxBytes = 256ull << 20;  // all-reduce sizes, powers of two
  int hidden = 6144, maxTokens = 2048;                // fused: 1, 2, 4 .. maxTokens tokens
  int budgetMs = 0;                                   // 0: no limit
  int calls = 20, samples = 9;                        // per sample (one graph), median
};
using TuneProgress = std::function<void(int done, int total, const std::string& what)>;

class Tuner {
 public:
  explicit Tuner(Communicator& c);

  // At init (collective): rank 0 reads config.tuningFile and every rank installs the same table;
  // else, with a budget, tunes (Communicator::tune) and rank 0 saves the result.
  void loadOrTuneAtInit();
  // Communicator::tune's body, under its call guard: measures, agrees and installs; returns the
  // table. `progress` is called on rank 0 only.
  TuningTable tuneHealthy(const TuneOptions& o, const TuneProgress& progress);
  // The settings a tuning table records beside the machine (select/tuning.h): the agreed ones
  // that shape kernels, hence the times a table holds.
  std::vector<std::string> tuningSettings() const;

 private:
  double timePath(Op op, uint64_t bytes, int tokens, int hidden, void* const* bufs, int calls,
                  int samples, cudaStream_t s);
  // After a fused kernel won a point: its cluster sizes measured against the automatic rule
  // (FusedPlan::clusterSizesToMeasure); a size that wins goes into tp->choice ("/cN").
  void tuneClusterSize(Op op, Path chosen, int tokens, const TuneOptions& o, void* const* bufs,
                       cudaStream_t s, TunedPoint* tp, int* done, int* total,
                       const TuneProgress& progress);

  Communicator& c_;
  CommContext& ctx_;
  Selector& sel_;
  const Capabilities& caps_;
};

}  // namespace anyr
