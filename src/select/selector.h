// The selector: which path each call takes. Holds what admission allowed (agreed at init, then
// narrowed by the startup self-test), the size thresholds, the candidates per operation, the
// dispatch table (seeded, or measured by tuning), the algorithm forced by configuration or
// anyrCommSetAlgorithm, and the paths forced by tuning and `bench --check-dispatch`. The
// per-call decision (pathFor, fusedKernelFor) is in select/decide.cc.
//
// Locking: the dispatch table and what tuning installed in it (table, tuned, tunedClusterHidden,
// tuningNote) are rewritten by anyrCommTune under the communicator's call guard, and read by the
// calls under the same guard; explain and the algorithm query take no guard (they must not be
// refused while a call runs), so they and tune's writes take tableMu().
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "anyreduce/anyreduce.h"
#include "base/config.h"
#include "select/admission.h"
#include "select/dispatch.h"
#include "select/tuning.h"
#include "topology/topology.h"

namespace anyr {

class Selector {
 public:
  Selector() = default;
  Selector(const Selector&) = delete;
  Selector& operator=(const Selector&) = delete;

  // ---- At init (selector.cc), in this order ----
  // Admission from the agreed topology and facts; `rank` names this rank in the log.
  void admit(const Topology& topo, const CommFacts& facts, int rank, int nranks);
  // The admission the startup self-test narrows (a path that failed it is disabled).
  Admission& admission() { return admission_; }
  const Admission& admission() const { return admission_; }
  // After the self-test: the size thresholds; throws anyrUnsupported (naming every algorithm's
  // reason) when a communicator of several ranks admits none.
  void setThresholds(const Topology& topo, const Config& cfg);
  const Thresholds& thresholds() const { return thresholds_; }
  // Candidates per operation and the seed table (select/dispatch.h); which fused kernels are
  // admitted. `clusterOn`/`clusterReason`: whether thread-block clusters are available (forced
  // paths and tuning tables with a cluster size need them). A tuning table may replace the
  // seed's choices (installTuning).
  void seed(const Topology& topo, const Config& cfg, bool clusterOn,
            const std::string& clusterReason);
  void logAdmission() const;  // one line per algorithm: admitted or rejected, and why

  // ---- Per call (decide.cc) ----
  // The path a call of `op` with `bytes` takes: a forced path, else a forced algorithm, else
  // the table. O(1); no synchronization. `hidden`: the row width of a fused call, which keeps
  // a measured cluster size only at the width the table was measured at (0: keep it).
  Path pathFor(Op op, uint64_t bytes, int hidden = 0) const;
  // Whether a fused call on `path` runs its fused kernel (else the composition: all-reduce,
  // then the standalone epilogue): an admitted kernel that passed the self-test, at least one
  // row per launch (maxRows), and a row the kernel holds in registers unless forced.
  bool fusedKernelFor(const Path& path, uint64_t maxRows, int hidden) const;
  // The algorithm forced by configuration, ANYR_ALGO or anyrCommSetAlgorithm (auto: none).
  anyrAlgo_t forced() const { return static_cast<anyrAlgo_t>(forced_.load()); }
  bool algoForced() const { return forced_.load() != anyrAlgoAuto; }
  void setForced(anyrAlgo_t algo) { forced_.store(algo); }
  // Internal (tuning, `bench --check-dispatch`): force one path of one operation; `clear`
  // restores dispatch. Throws for a path not admitted.
  void forcePath(Op op, Path p);
  void clearForcedPath(Op op);

  // ---- Tables ----
  const std::vector<Candidate>& candidatesOf(Op op) const {
    return candidates_[static_cast<size_t>(op)];
  }
  const DispatchTable& dispatchTable() const { return dispatch_; }
  const TuningTable* tuned() const { return tuned_.get(); }
  int tunedClusterHidden() const { return tunedClusterHidden_; }
  const std::string& tuningNote() const { return tuningNote_; }
  void setTuningNote(const std::string& note) { tuningNote_ = note; }
  void appendTuningNote(const std::string& more) { tuningNote_ += more; }
  std::mutex& tableMu() const { return tableMu_; }
  // Takes tableMu(): the seed table again, dropping an earlier table's choices (before tuning
  // installs a new one).
  void reseed(const Topology& topo, const Config& cfg);
  // Takes tableMu(): the thresholds and the seed table again from a topology whose measured
  // figures changed (the fabric measured again for tuning); admission stays.
  void refit(const Topology& topo, const Config& cfg);
  // Applies a tuning table (agreed by every rank) over the current dispatch table and keeps it
  // for explain; `what` prefixes its warnings in the log. Takes tableMu().
  void installTuning(const TuningTable& table, const char* what, const std::string& note);

 private:
  int rank_ = -1;
  int nranks_ = 0;
  bool clusterOn_ = false;
  std::string clusterReason_;
  Admission admission_;
  Thresholds thresholds_;
  std::atomic<int> forced_{anyrAlgoAuto};
  std::array<std::vector<Candidate>, kNumOps> candidates_;
  std::array<std::atomic<int>, kNumOps> forcedPath_{};  // -1: none; else algo | kernel << 8
  std::array<bool, anyrNumAlgos> fusedKernelOk_{};      // fused kernel of this algorithm admitted
  mutable std::mutex tableMu_;
  DispatchTable dispatch_{};
  std::unique_ptr<TuningTable> tuned_;
  int tunedClusterHidden_ = 0;  // the installed table's hidden (its cluster sizes hold there)
  std::string tuningNote_;
};

}  // namespace anyr
