// The doubling push (doubling-push: the one-shot push relayed in ceil(log2 n) rounds, one partner
// a round): its schedule walked with the kernel's own arithmetic (algo/doubling_schedule.h) at
// every world size and island layout, its admission (the partners' pairs only), its cost
// (algo/cost.cc, doublingPushUs) and where the seed takes it on the sourced fixtures, and why.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include "algo/cost.h"
#include "algo/doubling_schedule.h"
#include "base/config.h"
#include "cpu/select_fixtures.h"
#include "device/handles.h"
#include "select/admission.h"
#include "select/dispatch.h"
#include "select/explain.h"
#include "topology/islands.h"
#include "topology/topology.h"

namespace anyr {
namespace {

using testfix::fixture;
using testfix::Seeded;
using testfix::seeded;
using testfix::seededTopology;

constexpr uint64_t KB = 1024;

// The kernel's map of islands forced by `text` ("" : none) over n ranks.
IslandMap mapOf(const std::string& text, int n) {
  if (text.empty()) return islandMapOf(Islands{});
  uint32_t packed = 0;
  std::string why;
  EXPECT_TRUE(parseIslands(text, &packed, &why)) << text << ": " << why;
  Topology t;
  return islandMapOf(islandsOf(t, packed, n));
}

// Walks the schedule as every rank's kernel runs it and checks what the kernel relies on: a
// round's stores land where the partner expects them (its `from` and `recv`), a rank sends only
// what it holds (its own, or what an earlier round brought), every source reaches every rank
// exactly once, so every slot has one writer a call (the three-phase clearing), and writerOf
// names that writer.
void walk(int n, uint32_t order) {
  SCOPED_TRACE("n=" + std::to_string(n) + " order=" + std::to_string(order));
  const int R = doubling::rounds(n);
  std::vector<uint32_t> held(static_cast<size_t>(n));
  std::vector<std::vector<int>> writer(static_cast<size_t>(n), std::vector<int>(n, -1));
  for (int r = 0; r < n; ++r) held[static_cast<size_t>(r)] = 1u << r;
  for (int j = 0; j < R; ++j) {
    std::vector<uint32_t> next = held;
    std::vector<int> receivers(static_cast<size_t>(n), 0);
    for (int r = 0; r < n; ++r) {
      const doubling::Round x = doubling::round(n, order, r, j);
      ASSERT_GE(x.to, 0);
      ASSERT_LT(x.to, n);
      ASSERT_NE(x.to, r);
      ++receivers[static_cast<size_t>(x.to)];
      // Only what it holds, and something in every round.
      EXPECT_EQ(x.send & ~held[static_cast<size_t>(r)], 0u) << "rank " << r << " round " << j;
      EXPECT_NE(x.send, 0u);
      // The partner expects exactly these, from this rank.
      const doubling::Round y = doubling::round(n, order, x.to, j);
      EXPECT_EQ(y.from, r) << "rank " << r << " round " << j;
      EXPECT_EQ(y.recv, x.send) << "rank " << r << " round " << j;
      for (int s = 0; s < n; ++s) {
        if (!(x.send & (1u << s))) continue;
        // Not yet held there: each source arrives once.
        EXPECT_FALSE(held[static_cast<size_t>(x.to)] & (1u << s))
            << "source " << s << " reaches rank " << x.to << " twice";
        EXPECT_EQ(writer[static_cast<size_t>(x.to)][static_cast<size_t>(s)], -1);
        writer[static_cast<size_t>(x.to)][static_cast<size_t>(s)] = r;
        next[static_cast<size_t>(x.to)] |= 1u << s;
      }
    }
    // A permutation: one inbound flow per rank a round.
    for (int r = 0; r < n; ++r) EXPECT_EQ(receivers[static_cast<size_t>(r)], 1);
    held = next;
  }
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(held[static_cast<size_t>(r)], (1u << n) - 1) << "rank " << r;
    for (int s = 0; s < n; ++s) {
      EXPECT_EQ(doubling::writerOf(n, order, r, s),
                s == r ? -1 : writer[static_cast<size_t>(r)][static_cast<size_t>(s)])
          << "rank " << r << " source " << s;
    }
  }
}

TEST(Doubling, EverySourceReachesEveryRankOnceThroughWhatItsRelaysHold) {
  for (int n = 2; n <= kMaxLocalRanks; ++n) {
    EXPECT_EQ(doubling::rounds(n), n <= 2 ? 1 : n <= 4 ? 2 : 3) << n;
    walk(n, doubling::doublingOrder(mapOf("", n), n));
  }
  // Every order of the partner bits a power-of-two world can take.
  for (uint32_t order : {0x210u, 0x120u, 0x201u, 0x021u, 0x102u, 0x012u}) walk(8, order);
  for (uint32_t order : {0x10u, 0x01u}) walk(4, order);
}

TEST(Doubling, TheRoundsThatCrossIslandsGoFirstWhereAFlowCarriesOneVector) {
  // No islands: the bits in order (partners rank ^ 1, ^ 2, ^ 4).
  EXPECT_EQ(doubling::doublingOrder(mapOf("", 8), 8), 0x210u);
  // Two switches (or sockets) of consecutive ranks: rank ^ 4 crosses, first.
  EXPECT_EQ(doubling::doublingOrder(mapOf("0-3,4-7", 8), 8), 0x102u);
  EXPECT_EQ(doubling::round(8, 0x102u, 1, 0).to, 5);
  EXPECT_EQ(doubling::round(8, 0x102u, 1, 0).send, 1u << 1);
  // Interleaved islands: rank ^ 1 crosses.
  EXPECT_EQ(doubling::doublingOrder(mapOf("0+2+4+6,1+3+5+7", 8), 8), 0x210u);
  // Four islands of two: ^ 1 stays inside, ^ 2 and ^ 4 cross (both all ranks): they go first.
  EXPECT_EQ(doubling::doublingOrder(mapOf("0-1,2-3,4-5,6-7", 8), 8), 0x021u);
  EXPECT_EQ(doubling::doublingOrder(mapOf("0-1,2-3", 4), 4), 0x01u);
  // A rank crosses islands in the first round only, with its own vector.
  const uint32_t order = doubling::doublingOrder(mapOf("0-3,4-7", 8), 8);
  for (int r = 0; r < 8; ++r) {
    for (int j = 1; j < 3; ++j) EXPECT_EQ(doubling::round(8, order, r, j).to / 4, r / 4);
  }
}

TEST(Doubling, ThePlanPackedForTheKernelsIsTheSchedule) {
  // What the kernels read (AllReduceArgs::doubling, packed once on the host) against the
  // schedule, at every world size, rank and (power of two) order.
  for (int n = 2; n <= kMaxLocalRanks; ++n) {
    std::vector<uint32_t> orders = {doubling::doublingOrder(mapOf("", n), n)};
    if (n == 8) orders = {0x210u, 0x120u, 0x201u, 0x021u, 0x102u, 0x012u};
    if (n == 4) orders = {0x10u, 0x01u};
    for (uint32_t order : orders) {
      for (int r = 0; r < n; ++r) {
        const DoublingPlan p = doubling::planOf(n, order, r);
        ASSERT_EQ(static_cast<int>(p.count), doubling::rounds(n));
        for (int j = 0; j < doubling::rounds(n); ++j) {
          EXPECT_EQ(doubling::planTo(p, j), doubling::round(n, order, r, j).to);
          EXPECT_EQ(doubling::planFrom(p, j), doubling::round(n, order, r, j).from);
          EXPECT_EQ(doubling::planSend(p, j), doubling::round(n, order, r, j).send);
        }
        for (int s = 0; s < n; ++s) {
          EXPECT_EQ(doubling::planWriter(p, s), s == r ? r : doubling::writerOf(n, order, r, s));
        }
      }
    }
  }
}

// The waits that give up after the grace are those for a party that sends only after waits of
// its own; a wait that can take the missing rank's data first hand gives up at the deadline.
TEST(Doubling, SecondHandWaitsAreThoseForDataSentAfterTheSendersOwnWaits) {
  for (int32_t w : {kWaitClusterRow, kWaitLaterRound, kWaitEndFlag, kWaitHostResult}) {
    EXPECT_TRUE(waitIsSecondHand(w)) << waitWhatName(w);
  }
  for (int32_t w : {kWaitNone, kWaitPushData, kWaitStartFlag, kWaitHostData, kWaitHostReady,
                    kWaitRingData, kWaitRingRoom}) {
    EXPECT_FALSE(waitIsSecondHand(w)) << waitWhatName(w);
  }
}

// A wait for a later round's data is second hand (kWaitLaterRound: it times out after the
// first-hand waits, common.cuh's kSecondHandGraceNs), so a missing rank is named by the rank that
// waits for its data first hand: exactly one rank takes each source in round 0, from the source
// itself, and every rank takes exactly one source so; every other wait for it is second hand.
TEST(Doubling, EverySourceHasOneRankThatWaitsForItFirstHand) {
  EXPECT_STRNE(waitWhatName(kWaitLaterRound), waitWhatName(kWaitPushData));
  EXPECT_STRNE(waitWhatName(kWaitLaterRound), waitWhatName(kWaitNone));
  for (int n = 2; n <= kMaxLocalRanks; ++n) {
    std::vector<uint32_t> orders = {doubling::doublingOrder(mapOf("", n), n)};
    if (n == 8) orders = {0x210u, 0x120u, 0x201u, 0x021u, 0x102u, 0x012u};
    for (uint32_t order : orders) {
      std::vector<int> firstHandOf(n, 0);
      for (int s = 0; s < n; ++s) {
        int firstHand = 0;
        for (int r = 0; r < n; ++r) {
          const DoublingPlan p = doubling::planOf(n, order, r);
          if (!doubling::planFirstHand(p, s)) continue;
          EXPECT_NE(r, s) << "n " << n << " order " << order;
          EXPECT_EQ(doubling::planWriter(p, s), s) << "n " << n << " rank " << r << " source " << s;
          EXPECT_EQ(doubling::round(n, order, r, 0).recv, 1u << s) << "n " << n << " rank " << r;
          ++firstHand;
          ++firstHandOf[r];
        }
        EXPECT_EQ(firstHand, 1) << "n " << n << " order " << order << " source " << s;
      }
      for (int r = 0; r < n; ++r) EXPECT_EQ(firstHandOf[r], 1) << "n " << n << " rank " << r;
    }
  }
  // No schedule, no first-hand wait.
  EXPECT_FALSE(doubling::planFirstHand(doubling::planOf(1, 0, 0), 0));
}

TEST(Doubling, NoScheduleBeyondThePeerMappedWorld) {
  // Communicators wider than kMaxLocalRanks (several hosts, NCCL) run no peer algorithm: the
  // schedule is empty, nothing indexes past the island map, and the model has no number.
  for (int n : {9, 16, 32, 64, 1024}) {
    EXPECT_EQ(doubling::rounds(n), 0) << n;
    EXPECT_EQ(doubling::doublingOrder(mapOf("", 8), n), 0u) << n;
    const doubling::Round x = doubling::round(n, 0x210u, 3, 0);
    EXPECT_EQ(x.to, 3);
    EXPECT_EQ(x.send, 0u);
    EXPECT_EQ(doubling::planOf(n, 0, 3).count, 0u);
  }
  const Topology t = fixture("rtxpro6000_16gpu_slow_writes");
  for (int n : {16, 32, 64}) {
    const CostInputs in = costInputs(t, Config(), n);
    EXPECT_TRUE(in.doublingRoundGBps.empty()) << n;
    EXPECT_LT(doublingPushUs(16 * KB, in), 0) << n;
  }
}

TEST(Doubling, TheModelTakesTheKernelsOrderFromTheSameIslands) {
  // The kernels' order comes from the communicator's islands (core/peer_workspace.cc: the
  // agreed topology and ANYR_ISLANDS); admission and the model from the same function of the
  // same inputs (select/dispatch.cc, costInputs).
  for (const char* name : {"rtxpro6000_8gpu_switches", "rtxpro6000_8gpu_dual_socket",
                           "l40s_8gpu_numa", "nvlink_8gpu", "pcie_8gpu_two_switches"}) {
    const Topology t = fixture(name);
    for (const char* layout : {"", "0-3,4-7", "0+2+4+6,1+3+5+7", "0-1,2-3,4-5,6-7"}) {
      Config cfg;
      std::string why;
      if (*layout != '\0') {
        ASSERT_TRUE(parseIslands(layout, &cfg.islands, &why)) << why;
      }
      const uint32_t kernels =
          doubling::doublingOrder(islandMapOf(islandsOf(t, cfg.islands, t.size())), t.size());
      EXPECT_EQ(costInputs(t, cfg, t.size()).doublingOrder, kernels) << name << " " << layout;
    }
  }
}

TEST(Doubling, OtherWorldSizesDoubleByShifts) {
  // Bruck's order: in round j rank r sends sources r .. r + min(2^j, n - 2^j) - 1 to r - 2^j.
  const doubling::Round x = doubling::round(5, 0, 1, 2);
  EXPECT_EQ(x.to, 2);  // 1 - 4 mod 5
  EXPECT_EQ(x.from, 0);
  EXPECT_EQ(x.send, 1u << 1);
  EXPECT_EQ(x.recv, 1u << 0);
  const doubling::Round y = doubling::round(7, 0, 6, 1);
  EXPECT_EQ(y.to, 4);
  EXPECT_EQ(y.send, (1u << 6) | (1u << 0));
}

// ---- admission --------------------------------------------------------------------------------

TEST(Doubling, AdmittedOverItsPartnersPairsOnly) {
  // Behind two switches of four the partners are rank ^ 4, ^ 1, ^ 2: a failed write check on a
  // pair it never writes over (0 -> 3) leaves it admitted (the one-shot push is rejected), one
  // on a partner pair (1 -> 5) rejects it, naming the pair.
  Topology t = fixture("rtxpro6000_8gpu_switches");
  EXPECT_TRUE(seededTopology(t).adm[anyrAlgoDoublingPush].admitted);
  EXPECT_EQ(seededTopology(t).adm[anyrAlgoDoublingPush].reason,
            "partners rank ^ 4, ^ 1, ^ 2: every pair it writes over passed its peer-write check "
            "(no other pair is used)");
  EXPECT_EQ(seeded("rtxpro6000_8gpu_switches", 5).adm[anyrAlgoDoublingPush].reason,
            "partners rank - 1, - 2, - 4: every pair it writes over passed its peer-write check "
            "(no other pair is used)");
  t.pair(0, 3).peerWriteOk = false;
  const Seeded s = seededTopology(t);
  EXPECT_TRUE(s.adm[anyrAlgoDoublingPush].admitted) << s.adm[anyrAlgoDoublingPush].reason;
  EXPECT_FALSE(s.adm[anyrAlgoOneShotPush].admitted);
  t.pair(1, 5).peerWriteOk = false;
  const Seeded r = seededTopology(t);
  EXPECT_FALSE(r.adm[anyrAlgoDoublingPush].admitted);
  EXPECT_EQ(r.adm[anyrAlgoDoublingPush].reason,
            "peer write rank 1 -> rank 5 (doubling partners) failed its transfer check or is not "
            "mapped");
  // No peer path at all: rejected with the peer algorithms' reason.
  const Seeded none = seeded("no_p2p");
  EXPECT_FALSE(none.adm[anyrAlgoDoublingPush].admitted);
}

// ---- cost -------------------------------------------------------------------------------------

// The bytes term of a cost: what twice the message adds, in one launch.
double slopeUs(double (*cost)(double, const CostInputs&), const CostInputs& in, double bytes) {
  return cost(2 * bytes, in) - cost(bytes, in);
}

TEST(Doubling, WithTwoRanksItIsTheOneShotPushAndTheTieGoesToTheOneShot) {
  for (const char* name : {"rtxpro6000_8gpu_switches", "l40s_8gpu_numa", "nvlink_pair"}) {
    const Seeded s = seeded(name, 2);
    for (int b = 10; b <= 28; ++b) {
      const double B = static_cast<double>(bucketBytes(b));
      EXPECT_DOUBLE_EQ(doublingPushUs(B, s.in), oneShotPushUs(B, s.in)) << name << " " << B;
      for (int o = 0; o < kNumOps; ++o) {
        EXPECT_NE(s.table.lookup(static_cast<Op>(o), bucketBytes(b)).algo, anyrAlgoDoublingPush)
            << name << " " << B;
      }
    }
  }
}

TEST(Doubling, BehindSwitchesThreeHopsAndOneVectorAFlowAcrossTheUplink) {
  // 8 x RTX PRO 6000 behind two switches of four: three rounds, each a one-partner round
  // (NCCL's 1.3 us where none is measured, as the staged push's), against the one-shot push's
  // loaded round of 6.79 us. Bytes: round 1 crosses the switches (four flows of one vector on each
  // uplink, at the uplink's 16/7 x 24 GB/s the measured all-to-all implies; the cross pairs write
  // 50 GB/s), rounds 2 and 3 stay inside them (two and four vectors a flow at one flow's rate of
  // the pairs inside, 54.5 GB/s).
  const Seeded s = seeded("rtxpro6000_8gpu_switches");
  ASSERT_EQ(s.in.doublingOrder, 0x102u);
  ASSERT_EQ(s.in.doublingRoundGBps, (std::vector<double>{50, 54.5, 54.5}));
  EXPECT_NEAR(doublingPushUs(16, s.in), kLaunchUs + 3 * 1.3, 0.01);
  const double B = 16 * KB;
  const double uplink = 24.0 * 16 / 7;
  const double across = 50 * 0.8, inside = 54.5 * 0.8;
  EXPECT_NEAR(slopeUs(doublingPushUs, s.in, B),
              std::max(4 * B / (uplink * 1e3), B / (across * 1e3)) + 6 * B / (inside * 1e3), 1e-6);
  // Predicted at 16 KB: 9.3 us against the two-level form's 11.4, the one-shot push's 13.6 and
  // NCCL's 22.2; issue 43's 8 us is met to 8 KB (7.6), not at 16 KB: the relayed bytes (seven
  // vectors a GPU, as the one-shot's) take 3.4 us at one flow's rate.
  EXPECT_NEAR(doublingPushUs(16 * KB, s.in), 9.3, 0.05);
  EXPECT_NEAR(doublingPushUs(8 * KB, s.in), 7.6, 0.05);
  // The fused operation at hidden 6144 and one token (12 KB): the fused kernel (the epilogue in
  // the same kernel) over its 8.5 us all-reduce, short of issue 43's 9 us.
  const uint64_t row = 6144 * 2;
  EXPECT_NEAR(doublingPushUs(row, s.in), 8.5, 0.05);
  EXPECT_EQ(pathName(Op::AddRmsNorm, s.table.lookup(Op::AddRmsNorm, row)), "fused:doubling-push");
  EXPECT_GT(seedTimeUs(Op::AddRmsNorm, Path{anyrAlgoDoublingPush, true}, row, s.in), 9.0);
  EXPECT_LT(seedTimeUs(Op::AddRmsNorm, Path{anyrAlgoDoublingPush, true}, row, s.in),
            seedTimeUs(Op::AddRmsNorm, Path{anyrAlgoDoublingPush, false}, row, s.in));
  EXPECT_LT(doublingPushUs(16 * KB, s.in), islandsUs(16 * KB, s.in));
  EXPECT_LT(doublingPushUs(16 * KB, s.in), oneShotPushUs(16 * KB, s.in));
  // Islands forced across the switches (0+2+4+6 | 1+3+5+7) order the rounds for them: the
  // round across the real uplinks (rank ^ 4) comes last with four vectors a flow, and the model
  // counts its flows on the switch groups, so it charges more.
  Config cfg;
  std::string why;
  ASSERT_TRUE(parseIslands("0+2+4+6,1+3+5+7", &cfg.islands, &why)) << why;
  const CostInputs crossed = costInputs(s.t, cfg, 8);
  EXPECT_EQ(crossed.doublingOrder, 0x210u);
  EXPECT_GT(doublingPushUs(16 * KB, crossed), doublingPushUs(16 * KB, s.in) + 2.0);
}

TEST(Doubling, TheMeasuredOnePartnerRoundDecidesItBehindSwitches) {
  // Its three rounds are what the fabric measures at init as the one-partner round
  // (Topology::load.hopUs): where that round is slow (3 us), three of them cost more than the
  // one-shot push's loaded all-to-all round and the seed keeps the one-shot push, then the
  // two-level form; where it is fast (0.6 us), issue 43's 16 KB in 8 us is predicted (7.2 us),
  // and its fused row of 6144 at one token in 9 us (8.0). Three rounds a call: both goals hold
  // for a measured round up to about 0.87 us.
  // NCCL's hop stays its own (1.3 us) either way.
  for (const auto& [hop, sixteen, small] : {std::tuple{3.0, "islands", "oneshot-push"},
                                            std::tuple{0.6, "doubling-push", "doubling-push"}}) {
    SCOPED_TRACE("round " + std::to_string(hop) + " us");
    Topology t = fixture("rtxpro6000_8gpu_switches");
    t.load.hopUs = hop;
    const Seeded s = seededTopology(t);
    EXPECT_DOUBLE_EQ(s.in.hopUs, hop);
    EXPECT_DOUBLE_EQ(s.in.ringHopUs, 1.3);
    EXPECT_NEAR(doublingPushUs(16, s.in), kLaunchUs + 3 * hop, 0.01);
    EXPECT_EQ(pathName(Op::AllReduce, s.table.lookup(Op::AllReduce, 1 * KB)), small);
    EXPECT_EQ(pathName(Op::AllReduce, s.table.lookup(Op::AllReduce, 16 * KB)), sixteen);
  }
  Topology fast = fixture("rtxpro6000_8gpu_switches");
  fast.load.hopUs = 0.6;
  EXPECT_NEAR(doublingPushUs(16 * KB, seededTopology(fast).in), 7.2, 0.05);
  // And its fused goal (hidden 6144, one token, <= 9 us) with the epilogue in the same kernel.
  const uint64_t row = 6144 * 2;
  const Seeded f = seededTopology(fast);
  EXPECT_EQ(pathName(Op::AddRmsNorm, f.table.lookup(Op::AddRmsNorm, row)), "fused:doubling-push");
  EXPECT_NEAR(seedTimeUs(Op::AddRmsNorm, Path{anyrAlgoDoublingPush, true}, row, f.in), 8.0, 0.05);
  // Explain says which round the model used, and whether it was measured.
  const std::string measured = costInputs(fast, Config{}, 8).summary;
  EXPECT_NE(measured.find("one-partner round 0.6 us, NCCL hop 1.3 us"), std::string::npos)
      << measured;
  const std::string assumed = seeded("rtxpro6000_8gpu_switches").in.summary;
  EXPECT_NE(assumed.find("one-partner round 1.3 us (NCCL's hop), NCCL hop 1.3 us"),
            std::string::npos)
      << assumed;
  // A round measured on another world size is not this one's.
  Topology other = fixture("rtxpro6000_8gpu_switches");
  other.load.hopUs = 0.6;
  other.load.ranks = 4;
  EXPECT_FALSE(costInputs(other, Config{}, 8).hopMeasured);
  EXPECT_DOUBLE_EQ(costInputs(other, Config{}, 8).hopUs, 1.3);
}

TEST(Doubling, OnTwoSocketsItIsOneAndAHalfTimesTheAllToAllOneShotFromSixteenKilobytes) {
  // Issue 43's goal for the dual-socket box (>= 1.5x the all-to-all one-shot push from 16 KB to
  // 1 MB): the two-level form ("islands") reaches it from 64 KB; the doubling push, whose only
  // round across the sockets carries one vector a flow (at the cross pairs' 45 GB/s) and whose
  // other rounds stay inside them (54 GB/s), from 16 KB. The faster of the two is 1.5x or more
  // at every size from 16 KB to 1 MB.
  const Seeded s = seeded("rtxpro6000_8gpu_dual_socket");
  ASSERT_EQ(s.in.doublingOrder, 0x102u);
  for (uint64_t b = 16 * KB; b <= 1024 * KB; b *= 2) {
    const double B = static_cast<double>(b);
    const double best = std::min(doublingPushUs(B, s.in), islandsUs(B, s.in));
    EXPECT_GE(oneShotPushUs(B, s.in) / best, 1.5) << b;
  }
  EXPECT_GE(oneShotPushUs(16.0 * KB, s.in) / doublingPushUs(16.0 * KB, s.in), 1.5);
  EXPECT_LT(oneShotPushUs(16.0 * KB, s.in) / islandsUs(16.0 * KB, s.in), 1.5);
}

TEST(Doubling, OverNvlinkTheAllToAllRoundIsCheapAndTheOneShotStays) {
  // NVLink's loaded round adds 0.05 us a peer: one round of seven beats three hops.
  const Seeded s = seeded("nvlink_8gpu");
  for (int b = 10; b <= 28; ++b) {
    const double B = static_cast<double>(bucketBytes(b));
    EXPECT_GT(doublingPushUs(B, s.in), oneShotPushUs(B, s.in)) << B;
    for (int o = 0; o < kNumOps; ++o) {
      EXPECT_NE(s.table.lookup(static_cast<Op>(o), bucketBytes(b)).algo, anyrAlgoDoublingPush) << B;
    }
  }
}

TEST(Doubling, TheSeedNeverTakesItWhereNcclIsPredictedFaster) {
  for (const char* name : {"rtxpro6000_8gpu_switches", "rtxpro6000_8gpu_dual_socket",
                           "l40s_8gpu_numa", "pcie_8gpu_two_switches"}) {
    const Seeded s = seeded(name);
    for (int o = 0; o < kNumOps; ++o) {
      const Op op = static_cast<Op>(o);
      for (int b = 10; b <= 28; ++b) {
        const uint64_t bytes = bucketBytes(b);
        const Path p = s.table.lookup(op, bytes);
        if (p.algo != anyrAlgoDoublingPush) continue;
        EXPECT_LE(seedTimeUs(op, p, bytes, s.in),
                  seedTimeUs(op, forcedPath(op, anyrAlgoNccl), bytes, s.in) + 1e-9)
            << name << " " << opName(op) << " " << bytes;
      }
    }
  }
}

// ---- explain ----------------------------------------------------------------------------------

TEST(Doubling, ExplainShowsItAmongTheCandidatesWithItsSeedTime) {
  const std::string text = testfix::explainOf(seeded("rtxpro6000_8gpu_switches"));
  for (const char* must :
       {"16K       doubling-push ", " doubling-push 9.3 ", " doubling-push+epilogue "}) {
    EXPECT_NE(text.find(must), std::string::npos) << must << "\n" << text;
  }
}

}  // namespace
}  // namespace anyr
