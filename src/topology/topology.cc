// Topology model: link names, pair indexing, the JSON format (dump and strict load) and the
// human-readable tables.
//
// JSON format, version 1 (every field is required; unknown fields are rejected so that a typo
// in a hand-written file is an error, not a silently ignored setting):
//
//   {
//     "format": "anyreduce-topology", "version": 1,
//     "source": "probe", "hostName": "node01", "driverVersion": "580.95.05",
//     "cudaDriverVersion": 13000, "cudaRuntimeVersion": 13000,
//     "gpus": [ { "index": 0, "name": "NVIDIA H200", "pciBusId": "0000:19:00.0",
//                 "uuid": "GPU-...", "hostHash": "9e3779b97f4a7c15", "ccMajor": 9, "ccMinor": 0,
//                 "smCount": 132, "sharedMemPerBlockOptin": 232448, "sharedMemPerSm": 233472,
//                 "clusterLaunch": true, "hostNativeAtomics": false,
//                 "totalMemBytes": 150754820096, "numaNode": 0, "pcieGen": 5, "pcieWidth": 16 },
//               ... ],
//     "pairs": [ { "src": 0, "dst": 1, "link": "nvlink", "nvlinkCount": 18, "linkGBps": 478.125,
//                  "pcieRelation": "system", "driverPeerAccess": true, "driverAtomics": true,
//                  "peerWriteOk": true, "peerReadOk": true, "peerAtomicOk": true,
//                  "writeGBps": 366.2, "readGBps": 333.1, "latencyUs": 1.21 },
//                ... ]   // exactly n*n entries, row-major by src then dst, diagonal "self"
//   }
//
// hostHash is written as 16 hex digits in a string because JSON readers outside C++ (JavaScript,
// jq) lose precision on integers above 2^53. Measurements (linkGBps, writeGBps, readGBps,
// latencyUs) are numbers >= 0, or -1 for "not measured".
#include "topology/topology.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <limits>
#include <nlohmann/json.hpp>
#include <ostream>
#include <set>
#include <sstream>

#include "base/error.h"
#include "base/json_text.h"
#include "base/names.h"

namespace anyr {

using nlohmann::json;

namespace {

constexpr const char* kFormatName = "anyreduce-topology";

const char* const kPcieRelations[] = {"",           "board", "switch", "switches",
                                      "hostbridge", "numa",  "system"};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Link names

namespace {

constexpr Named<LinkType> kLinkTypeNames[] = {{LinkType::Unknown, "unknown"},
                                              {LinkType::Self, "self"},
                                              {LinkType::NVLink, "nvlink"},
                                              {LinkType::PCIe, "pcie"},
                                              {LinkType::None, "none"}};

}  // namespace

const char* linkTypeName(LinkType t) { return nameOf(kLinkTypeNames, t, "unknown"); }

bool parseLinkType(const std::string& s, LinkType* out) {
  std::string lower(s);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  LinkType t{};
  if (!parseName(kLinkTypeNames, lower, &t)) return false;
  if (out != nullptr) *out = t;
  return true;
}

// ---------------------------------------------------------------------------------------------
// Pair indexing

const PairInfo& Topology::pair(int src, int dst) const {
  const int n = size();
  if (src < 0 || src >= n || dst < 0 || dst >= n ||
      pairs.size() != static_cast<size_t>(n) * static_cast<size_t>(n)) {
    throwError(anyrInternalError, "topology: pair(" + std::to_string(src) + ", " +
                                      std::to_string(dst) + ") out of range (" + std::to_string(n) +
                                      " GPUs, " + std::to_string(pairs.size()) + " pairs)");
  }
  return pairs[static_cast<size_t>(src) * static_cast<size_t>(n) + static_cast<size_t>(dst)];
}

PairInfo& Topology::pair(int src, int dst) {
  return const_cast<PairInfo&>(static_cast<const Topology&>(*this).pair(src, dst));
}

void Topology::resizePairs() {
  const int n = size();
  pairs.assign(static_cast<size_t>(n) * static_cast<size_t>(n), PairInfo{});
  for (int s = 0; s < n; ++s) {
    for (int d = 0; d < n; ++d) {
      PairInfo& p = pairs[static_cast<size_t>(s) * static_cast<size_t>(n) + static_cast<size_t>(d)];
      p.src = s;
      p.dst = d;
      if (s == d) p.link = LinkType::Self;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// To JSON

namespace {

std::string hex64(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

json gpuToJson(const GpuInfo& g) {
  json j = json::object();
  j["index"] = g.index;
  j["name"] = g.name;
  j["pciBusId"] = g.pciBusId;
  j["uuid"] = g.uuid;
  j["hostHash"] = hex64(g.hostHash);
  j["ccMajor"] = g.ccMajor;
  j["ccMinor"] = g.ccMinor;
  j["smCount"] = g.smCount;
  j["sharedMemPerBlockOptin"] = g.sharedMemPerBlockOptin;
  j["sharedMemPerSm"] = g.sharedMemPerSm;
  j["clusterLaunch"] = g.clusterLaunch;
  j["hostNativeAtomics"] = g.hostNativeAtomics;
  j["totalMemBytes"] = g.totalMemBytes;
  j["numaNode"] = g.numaNode;
  j["pcieGen"] = g.pcieGen;
  j["pcieWidth"] = g.pcieWidth;
  j["pcieMaxGen"] = g.pcieMaxGen;
  j["pcieMaxWidth"] = g.pcieMaxWidth;
  return j;
}

// Measurements are either >= 0 or "not measured"; every negative value is written as -1 so
// that the file always satisfies the reader's rule. NaN/inf (a division by a zero time) is
// also "not measured".
double measurement(double v) { return (std::isfinite(v) && v >= 0) ? v : -1.0; }

json pairToJson(const PairInfo& p) {
  json j = json::object();
  j["src"] = p.src;
  j["dst"] = p.dst;
  j["link"] = linkTypeName(p.link);
  j["nvlinkCount"] = p.nvlinkCount;
  j["linkGBps"] = measurement(p.linkGBps);
  j["pcieRelation"] = p.pcieRelation;
  j["driverPeerAccess"] = p.driverPeerAccess;
  j["driverAtomics"] = p.driverAtomics;
  j["peerWriteOk"] = p.peerWriteOk;
  j["peerReadOk"] = p.peerReadOk;
  j["peerAtomicOk"] = p.peerAtomicOk;
  j["writeGBps"] = measurement(p.writeGBps);
  j["readGBps"] = measurement(p.readGBps);
  j["latencyUs"] = measurement(p.latencyUs);
  return j;
}

json loadToJson(const FabricLoad& l) {
  json j = json::object();
  j["ranks"] = l.ranks;
  j["allToAllGBps"] = measurement(l.allToAllGBps);
  j["ringGBps"] = measurement(l.ringGBps);
  j["islandGBps"] = measurement(l.islandGBps);
  j["syncUs"] = measurement(l.syncUs);
  j["ringHopUs"] = measurement(l.ringHopUs);
  j["hopUs"] = measurement(l.hopUs);
  if (!l.islands.empty()) j["islands"] = l.islands;
  if (l.ringCopyGBps > 0) j["ringCopyGBps"] = l.ringCopyGBps;
  if (l.hostGBps > 0) j["hostGBps"] = l.hostGBps;
  if (l.hostStepUs > 0) j["hostStepUs"] = l.hostStepUs;
  j["source"] = l.source;
  return j;
}

}  // namespace

std::string topologyToJson(const Topology& t, int indent) {
  json j = json::object();
  j["format"] = kFormatName;
  j["version"] = Topology::kFormatVersion;
  j["source"] = t.source;
  j["hostName"] = t.hostName;
  j["driverVersion"] = t.driverVersion;
  j["cudaDriverVersion"] = t.cudaDriverVersion;
  j["cudaRuntimeVersion"] = t.cudaRuntimeVersion;
  json gpus = json::array();
  for (const GpuInfo& g : t.gpus) gpus.push_back(gpuToJson(g));
  j["gpus"] = std::move(gpus);
  json pairs = json::array();
  for (const PairInfo& p : t.pairs) pairs.push_back(pairToJson(p));
  j["pairs"] = std::move(pairs);
  if (t.load.known()) j["load"] = loadToJson(t.load);
  if (!t.sources.empty()) j["sources"] = t.sources;
  std::string out = jsonText(j, indent);
  out += '\n';
  return out;
}

// ---------------------------------------------------------------------------------------------
// From JSON: a strict reader that names the path of the first bad field.

namespace {

const char* typeName(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::object:
      return "an object";
    case json::value_t::array:
      return "an array";
    case json::value_t::string:
      return "a string";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return "an integer";
    case json::value_t::number_float:
      return "a fractional number";
    case json::value_t::binary:
      return "binary data";
    case json::value_t::discarded:
      return "discarded";
  }
  return "unknown";
}

std::string quoteShort(const std::string& s) {
  std::string q = s.size() > 48 ? s.substr(0, 48) + "..." : s;
  return "\"" + q + "\"";
}

class Reader {
 public:
  explicit Reader(std::string prefix) : prefix_(std::move(prefix)) {}

  [[noreturn]] void fail(const std::string& path, const std::string& rule) const {
    throwError(anyrInvalidArgument, prefix_ + ": " + (path.empty() ? "" : path + ": ") + rule);
  }

  // Checks that `obj` (at `path`) is an object holding exactly `keys`, and perhaps some of
  // `optional` (fields later versions of the format added).
  void requireObject(const json& obj, const std::string& path,
                     std::initializer_list<const char*> keys,
                     std::initializer_list<const char*> optional = {}) const {
    if (!obj.is_object()) fail(path, std::string("must be an object, not ") + typeName(obj));
    for (const char* k : keys) {
      if (!obj.contains(k)) fail(join(path, k), "missing field");
    }
    std::set<std::string> known(keys.begin(), keys.end());
    known.insert(optional.begin(), optional.end());
    for (auto it = obj.begin(); it != obj.end(); ++it) {
      if (known.count(it.key()) == 0) fail(join(path, it.key()), "unknown field");
    }
  }

  static std::string join(const std::string& path, const std::string& key) {
    return path.empty() ? key : path + "." + key;
  }

  int64_t integer(const json& v, const std::string& path, int64_t lo, int64_t hi,
                  const std::string& rule) const {
    if (v.is_number_unsigned()) {
      uint64_t u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          static_cast<int64_t>(u) > hi || static_cast<int64_t>(u) < lo) {
        fail(path, rule);
      }
      return static_cast<int64_t>(u);
    }
    if (v.is_number_integer()) {
      int64_t x = v.get<int64_t>();
      if (x < lo || x > hi) fail(path, rule);
      return x;
    }
    fail(path, rule + " (got " + typeName(v) + ")");
  }

  int intAtLeast(const json& obj, const std::string& path, const char* key, int lo) const {
    const std::string p = join(path, key);
    return static_cast<int>(integer(obj.at(key), p, lo, std::numeric_limits<int>::max(),
                                    "must be an integer >= " + std::to_string(lo)));
  }

  int64_t int64AtLeast(const json& obj, const std::string& path, const char* key,
                       int64_t lo) const {
    const std::string p = join(path, key);
    return integer(obj.at(key), p, lo, std::numeric_limits<int64_t>::max(),
                   "must be an integer >= " + std::to_string(lo));
  }

  bool boolean(const json& obj, const std::string& path, const char* key) const {
    const json& v = obj.at(key);
    if (!v.is_boolean()) {
      fail(join(path, key), std::string("must be true or false (got ") + typeName(v) + ")");
    }
    return v.get<bool>();
  }

  std::string string(const json& obj, const std::string& path, const char* key) const {
    const json& v = obj.at(key);
    if (!v.is_string()) {
      fail(join(path, key), std::string("must be a string (got ") + typeName(v) + ")");
    }
    return v.get<std::string>();
  }

  // A measurement: a finite number >= 0, or -1 for "not measured".
  double measurement(const json& obj, const std::string& path, const char* key) const {
    const json& v = obj.at(key);
    const std::string rule = "must be a number >= 0, or -1 when not measured";
    if (!v.is_number()) fail(join(path, key), rule + " (got " + typeName(v) + ")");
    double x = v.get<double>();
    if (!std::isfinite(x) || (x < 0 && x != -1.0)) fail(join(path, key), rule);
    return x;
  }

  uint64_t hexHash(const json& obj, const std::string& path, const char* key) const {
    const json& v = obj.at(key);
    const std::string rule = "must be a string of 1 to 16 hexadecimal digits";
    if (!v.is_string()) fail(join(path, key), rule + " (got " + typeName(v) + ")");
    const std::string s = v.get<std::string>();
    if (s.empty() || s.size() > 16) fail(join(path, key), rule);
    uint64_t x = 0;
    for (char c : s) {
      int d = 0;
      if (c >= '0' && c <= '9') {
        d = c - '0';
      } else if (c >= 'a' && c <= 'f') {
        d = c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        d = c - 'A' + 10;
      } else {
        fail(join(path, key), rule);
      }
      x = (x << 4) | static_cast<uint64_t>(d);
    }
    return x;
  }

 private:
  std::string prefix_;
};

std::string indexed(const char* name, size_t i) {
  return std::string(name) + "[" + std::to_string(i) + "]";
}

GpuInfo gpuFromJson(const Reader& r, const json& j, size_t position) {
  const std::string path = indexed("gpus", position);
  r.requireObject(j, path,
                  {"index", "name", "pciBusId", "uuid", "hostHash", "ccMajor", "ccMinor", "smCount",
                   "sharedMemPerBlockOptin", "sharedMemPerSm", "clusterLaunch", "hostNativeAtomics",
                   "totalMemBytes", "numaNode", "pcieGen", "pcieWidth"},
                  {"pcieMaxGen", "pcieMaxWidth"});
  GpuInfo g;
  // Not required to equal the position: a communicator sends one GPU numbered by its rank.
  g.index = r.intAtLeast(j, path, "index", -1);
  g.name = r.string(j, path, "name");
  g.pciBusId = r.string(j, path, "pciBusId");
  g.uuid = r.string(j, path, "uuid");
  g.hostHash = r.hexHash(j, path, "hostHash");
  g.ccMajor = r.intAtLeast(j, path, "ccMajor", 0);
  g.ccMinor = r.intAtLeast(j, path, "ccMinor", 0);
  g.smCount = r.intAtLeast(j, path, "smCount", 0);
  g.sharedMemPerBlockOptin = r.int64AtLeast(j, path, "sharedMemPerBlockOptin", 0);
  g.sharedMemPerSm = r.int64AtLeast(j, path, "sharedMemPerSm", 0);
  g.clusterLaunch = r.boolean(j, path, "clusterLaunch");
  g.hostNativeAtomics = r.boolean(j, path, "hostNativeAtomics");
  g.totalMemBytes = r.int64AtLeast(j, path, "totalMemBytes", 0);
  g.numaNode = r.intAtLeast(j, path, "numaNode", -1);
  g.pcieGen = r.intAtLeast(j, path, "pcieGen", 0);
  g.pcieWidth = r.intAtLeast(j, path, "pcieWidth", 0);
  if (j.contains("pcieMaxGen")) g.pcieMaxGen = r.intAtLeast(j, path, "pcieMaxGen", 0);
  if (j.contains("pcieMaxWidth")) g.pcieMaxWidth = r.intAtLeast(j, path, "pcieMaxWidth", 0);
  return g;
}

PairInfo pairFromJson(const Reader& r, const json& j, size_t position, int n) {
  const std::string path = indexed("pairs", position);
  r.requireObject(j, path,
                  {"src", "dst", "link", "nvlinkCount", "linkGBps", "pcieRelation",
                   "driverPeerAccess", "driverAtomics", "peerWriteOk", "peerReadOk", "peerAtomicOk",
                   "writeGBps", "readGBps", "latencyUs"});
  PairInfo p;
  const int wantSrc = static_cast<int>(position / static_cast<size_t>(n));
  const int wantDst = static_cast<int>(position % static_cast<size_t>(n));
  p.src = static_cast<int>(
      r.integer(j.at("src"), Reader::join(path, "src"), wantSrc, wantSrc,
                "must be " + std::to_string(wantSrc) + " (pairs are row-major by src, then dst)"));
  p.dst = static_cast<int>(
      r.integer(j.at("dst"), Reader::join(path, "dst"), wantDst, wantDst,
                "must be " + std::to_string(wantDst) + " (pairs are row-major by src, then dst)"));
  const std::string link = r.string(j, path, "link");
  if (!parseLinkType(link, &p.link)) {
    r.fail(Reader::join(path, "link"),
           "must be one of \"unknown\", \"self\", \"nvlink\", \"pcie\", \"none\" (got " +
               quoteShort(link) + ")");
  }
  if (p.src == p.dst && p.link != LinkType::Self) {
    r.fail(Reader::join(path, "link"), "must be \"self\" on the diagonal");
  }
  p.nvlinkCount = r.intAtLeast(j, path, "nvlinkCount", 0);
  p.linkGBps = r.measurement(j, path, "linkGBps");
  p.pcieRelation = r.string(j, path, "pcieRelation");
  if (std::find(std::begin(kPcieRelations), std::end(kPcieRelations), p.pcieRelation) ==
      std::end(kPcieRelations)) {
    r.fail(Reader::join(path, "pcieRelation"),
           "must be one of \"board\", \"switch\", \"switches\", \"hostbridge\", \"numa\", "
           "\"system\" or \"\" (got " +
               quoteShort(p.pcieRelation) + ")");
  }
  p.driverPeerAccess = r.boolean(j, path, "driverPeerAccess");
  p.driverAtomics = r.boolean(j, path, "driverAtomics");
  p.peerWriteOk = r.boolean(j, path, "peerWriteOk");
  p.peerReadOk = r.boolean(j, path, "peerReadOk");
  p.peerAtomicOk = r.boolean(j, path, "peerAtomicOk");
  p.writeGBps = r.measurement(j, path, "writeGBps");
  p.readGBps = r.measurement(j, path, "readGBps");
  p.latencyUs = r.measurement(j, path, "latencyUs");
  return p;
}

FabricLoad loadFromJson(const Reader& r, const json& j) {
  const std::string path = "load";
  r.requireObject(
      j, path, {"ranks", "allToAllGBps", "ringGBps", "islandGBps", "syncUs", "ringHopUs", "source"},
      {"hopUs", "islands", "ringCopyGBps", "hostGBps", "hostStepUs"});
  FabricLoad l;
  l.ranks = r.intAtLeast(j, path, "ranks", 1);
  l.allToAllGBps = r.measurement(j, path, "allToAllGBps");
  l.ringGBps = r.measurement(j, path, "ringGBps");
  l.islandGBps = r.measurement(j, path, "islandGBps");
  l.syncUs = r.measurement(j, path, "syncUs");
  l.ringHopUs = r.measurement(j, path, "ringHopUs");
  if (j.contains("hopUs")) l.hopUs = r.measurement(j, path, "hopUs");
  if (j.contains("islands")) l.islands = r.string(j, path, "islands");
  if (j.contains("ringCopyGBps")) l.ringCopyGBps = r.measurement(j, path, "ringCopyGBps");
  if (j.contains("hostGBps")) l.hostGBps = r.measurement(j, path, "hostGBps");
  if (j.contains("hostStepUs")) l.hostStepUs = r.measurement(j, path, "hostStepUs");
  l.source = r.string(j, path, "source");
  return l;
}

Topology parseTopology(const std::string& text, const std::string& prefix) {
  const Reader r(prefix);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    r.fail("", std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object()) r.fail("", std::string("must be a JSON object, not ") + typeName(j));

  // Identify the document before anything else, so that a foreign file gets a clear message.
  if (!j.contains("format")) r.fail("format", "missing field (not an anyreduce topology file?)");
  if (!j.at("format").is_string() || j.at("format").get<std::string>() != kFormatName) {
    r.fail("format", std::string("must be \"") + kFormatName + "\" (got " +
                         (j.at("format").is_string() ? quoteShort(j.at("format").get<std::string>())
                                                     : std::string(typeName(j.at("format")))) +
                         ")");
  }
  if (!j.contains("version")) r.fail("version", "missing field");
  r.integer(
      j.at("version"), "version", Topology::kFormatVersion, Topology::kFormatVersion,
      "unsupported version; this build reads version " + std::to_string(Topology::kFormatVersion));

  r.requireObject(j, "",
                  {"format", "version", "source", "hostName", "driverVersion", "cudaDriverVersion",
                   "cudaRuntimeVersion", "gpus", "pairs"},
                  {"load", "sources"});
  Topology t;
  t.source = r.string(j, "", "source");
  t.hostName = r.string(j, "", "hostName");
  t.driverVersion = r.string(j, "", "driverVersion");
  t.cudaDriverVersion = r.intAtLeast(j, "", "cudaDriverVersion", 0);
  t.cudaRuntimeVersion = r.intAtLeast(j, "", "cudaRuntimeVersion", 0);

  const json& gpus = j.at("gpus");
  if (!gpus.is_array())
    r.fail("gpus", std::string("must be an array (got ") + typeName(gpus) + ")");
  if (gpus.size() > 4096) r.fail("gpus", "more than 4096 GPUs");
  for (size_t i = 0; i < gpus.size(); ++i) t.gpus.push_back(gpuFromJson(r, gpus[i], i));

  const json& pairs = j.at("pairs");
  if (!pairs.is_array()) {
    r.fail("pairs", std::string("must be an array (got ") + typeName(pairs) + ")");
  }
  const size_t n = t.gpus.size();
  if (pairs.size() != n * n) {
    r.fail("pairs", "must hold exactly " + std::to_string(n * n) + " entries (" +
                        std::to_string(n) + " GPUs squared), not " + std::to_string(pairs.size()));
  }
  t.pairs.reserve(n * n);
  for (size_t i = 0; i < pairs.size(); ++i) {
    t.pairs.push_back(pairFromJson(r, pairs[i], i, static_cast<int>(n)));
  }
  if (j.contains("load")) t.load = loadFromJson(r, j.at("load"));
  if (j.contains("sources")) {
    const json& src = j.at("sources");
    if (!src.is_array()) {
      r.fail("sources", std::string("must be an array of strings (got ") + typeName(src) + ")");
    }
    for (size_t i = 0; i < src.size(); ++i) {
      if (!src[i].is_string()) r.fail(indexed("sources", i), "must be a string");
      t.sources.push_back(src[i].get<std::string>());
    }
  }
  return t;
}

}  // namespace

Topology topologyFromJson(const std::string& text) { return parseTopology(text, "topology"); }

Topology firstGpus(const Topology& t, int n) {
  Topology sub = t;
  sub.gpus.resize(static_cast<size_t>(n));
  sub.resizePairs();
  for (int s = 0; s < n; ++s)
    for (int d = 0; d < n; ++d) sub.pair(s, d) = t.pair(s, d);
  return sub;
}

Topology loadTopologyFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throwErrno("topology file '" + path + "': cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throwErrno("topology file '" + path + "': cannot read");
  return parseTopology(ss.str(), "topology file '" + path + "'");
}

void saveTopologyFile(const Topology& t, const std::string& path) {
  const std::string text = topologyToJson(t);
  // Write a temporary file and rename it, so that a reader never sees half a file.
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throwErrno("topology file '" + path + "': cannot create '" + tmp + "'");
    out << text;
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      throwErrno("topology file '" + path + "': cannot write");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throwErrno("topology file '" + path + "': cannot rename '" + tmp + "' to it");
  }
}

// ---------------------------------------------------------------------------------------------
// Tables

namespace {

std::string fixed(double v, int digits) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(digits) << v;
  return os.str();
}

std::string measured(double v, int digits) { return v < 0 ? "-" : fixed(v, digits); }

std::string linkCell(const PairInfo& p) {
  switch (p.link) {
    case LinkType::Self:
      return "X";
    case LinkType::NVLink:
      return p.nvlinkCount > 0 ? "NV" + std::to_string(p.nvlinkCount) : "NV";
    case LinkType::PCIe:
      return "PCIe";
    case LinkType::None:
      return "-";
    case LinkType::Unknown:
      break;
  }
  return "?";
}

// "ok" when confirmed; "FAIL" when the driver claimed it but the transfer did not confirm it;
// "-" when the driver did not claim it (so it was not expected, nor tested by the probe).
std::string confirmed(bool ok, bool claimed) { return ok ? "ok" : claimed ? "FAIL" : "-"; }

std::string gpuLabel(int i) { return "GPU" + std::to_string(i); }

template <typename CellFn>
void printMatrix(const Topology& t, std::ostream& os, const std::string& title, CellFn cell) {
  const int n = t.size();
  std::vector<std::string> cells(static_cast<size_t>(n) * static_cast<size_t>(n));
  size_t width = gpuLabel(n - 1).size();
  for (int s = 0; s < n; ++s) {
    for (int d = 0; d < n; ++d) {
      const PairInfo& p = t.pair(s, d);
      std::string c = s == d ? std::string("X") : cell(p);
      width = std::max(width, c.size());
      cells[static_cast<size_t>(s) * static_cast<size_t>(n) + static_cast<size_t>(d)] =
          std::move(c);
    }
  }
  const int w = static_cast<int>(width);
  const int rowLabelWidth = static_cast<int>(gpuLabel(n - 1).size());
  os << "\n" << title << "; rows: src, columns: dst\n";
  os << std::setw(rowLabelWidth) << "";
  for (int d = 0; d < n; ++d) os << "  " << std::setw(w) << gpuLabel(d);
  os << "\n";
  for (int s = 0; s < n; ++s) {
    os << std::left << std::setw(rowLabelWidth) << gpuLabel(s) << std::right;
    for (int d = 0; d < n; ++d) {
      os << "  " << std::setw(w)
         << cells[static_cast<size_t>(s) * static_cast<size_t>(n) + static_cast<size_t>(d)];
    }
    os << "\n";
  }
}

std::string versionText(int v) {
  if (v <= 0) return "unknown";
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

}  // namespace

void printTopology(const Topology& t, std::ostream& os) {
  const std::ios::fmtflags flags = os.flags();
  const int n = t.size();
  os << "Topology: " << n << " GPU" << (n == 1 ? "" : "s") << ", source "
     << (t.source.empty() ? "-" : t.source) << ", host " << (t.hostName.empty() ? "-" : t.hostName)
     << "\n";
  os << "Driver " << (t.driverVersion.empty() ? "unknown" : t.driverVersion) << ", CUDA driver "
     << versionText(t.cudaDriverVersion) << ", CUDA runtime " << versionText(t.cudaRuntimeVersion)
     << "\n";
  if (n == 0) {
    os << "(no GPUs)\n";
    os.flags(flags);
    return;
  }

  // GPU table.
  struct Col {
    std::string head;
    bool left;
  };
  const std::vector<Col> cols = {{"GPU", false},     {"Name", true},         {"Bus id", true},
                                 {"SMs", false},     {"Smem/blk KB", false}, {"Cluster", true},
                                 {"Mem GiB", false}, {"NUMA", false},        {"PCIe", true}};
  std::vector<std::vector<std::string>> rows;
  for (const GpuInfo& g : t.gpus) {
    const double smemKb = static_cast<double>(g.sharedMemPerBlockOptin) / 1024.0;
    auto link = [](int gen, int width) {
      return "Gen" + (gen > 0 ? std::to_string(gen) : std::string("?")) + " x" +
             (width > 0 ? std::to_string(width) : std::string("?"));
    };
    std::string pcie = "-";
    if (g.pcieGen > 0 || g.pcieWidth > 0) pcie = link(g.pcieGen, g.pcieWidth);
    // The maximum, where it differs from the current link (an idle GPU trains down).
    if ((g.pcieMaxGen > 0 || g.pcieMaxWidth > 0) &&
        (g.pcieMaxGen != g.pcieGen || g.pcieMaxWidth != g.pcieWidth)) {
      pcie += " (max " + link(g.pcieMaxGen, g.pcieMaxWidth) + ")";
    }
    rows.push_back({std::to_string(g.index), g.name.empty() ? "-" : g.name,
                    g.pciBusId.empty() ? "-" : g.pciBusId, std::to_string(g.smCount),
                    g.sharedMemPerBlockOptin % 1024 == 0
                        ? std::to_string(g.sharedMemPerBlockOptin / 1024)
                        : fixed(smemKb, 1),
                    g.clusterLaunch ? "yes" : "no",
                    fixed(static_cast<double>(g.totalMemBytes) / (1024.0 * 1024.0 * 1024.0), 1),
                    g.numaNode < 0 ? "-" : std::to_string(g.numaNode), pcie});
  }
  std::vector<size_t> widths(cols.size());
  for (size_t c = 0; c < cols.size(); ++c) {
    widths[c] = cols[c].head.size();
    for (const auto& row : rows) widths[c] = std::max(widths[c], row[c].size());
  }
  auto printRow = [&](const std::vector<std::string>& cells) {
    for (size_t c = 0; c < cols.size(); ++c) {
      if (c > 0) os << "  ";
      if (cols[c].left) {
        // No padding after the last column.
        if (c + 1 == cols.size()) {
          os << cells[c];
        } else {
          os << std::left << std::setw(static_cast<int>(widths[c])) << cells[c] << std::right;
        }
      } else {
        os << std::right << std::setw(static_cast<int>(widths[c])) << cells[c];
      }
    }
    os << "\n";
  };
  os << "\n";
  std::vector<std::string> heads;
  for (const Col& c : cols) heads.push_back(c.head);
  printRow(heads);
  for (const auto& row : rows) printRow(row);

  if (t.pairs.size() != static_cast<size_t>(n) * static_cast<size_t>(n)) {
    os << "\n(pair matrix missing: " << t.pairs.size() << " pairs for " << n << " GPUs)\n";
    os.flags(flags);
    return;
  }

  printMatrix(t, os, "Link (NVn: n NVLinks, PCIe: peer-to-peer over PCIe, -: none, ?: unknown)",
              [](const PairInfo& p) { return linkCell(p); });
  printMatrix(t, os, "Nominal link GB/s per direction",
              [](const PairInfo& p) { return measured(p.linkGBps, 1); });
  printMatrix(t, os, "PCIe common ancestor",
              [](const PairInfo& p) { return p.pcieRelation.empty() ? "-" : p.pcieRelation; });
  printMatrix(t, os, "Driver peer access / native atomics", [](const PairInfo& p) {
    return std::string(p.driverPeerAccess ? "yes" : "no") + "/" + (p.driverAtomics ? "yes" : "no");
  });
  printMatrix(t, os, "Confirmed write/read/atomic (ok, FAIL: claimed but failed, -: not claimed)",
              [](const PairInfo& p) {
                return confirmed(p.peerWriteOk, p.driverPeerAccess) + "/" +
                       confirmed(p.peerReadOk, p.driverPeerAccess) + "/" +
                       confirmed(p.peerAtomicOk, p.driverAtomics);
              });
  printMatrix(t, os, "Measured write GB/s (src stores into dst memory)",
              [](const PairInfo& p) { return measured(p.writeGBps, 1); });
  printMatrix(t, os, "Measured read GB/s (src loads from dst memory)",
              [](const PairInfo& p) { return measured(p.readGBps, 1); });
  printMatrix(t, os, "One-way flag latency us",
              [](const PairInfo& p) { return measured(p.latencyUs, 2); });
  if (t.source == "probe") {
    os << "\nMeasured by this probe, one pair at a time (the other GPUs idle). The fabric under "
          "load is measured by a communicator at init (ANYR_FABRIC): `anyreduce explain` shows "
          "its figures and where they came from.\n";
  }
  if (t.load.known()) {
    const FabricLoad& l = t.load;
    os << "\nUnder load, " << l.ranks << " ranks at once (" << (l.source.empty() ? "-" : l.source)
       << "):\n  all-to-all " << measured(l.allToAllGBps, 1) << " GB/s per GPU, ring "
       << measured(l.ringGBps, 1) << " GB/s per GPU, island " << measured(l.islandGBps, 1)
       << " GB/s per GPU" << (l.islands.empty() ? "" : " (islands " + l.islands + ")")
       << ", synchronisation round " << measured(l.syncUs, 2) << " us, one-partner round "
       << measured(l.hopUs, 2) << " us, NCCL ring hop " << measured(l.ringHopUs, 2) << " us\n";
    if (l.ringCopyGBps > 0) {
      os << "  the copy engines pulling from the ring neighbour " << measured(l.ringCopyGBps, 1)
         << " GB/s per GPU\n";
    }
    if (l.hostGBps > 0 || l.hostStepUs > 0) {
      os << "  through host memory " << measured(l.hostGBps, 1)
         << " GB/s per GPU and direction, a step " << measured(l.hostStepUs, 2) << " us\n";
    }
  }
  for (const std::string& src : t.sources) os << "Source: " << src << "\n";
  os.flags(flags);
}

}  // namespace anyr
