// The selector's tables (select/selector.h): admission, thresholds, candidates and the seed
// table at init, and the tuning tables installed over them.
#include "select/selector.h"

#include "base/error.h"
#include "base/log.h"
#include "base/names.h"

namespace anyr {

void Selector::admit(const Topology& topo, const CommFacts& facts, int rank, int nranks) {
  rank_ = rank;
  nranks_ = nranks;
  admission_ = anyr::admit(topo, facts);
}

void Selector::setThresholds(const Topology& topo, const Config& cfg) {
  thresholds_ = defaultThresholds(topo, admission_, cfg, nranks_);
  if (nranks_ > 1 && !admission_.any()) {
    std::string reasons;
    for (int a = 1; a < anyrNumAlgos; ++a) {
      reasons += std::string("\n  ") + anyrAlgoName(static_cast<anyrAlgo_t>(a)) + ": " +
                 admission_.algo[static_cast<size_t>(a)].reason;
    }
    throwError(anyrUnsupported, "no all-reduce algorithm is admitted on this hardware:" + reasons);
  }
}

void Selector::seed(const Topology& topo, const Config& cfg, bool clusterOn,
                    const std::string& clusterReason) {
  clusterOn_ = clusterOn;
  clusterReason_ = clusterReason;
  for (int o = 0; o < kNumOps; ++o) {
    candidates_[static_cast<size_t>(o)] = candidates(static_cast<Op>(o), topo, admission_);
  }
  dispatch_ = seedTable(topo, admission_, cfg, nranks_);
  for (const Candidate& c : candidates_[static_cast<size_t>(Op::AddRmsNorm)]) {
    if (c.path.fusedKernel) fusedKernelOk_[static_cast<size_t>(c.path.algo)] = c.admitted;
  }
}

void Selector::logAdmission() const {
  for (int a = 1; a < anyrNumAlgos; ++a) {
    ANYR_LOG(
        Info, rank_,
        anyrAlgoName(static_cast<anyrAlgo_t>(a))
            << (admission_.algo[static_cast<size_t>(a)].admitted ? " admitted: " : " rejected: ")
            << admission_.algo[static_cast<size_t>(a)].reason);
  }
}

void Selector::reseed(const Topology& topo, const Config& cfg) {
  std::lock_guard<std::mutex> lock(tableMu_);
  dispatch_ = seedTable(topo, admission_, cfg, nranks_);  // drop an earlier table's choices
}

void Selector::refit(const Topology& topo, const Config& cfg) {
  std::lock_guard<std::mutex> lock(tableMu_);
  thresholds_ = defaultThresholds(topo, admission_, cfg, nranks_);
  dispatch_ = seedTable(topo, admission_, cfg, nranks_);
}

void Selector::installTuning(const TuningTable& table, const char* what, const std::string& note) {
  std::vector<std::string> warnings;
  {
    std::lock_guard<std::mutex> lock(tableMu_);
    applyTuning(table, candidates_, clusterOn_, &dispatch_, &warnings);
    tuned_ = std::make_unique<TuningTable>(table);
    tunedClusterHidden_ = table.hidden;
    tuningNote_ = note;
  }
  for (const std::string& w : warnings) ANYR_LOG(Warn, rank_, what << ": " << w);
}

}  // namespace anyr
