// Which algorithms this communicator may use (admission: a capability question, answered
// from the probed and confirmed topology by each registry row's rule, algo/registry.h; tuning
// cannot change it), and the default choice per message size (thresholds: a seed, not a
// measurement). Pure functions of agreed inputs, so every rank computes the same answer. No
// architecture names: capabilities decide.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "algo/registry.h"
#include "anyreduce/anyreduce.h"
#include "base/config.h"
#include "topology/topology.h"

namespace anyr {

struct Admission {
  std::array<AlgoAdmission, anyrNumAlgos> algo;  // index anyrAlgo_t; [anyrAlgoAuto] unused
  // Non-empty: this algorithm's fused kernel failed the startup self-test (the reason, the
  // same on every rank); its fused-kernel candidates are rejected with it (select/dispatch.h).
  std::array<std::string, anyrNumAlgos> fusedKernelFailure;
  bool any() const;
  const AlgoAdmission& operator[](anyrAlgo_t a) const { return algo[static_cast<size_t>(a)]; }
};

Admission admit(const Topology& rankTopo, const CommFacts& facts);

// The threshold ladder (Thresholds, defaultThresholds, chooseAlgo, explainChoice): the policy
// of configured size thresholds, by design over named algorithms (the one-shot and two-shot
// flavours, push or pull, and the host rung). The registry does not feed it: an algorithm
// added since is chosen by the seed cost model, tuning or forcing, never by the ladder.
struct Thresholds {
  anyrAlgo_t oneShot = anyrAlgoOneShotPush;  // preferred one-shot flavour
  std::string oneShotWhy;
  anyrAlgo_t twoShot = anyrAlgoTwoShotPush;  // preferred two-shot flavour
  std::string twoShotWhy;
  uint64_t oneShotMaxBytes = 0;
  uint64_t twoShotMaxBytes = 0;
  // Host-memory rung of the threshold ladder (used only when the configuration sets
  // oneShotMaxBytes / twoShotMaxBytes; otherwise the dispatch cost model seeds the choice),
  // where no peer-memory algorithm is admitted: host-oneshot up to hostOneShotMaxBytes,
  // host-twoshot up to hostMaxBytes, NCCL above.
  uint64_t hostOneShotMaxBytes = 0;
  uint64_t hostMaxBytes = 0;
  std::string hostWhy;
};

// The ordered pair whose measured peer writes lag its measured reads the most (the first such
// pair on ties); ratio = read / write, 0 (and -1s) when no pair has both measured. Writes count
// as much slower than reads beyond kSlowWritesRatio: the threshold ladder then pulls, and the
// seed's explanation names the pair.
struct SlowWrites {
  int src = -1, dst = -1;
  double writeGBps = 0, readGBps = 0, ratio = 0;
};
constexpr double kSlowWritesRatio = 4.0;
SlowWrites slowestWrites(const Topology& rankTopo);

// Bytes a one-shot message may have by default for `nranks`: 1 MiB for two ranks (where the
// one-shot moves no more bytes than the two-shot); above, one-shot moves (n-1) x bytes per
// rank, so the limit keeps that near 512 KiB (at least 64 KiB). Shared by the workspace layout
// and the thresholds, so they agree.
uint64_t defaultOneShotMaxBytes(int nranks);

// Seed defaults. `pushSlotBytes` is the one-shot push capacity per call (larger one-shot
// messages are chunked, so the threshold never exceeds it by default).
Thresholds defaultThresholds(const Topology& rankTopo, const Admission& adm, const Config& cfg,
                             int nranks);

// The algorithms that go through the shared pinned host segment (registry kind HostMemory).
inline bool isHostAlgo(anyrAlgo_t a) {
  const AlgoInfo* r = findAlgo(a);
  return r != nullptr && r->kind == AlgoKind::HostMemory;
}

// True when some peer-memory algorithm (registry kind PeerMemory) is admitted. The
// seed then never picks a host-memory algorithm (they stay admitted candidates, for tuning and
// forcing): peer paths keep the seed where they exist.
bool peerPathAdmitted(const Admission& adm);

// The algorithm for one call. `forced` (config, environment or anyrCommSetAlgorithm) wins and
// must already have been checked against admission.
anyrAlgo_t chooseAlgo(const Admission& adm, const Thresholds& th, uint64_t bytes,
                      anyrAlgo_t forced);

// One line: the choice for `bytes` and why.
std::string explainChoice(const Admission& adm, const Thresholds& th, uint64_t bytes,
                          anyrAlgo_t forced);

}  // namespace anyr
