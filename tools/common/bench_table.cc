#include "common/bench_table.h"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <sstream>
#include <stdexcept>

namespace anyr {
namespace tool {

namespace {

// anyreduce's own dtype names (the JSON's "dtype", as the tools have always written it).
const char* anyrTypeName(anyrDataType_t t) {
  return t == anyrFloat32 ? "fp32" : t == anyrFloat16 ? "fp16" : t == anyrBfloat16 ? "bf16" : "?";
}

// The widths of nccl-tests' columns: the five that describe the operation, then per group the
// time, algbw, busbw and #wrong. The header's first column is two narrower, for its "# ".
constexpr int kSizeW = 12, kCountW = 12, kTypeW = 8, kOpW = 6, kRootW = 6;
constexpr int kTimeW = 7, kBwW = 6, kWrongW = 6;
// anyreduce's trailing columns: the algorithm (auto shows its choice), NCCL's time, the speedup.
constexpr int kAlgoW = 24, kNcclW = 9, kSpeedW = 7;

std::string printed(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string printed(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  return buf;
}

std::string centered(const std::string& text, int width) {
  const int pad = std::max(0, width - static_cast<int>(text.size()));
  return std::string(pad / 2, ' ') + text + std::string(pad - pad / 2, ' ');
}

// The four columns of one group: "  time  algbw  busbw #wrong".
std::string groupColumns(const char* time, const char* algbw, const char* busbw,
                         const char* wrong) {
  return printed("  %*s  %*s  %*s %*s", kTimeW, time, kBwW, algbw, kBwW, busbw, kWrongW, wrong);
}

std::string wrongText(const BenchGroup& g) {
  if (!g.checked) return "N/A";
  return printed("%g", g.wrong);
}

}  // namespace

const char* rankAverageName(RankAverage a) {
  switch (a) {
    case RankAverage::kRank0:
      return "rank0";
    case RankAverage::kMean:
      return "mean";
    case RankAverage::kMin:
      return "min";
    case RankAverage::kMax:
      return "max";
  }
  return "?";
}

double combineRanks(const std::vector<double>& perRank, RankAverage how) {
  if (perRank.empty()) return 0;
  switch (how) {
    case RankAverage::kRank0:
      return perRank[0];
    case RankAverage::kMin:
      return *std::min_element(perRank.begin(), perRank.end());
    case RankAverage::kMax:
      return *std::max_element(perRank.begin(), perRank.end());
    case RankAverage::kMean:
      break;
  }
  double sum = 0;
  for (double v : perRank) sum += v;
  return sum / static_cast<double>(perRank.size());
}

double algBandwidthGBs(uint64_t bytes, double us) {
  return us > 0 ? static_cast<double>(bytes) / (us * 1e3) : 0;  // bytes/us = MB/s; /1e3: GB/s
}

double busBandwidthGBs(double algbw, int nranks) {
  return nranks > 0 ? algbw * 2.0 * (nranks - 1) / nranks : 0;
}

const char* ncclTestsTypeName(anyrDataType_t t) {
  return t == anyrFloat32    ? "float"
         : t == anyrFloat16  ? "half"
         : t == anyrBfloat16 ? "bfloat16"
                             : "?";
}

bool parseDtypeList(const std::string& text, std::vector<anyrDataType_t>* out, std::string* error) {
  std::vector<anyrDataType_t> types;
  std::stringstream ss(text);
  for (std::string d; std::getline(ss, d, ',');) {
    if (d == "all") {
      types.insert(types.end(), {anyrBfloat16, anyrFloat16, anyrFloat32});
    } else if (d == "bf16" || d == "bfloat16") {
      types.push_back(anyrBfloat16);
    } else if (d == "fp16" || d == "half" || d == "float16") {
      types.push_back(anyrFloat16);
    } else if (d == "fp32" || d == "float" || d == "float32") {
      types.push_back(anyrFloat32);
    } else {
      *error = d.empty() ? "names no dtype"
                         : "unknown dtype '" + d +
                               "' (bf16|bfloat16, fp16|half, fp32|float, or all; anyreduce "
                               "reduces no other type)";
      return false;
    }
  }
  if (types.empty()) {
    *error = "names no dtype";
    return false;
  }
  *out = types;
  return true;
}

std::string fitNumber(double value, int width) {
  if (!std::isfinite(value)) return printed("%*s", width, "-");
  for (int decimals = 2; decimals >= 0; --decimals) {
    const std::string s = printed("%*.*f", width, decimals, value);
    if (static_cast<int>(s.size()) <= width) return s;
  }
  return printed("%*.*e", width, width >= 7 ? 1 : 0, value);
}

BenchGroup makeGroup(uint64_t bytes, double us, double wrong, bool checked, int nranks) {
  BenchGroup g;
  g.us = us;
  g.wrong = checked ? wrong : 0;
  g.checked = checked;
  g.algbw = algBandwidthGBs(bytes, us);
  g.busbw = busBandwidthGBs(g.algbw, nranks);
  return g;
}

std::string formatBenchHeader(const BenchHeader& h) {
  std::string s;
  s += printed("# anyreduce bench %s: all-reduce in the format of nccl-tests' all_reduce_perf\n",
               h.version.c_str());
  s += printed(
      "# nRanks %d nGpus %d minBytes %llu maxBytes %llu step: %g(factor) warmup iters: %d iters: "
      "%d validation: %d graph: %d average: %d(%s)\n",
      h.nranks, h.ngpus, static_cast<unsigned long long>(h.minBytes),
      static_cast<unsigned long long>(h.maxBytes), h.factor, h.warmup, h.iters, h.check,
      h.graphReplays, static_cast<int>(h.average), rankAverageName(h.average));
  s += printed(
      "# time: per call, the median of %d timed %s of %d calls each (after %d warm-up), then the "
      "%s over ranks; busbw = algbw * 2(n-1)/n\n",
      h.samples, h.graphReplays > 0 ? "CUDA-graph replays" : "batches of eager launches", h.iters,
      h.warmup, rankAverageName(h.average));
  s += printed("# nccl: %s\n", h.nccl ? "ncclAllReduce out of place, timed the same way in the "
                                        "same run on the same buffers"
                                      : "not available (no NCCL communicator)");
  if (h.nranks > h.ngpus && h.ngpus > 0) {
    s += printed("# %d ranks share %d GPU(s): a correctness run; the times are not meaningful\n",
                 h.nranks, h.ngpus);
  }
  s += "#\n";
  if (!h.devices.empty()) {
    s += "# Using devices\n";
    for (const std::string& d : h.devices) s += "#  " + d + "\n";
    s += "#\n";
  }
  for (const std::string& n : h.notes) s += "# " + n + "\n";
  if (!h.notes.empty()) s += "#\n";
  // Three header lines: the groups' titles, the columns' names, their units.
  const int lead = 2 + kSizeW - 2 + 2 + kCountW + 2 + kTypeW + 2 + kOpW + 2 + kRootW;
  const int group = 2 + kTimeW + 2 + kBwW + 2 + kBwW + 1 + kWrongW;
  std::string titles = "#" + std::string(lead - 1, ' ') + centered("out-of-place", group) +
                       centered("in-place", group) + "  anyreduce";
  s += titles + "\n";
  s += printed("# %*s  %*s  %*s  %*s  %*s", kSizeW - 2, "size", kCountW, "count", kTypeW, "type",
               kOpW, "redop", kRootW, "root") +
       groupColumns("time", "algbw", "busbw", "#wrong") +
       groupColumns("time", "algbw", "busbw", "#wrong") +
       printed("  %-*s %*s %*s\n", kAlgoW, "algo", kNcclW, "nccl", kSpeedW, "speedup");
  s += printed("# %*s  %*s  %*s  %*s  %*s", kSizeW - 2, "(B)", kCountW, "(elements)", kTypeW, "",
               kOpW, "", kRootW, "") +
       groupColumns("(us)", "(GB/s)", "(GB/s)", "") + groupColumns("(us)", "(GB/s)", "(GB/s)", "") +
       printed("  %-*s %*s %*s\n", kAlgoW, "", kNcclW, "(us)", kSpeedW, "(x)");
  return s;
}

std::string formatBenchRow(const BenchRow& r) {
  std::string s =
      printed("%*llu  %*llu  %*s  %*s  %*d", kSizeW, static_cast<unsigned long long>(r.bytes),
              kCountW, static_cast<unsigned long long>(r.count), kTypeW, ncclTestsTypeName(r.dtype),
              kOpW, "sum", kRootW, -1);
  for (const BenchGroup* g : {&r.outOfPlace, &r.inPlace}) {
    s += groupColumns(fitNumber(g->us, kTimeW).c_str(), fitNumber(g->algbw, kBwW).c_str(),
                      fitNumber(g->busbw, kBwW).c_str(), wrongText(*g).c_str());
  }
  const std::string algo = r.algo == "auto" ? "auto:" + r.chosen : r.algo;
  std::string nccl = "-", speedup = "-";
  if (r.ncclUs > 0 && r.outOfPlace.us > 0) {
    nccl = fitNumber(r.ncclUs, kNcclW);
    speedup = fitNumber(r.ncclUs / r.outOfPlace.us, kSpeedW);
  }
  s += printed("  %-*s %*s %*s\n", kAlgoW, algo.c_str(), kNcclW, nccl.c_str(), kSpeedW,
               speedup.c_str());
  if (r.inputChanged > 0) {
    s += printed("# ^ out-of-place input modified: %g element(s), summed over ranks\n",
                 r.inputChanged);
  }
  return s;
}

BenchSummary summarize(const std::vector<BenchRow>& rows) {
  BenchSummary s;
  double sum = 0;
  int groups = 0;
  for (const BenchRow& r : rows) {
    ++s.rows;
    if (r.outOfPlace.checked && (r.outOfPlace.wrong > 0 || r.inputChanged > 0)) ++s.outOfBounds;
    if (r.inPlace.checked && r.inPlace.wrong > 0) ++s.outOfBounds;
    sum += r.outOfPlace.busbw + r.inPlace.busbw;
    groups += 2;
  }
  s.avgBusbw = groups ? sum / groups : 0;
  return s;
}

std::string formatBenchFooter(const BenchSummary& s) {
  return printed("# %-20s : %d %s\n", "Out of bounds values", s.outOfBounds,
                 s.outOfBounds ? "FAILED" : "OK") +
         printed("# %-20s : %g\n", "Avg bus bandwidth", s.avgBusbw);
}

nlohmann::json benchRowJson(const BenchRow& r) {
  auto wrong = [](const BenchGroup& g) {
    return g.checked ? nlohmann::json(g.wrong) : nlohmann::json(nullptr);
  };
  return {{"bytes", r.bytes},
          {"count", r.count},
          {"dtype", anyrTypeName(r.dtype)},
          {"type", ncclTestsTypeName(r.dtype)},
          {"redop", "sum"},
          {"root", -1},
          {"algo", r.algo},
          {"chosen", r.chosen},
          {"us", r.outOfPlace.us},
          {"algbw", r.outOfPlace.algbw},
          {"busbw", r.outOfPlace.busbw},
          {"wrong", wrong(r.outOfPlace)},
          {"inputChanged", r.inputChanged},
          {"ncclUs", r.ncclUs},
          {"inPlace",
           {{"us", r.inPlace.us},
            {"algbw", r.inPlace.algbw},
            {"busbw", r.inPlace.busbw},
            {"wrong", wrong(r.inPlace)}}}};
}

nlohmann::json benchJson(const BenchHeader& h, const std::vector<BenchRow>& rows) {
  nlohmann::json points = nlohmann::json::array();
  for (const BenchRow& r : rows) points.push_back(benchRowJson(r));
  const BenchSummary s = summarize(rows);
  return {{"version", h.version},
          {"op", "allreduce"},
          {"nranks", h.nranks},
          {"ngpus", h.ngpus},
          {"minBytes", h.minBytes},
          {"maxBytes", h.maxBytes},
          {"factor", h.factor},
          {"warmup", h.warmup},
          {"calls", h.iters},
          {"check", h.check},
          {"graph", h.graphReplays > 0},
          {"samples", h.samples},
          {"average", rankAverageName(h.average)},
          {"nccl", h.nccl},
          {"devices", h.devices},
          {"notes", h.notes},
          {"points", points},
          {"outOfBounds", s.outOfBounds},
          {"avgBusbw", s.avgBusbw}};
}

bool benchFromJson(const nlohmann::json& j, BenchHeader* h, std::vector<BenchRow>* rows,
                   std::string* error) {
  using nlohmann::json;
  if (!j.is_object() || j.value("op", std::string()) != "allreduce" || !j.contains("points")) {
    *error =
        "not a record of `anyreduce bench --json` for the all-reduce (needs \"op\": "
        "\"allreduce\" and \"points\")";
    return false;
  }
  try {
    BenchHeader x;
    x.version = j.at("version").get<std::string>();
    x.nranks = j.at("nranks").get<int>();
    x.ngpus = j.at("ngpus").get<int>();
    x.minBytes = j.at("minBytes").get<uint64_t>();
    x.maxBytes = j.at("maxBytes").get<uint64_t>();
    x.factor = j.at("factor").get<double>();
    x.warmup = j.at("warmup").get<int>();
    x.iters = j.at("calls").get<int>();
    x.check = j.at("check").get<int>();
    x.samples = j.at("samples").get<int>();
    x.graphReplays = j.at("graph").get<bool>() ? x.samples : 0;
    const std::string average = j.at("average").get<std::string>();
    bool known = false;
    for (RankAverage a :
         {RankAverage::kRank0, RankAverage::kMean, RankAverage::kMin, RankAverage::kMax}) {
      if (average == rankAverageName(a)) {
        x.average = a;
        known = true;
      }
    }
    if (!known) throw std::runtime_error("\"average\": unknown '" + average + "'");
    x.nccl = j.at("nccl").get<bool>();
    x.devices = j.value("devices", std::vector<std::string>());
    x.notes = j.value("notes", std::vector<std::string>());
    if (x.nranks < 1) throw std::runtime_error("\"nranks\" must be positive");
    std::vector<BenchRow> out;
    for (const json& p : j.at("points")) {
      BenchRow r;
      r.bytes = p.at("bytes").get<uint64_t>();
      r.count = p.at("count").get<uint64_t>();
      std::vector<anyrDataType_t> t;
      std::string why;
      if (!parseDtypeList(p.at("dtype").get<std::string>(), &t, &why) || t.size() != 1) {
        throw std::runtime_error("\"dtype\": " + why);
      }
      r.dtype = t[0];
      r.algo = p.at("algo").get<std::string>();
      r.chosen = p.at("chosen").get<std::string>();
      const json& ip = p.at("inPlace");
      const bool checked = !p.at("wrong").is_null();
      r.outOfPlace = makeGroup(r.bytes, p.at("us").get<double>(),
                               checked ? p.at("wrong").get<double>() : 0, checked, x.nranks);
      r.inPlace = makeGroup(r.bytes, ip.at("us").get<double>(),
                            checked ? ip.at("wrong").get<double>() : 0, checked, x.nranks);
      r.ncclUs = p.at("ncclUs").get<double>();
      r.inputChanged = p.at("inputChanged").get<double>();
      out.push_back(r);
    }
    *h = x;
    *rows = out;
    return true;
  } catch (const std::exception& e) {
    *error = e.what();
    return false;
  }
}

}  // namespace tool
}  // namespace anyr
