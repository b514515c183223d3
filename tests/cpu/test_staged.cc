// The staged one-shots (staged-push, staged-pull: in round k rank r talks to rank r + k only):
// admitted exactly where the one-shot push and pull they stage are; costed by the fabric
// model's terms (algo/cost.cc, stagedUs: a one-partner round each, one flow per link, a switch
// uplink's bytes unchanged); shown by explain; and where the seed does and does not take them
// on the sourced fixtures, and why.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "algo/cost.h"
#include "base/config.h"
#include "cpu/select_fixtures.h"
#include "select/admission.h"
#include "select/dispatch.h"
#include "select/explain.h"
#include "topology/topology.h"

namespace anyr {
namespace {

using testfix::fixture;
using testfix::Seeded;
using testfix::seeded;
using testfix::seededTopology;

constexpr uint64_t KB = 1024, MB = 1024 * 1024;

std::string chosen(const Seeded& s, Op op, uint64_t bytes) {
  return pathName(op, s.table.lookup(op, bytes));
}

// The bytes term of a cost: what twice the message adds, in one launch.
template <typename F>
double slopeUs(F&& cost, const CostInputs& in, double bytes) {
  return cost(2 * bytes, in) - cost(bytes, in);
}

// The fixture with a measured one-partner round of `us` in its load record (the staged round's
// own figure: 1 KB and a flag to one peer, a wait for one, every rank at once).
Topology withHop(const std::string& name, double us) {
  Topology t = fixture(name);
  t.load.hopUs = us;
  return t;
}

// ---- admission ---------------------------------------------------------------------------------

TEST(Staged, AdmittedExactlyWhereTheOneShotsTheyStageAre) {
  for (const char* name :
       {"nvlink_pair", "nvlink_8gpu", "pcie_8gpu_two_switches", "pcie_slow_writes",
        "pcie_no_atomics", "no_p2p", "rtxpro6000_8gpu_switches", "rtxpro6000_8gpu_dual_socket",
        "rtxpro6000_8gpu_switches_nop2p", "l40s_8gpu_numa", "rtxpro6000_16gpu_slow_writes"}) {
    const Seeded s = seeded(name);
    for (const auto& [staged, base] : {std::pair{anyrAlgoStagedPush, anyrAlgoOneShotPush},
                                       std::pair{anyrAlgoStagedPull, anyrAlgoOneShotPull}}) {
      EXPECT_EQ(s.adm[staged].admitted, s.adm[base].admitted)
          << name << " " << anyrAlgoName(staged);
      EXPECT_EQ(s.adm[staged].reason, s.adm[base].reason) << name << " " << anyrAlgoName(staged);
    }
  }
  // One pair's failed write check rejects the staged push (naming the pair), not the pull; a
  // failed read check the other way round.
  Topology w = fixture("rtxpro6000_8gpu_switches");
  w.pair(2, 5).peerWriteOk = false;
  const Seeded sw = seededTopology(w);
  EXPECT_FALSE(sw.adm[anyrAlgoStagedPush].admitted);
  EXPECT_EQ(sw.adm[anyrAlgoStagedPush].reason,
            "peer write rank 2 -> rank 5 failed its transfer check or is not mapped");
  EXPECT_TRUE(sw.adm[anyrAlgoStagedPull].admitted) << sw.adm[anyrAlgoStagedPull].reason;
  Topology r = fixture("rtxpro6000_8gpu_switches");
  r.pair(6, 1).peerReadOk = false;
  const Seeded sr = seededTopology(r);
  EXPECT_TRUE(sr.adm[anyrAlgoStagedPush].admitted) << sr.adm[anyrAlgoStagedPush].reason;
  EXPECT_FALSE(sr.adm[anyrAlgoStagedPull].admitted);
  EXPECT_EQ(sr.adm[anyrAlgoStagedPull].reason,
            "peer read rank 6 -> rank 1 failed its transfer check or is not mapped");
}

// ---- cost
// ----------------------------------------------------------------------------------------

TEST(Staged, WithTwoRanksTheyAreTheOneShotsAndTheTieGoesToTheOneShot) {
  // One round to one peer: the same kernels, so the same cost; the registry's order (the
  // one-shots first) breaks the tie, and the seed never takes a staged form at two ranks.
  for (const char* name : {"rtxpro6000_8gpu_switches", "l40s_8gpu_numa", "nvlink_pair"}) {
    const Seeded s = seeded(name, 2);
    for (int b = 10; b <= 28; ++b) {
      const double B = static_cast<double>(bucketBytes(b));
      EXPECT_DOUBLE_EQ(stagedPushUs(B, s.in), oneShotPushUs(B, s.in)) << name << " " << B;
      EXPECT_DOUBLE_EQ(stagedPullUs(B, s.in), oneShotPullUs(B, s.in)) << name << " " << B;
      for (int o = 0; o < kNumOps; ++o) {
        const anyrAlgo_t a = s.table.lookup(static_cast<Op>(o), bucketBytes(b)).algo;
        EXPECT_NE(a, anyrAlgoStagedPush) << name << " " << B;
        EXPECT_NE(a, anyrAlgoStagedPull) << name << " " << B;
      }
    }
  }
}

TEST(Staged, ARoundCostsAOnePartnerRoundNotTheLoadedAllToAllRound) {
  // 8 x RTX PRO 6000 behind switches: no one-partner round measured, so a round is NCCL's LL hop
  // over PCIe (1.3 us; also the model's synchronisation round with one peer: 0.45 idle + 0.85),
  // against one loaded all-to-all round of 6.79 us for the one-shot push. Seven rounds cost more
  // than that one round: 2 + 7 x 1.3 at the smallest size.
  const Seeded s = seeded("rtxpro6000_8gpu_switches");
  ASSERT_EQ(s.in.nranks, 8);
  EXPECT_DOUBLE_EQ(s.in.ringHopUs, 1.3);
  EXPECT_DOUBLE_EQ(s.in.hopUs, 1.3);
  EXPECT_FALSE(s.in.hopMeasured);
  EXPECT_NEAR(stagedPushUs(16, s.in), kLaunchUs + 7 * 1.3, 0.01);
  // Pull: the one-shot pull's handshake (two loaded rounds), then a read's round trip a round.
  EXPECT_NEAR(stagedPullUs(16, s.in), kLaunchUs + 2 * s.in.syncUs + 14 * 1.3, 0.01);
  // A measured round replaces it; none is taken below the slowest pair's idle latency.
  const Seeded fast = seededTopology(withHop("rtxpro6000_8gpu_switches", 0.6));
  EXPECT_NEAR(stagedPushUs(16, fast.in), kLaunchUs + 7 * 0.6, 0.01);
  const Seeded tooFast = seededTopology(withHop("rtxpro6000_8gpu_switches", 0.1));
  EXPECT_NEAR(stagedPushUs(16, tooFast.in), kLaunchUs + 7 * tooFast.in.latencyUs, 0.01);
  EXPECT_DOUBLE_EQ(tooFast.in.latencyUs, 0.45);
  // Messages larger than a push slot (512 KiB / 7) or a staging chunk pay the rounds per launch.
  const double slot = static_cast<double>(s.in.pushSlotBytes);
  EXPECT_NEAR(stagedPushUs(2 * slot, s.in) - 2 * stagedPushUs(slot, s.in), 0, 0.01);
}

TEST(Staged, BehindSwitchesTheUplinkKeepsItsBytesSoTheOneShotPushStaysAhead) {
  // Switches of 4 + 4: 16 of the 28 flows a GPU pair set cross each switch's uplink whatever
  // their order. The measured all-to-all (24 GB/s per GPU) is that uplink at 16/7 x 24 = 55 GB/s
  // (a Gen5 x16 link), so the staged bytes take the all-to-all's own time: staging saves the
  // loaded round there, not bandwidth, and seven rounds (9.1 us) cost more than that round
  // (6.79 us). The seed keeps the one-shot push (to 16 KB), then the two-shot push and NCCL.
  const Seeded s = seeded("rtxpro6000_8gpu_switches");
  for (double B : {4.0 * KB, 16.0 * KB}) {
    EXPECT_NEAR(slopeUs(stagedPushUs, s.in, B), slopeUs(oneShotPushUs, s.in, B), 1e-9) << B;
  }
  for (int b = 10; b <= 28; ++b) {
    const double B = static_cast<double>(bucketBytes(b));
    EXPECT_GT(stagedPushUs(B, s.in), oneShotPushUs(B, s.in)) << B;
    for (int o = 0; o < kNumOps; ++o) {
      const anyrAlgo_t a = s.table.lookup(static_cast<Op>(o), bucketBytes(b)).algo;
      EXPECT_NE(a, anyrAlgoStagedPush) << B;
      EXPECT_NE(a, anyrAlgoStagedPull) << B;
    }
  }
  EXPECT_NEAR(stagedPushUs(16 * KB, s.in), 15.9, 0.05);
  EXPECT_NEAR(oneShotPushUs(16 * KB, s.in), 13.6, 0.05);
}

TEST(Staged, TheSixteenKilobyteGoalIsOutOfTheStagedScheduleReachBehindSwitches) {
  // Issue 43 asks for 16 KB <= 8 us on this fixture. A staged push cannot get there honestly:
  // even with every round at the idle one-way latency (0.45 us, a round measured no slower
  // than that), the launch and the uplink's bytes (the 16 crossing flows, 4.8 us) already take
  // 6.8 us, and seven rounds add 3.2. That goal needs fewer bytes across the uplinks (the
  // two-level form), not another order of the same bytes.
  const Seeded best = seededTopology(withHop("rtxpro6000_8gpu_switches", 0.01));
  const double B = 16 * KB;
  const double uplink = slopeUs(stagedPushUs, best.in, B);
  EXPECT_NEAR(uplink, 16 * B / (24.0 * 16 / 7 * 1e3), 1e-6);
  EXPECT_NEAR(stagedPushUs(B, best.in), kLaunchUs + 7 * 0.45 + uplink, 1e-6);
  EXPECT_GT(stagedPushUs(B, best.in), 8.0);
}

TEST(Staged, WithoutASharedUplinkStagingAvoidsTheAllToAllCollapse) {
  // Two sockets, no switches (all-to-all measured at 0.41 of the links, 21.6 GB/s per GPU): one
  // flow per link runs at the pair's rate (45 GB/s x 0.8 between sockets), so the staged bytes
  // take 0.6 of the all-to-all's time; the staged push passes the one-shot push from 32 KB.
  // The two-shot push (an eighth of the bytes each way) and NCCL stay ahead of it, so the seed
  // does not take it.
  const Seeded s = seeded("rtxpro6000_8gpu_dual_socket");
  const double B = 16 * KB;
  EXPECT_NEAR(slopeUs(stagedPushUs, s.in, B), 7 * B / (45 * 0.8 * 1e3), 1e-6);
  EXPECT_NEAR(slopeUs(stagedPushUs, s.in, B) / slopeUs(oneShotPushUs, s.in, B), 0.6, 0.01);
  EXPECT_GT(stagedPushUs(16 * KB, s.in), oneShotPushUs(16 * KB, s.in));
  for (double b : {32.0 * KB, 64.0 * KB}) {
    EXPECT_LT(stagedPushUs(b, s.in), oneShotPushUs(b, s.in)) << b;
    EXPECT_GT(stagedPushUs(b, s.in), twoShotPushUs(b, s.in)) << b;
  }
  for (int b = 10; b <= 28; ++b) {
    EXPECT_NE(s.table.lookup(Op::AllReduce, bucketBytes(b)).algo, anyrAlgoStagedPush) << b;
  }
}

TEST(Staged, WhereTheFabricMeasuresAFastRoundTheStagedPushBeatsTheOneShotNotTheDoubling) {
  // The same two-socket box with our one-partner round measured at 0.5 us (Topology::load):
  // seven rounds (3.5 us) now cost less than one loaded all-to-all round (6.03 us), and without
  // a shared uplink the bytes move at one flow's rate, so the staged push beats the one-shot push
  // from 1 to 16 KB. The doubling push moves the same bytes as one flow per link too, in three of
  // those rounds instead of seven, so it is the seed there and to 64 KB (its fused kernel for the
  // fused operation). NCCL keeps its own hop (1.3 us over PCIe: our round measured is not its
  // hop), so its 22.2 us is passed only from 128 KB.
  const Seeded s = seededTopology(withHop("rtxpro6000_8gpu_dual_socket", 0.5));
  EXPECT_DOUBLE_EQ(s.in.hopUs, 0.5);
  EXPECT_TRUE(s.in.hopMeasured);
  EXPECT_DOUBLE_EQ(s.in.ringHopUs, 1.3);
  for (uint64_t b : {1 * KB, 4 * KB, 16 * KB}) {
    const double B = static_cast<double>(b);
    EXPECT_LT(stagedPushUs(B, s.in), oneShotPushUs(B, s.in)) << b;
    EXPECT_LT(doublingPushUs(B, s.in), stagedPushUs(B, s.in)) << b;
    EXPECT_EQ(chosen(s, Op::AllReduce, b), "doubling-push") << b;
    EXPECT_EQ(chosen(s, Op::AddRmsNorm, b), "fused:doubling-push") << b;
  }
  EXPECT_EQ(chosen(s, Op::AllReduce, 32 * KB), "doubling-push");
  EXPECT_EQ(chosen(s, Op::AllReduce, 64 * KB), "doubling-push");
  EXPECT_EQ(chosen(s, Op::AllReduce, 128 * KB), "nccl");
  EXPECT_NEAR(stagedPushUs(16 * KB, s.in), kLaunchUs + 7 * 0.5 + 7 * 16 * KB / (36.0 * 1e3), 1e-6);
  // Never a path predicted slower than NCCL.
  for (int o = 0; o < kNumOps; ++o) {
    const Op op = static_cast<Op>(o);
    for (int b = 10; b <= 28; ++b) {
      const uint64_t bytes = bucketBytes(b);
      EXPECT_LE(seedTimeUs(op, s.table.lookup(op, bytes), bytes, s.in),
                seedTimeUs(op, forcedPath(op, anyrAlgoNccl), bytes, s.in) + 1e-9)
          << opName(op) << " " << bytes;
    }
  }
}

TEST(Staged, ThePullPaysTheHandshakeAndARoundTripPerRound) {
  // The staged pull keeps the one-shot pull's flag handshake and reads one peer per round, a
  // round trip each: at 8 ranks, in one launch of each, it is behind the staged push on every
  // sourced fixture whose writes are as fast as its reads (the push's launches are smaller:
  // 512 KiB / 7 against an 8 MiB chunk), and ahead of it where reads beat writes (b12x#139:
  // writes 20x slower).
  for (const char* name :
       {"rtxpro6000_8gpu_switches", "rtxpro6000_8gpu_dual_socket", "l40s_8gpu_numa"}) {
    const Seeded s = seeded(name);
    for (double B : {1.0 * KB, 16.0 * KB, 64.0 * KB}) {
      EXPECT_GT(stagedPullUs(B, s.in), stagedPushUs(B, s.in)) << name << " " << B;
    }
  }
  const Seeded slow = seeded("rtxpro6000_16gpu_slow_writes", 8);
  EXPECT_LT(stagedPullUs(64 * KB, slow.in), stagedPushUs(64 * KB, slow.in));
  // No load record there: the one-shot pull's reads are charged on the same links, so staging
  // them only adds rounds.
  for (double B : {1.0 * KB, 64.0 * KB, 1.0 * MB}) {
    EXPECT_GT(stagedPullUs(B, slow.in), oneShotPullUs(B, slow.in)) << B;
  }
}

// ---- explain
// -------------------------------------------------------------------------------------

TEST(Staged, ExplainShowsBothAmongTheCandidatesWithTheirSeedTimes) {
  const std::string text = testfix::explainOf(seeded("rtxpro6000_8gpu_switches"));
  for (const char* must : {" staged-push 15.9 staged-pull 38.6 ", " staged-push+epilogue 19.0 "}) {
    EXPECT_NE(text.find(must), std::string::npos) << must << "\n" << text;
  }
}

}  // namespace
}  // namespace anyr
