// The fabric a communicator measures at init (core/fabric.h), without a GPU: the ranks' rows
// combined into one record (the same on every rank; a failure anywhere leaves every rank
// unmeasured, naming the rank), applied to the topology, its JSON and its cache in the tuning
// table, ANYR_FABRIC, and that measured figures fed as rows drive admission's slow-write rule
// and the seed cost model exactly as a fixture holding the same figures does.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "algo/cost.h"
#include "base/config.h"
#include "base/error.h"
#include "cpu/expect_error.h"
#include "cpu/select_fixtures.h"
#include "select/admission.h"
#include "select/dispatch.h"
#include "select/explain_topology.h"
#include "select/tuning.h"
#include "topology/fabric.h"
#include "topology/topology.h"

namespace anyr {
namespace {

using testfix::fixture;

struct EnvGuard {
  std::string name;
  EnvGuard(const char* n, const char* v) : name(n) { setenv(n, v, 1); }
  ~EnvGuard() { unsetenv(name.c_str()); }
};

std::string tempPath(const std::string& tag) {
  return testing::TempDir() + "/anyr_fabric_" + tag + "_" + std::to_string(::getpid()) + ".json";
}

bool mentions(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

// The rows the ranks of a communicator over `t` would gather if each measured exactly the pair
// figures `t` records (its own row) and `t`'s load.
std::vector<FabricRow> rowsOf(const Topology& t) {
  std::vector<FabricRow> rows;
  for (int s = 0; s < t.size(); ++s) {
    FabricRow row = emptyFabricRow();
    for (int d = 0; d < t.size(); ++d) {
      if (s == d) continue;
      row.writeGBps[d] = t.pair(s, d).writeGBps;
      row.readGBps[d] = t.pair(s, d).readGBps;
      row.latencyUs[d] = t.pair(s, d).latencyUs;
    }
    row.allToAllGBps = t.load.allToAllGBps;
    row.ringGBps = t.load.ringGBps;
    row.syncUs = t.load.syncUs;
    row.hopUs = t.load.hopUs;
    row.elapsedMs = 10 + s;
    rows.push_back(row);
  }
  return rows;
}

// Rows of 4 ranks with distinct figures per pair, and under load per rank.
std::vector<FabricRow> syntheticRows(int n = 4) {
  std::vector<FabricRow> rows;
  for (int s = 0; s < n; ++s) {
    FabricRow row = emptyFabricRow();
    for (int d = 0; d < n; ++d) {
      if (s == d) continue;
      row.writeGBps[d] = 40 + s + 0.1 * d;
      row.readGBps[d] = 50 + s + 0.1 * d;
      row.latencyUs[d] = 0.5 + 0.01 * s + 0.001 * d;
    }
    row.allToAllGBps = 20 + s;   // rank 0 the least
    row.ringGBps = 45 - s;       // the last rank the least
    row.syncUs = 3 + s;          // the last rank the longest
    row.hopUs = 1.5 - 0.25 * s;  // rank 0 the longest
    row.elapsedMs = 12.5 + s;
    rows.push_back(row);
  }
  return rows;
}

// A topology of 4 GPUs behind one PCIe switch, each pair confirmed, no figures measured.
Topology bareFour() {
  Topology t = firstGpus(fixture("rtxpro6000_8gpu_switches"), 4);
  clearFabricFigures(&t);
  return t;
}

// ---- ANYR_FABRIC ------------------------------------------------------------------------------

TEST(FabricConfig, ModesParseFromTheEnvironmentAndCrossProcesses) {
  EXPECT_EQ(resolveConfig(nullptr).fabric, FabricMode::Measure);  // the default
  const struct {
    const char* text;
    FabricMode mode;
  } cases[] = {{"measure", FabricMode::Measure},
               {"1", FabricMode::Measure},
               {"cached", FabricMode::Cached},
               {"off", FabricMode::Off},
               {"0", FabricMode::Off}};
  for (const auto& c : cases) {
    EnvGuard g("ANYR_FABRIC", c.text);
    const Config cfg = resolveConfig(nullptr);
    EXPECT_EQ(cfg.fabric, c.mode) << c.text;
    EXPECT_TRUE(Config::fromWire(cfg.toWire()) == cfg) << c.text;  // rank 0's is everyone's
    EXPECT_TRUE(mentions(cfg.describe(), std::string("fabric=") + fabricModeName(c.mode)))
        << cfg.describe();
  }
  for (const char* bad : {"yes", "2", "Measure", "cache", " off"}) {
    EnvGuard g("ANYR_FABRIC", bad);
    expectError([] { resolveConfig(nullptr); }, anyrInvalidArgument,
                {"ANYR_FABRIC", "must be measure, cached or off"},
                std::string("accepted ANYR_FABRIC=") + bad);
  }
  Config a, b;
  b.fabric = FabricMode::Off;
  EXPECT_FALSE(a == b);
}

// ---- combining the rows ---------------------------------------------------------------------

TEST(FabricCombine, PairsFromTheirSourceRankAndTheWorstRankUnderLoad) {
  const std::vector<FabricRow> rows = syntheticRows();
  const FabricRecord r = combineFabric(rows, "measured at init (4 ranks)");
  ASSERT_EQ(r.state, FabricRecord::State::Measured) << r.reason;
  EXPECT_EQ(r.ranks, 4);
  EXPECT_EQ(r.source, "measured at init (4 ranks)");
  EXPECT_DOUBLE_EQ(r.measureMs, 15.5);  // the slowest rank's
  for (int s = 0; s < 4; ++s) {
    for (int d = 0; d < 4; ++d) {
      if (s == d) {
        EXPECT_LT(r.at(r.writeGBps, s, d), 0);
        continue;
      }
      EXPECT_DOUBLE_EQ(r.at(r.writeGBps, s, d), 40 + s + 0.1 * d);
      EXPECT_DOUBLE_EQ(r.at(r.readGBps, s, d), 50 + s + 0.1 * d);
      EXPECT_DOUBLE_EQ(r.at(r.latencyUs, s, d), 0.5 + 0.01 * s + 0.001 * d);
    }
  }
  EXPECT_EQ(r.load.ranks, 4);
  EXPECT_DOUBLE_EQ(r.load.allToAllGBps, 20);  // the least
  EXPECT_DOUBLE_EQ(r.load.ringGBps, 42);
  EXPECT_DOUBLE_EQ(r.load.syncUs, 6);   // the longest
  EXPECT_DOUBLE_EQ(r.load.hopUs, 1.5);  // the longest
  EXPECT_LT(r.load.ringHopUs, 0);       // NCCL's hop is the model's, not measured
  EXPECT_LT(r.load.islandGBps, 0);
  EXPECT_EQ(r.load.source, "measured at init (4 ranks)");
  // Every rank combines the same rows into the same record; another figure, another record.
  EXPECT_EQ(fabricHash(r), fabricHash(combineFabric(rows, "measured at init (4 ranks)")));
  std::vector<FabricRow> other = rows;
  other[2].readGBps[1] = 49;
  EXPECT_NE(fabricHash(r), fabricHash(combineFabric(other, "measured at init (4 ranks)")));
}

TEST(FabricCombine, FiguresThatAreNotMeasurementsAreLeftUnmeasured) {
  std::vector<FabricRow> rows = syntheticRows();
  rows[0].writeGBps[1] = std::nan("");
  rows[1].readGBps[0] = -3;
  rows[2].latencyUs[3] = 0;
  rows[3].writeGBps[0] = INFINITY;
  rows[1].syncUs = -1;  // one rank did not time its rounds: no round is known
  rows[2].hopUs = std::nan("");
  const FabricRecord r = combineFabric(rows, "measured at init (4 ranks)");
  ASSERT_EQ(r.state, FabricRecord::State::Measured);
  EXPECT_LT(r.at(r.writeGBps, 0, 1), 0);
  EXPECT_LT(r.at(r.readGBps, 1, 0), 0);
  EXPECT_LT(r.at(r.latencyUs, 2, 3), 0);
  EXPECT_LT(r.at(r.writeGBps, 3, 0), 0);
  EXPECT_LT(r.load.syncUs, 0);
  EXPECT_LT(r.load.hopUs, 0);
  EXPECT_DOUBLE_EQ(r.load.allToAllGBps, 20);
  // Nothing under load measured on any rank: no load at all.
  for (FabricRow& row : rows) row.allToAllGBps = row.ringGBps = row.syncUs = row.hopUs = -1;
  const FabricRecord pairsOnly = combineFabric(rows, "measured at init (4 ranks)");
  EXPECT_EQ(pairsOnly.state, FabricRecord::State::Measured);
  EXPECT_FALSE(pairsOnly.load.known());
  EXPECT_TRUE(mentions(fabricSummary(pairsOnly), "under load not measured"));
}

TEST(FabricCombine, TheIslandFigureIsTheLeastOfTheRanksWithPeersInTheirIsland) {
  // Islands 0-2 | 3: rank 3 is alone in its island (0: nothing to measure).
  std::vector<FabricRow> rows = syntheticRows();
  for (int s = 0; s < 3; ++s) rows[static_cast<size_t>(s)].islandGBps = 30 + s;
  rows[3].islandGBps = 0;
  const FabricRecord r = combineFabric(rows, "measured at init (4 ranks)", "0-2 | 3");
  ASSERT_EQ(r.state, FabricRecord::State::Measured) << r.reason;
  EXPECT_DOUBLE_EQ(r.load.islandGBps, 30);
  EXPECT_EQ(r.load.islands, "0-2 | 3");
  EXPECT_TRUE(mentions(fabricSummary(r), "inside each island 30.0 GB/s per GPU (islands 0-2 | 3)"))
      << fabricSummary(r);
  // Another island figure, another record (the ranks compare their records by hash).
  std::vector<FabricRow> other = rows;
  other[1].islandGBps = 29;
  EXPECT_NE(fabricHash(r),
            fabricHash(combineFabric(other, "measured at init (4 ranks)", "0-2 | 3")));
  // A rank with island peers that did not measure: none is known, nor the islands.
  other[1].islandGBps = -1;
  const FabricRecord missing = combineFabric(other, "measured at init (4 ranks)", "0-2 | 3");
  EXPECT_LT(missing.load.islandGBps, 0);
  EXPECT_EQ(missing.load.islands, "");
  EXPECT_DOUBLE_EQ(missing.load.allToAllGBps, 20);
  // Every rank alone in its island: nothing measured.
  for (FabricRow& row : other) row.islandGBps = 0;
  EXPECT_LT(combineFabric(other, "measured at init (4 ranks)", "0 | 1 | 2 | 3").load.islandGBps, 0);
  // No islands (the default rows): unmeasured, no islands named.
  const FabricRecord none = combineFabric(syntheticRows(), "measured at init (4 ranks)");
  EXPECT_LT(none.load.islandGBps, 0);
  EXPECT_FALSE(mentions(fabricSummary(none), "inside each island"));
  // The record keeps the islands through the tuning table, and refuses a bad one.
  const FabricRecord back = fabricFromJson(fabricToJson(r));
  EXPECT_DOUBLE_EQ(back.load.islandGBps, 30);
  EXPECT_EQ(back.load.islands, "0-2 | 3");
  nlohmann::json j = nlohmann::json::parse(fabricToJson(r));
  j["load"]["islands"] = 3;
  expectError([&] { fabricFromJson(j.dump()); }, anyrInvalidArgument, "fabric.load.islands",
              "accepted islands that are not a string");
  // Applied, the topology carries them (and its JSON round-trips them).
  FabricRecord applied = r;
  applied.applied = true;
  Topology t = bareFour();
  applyFabric(applied, &t);
  EXPECT_DOUBLE_EQ(t.load.islandGBps, 30);
  EXPECT_EQ(t.load.islands, "0-2 | 3");
  const Topology parsed = topologyFromJson(topologyToJson(t));
  EXPECT_EQ(parsed.load.islands, "0-2 | 3");
  EXPECT_DOUBLE_EQ(parsed.load.islandGBps, 30);
}

TEST(FabricCombine, TheHostMemoryFiguresAreTheWorstRanksAndTravelWithTheRecord) {
  std::vector<FabricRow> rows = syntheticRows();
  for (int s = 0; s < 4; ++s) {
    rows[static_cast<size_t>(s)].hostGBps = 50 - s;           // the last rank the least
    rows[static_cast<size_t>(s)].hostStepUs = 2.0 + 0.5 * s;  // the last rank the longest
  }
  const FabricRecord r = combineFabric(rows, "measured at init (4 ranks)");
  ASSERT_EQ(r.state, FabricRecord::State::Measured) << r.reason;
  EXPECT_DOUBLE_EQ(r.load.hostGBps, 47);
  EXPECT_DOUBLE_EQ(r.load.hostStepUs, 3.5);
  EXPECT_TRUE(mentions(fabricSummary(r),
                       "through host memory 47.0 GB/s per GPU and direction, a step 3.50 us"))
      << fabricSummary(r);
  // Through the tuning table and back; a record cached before they were measured lacks them
  // (read, unmeasured); a bad one is refused naming the field.
  const FabricRecord back = fabricFromJson(fabricToJson(r));
  EXPECT_DOUBLE_EQ(back.load.hostGBps, 47);
  EXPECT_DOUBLE_EQ(back.load.hostStepUs, 3.5);
  nlohmann::json older = nlohmann::json::parse(fabricToJson(r));
  older["load"].erase("hostGBps");
  older["load"].erase("hostStepUs");
  const FabricRecord old = fabricFromJson(older.dump());
  EXPECT_LT(old.load.hostGBps, 0);
  EXPECT_LT(old.load.hostStepUs, 0);
  nlohmann::json spoiled = nlohmann::json::parse(fabricToJson(r));
  spoiled["load"]["hostStepUs"] = 0;
  expectError([&] { fabricFromJson(spoiled.dump()); }, anyrInvalidArgument,
              "fabric.load.hostStepUs", "accepted a step of 0 us");
  // One rank that did not measure: neither is known.
  rows[2].hostGBps = -1;
  rows[1].hostStepUs = std::nan("");
  const FabricRecord partial = combineFabric(rows, "measured at init (4 ranks)");
  EXPECT_LT(partial.load.hostGBps, 0);
  EXPECT_LT(partial.load.hostStepUs, 0);
  // The host step failed on rank 1 (and rank 3 then waited for it in vain): the peer figures
  // stand, the host ones are unmeasured, and the reason names rank 1 and what failed.
  std::vector<FabricRow> hostFailed = syntheticRows();
  for (FabricRow& row : hostFailed) row.hostGBps = row.hostStepUs = 40;
  failFabricHost(&hostFailed[3], "measuring through host memory: timed out waiting for rank 1", 1);
  failFabricHost(&hostFailed[1], "measuring through host memory: cudaErrorInvalidValue");
  failFabricHost(&hostFailed[1], "a second failure is not recorded");
  const FabricRecord hf = combineFabric(hostFailed, "measured at init (4 ranks)");
  ASSERT_EQ(hf.state, FabricRecord::State::Measured) << hf.reason;
  EXPECT_DOUBLE_EQ(hf.load.allToAllGBps, 20);
  EXPECT_DOUBLE_EQ(hf.at(hf.writeGBps, 0, 1), 40.1);
  EXPECT_LT(hf.load.hostGBps, 0);
  EXPECT_LT(hf.load.hostStepUs, 0);
  EXPECT_EQ(hf.reason,
            "through host memory not measured: rank 1: measuring through host memory: "
            "cudaErrorInvalidValue");
  // Only the host memory measured (no peer workspace): a record with a load and no pairs.
  std::vector<FabricRow> hostOnly;
  for (int s = 0; s < 4; ++s) {
    FabricRow row = emptyFabricRow();
    row.hostGBps = 40;
    row.hostStepUs = 3;
    hostOnly.push_back(row);
  }
  FabricRecord h = combineFabric(hostOnly, "measured at init (4 ranks)");
  ASSERT_EQ(h.state, FabricRecord::State::Measured);
  ASSERT_TRUE(h.load.known());
  EXPECT_LT(h.load.allToAllGBps, 0);
  EXPECT_LT(h.at(h.writeGBps, 0, 1), 0);
  // Applied: the topology carries them, its JSON round-trips them, and the model uses them in
  // place of the nominal link and step, at this world size only.
  h.applied = true;
  Topology t = bareFour();
  const CostInputs nominal = costInputs(t, Config(), 4);
  applyFabric(h, &t);
  EXPECT_DOUBLE_EQ(t.load.hostGBps, 40);
  const Topology parsed = topologyFromJson(topologyToJson(t));
  EXPECT_DOUBLE_EQ(parsed.load.hostGBps, 40);
  EXPECT_DOUBLE_EQ(parsed.load.hostStepUs, 3);
  const CostInputs in = costInputs(t, Config(), 4);
  EXPECT_DOUBLE_EQ(in.hostGBps, 40);
  EXPECT_DOUBLE_EQ(in.hostLatencyUs, 3);
  EXPECT_NE(nominal.hostGBps, 40);
  EXPECT_TRUE(mentions(in.summary, "host memory 40 GB/s per direction (measured")) << in.summary;
  EXPECT_TRUE(mentions(in.summary, "3 us per step (measured)")) << in.summary;
  EXPECT_FALSE(mentions(nominal.summary, "(measured")) << nominal.summary;
  const CostInputs three = costInputs(firstGpus(t, 3), Config(), 3);
  EXPECT_NE(three.hostGBps, 40);
}

// The copy engines pulling from the ring neighbour (ring-copy's pattern): the least of the ranks,
// in the summary, the record's JSON (absent from a record cached before it was measured) and the
// topology's; applied, the model charges ring-copy at it, at this world size only.
TEST(FabricCombine, TheRingPullFigureIsTheLeastRankAndChargesRingCopy) {
  std::vector<FabricRow> rows = syntheticRows();
  for (int s = 0; s < 4; ++s) rows[static_cast<size_t>(s)].ringCopyGBps = 30 - s;
  FabricRecord r = combineFabric(rows, "measured at init (4 ranks)");
  ASSERT_EQ(r.state, FabricRecord::State::Measured) << r.reason;
  EXPECT_DOUBLE_EQ(r.load.ringCopyGBps, 27);
  EXPECT_TRUE(mentions(fabricSummary(r),
                       "the copy engines pulling from the ring neighbour 27.0 GB/s per GPU"))
      << fabricSummary(r);
  std::vector<FabricRow> other = rows;
  other[1].ringCopyGBps = 26;
  EXPECT_NE(fabricHash(r), fabricHash(combineFabric(other, "measured at init (4 ranks)")));
  EXPECT_DOUBLE_EQ(fabricFromJson(fabricToJson(r)).load.ringCopyGBps, 27);
  nlohmann::json older = nlohmann::json::parse(fabricToJson(r));
  older["load"].erase("ringCopyGBps");
  EXPECT_LT(fabricFromJson(older.dump()).load.ringCopyGBps, 0);
  nlohmann::json spoiled = nlohmann::json::parse(fabricToJson(r));
  spoiled["load"]["ringCopyGBps"] = "fast";
  expectError([&] { fabricFromJson(spoiled.dump()); }, anyrInvalidArgument,
              "fabric.load.ringCopyGBps", "accepted a string");
  // One rank without the figure: not known.
  other[2].ringCopyGBps = -1;
  EXPECT_LT(combineFabric(other, "measured at init (4 ranks)").load.ringCopyGBps, 0);

  r.applied = true;
  Topology t = bareFour();
  const CostInputs before = costInputs(t, Config(), 4);
  applyFabric(r, &t);
  EXPECT_DOUBLE_EQ(topologyFromJson(topologyToJson(t)).load.ringCopyGBps, 27);
  const CostInputs in = costInputs(t, Config(), 4);
  EXPECT_DOUBLE_EQ(in.ringCopyGBps, 27);
  EXPECT_LE(before.ringCopyGBps, 0);
  EXPECT_TRUE(mentions(in.summary, "the copy engines pulling from the ring neighbour 27 GB/s"))
      << in.summary;
  // 256 MiB at 8 ranks' worth of bytes: 3 B per GPU at the measured rate, plus the fill.
  const double B = 256.0 * 1024 * 1024;
  EXPECT_GT(ringCopyUs(B, in), 3.0 * B / (27 * 1e3));
  EXPECT_LT(ringCopyUs(B, in), 1.1 * 3.0 * B / (27 * 1e3));
  CostInputs faster = in;
  faster.ringCopyGBps = 54;
  EXPECT_LT(ringCopyUs(B, faster), 0.55 * ringCopyUs(B, in));
  EXPECT_LE(costInputs(firstGpus(t, 3), Config(), 3).ringCopyGBps, 0);
}

TEST(FabricCombine, AFailureAnywhereLeavesEveryRankUnmeasuredNamingTheRank) {
  // Rank 2 failed on its own; ranks 0 and 3 then timed out waiting for it.
  std::vector<FabricRow> rows = syntheticRows();
  failFabricRow(&rows[0], "measuring under load: timed out after 2000 ms waiting for rank 2", 2);
  failFabricRow(&rows[2], "measuring under load: failed by ANYR_FAULT_INJECT=fabric-fail:2");
  failFabricRow(&rows[2], "a later failure is not recorded");
  failFabricRow(&rows[3], "measuring under load: rank 0 gave up", 0);
  EXPECT_EQ(rows[0].status, FabricRow::kWaitFailed);
  EXPECT_EQ(rows[0].peer, 2);
  EXPECT_EQ(rows[2].status, FabricRow::kFailed);
  EXPECT_EQ(rows[2].peer, -1);
  const FabricRecord r = combineFabric(rows, "measured at init (4 ranks)");
  EXPECT_EQ(r.state, FabricRecord::State::NotMeasured);
  EXPECT_FALSE(r.hasFigures());
  EXPECT_FALSE(r.load.known());
  EXPECT_EQ(r.reason,
            "not measured: rank 2: measuring under load: failed by "
            "ANYR_FAULT_INJECT=fabric-fail:2 (rank 0: measuring under load: timed out after "
            "2000 ms waiting for rank 2)");
  EXPECT_TRUE(mentions(fabricSummary(r), "nominal link figures and the seed decide"));
  // Only waits that ran out: the first rank whose wait failed is named.
  std::vector<FabricRow> waits = syntheticRows();
  failFabricRow(&waits[1], "timed out waiting for rank 3", 3);
  failFabricRow(&waits[3], "timed out waiting for rank 1", 1);
  EXPECT_EQ(combineFabric(waits, "x").reason, "not measured: rank 1: timed out waiting for rank 3");
  // A why longer than the row holds is cut, NUL-terminated.
  FabricRow longWhy = emptyFabricRow();
  failFabricRow(&longWhy, std::string(1000, 'x'));
  EXPECT_EQ(strnlen(longWhy.why, sizeof(longWhy.why)), sizeof(longWhy.why) - 1);
  // Fewer than two rows or more than the peer workspace's ranks: nothing to combine.
  EXPECT_EQ(combineFabric({emptyFabricRow()}, "x").state, FabricRecord::State::NotMeasured);
  EXPECT_EQ(combineFabric(std::vector<FabricRow>(9, emptyFabricRow()), "x").state,
            FabricRecord::State::NotMeasured);
}

// ---- applying the record ----------------------------------------------------------------------

TEST(FabricApply, AnAppliedRecordFillsThePairsAndTheLoadAndOnlyThen) {
  FabricRecord r = combineFabric(syntheticRows(), "measured at init (4 ranks)");
  Topology t = bareFour();
  const Topology before = t;
  applyFabric(r, &t);  // not applied (ranks sharing a GPU): nothing changes
  EXPECT_EQ(topologyToJson(t), topologyToJson(before));
  r.applied = true;
  applyFabric(r, &t);
  EXPECT_DOUBLE_EQ(t.pair(1, 3).writeGBps, 41.3);
  EXPECT_DOUBLE_EQ(t.pair(1, 3).readGBps, 51.3);
  EXPECT_DOUBLE_EQ(t.pair(1, 3).latencyUs, 0.513);
  EXPECT_EQ(t.load.ranks, 4);
  EXPECT_DOUBLE_EQ(t.load.syncUs, 6);
  EXPECT_EQ(t.load.source, "measured at init (4 ranks)");
  // A record of another world size does not fit this topology.
  Topology two = firstGpus(bareFour(), 2);
  applyFabric(r, &two);
  EXPECT_LT(two.pair(0, 1).writeGBps, 0);
  // A cached record says where it was cached.
  r.state = FabricRecord::State::Cached;
  r.cachedIn = "/tmp/tuning.json";
  applyFabric(r, &t);
  EXPECT_EQ(t.load.source, "measured at init (4 ranks), cached in /tmp/tuning.json");
  clearFabricFigures(&t);
  EXPECT_FALSE(t.load.known());
  EXPECT_LT(t.pair(1, 3).writeGBps, 0);
  EXPECT_LT(t.pair(1, 3).latencyUs, 0);
}

TEST(FabricApply, SummarySaysWhatWasMeasuredWhereFromAndWhetherItIsUsed) {
  FabricRecord r = combineFabric(syntheticRows(), "measured at init (4 ranks)");
  r.applied = true;
  std::string s = fabricSummary(r);
  EXPECT_TRUE(mentions(s, "measured at init (4 ranks) in 15.5 ms")) << s;
  EXPECT_TRUE(mentions(s, "pairs write 40.1-43.2 GB/s, read 50.1-53.2 GB/s")) << s;
  EXPECT_TRUE(mentions(s, "all-to-all 20.0 GB/s per GPU, ring 42.0 GB/s")) << s;
  EXPECT_TRUE(mentions(s, "synchronisation round 6.00 us, one-partner round 1.50 us")) << s;
  EXPECT_TRUE(mentions(s, "used by admission and the seed")) << s;
  r.applied = false;
  r.reason = "not applied: ranks share a GPU";
  s = fabricSummary(r);
  EXPECT_FALSE(mentions(s, "used by admission")) << s;
  EXPECT_TRUE(mentions(s, "not applied: ranks share a GPU")) << s;
  r.state = FabricRecord::State::Cached;
  r.cachedIn = "t.json";
  EXPECT_TRUE(mentions(fabricSummary(r),
                       "cached in t.json (measured at init (4 ranks), 15.5 ms "
                       "then; not measured at init)"));
  FabricRecord off;
  off.state = FabricRecord::State::Off;
  EXPECT_EQ(fabricSummary(off), "off (ANYR_FABRIC=off): nominal link figures and the seed decide");
}

// ---- JSON and the cache -------------------------------------------------------------------------

TEST(FabricCache, JsonRoundTripsAndRefusesBadRecordsNamingTheField) {
  const FabricRecord r = combineFabric(syntheticRows(), "measured at init (4 ranks)");
  const FabricRecord back = fabricFromJson(fabricToJson(r));
  EXPECT_EQ(back.state, FabricRecord::State::Cached);
  EXPECT_EQ(back.ranks, 4);
  EXPECT_EQ(back.source, r.source);
  EXPECT_EQ(back.writeGBps, r.writeGBps);
  EXPECT_EQ(back.readGBps, r.readGBps);
  EXPECT_EQ(back.latencyUs, r.latencyUs);
  EXPECT_EQ(back.load.syncUs, r.load.syncUs);
  EXPECT_EQ(back.load.hopUs, r.load.hopUs);
  EXPECT_EQ(back.load.allToAllGBps, r.load.allToAllGBps);
  EXPECT_EQ(back.load.source, r.load.source);
  EXPECT_DOUBLE_EQ(back.measureMs, r.measureMs);
  const nlohmann::json good = nlohmann::json::parse(fabricToJson(r));
  auto refused = [&](const std::function<void(nlohmann::json&)>& spoil, const std::string& part) {
    nlohmann::json j = good;
    spoil(j);
    expectError([&] { fabricFromJson(j.dump()); }, anyrInvalidArgument, part,
                "accepted a spoiled record (" + part + ")");
  };
  refused([](nlohmann::json& j) { j["ranks"] = 9; }, "fabric.ranks");
  refused([](nlohmann::json& j) { j.erase("writeGBps"); }, "fabric.writeGBps: missing");
  refused([](nlohmann::json& j) { j["readGBps"][0].erase(0); }, "fabric.readGBps");
  refused([](nlohmann::json& j) { j["latencyUs"][1][1] = 0.5; }, "fabric.latencyUs[1][1]");
  refused([](nlohmann::json& j) { j["writeGBps"][0][1] = -2; }, "fabric.writeGBps[0][1]");
  refused([](nlohmann::json& j) { j["writeGBps"][0][1] = "fast"; }, "fabric.writeGBps[0][1]");
  refused([](nlohmann::json& j) { j["load"]["ranks"] = 8; }, "fabric.load.ranks");
  refused([](nlohmann::json& j) { j["load"]["syncUs"] = -0.5; }, "fabric.load.syncUs");
  refused([](nlohmann::json& j) { j["load"]["hopUs"] = "1us"; }, "fabric.load.hopUs");
  refused([](nlohmann::json& j) { j["measureMs"] = -1; }, "fabric.measureMs");
  refused([](nlohmann::json& j) { j["speed"] = 1; }, "fabric.speed: unknown field");
  expectError([] { fabricFromJson("[1, 2"); }, anyrInvalidArgument, "fabric record", "not JSON");
  // A record cached before the one-partner round was measured lacks it: read, that figure
  // unmeasured (the model's NCCL hop stands in for it).
  nlohmann::json older = good;
  older["load"].erase("hopUs");
  const FabricRecord old = fabricFromJson(older.dump());
  EXPECT_LT(old.load.hopUs, 0);
  EXPECT_EQ(old.load.syncUs, r.load.syncUs);
}

TEST(FabricCache, TheTuningTableCarriesTheRecordForTheSameMachineAndWorld) {
  const Topology t = bareFour();
  TuningTable table;
  table.fingerprint = fingerprintOf(t, 4, {"maxBlocks 132 peer 264"});
  table.method = "test";
  table.hasFabric = true;
  table.fabric = combineFabric(syntheticRows(), "measured by anyrCommTune (4 ranks)");
  const std::string path = tempPath("cache");
  saveTuningFile(table, path);
  // Loaded for the same machine and world, whatever the tuning settings now.
  FabricRecord got;
  std::string why;
  bool present = false;
  ASSERT_TRUE(
      loadFabricFor(path, fingerprintOf(t, 4, {"maxBlocks 64 peer 128"}), &got, &why, &present))
      << why;
  EXPECT_TRUE(present);
  EXPECT_EQ(got.state, FabricRecord::State::Cached);
  EXPECT_EQ(got.cachedIn, path);
  EXPECT_EQ(got.writeGBps, table.fabric.writeGBps);
  EXPECT_EQ(got.load.syncUs, table.fabric.load.syncUs);
  // The tuning table itself still loads, with the record.
  TuningTable whole;
  ASSERT_TRUE(loadTuningFor(path, table.fingerprint, &whole, &why)) << why;
  EXPECT_TRUE(whole.hasFabric);
  // Another machine or world: stale, with the first difference.
  Topology otherDriver = t;
  otherDriver.driverVersion = "999.1";
  EXPECT_FALSE(loadFabricFor(path, fingerprintOf(otherDriver, 4), &got, &why, &present));
  EXPECT_TRUE(present);
  EXPECT_TRUE(mentions(why, "stale")) << why;
  EXPECT_TRUE(mentions(why, "driver")) << why;
  EXPECT_FALSE(loadFabricFor(path, fingerprintOf(firstGpus(t, 2), 2), &got, &why));
  EXPECT_TRUE(mentions(why, "world size")) << why;
  // A table without a record: none, and said so; the file has no "fabric" at all.
  TuningTable plain = table;
  plain.hasFabric = false;
  saveTuningFile(plain, path);
  EXPECT_FALSE(loadFabricFor(path, fingerprintOf(t, 4), &got, &why, &present));
  EXPECT_FALSE(present);
  EXPECT_TRUE(mentions(why, "holds no fabric record")) << why;
  EXPECT_FALSE(mentions(tuningToJson(plain), "\"fabric\""));
  // A spoiled record spoils the table, naming the field.
  std::string text = tuningToJson(table);
  const size_t at = text.find("\"measureMs\"");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 11, "\"measuredMs\"");
  {
    std::ofstream f(path);
    f << text;
  }
  EXPECT_FALSE(loadFabricFor(path, fingerprintOf(t, 4), &got, &why));
  EXPECT_TRUE(mentions(why, "fabric")) << why;
  EXPECT_FALSE(loadFabricFor("/nonexistent/tuning.json", fingerprintOf(t, 4), &got, &why));
  EXPECT_TRUE(mentions(why, "cannot read")) << why;
  std::remove(path.c_str());
}

// ---- measured figures drive the choices as a fixture's do --------------------------------------

void expectSameSeed(const Topology& a, const Topology& b, int n, const std::string& what) {
  const Config cfg;
  const CommFacts fa = testfix::facts(a, true, true, "");
  const CommFacts fb = testfix::facts(b, true, true, "");
  const Admission admA = admit(a, fa), admB = admit(b, fb);
  const Thresholds ta = defaultThresholds(a, admA, cfg, n);
  const Thresholds tb = defaultThresholds(b, admB, cfg, n);
  EXPECT_EQ(ta.oneShot, tb.oneShot) << what;
  EXPECT_EQ(ta.oneShotWhy, tb.oneShotWhy) << what;
  EXPECT_EQ(ta.twoShot, tb.twoShot) << what;
  const CostInputs ia = costInputs(a, cfg, n), ib = costInputs(b, cfg, n);
  EXPECT_EQ(ia.latencyUs, ib.latencyUs) << what;
  EXPECT_EQ(ia.syncUs, ib.syncUs) << what;
  EXPECT_EQ(ia.ringHopUs, ib.ringHopUs) << what;
  EXPECT_EQ(ia.hopUs, ib.hopUs) << what;
  EXPECT_EQ(ia.hopMeasured, ib.hopMeasured) << what;
  EXPECT_EQ(ia.allToAllGBps, ib.allToAllGBps) << what;
  EXPECT_EQ(ia.loadMeasured, ib.loadMeasured) << what;
  EXPECT_EQ(ia.writeGBps, ib.writeGBps) << what;
  EXPECT_EQ(ia.readGBps, ib.readGBps) << what;
  EXPECT_EQ(ia.ringGBps, ib.ringGBps) << what;
  EXPECT_EQ(ia.crossWriteGBps, ib.crossWriteGBps) << what;
  const DispatchTable sa = seedTable(a, admA, cfg, n), sb = seedTable(b, admB, cfg, n);
  for (int o = 0; o < kNumOps; ++o) {
    for (int k = 0; k < kNumBuckets; ++k) {
      const Op op = static_cast<Op>(o);
      EXPECT_EQ(pathName(op, sa.path[static_cast<size_t>(o)][static_cast<size_t>(k)]),
                pathName(op, sb.path[static_cast<size_t>(o)][static_cast<size_t>(k)]))
          << what << ": " << opName(op) << " bucket " << k;
    }
  }
}

TEST(FabricDrivesChoices, MeasuredRowsSeedExactlyAsTheFixtureWithTheSameFigures) {
  // The seeds' machine as published (8 x RTX PRO 6000, two switches), and the same machine with
  // nothing measured, then the rows its ranks would gather applied: the same thresholds, cost
  // model inputs and seed table at every size.
  const Topology published = fixture("rtxpro6000_8gpu_switches");
  Topology live = published;
  clearFabricFigures(&live);
  FabricRecord r = combineFabric(rowsOf(published), "measured at init (8 ranks)");
  ASSERT_EQ(r.state, FabricRecord::State::Measured) << r.reason;
  r.applied = true;
  applyFabric(r, &live);
  expectSameSeed(published, live, 8, "rtxpro6000_8gpu_switches");
  const CostInputs in = costInputs(live, Config(), 8);
  EXPECT_TRUE(in.loadMeasured);
  EXPECT_TRUE(mentions(in.summary, "(measured at init (8 ranks))")) << in.summary;
}

TEST(FabricDrivesChoices, SlowMeasuredWritesPullAsAFixtureWithSlowWritesDoes) {
  // Rank 1's measured writes at a twentieth of its reads (as on the b12x#139 platform): the
  // threshold ladder pulls and the seed's explanation names the pair, exactly as for a fixture
  // that records the same figures.
  const Topology published = fixture("rtxpro6000_8gpu_switches");
  Topology slowFixture = published;
  for (int d = 0; d < 8; ++d) {
    if (d != 1) slowFixture.pair(1, d).writeGBps /= 20;
  }
  std::vector<FabricRow> rows = rowsOf(published);
  for (int d = 0; d < 8; ++d) {
    if (d != 1) rows[1].writeGBps[d] /= 20;
  }
  Topology live = published;
  clearFabricFigures(&live);
  FabricRecord r = combineFabric(rows, "measured at init (8 ranks)");
  r.applied = true;
  applyFabric(r, &live);
  expectSameSeed(slowFixture, live, 8, "slow writes");
  const Admission adm = admit(live, testfix::facts(live, true, true, ""));
  const Thresholds th = defaultThresholds(live, adm, Config(), 8);
  EXPECT_EQ(th.oneShot, anyrAlgoOneShotPull);
  EXPECT_EQ(th.twoShot, anyrAlgoTwoShot);
  EXPECT_TRUE(mentions(th.oneShotWhy, "rank 1 -> rank 0")) << th.oneShotWhy;
  const CostInputs in = costInputs(live, Config(), 8);
  EXPECT_TRUE(mentions(in.summary, "writes 20x slower than reads on GPU1->GPU0 (pull)"))
      << in.summary;
  // Not applied (ranks sharing a GPU): the seed is the one of nothing measured.
  Topology shared = published;
  clearFabricFigures(&shared);
  Topology bare = shared;
  r.applied = false;
  applyFabric(r, &shared);
  expectSameSeed(bare, shared, 8, "not applied");
}

TEST(FabricDrivesChoices, MeasuredBandwidthReplacesTheNominalOfAnIdleLink) {
  // An idle workstation GPU reports Gen1: without measurements the pairs' nominal figure comes
  // from the link's maximum (Gen5 x16); measured figures replace it.
  Topology t = bareFour();
  for (GpuInfo& g : t.gpus) g.pcieGen = 1;
  const CostInputs nominal = costInputs(t, Config(), 4);
  EXPECT_NEAR(nominal.writeGBps, 3.94 * 16 * 0.8, 0.01);
  std::vector<FabricRow> rows = syntheticRows();
  FabricRecord r = combineFabric(rows, "measured at init (4 ranks)");
  r.applied = true;
  applyFabric(r, &t);
  const CostInputs measured = costInputs(t, Config(), 4);
  EXPECT_DOUBLE_EQ(measured.writeGBps, 40.1);  // the slowest pair measured
  EXPECT_DOUBLE_EQ(measured.readGBps, 50.1);
  EXPECT_DOUBLE_EQ(measured.syncUs, 6);
  EXPECT_DOUBLE_EQ(measured.allToAllGBps, 20);
  // The host path is not measured: still the link's maximum.
  EXPECT_NEAR(measured.hostGBps, nominal.hostGBps, 1e-9);
}

TEST(FabricDrivesChoices, ExplainOfATopologyFileAppliesTheRecordCachedInTheTuningFile) {
  const std::string fixturePath = std::string(ANYR_FIXTURE_DIR) + "/rtxpro6000_8gpu_switches.json";
  const Topology published = loadTopologyFile(fixturePath);
  std::vector<FabricRow> rows = rowsOf(published);
  for (int d = 0; d < 8; ++d) {
    if (d != 1) rows[1].writeGBps[d] /= 20;
  }
  TuningTable table;
  table.fingerprint = fingerprintOf(published, 8, {"maxBlocks 188 peer 376"});
  table.method = "test";
  table.hasFabric = true;
  table.fabric = combineFabric(rows, "measured by anyrCommTune (8 ranks)");
  const std::string path = tempPath("explain");
  saveTuningFile(table, path);
  TopologyExplainOptions o;
  o.path = fixturePath;
  o.tuningFile = path;
  nlohmann::json j = nlohmann::json::parse(explainTopologyJson(o, nullptr));
  std::string text = j["dispatchText"];
  EXPECT_TRUE(mentions(text, "fabric: cached in " + path + " (measured by anyrCommTune (8 ranks)"))
      << text;
  EXPECT_TRUE(mentions(text, "writes 20x slower than reads on GPU1->GPU0 (pull)")) << text;
  // Of 4 ranks: stale for that world, named; the fixture's own figures decide.
  o.nranks = 4;
  j = nlohmann::json::parse(explainTopologyJson(o, nullptr));
  text = j["dispatchText"];
  EXPECT_TRUE(mentions(text, "fabric: the cached record was not used")) << text;
  EXPECT_FALSE(mentions(text, "(pull)")) << text;
  // ANYR_FABRIC=off: no record.
  {
    EnvGuard g("ANYR_FABRIC", "off");
    o.nranks = 0;
    j = nlohmann::json::parse(explainTopologyJson(o, nullptr));
    text = j["dispatchText"];
    EXPECT_FALSE(mentions(text, "fabric:")) << text;
  }
  std::remove(path.c_str());
}

}  // namespace
}  // namespace anyr
