// Admission and seed thresholds from fixture topologies (machines we cannot run): every rank
// computes these from the same agreed facts, so a test of the pure functions is a test of the
// communicator's choice.
#include <gtest/gtest.h>

#include <string>

#include "base/config.h"
#include "cpu/select_fixtures.h"
#include "select/admission.h"
#include "topology/topology.h"

namespace anyr {
namespace {

using testfix::fixture;

// Without the host segment (the host algorithms are tested in test_select_host.cc).
CommFacts factsFor(const Topology& t, bool nccl = true) {
  return testfix::facts(t, nccl, false, "");
}

struct Decision {
  Admission adm;
  Thresholds th;
};

Decision decide(const Topology& t, const CommFacts& f, const Config& cfg = Config()) {
  Decision d;
  d.adm = admit(t, f);
  d.th = defaultThresholds(t, d.adm, cfg, f.nranks);
  return d;
}

bool mentions(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

TEST(Select, NvlinkPairAdmitsEverythingAndPushesBySize) {
  Topology t = fixture("nvlink_pair");
  Decision d = decide(t, factsFor(t));
  for (int a = 1; a <= anyrAlgoTwoShotPush; ++a) {  // host algorithms: test_select_host.cc
    EXPECT_TRUE(d.adm.algo[static_cast<size_t>(a)].admitted)
        << anyrAlgoName(static_cast<anyrAlgo_t>(a)) << ": "
        << d.adm.algo[static_cast<size_t>(a)].reason;
  }
  EXPECT_EQ(d.th.oneShot, anyrAlgoOneShotPush);
  EXPECT_EQ(d.th.twoShot, anyrAlgoTwoShotPush);
  EXPECT_EQ(d.th.oneShotMaxBytes, 1u << 20);  // two ranks: 1 MiB
  EXPECT_EQ(chooseAlgo(d.adm, d.th, 1024, anyrAlgoAuto), anyrAlgoOneShotPush);
  EXPECT_EQ(chooseAlgo(d.adm, d.th, 1u << 20, anyrAlgoAuto), anyrAlgoOneShotPush);
  EXPECT_EQ(chooseAlgo(d.adm, d.th, (1u << 20) + 2, anyrAlgoAuto), anyrAlgoTwoShotPush);
  EXPECT_EQ(chooseAlgo(d.adm, d.th, 32u << 20, anyrAlgoAuto), anyrAlgoTwoShotPush);
  EXPECT_EQ(chooseAlgo(d.adm, d.th, (32u << 20) + 2, anyrAlgoAuto), anyrAlgoNccl);
  EXPECT_EQ(chooseAlgo(d.adm, d.th, 1024, anyrAlgoTwoShot), anyrAlgoTwoShot);  // forced wins
}

TEST(Select, PcieWithoutPeerAtomicsAdmitsEveryPeerAlgorithm) {
  // None of the protocols needs peer atomics; their absence must not disable anything.
  Topology t = fixture("pcie_no_atomics");
  Decision d = decide(t, factsFor(t));
  EXPECT_TRUE(d.adm[anyrAlgoOneShotPush].admitted);
  EXPECT_TRUE(d.adm[anyrAlgoOneShotPull].admitted);
  EXPECT_TRUE(d.adm[anyrAlgoTwoShotPush].admitted);
  EXPECT_TRUE(d.adm[anyrAlgoTwoShot].admitted);
  EXPECT_TRUE(mentions(d.adm[anyrAlgoOneShotPush].reason, "no peer atomics needed"));
  // 4 ranks: one-shot moves 3x the message per rank, so the limit shrinks.
  EXPECT_EQ(d.th.oneShotMaxBytes, (512u << 10) / 3);
}

TEST(Select, SlowPeerWritesPreferPullAndSayWhy) {
  Topology t = fixture("pcie_slow_writes");
  Decision d = decide(t, factsFor(t));
  EXPECT_TRUE(d.adm[anyrAlgoOneShotPush].admitted);  // admitted: writes work, only slowly
  EXPECT_EQ(d.th.oneShot, anyrAlgoOneShotPull);
  EXPECT_EQ(d.th.twoShot, anyrAlgoTwoShot);
  EXPECT_TRUE(mentions(d.th.oneShotWhy, "peer write bandwidth")) << d.th.oneShotWhy;
  EXPECT_TRUE(mentions(d.th.oneShotWhy, "GB/s")) << d.th.oneShotWhy;
  EXPECT_EQ(chooseAlgo(d.adm, d.th, 4096, anyrAlgoAuto), anyrAlgoOneShotPull);
  EXPECT_EQ(chooseAlgo(d.adm, d.th, 4u << 20, anyrAlgoAuto), anyrAlgoTwoShot);
  std::string why = explainChoice(d.adm, d.th, 4096, anyrAlgoAuto);
  EXPECT_TRUE(mentions(why, "oneshot-pull")) << why;
}

TEST(Select, NoPeerAccessLeavesOnlyNccl) {
  Topology t = fixture("no_p2p");
  Decision d = decide(t, factsFor(t));
  for (anyrAlgo_t a :
       {anyrAlgoOneShotPush, anyrAlgoOneShotPull, anyrAlgoTwoShot, anyrAlgoTwoShotPush}) {
    EXPECT_FALSE(d.adm[a].admitted) << anyrAlgoName(a);
    EXPECT_TRUE(mentions(d.adm[a].reason, "rank 0 -> rank 1")) << d.adm[a].reason;
  }
  EXPECT_TRUE(d.adm[anyrAlgoNccl].admitted);
  for (uint64_t bytes : {1024ull, 1ull << 20, 256ull << 20}) {
    EXPECT_EQ(chooseAlgo(d.adm, d.th, bytes, anyrAlgoAuto), anyrAlgoNccl);
  }
  // ...and with NCCL unavailable too, nothing is admitted: the communicator refuses to start.
  Decision none = decide(t, factsFor(t, false));
  EXPECT_FALSE(none.adm.any());
  EXPECT_EQ(chooseAlgo(none.adm, none.th, 1024, anyrAlgoAuto), anyrAlgoAuto);
}

TEST(Select, EightPcieGpusUnderTwoSwitches) {
  Topology t = fixture("pcie_8gpu_two_switches");
  Decision d = decide(t, factsFor(t));
  EXPECT_TRUE(d.adm[anyrAlgoOneShotPush].admitted);
  EXPECT_TRUE(d.adm[anyrAlgoTwoShotPush].admitted);
  EXPECT_EQ(d.th.oneShotMaxBytes, (512u << 10) / 7);  // 7 peers share the 512 KiB budget
  EXPECT_EQ(chooseAlgo(d.adm, d.th, 16u << 10, anyrAlgoAuto), anyrAlgoOneShotPush);
  EXPECT_EQ(chooseAlgo(d.adm, d.th, 1u << 20, anyrAlgoAuto), anyrAlgoTwoShotPush);
}

TEST(Select, NvlinkEightGpus) {
  Topology t = fixture("nvlink_8gpu");
  Decision d = decide(t, factsFor(t));
  EXPECT_TRUE(d.adm.any());
  EXPECT_EQ(d.th.oneShot, anyrAlgoOneShotPush);
  EXPECT_EQ(chooseAlgo(d.adm, d.th, 1u << 16, anyrAlgoAuto), anyrAlgoOneShotPush);
}

TEST(Select, StructuralLimitsRejectPeerAlgorithms) {
  Topology t = fixture("nvlink_pair");
  CommFacts f = factsFor(t);
  f.sameHost = false;
  Decision d = decide(t, f);
  EXPECT_FALSE(d.adm[anyrAlgoOneShotPush].admitted);
  EXPECT_TRUE(mentions(d.adm[anyrAlgoOneShotPush].reason, "more than one host"));
  EXPECT_EQ(chooseAlgo(d.adm, d.th, 1024, anyrAlgoAuto), anyrAlgoNccl);

  CommFacts g = factsFor(t);
  g.peerMemory = false;
  g.peerMemoryReason = "cudaIpcOpenMemHandle failed";
  Decision e = decide(t, g);
  EXPECT_FALSE(e.adm[anyrAlgoTwoShot].admitted);
  EXPECT_TRUE(mentions(e.adm[anyrAlgoTwoShot].reason, "cudaIpcOpenMemHandle failed"));
}

TEST(Select, OneBrokenDirectionRejectsOnlyThatKind) {
  // Peer write fails in one direction (a real failure mode on risers / patched drivers):
  // the push algorithms go, the pull algorithms stay, and the reason names the pair.
  Topology t = fixture("nvlink_pair");
  t.pair(1, 0).peerWriteOk = false;
  Decision d = decide(t, factsFor(t));
  EXPECT_FALSE(d.adm[anyrAlgoOneShotPush].admitted);
  EXPECT_FALSE(d.adm[anyrAlgoTwoShotPush].admitted);
  EXPECT_TRUE(mentions(d.adm[anyrAlgoOneShotPush].reason, "rank 1 -> rank 0"))
      << d.adm[anyrAlgoOneShotPush].reason;
  EXPECT_TRUE(d.adm[anyrAlgoOneShotPull].admitted);
  EXPECT_EQ(d.th.oneShot, anyrAlgoOneShotPull);
  EXPECT_EQ(d.th.twoShot, anyrAlgoTwoShot);
  EXPECT_EQ(chooseAlgo(d.adm, d.th, 1024, anyrAlgoAuto), anyrAlgoOneShotPull);
}

TEST(Select, ConfiguredThresholdsWin) {
  Topology t = fixture("nvlink_pair");
  Config cfg;
  cfg.oneShotMaxBytes = 4096;
  cfg.twoShotMaxBytes = 1 << 20;
  Decision d = decide(t, factsFor(t), cfg);
  EXPECT_EQ(chooseAlgo(d.adm, d.th, 4096, anyrAlgoAuto), anyrAlgoOneShotPush);
  EXPECT_EQ(chooseAlgo(d.adm, d.th, 8192, anyrAlgoAuto), anyrAlgoTwoShotPush);
  EXPECT_EQ(chooseAlgo(d.adm, d.th, 2 << 20, anyrAlgoAuto), anyrAlgoNccl);
}

}  // namespace
}  // namespace anyr
