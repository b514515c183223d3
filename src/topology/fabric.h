// The fabric a communicator measured (core/fabric.h measures it; this is its record): per
// ordered pair the idle peer write and read bandwidth and the flag latency, and the fabric
// under load at the communicator's world size (Topology::load). Each rank measures its own row
// (the pairs it is the source of) and its own figures under load; the rows are gathered through
// the bootstrap and combined here by a pure function, so every rank holds the same record and
// makes the same choices from it. Persisted with the tuning table (select/tuning.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "device/handles.h"
#include "topology/topology.h"

namespace anyr {

// One rank's measurement as it crosses the bootstrap: a fixed layout, the same on every rank.
// A figure that was not measured is < 0.
struct FabricRow {
  static constexpr int kWhyBytes = 192;
  static constexpr int kHostWhyBytes = 128;
  enum : int32_t { kOk = 0, kFailed = 1, kWaitFailed = 2 };
  int32_t status;  // kOk; kFailed: this rank failed on its own; kWaitFailed: a wait for `peer`
  int32_t peer;    // with kWaitFailed: the rank waited for; else -1
  // The step through the host memory where a peer workspace was measured too: its failure
  // leaves only the host figures unmeasured (the same codes; hostWhy says what failed).
  int32_t hostStatus;
  int32_t hostPeer;
  double writeGBps[kMaxLocalRanks];  // this rank's kernel storing into each peer's staging
  double readGBps[kMaxLocalRanks];   // this rank's kernel loading from each peer's staging
  double latencyUs[kMaxLocalRanks];  // half a flag round trip to each peer's memory
  double allToAllGBps;               // storing into every peer at once, every rank at once
  double ringGBps;                   // storing into the ring neighbour, every rank at once
  double syncUs;                     // one round: 1 KB and a flag to every peer, wait for all
  double hopUs;                      // one round: 1 KB and a flag to the next rank, wait for one
  // Storing into every other member of its island at once, every rank at once; 0 where its
  // island has no other member (nothing to measure).
  double islandGBps;
  // This rank's copy engine pulling from the previous rank's memory, every rank at once (what
  // ring-copy's pulls do).
  double ringCopyGBps;
  // Through the host memory: the copy engines both ways at once (the slower direction), and a
  // synchronisation round (topology.h, FabricLoad::hostGBps / hostStepUs).
  double hostGBps;
  double hostStepUs;
  double elapsedMs;     // this rank's time in the measurement
  char why[kWhyBytes];  // with a failure: what failed, NUL-terminated
  char hostWhy[kHostWhyBytes];
};
static_assert(sizeof(FabricRow) == 16 + 3 * 8 * kMaxLocalRanks + 9 * 8 + FabricRow::kWhyBytes +
                                       FabricRow::kHostWhyBytes,
              "FabricRow layout");

// An empty row: status kOk, every figure unmeasured.
FabricRow emptyFabricRow();
// Records a failure in `row` (the first one recorded stays): kFailed, or kWaitFailed naming
// the rank waited for (`peer` >= 0).
void failFabricRow(FabricRow* row, const std::string& why, int peer = -1);
// The same for the step through the host memory alone (hostStatus, hostPeer, hostWhy).
void failFabricHost(FabricRow* row, const std::string& why, int peer = -1);

struct FabricRecord {
  enum class State {
    Off,          // ANYR_FABRIC=off
    NotMeasured,  // no peer workspace, no cached record (cached mode), or the measurement failed
    Measured,     // measured by this communicator
    Cached,       // a record cached with the tuning table
  };
  State state = State::NotMeasured;
  int ranks = 0;
  std::string source;    // "measured at init (4 ranks)", "measured by anyrCommTune (4 ranks)"
  std::string cachedIn;  // State::Cached: the file it came from
  // Why not measured; why figures that were measured are not applied; or, where the figures
  // are applied, what was left out (the fabric under load where a pair failed its transfer
  // check). "" when there is nothing to say.
  std::string reason;
  bool applied = false;  // the figures are in the communicator's topology
  double measureMs = 0;  // how long the measurement took (its slowest rank) when it was made
  // ranks x ranks, row-major by source rank (the diagonal unmeasured); < 0: not measured.
  std::vector<double> writeGBps, readGBps, latencyUs;
  FabricLoad load;  // ranks 0 when nothing under load was measured

  bool hasFigures() const { return state == State::Measured || state == State::Cached; }
  double at(const std::vector<double>& m, int src, int dst) const {
    return m[static_cast<size_t>(src * ranks + dst)];
  }
};

const char* fabricStateName(FabricRecord::State s);  // "off", "not measured", ...

// The agreed record from every rank's row (rows[r] is rank r's): a pure function of the rows,
// so every rank that holds them computes the same record. Where any rank failed, nothing is
// measured: the state is NotMeasured and the reason names the first rank that failed on its
// own (else the first whose wait failed) and what failed. Otherwise pair (s, d) takes rank s's
// figures; under load the worst rank counts (the least bandwidth, the longest round); a figure
// that is not finite and positive is unmeasured, and a figure under load that some rank did not
// measure is unmeasured. The island figure counts only the ranks whose island has other members
// (a row's 0 is an island of one) and was measured over `islands` (Islands::text(); "" where
// there were no islands to measure). `source` names the measurement ("measured at init (N
// ranks)").
FabricRecord combineFabric(const std::vector<FabricRow>& rows, const std::string& source,
                           const std::string& islands = "");

// Writes an applied record's figures into `t` (pair write/read bandwidth and latency where
// measured, and Topology::load where measured); nothing for a record that is not applied or
// has no figures. Pairs and load the record does not measure keep what `t` had.
void applyFabric(const FabricRecord& r, Topology* t);
// The measured figures of `t` back to unmeasured: every pair's write/read bandwidth and
// latency, and the load (before another record is applied).
void clearFabricFigures(Topology* t);

// One line for explain and the log: the state, where the figures came from, their ranges and
// whether admission and the seed use them ("measured at init (4 ranks) in 12.3 ms: ...").
std::string fabricSummary(const FabricRecord& r);

// JSON of the record (explain; the tuning table's "fabric"), and back. fabricFromJson reads
// what a tuning table caches (ranks, source, measureMs, the matrices, load, and cachedIn where
// present) and throws anyrInvalidArgument naming the first bad field ("fabric.writeGBps: ...");
// the result's state is Cached, applied false, reason empty (the communicator that installs it
// decides those).
std::string fabricToJson(const FabricRecord& r, int indent = 2);
FabricRecord fabricFromJson(const std::string& text);

// A hash of the figures and texts of a record: ranks that hold the same record hash the same.
uint64_t fabricHash(const FabricRecord& r);

}  // namespace anyr
