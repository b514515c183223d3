// Tuning on the device: a communicator measures its candidates, every rank ends with the same
// table, dispatch then uses it (results still exact), the saved table is loaded by a new
// communicator, init-time tuning within a budget works and saves, and a corrupt table file
// leaves the seed in place without failing init.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "api/boundary.h"
#include "common/data.h"
#include "common/launcher.h"
#include "common/timing.h"
#include "core/comm.h"
#include "gpu/gpu_test_util.h"
#include "select/dispatch.h"
#include "select/tuning.h"

namespace anyr {
namespace {

// This process's path for the tuning table `tag`, with no file there (one an earlier run left is
// removed).
std::string tmpFile(const std::string& tag) {
  const std::string path =
      "/tmp/anyr_gpu_tuning_" + tag + "_" + std::to_string(::getpid()) + ".json";
  std::remove(path.c_str());
  return path;
}

anyrComm_t openComm(int rank, int n, const anyrUniqueId& id, const char* tuningFile, int budgetMs) {
  anyrComm_t comm = initRankComm(rank, n, id, 30000, [&](anyrConfig_t& c) {
    c.tuningFile = tuningFile;
    if (budgetMs > 0) c.tuneBudgetMs = budgetMs;
  });
  return comm;
}

// "CHOICE <op> <bucket> <path>" for every bucket from 1 KB to 64 MB, as dispatch sees it.
std::string dispatchLines(Communicator& c) {
  std::ostringstream os;
  for (int o = 0; o < kNumOps; ++o) {
    for (int b = 10; b <= 26; ++b) {
      const Op op = static_cast<Op>(o);
      os << "CHOICE " << opName(op) << " " << b << " "
         << pathName(op, c.selector().pathFor(op, bucketBytes(b))) << "\n";
    }
  }
  return os.str();
}

// Runs `body` with a zeroed device mismatch counter and a stream of its own; returns the count.
unsigned long long countMismatchesOf(
    const std::function<void(unsigned long long* bad, cudaStream_t s)>& body) {
  unsigned long long* bad = deviceAlloc<unsigned long long>();
  R_CUDA(cudaMemset(bad, 0, sizeof(*bad)));
  cudaStream_t s = nonBlockingStream();
  body(bad, s);
  unsigned long long h = 0;
  R_CUDA(cudaMemcpyAsync(&h, bad, sizeof(h), cudaMemcpyDeviceToHost, s));
  R_CUDA(cudaStreamSynchronize(s));
  R_CUDA(cudaFree(bad));
  R_CUDA(cudaStreamDestroy(s));
  return h;
}

// Exact all-reduce at a few sizes through whatever dispatch chooses; returns wrong elements.
unsigned long long checkExact(anyrComm_t comm, int rank, int n) {
  const std::vector<uint64_t> counts = {1, 1000, 65536 + 3, 1u << 20};
  void* in = deviceAlloc<void>((1u << 20) * 2);
  void* out = deviceAlloc<void>((1u << 20) * 2);
  const unsigned long long wrong = countMismatchesOf([&](unsigned long long* bad, cudaStream_t s) {
    uint32_t seed = 77;
    for (uint64_t c : counts) {
      ++seed;
      R_CUDA(data::fillInput(anyrBfloat16, in, c, rank, seed, data::kSmallInts, s));
      R_CUDA(cudaMemsetAsync(out, 0xff, c * 2, s));
      R_ANYR(anyrAllReduce(in, out, c, anyrBfloat16, anyrSum, comm, s), comm);
      R_CUDA(data::countMismatches(anyrBfloat16, out, c, n, seed, data::kSmallInts, bad, s));
    }
  });
  R_CUDA(cudaFree(in));
  R_CUDA(cudaFree(out));
  return wrong;
}

// The fused op through whatever dispatch chooses, at `hidden` and a few token counts, without a
// residual: residualOut is then the all-reduced rows rounded to bf16, exact for small integers.
// Returns wrong elements.
unsigned long long checkFusedExact(anyrComm_t comm, int rank, int n, size_t hidden) {
  const std::vector<size_t> tokens = {1, 3, 16, 24, 64};
  const size_t maxCount = 64 * hidden;
  void *in = nullptr, *resid = nullptr, *norm = nullptr, *weight = nullptr;
  for (void** q : {&in, &resid, &norm}) R_CUDA(cudaMalloc(q, maxCount * 2));
  R_CUDA(cudaMalloc(&weight, hidden * 2));
  R_CUDA(cudaMemset(weight, 0, hidden * 2));
  const unsigned long long wrong = countMismatchesOf([&](unsigned long long* bad, cudaStream_t s) {
    uint32_t seed = 300;
    for (size_t t : tokens) {
      ++seed;
      const uint64_t count = t * hidden;
      R_CUDA(data::fillInput(anyrBfloat16, in, count, rank, seed, data::kSmallInts, s));
      R_CUDA(cudaMemsetAsync(resid, 0xff, count * 2, s));
      R_ANYR(anyrAllReduceAddRmsNorm(in, nullptr, resid, weight, 1e-6f, norm, t, hidden,
                                     anyrBfloat16, nullptr, comm, s),
             comm);
      R_CUDA(data::countMismatches(anyrBfloat16, resid, count, n, seed, data::kSmallInts, bad, s));
    }
  });
  for (void* q : {in, resid, norm, weight}) R_CUDA(cudaFree(q));
  return wrong;
}

// The cluster sizes (1, 2, 4, 8) the launches of one fused call of `tokens` x `hidden` took,
// from the communicator's counters ("2", "1/8"; "" if no fused kernel ran).
std::string clustersOfCall(anyrComm_t comm, size_t tokens, size_t hidden) {
  const size_t count = tokens * hidden;
  void *in = nullptr, *resid = nullptr, *norm = nullptr, *weight = nullptr;
  for (void** q : {&in, &resid, &norm}) R_CUDA(cudaMalloc(q, count * 2));
  R_CUDA(cudaMalloc(&weight, hidden * 2));
  for (void* q : {in, resid}) R_CUDA(cudaMemset(q, 0, count * 2));
  R_CUDA(cudaMemset(weight, 0, hidden * 2));
  anyrCounters_t before{}, after{};
  before.size = after.size = sizeof(anyrCounters_t);
  before.magic = after.magic = ANYR_COUNTERS_MAGIC;
  R_ANYR(anyrCommGetCounters(comm, &before), comm);
  cudaStream_t s = nonBlockingStream();
  R_ANYR(anyrAllReduceAddRmsNorm(in, resid, resid, weight, 1e-6f, norm, tokens, hidden,
                                 anyrBfloat16, nullptr, comm, s),
         comm);
  R_CUDA(cudaStreamSynchronize(s));
  R_ANYR(anyrCommGetCounters(comm, &after), comm);
  R_CUDA(cudaStreamDestroy(s));
  for (void* q : {in, resid, norm, weight}) R_CUDA(cudaFree(q));
  return tool::clusterSizesRan(before, after);
}

// Lines starting with `prefix` of one rank's report.
std::vector<std::string> linesOf(const launch::RankResult& r, const std::string& prefix) {
  std::vector<std::string> out;
  std::istringstream is(r.message);
  for (std::string line; std::getline(is, line);) {
    if (line.rfind(prefix, 0) == 0) out.push_back(line);
  }
  return out;
}

int ranksForTest() { return std::max(2, std::min(gpuCount(), 8)); }

TEST(DispatchGpu, TunedTableIsAgreedUsedSavedAndLoaded) {
  REQUIRE_GPU();
  const int n = ranksForTest();
  const std::string path = tmpFile("tuned");

  // 1. Tune a small range; every rank reports what dispatch now does.
  auto tuned =
      runRanksCatching(n, 600, [&](int rank, int nr, const anyrUniqueId& id, const Report& report) {
        anyrComm_t comm = openComm(rank, nr, id, nullptr, 0);
        Communicator& c = *comm->impl;
        if (c.selector().tuned() != nullptr) report("FAIL a table was installed before tuning\n");
        Communicator::TuneOptions o;
        o.minBytes = 1024;
        o.maxBytes = 4u << 20;
        o.maxTokens = 64;
        o.calls = 5;
        o.samples = 5;
        TuningTable t = c.tune(o, nullptr);
        if (c.selector().tuned() == nullptr) report("FAIL no table installed after tuning\n");
        size_t measured = 0;
        for (int op = 0; op < kNumOps; ++op) {
          for (const TunedPoint& p : t.points[static_cast<size_t>(op)]) {
            ++measured;
            const Path used = c.selector().pathFor(static_cast<Op>(op), bucketBytes(p.bucket));
            if (pathName(static_cast<Op>(op), used) != p.choice) {
              report("FAIL " + std::string(opName(static_cast<Op>(op))) + " bucket " +
                     std::to_string(p.bucket) + ": table says " + p.choice + ", dispatch uses " +
                     pathName(static_cast<Op>(op), used) + "\n");
            }
            if (c.selector().dispatchTable().source[static_cast<size_t>(op)][static_cast<size_t>(
                    p.bucket)] != Source::Measured) {
              report("FAIL bucket " + std::to_string(p.bucket) + " not marked measured\n");
            }
          }
        }
        // 13 all-reduce buckets (1 KB..4 MB) + 2 x 7 fused (1..64 tokens at hidden 6144).
        if (measured != 13 + 14) report("FAIL measured " + std::to_string(measured) + " points\n");
        // Where a fused kernel won a point, its cluster sizes were measured against the rule
        // and the choice is one of them; a measured size holds at the table's hidden only.
        for (int op = 1; op < kNumOps; ++op) {
          for (const TunedPoint& p : t.points[static_cast<size_t>(op)]) {
            Path chosen;
            if (!parsePath(static_cast<Op>(op), p.choice, &chosen)) {
              report("FAIL unreadable choice " + p.choice + "\n");
              continue;
            }
            if (!chosen.fusedKernel) continue;
            int tokens = 1;
            while (bucketOf(static_cast<uint64_t>(tokens) * 6144 * 2) < p.bucket) tokens *= 2;
            const std::vector<int> sizes = c.fusedPlan().clusterSizesToMeasure(
                chosen.algo, tokens, 6144,
                static_cast<Op>(op) == Op::AddRmsNormQuant ? anyrQuantFp8 : anyrQuantNone);
            std::vector<std::string> want;
            Path base = chosen;
            base.cluster = 0;
            if (!sizes.empty()) want.push_back(pathName(static_cast<Op>(op), base) + "/rule");
            for (int size : sizes) {
              Path v = base;
              v.cluster = size;
              want.push_back(pathName(static_cast<Op>(op), v));
            }
            for (const std::string& w : want) {
              bool timed = false;
              for (const auto& [name, us] : p.times) timed = timed || (name == w && us > 0);
              if (!timed) {
                report("FAIL " + w + " not measured at bucket " + std::to_string(p.bucket) + "\n");
              }
            }
            const Path at6144 =
                c.selector().pathFor(static_cast<Op>(op), bucketBytes(p.bucket), 6144);
            const Path at7168 =
                c.selector().pathFor(static_cast<Op>(op), bucketBytes(p.bucket), 7168);
            if (at6144 != chosen || !at7168.sameKernel(chosen) || at7168.cluster != 0) {
              report("FAIL bucket " + std::to_string(p.bucket) + ": hidden 6144 takes " +
                     pathName(static_cast<Op>(op), at6144) + ", 7168 " +
                     pathName(static_cast<Op>(op), at7168) + " for " + p.choice + "\n");
            }
            // A measured size is what the call then runs (the unquantized op: no options).
            if (op == static_cast<int>(Op::AddRmsNorm) && chosen.cluster != 0) {
              const std::string ran = clustersOfCall(comm, static_cast<size_t>(tokens), 6144);
              if (ran != std::to_string(chosen.cluster)) {
                report("FAIL " + p.choice + " at " + std::to_string(tokens) +
                       " tokens ran clusters of '" + ran + "'\n");
              }
            }
            report("CLUSTER " + std::string(opName(static_cast<Op>(op))) + " bucket " +
                   std::to_string(p.bucket) + " " + p.choice + "\n");
          }
        }
        // The public query agrees with the table.
        anyrAlgo_t q = anyrAlgoAuto;
        R_ANYR(anyrCommQueryAlgorithm(comm, 512, anyrBfloat16, &q), comm);
        if (q != c.selector().pathFor(Op::AllReduce, 1024).algo)
          report("FAIL query disagrees with dispatch\n");
        const unsigned long long wrong = checkExact(comm, rank, nr);
        if (wrong != 0) report("FAIL " + std::to_string(wrong) + " wrong elements after tuning\n");
        for (size_t hidden : {6144, 7168}) {
          const unsigned long long bad = checkFusedExact(comm, rank, nr, hidden);
          if (bad != 0) {
            report("FAIL " + std::to_string(bad) + " wrong fused elements at hidden " +
                   std::to_string(hidden) + " after tuning\n");
          }
        }
        if (rank == 0) saveTuningFile(t, path);
        report(dispatchLines(c));
        R_ANYR(anyrCommDestroy(comm), nullptr);
        return 0;
      });
  expectRanksPassed(tuned);
  const std::vector<std::string> choices = linesOf(tuned[0], "CHOICE");
  ASSERT_FALSE(choices.empty());
  for (const auto& r : tuned) EXPECT_EQ(linesOf(r, "CHOICE"), choices) << "rank " << r.rank;

  // 2. A new communicator loads the saved table (ANYR_TUNING_FILE / config.tuningFile) and
  //    dispatches exactly as the tuned one did.
  auto loaded =
      runRanksCatching(n, 300, [&](int rank, int nr, const anyrUniqueId& id, const Report& report) {
        anyrComm_t comm = openComm(rank, nr, id, path.c_str(), 0);
        Communicator& c = *comm->impl;
        if (c.selector().tuned() == nullptr) report("FAIL the saved table was not loaded\n");
        const unsigned long long wrong = checkExact(comm, rank, nr);
        if (wrong != 0)
          report("FAIL " + std::to_string(wrong) + " wrong elements (loaded table)\n");
        report(dispatchLines(c));
        R_ANYR(anyrCommDestroy(comm), nullptr);
        return 0;
      });
  expectRanksPassed(loaded);
  for (const auto& r : loaded) EXPECT_EQ(linesOf(r, "CHOICE"), choices) << "rank " << r.rank;

  // 3. A corrupt file: init succeeds, with the seed and a reason in explain.
  {
    std::ofstream f(path);
    f << "{\"format\": \"anyreduce-tuning\", \"version\": 1, \"fingerp";
  }
  auto corrupt =
      runRanksCatching(n, 300, [&](int rank, int nr, const anyrUniqueId& id, const Report& report) {
        anyrComm_t comm = openComm(rank, nr, id, path.c_str(), 0);
        Communicator& c = *comm->impl;
        if (c.selector().tuned() != nullptr) report("FAIL a corrupt table was installed\n");
        const std::string ex = c.explainJson();
        if (ex.find("ignored") == std::string::npos ||
            ex.find("not valid JSON") == std::string::npos) {
          report("FAIL explain does not say why the table was ignored\n");
        }
        if (c.selector().dispatchTable().source[0][10] != Source::Seed)
          report("FAIL not the seed\n");
        R_ANYR(anyrCommDestroy(comm), nullptr);
        return 0;
      });
  expectRanksPassed(corrupt);
  std::remove(path.c_str());
}

TEST(DispatchGpu, InitTimeTuningWithinABudgetSavesTheTable) {
  REQUIRE_GPU();
  const int n = ranksForTest();
  const std::string path = tmpFile("init");
  auto results =
      runRanksCatching(n, 600, [&](int rank, int nr, const anyrUniqueId& id, const Report& report) {
        const auto t0 = std::chrono::steady_clock::now();
        anyrComm_t comm = openComm(rank, nr, id, path.c_str(), 3000);
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        Communicator& c = *comm->impl;
        if (c.selector().tuned() == nullptr) report("FAIL init-time tuning installed no table\n");
        // The budget stops measuring after the point that crossed it: generous bound, no hang.
        if (s > 120)
          report("FAIL init with a 3 s tuning budget took " + std::to_string(s) + " s\n");
        const unsigned long long wrong = checkExact(comm, rank, nr);
        if (wrong != 0) report("FAIL " + std::to_string(wrong) + " wrong elements\n");
        report(dispatchLines(c));
        R_ANYR(anyrCommDestroy(comm), nullptr);
        return 0;
      });
  expectRanksPassed(results);
  const std::vector<std::string> choices = linesOf(results[0], "CHOICE");
  for (const auto& r : results) EXPECT_EQ(linesOf(r, "CHOICE"), choices) << "rank " << r.rank;
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << "rank 0 did not save the init-time table to " << path;
  std::remove(path.c_str());
}

}  // namespace
}  // namespace anyr

namespace anyr {
namespace {

// anyrCommExplain and anyrCommQueryAlgorithm take no call guard (they answer while a call runs),
// so they must not read the dispatch table while anyrCommTune rewrites it: a second thread
// reads both in a loop while every rank tunes three times (a small budget each). Every explain
// must parse and every query name an algorithm. A data race need not fail every run; this test
// makes the reads and the install overlap thousands of times.
TEST(DispatchGpu, ExplainAndQueryWhileTuningReadAWholeTable) {
  REQUIRE_GPU();
  auto results =
      runRanksCatching(2, 300, [&](int rank, int n, const anyrUniqueId& id, const Report& report) {
        anyrComm_t comm = initRankComm(rank, n, id, 30000);
        std::atomic<bool> done{false};
        std::atomic<long> reads{0};
        std::atomic<long> grew{0};
        std::string bad;
        std::thread reader([&] {
          while (!done.load()) {
            size_t need = 0;
            if (anyrCommExplain(comm, nullptr, 0, &need) != anyrSuccess) continue;
            std::vector<char> buf(need);
            if (anyrCommExplain(comm, buf.data(), buf.size(), &need) != anyrSuccess) continue;
            // The document grew between the two calls (tuning installed a table): the second
            // call said so through `need` and wrote a truncated prefix; ask again.
            if (need > buf.size()) {
              grew.fetch_add(1);
              continue;
            }
            if (!nlohmann::json::accept(std::string(buf.data()))) {
              bad = "an explain document did not parse";
              break;
            }
            anyrAlgo_t a = anyrAlgoAuto;
            if (anyrCommQueryAlgorithm(comm, 65536, anyrBfloat16, &a) != anyrSuccess ||
                anyrAlgoName(a) == nullptr) {
              bad = "a query named no algorithm";
              break;
            }
            reads.fetch_add(1);
          }
        });
        int failures = 0;
        for (int round = 0; round < 3; ++round) {
          if (anyrCommTune(comm, 300, nullptr) != anyrSuccess) {
            ++failures;
            report(std::string("FAIL tune: ") + anyrGetLastError(comm) + "\n");
            break;
          }
        }
        done.store(true);
        reader.join();
        if (!bad.empty()) {
          ++failures;
          report("FAIL " + bad + "\n");
        }
        if (reads.load() < 10) {
          ++failures;
          report("FAIL the reader made only " + std::to_string(reads.load()) + " reads\n");
        }
        report("NOTE rank " + std::to_string(rank) + ": " + std::to_string(reads.load()) +
               " explain + query reads during tuning, " + std::to_string(grew.load()) +
               " explains that grew between the size query and the read\n");
        return releaseRank(comm, nullptr, {}, failures);
      });
  expectRanksPassed(results);
}

}  // namespace
}  // namespace anyr
