// anyreduce doctor's verdict and HTML report, from the recorded fixtures
// tests/fixtures/doctor_run.json and doctor_watch.json (hand-made numbers, not measurements).
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "doctor/doctor.h"

using nlohmann::json;
using namespace anyr::doctor;

namespace {

json loadFixture(const char* name) {
  std::ifstream f(std::string(ANYR_FIXTURE_DIR) + "/" + name);
  EXPECT_TRUE(f.good()) << name;
  return json::parse(f);
}

size_t count(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + 1)) ++n;
  return n;
}

// Well-formedness: every element closed in order (void elements and "/>" excepted), attribute
// quotes balanced, scripts only inline (their text is skipped), no external resources. Returns
// "" or what is wrong.
std::string checkWellFormed(const std::string& html) {
  static const std::set<std::string> kVoid = {"meta", "br", "hr", "img", "link", "input"};
  std::vector<std::string> stack;
  size_t i = 0;
  if (html.rfind("<!DOCTYPE html>", 0) != 0) return "does not start with <!DOCTYPE html>";
  i = html.find('>') + 1;
  while ((i = html.find('<', i)) != std::string::npos) {
    size_t end = i + 1;
    bool inQuote = false;
    while (end < html.size() && (inQuote || html[end] != '>')) {
      if (html[end] == '"') inQuote = !inQuote;
      if (html[end] == '<' && !inQuote) return "'<' inside a tag at " + std::to_string(end);
      ++end;
    }
    if (end >= html.size()) return "unterminated tag at " + std::to_string(i);
    std::string tag = html.substr(i + 1, end - i - 1);
    i = end + 1;
    if (tag.empty()) return "empty tag";
    const bool closing = tag[0] == '/';
    const bool selfClosing = tag.back() == '/';
    std::string name = tag.substr(closing ? 1 : 0);
    name = name.substr(0, name.find_first_of(" /\t\n"));
    if (closing) {
      if (stack.empty() || stack.back() != name) {
        return "</" + name + "> closes " + (stack.empty() ? "nothing" : "<" + stack.back() + ">");
      }
      stack.pop_back();
    } else if (name == "script") {
      if (tag.find(" src") != std::string::npos) return "loads a script";
      const size_t close = html.find("</script>", i);
      if (close == std::string::npos) return "<script> never closed";
      i = close + 9;
    } else if (!selfClosing && !kVoid.count(name)) {
      stack.push_back(name);
    }
  }
  if (!stack.empty()) return "<" + stack.back() + "> never closed";
  if (html.find(" src=") != std::string::npos || html.find(" href=") != std::string::npos) {
    return "references an external resource";
  }
  return "";
}

}  // namespace

TEST(DoctorReport, VerdictFromRunFixtureStatesTheNumbers) {
  const json m = loadFixture("doctor_run.json");
  const std::string v = verdictText(m);
  // Batch 1: baseline 5200 us, compute 4000 us, anyreduce 4000 + 0.3 * 1500... see fixture:
  // anyreduce step = 4000 + 0.3 * 900 = 4270 us.
  EXPECT_NE(v.find("Batch 1 (all-reduce message 12 KiB)"), std::string::npos) << v;
  EXPECT_NE(v.find("23.1 % of the baseline decode step (1200 of 5200 us)"), std::string::npos) << v;
  EXPECT_NE(v.find("anyreduce saves 11.9 us per layer"), std::string::npos) << v;  // 930/78
  EXPECT_NE(v.find("step 5200 -> 4270 us, 1.22x faster (if communication cost nothing: 1.30x"),
            std::string::npos)
      << v;
  EXPECT_NE(v.find("Power, baseline: 250 W mean (peak 290 W of a 700 W limit)"), std::string::npos)
      << v;
  EXPECT_NE(v.find("Power, anyreduce: 330 W mean"), std::string::npos) << v;
  EXPECT_NE(v.find("oneshot-push (fused kernel)"), std::string::npos) << v;
  EXPECT_NE(v.find("oneshot-push 651 calls"), std::string::npos) << v;
  EXPECT_NE(v.find("composed (fallback) 22"), std::string::npos) << v;
  // 250 W of 700 W at 100 % utilization: the starvation signature, for every batch.
  EXPECT_EQ(count(v, "starvation signature"), 3u) << v;
  // 1.22x, 1.18x, 1.12x: the 1.3x target is not met, and the verdict says so.
  EXPECT_NE(v.find("Not met: 1.22x at batch 1, 1.18x at batch 8 and 1.12x at batch 32."),
            std::string::npos)
      << v;
}

TEST(DoctorReport, VerdictStartsWithTheHeadlineThenWhatToDo) {
  const json m = loadFixture("doctor_run.json");
  const std::string v = verdictText(m);
  // Batch 1 has the largest share: 1200 of 5200 us; saved 930 us / 78 layers, 930 / 5200.
  EXPECT_EQ(v.rfind("Communication is 23% of a decode step at batch 1; anyreduce's fused path "
                    "saves 12 us per layer, 18% of the step.\n",
                    0),
            0u)
      << v;
  const size_t todo = v.find("What to do:"), figures = v.find("Batch 1 (all-reduce message");
  ASSERT_NE(todo, std::string::npos) << v;
  EXPECT_LT(todo, figures) << v;
}

TEST(DoctorReport, SummaryDerivesTheActionsFromTheRun) {
  const json m = loadFixture("doctor_run.json");
  const Summary s = summarize(m);
  ASSERT_EQ(s.actions.size(), 3u);
  // 1: the fused path saves time at every batch.
  EXPECT_NE(s.actions[0].what.find("fused"), std::string::npos);
  EXPECT_NE(s.actions[0].why.find("from 23% to 6.3% of the step and saves 930 us per decode "
                                  "step (18%)"),
            std::string::npos)
      << s.actions[0].why;
  // 2: 22 of 673 fused calls were composed (counters), at 128 and 256 tokens (the sweep), and
  // no tuning table was in use: measure.
  EXPECT_NE(s.actions[1].why.find("22 of 673 fused calls (3.3%)"), std::string::npos)
      << s.actions[1].why;
  EXPECT_NE(s.actions[1].why.find("128 and 256 tokens, from 1.5 MiB"), std::string::npos)
      << s.actions[1].why;
  ASSERT_EQ(s.actions[1].commands.size(), 3u);
  EXPECT_EQ(s.actions[1].commands[0].rfind("anyreduce tune -o tuning.json", 0), 0u);
  EXPECT_EQ(s.actions[1].commands[1].rfind("export ANYR_TUNING_FILE=$PWD/tuning.json", 0), 0u);
  EXPECT_EQ(s.actions[1].commands[2].rfind("anyreduce doctor --preset glm --batch 1,8,32", 0), 0u);
  // 3: step / compute is 1.30x, 1.24x, 1.17x: out of reach at 8 and 32 on a 2-way split.
  EXPECT_EQ(s.actions[2].commands,
            std::vector<std::string>{"anyreduce doctor --preset glm --batch 1,8,32 --shard-as 8"});
  EXPECT_NE(s.target.find("Target: a decode step at least 1.3x faster than the baseline"),
            std::string::npos)
      << s.target;
  EXPECT_NE(s.target.find("23% less time per generated token"), std::string::npos) << s.target;
  EXPECT_NE(s.target.find("Out of reach at batch 8 and 32, where even communication that took "
                          "no time would give at most 1.24x and 1.17x; within reach at batch 1 "
                          "(up to 1.30x)."),
            std::string::npos)
      << s.target;
  // The starved baseline (250 W of 700 W at 100 % utilization) is a finding.
  bool starved = false;
  for (const std::string& f : s.findings) {
    starved = starved || f.find(
                             "The baseline looks starved: NVML counts its GPUs 100% busy "
                             "while they draw 250 W, 36% of the 700 W limit (batch 1, 8 and "
                             "32); with the fused path, 330 W.") != std::string::npos;
  }
  EXPECT_TRUE(starved);
}

TEST(DoctorReport, WithATuningTableTheAdviceIsToCheckTheDispatch) {
  json m = loadFixture("doctor_run.json");
  m["settings"] = {{"ANYR_TUNING_FILE", "/home/someone/runs/tuned-h200.json"}};
  const Summary s = summarize(m);
  ASSERT_EQ(s.actions.size(), 3u);
  EXPECT_EQ(s.actions[1].what, "Check what anyreduce dispatches at those sizes");
  EXPECT_NE(s.actions[1].why.find("The tuning table tuned-h200.json was in use."),
            std::string::npos)
      << s.actions[1].why;
  EXPECT_EQ(s.actions[1].commands[0].rfind("anyreduce bench --check-dispatch", 0), 0u);
  const std::string h = renderHtml(m);
  EXPECT_EQ(h.find("/home/someone"), std::string::npos);
  EXPECT_NE(h.find("ANYR_TUNING_FILE=tuned-h200.json"), std::string::npos);
}

TEST(DoctorReport, WhenTheFusedPathIsSlowerTheVerdictSaysSo) {
  json m = loadFixture("doctor_run.json");
  for (json& b : m["batches"]) {
    b["modes"]["anyreduce"]["stepUs"] = b["modes"]["baseline"]["stepUs"].get<double>() + 78 * 2.0;
  }
  const Summary s = summarize(m);
  EXPECT_EQ(s.headline,
            "Communication is 23% of a decode step at batch 1; anyreduce's fused path is 2.0 us "
            "per layer slower than NCCL and the separate kernel, 3.0% of the step.");
  ASSERT_GE(s.actions.size(), 2u);
  EXPECT_EQ(s.actions[0].what, "Keep NCCL and the separate add + RMSNorm kernel for now");
  EXPECT_NE(s.actions[1].why.find("At batch 1, 8 and 32 the whole step is slower"),
            std::string::npos)
      << s.actions[1].why;
}

TEST(DoctorReport, NothingComposedAndTargetMetLeavesOneAction) {
  json m = loadFixture("doctor_run.json");
  for (json& b : m["batches"]) {
    b["modes"]["anyreduce"]["stepUs"] = b["modes"]["baseline"]["stepUs"].get<double>() / 1.5;
  }
  m["counters"]["fusedComposedCalls"] = 0;
  for (json& p : m["arSweep"]) p["path"] = "oneshot-push (fused kernel)";
  const Summary s = summarize(m);
  ASSERT_EQ(s.actions.size(), 1u);
  EXPECT_NE(s.target.find("Met: 1.50x at batch 1"), std::string::npos) << s.target;
}

TEST(DoctorReport, PathsLoseTheirFolders) {
  EXPECT_EQ(withoutLocalPaths("anyreduce doctor --json /root/out/d.json --html=/root/out/d.html"),
            "anyreduce doctor --json d.json --html=d.html");
  EXPECT_EQ(withoutLocalPaths("--report ../runs/x.json ~/y.json ./z.html out/w.json"),
            "--report x.json y.json z.html w.json");
  EXPECT_EQ(withoutLocalPaths("'/tmp/a b.json'"), "'a b.json'");
  EXPECT_EQ(withoutLocalPaths("ANYR_TUNING_FILE=/srv/t/tuned.json"), "ANYR_TUNING_FILE=tuned.json");
  EXPECT_EQ(withoutLocalPaths("/srv/dir/"), "dir");
  // Prose and URLs stay.
  EXPECT_EQ(withoutLocalPaths("mean / peak, step / compute, https://example.org/a.json"),
            "mean / peak, step / compute, https://example.org/a.json");
}

TEST(DoctorReport, VerdictSaysMetWhenEveryBatchIsFastEnough) {
  json m = loadFixture("doctor_run.json");
  for (json& b : m["batches"]) {
    b["modes"]["anyreduce"]["stepUs"] = b["modes"]["baseline"]["stepUs"].get<double>() / 1.5;
  }
  const std::string v = verdictText(m);
  EXPECT_NE(v.find("1.50x faster"), std::string::npos) << v;
  EXPECT_NE(v.find("Met: 1.50x at batch 1, 1.50x at batch 8 and 1.50x at batch 32."),
            std::string::npos)
      << v;
}

TEST(DoctorReport, WatchVerdictFlagsOnlyTheStarvedGpu) {
  const json m = loadFixture("doctor_watch.json");
  const std::string v = verdictText(m);
  const size_t g0 = v.find("GPU 0"), g1 = v.find("GPU 1");
  ASSERT_NE(g0, std::string::npos) << v;
  ASSERT_NE(g1, std::string::npos) << v;
  EXPECT_EQ(v.rfind("GPU 0 of 2 looks starved: busy by NVML, yet drawing 232 W, 33% of its 700 W "
                    "power limit.",
                    0),
            0u)
      << v;
  EXPECT_NE(v.substr(g0, g1 - g0).find("STARVATION SIGNATURE: 100 %"), std::string::npos) << v;
  EXPECT_EQ(v.substr(g1).find("STARVATION"), std::string::npos) << v;
  EXPECT_NE(v.substr(g1).find("No starvation signature"), std::string::npos) << v;
}

TEST(DoctorReport, StarvationCountsBusyLowPowerSamples) {
  json g = {{"t", {0, 1, 2, 3, 4, 5, 6, 7}},
            {"powerW", {100, 100, 100, 400, 400, 100, -1, 300}},
            {"smMHz", {1980, 1980, 1980, 1980, 1980, 1980, 1980, 1980}},
            {"util", {100, 90, 80, 100, 100, 10, 100, 79}}};
  // limit 700: low power is <= 315 W. Busy (util >= 80, power known): samples 0..4 -> 5;
  // starved among them: 0, 1, 2 -> 3. Sample 6 has no power reading; 7 is not busy.
  Starvation s = starvation(g, 700);
  EXPECT_EQ(s.samples, 7);
  EXPECT_EQ(s.busy, 5);
  EXPECT_EQ(s.starved, 3);
  EXPECT_DOUBLE_EQ(s.fraction, 0.6);
  EXPECT_TRUE(s.flagged);
  // Unknown limit: nothing can be called low power.
  EXPECT_FALSE(starvation(g, -1).flagged);
}

TEST(DoctorReport, RunHtmlIsWellFormedSelfContainedAndHasThePlots) {
  const json m = loadFixture("doctor_run.json");
  const std::string h = renderHtml(m);
  EXPECT_EQ(checkWellFormed(h), "");
  // Share by batch, breakdown, latency by size, power, SM clock, utilization.
  EXPECT_EQ(count(h, "<svg "), 6u);
  EXPECT_NE(h.find("Communication's share of a decode step, by batch"), std::string::npos);
  EXPECT_NE(h.find("Where a decode step's time goes"), std::string::npos);
  EXPECT_NE(h.find("All-reduce + residual + RMSNorm latency per call"), std::string::npos);
  EXPECT_NE(h.find("Power draw over time"), std::string::npos);
  EXPECT_NE(h.find("SM clock over time"), std::string::npos);
  // Two GPUs x 3 time plots + latency series (baseline + two anyreduce paths).
  EXPECT_GE(count(h, "<polyline "), 9u);
  // 3 batches x 2 modes x (compute + communication) bars.
  EXPECT_EQ(count(h, "\"><title>communication "), 6u);
  EXPECT_EQ(count(h, "\"><title>compute "), 6u);
  // The share chart's x axis: a tick at every batch, labelled.
  for (const char* tick : {">1</text>", ">8</text>", ">32</text>"}) {
    EXPECT_NE(h.find(tick), std::string::npos) << tick;
  }
  EXPECT_NE(h.find("anyreduce: twoshot-push + add+RMSNorm kernel (composed)"), std::string::npos);
  // Text from the measurement is escaped.
  EXPECT_NE(h.find("&lt;with markup &amp; &quot;quotes&quot;&gt;"), std::string::npos);
  EXPECT_EQ(h.find("<with markup"), std::string::npos);
}

TEST(DoctorReport, HtmlPutsTheVerdictThenWhatToDoFirstAndNoLocalPaths) {
  json m = loadFixture("doctor_run.json");
  m["command"] =
      "anyreduce doctor --preset glm --json /root/out/doctor-glm.json --html "
      "/root/out/doctor-glm.html";
  const std::string h = renderHtml(m);
  const Summary s = summarize(m);
  const size_t verdict = h.find("<h1 id=\"verdict\">" + s.headline + "</h1>");
  const size_t todo = h.find("<section id=\"todo\">");
  const size_t plot = h.find("<svg ");
  ASSERT_NE(verdict, std::string::npos) << h.substr(0, 2000);
  EXPECT_EQ(h.find("<h1"), verdict);
  EXPECT_LT(verdict, todo);
  EXPECT_LT(todo, plot);
  EXPECT_NE(h.find("<pre class=\"cmd\">anyreduce tune -o tuning.json"), std::string::npos);
  EXPECT_EQ(h.find("/root/"), std::string::npos);
  EXPECT_NE(h.find("--json doctor-glm.json --html doctor-glm.html"), std::string::npos);
  // The page's own check records its outcome on <body> for the browser test.
  EXPECT_NE(h.find("setAttribute('data-check', 'ok')"), std::string::npos);
}

TEST(DoctorReport, WatchHtmlIsWellFormed) {
  const std::string h = renderHtml(loadFixture("doctor_watch.json"));
  EXPECT_EQ(checkWellFormed(h), "");
  EXPECT_EQ(count(h, "<svg "), 3u);
  EXPECT_NE(h.find("STARVATION SIGNATURE"), std::string::npos);
}

TEST(DoctorReport, NoSamplesStillRendersAndSaysNoData) {
  json m = loadFixture("doctor_watch.json");
  for (json& s : m["samples"]) {
    s["t"] = json::array();
    s["powerW"] = json::array();
    s["smMHz"] = json::array();
    s["util"] = json::array();
  }
  const std::string h = renderHtml(m);
  EXPECT_EQ(checkWellFormed(h), "");
  EXPECT_EQ(count(h, ">no data<"), 3u);
  EXPECT_NE(verdictText(m).find("no NVML samples"), std::string::npos);
}

TEST(DoctorReport, UnknownKindIsRejectedByName) {
  try {
    verdictText(json{{"kind", "bogus"}});
    FAIL() << "accepted kind 'bogus'";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("'kind'"), std::string::npos) << e.what();
  }
}

TEST(DoctorReport, MissingStepTimeIsRejectedByName) {
  json m = loadFixture("doctor_run.json");
  m["batches"][1]["modes"]["anyreduce"].erase("stepUs");
  try {
    verdictText(m);
    FAIL() << "accepted a measurement without stepUs";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("'stepUs'"), std::string::npos) << e.what();
  }
}

TEST(DoctorReport, ParseDuration) {
  double s = 0;
  EXPECT_TRUE(parseDuration("30s", &s));
  EXPECT_DOUBLE_EQ(s, 30);
  EXPECT_TRUE(parseDuration("2m", &s));
  EXPECT_DOUBLE_EQ(s, 120);
  EXPECT_TRUE(parseDuration("500ms", &s));
  EXPECT_DOUBLE_EQ(s, 0.5);
  EXPECT_TRUE(parseDuration("45", &s));
  EXPECT_DOUBLE_EQ(s, 45);
  for (const char* bad : {"", "s", "-3s", "0", "3h", "abc", "1.5x"}) {
    EXPECT_FALSE(parseDuration(bad, &s)) << bad;
  }
}

TEST(DoctorReport, WellFormedCheckCatchesBrokenHtml) {
  EXPECT_NE(checkWellFormed("<!DOCTYPE html><html><body><p></body></html>"), "");
  EXPECT_NE(checkWellFormed("<!DOCTYPE html><html><body></html></body>"), "");
  EXPECT_NE(checkWellFormed("<!DOCTYPE html><html><body><script src=\"x.js\"></script></body>"
                            "</html>"),
            "");
  EXPECT_EQ(checkWellFormed("<!DOCTYPE html><html><body><script>if (a <b) x();</script></body>"
                            "</html>"),
            "");
  EXPECT_NE(checkWellFormed("<!DOCTYPE html><html><body><img src=\"http://x\"/></body></html>"),
            "");
  EXPECT_EQ(checkWellFormed("<!DOCTYPE html><html><body><br><svg><rect x=\"1\"/></svg></body>"
                            "</html>"),
            "");
}

namespace {

// One rank's figures as doctor_run.cc writes them: one batch (8), two phases of 4 s each.
json rankFigures(int rank, double stepBase, double stepAny, double compute, double powerBase,
                 double powerAny) {
  json samples = {{"gpu", rank},
                  {"t", json::array()},
                  {"powerW", json::array()},
                  {"smMHz", json::array()},
                  {"util", json::array()}};
  // Baseline window [0, 4): the first second (the dropped quarter) at 999 W, then powerBase.
  // anyreduce window [4, 8): powerAny throughout. One sample every 0.5 s.
  for (int i = 0; i < 16; ++i) {
    const double t = 0.5 * i;
    const double p = t < 1.0 ? 999 : t < 4 ? powerBase : powerAny;
    samples["t"].push_back(t);
    samples["powerW"].push_back(p);
    samples["smMHz"].push_back(t < 4 ? 1500 : 1900);
    samples["util"].push_back(100);
  }
  auto mode = [&](double step) {
    return json{{"stepUs", step},
                {"computeUs", compute},
                {"commOnlyUs", 40.0 * (rank + 1)},
                {"perAllReduceUs", 10.0 * (rank + 1)},
                {"path", rank == 0 ? "rank0-path" : "rank1-path"}};
  };
  return {
      {"rank", rank},
      {"gpu", {{"index", rank}, {"name", "GPU"}, {"powerLimitW", 700}}},
      {"samples", samples},
      {"phases",
       {{{"label", "b8 baseline"}, {"batch", 8}, {"mode", "baseline"}, {"t0", 0}, {"t1", 4}},
        {{"label", "b8 anyreduce"}, {"batch", 8}, {"mode", "anyreduce"}, {"t0", 4}, {"t1", 8}}}},
      {"batches",
       {{{"batch", 8},
         {"messageBytes", 98304},
         {"modes", {{"baseline", mode(stepBase)}, {"anyreduce", mode(stepAny)}}}}}},
      {"arSweep",
       {{{"tokens", 8},
         {"bytes", 98304},
         {"baselineUs", 10.0 + rank},
         {"anyreduceUs", 4.0 + rank},
         {"path", "p"}}}},
      {"counters", {{"fusedKernelCalls", rank == 0 ? 7 : 9}}}};
}

}  // namespace

TEST(DoctorReport, MergeRanksAveragesTimesAndWindowsPower) {
  const std::vector<json> ranks = {rankFigures(0, 1000, 800, 700, 200, 300),
                                   rankFigures(1, 1200, 900, 700, 220, 320)};
  const json m = mergeRanks(ranks);
  const json& base = m["batches"][0]["modes"]["baseline"];
  const json& any = m["batches"][0]["modes"]["anyreduce"];
  EXPECT_DOUBLE_EQ(base["stepUs"].get<double>(), 1100);
  EXPECT_DOUBLE_EQ(any["stepUs"].get<double>(), 850);
  EXPECT_DOUBLE_EQ(base["exposedCommUs"].get<double>(), 400);
  EXPECT_DOUBLE_EQ(base["commShare"].get<double>(), 400.0 / 1100);
  EXPECT_DOUBLE_EQ(any["commShare"].get<double>(), 150.0 / 850);
  EXPECT_DOUBLE_EQ(base["perAllReduceUs"].get<double>(), 15);
  EXPECT_EQ(base["path"], "rank0-path");
  // Power: the first quarter (999 W) is dropped; mean over GPUs of (200, 220) and (300, 320).
  EXPECT_DOUBLE_EQ(base["power"]["meanW"].get<double>(), 210);
  EXPECT_DOUBLE_EQ(base["power"]["peakW"].get<double>(), 220);
  EXPECT_DOUBLE_EQ(base["power"]["smMHzMean"].get<double>(), 1500);
  EXPECT_DOUBLE_EQ(any["power"]["meanW"].get<double>(), 310);
  EXPECT_DOUBLE_EQ(any["power"]["smMHzMean"].get<double>(), 1900);
  EXPECT_DOUBLE_EQ(any["power"]["limitW"].get<double>(), 700);
  EXPECT_DOUBLE_EQ(m["arSweep"][0]["baselineUs"].get<double>(), 10.5);
  EXPECT_DOUBLE_EQ(m["arSweep"][0]["anyreduceUs"].get<double>(), 4.5);
  EXPECT_EQ(m["counters"]["fusedKernelCalls"], 7);
  EXPECT_EQ(m["gpus"].size(), 2u);
  EXPECT_EQ(m["samples"].size(), 2u);
  EXPECT_THROW(mergeRanks({}), std::runtime_error);
}

TEST(DoctorReport, PowerOverAWindowWithoutSamplesIsUnknown) {
  const std::vector<json> ranks = {rankFigures(0, 1000, 800, 700, 200, 300)};
  const json p = powerOver(ranks, 100, 200);
  EXPECT_DOUBLE_EQ(p["meanW"].get<double>(), -1);
}
