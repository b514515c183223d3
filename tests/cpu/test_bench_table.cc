// `anyreduce bench`'s table in nccl-tests' all_reduce_perf format (tools/common/bench_table.h),
// as pure functions over given figures: columns, widths, bandwidths, the rank averaging, the
// summary lines, the JSON record and its reading back.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "common/bench_table.h"

using namespace anyr::tool;

namespace {

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  for (std::string l; std::getline(ss, l);) out.push_back(l);
  return out;
}

std::vector<std::string> fields(const std::string& line) {
  std::vector<std::string> out;
  std::stringstream ss(line);
  for (std::string f; ss >> f;) out.push_back(f);
  return out;
}

BenchRow row(uint64_t bytes, double oopUs, double ipUs, int nranks) {
  BenchRow r;
  r.bytes = bytes;
  r.count = bytes / 2;
  r.dtype = anyrBfloat16;
  r.algo = "auto";
  r.chosen = "oneshot-push";
  r.outOfPlace = makeGroup(bytes, oopUs, 0, true, nranks);
  r.inPlace = makeGroup(bytes, ipUs, 0, true, nranks);
  r.ncclUs = 2 * oopUs;
  return r;
}

BenchHeader header(int nranks) {
  BenchHeader h;
  h.version = "0.1.0";
  h.nranks = nranks;
  h.ngpus = nranks;
  h.minBytes = 1024;
  h.maxBytes = 1 << 20;
  h.factor = 4;
  h.warmup = 5;
  h.iters = 20;
  h.samples = 25;
  h.graphReplays = 25;
  h.nccl = true;
  return h;
}

}  // namespace

TEST(BenchTable, BandwidthsAsNcclTestsDefineThem) {
  // 1 MB in 10 us: 100 GB/s algbw; busbw = algbw * 2 (n - 1) / n.
  EXPECT_DOUBLE_EQ(algBandwidthGBs(1000000, 10), 100.0);
  EXPECT_DOUBLE_EQ(busBandwidthGBs(100.0, 2), 100.0);
  EXPECT_DOUBLE_EQ(busBandwidthGBs(100.0, 4), 150.0);
  EXPECT_DOUBLE_EQ(busBandwidthGBs(100.0, 8), 175.0);
  EXPECT_EQ(algBandwidthGBs(1024, 0), 0);  // no division by a zero time
  const BenchGroup g = makeGroup(1 << 20, 20, 3, true, 8);
  EXPECT_DOUBLE_EQ(g.algbw, (1 << 20) / 20e3);
  EXPECT_DOUBLE_EQ(g.busbw, g.algbw * 14 / 8);
  EXPECT_EQ(g.wrong, 3);
}

TEST(BenchTable, RankAveragingAsNcclTestsMinusA) {
  const std::vector<double> t = {4, 2, 9, 5};
  EXPECT_EQ(combineRanks(t, RankAverage::kRank0), 4);
  EXPECT_EQ(combineRanks(t, RankAverage::kMean), 5);
  EXPECT_EQ(combineRanks(t, RankAverage::kMin), 2);
  EXPECT_EQ(combineRanks(t, RankAverage::kMax), 9);
  EXPECT_STREQ(rankAverageName(RankAverage::kMean), "mean");
}

TEST(BenchTable, FitNumberKeepsTheWidth) {
  EXPECT_EQ(fitNumber(6.123, 7), "   6.12");
  EXPECT_EQ(fitNumber(12345.678, 7), "12345.7");
  EXPECT_EQ(fitNumber(1234567.0, 7), "1234567");
  EXPECT_EQ(fitNumber(123456789.0, 7), "1.2e+08");
  EXPECT_EQ(fitNumber(0.004, 6), "  0.00");
  EXPECT_EQ(fitNumber(999.99, 6), "999.99");
  EXPECT_EQ(fitNumber(1000.5, 6), "1000.5");
  for (double v : {0.0, 1.5, 99.5, 1e4, 3e9}) EXPECT_EQ(fitNumber(v, 6).size(), 6u) << v;
}

TEST(BenchTable, DtypeNamesBothWays) {
  std::vector<anyrDataType_t> t;
  std::string error;
  ASSERT_TRUE(parseDtypeList("bf16,half,float", &t, &error));
  EXPECT_EQ(t, (std::vector<anyrDataType_t>{anyrBfloat16, anyrFloat16, anyrFloat32}));
  ASSERT_TRUE(parseDtypeList("all", &t, &error));
  EXPECT_EQ(t.size(), 3u);
  EXPECT_FALSE(parseDtypeList("int8", &t, &error));
  EXPECT_NE(error.find("unknown dtype 'int8'"), std::string::npos) << error;
  EXPECT_FALSE(parseDtypeList("", &t, &error));
  EXPECT_EQ(error, "names no dtype");
  EXPECT_STREQ(ncclTestsTypeName(anyrBfloat16), "bfloat16");
  EXPECT_STREQ(ncclTestsTypeName(anyrFloat16), "half");
  EXPECT_STREQ(ncclTestsTypeName(anyrFloat32), "float");
}

TEST(BenchTable, HeaderHasNcclTestsColumns) {
  const auto h = lines(formatBenchHeader(header(8)));
  for (const std::string& l : h) EXPECT_EQ(l[0], '#') << l;
  // The column line exactly as all_reduce_perf prints it, then anyreduce's own columns.
  const std::string columns =
      "#       size         count      type   redop    root     time   algbw   busbw #wrong     "
      "time   algbw   busbw #wrong";
  bool found = false;
  for (const std::string& l : h) {
    if (l.compare(0, columns.size(), columns) == 0) {
      found = true;
      EXPECT_EQ(fields(l.substr(columns.size())),
                (std::vector<std::string>{"algo", "nccl", "speedup"}));
    }
  }
  EXPECT_TRUE(found) << formatBenchHeader(header(8));
  const std::string text = formatBenchHeader(header(8));
  EXPECT_NE(text.find("# nRanks 8 nGpus 8 minBytes 1024 maxBytes 1048576 step: 4(factor) warmup "
                      "iters: 5 iters: 20 validation: 1 graph: 25 average: 1(mean)"),
            std::string::npos)
      << text;
}

TEST(BenchTable, RowColumnsAlignUnderTheHeader) {
  const BenchRow r = row(1 << 20, 61.3, 60.8, 8);
  const std::string line = lines(formatBenchRow(r)).at(0);
  const auto f = fields(line);
  ASSERT_EQ(f.size(), 16u) << line;
  EXPECT_EQ(f[0], "1048576");
  EXPECT_EQ(f[1], "524288");
  EXPECT_EQ(f[2], "bfloat16");
  EXPECT_EQ(f[3], "sum");
  EXPECT_EQ(f[4], "-1");
  EXPECT_EQ(f[5], "61.30");
  EXPECT_EQ(f[6], "17.11");  // 1048576 / 61.3 us
  EXPECT_EQ(f[7], "29.93");  // x 2 * 7 / 8
  EXPECT_EQ(f[8], "0");
  EXPECT_EQ(f[9], "60.80");
  EXPECT_EQ(f[12], "0");
  EXPECT_EQ(f[13], "auto:oneshot-push");
  EXPECT_EQ(f[14], "122.60");
  EXPECT_EQ(f[15], "2.00");
  // Every column ends where its header's does.
  std::string columns;
  for (const std::string& l : lines(formatBenchHeader(header(8)))) {
    if (l.find("size         count") != std::string::npos) columns = l;
  }
  for (const char* col : {"size", "count", "type", "redop", "root"}) {
    const size_t end = columns.find(col) + std::string(col).size();
    EXPECT_NE(line[end - 1], ' ') << col;
    EXPECT_TRUE(end == line.size() || line[end] == ' ') << col;
  }
  const size_t wrongEnd = columns.find("#wrong") + 6;
  EXPECT_EQ(line[wrongEnd - 1], '0');
}

TEST(BenchTable, UncheckedAndWrongAndNoNccl) {
  BenchRow r = row(4096, 6.4, 6.3, 2);
  r.outOfPlace = makeGroup(4096, 6.4, 0, false, 2);
  r.inPlace = makeGroup(4096, 6.3, 0, false, 2);
  r.ncclUs = -1;
  auto f = fields(lines(formatBenchRow(r)).at(0));
  EXPECT_EQ(f[8], "N/A");
  EXPECT_EQ(f[12], "N/A");
  EXPECT_EQ(f[14], "-");
  EXPECT_EQ(f[15], "-");

  BenchRow bad = row(4096, 6.4, 6.3, 2);
  bad.inPlace.wrong = 17;
  bad.inputChanged = 3;
  const auto l = lines(formatBenchRow(bad));
  ASSERT_EQ(l.size(), 2u);
  EXPECT_EQ(fields(l[0])[12], "17");
  EXPECT_EQ(l[1], "# ^ out-of-place input modified: 3 element(s), summed over ranks");
  const BenchSummary s = summarize({row(1024, 6, 6, 2), bad});
  EXPECT_EQ(s.outOfBounds, 2);  // the in-place group's wrong elements, the modified input
  EXPECT_EQ(lines(formatBenchFooter(s)).at(0), "# Out of bounds values : 2 FAILED");
}

TEST(BenchTable, FooterIsTheMeanBusbwOfEveryGroup) {
  const std::vector<BenchRow> rows = {row(1 << 20, 10, 20, 4), row(1 << 20, 40, 40, 4)};
  const BenchSummary s = summarize(rows);
  const double expect = (rows[0].outOfPlace.busbw + rows[0].inPlace.busbw +
                         rows[1].outOfPlace.busbw + rows[1].inPlace.busbw) /
                        4;
  EXPECT_DOUBLE_EQ(s.avgBusbw, expect);
  EXPECT_EQ(s.outOfBounds, 0);
  const auto l = lines(formatBenchFooter(s));
  ASSERT_EQ(l.size(), 2u);
  EXPECT_EQ(l[0], "# Out of bounds values : 0 OK");
  char want[64];
  std::snprintf(want, sizeof(want), "# Avg bus bandwidth    : %g", expect);
  EXPECT_EQ(l[1], want);
}

TEST(BenchTable, JsonCarriesBandwidthsAndReadsBack) {
  BenchHeader h = header(4);
  h.devices = {"Rank  0 device  0 [0000:18:00] x"};
  h.notes = {"skipped host-copy: not admitted"};
  BenchRow unchecked = row(4096, 8, 9, 4);
  unchecked.outOfPlace.checked = unchecked.inPlace.checked = false;
  const std::vector<BenchRow> rows = {row(1024, 6, 7, 4), row(1 << 20, 60, 61, 4), unchecked};
  const nlohmann::json j = benchJson(h, rows);
  ASSERT_EQ(j["points"].size(), 3u);
  const auto& p = j["points"][1];
  EXPECT_EQ(p["bytes"], 1 << 20);
  EXPECT_EQ(p["dtype"], "bf16");
  EXPECT_EQ(p["type"], "bfloat16");
  EXPECT_DOUBLE_EQ(p["algbw"].get<double>(), (1 << 20) / 60e3);
  EXPECT_DOUBLE_EQ(p["busbw"].get<double>(), (1 << 20) / 60e3 * 1.5);
  EXPECT_DOUBLE_EQ(p["inPlace"]["busbw"].get<double>(), (1 << 20) / 61e3 * 1.5);
  EXPECT_TRUE(j["points"][2]["wrong"].is_null());
  EXPECT_EQ(j["outOfBounds"], 0);

  BenchHeader h2;
  std::vector<BenchRow> rows2;
  std::string error;
  ASSERT_TRUE(benchFromJson(j, &h2, &rows2, &error)) << error;
  std::string a = formatBenchHeader(h), b = formatBenchHeader(h2);
  for (const BenchRow& r : rows) a += formatBenchRow(r);
  for (const BenchRow& r : rows2) b += formatBenchRow(r);
  EXPECT_EQ(a, b);

  nlohmann::json broken = j;
  broken["points"][0].erase("us");
  EXPECT_FALSE(benchFromJson(broken, &h2, &rows2, &error));
  EXPECT_NE(error.find("us"), std::string::npos) << error;
  EXPECT_FALSE(benchFromJson({{"op", "add-rmsnorm"}, {"points", {}}}, &h2, &rows2, &error));
  EXPECT_NE(error.find("\"op\": \"allreduce\""), std::string::npos) << error;
}
