#include "select/tuning.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/error.h"
#include "base/json_text.h"

#ifndef ANYR_VERSION_STRING
#define ANYR_VERSION_STRING "unknown"
#endif

namespace anyr {

using nlohmann::json;

namespace {

constexpr const char* kFormatName = "anyreduce-tuning";

std::string joinList(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
  return s;
}

[[noreturn]] void bad(const std::string& where, const std::string& rule) {
  throwError(anyrInvalidArgument, "tuning file: " + where + ": " + rule);
}

const json& need(const json& j, const char* key, const std::string& where) {
  if (!j.is_object()) bad(where, "must be an object");
  auto it = j.find(key);
  if (it == j.end()) bad(where + "." + key, "missing");
  return *it;
}

std::string needString(const json& j, const char* key, const std::string& where) {
  const json v = need(j, key, where);
  if (!v.is_string()) bad(where + "." + key, "must be a string");
  return v.get<std::string>();
}

int64_t needInt(const json& j, const char* key, const std::string& where, int64_t lo, int64_t hi) {
  const json v = need(j, key, where);
  if (!v.is_number_integer()) bad(where + "." + key, "must be an integer");
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) {
    bad(where + "." + key, "must be in " + std::to_string(lo) + ".." + std::to_string(hi));
  }
  return x;
}

std::vector<std::string> needStrings(const json& j, const char* key, const std::string& where) {
  const json v = need(j, key, where);
  if (!v.is_array()) bad(where + "." + key, "must be an array of strings");
  std::vector<std::string> out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string())
      bad(where + "." + key + "[" + std::to_string(i) + "]", "must be a string");
    out.push_back(v[i].get<std::string>());
  }
  return out;
}

}  // namespace

bool Fingerprint::operator==(const Fingerprint& o) const {
  return library == o.library && worldSize == o.worldSize && gpus == o.gpus && driver == o.driver &&
         links == o.links && settings == o.settings;
}

std::string Fingerprint::firstDifference(const Fingerprint& mine) const {
  auto diff = [](const char* what, const std::string& file, const std::string& here) {
    return std::string(what) + ": file has '" + file + "', this communicator '" + here + "'";
  };
  if (worldSize != mine.worldSize)
    return diff("world size", std::to_string(worldSize), std::to_string(mine.worldSize));
  if (library != mine.library) return diff("library version", library, mine.library);
  if (gpus != mine.gpus) return diff("GPUs", joinList(gpus), joinList(mine.gpus));
  if (driver != mine.driver) return diff("driver", driver, mine.driver);
  for (size_t i = 0; i < links.size() && i < mine.links.size(); ++i) {
    if (links[i] != mine.links[i]) return diff("link", links[i], mine.links[i]);
  }
  if (links.size() != mine.links.size()) return "link matrix sizes differ";
  if (!settings.empty() && settings != mine.settings) {
    return diff("settings", joinList(settings), joinList(mine.settings));
  }
  return "";
}

Fingerprint fingerprintOf(const Topology& t, int nranks, std::vector<std::string> settings) {
  Fingerprint f;
  f.settings = std::move(settings);
  f.library = ANYR_VERSION_STRING;
  f.worldSize = nranks;
  for (const GpuInfo& g : t.gpus) f.gpus.push_back(g.name);
  f.driver = (t.driverVersion.empty() ? std::string("?") : t.driverVersion) + " / cuda " +
             std::to_string(t.cudaDriverVersion);
  for (int s = 0; s < t.size(); ++s) {
    for (int d = 0; d < t.size(); ++d) {
      if (s == d) continue;
      const PairInfo& p = t.pair(s, d);
      std::ostringstream os;
      os << s << "->" << d << " " << linkTypeName(p.link);
      if (p.nvlinkCount > 0) os << " x" << p.nvlinkCount;
      if (!p.pcieRelation.empty()) os << " " << p.pcieRelation;
      os << " write" << (p.peerWriteOk ? "+" : "-") << " read" << (p.peerReadOk ? "+" : "-");
      f.links.push_back(os.str());
    }
  }
  return f;
}

std::string tuningToJson(const TuningTable& t) {
  json j;
  j["format"] = kFormatName;
  j["version"] = TuningTable::kFormatVersion;
  j["fingerprint"] = {{"library", t.fingerprint.library}, {"worldSize", t.fingerprint.worldSize},
                      {"gpus", t.fingerprint.gpus},       {"driver", t.fingerprint.driver},
                      {"links", t.fingerprint.links},     {"settings", t.fingerprint.settings}};
  j["hidden"] = t.hidden;
  j["method"] = t.method;
  json ops = json::object();
  for (int o = 0; o < kNumOps; ++o) {
    json pts = json::array();
    for (const TunedPoint& p : t.points[static_cast<size_t>(o)]) {
      json times = json::object();
      for (const auto& [name, us] : p.times) times[name] = us;
      pts.push_back({{"bucket", p.bucket},
                     {"bytes", bucketBytes(p.bucket)},
                     {"choice", p.choice},
                     {"timesUs", times}});
    }
    ops[opName(static_cast<Op>(o))] = pts;
  }
  j["ops"] = ops;
  if (t.hasFabric) j["fabric"] = json::parse(fabricToJson(t.fabric, -1));
  return jsonText(j, 2);
}

TuningTable tuningFromJson(const std::string& text) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) bad("document", "not valid JSON (corrupt or truncated)");
  if (!j.is_object()) bad("document", "must be a JSON object");
  if (!j.contains("format") || !j["format"].is_string() || j["format"] != kFormatName) {
    bad("format", std::string("must be \"") + kFormatName + "\" (not a tuning file)");
  }
  needInt(j, "version", "document", TuningTable::kFormatVersion, TuningTable::kFormatVersion);
  TuningTable t;
  const json fp = need(j, "fingerprint", "document");
  t.fingerprint.library = needString(fp, "library", "fingerprint");
  t.fingerprint.worldSize = static_cast<int>(needInt(fp, "worldSize", "fingerprint", 1, 1 << 20));
  t.fingerprint.gpus = needStrings(fp, "gpus", "fingerprint");
  t.fingerprint.driver = needString(fp, "driver", "fingerprint");
  t.fingerprint.links = needStrings(fp, "links", "fingerprint");
  if (fp.contains("settings")) t.fingerprint.settings = needStrings(fp, "settings", "fingerprint");
  t.hidden = static_cast<int>(needInt(j, "hidden", "document", 1, 1 << 20));
  t.method = needString(j, "method", "document");
  const json ops = need(j, "ops", "document");
  if (!ops.is_object()) bad("ops", "must be an object");
  for (auto it = ops.begin(); it != ops.end(); ++it) {
    Op op;
    if (!parseOp(it.key(), &op)) bad("ops." + it.key(), "unknown operation");
    if (!it.value().is_array()) bad("ops." + it.key(), "must be an array");
    for (size_t i = 0; i < it.value().size(); ++i) {
      const std::string where = "ops." + it.key() + "[" + std::to_string(i) + "]";
      const json& pj = it.value()[i];
      TunedPoint p;
      p.bucket = static_cast<int>(needInt(pj, "bucket", where, 0, kNumBuckets - 1));
      p.choice = needString(pj, "choice", where);
      const json times = need(pj, "timesUs", where);
      if (!times.is_object()) bad(where + ".timesUs", "must be an object");
      for (auto tt = times.begin(); tt != times.end(); ++tt) {
        if (!tt.value().is_number()) bad(where + ".timesUs." + tt.key(), "must be a number");
        p.times.emplace_back(tt.key(), tt.value().get<double>());
      }
      t.points[static_cast<size_t>(op)].push_back(p);
    }
  }
  if (j.contains("fabric")) {
    try {
      t.fabric = fabricFromJson(j["fabric"].dump());
    } catch (const Error& e) {
      bad("fabric", e.what());
    }
    t.hasFabric = true;
  }
  return t;
}

void saveTuningFile(const TuningTable& t, const std::string& path) {
  // Write a sibling file, then rename: a reader never sees half a table.
  const std::string tmp = path + ".tmp." + std::to_string(static_cast<long>(::getpid()));
  {
    std::ofstream f(tmp);
    f << tuningToJson(t) << "\n";
    if (!f) throwError(anyrSystemError, "could not write the tuning file " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throwError(anyrSystemError, "could not rename " + tmp + " to " + path);
  }
}

namespace {

// The tuning file at `path`, parsed (tuningFromJson); false with *why where it cannot be read or
// parsed.
bool readTuningFile(const std::string& path, TuningTable* t, std::string* why) {
  std::ifstream f(path);
  if (!f) {
    *why = "cannot read " + path;
    return false;
  }
  std::stringstream ss;
  ss << f.rdbuf();
  try {
    *t = tuningFromJson(ss.str());
    return true;
  } catch (const Error& e) {
    *why = path + ": " + e.what();
    return false;
  }
}

}  // namespace

bool loadTuningFor(const std::string& path, const Fingerprint& mine, TuningTable* out,
                   std::string* why) {
  TuningTable t;
  if (!readTuningFile(path, &t, why)) return false;
  std::string d = t.fingerprint.firstDifference(mine);
  if (!d.empty()) {
    *why = path + " was tuned on another machine or configuration (" + d + ")";
    return false;
  }
  *out = t;
  return true;
}

bool loadFabricFor(const std::string& path, const Fingerprint& mine, FabricRecord* out,
                   std::string* why, bool* present) {
  if (present != nullptr) *present = false;
  TuningTable t;
  if (!readTuningFile(path, &t, why)) return false;
  if (!t.hasFabric) {
    *why = path + " holds no fabric record";
    return false;
  }
  if (present != nullptr) *present = true;
  Fingerprint machine = t.fingerprint;
  machine.settings.clear();  // compared on the machine alone
  Fingerprint here = mine;
  here.settings.clear();
  const std::string d = machine.firstDifference(here);
  if (!d.empty()) {
    *why =
        "the fabric record in " + path + " is stale: made for another machine or world (" + d + ")";
    return false;
  }
  if (t.fabric.ranks != mine.worldSize) {
    *why = "the fabric record in " + path + " holds " + std::to_string(t.fabric.ranks) +
           " ranks, this communicator has " + std::to_string(mine.worldSize);
    return false;
  }
  *out = t.fabric;
  out->state = FabricRecord::State::Cached;
  out->cachedIn = path;
  return true;
}

void applyTuning(const TuningTable& t, const std::array<std::vector<Candidate>, kNumOps>& cands,
                 bool clustersOn, DispatchTable* table, std::vector<std::string>* warnings) {
  for (int o = 0; o < kNumOps; ++o) {
    const Op op = static_cast<Op>(o);
    std::vector<std::pair<int, Path>> measured;
    for (const TunedPoint& p : t.points[static_cast<size_t>(o)]) {
      Path path;
      bool ok = parsePath(op, p.choice, &path);
      const Candidate* c = nullptr;
      for (const Candidate& x : cands[static_cast<size_t>(o)]) {
        if (ok && x.path.sameKernel(path)) c = &x;
      }
      const std::string where =
          std::string(opName(op)) + " bucket " + std::to_string(p.bucket) + ": tuned choice '";
      if (c == nullptr || !c->admitted) {
        warnings->push_back(
            where + p.choice + "' " +
            (c == nullptr ? "is not a known path" : "is not admitted here: " + c->reason) +
            "; the bucket takes the nearest measured choice that is admitted (the seed's if "
            "none is)");
        continue;
      }
      if (path.cluster > 1 && !clustersOn) {
        warnings->push_back(where + p.choice +
                            "' needs thread-block clusters, which are off here; its kernel "
                            "takes the automatic cluster rule");
        path.cluster = 0;
      }
      measured.emplace_back(p.bucket, path);
    }
    if (measured.empty()) continue;
    for (int b = 0; b < kNumBuckets; ++b) {
      int bestDist = 1 << 30;
      Path best{};
      bool exact = false;
      for (const auto& [mb, path] : measured) {
        const int dist = std::abs(mb - b);
        if (dist < bestDist) {  // ties: the smaller bucket (listed first when sorted)
          bestDist = dist;
          best = path;
          exact = dist == 0;
        }
      }
      table->path[static_cast<size_t>(o)][static_cast<size_t>(b)] = best;
      table->source[static_cast<size_t>(o)][static_cast<size_t>(b)] =
          exact ? Source::Measured : Source::NearestMeasured;
    }
  }
}

}  // namespace anyr
