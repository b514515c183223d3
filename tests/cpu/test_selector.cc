// The selector (select/selector.h, select/decide.cc): the per-call decision over the seed table,
// a forced algorithm and forced paths, a tuning table's cluster sizes kept at the width they
// were measured at, and the fused kernel's admission per call. The selector holds no device
// state, so the decision every call makes is tested here on fixture machines.
#include <gtest/gtest.h>

#include <string>

#include "base/config.h"
#include "base/error.h"
#include "cpu/select_fixtures.h"
#include "select/dispatch.h"
#include "select/selector.h"
#include "select/tuning.h"
#include "topology/topology.h"

namespace anyr {
namespace {

using testfix::fixture;

// A selector as a communicator of `name` sets it up at init (the self-test disabling nothing).
void setUp(Selector* s, const std::string& name, bool clusterOn) {
  const Topology t = fixture(name);
  s->admit(t, testfix::facts(t, true, true, ""), 0, t.size());
  s->setThresholds(t, Config());
  s->seed(t, Config(), clusterOn, clusterOn ? "" : "off for the test");
}

template <typename F>
anyrResult_t errorOf(F&& f, std::string* what = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (what != nullptr) *what = e.what();
    return e.code();
  }
  return anyrSuccess;
}

TEST(Selector, WithNothingForcedEveryCallTakesTheSeedTable) {
  Selector s;
  setUp(&s, "nvlink_pair", false);
  const Topology t = fixture("nvlink_pair");
  const Admission adm = admit(t, testfix::facts(t, true, true, ""));
  const DispatchTable seed = seedTable(t, adm, Config(), t.size());
  for (int o = 0; o < kNumOps; ++o) {
    for (uint64_t b = 1; b <= (1ull << 32); b *= 4) {
      EXPECT_EQ(s.pathFor(static_cast<Op>(o), b), seed.lookup(static_cast<Op>(o), b))
          << opName(static_cast<Op>(o)) << " " << b;
    }
  }
  EXPECT_FALSE(s.algoForced());
}

TEST(Selector, AForcedAlgorithmThenAForcedPathTakePrecedence) {
  Selector s;
  setUp(&s, "nvlink_pair", false);
  s.setForced(anyrAlgoTwoShot);
  EXPECT_TRUE(s.algoForced());
  for (int o = 0; o < kNumOps; ++o) {
    EXPECT_EQ(s.pathFor(static_cast<Op>(o), 1024), forcedPath(static_cast<Op>(o), anyrAlgoTwoShot));
  }
  const Path push{anyrAlgoOneShotPush, false, 0};
  s.forcePath(Op::AllReduce, push);
  EXPECT_EQ(s.pathFor(Op::AllReduce, 64u << 20), push);
  EXPECT_EQ(s.pathFor(Op::AddRmsNorm, 1024), forcedPath(Op::AddRmsNorm, anyrAlgoTwoShot));
  s.clearForcedPath(Op::AllReduce);
  EXPECT_EQ(s.pathFor(Op::AllReduce, 64u << 20), forcedPath(Op::AllReduce, anyrAlgoTwoShot));
}

TEST(Selector, ForcingAPathChecksItsClusterSizeAndThatItExists) {
  Selector off;
  setUp(&off, "nvlink_pair", false);
  std::string what;
  EXPECT_EQ(errorOf(
                [&] {
                  off.forcePath(Op::AddRmsNorm, Path{anyrAlgoOneShotPush, true, 2});
                },
                &what),
            anyrUnsupported);
  EXPECT_NE(what.find("off for the test"), std::string::npos) << what;
  EXPECT_EQ(errorOf([&] {
              off.forcePath(Op::AllReduce, Path{anyrAlgoOneShotPush, false, 2});
            }),
            anyrInvalidArgument);
  EXPECT_EQ(errorOf([&] {
              off.forcePath(Op::AllReduce, Path{anyrAlgoOneShotPush, true, 0});
            }),
            anyrInvalidArgument);

  Selector on;
  setUp(&on, "nvlink_pair", true);
  const Path c2{anyrAlgoOneShotPush, true, 2};
  on.forcePath(Op::AddRmsNorm, c2);
  EXPECT_EQ(on.pathFor(Op::AddRmsNorm, 1u << 20, 6144), c2);  // forced: kept at any width
  // The fused pull kernels have no cluster form: a size above 1 is refused, a block per row
  // (c1) and the automatic rule are their own.
  for (anyrAlgo_t pull : {anyrAlgoOneShotPull, anyrAlgoTwoShot}) {
    EXPECT_EQ(errorOf(
                  [&] {
                    on.forcePath(Op::AddRmsNormQuant, Path{pull, true, 4});
                  },
                  &what),
              anyrInvalidArgument);
    EXPECT_NE(what.find("no thread-block cluster form"), std::string::npos) << what;
    for (int c : {0, 1}) {
      on.forcePath(Op::AddRmsNormQuant, Path{pull, true, c});
      EXPECT_EQ(on.pathFor(Op::AddRmsNormQuant, 1024, 6144), (Path{pull, true, c}));
    }
  }
}

TEST(Selector, AMeasuredClusterSizeHoldsAtTheWidthItWasMeasuredAt) {
  Selector s;
  setUp(&s, "nvlink_pair", true);
  TuningTable t;
  t.hidden = 6144;
  TunedPoint p;
  p.bucket = bucketOf(1u << 16);
  p.choice = "fused:oneshot-push/c2";
  t.points[static_cast<size_t>(Op::AddRmsNorm)].push_back(p);
  s.installTuning(t, "test", "installed by the test");
  ASSERT_NE(s.tuned(), nullptr);
  EXPECT_EQ(s.tuningNote(), "installed by the test");
  EXPECT_EQ(s.tunedClusterHidden(), 6144);
  EXPECT_EQ(s.pathFor(Op::AddRmsNorm, 1u << 16, 6144).cluster, 2);
  EXPECT_EQ(s.pathFor(Op::AddRmsNorm, 1u << 16, 0).cluster, 2);  // a query: kept
  EXPECT_EQ(s.pathFor(Op::AddRmsNorm, 1u << 16, 7168).cluster, 0);
  EXPECT_EQ(s.dispatchTable().source[static_cast<size_t>(Op::AddRmsNorm)]
                                    [static_cast<size_t>(bucketOf(1u << 16))],
            Source::Measured);
}

TEST(Selector, TheFusedKernelRunsWhereAdmittedARowFitsAndItsRowsFitALaunch) {
  Selector s;
  setUp(&s, "nvlink_pair", false);
  const Path fused{anyrAlgoOneShotPush, true, 0};
  const Path composed{anyrAlgoOneShotPush, false, 0};
  EXPECT_TRUE(s.fusedKernelFor(fused, 8, 6144));
  EXPECT_FALSE(s.fusedKernelFor(fused, 0, 6144));  // not one row per launch
  EXPECT_FALSE(s.fusedKernelFor(composed, 8, 6144));
  EXPECT_FALSE(s.fusedKernelFor(fused, 8, 16384));  // wider than the registers hold...
  s.setForced(anyrAlgoOneShotPush);
  EXPECT_TRUE(s.fusedKernelFor(fused, 8, 16384));  // ...unless its algorithm is forced
  // A fused kernel the self-test disabled is not a candidate's kernel any more.
  Selector failed;
  const Topology t = fixture("nvlink_pair");
  failed.admit(t, testfix::facts(t, true, true, ""), 0, t.size());
  failed.admission().fusedKernelFailure[static_cast<size_t>(anyrAlgoOneShotPush)] = "test";
  failed.setThresholds(t, Config());
  failed.seed(t, Config(), false, "");
  EXPECT_FALSE(failed.fusedKernelFor(fused, 8, 6144));
}

}  // namespace
}  // namespace anyr
