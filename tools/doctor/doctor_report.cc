// Verdict and HTML report from a doctor measurement (JSON). No CUDA, no NVML: runs anywhere.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>
#include <stdexcept>

#include "doctor.h"

namespace anyr {
namespace doctor {

using nlohmann::json;

namespace {

std::string fmt(const char* f, double v) {
  char b[512];
  std::snprintf(b, sizeof(b), f, v);
  return b;
}

double num(const json& j, const char* key, double dflt = -1) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return dflt;
  return it->get<double>();
}

// A required number: throws naming the key when it is missing or not a number.
double req(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) {
    throw std::runtime_error(std::string("measurement: '") + key + "' is missing or not a number");
  }
  return it->get<double>();
}

std::string str(const json& j, const char* key, const std::string& dflt = "") {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return dflt;
  return it->get<std::string>();
}

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&':
        o += "&amp;";
        break;
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '"':
        o += "&quot;";
        break;
      default:
        o += c;
    }
  }
  return o;
}

// Power summary of one mode: {meanW, peakW, limitW, smMHz, util} over its GPUs.
std::string powerWords(const json& p) {
  if (!p.is_object() || num(p, "meanW") < 0) return "power not available (no NVML)";
  std::string s = fmt("%.0f W mean", num(p, "meanW")) + fmt(" (peak %.0f W", num(p, "peakW"));
  if (num(p, "limitW") > 0) s += fmt(" of a %.0f W limit", num(p, "limitW"));
  s += ")";
  if (num(p, "smMHzMean") > 0) s += fmt(", SM clock %.0f MHz", num(p, "smMHzMean"));
  if (num(p, "utilMean") >= 0) s += fmt(", utilization %.0f %%", num(p, "utilMean"));
  return s;
}

const char* kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd",
                          "#ff7f0e", "#17becf", "#8c564b", "#e377c2"};

struct Series {
  std::string name;
  std::string color;
  std::vector<std::pair<double, double>> pts;
  std::vector<std::string> pointLabels;  // optional, one per point
};

struct Band {
  double x0, x1;
  std::string label;
};

double niceStep(double range, int ticks) {
  const double raw = range / ticks;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (raw <= m * mag) return m * mag;
  }
  return 10 * mag;
}

// A line chart as inline SVG. logX: log2 axis (message sizes).
std::string lineChart(const std::string& title, const std::string& xLabel,
                      const std::string& yLabel, const std::vector<Series>& series, bool logX,
                      const std::vector<Band>& bands = {}) {
  // The legend goes under the x-axis label, one series per line (names can be long).
  const double legendH = 16.0 * series.size();
  const double W = 760, L = 70, R = 20, T = 34, B = 46 + legendH;
  const double H = 300 + legendH;
  double x0 = 1e300, x1 = -1e300, y1 = 0;
  for (const Series& s : series) {
    for (auto [x, y] : s.pts) {
      if (logX && x <= 0) continue;
      const double xv = logX ? std::log2(x) : x;
      x0 = std::min(x0, xv);
      x1 = std::max(x1, xv);
      y1 = std::max(y1, y);
    }
  }
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"plot\" width=\"" << W << "\" height=\""
    << H << "\" viewBox=\"0 0 " << W << " " << H << "\" role=\"img\">";
  o << "<title>" << esc(title) << "</title>";
  o << "<text x=\"" << W / 2 << "\" y=\"20\" text-anchor=\"middle\" font-weight=\"bold\">"
    << esc(title) << "</text>";
  if (x0 > x1) {
    o << "<text x=\"" << W / 2 << "\" y=\"" << H / 2
      << "\" text-anchor=\"middle\">no data</text></svg>";
    return o.str();
  }
  if (x1 - x0 < 1e-12) {
    x0 -= 1;
    x1 += 1;
  }
  if (y1 <= 0) y1 = 1;
  const double yStep = niceStep(y1, 5);
  y1 = std::ceil(y1 / yStep) * yStep;
  auto px = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
  auto py = [&](double y) { return H - B - y / y1 * (H - T - B); };
  for (size_t i = 0; i < bands.size(); ++i) {
    const Band& b = bands[i];
    o << "<rect x=\"" << px(b.x0) << "\" y=\"" << T << "\" width=\""
      << std::max(0.5, px(b.x1) - px(b.x0)) << "\" height=\"" << H - T - B << "\" fill=\""
      << (i % 2 ? "#f2f2f2" : "#e6eef7") << "\"/>";
    o << "<text x=\"" << (px(b.x0) + px(b.x1)) / 2 << "\" y=\"" << T + 10
      << "\" font-size=\"9\" text-anchor=\"middle\">" << esc(b.label) << "</text>";
  }
  o << "<line x1=\"" << L << "\" y1=\"" << H - B << "\" x2=\"" << W - R << "\" y2=\"" << H - B
    << "\" stroke=\"#333\"/>";
  o << "<line x1=\"" << L << "\" y1=\"" << T << "\" x2=\"" << L << "\" y2=\"" << H - B
    << "\" stroke=\"#333\"/>";
  for (double y = 0; y <= y1 + 1e-9; y += yStep) {
    o << "<line x1=\"" << L - 4 << "\" y1=\"" << py(y) << "\" x2=\"" << W - R << "\" y2=\"" << py(y)
      << "\" stroke=\"#ddd\"/>";
    o << "<text x=\"" << L - 6 << "\" y=\"" << py(y) + 4 << "\" font-size=\"11\" "
      << "text-anchor=\"end\">" << fmt("%g", y) << "</text>";
  }
  if (logX) {
    for (double x = std::ceil(x0); x <= x1 + 1e-9; x += 1) {
      const double bytes = std::pow(2.0, x);
      std::string lab = bytes >= 1048576 ? fmt("%gM", bytes / 1048576)
                        : bytes >= 1024  ? fmt("%gK", bytes / 1024)
                                         : fmt("%g", bytes);
      o << "<text x=\"" << px(x) << "\" y=\"" << H - B + 16
        << "\" font-size=\"11\" text-anchor=\"middle\">" << lab << "</text>";
    }
  } else {
    const double xStep = niceStep(x1 - x0, 8);
    for (double x = std::ceil(x0 / xStep) * xStep; x <= x1 + 1e-9; x += xStep) {
      o << "<text x=\"" << px(x) << "\" y=\"" << H - B + 16
        << "\" font-size=\"11\" text-anchor=\"middle\">" << fmt("%g", x) << "</text>";
    }
  }
  o << "<text x=\"" << (L + W - R) / 2 << "\" y=\"" << H - B + 32
    << "\" font-size=\"12\" text-anchor=\"middle\">" << esc(xLabel) << "</text>";
  o << "<text x=\"14\" y=\"" << (T + H - B) / 2 << "\" font-size=\"12\" text-anchor=\"middle\" "
    << "transform=\"rotate(-90 14 " << (T + H - B) / 2 << ")\">" << esc(yLabel) << "</text>";
  int li = 0;
  for (const Series& s : series) {
    std::ostringstream pts;
    for (auto [x, y] : s.pts) {
      if (logX && x <= 0) continue;
      pts << px(logX ? std::log2(x) : x) << "," << py(y) << " ";
    }
    o << "<polyline fill=\"none\" stroke=\"" << s.color << "\" stroke-width=\"1.8\" points=\""
      << pts.str() << "\"/>";
    for (size_t i = 0; i < s.pts.size(); ++i) {
      auto [x, y] = s.pts[i];
      if (logX && x <= 0) continue;
      if (s.pts.size() > 60) break;  // dense series: line only
      o << "<circle cx=\"" << px(logX ? std::log2(x) : x) << "\" cy=\"" << py(y)
        << "\" r=\"3\" fill=\"" << s.color << "\">";
      o << "<title>" << esc(s.name) << fmt(": %.2f", y)
        << (i < s.pointLabels.size() ? " (" + esc(s.pointLabels[i]) + ")" : std::string())
        << "</title></circle>";
    }
    const double ly = H - legendH + 16.0 * li - 4;
    o << "<rect x=\"" << L << "\" y=\"" << ly << "\" width=\"10\" height=\"10\" fill=\"" << s.color
      << "\"/>";
    o << "<text x=\"" << L + 14 << "\" y=\"" << ly + 9 << "\" font-size=\"11\">" << esc(s.name)
      << "</text>";
    ++li;
  }
  o << "</svg>";
  return o.str();
}

// Horizontal stacked bars: per batch and mode, compute + exposed communication.
std::string breakdownChart(const json& m) {
  const json& batches = m.at("batches");
  struct Row {
    std::string label;
    double compute, comm;
  };
  std::vector<Row> rows;
  double xMax = 0;
  for (const json& b : batches) {
    for (const char* mode : {"baseline", "anyreduce"}) {
      if (!b.at("modes").contains(mode)) continue;
      const json& x = b.at("modes").at(mode);
      const double step = num(x, "stepUs", 0), comp = num(x, "computeUs", 0);
      rows.push_back({"batch " + std::to_string(b.at("batch").get<int>()) + " " + mode,
                      std::min(comp, step), std::max(0.0, step - comp)});
      xMax = std::max(xMax, step);
    }
  }
  const double W = 760, L = 150, R = 90, T = 40, rowH = 22;
  const double H = T + rowH * rows.size() + 40;
  if (xMax <= 0) xMax = 1;
  auto px = [&](double v) { return L + v / xMax * (W - L - R); };
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"plot\" width=\"" << W << "\" height=\""
    << H << "\" viewBox=\"0 0 " << W << " " << H << "\" role=\"img\">";
  o << "<title>Decode step breakdown</title>";
  o << "<text x=\"" << W / 2 << "\" y=\"20\" text-anchor=\"middle\" font-weight=\"bold\">"
    << "Decode step: compute vs exposed communication (us)</text>";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const double y = T + rowH * i;
    o << "<text x=\"" << L - 6 << "\" y=\"" << y + 14 << "\" font-size=\"11\" "
      << "text-anchor=\"end\">" << esc(r.label) << "</text>";
    o << "<rect x=\"" << L << "\" y=\"" << y + 3 << "\" width=\"" << px(r.compute) - L
      << "\" height=\"" << rowH - 6 << "\" fill=\"#7f9fbf\"><title>compute "
      << fmt("%.1f us", r.compute) << "</title></rect>";
    o << "<rect x=\"" << px(r.compute) << "\" y=\"" << y + 3 << "\" width=\""
      << px(r.compute + r.comm) - px(r.compute) << "\" height=\"" << rowH - 6
      << "\" fill=\"#d62728\"><title>communication " << fmt("%.1f us", r.comm) << "</title></rect>";
    o << "<text x=\"" << px(r.compute + r.comm) + 4 << "\" y=\"" << y + 14 << "\" font-size=\"11\">"
      << fmt("%.0f us", r.compute + r.comm) << "</text>";
  }
  const double ly = T + rowH * rows.size() + 16;
  o << "<rect x=\"" << L << "\" y=\"" << ly << "\" width=\"10\" height=\"10\" fill=\"#7f9fbf\"/>"
    << "<text x=\"" << L + 14 << "\" y=\"" << ly + 9
    << "\" font-size=\"11\">compute (GEMMs, elementwise)</text>";
  o << "<rect x=\"" << L + 220 << "\" y=\"" << ly
    << "\" width=\"10\" height=\"10\" fill=\"#d62728\"/>"
    << "<text x=\"" << L + 234 << "\" y=\"" << ly + 9
    << "\" font-size=\"11\">exposed communication (all-reduce + add + RMSNorm)</text>";
  o << "</svg>";
  return o.str();
}

// Power and SM-clock-over-time charts from per-GPU sample arrays.
std::string timeCharts(const json& m) {
  std::vector<Series> power, clock, util;
  std::vector<Band> bands;
  if (m.contains("phases")) {
    for (const json& p : m.at("phases")) {
      bands.push_back({num(p, "t0", 0), num(p, "t1", 0), str(p, "label")});
    }
  }
  int i = 0;
  for (const json& g : m.value("samples", json::array())) {
    const std::string name = "GPU " + std::to_string(g.value("gpu", i));
    const char* c = kPalette[i % 8];
    Series p{name, c, {}, {}}, k{name, c, {}, {}}, u{name, c, {}, {}};
    const json& t = g.at("t");
    for (size_t s = 0; s < t.size(); ++s) {
      const double ts = t[s].get<double>();
      if (g.at("powerW")[s].get<double>() >= 0) p.pts.push_back({ts, g.at("powerW")[s]});
      if (g.at("smMHz")[s].get<double>() >= 0) k.pts.push_back({ts, g.at("smMHz")[s]});
      if (g.at("util")[s].get<double>() >= 0) u.pts.push_back({ts, g.at("util")[s]});
    }
    power.push_back(p);
    clock.push_back(k);
    util.push_back(u);
    ++i;
  }
  return lineChart("Power draw over time", "time (s)", "W", power, false, bands) +
         lineChart("SM clock over time", "time (s)", "MHz", clock, false, bands) +
         lineChart("GPU utilization over time (NVML: share of time a kernel ran)", "time (s)", "%",
                   util, false, bands);
}

std::string countersTable(const json& c) {
  if (!c.is_object() || !c.contains("calls")) return "<p>No counters recorded.</p>";
  std::ostringstream o;
  o << "<table><tr><th>path</th><th>size bucket</th><th>calls</th><th>bytes</th></tr>";
  for (auto& [algo, buckets] : c.at("calls").items()) {
    for (auto& [bucket, calls] : buckets.items()) {
      o << "<tr><td>" << esc(algo) << "</td><td>" << esc(bucket) << "</td><td>"
        << calls.get<unsigned long long>() << "</td><td>"
        << c.at("bytes").at(algo).at(bucket).get<unsigned long long>() << "</td></tr>";
    }
  }
  o << "</table><p>fused kernel calls: " << c.value("fusedKernelCalls", 0ull)
    << "; fused calls composed of all-reduce + separate kernel (fallback): "
    << c.value("fusedComposedCalls", 0ull)
    << "; captured into CUDA graphs: " << c.value("capturedCalls", 0ull)
    << ". Counted per host dispatch (a captured call counts once, not per replay). Time waiting "
       "for peers is not counted by the library (see the exposed communication above).</p>";
  return o.str();
}

std::string gpuStarvationWords(const json& m) {
  std::ostringstream o;
  const json& gpus = m.value("gpus", json::array());
  int i = 0;
  for (const json& g : m.value("samples", json::array())) {
    double limit = -1, maxClk = -1;
    std::string name;
    const int idx = g.value("gpu", i);
    for (const json& d : gpus) {
      if (d.value("index", -2) == idx) {
        limit = num(d, "powerLimitW");
        maxClk = num(d, "maxSmMHz");
        name = str(d, "name");
      }
    }
    double pSum = 0, cSum = 0, uSum = 0, pPeak = 0;
    int n = 0;
    const json& t = g.at("t");
    for (size_t s = 0; s < t.size(); ++s) {
      const double p = g.at("powerW")[s], c = g.at("smMHz")[s], u = g.at("util")[s];
      if (p < 0 || c < 0 || u < 0) continue;
      pSum += p;
      cSum += c;
      uSum += u;
      pPeak = std::max(pPeak, p);
      ++n;
    }
    o << "GPU " << idx << (name.empty() ? "" : " (" + name + ")") << ": ";
    if (n == 0) {
      o << "no NVML samples.\n";
      ++i;
      continue;
    }
    o << fmt("%.0f W mean", pSum / n) << fmt(", %.0f W peak", pPeak);
    if (limit > 0) o << fmt(" of a %.0f W limit", limit);
    o << fmt(", SM clock %.0f MHz", cSum / n);
    if (maxClk > 0) o << fmt(" (max %.0f)", maxClk);
    o << fmt(", utilization %.0f %%", uSum / n) << ". ";
    Starvation st = starvation(g, limit);
    if (st.flagged) {
      o << fmt(
          "STARVATION SIGNATURE: %.0f %% of the busy samples ran at <= 45 %% of the power "
          "limit; kernels are resident (spinning or waiting) but the SMs are not fed.",
          100 * st.fraction);
    } else if (st.busy == 0) {
      o << "Mostly idle during the watch.";
    } else {
      o << fmt("No starvation signature (%.0f %% of busy samples at low power).",
               100 * st.fraction);
    }
    o << "\n";
    ++i;
  }
  return o.str();
}

}  // namespace

Starvation starvation(const json& g, double limitW) {
  Starvation s;
  const json& t = g.at("t");
  for (size_t i = 0; i < t.size(); ++i) {
    const double p = g.at("powerW")[i], u = g.at("util")[i];
    if (p < 0 || u < 0) continue;
    ++s.samples;
    if (u < kBusyUtilPct) continue;
    ++s.busy;
    if (limitW > 0 && p <= kStarvedPowerFraction * limitW) ++s.starved;
  }
  s.fraction = s.busy ? static_cast<double>(s.starved) / s.busy : 0;
  s.flagged = s.busy >= 5 && s.fraction >= 0.3;
  return s;
}

// Power over [t0 + 25 % of the window, t1) of every rank's GPU (see doctor.h).
json powerOver(const std::vector<json>& ranks, double t0, double t1) {
  const double from = t0 + 0.25 * (t1 - t0);
  double meanSum = 0, peak = 0, clk = 0, util = 0, limit = -1;
  int gpus = 0;
  for (const json& r : ranks) {
    const json& s = r.at("samples");
    double p = 0, c = 0, u = 0;
    int n = 0;
    for (size_t i = 0; i < s.at("t").size(); ++i) {
      const double t = s.at("t")[i];
      if (t < from || t >= t1 || s.at("powerW")[i].get<double>() < 0) continue;
      p += s.at("powerW")[i].get<double>();
      c += s.at("smMHz")[i].get<double>();
      u += s.at("util")[i].get<double>();
      peak = std::max(peak, s.at("powerW")[i].get<double>());
      ++n;
    }
    if (n == 0) continue;
    meanSum += p / n;
    clk += c / n;
    util += u / n;
    limit = r.at("gpu").value("powerLimitW", -1.0);
    ++gpus;
  }
  if (gpus == 0) return {{"meanW", -1}, {"peakW", -1}, {"limitW", limit}};
  return {{"meanW", meanSum / gpus},
          {"peakW", peak},
          {"limitW", limit},
          {"smMHzMean", clk / gpus},
          {"utilMean", util / gpus}};
}

json mergeRanks(const std::vector<json>& ranks) {
  if (ranks.empty()) throw std::runtime_error("mergeRanks: no rank figures");
  const json& r0 = ranks[0];
  const double nranks = static_cast<double>(ranks.size());
  json m;
  json gpus = json::array(), samples = json::array();
  for (const json& r : ranks) {
    gpus.push_back(r.at("gpu"));
    samples.push_back(r.at("samples"));
  }
  m["gpus"] = gpus;
  m["samples"] = samples;
  m["phases"] = r0.at("phases");
  json batches = json::array();
  for (size_t bi = 0; bi < r0.at("batches").size(); ++bi) {
    json b = r0.at("batches")[bi];
    for (const char* mode : {"baseline", "anyreduce"}) {
      json& x = b["modes"][mode];
      for (const char* key : {"stepUs", "computeUs", "commOnlyUs", "perAllReduceUs"}) {
        double sum = 0;
        for (const json& r : ranks) {
          sum += r.at("batches")[bi].at("modes").at(mode).at(key).get<double>();
        }
        x[key] = sum / nranks;
      }
      const double step = x["stepUs"], comp = x["computeUs"];
      x["exposedCommUs"] = std::max(0.0, step - comp);
      x["commShare"] = std::max(0.0, step - comp) / step;
      for (const json& p : r0.at("phases")) {
        if (p.at("batch") == b.at("batch") && p.at("mode") == mode) {
          x["power"] = powerOver(ranks, p.at("t0"), p.at("t1"));
        }
      }
    }
    batches.push_back(b);
  }
  m["batches"] = batches;
  json sweep = r0.at("arSweep");
  for (size_t i = 0; i < sweep.size(); ++i) {
    for (const char* key : {"baselineUs", "anyreduceUs"}) {
      double sum = 0;
      for (const json& r : ranks) sum += r.at("arSweep")[i].at(key).get<double>();
      sweep[i][key] = sum / nranks;
    }
  }
  m["arSweep"] = sweep;
  m["counters"] = r0.at("counters");
  return m;
}

std::string verdictText(const json& m) {
  std::ostringstream o;
  const std::string kind = str(m, "kind");
  if (kind == "watch") {
    o << fmt("anyreduce doctor --watch: %.0f s of NVML samples", num(m, "durationS", 0))
      << fmt(" every %.0f ms on ", num(m, "intervalMs", 0)) << m.value("gpus", json::array()).size()
      << " GPU(s).\n";
    o << gpuStarvationWords(m);
    return o.str();
  }
  if (kind != "run") throw std::runtime_error("measurement: 'kind' must be \"run\" or \"watch\"");
  const json& model = m.at("model");
  const int layers = model.at("layers").get<int>();
  o << "anyreduce doctor: preset " << str(model, "preset") << " (" << layers << " layers, hidden "
    << model.at("hidden").get<int>() << (model.value("moe", false) ? ", MoE" : ", dense") << "), "
    << m.at("nranks").get<int>() << " GPUs, per-GPU shapes of a " << model.value("shardAs", 0)
    << "-way tensor-parallel deployment.\n";
  bool allMet = true;
  std::vector<int> missed;
  for (const json& b : m.at("batches")) {
    const int batch = b.at("batch").get<int>();
    const json& base = b.at("modes").at("baseline");
    const json& any = b.at("modes").at("anyreduce");
    const double bs = req(base, "stepUs"), as = req(any, "stepUs");
    const double speedup = bs / as;
    const double savedPerLayer = (bs - as) / layers;
    o << "\nBatch " << batch
      << fmt(" (all-reduce message %.0f KiB): ", num(b, "messageBytes") / 1024);
    o << fmt("communication (all-reduce + residual add + RMSNorm, exposed beyond compute) is "
             "%.1f %% of the baseline decode step",
             100 * num(base, "commShare"))
      << fmt(" (%.0f", num(base, "exposedCommUs")) << fmt(" of %.0f us)", bs)
      << fmt(" and %.1f %% with anyreduce. ", 100 * num(any, "commShare"));
    o << fmt("anyreduce saves %.1f us per layer", savedPerLayer) << " (two all-reduces): step "
      << fmt("%.0f", bs) << fmt(" -> %.0f us, ", as) << fmt("%.2fx faster", speedup);
    const double compute = req(base, "computeUs");
    if (compute > 0) {
      o << fmt(" (if communication cost nothing: %.2fx, step / compute)", bs / compute);
    }
    o << ".\n";
    o << fmt("  Per all-reduce + add + RMSNorm, back to back: baseline %.1f us",
             num(base, "perAllReduceUs"))
      << " (" << str(base, "path") << ")" << fmt(", anyreduce %.1f us", num(any, "perAllReduceUs"))
      << " (" << str(any, "path") << ").\n";
    o << "  Power, baseline: " << powerWords(base.value("power", json())) << ".\n";
    o << "  Power, anyreduce: " << powerWords(any.value("power", json())) << ".\n";
    const json& bp = base.value("power", json());
    if (bp.is_object() && num(bp, "limitW") > 0 && num(bp, "utilMean") >= kBusyUtilPct &&
        num(bp, "meanW") <= kStarvedPowerFraction * num(bp, "limitW")) {
      o << "  Baseline shows the starvation signature: busy by NVML's utilization but drawing "
        << fmt("%.0f %% of the power limit.\n", 100 * num(bp, "meanW") / num(bp, "limitW"));
    }
    if (speedup < 1.3) {
      allMet = false;
      missed.push_back(batch);
    }
  }
  if (m.contains("counters") && m.at("counters").is_object()) {
    const json& c = m.at("counters");
    o << "\nPaths anyreduce dispatched (library counters, per captured call):";
    const json calls = c.value("calls", json::object());
    for (auto& [algo, buckets] : calls.items()) {
      unsigned long long n = 0;
      for (auto& [bk, v] : buckets.items()) n += v.get<unsigned long long>();
      o << " " << algo << " " << n << " calls;";
    }
    o << " fused kernel " << c.value("fusedKernelCalls", 0ull) << ", composed (fallback) "
      << c.value("fusedComposedCalls", 0ull) << ".\n";
  }
  o << "\nTarget (anyreduce step >= 1.3x faster than baseline at every batch): "
    << (allMet ? "met" : "NOT met");
  if (!allMet) {
    o << " (missed at batch";
    for (int b : missed) o << " " << b;
    o << ")";
  }
  o << ".\n";
  return o.str();
}

std::string renderHtml(const json& m) {
  const std::string kind = str(m, "kind");
  std::ostringstream o;
  o << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n"
    << "<title>anyreduce doctor report</title>\n<style>"
    << "body{font-family:sans-serif;max-width:820px;margin:2em auto;color:#222}"
    << "pre{white-space:pre-wrap;background:#f6f6f6;padding:1em}"
    << "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 8px;"
    << "font-size:13px}svg.plot{display:block;margin:1em 0;font-family:sans-serif}"
    << "</style>\n</head>\n<body>\n";
  o << "<h1>anyreduce doctor" << (kind == "watch" ? " (watch)" : "") << "</h1>\n";
  o << "<p>" << esc(str(m, "date")) << " &middot; " << esc(str(m, "host")) << " &middot; "
    << esc(str(m, "command")) << "</p>\n";
  o << "<h2>Verdict</h2>\n<pre>" << esc(verdictText(m)) << "</pre>\n";
  if (kind == "run") {
    const json& model = m.at("model");
    o << "<h2>Model and method</h2>\n<p>" << esc(str(model, "source")) << "</p>\n<p>"
      << esc(str(m, "method")) << "</p>\n";
    o << "<table><tr><th>batch</th><th>mode</th><th>step (us)</th><th>compute (us)</th>"
      << "<th>exposed comm (us)</th><th>comm share</th><th>per all-reduce (us)</th>"
      << "<th>path</th><th>power mean / peak (W)</th><th>SM clock (MHz)</th></tr>";
    for (const json& b : m.at("batches")) {
      for (const char* mode : {"baseline", "anyreduce"}) {
        const json& x = b.at("modes").at(mode);
        const json& p = x.value("power", json::object());
        o << "<tr><td>" << b.at("batch").get<int>() << "</td><td>" << mode << "</td><td>"
          << fmt("%.1f", num(x, "stepUs")) << "</td><td>" << fmt("%.1f", num(x, "computeUs"))
          << "</td><td>" << fmt("%.1f", num(x, "exposedCommUs")) << "</td><td>"
          << fmt("%.1f %%", 100 * num(x, "commShare")) << "</td><td>"
          << fmt("%.2f", num(x, "perAllReduceUs")) << "</td><td>" << esc(str(x, "path"))
          << "</td><td>" << fmt("%.0f", num(p, "meanW")) << " / " << fmt("%.0f", num(p, "peakW"))
          << "</td><td>" << fmt("%.0f", num(p, "smMHzMean")) << "</td></tr>";
      }
    }
    o << "</table>\n<h2>Step-time breakdown</h2>\n" << breakdownChart(m) << "\n";
    std::vector<Series> lat;
    Series base{"baseline: NCCL all-reduce + add+RMSNorm kernel", kPalette[1], {}, {}};
    std::map<std::string, Series> byPath;
    for (const json& s : m.value("arSweep", json::array())) {
      base.pts.push_back({num(s, "bytes"), num(s, "baselineUs")});
      const std::string path = "anyreduce: " + str(s, "path");
      if (!byPath.count(path)) {
        byPath[path] = Series{path, kPalette[(2 + byPath.size()) % 8], {}, {}};
      }
      byPath[path].pts.push_back({num(s, "bytes"), num(s, "anyreduceUs")});
      byPath[path].pointLabels.push_back(std::to_string(s.value("tokens", 0)) + " tokens");
    }
    lat.push_back(base);
    for (auto& [k, v] : byPath) lat.push_back(v);
    o << "<h2>All-reduce + add + RMSNorm latency by message size</h2>\n"
      << lineChart("All-reduce + residual + RMSNorm latency per call", "message bytes",
                   "us per call", lat, true)
      << "\n";
    o << "<h2>Library counters (rank 0)</h2>\n" << countersTable(m.value("counters", json()));
  } else {
    o << "<h2>GPUs</h2>\n<pre>" << esc(gpuStarvationWords(m)) << "</pre>\n";
  }
  o << "<h2>Power, SM clock and utilization over time</h2>\n" << timeCharts(m) << "\n";
  o << "</body>\n</html>\n";
  return o.str();
}

bool parseDuration(const std::string& s, double* seconds) {
  if (s.empty()) return false;
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(s, &pos);
  } catch (...) {
    return false;
  }
  const std::string unit = s.substr(pos);
  if (v <= 0 || !std::isfinite(v)) return false;
  if (unit.empty() || unit == "s") {
    *seconds = v;
  } else if (unit == "ms") {
    *seconds = v / 1000;
  } else if (unit == "m" || unit == "min") {
    *seconds = v * 60;
  } else {
    return false;
  }
  return true;
}

}  // namespace doctor
}  // namespace anyr
