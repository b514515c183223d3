// The algorithm registry (src/algo/registry.h): one row per public algorithm, names that round
// trip through anyrAlgoName and the parser, the launchers each kind needs, and kinds that agree
// with what admission admits and with the candidates' order.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "algo/registry.h"
#include "base/config.h"
#include "base/error.h"
#include "cpu/select_fixtures.h"
#include "select/admission.h"
#include "select/dispatch.h"

namespace anyr {
namespace {

std::vector<const AlgoInfo*> rows() {
  std::vector<const AlgoInfo*> out;
  for (const AlgoInfo& r : algoRegistry()) out.push_back(&r);
  return out;
}

TEST(Registry, EveryPublicValueButAutoHasExactlyOneRow) {
  ASSERT_EQ(rows().size(), static_cast<size_t>(anyrNumAlgos - 1));
  std::set<int> seen;
  for (const AlgoInfo* r : rows()) {
    EXPECT_GT(r->algo, anyrAlgoAuto) << r->name;
    EXPECT_LT(r->algo, anyrNumAlgos) << r->name;
    EXPECT_TRUE(seen.insert(r->algo).second) << "two rows for " << r->algo;
  }
  for (int a = 1; a < anyrNumAlgos; ++a) {
    const AlgoInfo* r = findAlgo(static_cast<anyrAlgo_t>(a));
    ASSERT_NE(r, nullptr) << a;
    EXPECT_EQ(r->algo, a);
    EXPECT_EQ(&algoInfo(static_cast<anyrAlgo_t>(a)), r);
  }
  EXPECT_EQ(findAlgo(anyrAlgoAuto), nullptr);
  EXPECT_EQ(findAlgo(anyrNumAlgos), nullptr);
  EXPECT_EQ(findAlgo(static_cast<anyrAlgo_t>(-1)), nullptr);
  EXPECT_THROW(algoInfo(anyrAlgoAuto), Error);
}

TEST(Registry, NamesAreUniqueAndRoundTripThroughAnyrAlgoNameAndTheParser) {
  std::set<std::string> names = {"auto"};
  EXPECT_STREQ(anyrAlgoName(anyrAlgoAuto), "auto");
  EXPECT_STREQ(algoName(anyrAlgoAuto), "auto");
  EXPECT_EQ(anyrAlgoName(anyrNumAlgos), nullptr);
  EXPECT_EQ(anyrAlgoName(static_cast<anyrAlgo_t>(-1)), nullptr);
  const std::string listed = algoNames();
  for (const AlgoInfo* r : rows()) {
    ASSERT_NE(r->name, nullptr);
    const std::string name = r->name;
    EXPECT_FALSE(name.empty());
    EXPECT_TRUE(names.insert(name).second) << "name used twice: " << name;
    EXPECT_EQ(name, anyrAlgoName(r->algo));
    anyrAlgo_t back = anyrAlgoAuto;
    ASSERT_TRUE(parseAlgo(name, &back)) << name;
    EXPECT_EQ(back, r->algo) << name;
    EXPECT_NE(listed.find(name), std::string::npos) << name << " missing from " << listed;
  }
  anyrAlgo_t back = anyrAlgoOneShotPush;
  ASSERT_TRUE(parseAlgo("auto", &back));
  EXPECT_EQ(back, anyrAlgoAuto);
}

TEST(Registry, EveryRowHasTheLaunchersItsKindNeeds) {
  std::set<std::string> kindNames;
  for (AlgoKind k : {AlgoKind::PeerMemory, AlgoKind::HostMemory, AlgoKind::Nccl}) {
    EXPECT_TRUE(kindNames.insert(algoKindName(k)).second);
  }
  for (const AlgoInfo* r : rows()) {
    SCOPED_TRACE(r->name);
    EXPECT_NE(r->admit, nullptr);
    EXPECT_NE(r->seedUs, nullptr);
    switch (r->kind) {
      case AlgoKind::PeerMemory:
        EXPECT_EQ(r->launchHost, nullptr);
        EXPECT_EQ(r->launchHostLowLatency, nullptr);
        EXPECT_EQ(r->launchHostCopy, nullptr);
        if (r->launchPeerCopy != nullptr) {
          // Copies and kernels on side streams: no blocks that must be resident together, no
          // fused kernel.
          EXPECT_EQ(r->launch, nullptr);
          EXPECT_EQ(r->residentPerSm, nullptr);
          EXPECT_EQ(r->capacity, LaunchCapacity::RingCopy);
          EXPECT_EQ(r->fused, nullptr);
          break;
        }
        EXPECT_NE(r->launch, nullptr);
        EXPECT_NE(r->residentPerSm, nullptr);
        EXPECT_TRUE(r->capacity == LaunchCapacity::PushSlot ||
                    r->capacity == LaunchCapacity::Chunk ||
                    r->capacity == LaunchCapacity::IslandSlots);
        break;
      case AlgoKind::HostMemory:
        EXPECT_EQ(r->launch, nullptr);
        EXPECT_EQ(r->launchPeerCopy, nullptr);
        EXPECT_EQ(r->residentPerSm, nullptr);
        // Kernels (optionally with a low-latency form) or the copy engines, not both.
        EXPECT_NE(r->launchHost == nullptr, r->launchHostCopy == nullptr);
        if (r->launchHostLowLatency != nullptr) {
          EXPECT_NE(r->launchHost, nullptr);
        }
        EXPECT_EQ(r->capacity, LaunchCapacity::HostLaunch);
        EXPECT_EQ(r->fused, nullptr) << "no fused kernel is built on host memory";
        break;
      case AlgoKind::Nccl:
        EXPECT_EQ(r->launch, nullptr);
        EXPECT_EQ(r->launchPeerCopy, nullptr);
        EXPECT_EQ(r->residentPerSm, nullptr);
        EXPECT_EQ(r->launchHost, nullptr);
        EXPECT_EQ(r->launchHostCopy, nullptr);
        EXPECT_EQ(r->capacity, LaunchCapacity::None);
        EXPECT_EQ(r->fused, nullptr);
        EXPECT_FALSE(r->perRankShare);
        break;
    }
    if (r->fused != nullptr) {
      EXPECT_NE(r->fused->kernel, nullptr);
      EXPECT_GT(r->fused->smemBytes, 0u);
      EXPECT_NE(r->fused->seedUs, nullptr);
    }
  }
}

// With one transport available at a time, exactly the rows of its kind are admitted, with their
// own rule's reason; isHostAlgo and peerPathAdmitted read the same kinds.
TEST(Registry, KindsAgreeWithAdmission) {
  const Topology t = testfix::fixture("nvlink_pair");
  struct Only {
    AlgoKind kind;
    bool peer, host, nccl;
  };
  for (const Only& o :
       {Only{AlgoKind::PeerMemory, true, false, false},
        Only{AlgoKind::HostMemory, false, true, false}, Only{AlgoKind::Nccl, false, false, true}}) {
    CommFacts f = testfix::facts(t, o.nccl, o.host, "off for the test");
    // Two islands of one GPU each: the pair is one island by its topology (NVLink).
    std::string why;
    ASSERT_TRUE(parseIslands("0,1", &f.islands, &why)) << why;
    f.peerMemory = o.peer;
    f.peerMemoryReason = "off for the test";
    const Admission adm = admit(t, f);
    EXPECT_EQ(peerPathAdmitted(adm), o.kind == AlgoKind::PeerMemory);
    for (const AlgoInfo* r : rows()) {
      SCOPED_TRACE(std::string(r->name) + " with only " + algoKindName(o.kind));
      EXPECT_EQ(adm[r->algo].admitted, r->kind == o.kind) << adm[r->algo].reason;
      EXPECT_FALSE(adm[r->algo].reason.empty());
      const AlgoAdmission own = r->admit(t, f);
      EXPECT_EQ(own.admitted, adm[r->algo].admitted);
      EXPECT_EQ(own.reason, adm[r->algo].reason);
      EXPECT_EQ(isHostAlgo(r->algo), r->kind == AlgoKind::HostMemory);
    }
  }
  EXPECT_FALSE(isHostAlgo(anyrAlgoAuto));
}

// The candidates follow the registry's order (it breaks ties); a row's fused kernel, where it
// has one, comes just before its composition for the fused operations, and forcing the
// algorithm there takes the fused kernel.
TEST(Registry, CandidatesFollowTheRegistry) {
  const Topology t = testfix::fixture("nvlink_pair");
  const Admission adm = admit(t, testfix::facts(t, true, true, ""));
  for (int o = 0; o < kNumOps; ++o) {
    const Op op = static_cast<Op>(o);
    std::vector<Path> want;
    for (const AlgoInfo* r : rows()) {
      if (op != Op::AllReduce && r->fused != nullptr) want.push_back(Path{r->algo, true});
      want.push_back(Path{r->algo, false});
      EXPECT_EQ(forcedPath(op, r->algo).fusedKernel, op != Op::AllReduce && r->fused != nullptr)
          << r->name;
    }
    std::vector<Path> got;
    for (const Candidate& c : candidates(op, t, adm)) got.push_back(c.path);
    EXPECT_EQ(got, want) << opName(op);
  }
}

}  // namespace
}  // namespace anyr
