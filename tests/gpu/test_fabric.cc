// The fabric measured live at communicator init (core/fabric.h), on the device: at 2 to 8 ranks
// the protocol runs and every rank holds the same record (on one shared GPU the figures are
// shown, not applied; on GPUs of their own they are applied), the peer workspace stays exact
// for the algorithms; applied measured figures drive the slow-write rule on every rank; a rank
// that fails the measurement leaves every rank unmeasured within a bound, naming it; forced
// islands are measured inside each island and that figure is used; without a peer workspace the
// host memory alone is measured and used; the record
// is cached with the tuning table, reused without measuring, refreshed by tuning, and
// ANYR_FABRIC's modes do what they say. Each rank prints the measurement's cost.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "anyreduce/anyreduce.h"
#include "common/data.h"
#include "common/launcher.h"
#include "gpu/gpu_test_util.h"

namespace anyr {
namespace {

using nlohmann::json;

// Sets an environment variable for the ranks forked while it lives (they inherit it).
struct RankEnv {
  std::string name;
  RankEnv(const char* n, const char* v) : name(n) { setenv(n, v, 1); }
  ~RankEnv() { unsetenv(name.c_str()); }
  RankEnv(const RankEnv&) = delete;
  RankEnv& operator=(const RankEnv&) = delete;
};

std::string tmpFile(const std::string& tag) {
  const std::string path =
      "/tmp/anyr_gpu_fabric_" + tag + "_" + std::to_string(::getpid()) + ".json";
  std::remove(path.c_str());
  return path;
}

std::string hashOf(const json& j) { return std::to_string(std::hash<std::string>()(j.dump())); }

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Exact automatic all-reduces at sizes that take the one-shot, the two-shot and the staging:
// the measurement, which wrote into the peers' staging and flags, left the workspace as the
// algorithms need it. The wrong elements.
unsigned long long wrongAfter(anyrComm_t comm, int rank, int n) {
  const uint64_t maxCount = (4u << 20) / 2;
  cudaStream_t s = nonBlockingStream();
  void* in = deviceAlloc<void>(maxCount * 2);
  void* out = deviceAlloc<void>(maxCount * 2);
  unsigned long long* dWrong = deviceAlloc<unsigned long long>();
  unsigned long long total = 0;
  uint32_t seed = 900;
  for (uint64_t c : {uint64_t{1}, uint64_t{4096}, uint64_t{65541}, maxCount}) {
    ++seed;
    R_CUDA(data::fillInput(anyrBfloat16, in, c, rank, seed, data::kSmallInts, s));
    R_CUDA(cudaMemsetAsync(out, 0xff, c * 2, s));
    R_ANYR(anyrAllReduce(in, out, c, anyrBfloat16, anyrSum, comm, s), comm);
    unsigned long long wrong = 0;
    R_CUDA(data::mismatchesNow(anyrBfloat16, out, c, n, seed, data::kSmallInts, dWrong, s, &wrong));
    total += wrong;
  }
  R_CUDA(cudaFree(in));
  R_CUDA(cudaFree(out));
  R_CUDA(cudaFree(dWrong));
  R_CUDA(cudaStreamDestroy(s));
  return total;
}

// Every off-diagonal entry of a rank x rank matrix of figures is > 0.
bool allMeasured(const json& m, int n) {
  if (!m.is_array() || m.size() != static_cast<size_t>(n)) return false;
  for (int s = 0; s < n; ++s) {
    for (int d = 0; d < n; ++d) {
      if (s != d && !(m[s][d].get<double>() > 0)) return false;
    }
  }
  return true;
}

// The checks of a record that was measured now (explain's "fabric"); `applied`: expected to be
// in use (GPUs of their own, or ANYR_TEST_FABRIC_APPLY=1).
int checkMeasured(const json& ex, int n, bool applied, const std::string& sourceHas,
                  const Report& report) {
  int failures = 0;
  auto fail = [&](const std::string& what) {
    ++failures;
    report("FAIL n=" + std::to_string(n) + ": " + what + "\n");
  };
  const json& f = ex["fabric"];
  if (f["state"] != "measured") {
    fail("state " + f["state"].get<std::string>() + ": " + f["summary"].get<std::string>());
    return failures;
  }
  if (!has(f["source"].get<std::string>(), sourceHas)) {
    fail("source '" + f["source"].get<std::string>() + "' lacks '" + sourceHas + "'");
  }
  if (!(f["measureMs"].get<double>() > 0)) fail("no measurement time");
  for (const char* m : {"writeGBps", "readGBps", "latencyUs"}) {
    if (!allMeasured(f[m], n))
      fail(std::string(m) + " not measured for every pair: " + f[m].dump());
  }
  const json& load = f["load"];
  if (!load.is_object()) {
    fail("nothing under load: " + f["summary"].get<std::string>());
  } else {
    for (const char* k : {"allToAllGBps", "ringGBps", "syncUs", "hopUs"}) {
      if (!(load[k].get<double>() > 0)) fail(std::string("load.") + k + " not measured");
    }
    // The copy engines pulling from the ring neighbour (ring-copy's pattern).
    if (!load.contains("ringCopyGBps") || !(load["ringCopyGBps"].get<double>() > 0)) {
      fail("load.ringCopyGBps not measured");
    }
    // Through the host segment, wherever the host transport is set up.
    if (ex["hostTransport"]["available"].get<bool>()) {
      for (const char* k : {"hostGBps", "hostStepUs"}) {
        if (!load.contains(k) || !(load[k].get<double>() > 0)) {
          fail(std::string("load.") + k + " not measured though the host transport is set up");
        }
      }
    }
  }
  if (f["applied"].get<bool>() != applied) {
    fail(std::string("applied is ") + (applied ? "false" : "true") + ": " +
         f["reason"].get<std::string>());
  }
  // Applied: the topology admission and the seed read holds the figures; else it does not.
  const json& topo = ex["topology"];
  const double w01 = topo["pairs"][1]["writeGBps"].get<double>();  // rank 0 -> rank 1
  if (applied) {
    if (!(w01 > 0) || !topo.contains("load") ||
        !has(topo["load"]["source"].get<std::string>(), sourceHas)) {
      fail("the topology lacks the applied figures");
    }
  } else {
    if (w01 > 0 || topo.contains("load")) fail("figures in the topology though not applied");
    if (!has(f["reason"].get<std::string>(), "not applied: ranks share a GPU")) {
      fail("no reason why not applied: " + f["reason"].get<std::string>());
    }
  }
  const std::string text = ex["dispatchText"];
  if (!has(text, "fabric: " + f["source"].get<std::string>())) {
    fail("the dispatch text lacks the fabric line");
  }
  return failures;
}

// ---- 2 to 8 ranks -----------------------------------------------------------------------------

TEST(FabricGpu, MeasuredAtInitAndAgreedOnEveryRankFrom2To8Ranks) {
  REQUIRE_GPU();
  for (int n = 2; n <= 8; ++n) {
    SCOPED_TRACE("ranks " + std::to_string(n));
    const bool distinct = gpuCount() >= n;  // ranks on GPU rank % gpus
    auto results =
        runRanksCatching(n, 300, [&](int rank, int nr, const anyrUniqueId& id, const Report& rep) {
          const auto t0 = std::chrono::steady_clock::now();
          anyrComm_t comm = initRankComm(rank, nr, id, 30000);
          const double initMs =
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                  .count();
          const json ex = explainJson(comm);
          int failures = checkMeasured(ex, nr, distinct,
                                       "measured at init (" + std::to_string(nr) + " ranks)", rep);
          if (ex["fabric"]["mode"] != "measure") {
            ++failures;
            rep("FAIL mode " + ex["fabric"]["mode"].dump() + "\n");
          }
          const unsigned long long wrong = wrongAfter(comm, rank, nr);
          if (wrong != 0) {
            ++failures;
            rep("FAIL " + std::to_string(wrong) + " wrong elements after the measurement\n");
          }
          rep("HASH fabric " + hashOf(ex["fabric"]) + "\n");
          if (rank == 0) {
            char line[160];
            std::snprintf(line, sizeof(line),
                          "INFO %d ranks: fabric measured in %.1f ms (init %.0f ms)\n", nr,
                          ex["fabric"]["measureMs"].get<double>(), initMs);
            rep(line);
            rep("INFO " + ex["fabric"]["summary"].get<std::string>() + "\n");
          }
          R_ANYR(anyrCommDestroy(comm), nullptr);
          return failures ? 4 : 0;
        });
    expectRanksPassedWithEqualHashes(results, n);
  }
}

// ---- applied figures drive the choice -----------------------------------------------------------

TEST(FabricGpu, AppliedMeasuredSlowWritesPullOnEveryRank) {
  REQUIRE_GPU();
  const int n = 3;
  // Applied even on one shared GPU (tests only), and the threshold ladder (whose one-shot
  // flavour is the slow-write rule's), first as measured, then with rank 1's writes 50x slower.
  RankEnv apply("ANYR_TEST_FABRIC_APPLY", "1");
  RankEnv ladder("ANYR_ONESHOT_MAX_BYTES", "65536");
  for (bool slow : {false, true}) {
    SCOPED_TRACE(slow ? "rank 1 writes slowly" : "as measured");
    if (slow) setenv("ANYR_FAULT_INJECT", "fabric-slow-writes:1", 1);
    auto results =
        runRanksCatching(n, 300, [&](int rank, int nr, const anyrUniqueId& id, const Report& rep) {
          anyrComm_t comm = initRankComm(rank, nr, id, 30000);
          const json ex = explainJson(comm);
          int failures = checkMeasured(ex, nr, true, "measured at init", rep);
          const std::string oneShot = ex["thresholds"]["oneShot"];
          const std::string why = ex["thresholds"]["oneShotWhy"];
          const std::string text = ex["dispatchText"];
          if (slow) {
            if (oneShot != "oneshot-pull" || !has(why, "on rank 1 -> rank")) {
              ++failures;
              rep("FAIL slow writes: one-shot " + oneShot + " (" + why + ")\n");
            }
            if (!has(text, "slower than reads on GPU1->GPU")) {
              ++failures;
              rep("FAIL the seed's explanation does not name the slow pair\n");
            }
            failures += expectChoice(comm, 2048, "4 KB", {anyrAlgoOneShotPull}, rep);
          } else {
            if (oneShot != "oneshot-push") {
              ++failures;
              rep("FAIL as measured: one-shot " + oneShot + " (" + why + ")\n");
            }
            failures += expectChoice(comm, 2048, "4 KB", {anyrAlgoOneShotPush}, rep);
          }
          const unsigned long long wrong = wrongAfter(comm, rank, nr);
          if (wrong != 0) {
            ++failures;
            rep("FAIL " + std::to_string(wrong) + " wrong elements\n");
          }
          rep("HASH fabric " + hashOf(ex["fabric"]) + "\n");
          rep("HASH thresholds " + hashOf(ex["thresholds"]) + "\n");
          if (rank == 0) rep("INFO " + oneShot + ": " + why + "\n");
          R_ANYR(anyrCommDestroy(comm), nullptr);
          return failures ? 4 : 0;
        });
    unsetenv("ANYR_FAULT_INJECT");
    expectRanksPassedWithEqualHashes(results, n);
  }
}

// ---- through host memory only -------------------------------------------------------------------

TEST(FabricGpu, WithoutAPeerWorkspaceTheHostMemoryIsMeasuredAndUsed) {
  REQUIRE_GPU();
  // No peer workspace (ANYR_PEER_MEMORY=none): no pair and no peer transfer is measured, the host
  // segment is, every rank agrees, and with the figures applied (tests only, on one shared GPU)
  // the model's host memory is the measured one; the host algorithms then stay exact.
  RankEnv none("ANYR_PEER_MEMORY", "none");
  RankEnv apply("ANYR_TEST_FABRIC_APPLY", "1");
  for (int n : {2, 3, 5}) {
    SCOPED_TRACE("ranks " + std::to_string(n));
    auto results =
        runRanksCatching(n, 300, [&](int rank, int nr, const anyrUniqueId& id, const Report& rep) {
          anyrComm_t comm = initRankComm(rank, nr, id, 30000);
          const json ex = explainJson(comm);
          int failures = 0;
          auto fail = [&](const std::string& what) {
            ++failures;
            rep("FAIL " + what + "\n");
          };
          const json& f = ex["fabric"];
          const std::string summary = f["summary"];
          if (f["state"] != "measured") fail("state " + f["state"].dump() + ": " + summary);
          if (!has(f["reason"].get<std::string>(), "no peer workspace")) {
            fail("no reason why the pairs are not measured: " + f["reason"].dump());
          }
          const json& load = f["load"];
          if (!load.is_object() || !load.contains("hostGBps") || !load.contains("hostStepUs") ||
              !(load["hostGBps"].get<double>() > 0) || !(load["hostStepUs"].get<double>() > 0)) {
            fail("the host memory not measured: " + summary);
          } else if (load["allToAllGBps"].get<double>() > 0 || f["writeGBps"][0][1] != -1) {
            fail("peer figures without a peer workspace: " + summary);
          }
          if (!has(ex["dispatchText"].get<std::string>(), "GB/s per direction (measured")) {
            fail("the cost model's inputs do not use the measured host memory");
          }
          const unsigned long long wrong = wrongAfter(comm, rank, nr);
          if (wrong != 0) fail(std::to_string(wrong) + " wrong elements");
          rep("HASH fabric " + hashOf(f) + "\n");
          if (rank == 0) rep("INFO " + summary + "\n");
          R_ANYR(anyrCommDestroy(comm), nullptr);
          return failures ? 4 : 0;
        });
    expectRanksPassedWithEqualHashes(results, n);
  }
}

// ---- inside the islands ------------------------------------------------------------------------

TEST(FabricGpu, IslandsAreMeasuredInsideEachIslandOverTheIslandsInUse) {
  REQUIRE_GPU();
  // Islands forced (ranks sharing a GPU form one island otherwise), the figures applied even on
  // one shared GPU (tests only): every rank with peers in its island stores into them at once;
  // a rank alone in its island takes part in the barriers only; all alone: nothing measured.
  struct Case {
    int n;
    const char* islands;
    const char* text;  // Islands::text(); "" where nothing is measured inside the islands
  };
  const Case cases[] = {{4, "0-1,2-3", "0-1 | 2-3"}, {5, "0-3,4", "0-3 | 4"}, {3, "0,1,2", ""}};
  RankEnv apply("ANYR_TEST_FABRIC_APPLY", "1");
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string("ANYR_ISLANDS=") + c.islands);
    RankEnv islands("ANYR_ISLANDS", c.islands);
    const std::string want = c.text;
    auto results = runRanksCatching(
        c.n, 300, [&](int rank, int nr, const anyrUniqueId& id, const Report& rep) {
          anyrComm_t comm = initRankComm(rank, nr, id, 30000);
          const json ex = explainJson(comm);
          int failures = checkMeasured(ex, nr, true, "measured at init", rep);
          const json& load = ex["fabric"]["load"];
          const double gbps = load.is_object() ? load["islandGBps"].get<double>() : -1;
          const std::string over = load.is_object() && load.contains("islands")
                                       ? load["islands"].get<std::string>()
                                       : "";
          const std::string text = ex["dispatchText"];
          if (want.empty()) {
            if (gbps > 0 || !over.empty()) {
              ++failures;
              rep("FAIL every rank alone in its island, yet " + std::to_string(gbps) +
                  " GB/s over '" + over + "'\n");
            }
          } else {
            if (!(gbps > 0) || over != want) {
              ++failures;
              rep("FAIL inside the islands: " + std::to_string(gbps) + " GB/s over '" + over +
                  "', wanted a figure over '" + want + "'\n");
            }
            if (!has(text, "inside each island under load")) {
              ++failures;
              rep("FAIL the cost model's inputs do not use the island figure\n");
            }
          }
          const unsigned long long wrong = wrongAfter(comm, rank, nr);
          if (wrong != 0) {
            ++failures;
            rep("FAIL " + std::to_string(wrong) + " wrong elements\n");
          }
          rep("HASH fabric " + hashOf(ex["fabric"]) + "\n");
          if (rank == 0) rep("INFO " + ex["fabric"]["summary"].get<std::string>() + "\n");
          R_ANYR(anyrCommDestroy(comm), nullptr);
          return failures ? 4 : 0;
        });
    expectRanksPassedWithEqualHashes(results, c.n);
  }
}

// ---- a rank that fails --------------------------------------------------------------------------

TEST(FabricGpu, ARankFailingTheMeasurementLeavesEveryRankUnmeasuredWithinABound) {
  REQUIRE_GPU();
  // The failing rank stays silent before the fabric under load: its peers' device waits for it
  // run out (a quarter of the 8 s timeout: 2 s), they tell each other, and every rank ends
  // unmeasured with the same reason naming it; init succeeds and the workspace is exact.
  const struct { int n, failing; } cases[] = {{2, 1}, {4, 1}, {3, 0}, {8, 5}};
  for (const auto& c : cases) {
    SCOPED_TRACE(std::to_string(c.n) + " ranks, rank " + std::to_string(c.failing) + " failing");
    const std::string fault = "fabric-fail:" + std::to_string(c.failing);
    RankEnv env("ANYR_FAULT_INJECT", fault.c_str());
    auto results = runRanksCatching(
        c.n, 300, [&](int rank, int nr, const anyrUniqueId& id, const Report& rep) {
          const auto t0 = std::chrono::steady_clock::now();
          anyrComm_t comm = initRankComm(rank, nr, id, 8000);
          const double s =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          int failures = 0;
          const json ex = explainJson(comm);
          const json& f = ex["fabric"];
          const std::string reason = f["reason"];
          const std::string named = "not measured: rank " + std::to_string(c.failing) +
                                    ": measuring under load: failed by ANYR_FAULT_INJECT=" + fault;
          if (f["state"] != "not measured" || !has(reason, named)) {
            ++failures;
            rep("FAIL state " + f["state"].dump() + ", reason: " + reason + "\n");
          }
          if (ex["topology"].contains("load") || ex["topology"]["pairs"][1]["writeGBps"] != -1) {
            ++failures;
            rep("FAIL figures in the topology of an unmeasured fabric\n");
          }
          if (!has(ex["dispatchText"].get<std::string>(), "nominal link figures and the seed")) {
            ++failures;
            rep("FAIL the dispatch text does not say the seed decides\n");
          }
          // One device wait (2 s) and the exchanges, far from the 8 s timeout of each.
          if (s > 30) {
            ++failures;
            rep("FAIL init took " + std::to_string(s) + " s\n");
          }
          const unsigned long long wrong = wrongAfter(comm, rank, nr);
          if (wrong != 0) {
            ++failures;
            rep("FAIL " + std::to_string(wrong) + " wrong elements after the failed measurement\n");
          }
          rep("HASH fabric " + hashOf(f) + "\n");
          if (rank == 0) {
            char line[64];
            std::snprintf(line, sizeof(line), "INFO init %.1f s: ", s);
            rep(line + reason + "\n");
          }
          R_ANYR(anyrCommDestroy(comm), nullptr);
          return failures ? 4 : 0;
        });
    expectRanksPassedWithEqualHashes(results, c.n);
  }
}

// ---- the cache, tuning and the modes ------------------------------------------------------------

// One communicator of `n` ranks over `tuningFile` ("" none): its explain's "fabric" (rank 0
// also reports it as a "FABRIC <json>" line); with `tuneTo`, then anyrCommTuneWithOptions over
// a small plan saving there, and explain's "fabric" afterwards as "AFTER <json>".
std::vector<launch::RankResult> openAndReport(int n, const std::string& tuningFile,
                                              const std::string& tuneTo) {
  return runRanksCatching(n, 300, [&](int rank, int nr, const anyrUniqueId& id, const Report& rep) {
    anyrComm_t comm = initRankComm(rank, nr, id, 30000, [&](anyrConfig_t& c) {
      if (!tuningFile.empty()) c.tuningFile = tuningFile.c_str();
    });
    const json f = explainJson(comm)["fabric"];
    rep("HASH fabric " + hashOf(f) + "\n");
    if (rank == 0) rep("FABRIC " + f.dump() + "\n");
    if (!tuneTo.empty()) {
      anyrTuneOptions_t o = ANYR_TUNE_OPTIONS_INITIALIZER;
      o.minBytes = o.maxBytes = 1024;
      o.maxTokens = 1;
      o.calls = 2;
      o.samples = 3;
      R_ANYR(anyrCommTuneWithOptions(comm, &o, tuneTo.c_str()), comm);
      const json after = explainJson(comm)["fabric"];
      rep("HASH after " + hashOf(after) + "\n");
      if (rank == 0) rep("AFTER " + after.dump() + "\n");
    }
    const unsigned long long wrong = wrongAfter(comm, rank, nr);
    if (wrong != 0) rep("FAIL " + std::to_string(wrong) + " wrong elements\n");
    R_ANYR(anyrCommDestroy(comm), nullptr);
    return 0;
  });
}

// Rank 0's "<tag> <json>" line.
json reported(const std::vector<launch::RankResult>& results, const std::string& tag) {
  for (const auto& r : results) {
    if (r.rank != 0) continue;
    std::istringstream is(r.message);
    for (std::string line; std::getline(is, line);) {
      if (line.rfind(tag + " ", 0) == 0) return json::parse(line.substr(tag.size() + 1));
    }
  }
  ADD_FAILURE() << "rank 0 reported no " << tag;
  return json::object();
}

json fabricInFile(const std::string& path) {
  std::ifstream f(path);
  if (!f) {
    ADD_FAILURE() << "no file " << path;
    return json::object();
  }
  const json table = json::parse(f);
  if (!table.contains("fabric")) {
    ADD_FAILURE() << path << " holds no fabric record";
    return json::object();
  }
  return table["fabric"];
}

TEST(FabricGpu, CachedWithTheTuningTableReusedWithoutMeasuringAndRefreshedByTuning) {
  REQUIRE_GPU();
  const int n = 3;
  const std::string first = tmpFile("first"), second = tmpFile("second");

  // 1. No table yet: measured at init (the missing file named); tuning keeps that record (it is
  //    this communicator's own) and saves it with the table.
  auto measured = openAndReport(n, first, first);
  expectRanksPassedWithEqualHashes(measured, n);
  const json atInit = reported(measured, "FABRIC");
  EXPECT_EQ(atInit["state"], "measured");
  EXPECT_TRUE(has(atInit["reason"].get<std::string>(), "the cached record was not used"))
      << atInit["reason"];
  EXPECT_EQ(reported(measured, "AFTER")["source"], "measured at init (3 ranks)");
  const json saved = fabricInFile(first);
  EXPECT_EQ(saved["source"], "measured at init (3 ranks)");
  EXPECT_EQ(saved["writeGBps"], atInit["writeGBps"]);
  EXPECT_EQ(saved["load"]["syncUs"], atInit["load"]["syncUs"]);

  // 2. The table's record is used without measuring; tuning then measures afresh and saves
  //    the new record.
  auto cached = openAndReport(n, first, second);
  expectRanksPassedWithEqualHashes(cached, n);
  const json reused = reported(cached, "FABRIC");
  EXPECT_EQ(reused["state"], "cached");
  EXPECT_EQ(reused["cachedIn"], first);
  EXPECT_EQ(reused["writeGBps"], saved["writeGBps"]);
  EXPECT_TRUE(has(reused["summary"].get<std::string>(), "not measured at init"));
  const json refreshed = reported(cached, "AFTER");
  EXPECT_EQ(refreshed["state"], "measured");
  EXPECT_EQ(refreshed["source"], "measured by anyrCommTune (3 ranks)");
  EXPECT_EQ(fabricInFile(second)["source"], "measured by anyrCommTune (3 ranks)");

  // 3. Another world: the record is stale, said so, and measured anew.
  auto stale = openAndReport(2, first, "");
  expectRanksPassedWithEqualHashes(stale, 2);
  const json anew = reported(stale, "FABRIC");
  EXPECT_EQ(anew["state"], "measured");
  EXPECT_TRUE(has(anew["reason"].get<std::string>(), "stale")) << anew["reason"];

  // 4. ANYR_FABRIC=cached: the record, or none without a table (never measured); off: nothing.
  {
    RankEnv mode("ANYR_FABRIC", "cached");
    auto withTable = openAndReport(n, first, "");
    expectRanksPassedWithEqualHashes(withTable, n);
    EXPECT_EQ(reported(withTable, "FABRIC")["state"], "cached");
    auto without = openAndReport(n, "", "");
    expectRanksPassedWithEqualHashes(without, n);
    const json none = reported(without, "FABRIC");
    EXPECT_EQ(none["state"], "not measured");
    EXPECT_TRUE(has(none["reason"].get<std::string>(), "ANYR_FABRIC=cached and no tuning file"))
        << none["reason"];
    EXPECT_EQ(none["mode"], "cached");
  }
  {
    RankEnv mode("ANYR_FABRIC", "off");
    auto off = openAndReport(n, first, "");
    expectRanksPassedWithEqualHashes(off, n);
    const json f = reported(off, "FABRIC");
    EXPECT_EQ(f["state"], "off");
    EXPECT_EQ(f["mode"], "off");
  }
  std::remove(first.c_str());
  std::remove(second.c_str());
}

}  // namespace
}  // namespace anyr
