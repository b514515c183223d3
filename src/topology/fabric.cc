// The fabric record (topology/fabric.h): combining the ranks' rows, applying the record to a
// topology, its summary and its JSON.
#include "topology/fabric.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/error.h"
#include "base/json_text.h"

namespace anyr {

using nlohmann::json;

namespace {

// A figure as measured: finite and positive, else unmeasured (-1).
double sane(double x) { return std::isfinite(x) && x > 0 ? x : -1.0; }

std::string whyOf(const FabricRow& row) {
  return std::string(row.why, strnlen(row.why, FabricRow::kWhyBytes));
}

// The worst rank's figure under load: the least (bandwidth) or the greatest (time); unmeasured
// where any rank did not measure it. With `zeroIsNone` a rank's 0 means it had nothing to
// measure (the island figure of an island of one): that rank does not count.
double worst(const std::vector<FabricRow>& rows, double FabricRow::*field, bool least,
             bool zeroIsNone = false) {
  double w = -1;
  for (const FabricRow& row : rows) {
    if (zeroIsNone && row.*field == 0) continue;
    const double x = sane(row.*field);
    if (x < 0) return -1;
    if (w < 0 || (least ? x < w : x > w)) w = x;
  }
  return w;
}

// The ranks whose step failed (status or hostStatus): the first that failed on its own (kFailed,
// or a status no rank writes), the first whose wait failed; -1 where none did.
struct Failures {
  int own = -1, waited = -1;
};
Failures failuresOf(const std::vector<FabricRow>& rows, int32_t FabricRow::*status) {
  Failures f;
  for (size_t i = 0; i < rows.size(); ++i) {
    const int32_t st = rows[i].*status;
    if (st == FabricRow::kOk) continue;
    if (st == FabricRow::kWaitFailed) {
      if (f.waited < 0) f.waited = static_cast<int>(i);
    } else if (f.own < 0) {
      f.own = static_cast<int>(i);
    }
  }
  return f;
}

std::string fmt(double x, int digits) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(digits);
  os << x;
  return os.str();
}

// "a-b unit" over the measured off-diagonal entries of `m`, "-" when none.
std::string range(const FabricRecord& r, const std::vector<double>& m, int digits,
                  const char* unit) {
  double lo = -1, hi = -1;
  for (int s = 0; s < r.ranks; ++s) {
    for (int d = 0; d < r.ranks; ++d) {
      const double x = s == d ? -1 : r.at(m, s, d);
      if (x <= 0) continue;
      lo = lo < 0 ? x : std::min(lo, x);
      hi = std::max(hi, x);
    }
  }
  if (lo < 0) return "-";
  const std::string a = fmt(lo, digits), b = fmt(hi, digits);
  return (a == b ? a : a + "-" + b) + " " + unit;
}

json matrixToJson(const FabricRecord& r, const std::vector<double>& m) {
  json rows = json::array();
  for (int s = 0; s < r.ranks; ++s) {
    json row = json::array();
    for (int d = 0; d < r.ranks; ++d) row.push_back(sane(r.at(m, s, d)));
    rows.push_back(row);
  }
  return rows;
}

[[noreturn]] void bad(const std::string& where, const std::string& rule) {
  throwError(anyrInvalidArgument, "fabric record: " + where + ": " + rule);
}

const json& need(const json& j, const char* key, const char* where) {
  auto it = j.find(key);
  if (it == j.end()) bad(std::string(where) + "." + key, "missing");
  return *it;
}

double needFigure(const json& v, const std::string& where) {
  const char* rule = "must be a number > 0, or -1 when not measured";
  if (!v.is_number()) bad(where, rule);
  const double x = v.get<double>();
  if (!std::isfinite(x) || (x <= 0 && x != -1.0)) bad(where, rule);
  return x;
}

std::vector<double> matrixFromJson(const json& j, const char* key, int n) {
  const std::string where = std::string("fabric.") + key;
  const json& m = need(j, key, "fabric");
  const std::string shape = "must be " + std::to_string(n) + " rows of " + std::to_string(n);
  if (!m.is_array() || m.size() != static_cast<size_t>(n)) bad(where, shape);
  std::vector<double> out(static_cast<size_t>(n) * static_cast<size_t>(n), -1.0);
  for (int s = 0; s < n; ++s) {
    const json& row = m[static_cast<size_t>(s)];
    if (!row.is_array() || row.size() != static_cast<size_t>(n)) bad(where, shape);
    for (int d = 0; d < n; ++d) {
      const std::string at = where + "[" + std::to_string(s) + "][" + std::to_string(d) + "]";
      const double x = needFigure(row[static_cast<size_t>(d)], at);
      if (s == d && x != -1.0) bad(at, "must be -1 (a rank with itself is not measured)");
      out[static_cast<size_t>(s * n + d)] = x;
    }
  }
  return out;
}

}  // namespace

FabricRow emptyFabricRow() {
  FabricRow row;
  std::memset(&row, 0, sizeof(row));
  row.status = FabricRow::kOk;
  row.peer = -1;
  for (int p = 0; p < kMaxLocalRanks; ++p) {
    row.writeGBps[p] = row.readGBps[p] = row.latencyUs[p] = -1;
  }
  row.allToAllGBps = row.ringGBps = row.syncUs = row.hopUs = row.islandGBps = -1;
  row.ringCopyGBps = -1;
  row.hostGBps = row.hostStepUs = -1;
  row.hostStatus = FabricRow::kOk;
  row.hostPeer = -1;
  return row;
}

void failFabricRow(FabricRow* row, const std::string& why, int peer) {
  if (row->status != FabricRow::kOk) return;
  row->status = peer >= 0 ? FabricRow::kWaitFailed : FabricRow::kFailed;
  row->peer = peer;
  std::snprintf(row->why, sizeof(row->why), "%s", why.c_str());
}

void failFabricHost(FabricRow* row, const std::string& why, int peer) {
  if (row->hostStatus != FabricRow::kOk) return;
  row->hostStatus = peer >= 0 ? FabricRow::kWaitFailed : FabricRow::kFailed;
  row->hostPeer = peer;
  row->hostGBps = row->hostStepUs = -1;
  std::snprintf(row->hostWhy, sizeof(row->hostWhy), "%s", why.c_str());
}

const char* fabricStateName(FabricRecord::State s) {
  switch (s) {
    case FabricRecord::State::Off:
      return "off";
    case FabricRecord::State::NotMeasured:
      return "not measured";
    case FabricRecord::State::Measured:
      return "measured";
    case FabricRecord::State::Cached:
      return "cached";
  }
  return "?";
}

FabricRecord combineFabric(const std::vector<FabricRow>& rows, const std::string& source,
                           const std::string& islands) {
  FabricRecord r;
  const int n = static_cast<int>(rows.size());
  r.ranks = n;
  if (n < 2 || n > kMaxLocalRanks) {
    r.reason = "not measured: " + std::to_string(n) + " rows (2 to " +
               std::to_string(kMaxLocalRanks) + " ranks measure a fabric)";
    return r;
  }
  const Failures failed = failuresOf(rows, &FabricRow::status);
  const int own = failed.own, waited = failed.waited;
  if (own >= 0 || waited >= 0) {
    const int first = own >= 0 ? own : waited;
    r.reason = "not measured: rank " + std::to_string(first) + ": " +
               whyOf(rows[static_cast<size_t>(first)]);
    if (own >= 0 && waited >= 0) {
      r.reason += " (rank " + std::to_string(waited) + ": " +
                  whyOf(rows[static_cast<size_t>(waited)]) + ")";
    }
    return r;
  }
  r.state = FabricRecord::State::Measured;
  r.source = source;
  const size_t cells = static_cast<size_t>(n) * static_cast<size_t>(n);
  r.writeGBps.assign(cells, -1.0);
  r.readGBps.assign(cells, -1.0);
  r.latencyUs.assign(cells, -1.0);
  for (int s = 0; s < n; ++s) {
    const FabricRow& row = rows[static_cast<size_t>(s)];
    r.measureMs = std::max(r.measureMs, std::isfinite(row.elapsedMs) ? row.elapsedMs : 0.0);
    for (int d = 0; d < n; ++d) {
      if (s == d) continue;
      const size_t i = static_cast<size_t>(s * n + d);
      r.writeGBps[i] = sane(row.writeGBps[d]);
      r.readGBps[i] = sane(row.readGBps[d]);
      r.latencyUs[i] = sane(row.latencyUs[d]);
    }
  }
  FabricLoad l;
  l.allToAllGBps = worst(rows, &FabricRow::allToAllGBps, true);
  l.ringGBps = worst(rows, &FabricRow::ringGBps, true);
  l.syncUs = worst(rows, &FabricRow::syncUs, false);
  l.hopUs = worst(rows, &FabricRow::hopUs, false);
  l.islandGBps = worst(rows, &FabricRow::islandGBps, true, true);
  if (l.islandGBps > 0) l.islands = islands;
  l.ringCopyGBps = worst(rows, &FabricRow::ringCopyGBps, true);
  l.hostGBps = worst(rows, &FabricRow::hostGBps, true);
  l.hostStepUs = worst(rows, &FabricRow::hostStepUs, false);
  // The step through the host memory failed somewhere: its figures only are unmeasured, and
  // the reason names the first rank that failed on its own (else the first whose wait failed).
  const Failures host = failuresOf(rows, &FabricRow::hostStatus);
  if (host.own >= 0 || host.waited >= 0) {
    const int first = host.own >= 0 ? host.own : host.waited;
    const FabricRow& fr = rows[static_cast<size_t>(first)];
    l.hostGBps = l.hostStepUs = -1;
    r.reason = "through host memory not measured: rank " + std::to_string(first) + ": " +
               std::string(fr.hostWhy, strnlen(fr.hostWhy, FabricRow::kHostWhyBytes));
  }
  // NCCL's ring hop (FabricLoad::ringHopUs) is not measured: a bare flag passed between our
  // kernels (hopUs) is not NCCL's hop, which the model charges from its own calibration.
  if (l.allToAllGBps > 0 || l.ringGBps > 0 || l.syncUs > 0 || l.hopUs > 0 || l.islandGBps > 0 ||
      l.ringCopyGBps > 0 || l.hostGBps > 0 || l.hostStepUs > 0) {
    l.ranks = n;
    l.source = source;
    r.load = l;
  }
  return r;
}

void applyFabric(const FabricRecord& r, Topology* t) {
  if (!r.applied || !r.hasFigures() || t->size() != r.ranks) return;
  for (int s = 0; s < r.ranks; ++s) {
    for (int d = 0; d < r.ranks; ++d) {
      if (s == d) continue;
      PairInfo& p = t->pair(s, d);
      if (r.at(r.writeGBps, s, d) > 0) p.writeGBps = r.at(r.writeGBps, s, d);
      if (r.at(r.readGBps, s, d) > 0) p.readGBps = r.at(r.readGBps, s, d);
      if (r.at(r.latencyUs, s, d) > 0) p.latencyUs = r.at(r.latencyUs, s, d);
    }
  }
  if (r.load.known()) {
    t->load = r.load;
    if (r.state == FabricRecord::State::Cached) t->load.source += ", cached in " + r.cachedIn;
  }
}

void clearFabricFigures(Topology* t) {
  for (PairInfo& p : t->pairs) p.writeGBps = p.readGBps = p.latencyUs = -1;
  t->load = FabricLoad{};
}

std::string fabricSummary(const FabricRecord& r) {
  using S = FabricRecord::State;
  if (r.state == S::Off) return "off (ANYR_FABRIC=off): nominal link figures and the seed decide";
  if (r.state == S::NotMeasured) {
    return (r.reason.empty() ? std::string("not measured") : r.reason) +
           "; nominal link figures and the seed decide";
  }
  std::ostringstream os;
  if (r.state == S::Measured) {
    os << r.source << " in " << fmt(r.measureMs, 1) << " ms (its slowest rank)";
  } else {
    os << "cached in " << r.cachedIn << " (" << r.source << ", " << fmt(r.measureMs, 1)
       << " ms then; not measured at init)";
  }
  os << ": pairs write " << range(r, r.writeGBps, 1, "GB/s") << ", read "
     << range(r, r.readGBps, 1, "GB/s") << ", latency " << range(r, r.latencyUs, 2, "us");
  if (r.load.known()) {
    const FabricLoad& l = r.load;
    auto f = [](double x, int digits) { return x > 0 ? fmt(x, digits) : std::string("-"); };
    os << "; under load at " << l.ranks << " ranks: all-to-all " << f(l.allToAllGBps, 1)
       << " GB/s per GPU, ring " << f(l.ringGBps, 1) << " GB/s, synchronisation round "
       << f(l.syncUs, 2) << " us, one-partner round " << f(l.hopUs, 2) << " us";
    if (l.islandGBps > 0) {
      os << ", inside each island " << f(l.islandGBps, 1) << " GB/s per GPU"
         << (l.islands.empty() ? "" : " (islands " + l.islands + ")");
    }
    if (l.ringCopyGBps > 0) {
      os << ", the copy engines pulling from the ring neighbour " << f(l.ringCopyGBps, 1)
         << " GB/s per GPU";
    }
    if (l.hostGBps > 0 || l.hostStepUs > 0) {
      os << ", through host memory " << f(l.hostGBps, 1) << " GB/s per GPU and direction, a step "
         << f(l.hostStepUs, 2) << " us";
    }
  } else {
    os << "; under load not measured";
  }
  os << (r.applied ? "; used by admission and the seed" : "");
  if (!r.reason.empty()) os << "; " << r.reason;
  return os.str();
}

std::string fabricToJson(const FabricRecord& r, int indent) {
  json j = json::object();
  j["state"] = fabricStateName(r.state);
  j["ranks"] = r.ranks;
  j["source"] = r.source;
  j["cachedIn"] = r.cachedIn;
  j["reason"] = r.reason;
  j["applied"] = r.applied;
  j["measureMs"] = std::isfinite(r.measureMs) && r.measureMs >= 0 ? r.measureMs : 0.0;
  if (r.hasFigures()) {
    j["writeGBps"] = matrixToJson(r, r.writeGBps);
    j["readGBps"] = matrixToJson(r, r.readGBps);
    j["latencyUs"] = matrixToJson(r, r.latencyUs);
    json l = nullptr;
    if (r.load.known()) {
      l = {{"ranks", r.load.ranks},
           {"allToAllGBps", sane(r.load.allToAllGBps)},
           {"ringGBps", sane(r.load.ringGBps)},
           {"islandGBps", sane(r.load.islandGBps)},
           {"syncUs", sane(r.load.syncUs)},
           {"ringHopUs", sane(r.load.ringHopUs)},
           {"hopUs", sane(r.load.hopUs)},
           {"source", r.load.source}};
      if (!r.load.islands.empty()) l["islands"] = r.load.islands;
      if (r.load.ringCopyGBps > 0) l["ringCopyGBps"] = r.load.ringCopyGBps;
      if (r.load.hostGBps > 0) l["hostGBps"] = r.load.hostGBps;
      if (r.load.hostStepUs > 0) l["hostStepUs"] = r.load.hostStepUs;
    }
    j["load"] = l;
  }
  j["summary"] = fabricSummary(r);
  return jsonText(j, indent);
}

FabricRecord fabricFromJson(const std::string& text) {
  const json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) bad("document", "must be a JSON object");
  static const char* const kKeys[] = {"state",    "ranks",     "source",    "cachedIn",
                                      "reason",   "applied",   "measureMs", "writeGBps",
                                      "readGBps", "latencyUs", "load",      "summary"};
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (std::find_if(std::begin(kKeys), std::end(kKeys),
                     [&](const char* k) { return it.key() == k; }) == std::end(kKeys)) {
      bad("fabric." + it.key(), "unknown field");
    }
  }
  FabricRecord r;
  r.state = FabricRecord::State::Cached;
  const json& ranks = need(j, "ranks", "fabric");
  if (!ranks.is_number_integer() || ranks.get<int64_t>() < 2 ||
      ranks.get<int64_t>() > kMaxLocalRanks) {
    bad("fabric.ranks", "must be an integer in 2.." + std::to_string(kMaxLocalRanks));
  }
  r.ranks = static_cast<int>(ranks.get<int64_t>());
  const json& source = need(j, "source", "fabric");
  if (!source.is_string()) bad("fabric.source", "must be a string");
  r.source = source.get<std::string>();
  if (j.contains("cachedIn")) {
    if (!j["cachedIn"].is_string()) bad("fabric.cachedIn", "must be a string");
    r.cachedIn = j["cachedIn"].get<std::string>();
  }
  const json& ms = need(j, "measureMs", "fabric");
  if (!ms.is_number() || !std::isfinite(ms.get<double>()) || ms.get<double>() < 0) {
    bad("fabric.measureMs", "must be a number >= 0");
  }
  r.measureMs = ms.get<double>();
  r.writeGBps = matrixFromJson(j, "writeGBps", r.ranks);
  r.readGBps = matrixFromJson(j, "readGBps", r.ranks);
  r.latencyUs = matrixFromJson(j, "latencyUs", r.ranks);
  const json& l = need(j, "load", "fabric");
  if (!l.is_null()) {
    if (!l.is_object()) bad("fabric.load", "must be an object or null");
    const json& lr = need(l, "ranks", "fabric.load");
    if (!lr.is_number_integer() || lr.get<int64_t>() != r.ranks) {
      bad("fabric.load.ranks", "must be the record's ranks, " + std::to_string(r.ranks));
    }
    r.load.ranks = r.ranks;
    r.load.allToAllGBps =
        needFigure(need(l, "allToAllGBps", "fabric.load"), "fabric.load.allToAllGBps");
    r.load.ringGBps = needFigure(need(l, "ringGBps", "fabric.load"), "fabric.load.ringGBps");
    r.load.islandGBps = needFigure(need(l, "islandGBps", "fabric.load"), "fabric.load.islandGBps");
    r.load.syncUs = needFigure(need(l, "syncUs", "fabric.load"), "fabric.load.syncUs");
    r.load.ringHopUs = needFigure(need(l, "ringHopUs", "fabric.load"), "fabric.load.ringHopUs");
    // A record cached before the one-partner round was measured has none: not measured.
    if (l.contains("hopUs")) r.load.hopUs = needFigure(l["hopUs"], "fabric.load.hopUs");
    // The islands the island figure was measured over; a record without them measured none.
    if (l.contains("islands")) {
      if (!l["islands"].is_string()) bad("fabric.load.islands", "must be a string");
      r.load.islands = l["islands"].get<std::string>();
    }
    // A record cached before the copy engines' pull was measured has none: not measured.
    if (l.contains("ringCopyGBps")) {
      r.load.ringCopyGBps = needFigure(l["ringCopyGBps"], "fabric.load.ringCopyGBps");
    }
    // A record cached before the host memory was measured has neither: not measured.
    if (l.contains("hostGBps")) r.load.hostGBps = needFigure(l["hostGBps"], "fabric.load.hostGBps");
    if (l.contains("hostStepUs")) {
      r.load.hostStepUs = needFigure(l["hostStepUs"], "fabric.load.hostStepUs");
    }
    const json& ls = need(l, "source", "fabric.load");
    if (!ls.is_string()) bad("fabric.load.source", "must be a string");
    r.load.source = ls.get<std::string>();
  }
  return r;
}

uint64_t fabricHash(const FabricRecord& r) {
  const std::string text = fabricToJson(r, -1);
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace anyr
