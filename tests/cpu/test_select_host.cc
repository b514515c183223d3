// Admission and default choice of the host-memory algorithms, from fixture topologies: the
// no-peer-access machine gets the host path up to its limit and NCCL above; a machine with
// peer access keeps its peer algorithms by default but admits the host path (so it can be
// forced); without a host segment the host algorithms are rejected with the reason.
#include <gtest/gtest.h>

#include <initializer_list>
#include <string>
#include <utility>

#include "base/config.h"
#include "cpu/select_fixtures.h"
#include "select/admission.h"
#include "topology/topology.h"

namespace anyr {
namespace {

using testfix::fixture;

CommFacts hostFacts(const Topology& t, bool nccl, bool hostMemory) {
  return testfix::facts(t, nccl, hostMemory,
                        hostMemory ? "mapped" : "shm_open(create): No space left on device");
}

bool mentions(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

Topology withoutPeerAccess(Topology t) {
  for (int s = 0; s < t.size(); ++s) {
    for (int d = 0; d < t.size(); ++d) {
      if (s == d) continue;
      t.pair(s, d).peerWriteOk = false;
      t.pair(s, d).peerReadOk = false;
    }
  }
  return t;
}

// The automatic choice at each message size: the algorithm paired with it.
void expectChoices(const Admission& adm, const Thresholds& th,
                   std::initializer_list<std::pair<uint64_t, anyrAlgo_t>> choices) {
  for (const auto& [bytes, algo] : choices) {
    EXPECT_EQ(chooseAlgo(adm, th, bytes, anyrAlgoAuto), algo) << bytes << " bytes";
  }
}

TEST(SelectHost, NoPeerAccessChoosesHostThenNccl) {
  Topology t = fixture("no_p2p");  // 4 GPUs, no peer access
  CommFacts f = hostFacts(t, true, true);
  Admission adm = admit(t, f);
  Thresholds th = defaultThresholds(t, adm, Config(), f.nranks);
  for (anyrAlgo_t a :
       {anyrAlgoOneShotPush, anyrAlgoOneShotPull, anyrAlgoTwoShot, anyrAlgoTwoShotPush}) {
    EXPECT_FALSE(adm[a].admitted) << anyrAlgoName(a);
  }
  EXPECT_TRUE(adm[anyrAlgoHostOneShot].admitted) << adm[anyrAlgoHostOneShot].reason;
  EXPECT_TRUE(adm[anyrAlgoHostTwoShot].admitted) << adm[anyrAlgoHostTwoShot].reason;
  EXPECT_TRUE(mentions(adm[anyrAlgoHostOneShot].reason, "no peer access needed"));
  // 4 ranks: one-shot reads 3x the message per rank, so two-shot above the one-shot limit;
  // NCCL above the host limit (32 MiB seed).
  EXPECT_EQ(th.hostOneShotMaxBytes, (512u << 10) / 3);
  EXPECT_EQ(th.hostMaxBytes, 32u << 20);
  EXPECT_EQ(chooseAlgo(adm, th, 2, anyrAlgoAuto), anyrAlgoHostOneShot);
  EXPECT_EQ(chooseAlgo(adm, th, 64u << 10, anyrAlgoAuto), anyrAlgoHostOneShot);
  EXPECT_EQ(chooseAlgo(adm, th, 1u << 20, anyrAlgoAuto), anyrAlgoHostTwoShot);
  EXPECT_EQ(chooseAlgo(adm, th, 32u << 20, anyrAlgoAuto), anyrAlgoHostTwoShot);
  EXPECT_EQ(chooseAlgo(adm, th, (32ull << 20) + 2, anyrAlgoAuto), anyrAlgoNccl);
  std::string why = explainChoice(adm, th, 4096, anyrAlgoAuto);
  EXPECT_TRUE(mentions(why, "host-oneshot")) << why;
  EXPECT_TRUE(mentions(why, "no peer-memory algorithm is admitted")) << why;
  why = explainChoice(adm, th, 1u << 20, anyrAlgoAuto);
  EXPECT_TRUE(mentions(why, "host-twoshot")) << why;
  why = explainChoice(adm, th, 64ull << 20, anyrAlgoAuto);
  EXPECT_TRUE(mentions(why, "nccl")) << why;
  EXPECT_TRUE(mentions(why, "host limit")) << why;
  // Forcing wins as for every algorithm.
  EXPECT_EQ(chooseAlgo(adm, th, 1024, anyrAlgoHostTwoShot), anyrAlgoHostTwoShot);
}

TEST(SelectHost, TwoRanksWithoutPeerAccessUseHostOneShotUpToTheLimit) {
  Topology t = withoutPeerAccess(fixture("nvlink_pair"));
  CommFacts f = hostFacts(t, true, true);
  Admission adm = admit(t, f);
  Thresholds th = defaultThresholds(t, adm, Config(), f.nranks);
  EXPECT_FALSE(adm[anyrAlgoOneShotPush].admitted);
  EXPECT_EQ(th.hostOneShotMaxBytes, 32u << 20);
  for (uint64_t bytes : {2ull, 1024ull, 64ull << 10, 1ull << 20, 16ull << 20, 32ull << 20}) {
    EXPECT_EQ(chooseAlgo(adm, th, bytes, anyrAlgoAuto), anyrAlgoHostOneShot) << bytes;
  }
  EXPECT_EQ(chooseAlgo(adm, th, 64ull << 20, anyrAlgoAuto), anyrAlgoNccl);
}

TEST(SelectHost, NoPeerAccessWithoutNcclUsesHostAtEverySize) {
  Topology t = fixture("no_p2p");
  CommFacts f = hostFacts(t, false, true);
  Admission adm = admit(t, f);
  Thresholds th = defaultThresholds(t, adm, Config(), f.nranks);
  EXPECT_TRUE(adm.any());
  EXPECT_EQ(chooseAlgo(adm, th, 1024, anyrAlgoAuto), anyrAlgoHostOneShot);
  EXPECT_EQ(chooseAlgo(adm, th, 1ull << 30, anyrAlgoAuto), anyrAlgoHostTwoShot);
  std::string why = explainChoice(adm, th, 1ull << 30, anyrAlgoAuto);
  EXPECT_TRUE(mentions(why, "NCCL is not admitted")) << why;
}

TEST(SelectHost, NoHostSegmentRejectsHostAlgorithmsWithTheReason) {
  Topology t = fixture("no_p2p");
  CommFacts f = hostFacts(t, true, false);
  Admission adm = admit(t, f);
  Thresholds th = defaultThresholds(t, adm, Config(), f.nranks);
  for (anyrAlgo_t a : {anyrAlgoHostOneShot, anyrAlgoHostTwoShot}) {
    EXPECT_FALSE(adm[a].admitted);
    EXPECT_TRUE(mentions(adm[a].reason, "No space left on device")) << adm[a].reason;
  }
  EXPECT_EQ(chooseAlgo(adm, th, 1024, anyrAlgoAuto), anyrAlgoNccl);
  // And with nothing else, nothing is admitted.
  Admission none = admit(t, hostFacts(t, false, false));
  EXPECT_FALSE(none.any());
}

TEST(SelectHost, PeerAccessKeepsPeerDefaultsButAdmitsHost) {
  Topology t = fixture("nvlink_pair");
  CommFacts f = hostFacts(t, true, true);
  Admission adm = admit(t, f);
  Thresholds th = defaultThresholds(t, adm, Config(), f.nranks);
  EXPECT_TRUE(adm[anyrAlgoHostOneShot].admitted);
  EXPECT_TRUE(adm[anyrAlgoHostTwoShot].admitted);
  expectChoices(
      adm, th,
      {{1024, anyrAlgoOneShotPush}, {4u << 20, anyrAlgoTwoShotPush}, {64u << 20, anyrAlgoNccl}});
}

TEST(SelectHost, MoreRanksSwitchToHostTwoShotAboveTheOneShotLimit) {
  // 4 PCIe GPUs where every peer mapping failed: one-shot reads 3x the message per rank, so
  // two-shot takes over above the one-shot limit.
  Topology t = withoutPeerAccess(fixture("pcie_no_atomics"));
  ASSERT_EQ(t.size(), 4);
  CommFacts f = hostFacts(t, true, true);
  Admission adm = admit(t, f);
  Thresholds th = defaultThresholds(t, adm, Config(), f.nranks);
  EXPECT_EQ(th.hostOneShotMaxBytes, (512u << 10) / 3);
  expectChoices(
      adm, th,
      {{4096, anyrAlgoHostOneShot}, {1u << 20, anyrAlgoHostTwoShot}, {64u << 20, anyrAlgoNccl}});
  std::string why = explainChoice(adm, th, 1u << 20, anyrAlgoAuto);
  EXPECT_TRUE(mentions(why, "host-twoshot")) << why;
}

TEST(SelectHost, StructuralLimitsRejectHost) {
  Topology t = fixture("nvlink_pair");
  CommFacts f = hostFacts(t, true, true);
  f.sameHost = false;
  Admission adm = admit(t, f);
  EXPECT_FALSE(adm[anyrAlgoHostOneShot].admitted);
}

TEST(SelectHost, WireNamesRoundTrip) {
  for (int w = 0; w < anyrNumWires; ++w) {
    anyrWire_t back = anyrWireNative;
    ASSERT_TRUE(parseWire(wireName(static_cast<anyrWire_t>(w)), &back));
    EXPECT_EQ(back, w);
  }
  anyrWire_t x;
  EXPECT_FALSE(parseWire("fp4", &x));
}

}  // namespace
}  // namespace anyr
