// Verdict and HTML report from a doctor measurement (JSON). No CUDA, no NVML: runs anywhere.
// What a person reads first is made here once (summarize) and printed by both the terminal
// verdict and the report: the verdict in one sentence with its numbers, what to do, the target
// in words; then the plots and the details.
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

// A share in words: "18%", "5.2%".
std::string pct(double fraction) {
  const double v = 100 * fraction;
  return fmt(std::fabs(v) >= 9.95 ? "%.0f%%" : "%.1f%%", v);
}

// A time in words: "1.5 ms", "19 us", "5.1 us".
std::string dur(double us) {
  if (std::fabs(us) >= 999.5) return fmt("%.1f ms", us / 1000);
  return fmt(std::fabs(us) >= 9.95 ? "%.0f us" : "%.1f us", us);
}

std::string sizeWords(double bytes) {
  if (bytes >= 1048576) return fmt("%.3g MiB", bytes / 1048576);
  if (bytes >= 1024) return fmt("%.3g KiB", bytes / 1024);
  return fmt("%.0f B", bytes);
}

// "1", "1 and 8", "1, 8 and 32".
std::string listWords(const std::vector<std::string>& items) {
  std::string o;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) o += i + 1 == items.size() ? " and " : ", ";
    o += items[i];
  }
  return o;
}

// Width of a line of text in the report's sans-serif font, an upper estimate (DejaVu Sans, the
// widest of the usual ones, averages about 0.6 em per character): labels are placed so that
// these boxes do not overlap, and the page's own check confirms it as rendered.
double textWidth(const std::string& s, double fontSize) {
  size_t chars = 0;
  for (unsigned char c : s) chars += (c & 0xC0) != 0x80;  // UTF-8 lead bytes
  return 0.62 * fontSize * static_cast<double>(chars);
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

// Colours: the baseline is red and anyreduce blue everywhere in the report.
constexpr const char* kBaseColor = "#d62728";
constexpr const char* kAnyColor = "#1f77b4";
constexpr const char* kComputeColor = "#a9bfd4";
const char* kPalette[] = {"#1f77b4", "#9467bd", "#2ca02c", "#ff7f0e",
                          "#17becf", "#8c564b", "#e377c2", "#7f7f7f"};

// ---- Charts (inline SVG) ----

struct Series {
  std::string name;
  std::string color;
  std::vector<std::pair<double, double>> pts;
  std::vector<std::string> tips;    // optional, one per point: its tooltip
  std::vector<std::string> labels;  // optional, one per point: drawn next to it
  bool markers = true;
};

// A shaded stretch of the x axis (a phase of the run), labelled in up to two lines when they
// fit, with shorter alternatives when they do not.
struct Band {
  double x0, x1;
  std::string line1, line2, short1, short2, tip;
};

struct Chart {
  std::string title;
  std::string xLabel, yLabel, ySuffix;
  bool logX = false;                      // log2 x axis (batches, message sizes)
  std::vector<double> xTicks;             // ticks at these x (the data); empty: round values
  std::vector<std::string> xTickLabels;   // one per tick
  std::vector<std::string> xTickLabels2;  // optional second line under each
  std::vector<Series> series;
  std::vector<Band> bands;
  struct RefLine {
    double y;
    std::string name, color, dash;  // named in the legend
  };
  std::vector<RefLine> refLines;
};

double niceStep(double range, int ticks) {
  const double raw = range / ticks;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (raw <= m * mag) return m * mag;
  }
  return 10 * mag;
}

std::string svgOpen(double w, double h, const std::string& title) {
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"plot\" width=\"" << w << "\" height=\""
    << h << "\" viewBox=\"0 0 " << w << " " << h << "\" role=\"img\"><title>" << esc(title)
    << "</title><text x=\"" << w / 2
    << "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\" font-weight=\"bold\">" << esc(title)
    << "</text>";
  return o.str();
}

std::string textAt(double x, double y, double size, const char* anchor, const std::string& s,
                   const std::string& extra = "") {
  std::ostringstream o;
  o << "<text x=\"" << x << "\" y=\"" << y << "\" font-size=\"" << size << "\" text-anchor=\""
    << anchor << "\"" << extra << ">" << esc(s) << "</text>";
  return o.str();
}

struct LegendEntry {
  std::string name, color;
  std::string dash;  // "": a filled square; else a line with this stroke-dasharray
};

// Legend entries flowing left to right, wrapped to the width; returns the rows used.
int legend(std::ostringstream& o, const std::vector<LegendEntry>& entries, double x0, double x1,
           double y, bool draw) {
  double x = x0;
  int rows = entries.empty() ? 0 : 1;
  for (const LegendEntry& e : entries) {
    const double swatch = e.dash.empty() ? 10 : 22;
    const double w = swatch + 4 + textWidth(e.name, 12) + 22;
    if (x > x0 && x + w > x1) {
      x = x0;
      ++rows;
      y += 18;
    }
    if (draw && e.dash.empty()) {
      o << "<rect x=\"" << x << "\" y=\"" << y - 10 << "\" width=\"10\" height=\"10\" fill=\""
        << e.color << "\"/>";
    } else if (draw) {
      o << "<line x1=\"" << x << "\" y1=\"" << y - 5 << "\" x2=\"" << x + swatch << "\" y2=\""
        << y - 5 << "\" stroke=\"" << e.color << "\" stroke-width=\"2\" stroke-dasharray=\""
        << e.dash << "\"/>";
    }
    if (draw) o << textAt(x + swatch + 4, y, 12, "start", e.name);
    x += w;
  }
  return rows;
}

std::string renderChart(const Chart& c) {
  const double W = 900, L = 72, R = 30, T = 44, plotH = 230;
  const double y0 = T + plotH;  // the x axis
  const bool twoLineTicks = !c.xTickLabels2.empty();
  const double xLabelY = y0 + (twoLineTicks ? 50 : 36);
  std::vector<LegendEntry> entries;
  for (const Series& s : c.series) entries.push_back({s.name, s.color, ""});
  for (const Chart::RefLine& r : c.refLines) entries.push_back({r.name, r.color, r.dash});
  std::ostringstream dummy;
  const int legendRows = legend(dummy, entries, L, W - R, 0, false);
  const double legendY = xLabelY + 24;
  const double H = legendY + 18.0 * std::max(0, legendRows - 1) + 12;

  auto xv = [&](double x) { return c.logX ? std::log2(x) : x; };
  double x0 = 1e300, x1 = -1e300, yMax = 0;
  bool anyLabel = false;
  for (const Series& s : c.series) {
    for (auto [x, y] : s.pts) {
      if (c.logX && x <= 0) continue;
      x0 = std::min(x0, xv(x));
      x1 = std::max(x1, xv(x));
      yMax = std::max(yMax, y);
    }
    anyLabel = anyLabel || !s.labels.empty();
  }
  for (const Chart::RefLine& r : c.refLines) yMax = std::max(yMax, r.y);
  std::ostringstream o;
  o << svgOpen(W, H, c.title);
  if (x0 > x1) {
    o << textAt(W / 2, (T + y0) / 2, 13, "middle", "no data") << "</svg>";
    return o.str();
  }
  if (c.logX) {
    // Room on both sides for the labels of the first and last points.
    const double pad = x1 - x0 < 1e-9 ? 1.0 : std::max(0.35, 0.05 * (x1 - x0));
    x0 -= pad;
    x1 += pad;
  } else if (x1 - x0 < 1e-12) {
    x0 -= 1;
    x1 += 1;
  }
  if (yMax <= 0) yMax = 1;
  if (anyLabel) yMax *= 1.18;  // room above the highest point for its label
  const double yStep = niceStep(yMax, 5);
  const double y1 = std::ceil(yMax / yStep - 1e-9) * yStep;
  auto px = [&](double v) { return L + (v - x0) / (x1 - x0) * (W - L - R); };
  // With point labels, value 0 sits a label's height above the x axis, so that a label
  // under a point near 0 stays clear of the axis.
  const double zeroY = y0 - (anyLabel ? 20 : 0);
  // With phase bands, their labels get the top of the plot to themselves.
  const double topY = T + (c.bands.empty() ? 0 : 26);
  auto py = [&](double y) { return zeroY - y / y1 * (zeroY - topY); };

  for (const Band& b : c.bands) {
    const double bx0 = px(b.x0), bx1 = px(b.x1), bw = std::max(0.5, bx1 - bx0);
    o << "<rect x=\"" << bx0 << "\" y=\"" << T << "\" width=\"" << bw << "\" height=\"" << plotH
      << "\" fill=\"#eef3f9\"><title>" << esc(b.tip) << "</title></rect>";
    const double fs = 9.5, room = bw - 4;
    std::string l1 = b.line1, l2 = b.line2;
    if (textWidth(l1, fs) > room || textWidth(l2, fs) > room) {
      l1 = b.short1;
      l2 = b.short2;
    }
    if (textWidth(l1, fs) <= room && textWidth(l2, fs) <= room) {
      o << textAt((bx0 + bx1) / 2, T + 11, fs, "middle", l1, " fill=\"#555\"");
      if (!l2.empty()) o << textAt((bx0 + bx1) / 2, T + 22, fs, "middle", l2, " fill=\"#555\"");
    }
  }
  // Axes, y grid and ticks.
  o << "<line x1=\"" << L << "\" y1=\"" << y0 << "\" x2=\"" << W - R << "\" y2=\"" << y0
    << "\" stroke=\"#333\"/><line x1=\"" << L << "\" y1=\"" << T << "\" x2=\"" << L << "\" y2=\""
    << y0 << "\" stroke=\"#333\"/>";
  for (double y = 0; y <= y1 + 1e-9 * y1; y += yStep) {
    o << "<line x1=\"" << L - 4 << "\" y1=\"" << py(y) << "\" x2=\"" << W - R << "\" y2=\"" << py(y)
      << "\" stroke=\"#e3e3e3\"/>" << textAt(L - 7, py(y) + 4, 11, "end", fmt("%g", y) + c.ySuffix);
  }
  for (const Chart::RefLine& r : c.refLines) {
    o << "<line x1=\"" << L << "\" y1=\"" << py(r.y) << "\" x2=\"" << W - R << "\" y2=\"" << py(r.y)
      << "\" stroke=\"" << r.color << "\" stroke-width=\"1.5\" stroke-dasharray=\"" << r.dash
      << "\"/>";
  }
  // x ticks: at the data when given, else round values; a tick's label is left out where it
  // would run into the previous one (the tick itself stays).
  std::vector<double> ticks = c.xTicks;
  std::vector<std::string> tickLabels = c.xTickLabels, tickLabels2 = c.xTickLabels2;
  if (ticks.empty()) {
    const double step = niceStep(x1 - x0, 8);
    for (double x = std::ceil(x0 / step) * step; x <= x1 + 1e-9; x += step) {
      ticks.push_back(x);
      tickLabels.push_back(fmt("%g", x));
    }
  }
  double lastRight = -1e300;
  for (size_t i = 0; i < ticks.size(); ++i) {
    if (c.logX && ticks[i] <= 0) continue;
    const double x = px(xv(ticks[i]));
    o << "<line x1=\"" << x << "\" y1=\"" << y0 << "\" x2=\"" << x << "\" y2=\"" << y0 + 5
      << "\" stroke=\"#333\"/>";
    const std::string l1 = i < tickLabels.size() ? tickLabels[i] : "";
    const std::string l2 = i < tickLabels2.size() ? tickLabels2[i] : "";
    const double half = std::max(textWidth(l1, 11), textWidth(l2, 10)) / 2;
    if (x - half < lastRight + 6) continue;
    lastRight = x + half;
    o << textAt(x, y0 + 17, 11, "middle", l1);
    if (!l2.empty()) o << textAt(x, y0 + 31, 10, "middle", l2, " fill=\"#555\"");
  }
  o << textAt((L + W - R) / 2, xLabelY, 12, "middle", c.xLabel);
  const double ym = (T + y0) / 2;
  o << textAt(18, ym, 12, "middle", c.yLabel,
              " transform=\"rotate(-90 18 " + fmt("%g", ym) + ")\"");

  // Series, then the point labels: at each x the highest point's label goes above it and the
  // others below theirs, pushed apart so that no two touch.
  struct Label {
    double x, pointY, y;
    std::string text, color;
  };
  std::map<double, std::vector<Label>> labelsAt;
  for (const Series& s : c.series) {
    std::ostringstream pts;
    for (auto [x, y] : s.pts) {
      if (c.logX && x <= 0) continue;
      pts << px(xv(x)) << "," << py(y) << " ";
    }
    o << "<polyline fill=\"none\" stroke=\"" << s.color << "\" stroke-width=\"2\" points=\""
      << pts.str() << "\"/>";
    for (size_t i = 0; i < s.pts.size(); ++i) {
      auto [x, y] = s.pts[i];
      if (c.logX && x <= 0) continue;
      if (s.markers && s.pts.size() <= 60) {
        o << "<circle cx=\"" << px(xv(x)) << "\" cy=\"" << py(y) << "\" r=\"3.5\" fill=\""
          << s.color << "\"><title>" << esc(s.name) << ": "
          << esc(i < s.tips.size() ? s.tips[i] : fmt("%.2f", y)) << "</title></circle>";
      }
      if (i < s.labels.size() && !s.labels[i].empty()) {
        labelsAt[x].push_back({px(xv(x)), py(y), 0, s.labels[i], s.color});
      }
    }
  }
  for (auto& [x, labels] : labelsAt) {
    std::sort(labels.begin(), labels.end(),
              [](const Label& a, const Label& b) { return a.pointY < b.pointY; });
    for (size_t i = 0; i < labels.size(); ++i) {
      labels[i].y = i == 0 ? labels[i].pointY - 9 : labels[i].pointY + 17;
      if (i > 0) labels[i].y = std::max(labels[i].y, labels[i - 1].y + 15);
    }
    const double over = labels.back().y - (y0 - 3);
    if (over > 0) {
      for (Label& l : labels) l.y -= over;
    }
    const double under = (T + 12) - labels.front().y;
    if (under > 0) {
      for (Label& l : labels) l.y += under;
    }
    for (const Label& l : labels) {
      o << textAt(l.x, l.y, 11, "middle", l.text,
                  std::string(" fill=\"") + l.color + "\" font-weight=\"bold\"");
    }
  }
  legend(o, entries, L, W - R, legendY, true);
  o << "</svg>";
  return o.str();
}

// ---- The measurement, per batch ----

struct BatchFigures {
  int batch = 0;
  double bytes = 0;
  double baseStep = 0, anyStep = 0, baseCompute = 0, anyCompute = 0;
  double baseShare = 0, anyShare = 0;  // exposed communication / step
  double saved = 0;                    // per step, us (negative: anyreduce is slower)
  double savedPerLayer = 0, savedFraction = 0, speedup = 0;
  double bound = 0;  // step / compute: the speed-up if communication took no time
  double basePerCall = -1, anyPerCall = -1;
  std::string basePath, anyPath;
  json basePower, anyPower;
  bool baseStarved = false;
};

bool starvedMode(const json& p) {
  return p.is_object() && num(p, "limitW") > 0 && num(p, "utilMean") >= kBusyUtilPct &&
         num(p, "meanW") >= 0 && num(p, "meanW") <= kStarvedPowerFraction * num(p, "limitW");
}

std::vector<BatchFigures> batchFigures(const json& m) {
  const int layers = m.at("model").at("layers").get<int>();
  if (layers <= 0) throw std::runtime_error("measurement: 'layers' must be positive");
  std::vector<BatchFigures> out;
  for (const json& b : m.at("batches")) {
    BatchFigures f;
    f.batch = b.at("batch").get<int>();
    f.bytes = num(b, "messageBytes", 0);
    const json& base = b.at("modes").at("baseline");
    const json& any = b.at("modes").at("anyreduce");
    f.baseStep = req(base, "stepUs");
    f.anyStep = req(any, "stepUs");
    f.baseCompute = req(base, "computeUs");
    f.anyCompute = num(any, "computeUs", f.baseCompute);
    if (f.baseStep <= 0 || f.anyStep <= 0) {
      throw std::runtime_error("measurement: 'stepUs' must be positive");
    }
    f.baseShare = std::max(0.0, f.baseStep - f.baseCompute) / f.baseStep;
    f.anyShare = std::max(0.0, f.anyStep - f.anyCompute) / f.anyStep;
    f.saved = f.baseStep - f.anyStep;
    f.savedPerLayer = f.saved / layers;
    f.savedFraction = f.saved / f.baseStep;
    f.speedup = f.baseStep / f.anyStep;
    f.bound = f.baseCompute > 0 ? f.baseStep / f.baseCompute : 0;
    f.basePerCall = num(base, "perAllReduceUs");
    f.anyPerCall = num(any, "perAllReduceUs");
    f.basePath = str(base, "path");
    f.anyPath = str(any, "path");
    f.basePower = base.value("power", json());
    f.anyPower = any.value("power", json());
    f.baseStarved = starvedMode(f.basePower);
    out.push_back(f);
  }
  if (out.empty()) throw std::runtime_error("measurement: 'batches' is empty");
  return out;
}

std::string batchList(const std::vector<BatchFigures>& figs, const std::vector<size_t>& idx) {
  std::vector<std::string> items;
  for (size_t i : idx) items.push_back(std::to_string(figs[i].batch));
  return listWords(items);
}

// The command to measure again: the preset and batches of this run (dimension overrides are
// not recorded, so a preset is the honest way to say "the same model").
std::string doctorCommand(const json& m, const std::vector<BatchFigures>& figs) {
  std::string cmd =
      "anyreduce doctor --preset " + str(m.at("model"), "preset", "glm") + " --batch ";
  for (size_t i = 0; i < figs.size(); ++i) cmd += (i ? "," : "") + std::to_string(figs[i].batch);
  return cmd;
}

std::string setting(const json& m, const char* name) {
  const json s = m.value("settings", json::object());
  return s.is_object() ? str(s, name) : "";
}

}  // namespace

std::string withoutLocalPaths(const std::string& s) {
  auto isPath = [](const std::string& w) {
    if (w.size() < 2 || w.find("://") != std::string::npos) return false;
    if (w[0] == '/' || w.rfind("~/", 0) == 0 || w.rfind("./", 0) == 0 || w.rfind("../", 0) == 0) {
      return true;
    }
    const size_t slash = w.rfind('/');
    return slash != std::string::npos && w.find('.', slash) != std::string::npos;
  };
  auto lastPart = [](std::string w) {
    while (w.size() > 1 && w.back() == '/') w.pop_back();
    const size_t slash = w.rfind('/');
    return slash == std::string::npos || slash + 1 == w.size() ? w : w.substr(slash + 1);
  };
  std::string out, word;
  auto flush = [&]() {
    // Quotes around a word stay; "--json=/x/y.json" keeps its "--json=".
    size_t lead = 0;
    while (lead < word.size() && (word[lead] == '\'' || word[lead] == '"')) ++lead;
    size_t trail = word.size();
    while (trail > lead && (word[trail - 1] == '\'' || word[trail - 1] == '"')) --trail;
    std::string core = word.substr(lead, trail - lead), prefix;
    const size_t eq = core.find('=');
    if (eq != std::string::npos && core.substr(0, eq).find('/') == std::string::npos) {
      prefix = core.substr(0, eq + 1);
      core = core.substr(eq + 1);
    }
    if (isPath(core)) core = lastPart(core);
    out += word.substr(0, lead) + prefix + core + word.substr(trail);
    word.clear();
  };
  for (char c : s) {
    if (c == ' ' || c == '\t' || c == '\n') {
      flush();
      out += c;
    } else {
      word += c;
    }
  }
  flush();
  return out;
}

namespace {

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

namespace {

// Shell lines with their "# ..." comments aligned in one column.
std::vector<std::string> aligned(const std::vector<std::pair<std::string, std::string>>& lines) {
  size_t width = 0;
  for (const auto& [cmd, comment] : lines) {
    if (!comment.empty()) width = std::max(width, cmd.size());
  }
  std::vector<std::string> out;
  for (const auto& [cmd, comment] : lines) {
    out.push_back(
        comment.empty() ? cmd : cmd + std::string(width - cmd.size() + 2, ' ') + "# " + comment);
  }
  return out;
}

Summary summarizeRun(const json& m) {
  const std::vector<BatchFigures> figs = batchFigures(m);
  const json& model = m.at("model");
  const int nranks = m.value("nranks", 0);
  const int shardAs = model.value("shardAs", nranks);
  Summary s;
  // The headline batch: where communication weighs most.
  size_t h = 0;
  for (size_t i = 1; i < figs.size(); ++i) {
    if (figs[i].baseShare > figs[h].baseShare) h = i;
  }
  const BatchFigures& hf = figs[h];
  std::vector<size_t> faster, slower, outOfReach, inReach;
  bool met = true;
  for (size_t i = 0; i < figs.size(); ++i) {
    (figs[i].saved > 0 ? faster : slower).push_back(i);
    (figs[i].bound < kTargetSpeedup ? outOfReach : inReach).push_back(i);
    met = met && figs[i].speedup >= kTargetSpeedup;
  }
  auto savesWords = [](const BatchFigures& f) {
    return f.saved >= 0 ? "saves " + dur(f.savedPerLayer) + " per layer"
                        : "is " + dur(-f.savedPerLayer) +
                              " per layer slower than NCCL and the separate kernel";
  };
  s.headline = "Communication is " + pct(hf.baseShare) + " of a decode step at batch " +
               std::to_string(hf.batch) + "; anyreduce's fused path " + savesWords(hf) + ", " +
               pct(std::fabs(hf.savedFraction)) + " of the step.";

  for (size_t i = 0; i < figs.size(); ++i) {
    if (i == h) continue;
    const BatchFigures& f = figs[i];
    s.findings.push_back("Batch " + std::to_string(f.batch) + ": communication is " +
                         pct(f.baseShare) + " of the step; the fused path " + savesWords(f) + " (" +
                         pct(std::fabs(f.savedFraction)) + " of the step).");
  }
  if (hf.basePerCall > 0 && hf.anyPerCall > 0) {
    s.findings.push_back("One all-reduce + residual add + RMSNorm (two per layer) at batch " +
                         std::to_string(hf.batch) + ": " + fmt("%.1f us", hf.basePerCall) +
                         " with NCCL and the separate kernel, " + fmt("%.1f us", hf.anyPerCall) +
                         " with anyreduce's " + (hf.anyPath.empty() ? "call" : hf.anyPath) + ".");
  }
  std::vector<size_t> starved;
  double lo = 1e300, hi = -1, limit = -1;
  for (size_t i = 0; i < figs.size(); ++i) {
    const json& p = figs[i].basePower;
    if (figs[i].baseStarved) starved.push_back(i);
    if (p.is_object() && num(p, "meanW") >= 0 && num(p, "limitW") > 0) {
      lo = std::min(lo, num(p, "meanW") / num(p, "limitW"));
      hi = std::max(hi, num(p, "meanW") / num(p, "limitW"));
      limit = num(p, "limitW");
    }
  }
  if (!starved.empty()) {
    const BatchFigures& f = figs[hf.baseStarved ? h : starved[0]];
    const json &bp = f.basePower, &ap = f.anyPower;
    std::string w = "The baseline looks starved: NVML counts its GPUs " +
                    fmt("%.0f%% busy", num(bp, "utilMean")) + " while they draw " +
                    fmt("%.0f W", num(bp, "meanW")) + ", " +
                    pct(num(bp, "meanW") / num(bp, "limitW")) +
                    fmt(" of the %.0f W limit", num(bp, "limitW")) + " (batch " +
                    batchList(figs, starved) + ")";
    if (ap.is_object() && num(ap, "meanW") >= 0) {
      w += fmt("; with the fused path, %.0f W", num(ap, "meanW"));
    }
    s.findings.push_back(w + ".");
  } else if (hi >= 0) {
    s.findings.push_back("No starvation signature: the baseline's GPUs drew " +
                         (pct(hi) == pct(lo) ? pct(hi) : pct(lo) + "-" + pct(hi)) +
                         fmt(" of their %.0f W power limit.", limit));
  }

  // The target, in words, and what this run says about it.
  std::vector<std::string> speedups, bounds, computeShares, reachBounds;
  for (const BatchFigures& f : figs) {
    speedups.push_back(fmt("%.2fx", f.speedup) + " at batch " + std::to_string(f.batch));
  }
  for (size_t i : outOfReach) {
    bounds.push_back(fmt("%.2fx", figs[i].bound));
    computeShares.push_back(pct(1 - figs[i].baseShare));
  }
  for (size_t i : inReach) reachBounds.push_back(fmt("%.2fx", figs[i].bound));
  s.target = fmt("Target: a decode step at least %.1fx faster than the baseline", kTargetSpeedup) +
             " (NCCL's all-reduce, then a separate add + RMSNorm kernel: what servers run "
             "today) at every batch, that is " +
             pct(1 - 1 / kTargetSpeedup) + " less time per generated token. " +
             (met ? "Met: " : "Not met: ") + listWords(speedups) + ".";
  if (!met) {
    if (inReach.empty()) {
      s.target +=
          " Out of reach for this model on these GPUs: even if communication took no "
          "time, the step would be at most " +
          listWords(bounds) + " faster, because compute is " + listWords(computeShares) + " of it.";
    } else if (!outOfReach.empty()) {
      s.target += " Out of reach at batch " + batchList(figs, outOfReach) +
                  ", where even communication that took no time would give at most " +
                  listWords(bounds) + "; within reach at batch " + batchList(figs, inReach) +
                  " (up to " + listWords(reachBounds) + ").";
    } else {
      size_t w = 0;
      for (size_t i = 1; i < figs.size(); ++i) {
        if (figs[i].anyShare > figs[w].anyShare) w = i;
      }
      s.target += " Within reach at every batch (up to " + listWords(reachBounds) +
                  " if communication took no time): with anyreduce, communication is still " +
                  pct(figs[w].anyShare) + " of the step at batch " + std::to_string(figs[w].batch) +
                  ".";
    }
  }

  // What to do, in order of payoff.
  if (!faster.empty()) {
    const size_t a = hf.saved > 0 ? h : faster[0];
    const BatchFigures& f = figs[a];
    Action act;
    act.what = "Use anyreduce's fused all-reduce + residual add + RMSNorm in your server";
    act.why =
        "It replaces NCCL's all-reduce and the separate add + RMSNorm kernel with one "
        "kernel. At batch " +
        std::to_string(f.batch) + " it takes communication from " + pct(f.baseShare) + " to " +
        pct(f.anyShare) + " of the step and saves " + dur(f.saved) + " per decode step (" +
        pct(f.savedFraction) + ").";
    if (!slower.empty()) {
      act.why += " At batch " + batchList(figs, slower) + " it is slower: see below.";
    }
    act.commands = {
        "# vLLM / SGLang: pip install ./python; export ANYREDUCE=1 (the plugins; the fused",
        "# path's conditions: docs/INTEGRATION.md, door 2). In PyTorch, per all-reduce + norm:",
        "torch.ops.anyreduce.fused_add_rms_norm_inplace(x, residual, weight, eps, comm.op_handle)"};
    s.actions.push_back(act);
  } else {
    s.actions.push_back({"Keep NCCL and the separate add + RMSNorm kernel for now",
                         "The fused path is slower at every batch measured (" +
                             dur(-hf.savedPerLayer) + " per layer at batch " +
                             std::to_string(hf.batch) + "): find out why before using it.",
                         {}});
  }

  const json counters = m.value("counters", json::object());
  const double composed = counters.is_object() ? num(counters, "fusedComposedCalls", 0) : 0;
  const double fusedCalls = counters.is_object() ? num(counters, "fusedKernelCalls", 0) : 0;
  std::vector<std::string> composedTokens, slowerTokens;
  double composedFrom = -1;
  for (const json& p : m.value("arSweep", json::array())) {
    const std::string tokens = std::to_string(p.value("tokens", 0));
    if (str(p, "path").find("composed") != std::string::npos) {
      composedTokens.push_back(tokens);
      if (composedFrom < 0) composedFrom = num(p, "bytes", 0);
    }
    if (num(p, "anyreduceUs") > 0 && num(p, "baselineUs") > 0 &&
        num(p, "anyreduceUs") > num(p, "baselineUs")) {
      slowerTokens.push_back(tokens);
    }
  }
  const std::string tuning = setting(m, "ANYR_TUNING_FILE");
  if (composed > 0 || !composedTokens.empty() || !slowerTokens.empty() || !slower.empty()) {
    Action act;
    std::string why;
    if (composed > 0 || !composedTokens.empty()) {
      why += composed > 0 ? fmt("%.0f", composed) + " of " + fmt("%.0f", composed + fusedCalls) +
                                " fused calls (" + pct(composed / (composed + fusedCalls)) + ")"
                          : std::string("Some fused calls");
      why += " ran as an all-reduce followed by the separate kernel";
      if (!composedTokens.empty()) {
        why += " (in the size sweep: " + listWords(composedTokens) + " tokens, from " +
               sizeWords(composedFrom) + ")";
      }
      why += tuning.empty() ? ": the built-in seed's choice for those sizes, not a measurement "
                              "of this machine."
                            : ".";
    }
    if (!slowerTokens.empty()) {
      why += std::string(why.empty() ? "" : " ") + "At " + listWords(slowerTokens) +
             " tokens anyreduce's call is slower than NCCL and the separate kernel.";
    }
    if (!slower.empty()) {
      why += std::string(why.empty() ? "" : " ") + "At batch " + batchList(figs, slower) +
             " the whole step is slower with the fused path.";
    }
    if (tuning.empty()) {
      act.what = "Measure anyreduce's choices on this machine, and use them";
      act.why = why;
      act.commands = aligned(
          {{"anyreduce tune -o tuning.json", "every path at every size"},
           {"export ANYR_TUNING_FILE=$PWD/tuning.json", "here and in your server's environment"},
           {doctorCommand(m, figs), "measure again, with the table"}});
    } else {
      act.what = "Check what anyreduce dispatches at those sizes";
      act.why = why + " The tuning table " + withoutLocalPaths(tuning) + " was in use.";
      act.commands = aligned(
          {{"anyreduce bench --check-dispatch", "the dispatched path against every candidate"},
           {"anyreduce explain", "what is admitted and chosen per size, and why"}});
    }
    s.actions.push_back(act);
  }
  if (!met && !outOfReach.empty() && shardAs > 0 && shardAs < 8) {
    Action act;
    act.what = "If you serve this model on more GPUs, measure with their per-GPU shapes";
    double cLo = 1, cHi = 0;
    for (size_t i : outOfReach) {
      cLo = std::min(cLo, 1 - figs[i].baseShare);
      cHi = std::max(cHi, 1 - figs[i].baseShare);
    }
    const std::string share = shardAs == 2   ? "half"
                              : shardAs == 4 ? "a quarter"
                                             : "1/" + std::to_string(shardAs);
    act.why = "Here each GPU computes " + share + " of the model, so compute is " +
              (pct(cLo) == pct(cHi) ? pct(cLo) : pct(cLo) + "-" + pct(cHi)) +
              " of the step. Served over 8 GPUs, each computes " + fmt("%g", 8.0 / shardAs) +
              " times less and communication weighs more: --shard-as 8 gives each GPU those "
              "shapes (the all-reduce stays over the " +
              std::to_string(nranks) + " GPUs present).";
    act.commands = {doctorCommand(m, figs) + " --shard-as 8"};
    s.actions.push_back(act);
  }
  return s;
}

struct GpuWatch {
  int index = 0;
  std::string name;
  double limitW = -1;
  Starvation st;
  double busyMeanW = -1;
};

std::vector<GpuWatch> watchFigures(const json& m) {
  const json& gpus = m.value("gpus", json::array());
  std::vector<GpuWatch> out;
  int i = 0;
  for (const json& g : m.value("samples", json::array())) {
    GpuWatch w;
    w.index = g.value("gpu", i++);
    for (const json& d : gpus) {
      if (d.value("index", -2) == w.index) {
        w.limitW = num(d, "powerLimitW");
        w.name = str(d, "name");
      }
    }
    w.st = starvation(g, w.limitW);
    double sum = 0;
    int n = 0;
    for (size_t k = 0; k < g.at("t").size(); ++k) {
      const double p = g.at("powerW")[k], u = g.at("util")[k];
      if (p < 0 || u < kBusyUtilPct) continue;
      sum += p;
      ++n;
    }
    if (n > 0) w.busyMeanW = sum / n;
    out.push_back(w);
  }
  return out;
}

Summary summarizeWatch(const json& m) {
  const std::vector<GpuWatch> gpus = watchFigures(m);
  const std::string span = fmt("%.0f s", num(m, "durationS", 0));
  Summary s;
  std::vector<std::string> flagged;
  std::vector<const GpuWatch*> flaggedGpus;
  double worst = 0;
  bool busy = false;
  for (const GpuWatch& g : gpus) {
    busy = busy || g.st.busy > 0;
    worst = std::max(worst, g.st.fraction);
    if (g.st.flagged) {
      flagged.push_back(std::to_string(g.index));
      flaggedGpus.push_back(&g);
    }
  }
  const std::string limitPct = fmt("%.0f%%", 100 * kStarvedPowerFraction);
  if (!flagged.empty()) {
    // The power each starved GPU drew while NVML counted it busy, as a share of its limit.
    std::vector<std::string> shares;
    for (const GpuWatch* g : flaggedGpus) {
      shares.push_back(g->limitW > 0 && g->busyMeanW >= 0 ? pct(g->busyMeanW / g->limitW) : "?");
    }
    const GpuWatch& g = *flaggedGpus[0];
    if (flagged.size() == 1) {
      s.headline = "GPU " + flagged[0] + " of " + std::to_string(gpus.size()) +
                   " looks starved: busy by NVML, yet drawing " + fmt("%.0f W, ", g.busyMeanW) +
                   shares[0] + fmt(" of its %.0f W power limit.", g.limitW);
    } else {
      s.headline = "GPUs " + listWords(flagged) + " of " + std::to_string(gpus.size()) +
                   " look starved: busy by NVML, yet drawing " + listWords(shares) +
                   " of their power limit.";
    }
  } else if (busy) {
    s.headline = "No GPU shows the starvation signature over the " + span + " watch: at most " +
                 pct(worst) + " of the busy samples drew " + limitPct +
                 " of the power limit or less (the signature needs 30%).";
  } else {
    s.headline = "The GPUs were mostly idle during the " + span +
                 " watch: too little load to judge starvation.";
  }
  std::istringstream words(gpuStarvationWords(m));
  for (std::string line; std::getline(words, line);) {
    if (!line.empty()) s.findings.push_back(line);
  }
  const std::string measure = "anyreduce doctor --preset glm --batch 1,8,32";
  if (!flagged.empty()) {
    s.actions.push_back(
        {"Measure how much of a decode step is communication on these GPUs",
         "A GPU waiting for its peers inside a kernel counts as busy but draws little power. The "
         "doctor measures communication's share of a decode step of a model like yours, and "
         "what anyreduce's fused path saves.",
         aligned({{measure, "anyreduce doctor --help lists the presets"}})});
  } else if (busy) {
    s.actions.push_back({"Nothing to change for starvation",
                         "To see communication's share of a decode step all the same:",
                         {measure}});
  } else {
    s.actions.push_back({"Watch again while your server is decoding",
                         "Starvation shows only under load.",
                         {"anyreduce doctor --watch 30s"}});
  }
  return s;
}

}  // namespace

Summary summarize(const json& m) {
  const std::string kind = str(m, "kind");
  if (kind == "watch") return summarizeWatch(m);
  if (kind != "run") throw std::runtime_error("measurement: 'kind' must be \"run\" or \"watch\"");
  return summarizeRun(m);
}

std::string verdictText(const json& m) {
  const Summary s = summarize(m);
  std::ostringstream o;
  o << s.headline << "\n";
  for (const std::string& f : s.findings) o << "  " << f << "\n";
  if (!s.target.empty()) o << "\n" << s.target << "\n";
  o << "\nWhat to do:\n";
  for (size_t i = 0; i < s.actions.size(); ++i) {
    const Action& a = s.actions[i];
    o << "  " << i + 1 << ". " << a.what << ". " << a.why << "\n";
    for (const std::string& c : a.commands) o << "       " << c << "\n";
  }
  if (str(m, "kind") != "run") return o.str();

  const json& model = m.at("model");
  const int layers = model.at("layers").get<int>();
  o << "\nThe figures: preset " << str(model, "preset") << " (" << layers << " layers, hidden "
    << model.at("hidden").get<int>() << (model.value("moe", false) ? ", MoE" : ", dense") << "), "
    << m.at("nranks").get<int>() << " GPUs, per-GPU shapes of a " << model.value("shardAs", 0)
    << "-way tensor-parallel deployment.\n";
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
    if (starvedMode(bp)) {
      o << "  Baseline shows the starvation signature: busy by NVML's utilization but drawing "
        << fmt("%.0f %% of the power limit.\n", 100 * num(bp, "meanW") / num(bp, "limitW"));
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
  return o.str();
}

namespace {

// Communication's share of the step by batch (log axis, a tick at every batch measured), both
// modes, each point labelled with its share.
std::string shareChart(const std::vector<BatchFigures>& figs) {
  Chart c;
  c.title = "Communication's share of a decode step, by batch";
  c.xLabel = "batch (tokens per decode step)";
  c.yLabel = "% of the step";
  c.ySuffix = "%";
  c.logX = true;
  Series base{"baseline: NCCL all-reduce, then the add + RMSNorm kernel", kBaseColor, {}, {}, {}};
  Series any{"anyreduce: fused all-reduce + add + RMSNorm", kAnyColor, {}, {}, {}};
  for (const BatchFigures& f : figs) {
    c.xTicks.push_back(f.batch);
    c.xTickLabels.push_back(std::to_string(f.batch));
    base.pts.push_back({static_cast<double>(f.batch), 100 * f.baseShare});
    any.pts.push_back({static_cast<double>(f.batch), 100 * f.anyShare});
    base.labels.push_back(pct(f.baseShare));
    any.labels.push_back(pct(f.anyShare));
    base.tips.push_back(pct(f.baseShare) + " of " + dur(f.baseStep) + " at batch " +
                        std::to_string(f.batch));
    any.tips.push_back(pct(f.anyShare) + " of " + dur(f.anyStep) + " at batch " +
                       std::to_string(f.batch));
  }
  c.series = {base, any};
  return renderChart(c);
}

// Where each step's time goes, as shares of that step: communication first (from 0, so the
// bars compare), then compute; the times beside each bar.
std::string breakdownChart(const std::vector<BatchFigures>& figs) {
  const double W = 900, L = 180, R = 200, T = 50, rowH = 22, gap = 12;
  const double barW = W - L - R;
  const double y0 = T + figs.size() * (2 * rowH + gap);
  const double H = y0 + 62;
  std::ostringstream o;
  o << svgOpen(W, H, "Where a decode step's time goes (share of each step)");
  for (int q = 0; q <= 4; ++q) {
    const double x = L + barW * q / 4;
    o << "<line x1=\"" << x << "\" y1=\"" << T - 4 << "\" x2=\"" << x << "\" y2=\"" << y0
      << "\" stroke=\"#e3e3e3\"/>" << textAt(x, y0 + 16, 11, "middle", fmt("%.0f%%", 25.0 * q));
  }
  for (size_t i = 0; i < figs.size(); ++i) {
    const BatchFigures& f = figs[i];
    const double gy = T + i * (2 * rowH + gap);
    o << textAt(12, gy + rowH + 4, 12, "start", "batch " + std::to_string(f.batch),
                " font-weight=\"bold\"");
    for (int r = 0; r < 2; ++r) {
      const bool base = r == 0;
      const double step = base ? f.baseStep : f.anyStep;
      const double share = base ? f.baseShare : f.anyShare;
      const double y = gy + r * rowH;
      const double commW = barW * share;
      o << textAt(L - 8, y + 15, 11, "end", base ? "NCCL + kernel" : "anyreduce fused");
      o << "<rect x=\"" << L << "\" y=\"" << y + 3 << "\" width=\"" << commW << "\" height=\""
        << rowH - 6 << "\" fill=\"" << (base ? kBaseColor : kAnyColor) << "\"><title>communication "
        << dur(step * share) << ", " << pct(share) << "</title></rect>";
      o << "<rect x=\"" << L + commW << "\" y=\"" << y + 3 << "\" width=\"" << barW - commW
        << "\" height=\"" << rowH - 6 << "\" fill=\"" << kComputeColor << "\"><title>compute "
        << dur(step * (1 - share)) << "</title></rect>";
      o << textAt(L + barW + 8, y + 15, 11, "start",
                  pct(share) + ": " + dur(step * share) + " of " + dur(step));
    }
  }
  o << textAt(L + barW / 2, y0 + 34, 12, "middle", "share of the decode step");
  const double ly = y0 + 54;
  o << "<rect x=\"" << L << "\" y=\"" << ly - 10 << "\" width=\"10\" height=\"10\" fill=\""
    << kBaseColor << "\"/><rect x=\"" << L + 12 << "\" y=\"" << ly - 10
    << "\" width=\"10\" height=\"10\" fill=\"" << kAnyColor << "\"/>"
    << textAt(L + 26, ly, 12, "start", "communication beyond compute (all-reduce + add + RMSNorm)")
    << "<rect x=\"" << L + 420 << "\" y=\"" << ly - 10 << "\" width=\"10\" height=\"10\" fill=\""
    << kComputeColor << "\"/>" << textAt(L + 434, ly, 12, "start", "compute");
  o << "</svg>";
  return o.str();
}

// One communication block's latency by batch size (log axis, a tick at every size measured,
// labelled with tokens and message size): the baseline and anyreduce, one series per path.
std::string latencyChart(const json& m) {
  Chart c;
  c.title = "All-reduce + residual + RMSNorm latency per call";
  c.xLabel = "tokens in the batch, and the all-reduce message";
  c.yLabel = "us per call";
  c.logX = true;
  Series base{"baseline: NCCL + add+RMSNorm kernel", kBaseColor, {}, {}, {}};
  std::map<std::string, Series> byPath;
  std::vector<std::string> order;
  for (const json& s : m.value("arSweep", json::array())) {
    const double tokens = s.value("tokens", 0);
    if (tokens <= 0) continue;
    const std::string tip = fmt("%.0f tokens", tokens) + ", " + sizeWords(num(s, "bytes", 0));
    c.xTicks.push_back(tokens);
    c.xTickLabels.push_back(fmt("%.0f", tokens));
    c.xTickLabels2.push_back(sizeWords(num(s, "bytes", 0)));
    base.pts.push_back({tokens, num(s, "baselineUs")});
    base.tips.push_back(fmt("%.1f us at ", num(s, "baselineUs")) + tip);
    const std::string path = "anyreduce: " + str(s, "path");
    if (!byPath.count(path)) {
      byPath[path] = Series{path, kPalette[order.size() % 8], {}, {}, {}};
      order.push_back(path);
    }
    byPath[path].pts.push_back({tokens, num(s, "anyreduceUs")});
    byPath[path].tips.push_back(fmt("%.1f us at ", num(s, "anyreduceUs")) + tip);
  }
  c.series.push_back(base);
  for (const std::string& p : order) c.series.push_back(byPath[p]);
  return renderChart(c);
}

// Power, SM clock and utilization over time from per-GPU sample arrays, the run's phases
// shaded.
std::string timeCharts(const json& m) {
  Chart power, clock, util;
  power.title = "Power draw over time";
  clock.title = "SM clock over time";
  util.title = "GPU utilization over time (NVML: share of time a kernel ran)";
  for (Chart* c : {&power, &clock, &util}) c->xLabel = "time (s)";
  power.yLabel = "W";
  clock.yLabel = "MHz";
  util.yLabel = "%";
  for (const json& p : m.value("phases", json::array())) {
    const std::string mode = str(p, "mode");
    const std::string batch = std::to_string(p.value("batch", 0));
    const Band b{num(p, "t0", 0),
                 num(p, "t1", 0),
                 "batch " + batch,
                 mode,
                 "b" + batch,
                 mode == "baseline" ? "base" : mode == "anyreduce" ? "any" : mode.substr(0, 4),
                 str(p, "label")};
    for (Chart* c : {&power, &clock, &util}) c->bands.push_back(b);
  }
  const json& gpus = m.value("gpus", json::array());
  // The power limit and the starvation threshold, where every GPU has the same limit.
  double limit = -1;
  for (const json& g : gpus) {
    const double l = num(g, "powerLimitW");
    limit = limit == -1 || limit == l ? l : -2;
  }
  if (limit > 0) {
    power.refLines.push_back({limit, fmt("power limit (%.0f W)", limit), "#555", "6 4"});
    power.refLines.push_back({kStarvedPowerFraction * limit,
                              fmt("%.0f%% of the limit: busy below it is the starvation signature",
                                  100 * kStarvedPowerFraction),
                              kBaseColor, "2 3"});
  }
  int i = 0;
  for (const json& g : m.value("samples", json::array())) {
    const int idx = g.value("gpu", i);
    std::string name = "GPU " + std::to_string(idx);
    for (const json& d : gpus) {
      if (d.value("index", -2) == idx && !str(d, "name").empty())
        name += " (" + str(d, "name") + ")";
    }
    const char* color = kPalette[(i * 3) % 8];
    Series p{name, color, {}, {}, {}, false}, k{name, color, {}, {}, {}, false},
        u{name, color, {}, {}, {}, false};
    const json& t = g.at("t");
    for (size_t s = 0; s < t.size(); ++s) {
      const double ts = t[s].get<double>();
      if (g.at("powerW")[s].get<double>() >= 0) p.pts.push_back({ts, g.at("powerW")[s]});
      if (g.at("smMHz")[s].get<double>() >= 0) k.pts.push_back({ts, g.at("smMHz")[s]});
      if (g.at("util")[s].get<double>() >= 0) u.pts.push_back({ts, g.at("util")[s]});
    }
    power.series.push_back(p);
    clock.series.push_back(k);
    util.series.push_back(u);
    ++i;
  }
  return renderChart(power) + renderChart(clock) + renderChart(util);
}

// The page's check of itself, as rendered (see renderHtml in doctor.h). It uses no '<', so
// that the report stays parseable by the simplest tag scanner.
const char* kCheckScript = R"JS(
(function () {
  var body = document.body, overlaps = 0, clipped = 0;
  function box(e) { return e.getBoundingClientRect(); }
  function apart(p, q) {
    return p.left + 0.5 >= q.right || q.left + 0.5 >= p.right ||
           p.top + 0.5 >= q.bottom || q.top + 0.5 >= p.bottom;
  }
  Array.prototype.forEach.call(document.querySelectorAll('svg.plot'), function (svg) {
    var frame = box(svg), seen = [];
    Array.prototype.forEach.call(svg.querySelectorAll('text'), function (t) {
      var r = box(t);
      if (r.width === 0 || r.height === 0) return;
      if (frame.left > r.left + 0.5 || r.right > frame.right + 0.5 ||
          frame.top > r.top + 0.5 || r.bottom > frame.bottom + 0.5) {
        clipped += 1;
        console.error('report check: label cut off: "' + t.textContent + '"');
      }
      seen.forEach(function (o) {
        if (!apart(o.r, r)) {
          overlaps += 1;
          console.error('report check: labels overlap: "' + o.t.textContent + '" and "' +
                        t.textContent + '"');
        }
      });
      seen.push({t: t, r: r});
    });
  });
  var h = window.innerHeight, verdict = document.getElementById('verdict');
  var todo = document.querySelector('#todo li');
  body.setAttribute('data-label-overlaps', String(overlaps));
  body.setAttribute('data-labels-clipped', String(clipped));
  body.setAttribute('data-verdict-in-view', verdict && h >= box(verdict).bottom ? 'yes' : 'no');
  body.setAttribute('data-todo-in-view', todo && h >= box(todo).bottom ? 'yes' : 'no');
  body.setAttribute('data-check', 'ok');
})();
)JS";

const char* kStyle =
    "body{font-family:'DejaVu Sans',Verdana,system-ui,sans-serif;max-width:940px;"
    "margin:18px auto 40px;padding:0 20px;color:#1b1b1b;line-height:1.4;font-size:15px}"
    ".context{color:#555;font-size:13px;margin:0 0 6px}"
    ".note{color:#8a4b00;font-size:13px;margin:0 0 6px}"
    "h1#verdict{font-size:25px;line-height:1.3;margin:4px 0 8px}"
    "ul.findings{margin:0 0 12px;padding-left:20px;color:#333;font-size:14px}"
    "ul.findings li{margin:2px 0}"
    "#todo{background:#f2f6fb;border-left:4px solid #1f77b4;padding:6px 16px 8px;margin:0 0 18px}"
    "#todo h2{margin:4px 0 6px;font-size:19px}"
    "#todo ol{margin:0;padding-left:22px}#todo li{margin:0 0 8px}#todo li p{margin:0 0 3px}"
    "pre.cmd{background:#fff;border:1px solid #d3dce6;padding:5px 9px;margin:3px 0 0;"
    "font-size:12.5px;white-space:pre-wrap;overflow-wrap:anywhere}"
    "p.target{margin:8px 0 2px;font-size:14px}"
    "h2{font-size:20px;margin:26px 0 6px}"
    "svg.plot{display:block;margin:6px 0 14px;max-width:100%;height:auto;"
    "font-family:'DejaVu Sans',Verdana,sans-serif}"
    "table{border-collapse:collapse;margin:6px 0}td,th{border:1px solid #ccc;padding:2px 7px;"
    "font-size:13px}pre.verdict{white-space:pre-wrap;background:#f6f6f6;padding:10px;"
    "font-size:12.5px}code{font-size:13px}";

std::string modelWords(const json& m) {
  const json& model = m.at("model");
  return "preset " + str(model, "preset") + " (" + std::to_string(model.value("layers", 0)) +
         " layers, hidden " + std::to_string(model.value("hidden", 0)) +
         (model.value("moe", false) ? ", MoE)" : ")");
}

// "2 x NVIDIA H200" (or the names one by one when they differ).
std::string gpuWords(const json& m) {
  std::map<std::string, int> names;
  std::vector<std::string> order;
  for (const json& g : m.value("gpus", json::array())) {
    const std::string n = str(g, "name", "GPU");
    if (names[n]++ == 0) order.push_back(n);
  }
  std::vector<std::string> parts;
  for (const std::string& n : order) parts.push_back(std::to_string(names[n]) + " \xC3\x97 " + n);
  return listWords(parts);
}

void actionsHtml(std::ostringstream& o, const Summary& s) {
  o << "<section id=\"todo\">\n<h2>What to do</h2>\n<ol>\n";
  for (const Action& a : s.actions) {
    o << "<li><p><b>" << esc(a.what) << ".</b> " << esc(a.why) << "</p>";
    if (!a.commands.empty()) {
      o << "<pre class=\"cmd\">";
      for (size_t i = 0; i < a.commands.size(); ++i) o << (i ? "\n" : "") << esc(a.commands[i]);
      o << "</pre>";
    }
    o << "</li>\n";
  }
  o << "</ol>\n";
  if (!s.target.empty()) {
    // "Target:" in bold, the rest as it is.
    const size_t colon = s.target.find(':');
    o << "<p class=\"target\"><b>" << esc(s.target.substr(0, colon + 1)) << "</b>"
      << esc(s.target.substr(colon + 1)) << "</p>\n";
  }
  o << "</section>\n";
}

std::string runTable(const json& m) {
  std::ostringstream o;
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
  o << "</table>\n";
  return o.str();
}

}  // namespace

std::string renderHtml(const json& m) {
  const std::string kind = str(m, "kind");
  const Summary s = summarize(m);
  std::ostringstream o;
  o << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n"
    << "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"/>\n"
    << "<title>anyreduce doctor: " << esc(s.headline) << "</title>\n<style>" << kStyle
    << "</style>\n</head>\n<body>\n";
  std::string context = "anyreduce doctor";
  if (kind == "run") {
    context += " \xC2\xB7 " + modelWords(m) + " \xC2\xB7 " + gpuWords(m) + ", shapes of a " +
               std::to_string(m.at("model").value("shardAs", 0)) + "-way split";
  } else {
    context += " --watch \xC2\xB7 " + fmt("%.0f s of NVML samples", num(m, "durationS", 0)) +
               fmt(" every %.0f ms", num(m, "intervalMs", 0)) + " \xC2\xB7 " + gpuWords(m);
  }
  if (!str(m, "date").empty()) context += " \xC2\xB7 " + str(m, "date");
  o << "<p class=\"context\">" << esc(context) << "</p>\n";
  if (!str(m, "note").empty()) {
    o << "<p class=\"note\">" << esc(withoutLocalPaths(str(m, "note"))) << "</p>\n";
  }
  o << "<h1 id=\"verdict\">" << esc(s.headline) << "</h1>\n";
  if (!s.findings.empty()) {
    o << "<ul class=\"findings\">\n";
    for (const std::string& f : s.findings) o << "<li>" << esc(f) << "</li>\n";
    o << "</ul>\n";
  }
  actionsHtml(o, s);
  if (kind == "run") {
    const std::vector<BatchFigures> figs = batchFigures(m);
    o << "<h2>Communication by batch</h2>\n"
      << shareChart(figs) << "\n"
      << breakdownChart(figs) << "\n<h2>One all-reduce + residual add + RMSNorm, by size</h2>\n"
      << latencyChart(m) << "\n";
  }
  o << "<h2>Power, SM clock and utilization over time</h2>\n" << timeCharts(m) << "\n";
  o << "<h2>Details</h2>\n";
  if (kind == "run") {
    const json& model = m.at("model");
    o << runTable(m);
    o << "<h3>Paths anyreduce ran (library counters, rank 0)</h3>\n"
      << countersTable(m.value("counters", json())) << "\n";
    o << "<h3>Model and method</h3>\n<p>" << esc(withoutLocalPaths(str(model, "source")))
      << "</p>\n<p>" << esc(withoutLocalPaths(str(m, "method"))) << "</p>\n";
    // The fabric's figures and where they came from (measured at init, cached, or why not).
    const json fabric = m.value("fabric", json());
    if (fabric.is_object() && fabric.contains("summary")) {
      o << "<h3>Fabric (ANYR_FABRIC=" << esc(str(fabric, "mode")) << ")</h3>\n<p>"
        << esc(withoutLocalPaths(str(fabric, "summary"))) << "</p>\n";
    }
  }
  o << "<h3>Run</h3>\n<p>Command: <code>" << esc(withoutLocalPaths(str(m, "command"))) << "</code>";
  const json settings = m.value("settings", json::object());
  if (settings.is_object() && !settings.empty()) {
    o << "; environment:";
    for (auto& [k, v] : settings.items()) {
      o << " <code>" << esc(k) << "="
        << esc(withoutLocalPaths(v.is_string() ? v.get<std::string>() : v.dump())) << "</code>";
    }
  }
  o << ".</p>\n<details><summary>The verdict as the terminal printed it</summary>\n"
    << "<pre class=\"verdict\">" << esc(verdictText(m)) << "</pre></details>\n";
  o << "<script>" << kCheckScript << "</script>\n</body>\n</html>\n";
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
