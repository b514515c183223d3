// The algorithm registry's table (algo/registry.h): one row per algorithm, with the admission
// rules the rows share.
#include "algo/registry.h"

#include <array>
#include <string>
#include <utility>

#include "algo/doubling_schedule.h"
#include "base/config.h"
#include "base/error.h"
#include "base/names.h"
#include "fused/fused.h"
#include "topology/islands.h"

// Host-only builds of the selection code (the fuzz targets, scripts/fuzz.sh) link no kernel:
// compiled with ANYR_HOST_ONLY, the rows' launchers and resident functions are null there.
#ifdef ANYR_HOST_ONLY
#define ANYR_KERNEL_FN(f) nullptr
#else
#define ANYR_KERNEL_FN(f) f
#endif

namespace anyr {

// The launchers and resident-blocks functions, each defined in its algorithm's file.
// oneshot_push.cu
cudaError_t launchOneShotPush(anyrDataType_t dtype, const AllReduceArgs& a,
                              const LaunchShape& shape, cudaStream_t stream);
cudaError_t oneShotPushResidentPerSm(int* least);
// oneshot_pull.cu
cudaError_t launchOneShotPull(anyrDataType_t dtype, const AllReduceArgs& a,
                              const LaunchShape& shape, cudaStream_t stream);
cudaError_t oneShotPullResidentPerSm(int* least);
// twoshot_push.cu
cudaError_t launchTwoShotPush(anyrDataType_t dtype, const AllReduceArgs& a,
                              const LaunchShape& shape, cudaStream_t stream);
cudaError_t twoShotPushResidentPerSm(int* least);
// twoshot.cu
cudaError_t launchTwoShot(anyrDataType_t dtype, const AllReduceArgs& a, const LaunchShape& shape,
                          cudaStream_t stream);
cudaError_t twoShotResidentPerSm(int* least);
// staged_push.cu
cudaError_t launchStagedPush(anyrDataType_t dtype, const AllReduceArgs& a, const LaunchShape& shape,
                             cudaStream_t stream);
cudaError_t stagedPushResidentPerSm(int* least);
// doubling_push.cu
cudaError_t launchDoublingPush(anyrDataType_t dtype, const AllReduceArgs& a,
                               const LaunchShape& shape, cudaStream_t stream);
cudaError_t doublingPushResidentPerSm(int* least);
// staged_pull.cu
cudaError_t launchStagedPull(anyrDataType_t dtype, const AllReduceArgs& a, const LaunchShape& shape,
                             cudaStream_t stream);
cudaError_t stagedPullResidentPerSm(int* least);
// islands.cu
cudaError_t launchIslands(anyrDataType_t dtype, const AllReduceArgs& a, const LaunchShape& shape,
                          cudaStream_t stream);
cudaError_t islandsResidentPerSm(int* least);
// ring.cu
cudaError_t launchRing(anyrDataType_t dtype, const AllReduceArgs& a, const LaunchShape& shape,
                       cudaStream_t stream);
cudaError_t ringResidentPerSm(int* least);
// ring_copy.cu
cudaError_t launchRingCopy(anyrDataType_t dtype, const AllReduceArgs& a, const LaunchShape& shape,
                           const RingCopyStreams& s, cudaStream_t stream);
// host_oneshot.cu, and host_oneshot_ll.cu: its low-latency protocol (native wire, small
// launches); a.wire selects the wire format.
cudaError_t launchHostOneShot(anyrDataType_t dtype, const HostArgs& a, const LaunchShape& shape,
                              cudaStream_t stream);
cudaError_t launchHostOneShotLL(anyrDataType_t dtype, const HostArgs& a, const LaunchShape& shape,
                                cudaStream_t stream);
// host_twoshot.cu
cudaError_t launchHostTwoShot(anyrDataType_t dtype, const HostArgs& a, const LaunchShape& shape,
                              cudaStream_t stream);
// host_copy.cu: one launch (a piece of at most layout.launchBytes); `shape` is the reduction
// kernels' grid.
cudaError_t launchHostCopy(anyrDataType_t dtype, const HostCopyArgs& a, const LaunchShape& shape,
                           const HostCopyStreams& s, cudaStream_t stream);

const char* algoKindName(AlgoKind k) {
  static constexpr Named<AlgoKind> kNames[] = {{AlgoKind::PeerMemory, "peer-memory"},
                                               {AlgoKind::HostMemory, "host-memory"},
                                               {AlgoKind::Nccl, "nccl"}};
  return nameOf(kNames, k, "?");
}

namespace {

// ---- Admission rules -------------------------------------------------------------------------

// First ordered pair that fails `ok`, as "rank a -> rank b", or "" if none.
template <typename F>
std::string firstFailingPair(const Topology& t, F ok) {
  for (int s = 0; s < t.size(); ++s) {
    for (int d = 0; d < t.size(); ++d) {
      if (s != d && !ok(t.pair(s, d))) {
        return "rank " + std::to_string(s) + " -> rank " + std::to_string(d);
      }
    }
  }
  return "";
}

// Peer-mapped algorithms share the structural conditions, then need every ordered pair to have
// passed its peer-write and/or peer-read transfer check.
AlgoAdmission admitPeer(const Topology& t, const CommFacts& f, bool needsWrite, bool needsRead) {
  AlgoAdmission x;
  if (f.nranks > kMaxLocalRanks) {
    x.reason = "world size " + std::to_string(f.nranks) + " exceeds " +
               std::to_string(kMaxLocalRanks) + " peer-mapped ranks";
    return x;
  }
  if (!f.sameHost) {
    x.reason = "ranks are on more than one host";
    return x;
  }
  if (!f.peerMemory) {
    x.reason = "no peer-mapped workspace: " + f.peerMemoryReason;
    return x;
  }
  if (t.size() != f.nranks) {
    x.reason = "topology has " + std::to_string(t.size()) + " GPUs for " +
               std::to_string(f.nranks) + " ranks";
    return x;
  }
  if (needsWrite) {
    std::string bad = firstFailingPair(t, [](const PairInfo& p) { return p.peerWriteOk; });
    if (!bad.empty()) {
      x.reason = "peer write " + bad + " failed its transfer check or is not mapped";
      return x;
    }
  }
  if (needsRead) {
    std::string bad = firstFailingPair(t, [](const PairInfo& p) { return p.peerReadOk; });
    if (!bad.empty()) {
      x.reason = "peer read " + bad + " failed its transfer check or is not mapped";
      return x;
    }
  }
  x.admitted = true;
  x.reason = std::string("every pair passed its peer-") + (needsWrite ? "write" : "read") +
             " check (no peer atomics needed)";
  return x;
}

// Peer stores into every peer's workspace (the push forms).
AlgoAdmission admitPeerWrites(const Topology& t, const CommFacts& f) {
  return admitPeer(t, f, true, false);
}

// Peer loads from every peer's workspace (the pull forms).
AlgoAdmission admitPeerReads(const Topology& t, const CommFacts& f) {
  return admitPeer(t, f, false, true);
}

// The two-level all-reduce: the peer algorithms' structural conditions, at least two islands
// (topology/islands.h: forced, or the topology's), and a confirmed peer write on every pair it
// writes over (inside each island, and each slice's owners across islands). It reads only its
// own workspace.
AlgoAdmission admitIslands(const Topology& t, const CommFacts& f) {
  AlgoAdmission x = admitPeer(t, f, false, false);
  if (!x.admitted) return x;
  x.admitted = false;
  const std::string cover = islandsCoverError(f.islands, f.nranks);
  if (!cover.empty()) {
    x.reason = "ANYR_ISLANDS=" + islandsText(f.islands) + ": " + cover;
    return x;
  }
  const Islands is = islandsOf(t, f.islands, f.nranks);
  if (is.count() < 2) {
    x.reason = "one island (" + is.source +
               "): nothing to exchange between islands (ANYR_ISLANDS forces a layout)";
    return x;
  }
  for (const auto& [s, d] : islandWritePairs(is)) {
    if (!t.pair(s, d).peerWriteOk) {
      x.reason = "peer write rank " + std::to_string(s) + " -> rank " + std::to_string(d) +
                 " (islands " + is.text() + ") failed its transfer check or is not mapped";
      return x;
    }
  }
  x.admitted = true;
  x.reason = std::to_string(is.count()) + " islands " + is.text() + " (" + is.source +
             "); every pair it writes over passed its peer-write check";
  return x;
}

// The ring (ring.cu) stores only into its ring neighbours' workspaces, both ways (partial sums
// and results one way, freed slots back); ring-copy (ring_copy.cu) pulls partial sums and
// results from them and stores only its chunk flags into them. Those pairs need their
// peer-write check (and, for the pulls, their peer-read check), both ways; no others.
AlgoAdmission admitRingNeighbours(const Topology& t, const CommFacts& f, bool needsRead) {
  AlgoAdmission x = admitPeer(t, f, false, false);
  if (!x.admitted) return x;
  const int n = t.size();
  for (int r = 0; r < n; ++r) {
    const int next = (r + 1) % n;
    for (const auto& [s, d] : {std::pair<int, int>{r, next}, std::pair<int, int>{next, r}}) {
      if (s == d) continue;
      const PairInfo& p = t.pair(s, d);
      const char* failed = needsRead && !p.peerReadOk ? "read" : !p.peerWriteOk ? "write" : nullptr;
      if (failed != nullptr) {
        x.admitted = false;
        x.reason = std::string("peer ") + failed + " rank " + std::to_string(s) + " -> rank " +
                   std::to_string(d) +
                   " (ring neighbours) failed its transfer check or is not mapped";
        return x;
      }
    }
  }
  x.reason = std::string("every ring-neighbour pair passed its ") +
             (needsRead ? "peer-read and peer-write checks" : "peer-write check") +
             ", both ways (no other pair is used)";
  return x;
}
AlgoAdmission admitRingWrites(const Topology& t, const CommFacts& f) {
  return admitRingNeighbours(t, f, false);
}
AlgoAdmission admitRingPulls(const Topology& t, const CommFacts& f) {
  return admitRingNeighbours(t, f, true);
}

// The doubling push stores only into its rounds' partners (algo/doubling_schedule.h, with the
// islands' order): those pairs need their peer-write check, no others.
AlgoAdmission admitDoublingWrites(const Topology& t, const CommFacts& f) {
  AlgoAdmission x = admitPeer(t, f, false, false);
  if (!x.admitted) return x;
  const int n = t.size();
  const Islands is = islandsCoverError(f.islands, f.nranks).empty()
                         ? islandsOf(t, f.islands, f.nranks)
                         : Islands{};
  const uint32_t order = doubling::doublingOrder(islandMapOf(is), n);
  for (int r = 0; r < n; ++r) {
    for (int j = 0; j < doubling::rounds(n); ++j) {
      const int to = doubling::round(n, order, r, j).to;
      if (!t.pair(r, to).peerWriteOk) {
        x.admitted = false;
        x.reason = "peer write rank " + std::to_string(r) + " -> rank " + std::to_string(to) +
                   " (doubling partners) failed its transfer check or is not mapped";
        return x;
      }
    }
  }
  // Its partners in words: the rounds' bits, or the shifts of the other world sizes.
  std::string partners;
  for (int j = 0; j < doubling::rounds(n); ++j) {
    partners += (j ? ", " : "") + std::string(doubling::powerOfTwo(n) ? "^ " : "- ") +
                std::to_string(doubling::powerOfTwo(n) ? doubling::orderBit(order, j) : 1 << j);
  }
  x.reason = "partners rank " + partners +
             ": every pair it writes over passed its peer-write check (no other pair is used)";
  return x;
}

// Host-memory algorithms need no peer access at all: only the shared pinned segment.
AlgoAdmission admitHostSegment(const Topology&, const CommFacts& f) {
  AlgoAdmission x;
  x.admitted = f.hostMemory && f.sameHost && f.nranks <= kMaxLocalRanks;
  x.reason = x.admitted ? "every rank mapped the shared pinned host segment (no peer access "
                          "needed)"
                        : "no host-memory transport: " + f.hostMemoryReason;
  return x;
}

AlgoAdmission admitNccl(const Topology&, const CommFacts& f) {
  AlgoAdmission x;
  x.admitted = f.ncclAvailable;
  x.reason = f.ncclAvailable ? "NCCL communicator available" : "NCCL unavailable: " + f.ncclReason;
  return x;
}

// ---- Fused kernels ---------------------------------------------------------------------------

// The fused one-shot push kernel holds its row in registers: only the reduction scratch,
// static (4,112 bytes, under the 48 KB every block gets without opting in).
constexpr FusedVariant kFusedOneShotPush{"fused one-shot push", kFusedRedFloats * sizeof(float),
                                         false, fusedOneShotPushUs, true};
// The fused two-shot push kernel stages the fp32 row in dynamic shared memory, sized for the
// widest supported row (69,648 bytes), which a block must opt in to; its register form runs
// dense launches of more rows than SMs.
constexpr FusedVariant kFusedTwoShotPush{"fused two-shot push", fusedSharedBytes(kFusedMaxHidden),
                                         true, fusedTwoShotPushUs, true};
// The fused pull kernels (one-shot pull, two-shot) hold their rows in registers at every width
// (the reduction scratch and a flag word, static), a block per row: no dense or cluster form.
constexpr FusedVariant kFusedOneShotPull{"fused one-shot pull",
                                         kFusedRedFloats * sizeof(float) + sizeof(int), false,
                                         fusedOneShotPullUs};
constexpr FusedVariant kFusedTwoShotPull{"fused two-shot pull",
                                         kFusedRedFloats * sizeof(float) + sizeof(int), false,
                                         fusedTwoShotPullUs};

// The fused doubling push: the fused one-shot push's block-per-row kernel in the doubling order
// (its row in registers, the reduction scratch static); no cluster or dense form.
constexpr FusedVariant kFusedDoublingPush{"fused doubling push", kFusedRedFloats * sizeof(float),
                                          false, fusedOneShotPushUs};

// The fused islands kernel: the islands kernel's steps, then a block per row in registers (the
// reduction scratch static); it reads its rows back from the gather slots as the fused two-shot
// push's register form does, and is modelled as that one is. No cluster or dense form.
constexpr FusedVariant kFusedIslands{"fused islands", kFusedRedFloats * sizeof(float), false,
                                     fusedTwoShotPushUs};

// ---- The table -------------------------------------------------------------------------------
// Candidate order: the peer-memory algorithms, NCCL, then the host-memory algorithms (they have
// no fused kernel, so the fused operations get them only as composition, "host-oneshot+epilogue").
constexpr AlgoInfo kAlgos[] = {
    AlgoInfo(anyrAlgoOneShotPush, "oneshot-push", AlgoKind::PeerMemory)
        .peer(ANYR_KERNEL_FN(launchOneShotPush), ANYR_KERNEL_FN(oneShotPushResidentPerSm),
              LaunchCapacity::PushSlot)
        .fusedKernel(&kFusedOneShotPush)
        .admission(admitPeerWrites)
        .cost(oneShotPushUs),
    AlgoInfo(anyrAlgoOneShotPull, "oneshot-pull", AlgoKind::PeerMemory)
        .peer(ANYR_KERNEL_FN(launchOneShotPull), ANYR_KERNEL_FN(oneShotPullResidentPerSm),
              LaunchCapacity::Chunk)
        .fusedKernel(&kFusedOneShotPull)
        .admission(admitPeerReads)
        .cost(oneShotPullUs),
    AlgoInfo(anyrAlgoTwoShotPush, "twoshot-push", AlgoKind::PeerMemory)
        .peer(ANYR_KERNEL_FN(launchTwoShotPush), ANYR_KERNEL_FN(twoShotPushResidentPerSm),
              LaunchCapacity::Chunk)
        .splitPerRank()
        .fusedKernel(&kFusedTwoShotPush)
        .admission(admitPeerWrites)
        .cost(twoShotPushUs),
    AlgoInfo(anyrAlgoTwoShot, "twoshot", AlgoKind::PeerMemory)
        .peer(ANYR_KERNEL_FN(launchTwoShot), ANYR_KERNEL_FN(twoShotResidentPerSm),
              LaunchCapacity::Chunk)
        .splitPerRank()
        .fusedKernel(&kFusedTwoShotPull)
        .admission(admitPeerReads)
        .cost(twoShotUs),
    // The one-shots with their peer traffic in rounds, one peer per round: after the all-to-all
    // forms, which win ties (with two ranks they are the same kernels).
    AlgoInfo(anyrAlgoStagedPush, "staged-push", AlgoKind::PeerMemory)
        .peer(ANYR_KERNEL_FN(launchStagedPush), ANYR_KERNEL_FN(stagedPushResidentPerSm),
              LaunchCapacity::PushSlot)
        .admission(admitPeerWrites)
        .cost(stagedPushUs),
    AlgoInfo(anyrAlgoStagedPull, "staged-pull", AlgoKind::PeerMemory)
        .peer(ANYR_KERNEL_FN(launchStagedPull), ANYR_KERNEL_FN(stagedPullResidentPerSm),
              LaunchCapacity::Chunk)
        .admission(admitPeerReads)
        .cost(stagedPullUs),
    AlgoInfo(anyrAlgoIslands, "islands", AlgoKind::PeerMemory)
        .peer(ANYR_KERNEL_FN(launchIslands), ANYR_KERNEL_FN(islandsResidentPerSm),
              LaunchCapacity::IslandSlots)
        .fusedKernel(&kFusedIslands)
        .admission(admitIslands)
        .cost(islandsUs),
    AlgoInfo(anyrAlgoRing, "ring", AlgoKind::PeerMemory)
        .peer(ANYR_KERNEL_FN(launchRing), ANYR_KERNEL_FN(ringResidentPerSm), LaunchCapacity::Chunk)
        .admission(admitRingWrites)
        .cost(ringUs),
    // The ring's chain with its bytes pulled by the copy engines: after the ring, which wins ties.
    AlgoInfo(anyrAlgoRingCopy, "ring-copy", AlgoKind::PeerMemory)
        .peerCopy(ANYR_KERNEL_FN(launchRingCopy))
        .admission(admitRingPulls)
        .cost(ringCopyUs),
    // The one-shot push relayed in ceil(log2 n) rounds: after the staged forms and the
    // islands (with two ranks it is the one-shot push's kernel and cost, and the tie goes to it).
    AlgoInfo(anyrAlgoDoublingPush, "doubling-push", AlgoKind::PeerMemory)
        .peer(ANYR_KERNEL_FN(launchDoublingPush), ANYR_KERNEL_FN(doublingPushResidentPerSm),
              LaunchCapacity::PushSlot)
        .fusedKernel(&kFusedDoublingPush)
        .admission(admitDoublingWrites)
        .cost(doublingPushUs),
    AlgoInfo(anyrAlgoNccl, "nccl", AlgoKind::Nccl).admission(admitNccl).cost(ncclUs),
    AlgoInfo(anyrAlgoHostOneShot, "host-oneshot", AlgoKind::HostMemory)
        .host(ANYR_KERNEL_FN(launchHostOneShot), ANYR_KERNEL_FN(launchHostOneShotLL))
        .admission(admitHostSegment)
        .cost(hostOneShotUs),
    AlgoInfo(anyrAlgoHostTwoShot, "host-twoshot", AlgoKind::HostMemory)
        .host(ANYR_KERNEL_FN(launchHostTwoShot))
        .splitPerRank()
        .admission(admitHostSegment)
        .cost(hostTwoShotUs),
    AlgoInfo(anyrAlgoHostCopy, "host-copy", AlgoKind::HostMemory)
        .hostCopy(ANYR_KERNEL_FN(launchHostCopy))
        .admission(admitHostSegment)
        .cost(hostCopyUs),
};
constexpr size_t kNumRows = sizeof(kAlgos) / sizeof(kAlgos[0]);

// ---- Checked at compile time: every anyrAlgo_t value but anyrAlgoAuto has exactly one row,
// and no two rows share a name.

constexpr bool sameText(const char* a, const char* b) {
  while (*a != '\0' && *a == *b) {
    ++a;
    ++b;
  }
  return *a == *b;
}

constexpr bool oneRowPerValue() {
  if (kNumRows != static_cast<size_t>(anyrNumAlgos) - 1) return false;
  for (size_t i = 0; i < kNumRows; ++i) {
    if (kAlgos[i].algo <= anyrAlgoAuto || kAlgos[i].algo >= anyrNumAlgos) return false;
    if (kAlgos[i].name == nullptr || sameText(kAlgos[i].name, "auto")) return false;
    for (size_t j = 0; j < i; ++j) {
      if (kAlgos[j].algo == kAlgos[i].algo || sameText(kAlgos[j].name, kAlgos[i].name)) {
        return false;
      }
    }
  }
  return true;
}
static_assert(oneRowPerValue(),
              "every anyrAlgo_t value but anyrAlgoAuto needs exactly one row, under its own name");

// Row index by enum value (-1: none), for O(1) lookups on the call path.
constexpr std::array<int, anyrNumAlgos> rowIndex() {
  std::array<int, anyrNumAlgos> idx{};
  for (int& i : idx) i = -1;
  for (size_t r = 0; r < kNumRows; ++r)
    idx[static_cast<size_t>(kAlgos[r].algo)] = static_cast<int>(r);
  return idx;
}
constexpr std::array<int, anyrNumAlgos> kRowOf = rowIndex();

}  // namespace

AlgoRows algoRegistry() { return AlgoRows{kAlgos, kNumRows}; }

const AlgoInfo* findAlgo(anyrAlgo_t a) {
  if (a < 0 || a >= anyrNumAlgos) return nullptr;
  const int r = kRowOf[static_cast<size_t>(a)];
  return r < 0 ? nullptr : &kAlgos[r];
}

const AlgoInfo& algoInfo(anyrAlgo_t a) {
  const AlgoInfo* r = findAlgo(a);
  if (r == nullptr) {
    throwError(anyrInternalError,
               "algorithm " + std::to_string(static_cast<int>(a)) + " has no registry row");
  }
  return *r;
}

const char* algoName(anyrAlgo_t a) {
  if (a == anyrAlgoAuto) return "auto";
  const AlgoInfo* r = findAlgo(a);
  return r == nullptr ? nullptr : r->name;
}

}  // namespace anyr
