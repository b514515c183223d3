// Dispatch: candidates and their rejection reasons, the seed cost model's choices on fixture
// topologies (machines we cannot run), the tuning table's JSON round trip and its defences
// (fingerprint mismatch, corrupt / truncated / foreign files), agreement across simulated
// ranks, and overrides. All pure functions: every rank computes these from agreed inputs.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

#include "base/config.h"
#include "base/error.h"
#include "cpu/expect_error.h"
#include "cpu/select_fixtures.h"
#include "select/admission.h"
#include "select/dispatch.h"
#include "select/explain.h"
#include "select/tuning.h"
#include "topology/topology.h"

namespace anyr {
namespace {

using testfix::fixture;

// As a communicator of one host sees it: the shared pinned host segment is mapped (host-memory
// algorithms admitted) unless `host` is false.
CommFacts factsFor(const Topology& t, bool nccl = true, bool host = true) {
  return testfix::facts(t, nccl, host, host ? "" : "disabled for the test");
}

struct Machine : testfix::Seeded {
  std::array<std::vector<Candidate>, kNumOps> cands;
};

Machine setup(const std::string& name, const Config& cfg = Config(), bool nccl = true,
              bool host = true, int ranks = 0) {
  Machine s;
  static_cast<testfix::Seeded&>(s) = testfix::seeded(name, ranks, nccl, host, cfg);
  for (int o = 0; o < kNumOps; ++o) {
    s.cands[static_cast<size_t>(o)] = candidates(static_cast<Op>(o), s.t, s.adm);
  }
  return s;
}

std::string choice(const Machine& s, Op op, uint64_t bytes) {
  return pathName(op, s.table.lookup(op, bytes));
}

bool mentions(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

std::string tempPath(const std::string& tag) {
  return testing::TempDir() + "/anyr_tuning_" + tag + "_" + std::to_string(::getpid()) + ".json";
}

void writeFile(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
}

// ---- buckets and lookup ----------------------------------------------------------------------

TEST(Dispatch, BucketsAreLog2AndCoverEverySize) {
  EXPECT_EQ(bucketOf(0), 0);
  EXPECT_EQ(bucketOf(1), 0);
  EXPECT_EQ(bucketOf(2), 1);
  EXPECT_EQ(bucketOf(1024), 10);
  EXPECT_EQ(bucketOf(1025), 11);
  EXPECT_EQ(bucketOf(2048), 11);
  EXPECT_EQ(bucketOf(~0ull), kNumBuckets - 1);
  for (int b = 1; b < kNumBuckets; ++b) {
    EXPECT_EQ(bucketOf(bucketBytes(b)), b);
    EXPECT_EQ(bucketOf(bucketBytes(b) + 1), std::min(b + 1, kNumBuckets - 1));
  }
}

TEST(Dispatch, PathNamesRoundTrip) {
  for (int o = 0; o < kNumOps; ++o) {
    const Op op = static_cast<Op>(o);
    for (const Candidate& c :
         candidates(op, fixture("nvlink_pair"),
                    admit(fixture("nvlink_pair"), factsFor(fixture("nvlink_pair"))))) {
      Path back;
      ASSERT_TRUE(parsePath(op, pathName(op, c.path), &back)) << pathName(op, c.path);
      EXPECT_EQ(back, c.path);
    }
  }
  Path p;
  EXPECT_FALSE(parsePath(Op::AllReduce, "fused:oneshot-push", &p));  // no fused all-reduce
  EXPECT_FALSE(parsePath(Op::AddRmsNorm, "warp-drive", &p));
}

TEST(Dispatch, FusedKernelPathsCarryAClusterSize) {
  for (Op op : {Op::AddRmsNorm, Op::AddRmsNormQuant}) {
    for (anyrAlgo_t a : {anyrAlgoOneShotPush, anyrAlgoTwoShotPush}) {
      for (int c : {1, 2, 4, 8}) {
        const Path want{a, true, c};
        const std::string name = pathName(op, want);
        EXPECT_EQ(name, std::string("fused:") + anyrAlgoName(a) + "/c" + std::to_string(c));
        Path back;
        ASSERT_TRUE(parsePath(op, name, &back)) << name;
        EXPECT_EQ(back, want) << name;
        EXPECT_NE(back, (Path{a, true, 0})) << name;  // the size is part of the path
        EXPECT_TRUE(back.sameKernel(Path{a, true, 0})) << name;
      }
    }
  }
  Path p{anyrAlgoNccl, false, 7};
  // Sizes other than 1, 2, 4, 8; a size on a composition or an all-reduce; a size alone.
  for (const char* bad :
       {"fused:oneshot-push/c3", "fused:oneshot-push/c0", "fused:oneshot-push/c16",
        "fused:oneshot-push/cx", "fused:oneshot-push/c", "oneshot-push+epilogue/c2", "/c2"}) {
    EXPECT_FALSE(parsePath(Op::AddRmsNorm, bad, &p)) << bad;
  }
  EXPECT_FALSE(parsePath(Op::AllReduce, "oneshot-push/c2", &p));
  EXPECT_EQ(p, (Path{anyrAlgoNccl, false, 7}));  // untouched by a failed parse
  for (int c : {0, 3, 5, 16, -2}) EXPECT_FALSE(pathClusterValid(c)) << c;
  Op op;
  EXPECT_TRUE(parseOp("add-rmsnorm-quant", &op));
  EXPECT_EQ(op, Op::AddRmsNormQuant);
  EXPECT_FALSE(parseOp("allgather", &op));
}

// ---- candidates ------------------------------------------------------------------------------

TEST(Dispatch, FusedOperationsHaveKernelAndCompositionCandidates) {
  Machine s = setup("nvlink_pair");
  EXPECT_EQ(s.cands[0].size(), 14u);  // fourteen all-reduce algorithms (three through host memory)
  EXPECT_EQ(s.cands[1].size(), 20u);  // + fused kernels of the six peer algorithms that have one
  for (const auto& ops : s.cands) {
    for (const Candidate& c : ops) {
      // Two GPUs over NVLink are one island: nothing for the two-level form to exchange.
      if (c.path.algo == anyrAlgoIslands) {
        EXPECT_FALSE(c.admitted);
        EXPECT_TRUE(mentions(c.reason, "one island")) << c.reason;
      } else {
        EXPECT_TRUE(c.admitted) << c.reason;
      }
    }
  }
}

TEST(Dispatch, HostAlgorithmsComeLastInTheFixedOrderAndOnlyAsComposition) {
  // The order breaks ties, so it is part of the agreement: the host algorithms are appended.
  Machine s = setup("no_p2p");
  const std::vector<std::string> allReduce = {
      "oneshot-push", "oneshot-pull", "twoshot-push", "twoshot",   "staged-push",
      "staged-pull",  "islands",      "ring",         "ring-copy", "doubling-push",
      "nccl",         "host-oneshot", "host-twoshot", "host-copy"};
  ASSERT_EQ(s.cands[0].size(), allReduce.size());
  for (size_t i = 0; i < allReduce.size(); ++i)
    EXPECT_EQ(pathName(Op::AllReduce, s.cands[0][i].path), allReduce[i]) << i;
  for (int o = 1; o < kNumOps; ++o) {
    const auto& c = s.cands[static_cast<size_t>(o)];
    ASSERT_EQ(c.size(), 20u);  // the fourteen compositions and six fused kernels
    const size_t last = c.size() - 1;
    EXPECT_EQ(pathName(static_cast<Op>(o), c[last - 2].path), "host-oneshot+epilogue");
    EXPECT_EQ(pathName(static_cast<Op>(o), c[last - 1].path), "host-twoshot+epilogue");
    EXPECT_EQ(pathName(static_cast<Op>(o), c[last].path), "host-copy+epilogue");
    for (const Candidate& k : c) {
      if (isHostAlgo(k.path.algo)) {
        EXPECT_FALSE(k.path.fusedKernel);  // no fused host kernel
        EXPECT_TRUE(k.admitted) << k.reason;
      }
    }
  }
  // Without the host segment they are rejected with its reason.
  Machine none = setup("no_p2p", Config(), true, false);
  for (const Candidate& c : none.cands[0]) {
    if (isHostAlgo(c.path.algo)) {
      EXPECT_FALSE(c.admitted);
      EXPECT_TRUE(mentions(c.reason, "no host-memory transport: disabled for the test"))
          << c.reason;
    }
  }
}

TEST(Dispatch, RejectedCandidatesCarryReasonsWithoutArchitectureNames) {
  Machine s = setup("no_p2p");
  int rejected = 0;
  for (const auto& ops : s.cands) {
    for (const Candidate& c : ops) {
      if (c.admitted) continue;
      ++rejected;
      // The two-level form finds no islands where no pair has a peer path, and says so.
      EXPECT_TRUE(mentions(c.reason, c.path.algo == anyrAlgoIslands ? "no pair has a peer path"
                                                                    : "rank 0 -> rank 1"))
          << c.reason;
      for (const char* arch : {"sm_", "sm90", "Hopper", "Ampere", "Blackwell", "H100", "A100"}) {
        EXPECT_FALSE(mentions(c.reason, arch)) << c.reason;
      }
    }
  }
  EXPECT_EQ(rejected, 10 + 16 + 16);  // the peer algorithms, and per fused operation their
                                      // compositions and fused kernels
}

TEST(Dispatch, AFusedKernelThatFailedTheSelfTestIsRejectedWithItsReason) {
  // The startup self-test records a failed fused kernel in the admission; its candidates are
  // rejected with that reason (so the seed, tuning and explain never use it), while the
  // algorithm itself and its composition with the standalone epilogue stay admitted.
  Topology t = fixture("nvlink_pair");
  Admission adm = admit(t, factsFor(t));
  const std::string why = "self-test failed on rank 1: 3 wrong elements";
  adm.fusedKernelFailure[anyrAlgoOneShotPush] = why;
  for (Op op : {Op::AddRmsNorm, Op::AddRmsNormQuant}) {
    for (const Candidate& c : candidates(op, t, adm)) {
      if (c.path == Path{anyrAlgoOneShotPush, true}) {
        EXPECT_FALSE(c.admitted);
        EXPECT_EQ(c.reason, why);
      } else if (c.path.algo == anyrAlgoOneShotPush || c.path.algo == anyrAlgoTwoShotPush) {
        EXPECT_TRUE(c.admitted) << pathName(op, c.path) << ": " << c.reason;
      }
    }
  }
  DispatchTable tab = seedTable(t, adm, Config(), t.size());
  for (int o = 1; o < kNumOps; ++o) {
    for (int b = 0; b < kNumBuckets; ++b) {
      EXPECT_NE(tab.path[static_cast<size_t>(o)][static_cast<size_t>(b)],
                (Path{anyrAlgoOneShotPush, true}));
    }
  }
  // The bucket the one-shot kernel had is taken by another admitted peer path (with two ranks
  // the fused doubling push is the one-shot's protocol in its own kernel, at the same cost).
  const Path small = tab.lookup(Op::AddRmsNorm, 16u << 10);
  EXPECT_TRUE(small.algo == anyrAlgoOneShotPush || small.algo == anyrAlgoTwoShotPush ||
              small.algo == anyrAlgoDoublingPush)
      << pathName(Op::AddRmsNorm, small);
}

TEST(Dispatch, OnlyTheFusedTwoShotKernelNeedsLargeSharedMemory) {
  // The fused two-shot push kernel stages an fp32 row in dynamic shared memory (68 KB for the
  // widest row); the fused one-shot and doubling push kernels and the fused pull kernels hold
  // the row in registers (4 KB static).
  Topology t = fixture("nvlink_pair");
  t.gpus[1].sharedMemPerBlockOptin = 48 * 1024;
  Admission adm = admit(t, factsFor(t));
  for (Op op : {Op::AddRmsNorm, Op::AddRmsNormQuant}) {
    int kernels = 0;
    for (const Candidate& c : candidates(op, t, adm)) {
      if (c.path == Path{anyrAlgoTwoShotPush, true}) {
        ++kernels;
        EXPECT_FALSE(c.admitted);
        EXPECT_TRUE(mentions(c.reason, "needs 68 KB shared memory per block, GPU 1 has 48 KB"))
            << c.reason;
      } else if (c.path.algo != anyrAlgoIslands) {  // one island here (its own tests)
        if (c.path.fusedKernel) ++kernels;
        EXPECT_TRUE(c.admitted) << pathName(op, c.path) << ": " << c.reason;
      }
    }
    EXPECT_EQ(kernels, 5);
  }
  // The seed keeps the fused one-shot kernel and never picks the rejected one.
  DispatchTable tab = seedTable(t, adm, Config(), t.size());
  EXPECT_EQ(pathName(Op::AddRmsNorm, tab.lookup(Op::AddRmsNorm, 64u << 10)), "fused:oneshot-push");
  for (int o = 1; o < kNumOps; ++o) {
    for (int b = 0; b < kNumBuckets; ++b) {
      EXPECT_NE(tab.path[static_cast<size_t>(o)][static_cast<size_t>(b)],
                (Path{anyrAlgoTwoShotPush, true}));
    }
  }
  // Below what even the register kernels' static scratch needs, every one is rejected.
  t.gpus[0].sharedMemPerBlockOptin = 2048;
  for (const Candidate& c : candidates(Op::AddRmsNorm, t, admit(t, factsFor(t)))) {
    if (c.path.fusedKernel) {
      EXPECT_FALSE(c.admitted) << pathName(Op::AddRmsNorm, c.path);
    }
  }
}

// ---- seed cost model on fixtures --------------------------------------------------------------

TEST(Dispatch, SeedOnNvlinkPairFollowsTheMeasuredLadder) {
  // 2 x H200 NVLink: one-shot push to 512 KB, two-shot push to 128 MB (measured 234.3 us at
  // 64 MB against NCCL's 248.2, docs/runs/2026-11-29-session1-final.json), NCCL at 256 MB.
  Machine s = setup("nvlink_pair");
  for (uint64_t b = 1024; b <= (512u << 10); b *= 2) {
    EXPECT_EQ(choice(s, Op::AllReduce, b), "oneshot-push") << b;
    EXPECT_EQ(choice(s, Op::AddRmsNorm, b), "fused:oneshot-push") << b;
  }
  // The 1 MB bucket: the two-shot push, plain and fused (the fused kernels measured both ways
  // there: 7.00 us for the one-shot against 7.97 at 64 tokens of 6144 in one run, 12.80 against
  // 9.27 in docs/runs/2026-11-30-pdl-default-host-copy.json).
  EXPECT_EQ(choice(s, Op::AllReduce, 1u << 20), "twoshot-push");
  EXPECT_EQ(choice(s, Op::AddRmsNorm, 1u << 20), "fused:twoshot-push");
  // The fused two-shot kernel up to 16 MB (measured faster than the composition from 96 to
  // 1024 tokens of hidden 6144/7168, level at 2048), the composition above.
  for (uint64_t b = 2u << 20; b <= (32u << 20); b *= 2) {
    EXPECT_EQ(choice(s, Op::AllReduce, b), "twoshot-push") << b;
    EXPECT_EQ(choice(s, Op::AddRmsNorm, b),
              b <= (16u << 20) ? "fused:twoshot-push" : "twoshot-push+epilogue")
        << b;
  }
  for (uint64_t b = 64u << 20; b <= (128u << 20); b *= 2) {
    EXPECT_EQ(choice(s, Op::AllReduce, b), "twoshot-push") << b;
    EXPECT_EQ(choice(s, Op::AddRmsNormQuant, b), "twoshot-push+epilogue") << b;
  }
  for (uint64_t b = 256u << 20; b <= (1ull << 30); b *= 2) {
    EXPECT_EQ(choice(s, Op::AllReduce, b), "nccl") << b;
    EXPECT_EQ(choice(s, Op::AddRmsNormQuant, b), "nccl+epilogue") << b;
  }
  EXPECT_EQ(s.table.source[0][20], Source::Seed);
  // Sizes between buckets take the bucket above: 600 KB is in the 1 MB bucket.
  EXPECT_EQ(choice(s, Op::AllReduce, 600u << 10), "twoshot-push");
  EXPECT_EQ(choice(s, Op::AllReduce, 100), "oneshot-push");
}

TEST(Dispatch, SeedOnNvlinkPairWithoutMeasurementsUsesNominalLinksAndTheSameLadder) {
  // A communicator's topology carries the confirmed checks and the driver's link facts but no
  // bandwidth/latency measurements: the nominal figures must give the same ladder.
  Topology t = fixture("nvlink_pair");
  for (PairInfo& p : t.pairs) p.writeGBps = p.readGBps = p.latencyUs = -1;
  Admission adm = admit(t, factsFor(t));
  DispatchTable tab = seedTable(t, adm, Config(), 2);
  // (The nominal figures move the one-shot's end from 512 KB to 256 KB, and leave NCCL and the
  // two-shot push within 2% of each other at 1 GB, the two-shot ahead.)
  EXPECT_EQ(pathName(Op::AllReduce, tab.lookup(Op::AllReduce, 256u << 10)), "oneshot-push");
  EXPECT_EQ(pathName(Op::AllReduce, tab.lookup(Op::AllReduce, 1u << 20)), "twoshot-push");
  EXPECT_EQ(pathName(Op::AllReduce, tab.lookup(Op::AllReduce, 32u << 20)), "twoshot-push");
  const CostInputs in = costInputs(t, Config(), 2);
  const double twoShot = seedTimeUs(Op::AllReduce, Path{anyrAlgoTwoShotPush}, 1ull << 30, in);
  const double nccl = seedTimeUs(Op::AllReduce, Path{anyrAlgoNccl}, 1ull << 30, in);
  EXPECT_LT(std::fabs(twoShot / nccl - 1), 0.02);
}

TEST(Dispatch, SeedOnEightPcieGpusUnderTwoSwitchesLeavesLargeMessagesToTheRing) {
  // All-to-all traffic between the two switches shares each switch's uplink (16 flows); NCCL's
  // ring crosses it once each way, so NCCL takes large messages early.
  Machine s = setup("pcie_8gpu_two_switches");
  const CostInputs in = costInputs(s.t, Config(), 8);
  EXPECT_EQ(in.largestGroup, 4);
  EXPECT_GT(in.crossWriteGBps, 0);
  // Small messages relayed in three one-peer rounds, the one crossing the switches first (one
  // vector a flow across instead of the one-shot's all to all).
  EXPECT_EQ(choice(s, Op::AllReduce, 1024), "doubling-push");
  EXPECT_EQ(choice(s, Op::AllReduce, 16u << 10), "doubling-push");
  for (uint64_t b = 32u << 10; b <= (256u << 20); b *= 2) {
    EXPECT_EQ(choice(s, Op::AllReduce, b), "nccl") << b;
  }
  // One switch group (all pairs under one switch): no uplink, peer algorithms go further.
  Topology one = s.t;
  for (PairInfo& p : one.pairs) {
    if (p.link == LinkType::PCIe) p.pcieRelation = "switch";
  }
  Admission adm1 = admit(one, factsFor(one));
  DispatchTable t1 = seedTable(one, adm1, Config(), 8);
  EXPECT_EQ(costInputs(one, Config(), 8).largestGroup, 8);
  auto lastPeerBucket = [](const DispatchTable& tab) {
    int last = 0;
    for (int b = 0; b < kNumBuckets; ++b) {
      if (tab.path[0][static_cast<size_t>(b)].algo != anyrAlgoNccl) last = b;
    }
    return last;
  };
  EXPECT_GT(lastPeerBucket(t1), lastPeerBucket(s.table));
}

TEST(Dispatch, SeedOnSlowPeerWritesReadsInstead) {
  // Writes 2.6 GB/s, reads 52 GB/s: beyond a few KB no push path is chosen.
  Machine s = setup("pcie_slow_writes");
  for (uint64_t b = 8u << 10; b <= (256u << 20); b *= 2) {
    const Path p = s.table.lookup(Op::AllReduce, b);
    EXPECT_NE(p.algo, anyrAlgoOneShotPush) << b;
    EXPECT_NE(p.algo, anyrAlgoTwoShotPush) << b;
    EXPECT_NE(s.table.lookup(Op::AddRmsNorm, b).algo, anyrAlgoOneShotPush) << b;
  }
  // Small messages: NCCL (the pull's handshake, a round trip and two loaded rounds cost more
  // than its two hops); large ones: the one-shot pull reads at 0.8 of 51.7 GB/s, above NCCL's
  // ring at 0.7 of it.
  EXPECT_EQ(choice(s, Op::AllReduce, 64u << 10), "nccl");
  EXPECT_EQ(choice(s, Op::AllReduce, 256u << 20), "oneshot-pull");
}

TEST(Dispatch, SeedWithoutPeerAccessTakesHostPathsThenNccl) {
  // 4 x PCIe gen4 x16 without peer access. The host one-shot wins by latency for the smallest
  // messages only (its writes and reads do not overlap); NCCL through host memory takes the
  // middle; the host two-shot, which overlaps its traffic, the large sizes (calibration:
  // 2 x H200, docs/PERFORMANCE.md).
  Machine s = setup("no_p2p");
  const CostInputs in = costInputs(s.t, Config(), 4);
  EXPECT_NEAR(in.hostGBps, 1.97 * 16 * 0.8 * 0.85, 0.01);
  EXPECT_TRUE(in.ncclViaHost);
  EXPECT_TRUE(mentions(in.summary, "host memory")) << in.summary;
  EXPECT_TRUE(mentions(in.summary, "gen4 x16")) << in.summary;
  // At four ranks NCCL's six hops through host memory and the host steps' queueing (each
  // rank beyond two adds the PCIe per-peer term) leave NCCL only the 16-32 KB buckets.
  for (uint64_t b = 1024; b <= (8u << 10); b *= 2) {
    EXPECT_EQ(choice(s, Op::AllReduce, b), "host-oneshot") << b;
    EXPECT_EQ(choice(s, Op::AddRmsNorm, b), "host-oneshot+epilogue") << b;
  }
  for (uint64_t b = 16u << 10; b <= (32u << 10); b *= 2) {
    EXPECT_EQ(choice(s, Op::AllReduce, b), "nccl") << b;
  }
  EXPECT_EQ(choice(s, Op::AddRmsNorm, 16u << 10), "nccl+epilogue");
  for (uint64_t b = 64u << 10; b <= (1ull << 30); b *= 2) {
    EXPECT_EQ(choice(s, Op::AllReduce, b), "host-twoshot") << b;
    EXPECT_EQ(choice(s, Op::AddRmsNormQuant, b), "host-twoshot+epilogue") << b;
  }
  // Two ranks, gen5 x16 (the measured machine's link): host one-shot up to 4 KB (measured 7.8
  // vs NCCL 10.4 us), NCCL from 16 KB to 64 KB (measured 11.2 / 15.9 us; host-oneshot with the
  // flag protocol 13.4 / 16.2), host two-shot from 128 KB to 4 MB (measured 28.6 us at 256 KB
  // against NCCL's 35.7, and 48.4 / 142.6 us at 1 / 4 MB against host-copy's 79.2 / 159.8),
  // host-copy from 8 MB (measured at 16 MB in two 8 MiB launches 547.6 us, the two-shot 549.4;
  // in one 16 MiB launch, ANYR_HOST_LAUNCH_BYTES's default, 494.0 in 1 MiB chunks and 475.6 in
  // 2 MiB chunks, ANYR_HOST_COPY_CHUNK_BYTES's default since; modelled in one launch of 2 MiB
  // chunks 508).
  Topology gen5 = firstGpus(fixture("no_p2p"), 2);
  for (GpuInfo& g : gen5.gpus) g.pcieGen = 5;
  Admission adm5 = admit(gen5, factsFor(gen5));
  DispatchTable t5 = seedTable(gen5, adm5, Config(), 2);
  for (uint64_t b = 1024; b <= (4u << 10); b *= 2)
    EXPECT_EQ(pathName(Op::AllReduce, t5.lookup(Op::AllReduce, b)), "host-oneshot") << b;
  for (uint64_t b = 16u << 10; b <= (64u << 10); b *= 2)
    EXPECT_EQ(pathName(Op::AllReduce, t5.lookup(Op::AllReduce, b)), "nccl") << b;
  for (uint64_t b = 128u << 10; b <= (4u << 20); b *= 2)
    EXPECT_EQ(pathName(Op::AllReduce, t5.lookup(Op::AllReduce, b)), "host-twoshot") << b;
  for (uint64_t b = 8u << 20; b <= (64u << 20); b *= 2)
    EXPECT_EQ(pathName(Op::AllReduce, t5.lookup(Op::AllReduce, b)), "host-copy") << b;
  const CostInputs in5 = costInputs(gen5, Config(), 2);
  EXPECT_NEAR(seedTimeUs(Op::AllReduce, Path{anyrAlgoHostCopy, false}, 16u << 20, in5), 508, 5);
  // A smaller chunk pays more per-chunk costs; a message of four chunks or fewer is cut into
  // quarters whatever the chunk (hostCopyLaunchChunkBytes).
  Config small;
  small.hostCopyChunkBytes = 64u << 10;
  EXPECT_GT(seedTimeUs(Op::AllReduce, Path{anyrAlgoHostCopy, false}, 16u << 20,
                       costInputs(gen5, small, 2)),
            seedTimeUs(Op::AllReduce, Path{anyrAlgoHostCopy, false}, 16u << 20, in5));
  // With the host one-shot's low-latency protocol up to 16 KB (what a communicator sets from
  // ANYR_HOST_LL_BYTES): host one-shot up to 16 KB (measured 9.8 vs NCCL 11.5 us at 16 KB),
  // NCCL at 32 and 64 KB; a compressed wire does not use the protocol.
  // Launches of ANYR_HOST_LAUNCH_BYTES (default 16 MiB; not ANYR_CHUNK_BYTES): a 16 MiB host-copy
  // call is one launch, 64 MiB four equal ones; with 8 MiB launches 16 MiB pays one launch more
  // (the same 8 chunks of 2 MiB either way).
  EXPECT_EQ(in5.hostLaunchBytes, 16u << 20);
  const Path copy{anyrAlgoHostCopy, false};
  const double t16 = seedTimeUs(Op::AllReduce, copy, 16u << 20, in5);
  Config huge;
  huge.hostLaunchBytes = 1u << 30;
  EXPECT_DOUBLE_EQ(seedTimeUs(Op::AllReduce, copy, 16u << 20, costInputs(gen5, huge, 2)), t16);
  EXPECT_NEAR(seedTimeUs(Op::AllReduce, copy, 64u << 20, in5), 4 * t16, 1e-6);
  Config launch8;
  launch8.hostLaunchBytes = 8u << 20;
  const CostInputs in8 = costInputs(gen5, launch8, 2);
  EXPECT_EQ(in8.hostLaunchBytes, 8u << 20);
  EXPECT_NEAR(seedTimeUs(Op::AllReduce, copy, 16u << 20, in8) - t16, 32.0, 1e-6);
  EXPECT_NEAR(seedTimeUs(Op::AllReduce, copy, 64u << 20, in8),
              8 * seedTimeUs(Op::AllReduce, copy, 8u << 20, in8), 1e-6);
  // ANYR_CHUNK_BYTES (the peer algorithms' staging) leaves the host launch alone.
  Config chunk1;
  chunk1.chunkBytes = 1u << 20;
  EXPECT_EQ(costInputs(gen5, chunk1, 2).hostLaunchBytes, 16u << 20);
  EXPECT_DOUBLE_EQ(seedTimeUs(Op::AllReduce, copy, 16u << 20, costInputs(gen5, chunk1, 2)), t16);
  // The host one- and two-shot count launches of the same size.
  for (anyrAlgo_t a : {anyrAlgoHostOneShot, anyrAlgoHostTwoShot}) {
    EXPECT_GT(seedTimeUs(Op::AllReduce, Path{a, false}, 16u << 20, in8),
              seedTimeUs(Op::AllReduce, Path{a, false}, 16u << 20, in5))
        << anyrAlgoName(a);
  }
  // The all-reduce choice of `t` for every power of two from lo to hi.
  auto expectChoice = [](const DispatchTable& t, uint64_t lo, uint64_t hi, const char* name) {
    for (uint64_t b = lo; b <= hi; b *= 2) {
      EXPECT_EQ(pathName(Op::AllReduce, t.lookup(Op::AllReduce, b)), name) << b;
    }
  };
  Config ll;
  ll.hostLowLatencyBytes = 16u << 10;
  DispatchTable t5ll = seedTable(gen5, adm5, ll, 2);
  expectChoice(t5ll, 1024, 16u << 10, "host-oneshot");
  expectChoice(t5ll, 32u << 10, 64u << 10, "nccl");
  expectChoice(t5ll, 256u << 10, 256u << 10, "host-twoshot");
  // At the default ANYR_HOST_LL_BYTES (64 KiB, in small launches over many SMs, every thread
  // polling its own lines): host one-shot up to 64 KB (measured 12.1 us against NCCL's 15.6),
  // host two-shot from 128 KB.
  Config ll64;
  ll64.hostLowLatencyBytes = 64u << 10;
  DispatchTable t5ll64 = seedTable(gen5, adm5, ll64, 2);
  expectChoice(t5ll64, 1024, 64u << 10, "host-oneshot");
  expectChoice(t5ll64, 128u << 10, 4u << 20, "host-twoshot");
  EXPECT_LT(seedTimeUs(Op::AllReduce, Path{anyrAlgoHostOneShot, false}, 16u << 10,
                       costInputs(gen5, ll, 2)),
            seedTimeUs(Op::AllReduce, Path{anyrAlgoHostOneShot, false}, 16u << 10,
                       costInputs(gen5, Config(), 2)));
  Config llFp8 = ll;
  llFp8.wire = anyrWireFp8;
  EXPECT_EQ(costInputs(gen5, llFp8, 2).hostLowLatencyBytes, 0u);
  // The slowest GPU's link bounds host memory: one GPU at gen4 x4 slows the host paths down.
  Topology narrow = fixture("no_p2p");
  narrow.gpus[2].pcieWidth = 4;
  EXPECT_NEAR(costInputs(narrow, Config(), 4).hostGBps, in.hostGBps / 4, 0.01);
  // Without NCCL: host paths at every size.
  Machine noNccl = setup("no_p2p", Config(), false);
  for (int o = 0; o < kNumOps; ++o) {
    for (int b = 0; b < kNumBuckets; ++b) {
      const anyrAlgo_t a = noNccl.table.path[static_cast<size_t>(o)][static_cast<size_t>(b)].algo;
      EXPECT_TRUE(isHostAlgo(a)) << o << " " << b;
    }
  }
  // Without the host segment: NCCL everywhere, as before the host transport.
  Machine noHost = setup("no_p2p", Config(), true, false);
  for (int o = 0; o < kNumOps; ++o) {
    for (int b = 0; b < kNumBuckets; ++b) {
      EXPECT_EQ(noHost.table.path[static_cast<size_t>(o)][static_cast<size_t>(b)].algo,
                anyrAlgoNccl);
    }
  }
  // Nothing admitted at all: the table holds "auto", which the communicator refuses at init.
  Machine none = setup("no_p2p", Config(), false, false);
  EXPECT_EQ(none.table.lookup(Op::AllReduce, 1024).algo, anyrAlgoAuto);
}

TEST(Dispatch, HostPathsStayCandidatesButNeverTheSeedWherePeerPathsExist) {
  for (const char* name : {"nvlink_pair", "nvlink_8gpu", "pcie_8gpu_two_switches",
                           "pcie_no_atomics", "pcie_slow_writes"}) {
    Machine s = setup(name);
    ASSERT_TRUE(peerPathAdmitted(s.adm)) << name;
    for (int o = 0; o < kNumOps; ++o) {
      int hostCands = 0;
      for (const Candidate& c : s.cands[static_cast<size_t>(o)]) {
        if (!isHostAlgo(c.path.algo)) continue;
        ++hostCands;
        EXPECT_TRUE(c.admitted) << name << " " << c.reason;  // tuning measures them
      }
      EXPECT_EQ(hostCands, 3) << name;
      for (int b = 0; b < kNumBuckets; ++b) {
        const anyrAlgo_t a = s.table.path[static_cast<size_t>(o)][static_cast<size_t>(b)].algo;
        EXPECT_FALSE(isHostAlgo(a)) << name << " " << o << " " << b;
      }
    }
    // ...and forcing them works.
    EXPECT_EQ(overrideError(s.adm, anyrAlgoHostOneShot), "") << name;
    EXPECT_EQ(overrideError(s.adm, anyrAlgoHostTwoShot), "") << name;
    EXPECT_EQ(overrideError(s.adm, anyrAlgoHostCopy), "") << name;
  }
  EXPECT_EQ(forcedPath(Op::AddRmsNorm, anyrAlgoHostOneShot), (Path{anyrAlgoHostOneShot, false}));
  // A tuning table may choose them there.
  Machine s = setup("nvlink_pair");
  TuningTable tab;
  tab.fingerprint = fingerprintOf(s.t, 2);
  tab.points[0].push_back({10, "host-oneshot", {{"host-oneshot", 3.0}, {"oneshot-push", 4.0}}});
  std::vector<std::string> warnings;
  applyTuning(tab, s.cands, true, &s.table, &warnings);
  EXPECT_TRUE(warnings.empty());
  EXPECT_EQ(choice(s, Op::AllReduce, 1024), "host-oneshot");
}

TEST(Dispatch, SeedOnNvlinkEightGpus) {
  Machine s = setup("nvlink_8gpu");
  EXPECT_EQ(choice(s, Op::AllReduce, 4096), "oneshot-push");
  EXPECT_EQ(choice(s, Op::AllReduce, 1u << 20), "twoshot-push");
  // Two rounds of the two-shot against the ring's 14 hops: the two-shot holds at 256 MB.
  EXPECT_EQ(choice(s, Op::AllReduce, 256u << 20), "twoshot-push");
  // One-shot moves 7x the message per rank at 8 ranks: it stops earlier than at 2.
  Machine pair = setup("nvlink_pair");
  int last8 = 0, last2 = 0;
  for (int b = 0; b < kNumBuckets; ++b) {
    if (s.table.path[0][static_cast<size_t>(b)].algo == anyrAlgoOneShotPush) last8 = b;
    if (pair.table.path[0][static_cast<size_t>(b)].algo == anyrAlgoOneShotPush) last2 = b;
  }
  EXPECT_LT(last8, last2);
}

TEST(Dispatch, ConfiguredThresholdsReplaceTheModel) {
  Config cfg;
  cfg.oneShotMaxBytes = 64u << 10;
  cfg.twoShotMaxBytes = 1u << 20;
  Machine s = setup("nvlink_pair", cfg);
  EXPECT_EQ(choice(s, Op::AllReduce, 64u << 10), "oneshot-push");
  EXPECT_EQ(choice(s, Op::AllReduce, 128u << 10), "twoshot-push");
  EXPECT_EQ(choice(s, Op::AllReduce, 2u << 20), "nccl");
  EXPECT_EQ(choice(s, Op::AddRmsNorm, 64u << 10), "fused:oneshot-push");
  EXPECT_EQ(s.table.source[0][10], Source::Thresholds);
}

TEST(Dispatch, SeedTimesAreMonotonicInSize) {
  for (const char* name : {"nvlink_pair", "pcie_8gpu_two_switches", "pcie_slow_writes", "no_p2p"}) {
    Machine s = setup(name);
    const CostInputs in = costInputs(s.t, Config(), s.t.size());
    for (int o = 0; o < kNumOps; ++o) {
      for (const Candidate& c : s.cands[static_cast<size_t>(o)]) {
        if (!c.admitted) continue;  // no_p2p: the peer paths have no bandwidth (< 0)
        double prev = 0;
        for (int b = 0; b < 32; ++b) {
          const double us = seedTimeUs(static_cast<Op>(o), c.path, bucketBytes(b), in);
          ASSERT_GT(us, 0) << name;
          EXPECT_GE(us, prev) << name << " " << pathName(static_cast<Op>(o), c.path);
          prev = us;
        }
      }
    }
  }
}

// ---- overrides -------------------------------------------------------------------------------

TEST(Dispatch, OverrideOfANonAdmittedPathIsAnErrorNamingWhy) {
  Machine s = setup("no_p2p");
  std::string err = overrideError(s.adm, anyrAlgoOneShotPush);
  EXPECT_TRUE(mentions(err, "oneshot-push is not admitted")) << err;
  EXPECT_TRUE(mentions(err, "peer write rank 0 -> rank 1")) << err;
  EXPECT_EQ(overrideError(s.adm, anyrAlgoNccl), "");
  EXPECT_EQ(overrideError(s.adm, anyrAlgoAuto), "");
  EXPECT_TRUE(mentions(overrideError(s.adm, static_cast<anyrAlgo_t>(17)), "not one of"));
}

TEST(Dispatch, ForcedAlgorithmGivesEachOperationItsPath) {
  EXPECT_EQ(forcedPath(Op::AllReduce, anyrAlgoTwoShotPush), (Path{anyrAlgoTwoShotPush, false}));
  EXPECT_EQ(forcedPath(Op::AddRmsNorm, anyrAlgoOneShotPush), (Path{anyrAlgoOneShotPush, true}));
  EXPECT_EQ(forcedPath(Op::AddRmsNorm, anyrAlgoTwoShotPush), (Path{anyrAlgoTwoShotPush, true}));
  EXPECT_EQ(forcedPath(Op::AddRmsNormQuant, anyrAlgoNccl), (Path{anyrAlgoNccl, false}));
  EXPECT_EQ(forcedPath(Op::AddRmsNorm, anyrAlgoOneShotPull), (Path{anyrAlgoOneShotPull, true}));
  EXPECT_EQ(forcedPath(Op::AddRmsNormQuant, anyrAlgoTwoShot), (Path{anyrAlgoTwoShot, true}));
  EXPECT_EQ(forcedPath(Op::AddRmsNorm, anyrAlgoHostOneShot), (Path{anyrAlgoHostOneShot, false}));
}

TEST(Dispatch, TuningFileAndBudgetResolveFromConfigThenEnvironment) {
  setenv("ANYR_TUNING_FILE", "/tmp/from-env.json", 1);
  setenv("ANYR_TUNE_BUDGET_MS", "2500", 1);
  Config c = resolveConfig(nullptr);
  EXPECT_EQ(c.tuningFile, "/tmp/from-env.json");
  EXPECT_EQ(c.tuneBudgetMs, 2500);
  anyrConfig_t user = ANYR_CONFIG_INITIALIZER;
  user.tuningFile = "/tmp/from-config.json";
  user.tuneBudgetMs = 0;
  c = resolveConfig(&user);  // explicit fields win over the environment
  EXPECT_EQ(c.tuningFile, "/tmp/from-config.json");
  EXPECT_EQ(c.tuneBudgetMs, 0);
  setenv("ANYR_TUNE_BUDGET_MS", "-1", 1);
  expectError([] { resolveConfig(nullptr); }, anyrInvalidArgument, "ANYR_TUNE_BUDGET_MS",
              "a negative budget was accepted");
  // Beyond 32 bits: refused, not narrowed (4294967297 would have become 1).
  setenv("ANYR_TUNE_BUDGET_MS", "4294967297", 1);
  expectError([] { resolveConfig(nullptr); }, anyrInvalidArgument,
              {"ANYR_TUNE_BUDGET_MS=4294967297", "32-bit"}, "a budget beyond 32 bits was accepted");
  unsetenv("ANYR_TUNING_FILE");
  unsetenv("ANYR_TUNE_BUDGET_MS");
  c = resolveConfig(nullptr);
  EXPECT_EQ(c.tuningFile, "");
  EXPECT_EQ(c.tuneBudgetMs, 0);
}

// ---- agreement -------------------------------------------------------------------------------

TEST(Dispatch, SlowestRankCountsAndEveryRankAgrees) {
  // Four simulated ranks, three candidates. Rank 2 is slow on candidate 0, so candidate 1
  // (never the fastest on any single rank but the best worst case) wins.
  const std::vector<std::vector<double>> perRank = {
      {5.0, 6.0, 9.0}, {5.1, 6.1, 9.0}, {20.0, 6.2, 9.5}, {5.0, 6.0, 8.0}};
  std::vector<double> slowest;
  EXPECT_EQ(agreeChoice(perRank, &slowest), 1);
  EXPECT_DOUBLE_EQ(slowest[0], 20.0);
  EXPECT_DOUBLE_EQ(slowest[1], 6.2);
  EXPECT_DOUBLE_EQ(slowest[2], 9.5);
  // Each rank computing from the gathered timings reaches the same answer, whatever its own
  // timings were (a rank that only trusted its own would pick candidate 0), and whichever
  // rank's row comes first (the gathered rows rotated so that rank r's leads).
  for (int r = 0; r < 4; ++r) {
    std::vector<std::vector<double>> rotated(perRank.begin() + r, perRank.end());
    rotated.insert(rotated.end(), perRank.begin(), perRank.begin() + r);
    EXPECT_EQ(agreeChoice(rotated, nullptr), 1) << "rank " << r << "'s row first";
    int own = 0;
    for (int c = 1; c < 3; ++c) {
      if (perRank[static_cast<size_t>(r)][static_cast<size_t>(c)] <
          perRank[static_cast<size_t>(r)][static_cast<size_t>(own)])
        own = c;
    }
    if (r != 2) {
      EXPECT_EQ(own, 0);
    }
  }
}

TEST(Dispatch, AVariantReplacesTheBaselineOnlyWhenClearlyFaster) {
  std::vector<double> slowest;
  // Slowest ranks: baseline 5.10, variants 4.66 and 5.00: 4.66 is 8.6% faster.
  EXPECT_EQ(agreeOverBaseline({{5.10, 4.60, 5.00}, {5.05, 4.66, 4.90}}, 0.02, &slowest), 1);
  EXPECT_EQ(slowest, (std::vector<double>{5.10, 4.66, 5.00}));
  // 1% faster on the slowest rank: within the margin, the baseline stays.
  EXPECT_EQ(agreeOverBaseline({{5.00, 4.95}, {4.90, 4.90}}, 0.02, nullptr), 0);
  // Faster on one rank, slower on the other: the slowest rank counts.
  EXPECT_EQ(agreeOverBaseline({{5.00, 4.00}, {5.00, 5.20}}, 0.02, nullptr), 0);
  // The baseline failed on a rank: the fastest variant measured everywhere.
  EXPECT_EQ(agreeOverBaseline({{-1.0, 6.0, 5.5}, {4.0, 6.0, 5.6}}, 0.02, nullptr), 2);
  // A variant that failed somewhere is out, however fast elsewhere.
  EXPECT_EQ(agreeOverBaseline({{5.0, 1.0}, {5.0, -1.0}}, 0.02, nullptr), 0);
  EXPECT_EQ(agreeOverBaseline({{-1.0}, {-1.0}}, 0.02, nullptr), -1);
}

TEST(Dispatch, AgreementExcludesFailuresAndBreaksTiesByOrder) {
  EXPECT_EQ(agreeChoice({{1.0, 2.0}, {-1.0, 2.0}}, nullptr), 1);  // failed on rank 1
  EXPECT_EQ(agreeChoice({{3.0, 3.0}, {3.0, 3.0}}, nullptr), 0);   // tie: lowest index
  EXPECT_EQ(agreeChoice({{-1.0}, {-1.0}}, nullptr), -1);          // nothing measured
  EXPECT_EQ(agreeChoice({}, nullptr), -1);
  EXPECT_EQ(agreeChoice({{1.0, 2.0}, {1.0}}, nullptr), 0);  // missing on a rank: out
  EXPECT_EQ(agreeChoice({{std::nan(""), 2.0}, {1.0, 2.0}}, nullptr), 1);
}

// ---- tuning table ----------------------------------------------------------------------------

TuningTable sampleTable(const Topology& t) {
  TuningTable tab;
  tab.fingerprint = fingerprintOf(t, t.size());
  tab.method = "test";
  tab.points[0].push_back({10, "nccl", {{"oneshot-push", 9.5}, {"nccl", 8.5}}});
  tab.points[0].push_back({20, "oneshot-pull", {{"oneshot-pull", 30.0}, {"nccl", 31.0}}});
  tab.points[1].push_back({14, "twoshot-push+epilogue", {{"twoshot-push+epilogue", 7.0}}});
  return tab;
}

TEST(Tuning, JsonRoundTrip) {
  Topology t = fixture("nvlink_pair");
  TuningTable a = sampleTable(t);
  TuningTable b = tuningFromJson(tuningToJson(a));
  EXPECT_TRUE(b.fingerprint == a.fingerprint);
  EXPECT_EQ(b.hidden, a.hidden);
  EXPECT_EQ(b.method, a.method);
  for (int o = 0; o < kNumOps; ++o) {
    ASSERT_EQ(b.points[static_cast<size_t>(o)].size(), a.points[static_cast<size_t>(o)].size());
    for (size_t i = 0; i < a.points[static_cast<size_t>(o)].size(); ++i) {
      const TunedPoint& x = a.points[static_cast<size_t>(o)][i];
      const TunedPoint& y = b.points[static_cast<size_t>(o)][i];
      EXPECT_EQ(x.bucket, y.bucket);
      EXPECT_EQ(x.choice, y.choice);
      ASSERT_EQ(x.times.size(), y.times.size());
      for (const auto& [name, us] : x.times) {
        bool found = false;
        for (const auto& [n2, us2] : y.times) found = found || (n2 == name && us2 == us);
        EXPECT_TRUE(found) << name;
      }
    }
  }
  // Through a file, as ANYR_TUNING_FILE is used.
  const std::string path = tempPath("roundtrip");
  saveTuningFile(a, path);
  TuningTable c;
  std::string why;
  ASSERT_TRUE(loadTuningFor(path, fingerprintOf(t, 2), &c, &why)) << why;
  EXPECT_EQ(c.points[0][1].choice, "oneshot-pull");
  std::remove(path.c_str());
}

TEST(Tuning, AppliedTableIsWhatDispatchLooksUp) {
  Machine s = setup("nvlink_pair");
  std::vector<std::string> warnings;
  applyTuning(sampleTable(s.t), s.cands, true, &s.table, &warnings);
  EXPECT_TRUE(warnings.empty());
  EXPECT_EQ(choice(s, Op::AllReduce, 1024), "nccl");
  EXPECT_EQ(s.table.source[0][10], Source::Measured);
  EXPECT_EQ(choice(s, Op::AllReduce, 1u << 20), "oneshot-pull");
  // Unmeasured buckets take the nearest measured one (ties to the smaller bucket).
  EXPECT_EQ(choice(s, Op::AllReduce, 1u << 14), "nccl");          // bucket 14: 4 from 10
  EXPECT_EQ(choice(s, Op::AllReduce, 1u << 16), "oneshot-pull");  // bucket 16: 4 from 20
  EXPECT_EQ(choice(s, Op::AllReduce, 1u << 15), "nccl");          // 5 from both: smaller
  EXPECT_EQ(choice(s, Op::AllReduce, 1ull << 35), "oneshot-pull");
  EXPECT_EQ(s.table.source[0][30], Source::NearestMeasured);
  EXPECT_EQ(choice(s, Op::AddRmsNorm, 1024), "twoshot-push+epilogue");
  // The quantized op was not measured: it keeps the seed.
  EXPECT_EQ(choice(s, Op::AddRmsNormQuant, 1024), "fused:oneshot-push");
  EXPECT_EQ(s.table.source[2][10], Source::Seed);
}

TEST(Tuning, ChoiceNotAdmittedHereIsSkippedWithAWarning) {
  Machine s = setup("no_p2p");
  TuningTable tab = sampleTable(s.t);  // asks for oneshot-pull, rejected without peer access
  tab.points[0].push_back({12, "no-such-path", {}});
  std::vector<std::string> warnings;
  applyTuning(tab, s.cands, true, &s.table, &warnings);
  ASSERT_EQ(warnings.size(), 3u);
  EXPECT_TRUE(mentions(warnings[0] + warnings[1] + warnings[2], "oneshot-pull' is not admitted"));
  EXPECT_TRUE(mentions(warnings[0] + warnings[1] + warnings[2], "not a known path"));
  for (int b = 0; b < kNumBuckets; ++b)
    EXPECT_EQ(s.table.path[0][static_cast<size_t>(b)].algo, anyrAlgoNccl);
}

TEST(Tuning, AMeasuredClusterSizeIsAppliedOnlyWhereClustersAre) {
  Machine s = setup("nvlink_pair");
  TuningTable tab = sampleTable(s.t);
  tab.points[1].push_back({18,
                           "fused:oneshot-push/c2",
                           {{"fused:oneshot-push", 5.10}, {"fused:oneshot-push/c2", 4.66}}});
  tab.points[2].push_back({12, "fused:oneshot-push/c1", {{"fused:oneshot-push/c1", 4.0}}});
  // Through JSON, as a saved table is read.
  tab = tuningFromJson(tuningToJson(tab));
  std::vector<std::string> warnings;
  DispatchTable on = s.table;
  applyTuning(tab, s.cands, true, &on, &warnings);
  EXPECT_TRUE(warnings.empty());
  EXPECT_EQ(on.lookup(Op::AddRmsNorm, 200u << 10), (Path{anyrAlgoOneShotPush, true, 2}));
  EXPECT_EQ(on.source[1][18], Source::Measured);
  EXPECT_EQ(on.lookup(Op::AddRmsNormQuant, 4u << 10), (Path{anyrAlgoOneShotPush, true, 1}));
  // Without clusters: the kernel choice stays, its size falls back to the rule, and a warning
  // says so. A block per row ("/c1") needs no clusters.
  warnings.clear();
  DispatchTable off = s.table;
  applyTuning(tab, s.cands, false, &off, &warnings);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_TRUE(mentions(warnings[0], "fused:oneshot-push/c2' needs thread-block clusters"));
  EXPECT_EQ(off.lookup(Op::AddRmsNorm, 200u << 10), (Path{anyrAlgoOneShotPush, true, 0}));
  EXPECT_EQ(off.lookup(Op::AddRmsNormQuant, 4u << 10), (Path{anyrAlgoOneShotPush, true, 1}));
  // A size on a kernel this machine does not admit is skipped like any other such choice.
  Machine n = setup("no_p2p");
  warnings.clear();
  applyTuning(tab, n.cands, true, &n.table, &warnings);
  bool said = false;
  for (const std::string& w : warnings) said = said || mentions(w, "/c2' is not admitted");
  EXPECT_TRUE(said);
  EXPECT_FALSE(n.table.lookup(Op::AddRmsNorm, 200u << 10).fusedKernel);
}

TEST(Tuning, FingerprintMismatchIsReportedAndIgnored) {
  Topology pair = fixture("nvlink_pair");
  const std::string path = tempPath("mismatch");
  saveTuningFile(sampleTable(pair), path);
  TuningTable out;
  std::string why;
  // Another world size.
  Topology eight = fixture("nvlink_8gpu");
  EXPECT_FALSE(loadTuningFor(path, fingerprintOf(eight, 8), &out, &why));
  EXPECT_TRUE(mentions(why, "another machine")) << why;
  EXPECT_TRUE(mentions(why, "world size")) << why;
  // Same size, another GPU model.
  Topology other = pair;
  other.gpus[1].name = "Some Other GPU";
  EXPECT_FALSE(loadTuningFor(path, fingerprintOf(other, 2), &out, &why));
  EXPECT_TRUE(mentions(why, "GPUs")) << why;
  // Same GPUs, a link that lost peer writes.
  Topology broken = pair;
  broken.pair(0, 1).peerWriteOk = false;
  EXPECT_FALSE(loadTuningFor(path, fingerprintOf(broken, 2), &out, &why));
  EXPECT_TRUE(mentions(why, "link")) << why;
  // Another driver.
  Topology drv = pair;
  drv.driverVersion = "999.1";
  EXPECT_FALSE(loadTuningFor(path, fingerprintOf(drv, 2), &out, &why));
  EXPECT_TRUE(mentions(why, "driver")) << why;
  std::remove(path.c_str());
}

// A table records the settings it was measured under (maxBlocks, the cluster setting, ...); a
// communicator with other settings ignores it and says which, and a table written before the
// settings were recorded is still compared on the machine alone.
TEST(Tuning, TablesMeasuredUnderOtherSettingsAreIgnoredNamingThem) {
  Topology pair = fixture("nvlink_pair");
  const std::vector<std::string> tuned = {"maxBlocks 64", "fusedCluster 0 on", "wire native"};
  TuningTable table = sampleTable(pair);
  table.fingerprint = fingerprintOf(pair, 2, tuned);
  const std::string path = tempPath("settings");
  saveTuningFile(table, path);
  TuningTable out;
  std::string why;
  // The same settings: loaded, and they survive the round trip through the file.
  ASSERT_TRUE(loadTuningFor(path, fingerprintOf(pair, 2, tuned), &out, &why)) << why;
  EXPECT_EQ(out.fingerprint.settings, tuned);
  // Another block cap: ignored, naming both settings lists.
  const std::vector<std::string> other = {"maxBlocks 132", "fusedCluster 0 on", "wire native"};
  EXPECT_FALSE(loadTuningFor(path, fingerprintOf(pair, 2, other), &out, &why));
  EXPECT_TRUE(mentions(why, "settings")) << why;
  EXPECT_TRUE(mentions(why, "maxBlocks 64")) << why;
  EXPECT_TRUE(mentions(why, "maxBlocks 132")) << why;
  // A table without settings (written before they were recorded): the machine decides.
  TuningTable old = sampleTable(pair);
  old.fingerprint = fingerprintOf(pair, 2);
  saveTuningFile(old, path);
  EXPECT_TRUE(loadTuningFor(path, fingerprintOf(pair, 2, other), &out, &why)) << why;
  EXPECT_TRUE(out.fingerprint.settings.empty());
  // Settings that are not a list of strings: a clear error naming the field.
  std::string text = tuningToJson(table);
  const std::string key = "\"settings\": [";
  const size_t at = text.find(key);
  ASSERT_NE(at, std::string::npos) << text;
  text.replace(at, key.size(), "\"settings\": [7, ");
  EXPECT_THROW(
      {
        try {
          (void)tuningFromJson(text);
        } catch (const Error& e) {
          EXPECT_TRUE(mentions(e.what(), "fingerprint.settings[0]")) << e.what();
          throw;
        }
      },
      Error);
  std::remove(path.c_str());
}

TEST(Tuning, CorruptTruncatedOrForeignFilesGiveAClearReasonNotACrash) {
  Topology t = fixture("nvlink_pair");
  const Fingerprint fp = fingerprintOf(t, 2);
  const std::string good = tuningToJson(sampleTable(t));
  const std::string path = tempPath("bad");
  struct Case {
    std::string text;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"", "not valid JSON"},
      {"\x01\x02garbage\xff", "not valid JSON"},
      {good.substr(0, good.size() / 2), "not valid JSON"},  // truncated
      {"[1, 2, 3]", "must be a JSON object"},
      {R"({"format": "anyreduce-topology", "version": 1})", "not a tuning file"},
      {R"({"hello": "world"})", "not a tuning file"},
      {R"({"format": "anyreduce-tuning", "version": 99})", "version"},
      {R"({"format": "anyreduce-tuning", "version": 1})", "fingerprint"},
  };
  for (const Case& c : cases) {
    writeFile(path, c.text);
    TuningTable out;
    std::string why;
    EXPECT_FALSE(loadTuningFor(path, fp, &out, &why)) << c.text;
    EXPECT_TRUE(mentions(why, c.expect)) << "expected '" << c.expect << "' in: " << why;
    EXPECT_TRUE(mentions(why, path)) << why;  // names the file
  }
  // Well-formed JSON with a wrong field type deep inside: the path of the field is named.
  std::string wrong = good;
  const size_t at = wrong.find("\"bucket\": 20");
  ASSERT_NE(at, std::string::npos);
  wrong.replace(at, 12, "\"bucket\": \"x\"");
  writeFile(path, wrong);
  TuningTable out;
  std::string why;
  EXPECT_FALSE(loadTuningFor(path, fp, &out, &why));
  EXPECT_TRUE(mentions(why, "ops.allreduce[1].bucket")) << why;
  // Out-of-range bucket.
  std::string range = good;
  range.replace(range.find("\"bucket\": 20"), 12, "\"bucket\": 400");
  writeFile(path, range);
  EXPECT_FALSE(loadTuningFor(path, fp, &out, &why));
  EXPECT_TRUE(mentions(why, "must be in 0..40")) << why;
  // Missing file.
  std::remove(path.c_str());
  EXPECT_FALSE(loadTuningFor(path, fp, &out, &why));
  EXPECT_TRUE(mentions(why, "cannot read")) << why;
}

// ---- explain ---------------------------------------------------------------------------------

TEST(Explain, EveryOperationAndBucketWithReasonsAndTimes) {
  Machine s = setup("no_p2p");
  ExplainInput in;
  in.topo = &s.t;
  in.adm = &s.adm;
  Config cfg;
  in.cfg = &cfg;
  in.nranks = s.t.size();
  in.table = &s.table;
  const std::string text = explainDispatch(in);
  for (int o = 0; o < kNumOps; ++o) EXPECT_TRUE(mentions(text, opName(static_cast<Op>(o))));
  EXPECT_TRUE(mentions(text, "fused:oneshot-push: peer write rank 0 -> rank 1")) << text;
  EXPECT_TRUE(mentions(text, "1K        host-oneshot           seed")) << text;
  EXPECT_TRUE(mentions(text, "1M        host-twoshot+epilogue  seed")) << text;
  EXPECT_TRUE(mentions(text, "256M      host-twoshot")) << text;
  EXPECT_TRUE(mentions(text, "cost model inputs")) << text;
  EXPECT_TRUE(mentions(text, "host memory")) << text;
  // Every admitted alternative with its seed time, the host ones included.
  EXPECT_TRUE(mentions(text, " nccl 19.3 host-oneshot 12.2 host-twoshot 20.9")) << text;
  EXPECT_TRUE(mentions(text, " host-oneshot+epilogue ")) << text;
  EXPECT_TRUE(mentions(text, " host-copy ")) << text;
  EXPECT_TRUE(mentions(text, " host-copy+epilogue ")) << text;
  EXPECT_FALSE(mentions(text, "host-oneshot: no host-memory")) << text;  // none rejected
  // With a tuning table: measured and seeded times side by side.
  Machine p = setup("nvlink_pair");
  TuningTable tab = sampleTable(p.t);
  tab.points[1].push_back({18,
                           "fused:oneshot-push/c2",
                           {{"fused:oneshot-push", 5.10},
                            {"fused:oneshot-push/rule", 5.04},
                            {"fused:oneshot-push/c1", 6.25},
                            {"fused:oneshot-push/c2", 4.66},
                            {"fused:oneshot-push/c4", -1.0}}});
  std::vector<std::string> warnings;
  applyTuning(tab, p.cands, true, &p.table, &warnings);
  in.topo = &p.t;
  in.adm = &p.adm;
  in.table = &p.table;
  in.nranks = p.t.size();
  in.tuned = &tab;
  const std::string tuned = explainDispatch(in);
  EXPECT_FALSE(mentions(text, "never the seed")) << text;  // no_p2p: host paths are seeded
  EXPECT_TRUE(mentions(tuned, "host-memory candidates: admitted")) << tuned;
  EXPECT_TRUE(mentions(tuned, "never the seed while a peer path is admitted")) << tuned;
  EXPECT_TRUE(mentions(tuned, "host-oneshot not measured (")) << tuned;
  EXPECT_TRUE(mentions(tuned, "nccl 8.5 (")) << tuned;  // measured (seed)
  EXPECT_TRUE(mentions(tuned, "measured")) << tuned;
  EXPECT_TRUE(mentions(tuned, "oneshot-pull not measured (")) << tuned;  // in a measured row
  // A measured cluster size: chosen, and every size measured shown with its time.
  EXPECT_TRUE(mentions(tuned, "256K      fused:oneshot-push/c2  measured")) << tuned;
  EXPECT_TRUE(mentions(tuned, " fused:oneshot-push 5.1 (")) << tuned;
  EXPECT_TRUE(mentions(tuned,
                       " fused:oneshot-push/rule 5.0 fused:oneshot-push/c1 6.2 "
                       "fused:oneshot-push/c2 4.7 fused:oneshot-push/c4 failed\n"))
      << tuned;
  in.forced = anyrAlgoTwoShot;
  EXPECT_TRUE(mentions(explainDispatch(in), "FORCED"));
}

}  // namespace
}  // namespace anyr
