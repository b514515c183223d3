// The ring's host-side schedule (src/algo/ring_plan.h) and its admission: how a launch is cut
// into chunks and streams (the ring's and ring-copy's), the two arms that carry the result back
// from rank n-1, which pairs the ring stores across, and that only those pairs' checks admit or
// reject the ring and ring-copy.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "algo/ring_plan.h"
#include "cpu/select_fixtures.h"
#include "select/admission.h"
#include "topology/topology.h"

namespace anyr {
namespace {

bool ringNeighbours(int a, int b, int n) {
  return a != b && (std::abs(a - b) == 1 || (std::min(a, b) == 0 && std::max(a, b) == n - 1));
}

TEST(RingPlan, ChunksCoverTheLaunchAndStreamsStayWithinTheirCaps) {
  for (int elems : {4, 8}) {
    for (uint64_t vecs : {0ull, 1ull, 511ull, 512ull, 513ull, 1023ull, 4096ull * 8 + 3, 1ull << 20,
                          (1ull << 26) + 5}) {
      for (int cap : {1, 2, 3, 16, 17, 264}) {
        const RingPlan p = ringPlan(vecs, elems, cap);
        SCOPED_TRACE(std::to_string(elems) + " elements a vector, " + std::to_string(vecs) +
                     " vectors, cap " + std::to_string(cap));
        // A chunk is kRingChunkElems elements, whose fp32 partial sums fill one slot.
        EXPECT_EQ(p.chunkVecs * static_cast<uint64_t>(elems), kRingChunkElems);
        EXPECT_EQ(p.chunkVecs * static_cast<uint64_t>(elems) * 4, kRingSlotBytes);
        EXPECT_GE(p.chunks * p.chunkVecs, vecs);
        if (vecs > 0) {
          EXPECT_LT((p.chunks - 1) * p.chunkVecs, vecs);
        }
        EXPECT_GE(p.streams, 1);
        EXPECT_LE(p.streams, kRingMaxStreams);
        EXPECT_LE(p.streams, std::max(1, cap / 2));
        EXPECT_LE(static_cast<uint64_t>(p.streams), std::max<uint64_t>(1, p.chunks));
        // The kernel recomputes the plan from its grid (two blocks a stream): the same chunks.
        const RingPlan k = ringPlan(vecs, elems, 2 * p.streams);
        EXPECT_EQ(k.chunkVecs, p.chunkVecs);
        EXPECT_EQ(k.chunks, p.chunks);
        EXPECT_EQ(k.streams, p.streams);
      }
    }
  }
  // Large launches use every stream.
  EXPECT_EQ(ringPlan(1ull << 20, 8, 264).streams, kRingMaxStreams);
  // The inboxes hold kRingSlots slots of every stream.
  EXPECT_EQ(kRingInboxBytes, kRingMaxStreams * kRingSlots * kRingSlotBytes);
  EXPECT_EQ(kRingAreaBytes, 2 * kRingInboxBytes);
}

// ring-copy's plan: chunks of kRingCopyChunkElems elements over at most kRingCopyStreams
// pipelines, chunk c on pipeline c % streams, every chunk on exactly one pipeline; its area
// holds every pipeline's slots and inbox.
TEST(RingPlan, RingCopyChunksCoverTheLaunchOnEveryPipelineOnce) {
  for (int elems : {4, 8}) {
    for (uint64_t vecs : {1ull, 7ull, 32767ull, 32768ull, 32769ull, 65536ull * 3 + 1, 1ull << 26}) {
      SCOPED_TRACE(std::to_string(elems) + " elements a vector, " + std::to_string(vecs) +
                   " vectors");
      const RingCopyPlan p = ringCopyPlan(vecs, elems);
      EXPECT_EQ(p.chunkVecs * static_cast<uint64_t>(elems), kRingCopyChunkElems);
      // A chunk's fp32 partial sums fill one slot; its result in the call's type fits one.
      EXPECT_EQ(p.chunkVecs * static_cast<uint64_t>(elems) * 4, kRingCopySlotBytes);
      EXPECT_LE(p.chunkVecs * 16, kRingCopySlotBytes);
      EXPECT_GE(p.chunks * p.chunkVecs, vecs);
      EXPECT_LT((p.chunks - 1) * p.chunkVecs, vecs);
      EXPECT_GE(p.streams, 1);
      EXPECT_LE(p.streams, kRingCopyStreams);
      EXPECT_LE(static_cast<uint64_t>(p.streams), p.chunks);
      uint64_t total = 0;
      for (int b = 0; b < p.streams; ++b) {
        const uint64_t mine = ringCopyChunksOf(p, b);
        total += mine;
        // Its chunks are b, b + streams, ..., the last one below chunks.
        EXPECT_GE(mine, 1u);
        EXPECT_LT(static_cast<uint64_t>(b) + (mine - 1) * static_cast<uint64_t>(p.streams),
                  p.chunks);
        EXPECT_GE(static_cast<uint64_t>(b) + mine * static_cast<uint64_t>(p.streams), p.chunks);
      }
      EXPECT_EQ(total, p.chunks);
    }
  }
  EXPECT_EQ(ringCopyPlan(1ull << 20, 8).streams, kRingCopyStreams);
  EXPECT_EQ(ringCopyPlan(1, 8).streams, 1);
  EXPECT_EQ(kRingCopyAreaBytes,
            (2 * kRingCopyStreams * kRingCopySlots + kRingCopyStreams) * kRingCopySlotBytes);
  // A launch's chunk counts fit the flags' 32-bit counts many times over.
  EXPECT_LT(kRingCopyLaunchBytes / 2 / kRingCopyChunkElems, 1ull << 20);
}

TEST(RingPlan, TheResultReachesEveryRankOnceAlongTheRingWithinItsDepth) {
  for (int n = 2; n <= kMaxLocalRanks; ++n) {
    SCOPED_TRACE("world size " + std::to_string(n));
    EXPECT_EQ(ringResultSource(n - 1, n), -1);
    int longestArm = 0;
    for (int k = 0; k < n - 1; ++k) {
      const int src = ringResultSource(k, n);
      ASSERT_GE(src, 0) << "rank " << k;
      EXPECT_TRUE(ringNeighbours(src, k, n)) << "rank " << k << " from " << src;
      // The source passes on to this rank on this rank's arm, and this rank's free flags go to
      // that arm's index in the source's flags.
      const int side = ringResultSide(k, n);
      EXPECT_EQ(ringResultDest(src, n, side), k) << "rank " << k;
      EXPECT_EQ(ringResultDest(k, n, 1 - side), -1) << "rank " << k << " passes on one arm only";
      // Back to rank n-1 along the sources: no cycle, at most the wrap arm's length.
      int hops = 0;
      for (int r = k; r != n - 1; r = ringResultSource(r, n)) {
        ++hops;
        ASSERT_LE(hops, n) << "rank " << k << ": the sources loop";
      }
      longestArm = std::max(longestArm, hops);
    }
    EXPECT_EQ(longestArm, ringSplit(n));
    EXPECT_EQ(ringDepth(n), n - 1 + longestArm);
    // Every destination names its source back, and rank n-1 starts both arms (one at n = 2).
    for (int r = 0; r < n; ++r) {
      for (int side = 0; side < 2; ++side) {
        const int d = ringResultDest(r, n, side);
        if (d < 0) continue;
        EXPECT_TRUE(ringNeighbours(r, d, n)) << r << " -> " << d;
        EXPECT_EQ(ringResultSource(d, n), r) << r << " -> " << d;
        EXPECT_EQ(ringResultSide(d, n), side) << r << " -> " << d;
      }
    }
    EXPECT_EQ(ringResultDest(n - 1, n, 0), 0);
    EXPECT_EQ(ringResultDest(n - 1, n, 1), n >= 3 ? n - 2 : -1);
  }
}

// When one rank skips a call, every other rank's ring blocks wait; each wait gives up its chain
// steps after the timeout (ringFoldDataSteps ...), and the first to give up names the rank it
// waited for to every rank. That rank is the missing one, for every world size and missing rank,
// with one chunk in flight (the fold and the result waits) and with the pipeline full (the free
// slot waits too).
TEST(RingPlan, TheFirstWaitToGiveUpWaitsForTheMissingRank) {
  struct Wait {
    uint32_t steps;
    int from;
  };
  for (int n = 2; n <= kMaxLocalRanks; ++n) {
    for (int m = 0; m < n; ++m) {
      for (bool full : {false, true}) {
        std::vector<Wait> blocked;
        for (int k = 0; k < n; ++k) {
          if (k == m) continue;
          // The partials stop at m: every rank after it waits for its predecessor's.
          if (k > m) blocked.push_back({ringFoldDataSteps(k), k - 1});
          // Slots stop being freed at m: with the pipeline full every rank before it waits.
          if (full && k < m) blocked.push_back({ringFoldRoomSteps(k, n), k + 1});
          // No result leaves rank n-1: every other rank waits for its source's.
          if (k != n - 1) blocked.push_back({ringResultSteps(k, n), ringResultSource(k, n)});
        }
        ASSERT_FALSE(blocked.empty());
        const auto first =
            std::min_element(blocked.begin(), blocked.end(),
                             [](const Wait& a, const Wait& b) { return a.steps < b.steps; });
        // Ties: every wait of the least steps must wait for m.
        for (const Wait& w : blocked) {
          if (w.steps == first->steps) {
            EXPECT_EQ(w.from, m) << "world " << n << ", rank " << m << " missing, pipeline "
                                 << (full ? "full" : "with one chunk") << ": a wait of " << w.steps
                                 << " steps names rank " << w.from;
          }
        }
        for (const Wait& w : blocked) EXPECT_LE(w.steps, static_cast<uint32_t>(ringDepth(n)));
      }
    }
  }
}

// ---- admission -------------------------------------------------------------------------------

const AlgoAdmission& admitted(const Topology& t, anyrAlgo_t a, Admission* keep) {
  *keep = admit(t, testfix::facts(t, true, false, "disabled for the test"));
  return (*keep)[a];
}

// Without a peer workspace `a` is refused, with the workspace's reason.
void expectRefusedWithoutPeerMemory(const Topology& t, anyrAlgo_t a) {
  CommFacts f = testfix::facts(t, true, false, "");
  f.peerMemory = false;
  f.peerMemoryReason = "no mapping for the test";
  const Admission none = admit(t, f);
  EXPECT_FALSE(none[a].admitted);
  EXPECT_NE(none[a].reason.find("no mapping for the test"), std::string::npos);
}

TEST(RingAdmission, OnlyTheRingNeighboursPeerWritesDecide) {
  Topology t = testfix::fixture("pcie_8gpu_two_switches");
  ASSERT_EQ(t.size(), 8);
  Admission adm;
  EXPECT_TRUE(admitted(t, anyrAlgoRing, &adm).admitted) << adm[anyrAlgoRing].reason;
  EXPECT_NE(adm[anyrAlgoRing].reason.find("ring-neighbour"), std::string::npos);
  // A pair the ring never stores across fails its check: the all-to-all pushes go, the ring
  // stays.
  t.pair(0, 2).peerWriteOk = false;
  EXPECT_TRUE(admitted(t, anyrAlgoRing, &adm).admitted) << adm[anyrAlgoRing].reason;
  EXPECT_FALSE(adm[anyrAlgoOneShotPush].admitted);
  // Either direction between neighbours rejects it (results and freed slots go backwards), the
  // wrap pair too, naming the pair.
  for (const auto& [s, d] : {std::pair<int, int>{3, 2}, {4, 5}, {7, 0}, {0, 7}}) {
    Topology u = testfix::fixture("pcie_8gpu_two_switches");
    u.pair(s, d).peerWriteOk = false;
    const AlgoAdmission& x = admitted(u, anyrAlgoRing, &adm);
    EXPECT_FALSE(x.admitted) << s << " -> " << d;
    EXPECT_NE(x.reason.find("rank " + std::to_string(s) + " -> rank " + std::to_string(d) +
                            " (ring neighbours)"),
              std::string::npos)
        << x.reason;
  }
  // The structural conditions of every peer algorithm hold for it too.
  expectRefusedWithoutPeerMemory(t, anyrAlgoRing);
}

// ring-copy pulls from its neighbours (partial sums from the rank before, results from its
// source on its arm) and stores its flags into them: every ring-neighbour pair needs both its
// peer-read and its peer-write check, both ways; no other pair matters.
TEST(RingAdmission, RingCopyNeedsTheNeighboursPeerReadsAndWrites) {
  Topology t = testfix::fixture("pcie_8gpu_two_switches");
  Admission adm;
  EXPECT_TRUE(admitted(t, anyrAlgoRingCopy, &adm).admitted) << adm[anyrAlgoRingCopy].reason;
  EXPECT_NE(adm[anyrAlgoRingCopy].reason.find("peer-read and peer-write"), std::string::npos);
  t.pair(0, 2).peerReadOk = false;
  t.pair(5, 1).peerWriteOk = false;
  EXPECT_TRUE(admitted(t, anyrAlgoRingCopy, &adm).admitted) << adm[anyrAlgoRingCopy].reason;
  EXPECT_FALSE(adm[anyrAlgoOneShotPull].admitted);
  for (const bool read : {true, false}) {
    for (const auto& [s, d] : {std::pair<int, int>{3, 2}, {4, 5}, {7, 0}, {0, 7}}) {
      Topology u = testfix::fixture("pcie_8gpu_two_switches");
      (read ? u.pair(s, d).peerReadOk : u.pair(s, d).peerWriteOk) = false;
      const AlgoAdmission& x = admitted(u, anyrAlgoRingCopy, &adm);
      EXPECT_FALSE(x.admitted) << s << " -> " << d;
      EXPECT_NE(
          x.reason.find(std::string("peer ") + (read ? "read" : "write") + " rank " +
                        std::to_string(s) + " -> rank " + std::to_string(d) + " (ring neighbours)"),
          std::string::npos)
          << x.reason;
    }
  }
  expectRefusedWithoutPeerMemory(t, anyrAlgoRingCopy);
}

}  // namespace
}  // namespace anyr
