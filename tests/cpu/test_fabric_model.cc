// The fabric model against published and recorded figures: fed each sourced fixture
// (tests/fixtures/make_public_fixtures.py) it predicts the published NCCL and custom
// all-reduce times within 30%; fed the 2 x H200 pair it predicts the times recorded there
// (docs/runs) within 25% at every size the seed chooses; on every fixture the seed's choice at
// each size is stated with its reason, and never one predicted slower than NCCL. Also: the
// load figures hold only at their world size, and nominal PCIe bandwidth comes from the link's
// maximum, not its idle generation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "algo/cost.h"
#include "base/config.h"
#include "cpu/select_fixtures.h"
#include "select/admission.h"
#include "select/dispatch.h"
#include "topology/topology.h"

namespace anyr {
namespace {

using testfix::fixture;

using testfix::Seeded;
using testfix::seeded;

std::string chosen(const Seeded& s, Op op, uint64_t bytes) {
  return pathName(op, s.table.lookup(op, bytes));
}

double predicted(const Seeded& s, Op op, const std::string& path, uint64_t bytes) {
  Path p;
  EXPECT_TRUE(parsePath(op, path, &p)) << path;
  return seedTimeUs(op, p, bytes, s.in);
}

// |predicted / published - 1| <= tolerance.
void expectWithin(double model, double published, double tolerance, const std::string& what) {
  EXPECT_GT(model, 0) << what;
  EXPECT_LE(std::fabs(model / published - 1.0), tolerance)
      << what << ": model " << model << " us, published/recorded " << published << " us";
}

constexpr uint64_t KB = 1024, MB = 1024 * 1024;

// ---- published figures -----------------------------------------------------------------------

TEST(FabricModel, SeedsMachineMatchesPublishedNcclAndCustomAllReduceTimes) {
  // voipmonitor/rtx6kpro: 8 x RTX PRO 6000 behind switches, a custom one-shot all-reduce
  // against NCCL (graph replay), us.
  const Seeded s = seeded("rtxpro6000_8gpu_switches");
  ASSERT_TRUE(s.in.loadMeasured);
  const struct {
    uint64_t bytes;
    double custom, nccl;
  } published[] = {{256, 7.5, 24.6},
                   {8 * KB, 9.2, 24.2},
                   {32 * KB, 16.5, 24.5},
                   {64 * KB, 25.9, 24.1},
                   {256 * KB, 73.6, 28.0}};
  // The published kernel writes the whole message in one launch: the model's one-shot push
  // with a push slot of the message's size.
  CostInputs oneLaunch = s.in;
  oneLaunch.pushSlotBytes = 1 * MB;
  for (const auto& f : published) {
    const std::string at = std::to_string(f.bytes) + " B";
    expectWithin(ncclUs(static_cast<double>(f.bytes), s.in), f.nccl, 0.30, "NCCL at " + at);
    expectWithin(oneShotPushUs(static_cast<double>(f.bytes), oneLaunch), f.custom, 0.30,
                 "one-shot at " + at);
  }
  // The loaded round grows with the ranks: published 6.03-7.48 us at 8 GPUs, 2.12-4.10 at 4
  // (the fixture's load figures hold at 8; at 4 the seed's per-peer term decides).
  EXPECT_GE(s.in.syncUs, 6.0);
  EXPECT_LE(s.in.syncUs, 7.4);
  const Seeded four = seeded("rtxpro6000_8gpu_switches", 4);
  EXPECT_FALSE(four.in.loadMeasured);
  EXPECT_GE(four.in.syncUs, 2.1);
  EXPECT_LE(four.in.syncUs, 4.1);
}

TEST(FabricModel, NcclWithoutPeerAccessAndOnTheSlowWritePlatformMatchesPublishedFigures) {
  // NVIDIA/nccl#1530: 8 x RTX 4090 without P2P, 42 us at 8 B.
  const Seeded nop2p = seeded("rtxpro6000_8gpu_switches_nop2p");
  EXPECT_TRUE(nop2p.in.ncclViaHost);
  expectWithin(ncclUs(8, nop2p.in), 42.0, 0.30, "NCCL through host memory, 8 ranks, 8 B");
  // b12x#139: 16 x RTX PRO 6000, bf16 [1, 7168] (14 KB): NCCL 36.07 us.
  const Seeded b12x = seeded("rtxpro6000_16gpu_slow_writes");
  expectWithin(ncclUs(7168 * 2, b12x.in), 36.07, 0.30, "NCCL, 16 ranks, 14 KB");
}

// ---- recorded 2 x H200 figures ---------------------------------------------------------------

TEST(FabricModel, NvlinkPairPredictsTheRecordedTimesOfWhatTheSeedChooses) {
  // docs/runs/2026-11-29-session1-final.json: 2 x H200, bf16, graph replay: the time of the
  // automatic choice and of NCCL, us.
  const Seeded s = seeded("nvlink_pair");
  const struct {
    uint64_t bytes;
    double chosen, nccl;
  } recorded[] = {{1 * KB, 2.69, 5.87},     {4 * KB, 2.96, 6.28},
                  {16 * KB, 3.03, 6.85},    {64 * KB, 3.31, 7.20},
                  {256 * KB, 4.00, 8.51},   {1 * MB, 6.78, 13.95},
                  {4 * MB, 15.92, 32.29},   {16 * MB, 58.72, 77.46},
                  {64 * MB, 234.32, 248.18}};  // 64 MB: the two-shot push, forced
  for (const auto& r : recorded) {
    const std::string at = std::to_string(r.bytes) + " B";
    const std::string path = chosen(s, Op::AllReduce, r.bytes);
    expectWithin(predicted(s, Op::AllReduce, path, r.bytes), r.chosen, 0.25, path + " at " + at);
    expectWithin(predicted(s, Op::AllReduce, "nccl", r.bytes), r.nccl, 0.25, "nccl at " + at);
  }
  // docs/runs/2026-11-30-pdl-default-host-copy.json: fused all-reduce + add + RMSNorm at hidden
  // 6144, the automatic path and NCCL + the standalone kernel, us.
  const struct {
    int tokens;
    double fused, ncclK;
  } fused[] = {{1, 4.93, 11.54},    {8, 5.29, 11.09},      {32, 7.20, 13.18},
               {64, 9.50, 16.32},   {128, 10.95, 21.58},   {256, 17.70, 35.19},
               {512, 29.63, 50.33}, {2048, 125.26, 144.10}};
  for (const auto& f : fused) {
    const uint64_t bytes = static_cast<uint64_t>(f.tokens) * 6144 * 2;
    const std::string at = std::to_string(f.tokens) + " tokens";
    const std::string path = chosen(s, Op::AddRmsNorm, bytes);
    expectWithin(predicted(s, Op::AddRmsNorm, path, bytes), f.fused, 0.25, path + " at " + at);
    expectWithin(predicted(s, Op::AddRmsNorm, "nccl+epilogue", bytes), f.ncclK, 0.25,
                 "nccl+epilogue at " + at);
  }
}

// ---- the seed's choices on every sourced fixture ---------------------------------------------

struct Expect {
  uint64_t bytes;
  const char* allReduce;
  const char* fused;  // add + RMSNorm at the same message size
};

void expectChoices(const Seeded& s, const std::vector<Expect>& want, const std::string& name) {
  for (const Expect& e : want) {
    EXPECT_EQ(chosen(s, Op::AllReduce, e.bytes), e.allReduce) << name << " at " << e.bytes;
    EXPECT_EQ(chosen(s, Op::AddRmsNorm, e.bytes), e.fused) << name << " at " << e.bytes;
  }
}

// Hidden 6144 and 7168 at one token and at 128 tokens (bf16): the fused operation's sizes.
constexpr uint64_t k6144x1 = 6144 * 2, k7168x1 = 7168 * 2;
constexpr uint64_t k6144x128 = 6144 * 2 * 128, k7168x128 = 7168 * 2 * 128;

TEST(FabricModel, SeedsMachineChoicesAndWhy) {
  // Behind two switches at 8 ranks: one loaded round costs 6.7 us, three one-peer hops 3.9, so
  // to 32 KB the doubling push (the one-shot's vectors relayed in three rounds, the round that
  // crosses the switches first, one vector a flow; the fused operation runs its fused kernel);
  // at 64 KB the two-level form over the two switch groups (a ninth of the
  // one-shot's bytes across the host bridge, one partner there instead of four; the fused
  // operation its fused kernel, which saves the composition's second kernel, to 128 KB); from
  // 128 KB NCCL's ring, which does not share the switches' uplinks all to all.
  const Seeded s = seeded("rtxpro6000_8gpu_switches");
  expectChoices(s,
                {{1 * KB, "doubling-push", "fused:doubling-push"},
                 {8 * KB, "doubling-push", "fused:doubling-push"},
                 {k6144x1, "doubling-push", "fused:doubling-push"},
                 {k7168x1, "doubling-push", "fused:doubling-push"},
                 {16 * KB, "doubling-push", "fused:doubling-push"},
                 {64 * KB, "islands", "fused:islands"},
                 {128 * KB, "nccl", "fused:islands"},
                 {256 * KB, "nccl", "nccl+epilogue"},
                 {1 * MB, "nccl", "nccl+epilogue"},
                 {k6144x128, "nccl", "nccl+epilogue"},
                 {k7168x128, "nccl", "nccl+epilogue"},
                 {16 * MB, "nccl", "nccl+epilogue"},
                 {256 * MB, "nccl", "nccl+epilogue"}},
                "rtxpro6000_8gpu_switches");
}

TEST(FabricModel, DualSocketChoicesAndWhy) {
  // No switches, two sockets (published all-to-all 0.41 of ideal, a loaded round of 6.03 us):
  // the same ladder as behind switches: the doubling push to 32 KB, the two-level form over
  // the two sockets at 64 KB (and for the fused operation its fused kernel to 128 KB, which
  // saves the composition's second kernel), then NCCL.
  const Seeded s = seeded("rtxpro6000_8gpu_dual_socket");
  expectChoices(s,
                {{1 * KB, "doubling-push", "fused:doubling-push"},
                 {k6144x1, "doubling-push", "fused:doubling-push"},
                 {16 * KB, "doubling-push", "fused:doubling-push"},
                 {64 * KB, "islands", "fused:islands"},
                 {128 * KB, "nccl", "fused:islands"},
                 {256 * KB, "nccl", "nccl+epilogue"},
                 {1 * MB, "nccl", "nccl+epilogue"},
                 {16 * MB, "nccl", "nccl+epilogue"},
                 {256 * MB, "nccl", "nccl+epilogue"}},
                "rtxpro6000_8gpu_dual_socket");
}

// Issue 43's goal on the dual-socket box: the two-level form ("islands", over the two sockets)
// predicted >= 1.5x the all-to-all one-shot push at 16 KB-1 MB. The model gives it from 64 KB to
// 1 MB (1.8x at 64 KB, 3.5x at 1 MB), not below: there the message is latency-bound, and the
// two-level form's three dependent hops (gather among 4, exchange with 1 partner, all-gather
// among 4) cost more than the one-shot's single loaded round of 7 peers; what it saves is bytes
// (per GPU the one-shot sends 7 x the message, 4 x across the sockets; the two-level form 1.5 x
// inside its socket and 1 x across, the values unreduced for the rank-order sum), which only
// outweighs the extra hops from about 32 KB (1.23x at 16 KB, 1.46x at 32 KB).
TEST(FabricModel, DualSocketTwoLevelFormAgainstTheAllToAllOneShot) {
  const Seeded s = seeded("rtxpro6000_8gpu_dual_socket");
  ASSERT_TRUE(s.adm[anyrAlgoIslands].admitted) << s.adm[anyrAlgoIslands].reason;
  auto ratio = [&](uint64_t b) {
    const double B = static_cast<double>(b);
    return oneShotPushUs(B, s.in) / islandsUs(B, s.in);
  };
  for (uint64_t b = 64 * KB; b <= 1 * MB; b *= 2) {
    EXPECT_GE(ratio(b), 1.5) << b << " B: one-shot " << oneShotPushUs(static_cast<double>(b), s.in)
                             << " us, islands " << islandsUs(static_cast<double>(b), s.in);
  }
  EXPECT_GT(ratio(16 * KB), 1.15);
  EXPECT_LT(ratio(16 * KB), 1.5);  // the shortfall stated above, until the model says otherwise
  EXPECT_GT(ratio(32 * KB), 1.4);
  // Behind switches it is the same shape (the switch groups' uplinks for the sockets).
  const Seeded sw = seeded("rtxpro6000_8gpu_switches");
  EXPECT_GE(oneShotPushUs(64.0 * KB, sw.in) / islandsUs(64.0 * KB, sw.in), 1.5);
}

TEST(FabricModel, WithoutPeerAccessChoicesAndWhy) {
  // P2P off: host memory or NCCL through it; the host one-shot (one step) to 16 KB, the host
  // two-shot (its traffic overlapped) beyond; NCCL's 14 hops through host memory are predicted
  // slower at every size.
  const Seeded s = seeded("rtxpro6000_8gpu_switches_nop2p");
  expectChoices(s,
                {{1 * KB, "host-oneshot", "host-oneshot+epilogue"},
                 {16 * KB, "host-oneshot", "host-oneshot+epilogue"},
                 {32 * KB, "host-twoshot", "host-twoshot+epilogue"},
                 {256 * KB, "host-twoshot", "host-twoshot+epilogue"},
                 {1 * MB, "host-twoshot", "host-twoshot+epilogue"},
                 {16 * MB, "host-twoshot", "host-twoshot+epilogue"},
                 {256 * MB, "host-twoshot", "host-twoshot+epilogue"}},
                "rtxpro6000_8gpu_switches_nop2p");
}

TEST(FabricModel, L40sChoicesAndWhy) {
  // Gen4, 4 + 4 NUMA, 9.7 GB/s between the halves against 26.3 inside: the doubling push to
  // 32 KB (one vector a flow across the halves, in its first round; the rest inside them at
  // 26.3), then NCCL's ring (25.4 GB/s measured at 8 ranks).
  const Seeded s = seeded("l40s_8gpu_numa");
  expectChoices(s,
                {{1 * KB, "doubling-push", "fused:doubling-push"},
                 {8 * KB, "doubling-push", "fused:doubling-push"},
                 {16 * KB, "doubling-push", "fused:doubling-push"},
                 {32 * KB, "doubling-push", "fused:doubling-push"},
                 {64 * KB, "nccl", "nccl+epilogue"},
                 {256 * KB, "nccl", "nccl+epilogue"},
                 {1 * MB, "nccl", "nccl+epilogue"},
                 {16 * MB, "nccl", "nccl+epilogue"},
                 {256 * MB, "nccl", "nccl+epilogue"}},
                "l40s_8gpu_numa");
}

TEST(FabricModel, SlowWritePlatformPullsAndExplainNamesTheFact) {
  // b12x#139 at 8 ranks: writes 2.6 GB/s against reads 52: no push beyond the smallest call
  // (1 KB: the doubling push's three one-peer hops beat the pull's two full rounds while its
  // writes stay small; its fused kernel for the fused operation); the one-shot pull
  // to 16 KB, its fused kernel for the fused operation, NCCL above.
  const Seeded s = seeded("rtxpro6000_16gpu_slow_writes", 8);
  EXPECT_NE(s.in.summary.find("writes 20x slower than reads on GPU0->GPU1 (pull)"),
            std::string::npos)
      << s.in.summary;
  expectChoices(s,
                {{1 * KB, "doubling-push", "fused:doubling-push"},
                 {16 * KB, "oneshot-pull", "fused:oneshot-pull"},
                 {256 * KB, "nccl", "nccl+epilogue"},
                 {1 * MB, "nccl", "nccl+epilogue"},
                 {16 * MB, "nccl", "nccl+epilogue"},
                 {256 * MB, "nccl", "nccl+epilogue"}},
                "rtxpro6000_16gpu_slow_writes (8 ranks)");
}

// Where peer writes are much slower than reads the fused operations pull too, and they run the
// pull's fused kernel (one kernel: no second launch) rather than the pull composed with the
// standalone epilogue, at every size the fused kernels are modelled for (to 16 MB). Both
// slow-write fixtures: the 16 x RTX PRO 6000 of b12x#139 at 8 ranks, and the 4-GPU one.
TEST(FabricModel, SlowWritePlatformsRunThePullsFusedKernel) {
  struct Fixture {
    const char* name;
    int ranks;
    uint64_t pulled;  // a size where the fused operation pulls
  };
  for (const Fixture& f :
       {Fixture{"rtxpro6000_16gpu_slow_writes", 8, 16 * KB}, Fixture{"pcie_slow_writes", 0, MB}}) {
    const Seeded s = seeded(f.name, f.ranks);
    for (Op op : {Op::AddRmsNorm, Op::AddRmsNormQuant}) {
      EXPECT_EQ(chosen(s, op, f.pulled), "fused:oneshot-pull") << f.name << " " << opName(op);
      int pulls = 0;
      for (int b = 10; b <= 24; ++b) {
        const uint64_t bytes = bucketBytes(b);
        const Path p = s.table.lookup(op, bytes);
        if (p.algo != anyrAlgoOneShotPull && p.algo != anyrAlgoTwoShot) continue;
        ++pulls;
        EXPECT_TRUE(p.fusedKernel)
            << f.name << " " << opName(op) << " " << bytes << ": " << pathName(op, p);
        // The fused kernel saves the composition's second launch.
        const Path composed{p.algo, false};
        EXPECT_LT(seedTimeUs(op, p, bytes, s.in), seedTimeUs(op, composed, bytes, s.in))
            << f.name << " " << bytes;
      }
      EXPECT_GT(pulls, 0) << f.name << " " << opName(op);
    }
  }
}

TEST(FabricModel, TheSeedNeverChoosesAPathPredictedSlowerThanNccl) {
  for (const char* name :
       {"rtxpro6000_8gpu_switches", "rtxpro6000_8gpu_dual_socket", "rtxpro6000_8gpu_switches_nop2p",
        "l40s_8gpu_numa", "nvlink_pair", "nvlink_8gpu"}) {
    for (int ranks : {2, 4, 8}) {
      if (ranks > fixture(name).size()) continue;
      const Seeded s = seeded(name, ranks);
      for (int o = 0; o < kNumOps; ++o) {
        const Op op = static_cast<Op>(o);
        const Path nccl = forcedPath(op, anyrAlgoNccl);
        for (int b = 10; b <= 28; ++b) {
          const uint64_t bytes = bucketBytes(b);
          const double mine = seedTimeUs(op, s.table.lookup(op, bytes), bytes, s.in);
          const double theirs = seedTimeUs(op, nccl, bytes, s.in);
          EXPECT_LE(mine, theirs + 1e-9)
              << name << " x" << ranks << " " << opName(op) << " " << bytes << ": "
              << pathName(op, s.table.lookup(op, bytes));
        }
      }
    }
  }
}

// ---- the ring --------------------------------------------------------------------------------

// The exact ring (algo/ring.cu) moves 3 B per GPU each way for a 16-bit message of B bytes (fp32
// partial sums and the result) against NCCL's 2 (n-1)/n B at kEffNccl of the ring figure, so
// with NCCL admitted the seed never chooses it on these fixtures: at 256 MB it is predicted
// 1.2-1.6x NCCL's time. It is never chosen where predicted slower than NCCL (the test above
// covers every path; here it is stated for the ring alone).
TEST(FabricModel, TheRingIsNeverChosenWhereNcclIsPredictedFaster) {
  int ncclFaster = 0;  // the sizes where the rule below has something to refuse
  for (const char* name : {"rtxpro6000_8gpu_switches", "rtxpro6000_8gpu_dual_socket",
                           "l40s_8gpu_numa", "rtxpro6000_16gpu_slow_writes", "nvlink_8gpu"}) {
    for (int ranks : {2, 4, 8}) {
      const Seeded s = seeded(name, ranks);
      for (int b = 10; b <= 28; ++b) {
        const uint64_t bytes = bucketBytes(b);
        const double B = static_cast<double>(bytes);
        if (ringUs(B, s.in) <= ncclUs(B, s.in)) continue;
        ++ncclFaster;
        EXPECT_NE(s.table.lookup(Op::AllReduce, bytes).algo, anyrAlgoRing)
            << name << " x" << ranks << " at " << bytes;
      }
    }
  }
  EXPECT_GT(ncclFaster, 0) << "no fixture size where NCCL is predicted faster than the ring";
  for (const char* name : {"rtxpro6000_8gpu_switches", "l40s_8gpu_numa"}) {
    const Seeded s = seeded(name);
    const double B = 256.0 * MB;
    const double ratio = ringUs(B, s.in) / ncclUs(B, s.in);
    EXPECT_GE(ratio, 1.2) << name;
    EXPECT_LE(ratio, 1.6) << name;
    // The bytes at the ring figure, plus a pipeline fill per launch (of ANYR_CHUNK_BYTES,
    // 8 MiB by default: 5-8% here).
    const double bytesUs = 3.0 * B / (s.in.ringWriteGBps * 1e3);
    EXPECT_GT(ringUs(B, s.in), bytesUs) << name;
    EXPECT_LT(ringUs(B, s.in), 1.1 * bytesUs) << name;
    EXPECT_EQ(chosen(s, Op::AllReduce, 256 * MB), "nccl") << name;
  }
}

// Without NCCL the ring takes the large messages from the two-shot push where all-to-all stores
// collapse (behind switches: 24 GB/s per GPU all to all against 49.6 to the ring neighbour; on
// the L40S box 9.7 between the NUMA halves against a 25.4 ring), and leaves them to it where the
// ring's bytes cost more than the all-to-all's (the dual-socket box, ring not measured: 36 GB/s
// derated from a pair's 45 against 21.6 all to all for 1.75 B).
TEST(FabricModel, WithoutNcclTheRingTakesLargeMessagesWhereAllToAllCollapses) {
  const Seeded sw = seeded("rtxpro6000_8gpu_switches", 0, false);
  EXPECT_EQ(chosen(sw, Op::AllReduce, 1 * MB), "twoshot-push");
  for (uint64_t bytes : {4 * MB, 16 * MB, 256 * MB}) {
    EXPECT_EQ(chosen(sw, Op::AllReduce, bytes), "ring") << bytes;
    EXPECT_EQ(chosen(sw, Op::AddRmsNorm, bytes), "ring+epilogue") << bytes;
  }
  const Seeded l40s = seeded("l40s_8gpu_numa", 0, false);
  EXPECT_EQ(chosen(l40s, Op::AllReduce, 256 * KB), "twoshot-push");
  for (uint64_t bytes : {1 * MB, 16 * MB, 256 * MB}) {
    EXPECT_EQ(chosen(l40s, Op::AllReduce, bytes), "ring") << bytes;
  }
  const Seeded dual = seeded("rtxpro6000_8gpu_dual_socket", 0, false);
  for (uint64_t bytes : {1 * MB, 16 * MB, 256 * MB}) {
    EXPECT_EQ(chosen(dual, Op::AllReduce, bytes), "twoshot-push") << bytes;
  }
  // Neighbour stores measured under load are the ring's own figure; unmeasured, the slowest
  // neighbour pair's stores derated.
  EXPECT_DOUBLE_EQ(sw.in.ringWriteGBps, 49.6);
  EXPECT_NEAR(dual.in.ringWriteGBps, 45 * kEffRing, 1e-9);
}

// ring-copy moves the ring's bytes through the copy engines at the peer-read figure: where reads
// and stores run alike it is slower than the ring (the copy engines' share of the link, a larger
// chunk to fill the pipeline with), so the seed keeps the ring; where the ring's stores collapse
// and reads do not (hosts that serve peer reads far faster than peer writes), it is the faster
// of the two at large sizes, and where NCCL is predicted faster still, NCCL stays.
TEST(FabricModel, RingCopyWinsOverTheRingOnlyWherePeerReadsOutrunItsStores) {
  const Seeded sw = seeded("rtxpro6000_8gpu_switches", 0, false);
  for (uint64_t bytes : {4 * MB, 16 * MB, 256 * MB}) {
    const double B = static_cast<double>(bytes);
    EXPECT_GT(ringCopyUs(B, sw.in), ringUs(B, sw.in)) << bytes;
    EXPECT_NE(chosen(sw, Op::AllReduce, bytes), "ring-copy") << bytes;
    // Never below its bytes at the link rate it is charged.
    const double load = std::min(1.0, sw.in.ringWriteGBps / sw.in.writeGBps);
    EXPECT_GT(ringCopyUs(B, sw.in), 3.0 * B / (sw.in.readGBps * load * 0.85 * 1e3)) << bytes;
  }
  // Stores at a twentieth of the reads, the ring's under load too.
  CostInputs slow = sw.in;
  slow.writeGBps = sw.in.readGBps / 20;
  slow.ringWriteGBps = slow.writeGBps;
  const double B = 256.0 * MB;
  EXPECT_LT(ringCopyUs(B, slow), ringUs(B, slow));
  EXPECT_LT(ringCopyUs(B, slow), 0.2 * ringUs(B, slow));
  // A small message pays the pipeline's fill: ring-copy's hops carry whole chunks.
  EXPECT_GT(ringCopyUs(64.0 * KB, sw.in), ringUs(64.0 * KB, sw.in));
  // No figure, no number.
  CostInputs none = sw.in;
  none.readGBps = 0;
  EXPECT_LT(ringCopyUs(B, none), 0);
  none = sw.in;
  none.ringWriteGBps = 0;
  EXPECT_LT(ringCopyUs(B, none), 0);
  const Seeded withNccl = seeded("rtxpro6000_8gpu_switches");
  EXPECT_EQ(chosen(withNccl, Op::AllReduce, 256 * MB), "nccl");
}

// ---- inputs ----------------------------------------------------------------------------------

TEST(FabricModel, LoadFiguresHoldOnlyAtTheirWorldSize) {
  const Seeded eight = seeded("rtxpro6000_8gpu_switches");
  EXPECT_TRUE(eight.in.loadMeasured);
  EXPECT_DOUBLE_EQ(eight.in.syncUs, 6.79);
  EXPECT_GT(eight.in.allToAllGBps, 0);
  EXPECT_NE(eight.in.summary.find("voipmonitor"), std::string::npos) << eight.in.summary;
  const Seeded two = seeded("rtxpro6000_8gpu_switches", 2);
  EXPECT_FALSE(two.in.loadMeasured);
  EXPECT_EQ(two.in.allToAllGBps, 0);
  EXPECT_NE(two.in.summary.find("(seed)"), std::string::npos) << two.in.summary;
  // Without the load record at 8 ranks the seed's per-peer term gives a round in the published
  // 6.0-7.4 us range too.
  Topology bare = fixture("rtxpro6000_8gpu_switches");
  bare.load = FabricLoad{};
  const CostInputs in = costInputs(bare, Config(), 8);
  EXPECT_GE(in.syncUs, 6.0);
  EXPECT_LE(in.syncUs, 7.4);
}

TEST(FabricModel, NominalPcieBandwidthComesFromTheLinksMaximumNotItsIdleGeneration) {
  // An idle workstation GPU trains its link down to Gen1; the host path's nominal bandwidth
  // must come from the maximum (Gen5 x16), which the link reaches under load.
  Topology t = fixture("rtxpro6000_8gpu_switches_nop2p");
  for (GpuInfo& g : t.gpus) g.pcieGen = 1;
  const CostInputs atMax = costInputs(t, Config(), 8);
  EXPECT_NEAR(atMax.hostGBps, 3.94 * 16 * 0.8 * kEffHost, 0.01);
  EXPECT_NE(atMax.summary.find("gen5 x16"), std::string::npos) << atMax.summary;
  // A topology that knows only the current link still uses it.
  for (GpuInfo& g : t.gpus) g.pcieMaxGen = g.pcieMaxWidth = 0;
  const CostInputs current = costInputs(t, Config(), 8);
  EXPECT_NEAR(current.hostGBps, 0.25 * 16 * 0.8 * kEffHost, 0.01);
}

TEST(FabricModel, SourcedFixturesNameTheirSourcesAndRoundTrip) {
  for (const char* name :
       {"rtxpro6000_8gpu_switches", "rtxpro6000_8gpu_dual_socket", "rtxpro6000_8gpu_switches_nop2p",
        "l40s_8gpu_numa", "rtxpro6000_16gpu_slow_writes"}) {
    const Topology t = fixture(name);
    ASSERT_FALSE(t.sources.empty()) << name;
    for (const std::string& src : t.sources) {
      EXPECT_NE(src.find("read 2026-"), std::string::npos) << name << ": " << src;
    }
    const Topology back = topologyFromJson(topologyToJson(t));
    EXPECT_EQ(back.sources, t.sources) << name;
    EXPECT_EQ(back.load.ranks, t.load.ranks) << name;
    EXPECT_EQ(back.load.syncUs, t.load.syncUs) << name;
    EXPECT_EQ(back.load.allToAllGBps, t.load.allToAllGBps) << name;
    EXPECT_EQ(back.load.source, t.load.source) << name;
    EXPECT_EQ(back.gpus[0].pcieMaxGen, t.gpus[0].pcieMaxGen) << name;
  }
}

TEST(FabricModel, TheTopologyPrintShowsTheMaximumLinkTheLoadAndTheSources) {
  Topology t = fixture("rtxpro6000_8gpu_switches");
  t.gpus[0].pcieGen = 1;  // idle
  std::ostringstream os;
  printTopology(t, os);
  const std::string text = os.str();
  EXPECT_NE(text.find("Gen1 x16 (max Gen5 x16)"), std::string::npos) << text;
  EXPECT_NE(text.find("Under load, 8 ranks at once"), std::string::npos) << text;
  EXPECT_NE(text.find("synchronisation round 6.79 us"), std::string::npos) << text;
  EXPECT_NE(text.find("Source: voipmonitor/rtx6kpro"), std::string::npos) << text;
}

}  // namespace
}  // namespace anyr
