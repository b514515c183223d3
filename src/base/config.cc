#include "base/config.h"

#include <algorithm>
#include <sstream>

#include "base/env.h"
#include "base/error.h"
#include "base/names.h"
#include "base/validate.h"

namespace anyr {

bool parseAlgo(const std::string& name, anyrAlgo_t* out) {
  for (int i = 0; i < anyrNumAlgos; ++i) {
    const char* n = anyrAlgoName(static_cast<anyrAlgo_t>(i));
    if (n != nullptr && name == n) {
      *out = static_cast<anyrAlgo_t>(i);
      return true;
    }
  }
  return false;
}

std::string algoNames() {
  std::string s;
  for (int i = 0; i < anyrNumAlgos; ++i)
    s += std::string(i ? ", " : "") + anyrAlgoName(static_cast<anyrAlgo_t>(i));
  return s;
}

namespace {

constexpr Named<anyrWire_t> kWireNames[] = {
    {anyrWireNative, "native"}, {anyrWireFp8, "fp8"}, {anyrWireInt8, "int8"}};

// The switches also take 0 (off) and 1 (on): rows after the names, so nameOf keeps the names.
constexpr Named<anyrPeerMemory_t> kPeerMemoryNames[] = {
    {anyrPeerMemoryNone, "none"}, {anyrPeerMemoryAuto, "auto"}, {anyrPeerMemoryCudaIpc, "cuda-ipc"},
    {anyrPeerMemoryVmm, "vmm"},   {anyrPeerMemoryNone, "0"},    {anyrPeerMemoryAuto, "1"}};

constexpr Named<FabricMode> kFabricModeNames[] = {{FabricMode::Measure, "measure"},
                                                  {FabricMode::Cached, "cached"},
                                                  {FabricMode::Off, "off"},
                                                  {FabricMode::Off, "0"},
                                                  {FabricMode::Measure, "1"}};

constexpr Named<HintsMode> kHintsModeNames[] = {{HintsMode::Auto, "auto"},
                                                {HintsMode::Off, "off"},
                                                {HintsMode::On, "on"},
                                                {HintsMode::Off, "0"},
                                                {HintsMode::On, "1"}};

}  // namespace

const char* hintsModeName(HintsMode m) { return nameOf(kHintsModeNames, m, "invalid"); }

bool parseHintsMode(const std::string& name, HintsMode* out) {
  return parseName(kHintsModeNames, name, out);
}

HintsMode epilogueHintsFromEnv() {
  const std::string name = env::getString("ANYR_EPILOGUE_HINTS");
  HintsMode m = HintsMode::Auto;
  if (!parseHintsMode(name, &m)) {
    throwError(anyrInvalidArgument, "environment variable ANYR_EPILOGUE_HINTS='" + name +
                                        "': must be auto, off or on (or 0 = off, 1 = on)");
  }
  return m;
}

const char* fabricModeName(FabricMode m) { return nameOf(kFabricModeNames, m, "invalid"); }

bool parseFabricMode(const std::string& name, FabricMode* out) {
  return parseName(kFabricModeNames, name, out);
}

const char* wireName(anyrWire_t w) { return nameOf(kWireNames, w, "invalid"); }

bool parseWire(const std::string& name, anyrWire_t* out) {
  return parseName(kWireNames, name, out);
}

const char* peerMemoryName(anyrPeerMemory_t k) { return nameOf(kPeerMemoryNames, k, "invalid"); }

bool parsePeerMemory(const std::string& name, anyrPeerMemory_t* out) {
  return parseName(kPeerMemoryNames, name, out);
}

Config::Wire Config::toWire() const {
  Wire w{};
  w.algorithm = algorithm;
  w.timeoutMs = timeoutMs;
  w.useNccl = useNccl ? 1 : 0;
  w.maxBlocks = maxBlocks;
  w.oneShotMaxBytes = oneShotMaxBytes;
  w.twoShotMaxBytes = twoShotMaxBytes;
  w.chunkBytes = chunkBytes;
  w.wire = wire;
  w.fusedCluster = fusedCluster;
  w.peerMemory = peerMemory;
  w.islands = islands;
  w.fabric = static_cast<int32_t>(fabric);
  return w;
}

Config Config::fromWire(const Wire& w) {
  Config c;
  c.algorithm = static_cast<anyrAlgo_t>(w.algorithm);
  c.timeoutMs = w.timeoutMs;
  c.useNccl = w.useNccl != 0;
  c.maxBlocks = w.maxBlocks;
  c.oneShotMaxBytes = w.oneShotMaxBytes;
  c.twoShotMaxBytes = w.twoShotMaxBytes;
  c.chunkBytes = w.chunkBytes;
  c.wire = static_cast<anyrWire_t>(w.wire);
  c.fusedCluster = w.fusedCluster;
  c.peerMemory = static_cast<anyrPeerMemory_t>(w.peerMemory);
  c.islands = w.islands;
  c.fabric = static_cast<FabricMode>(w.fabric);
  return c;
}

bool Config::operator==(const Config& o) const {
  return algorithm == o.algorithm && timeoutMs == o.timeoutMs && useNccl == o.useNccl &&
         maxBlocks == o.maxBlocks && oneShotMaxBytes == o.oneShotMaxBytes &&
         twoShotMaxBytes == o.twoShotMaxBytes && chunkBytes == o.chunkBytes && wire == o.wire &&
         fusedCluster == o.fusedCluster && peerMemory == o.peerMemory && islands == o.islands &&
         fabric == o.fabric;
}

std::string Config::describe() const {
  std::ostringstream os;
  os << "algorithm=" << anyrAlgoName(algorithm) << " timeoutMs=" << timeoutMs
     << " oneShotMaxBytes=" << oneShotMaxBytes << " twoShotMaxBytes=" << twoShotMaxBytes
     << " chunkBytes=" << chunkBytes << " useNccl=" << useNccl << " maxBlocks=" << maxBlocks
     << " wire=" << wireName(wire) << " fusedCluster=" << fusedCluster
     << " peerMemory=" << peerMemoryName(peerMemory) << " islands=" << islandsText(islands)
     << " fabric=" << fabricModeName(fabric) << " epilogueHints=" << hintsModeName(epilogueHints);
  return os.str();
}

const char* const kIslandsRule =
    "islands separated by ',', each a rank, a range a-b, or several of those joined by '+' "
    "(0-3,4-7 or 0+2+4+6,1+3+5+7), every rank of the communicator in exactly one island; "
    "auto (or unset): from the topology";

namespace {

constexpr int kIslandRanks = 8;  // the peer-mapped ranks (device/handles.h, kMaxLocalRanks)

// A rank of ANYR_ISLANDS: decimal digits, 0..kIslandRanks - 1.
bool parseIslandRank(const std::string& s, int* out, std::string* why) {
  if (s.empty()) {
    *why = "an empty rank (a '+' or '-' at an end, or two in a row)";
    return false;
  }
  if (s.size() > 3 || s.find_first_not_of("0123456789") != std::string::npos) {
    *why = "'" + s + "' is not a rank";
    return false;
  }
  *out = std::stoi(s);
  if (*out >= kIslandRanks) {
    *why = "rank " + s + " is outside 0.." + std::to_string(kIslandRanks - 1) +
           " (the ranks that map each other's memory)";
    return false;
  }
  return true;
}

}  // namespace

bool parseIslands(const std::string& raw, uint32_t* packed, std::string* why) {
  std::string text;
  for (char ch : raw) {
    if (ch != ' ' && ch != '\t') text += ch;
  }
  *packed = 0;
  if (text.empty() || text == "auto") return true;
  // Island per rank (-1: none yet), islands numbered as written, renumbered below.
  int islandOf[kIslandRanks];
  for (int& i : islandOf) i = -1;
  int islands = 0;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string island = text.substr(start, comma - start);
    if (island.empty()) {
      *why = "an empty island (a ',' at an end or two in a row)";
      return false;
    }
    size_t at = 0;
    while (at <= island.size()) {
      const size_t plus = std::min(island.find('+', at), island.size());
      const std::string item = island.substr(at, plus - at);
      const size_t dash = item.find('-');
      int lo = 0, hi = 0;
      if (!parseIslandRank(item.substr(0, dash), &lo, why)) return false;
      hi = lo;
      if (dash != std::string::npos) {
        if (!parseIslandRank(item.substr(dash + 1), &hi, why)) return false;
        if (hi < lo) {
          *why = "the range '" + item + "' goes downward";
          return false;
        }
      }
      for (int r = lo; r <= hi; ++r) {
        if (islandOf[r] >= 0) {
          *why = "rank " + std::to_string(r) + " is in two islands";
          return false;
        }
        islandOf[r] = islands;
      }
      at = plus + 1;
    }
    ++islands;
    start = comma + 1;
  }
  // Islands numbered by their lowest rank, so that equal layouts pack alike.
  int renumber[kIslandRanks];
  for (int& i : renumber) i = -1;
  int next = 0;
  for (int r = 0; r < kIslandRanks; ++r) {
    if (islandOf[r] >= 0 && renumber[islandOf[r]] < 0) renumber[islandOf[r]] = next++;
  }
  for (int r = 0; r < kIslandRanks; ++r) {
    if (islandOf[r] >= 0) *packed |= static_cast<uint32_t>(renumber[islandOf[r]] + 1) << (4 * r);
  }
  return true;
}

std::string islandsText(uint32_t packed) {
  if (packed == 0) return "auto";
  std::string out;
  for (int island = 0; island < kIslandRanks; ++island) {
    std::string text;
    for (int r = 0; r < kIslandRanks; ++r) {
      if (islandOfRank(packed, r) != island) continue;
      int last = r;
      while (last + 1 < kIslandRanks && islandOfRank(packed, last + 1) == island) ++last;
      text += (text.empty() ? "" : "+") + std::to_string(r) +
              (last > r ? "-" + std::to_string(last) : "");
      r = last;
    }
    if (!text.empty()) out += (out.empty() ? "" : ",") + text;
  }
  return out;
}

std::string islandsCoverError(uint32_t packed, int nranks) {
  if (packed == 0) return "";
  if (nranks > kIslandRanks) {
    return "islands hold at most " + std::to_string(kIslandRanks) +
           " ranks (those that map each other's memory), the communicator has " +
           std::to_string(nranks);
  }
  for (int r = 0; r < kIslandRanks; ++r) {
    const bool listed = islandOfRank(packed, r) >= 0;
    if (r < nranks && !listed) {
      return "rank " + std::to_string(r) + " is in no island (every rank 0.." +
             std::to_string(nranks - 1) + " must be in exactly one)";
    }
    if (r >= nranks && listed) {
      return "rank " + std::to_string(r) + " is named, but the communicator has " +
             std::to_string(nranks) + " ranks (0.." + std::to_string(nranks - 1) + ")";
    }
  }
  return "";
}

const char* const kMaxBlocksRule = "must be in 0..256 (0 = automatic)";
const char* const kFusedClusterRule = "must be 0 (automatic), 1 (off), 2, 4 or 8";

bool maxBlocksValid(int64_t v) { return v >= 0 && v <= 256; }

bool fusedClusterValid(int64_t v) { return v == 0 || v == 1 || v == 2 || v == 4 || v == 8; }

Config resolveConfig(const anyrConfig_t* user) {
  if (user != nullptr) {
    checkVersionedStruct("config", user->magic, ANYR_CONFIG_MAGIC, user->size, sizeof(anyrConfig_t),
                         "ANYR_CONFIG_INITIALIZER");
  }
  Config c;
  // algorithm
  if (user && user->algorithm != ANYR_CONFIG_UNDEF_INT) {
    ANYR_REQUIRE_ARG(user->algorithm >= 0 && user->algorithm < anyrNumAlgos, "config.algorithm",
                     "must be an anyrAlgo_t value (0.." + std::to_string(anyrNumAlgos - 1) + ")");
    c.algorithm = static_cast<anyrAlgo_t>(user->algorithm);
  } else {
    std::string name = env::getString("ANYR_ALGO");
    if (!parseAlgo(name, &c.algorithm)) {
      throwError(anyrInvalidArgument,
                 "environment variable ANYR_ALGO='" + name + "': must be one of " + algoNames());
    }
  }
  // timeout
  if (user && user->timeoutMs != ANYR_CONFIG_UNDEF_INT) {
    c.timeoutMs = user->timeoutMs;
    // The same range as ANYR_TIMEOUT_MS: deadlines add to it (destroy waits timeout + 5 s).
    ANYR_REQUIRE_ARG(
        c.timeoutMs > 0 && c.timeoutMs <= 24 * 3600 * 1000, "config.timeoutMs",
        "must be in 1..86400000 milliseconds (got " + std::to_string(c.timeoutMs) + ")");
  } else {
    int64_t t = env::getInt("ANYR_TIMEOUT_MS");
    if (t <= 0 || t > 24ll * 3600 * 1000) {
      throwError(anyrInvalidArgument, "environment variable ANYR_TIMEOUT_MS=" + std::to_string(t) +
                                          ": must be in 1..86400000");
    }
    c.timeoutMs = static_cast<int>(t);
  }
  // ANYR_DEBUG is read where the first line is logged, which cannot fail: checked here, so a
  // malformed value is an error like every other variable's.
  const std::string debug = env::getString("ANYR_DEBUG");
  if (debug != "NONE" && debug != "WARN" && debug != "INFO" && debug != "TRACE") {
    throwError(anyrInvalidArgument, "environment variable ANYR_DEBUG='" + debug +
                                        "': must be NONE, WARN, INFO or TRACE");
  }
  // sizes
  auto sizeField = [&](size_t field, const char* envName, uint64_t* out) {
    if (user && field != ANYR_CONFIG_UNDEF_SIZE) {
      *out = field;
    } else if (env::isSet(envName)) {
      *out = env::getSize(envName);
    }
  };
  sizeField(user ? user->oneShotMaxBytes : ANYR_CONFIG_UNDEF_SIZE, "ANYR_ONESHOT_MAX_BYTES",
            &c.oneShotMaxBytes);
  sizeField(user ? user->twoShotMaxBytes : ANYR_CONFIG_UNDEF_SIZE, "ANYR_TWOSHOT_MAX_BYTES",
            &c.twoShotMaxBytes);
  // The variable (or its registered default) only where the field is not set: an explicit field
  // wins over a malformed variable too.
  c.chunkBytes = user && user->chunkBytes != ANYR_CONFIG_UNDEF_SIZE
                     ? user->chunkBytes
                     : env::getSize("ANYR_CHUNK_BYTES");
  ANYR_REQUIRE_ARG(
      c.chunkBytes >= (64u << 10) && c.chunkBytes <= (1ull << 30) && c.chunkBytes % 4096 == 0,
      "config.chunkBytes / ANYR_CHUNK_BYTES",
      "must be a multiple of 4096 between 64 KiB and 1 GiB (got " + std::to_string(c.chunkBytes) +
          ")");
  ANYR_REQUIRE_ARG(c.oneShotMaxBytes <= (64ull << 20),
                   "config.oneShotMaxBytes / ANYR_ONESHOT_MAX_BYTES",
                   "must be at most 64 MiB (got " + std::to_string(c.oneShotMaxBytes) + ")");
  // NCCL
  if (user && user->useNccl != ANYR_CONFIG_UNDEF_INT) {
    ANYR_REQUIRE_ARG(user->useNccl == 0 || user->useNccl == 1, "config.useNccl", "must be 0 or 1");
    c.useNccl = user->useNccl == 1;
  } else {
    int64_t v = env::getInt("ANYR_USE_NCCL");
    if (v != 0 && v != 1) {
      throwError(anyrInvalidArgument, "environment variable ANYR_USE_NCCL: must be 0 or 1");
    }
    c.useNccl = v == 1;
  }
  // blocks
  if (user && user->maxBlocks != ANYR_CONFIG_UNDEF_INT) {
    c.maxBlocks = user->maxBlocks;
  } else {
    // Range-checked before narrowing, so 4294967297 is refused rather than read as 1.
    const int64_t b = env::getInt("ANYR_MAX_BLOCKS");
    c.maxBlocks = maxBlocksValid(b) ? static_cast<int>(b) : -1;
  }
  ANYR_REQUIRE_ARG(maxBlocksValid(c.maxBlocks), "config.maxBlocks / ANYR_MAX_BLOCKS",
                   kMaxBlocksRule);
  // tuning table and init-time tuning budget
  if (user && user->tuningFile != nullptr) {
    c.tuningFile = user->tuningFile;
  } else {
    c.tuningFile = env::getString("ANYR_TUNING_FILE");
  }
  if (user && user->tuneBudgetMs != ANYR_CONFIG_UNDEF_INT) {
    c.tuneBudgetMs = user->tuneBudgetMs;
  } else {
    c.tuneBudgetMs = env::getInt32("ANYR_TUNE_BUDGET_MS");
  }
  ANYR_REQUIRE_ARG(c.tuneBudgetMs >= 0 && c.tuneBudgetMs <= 3600 * 1000,
                   "config.tuneBudgetMs / ANYR_TUNE_BUDGET_MS",
                   "must be in 0..3600000 milliseconds (0 = no tuning at init)");
  // wire format of the host-memory algorithms
  if (user && user->wire != ANYR_CONFIG_UNDEF_INT) {
    ANYR_REQUIRE_ARG(user->wire >= 0 && user->wire < anyrNumWires, "config.wire",
                     "must be an anyrWire_t value (0..2: native, fp8, int8)");
    c.wire = static_cast<anyrWire_t>(user->wire);
  } else {
    std::string name = env::getString("ANYR_WIRE");
    if (!parseWire(name, &c.wire)) {
      throwError(anyrInvalidArgument,
                 "environment variable ANYR_WIRE='" + name + "': must be native, fp8 or int8");
    }
  }
  // cluster size of the fused one-shot all-reduce + RMSNorm kernel. Checked as read (64-bit),
  // before narrowing, so 4294967298 is refused rather than read as 2.
  const int64_t cluster = user && user->fusedCluster != ANYR_CONFIG_UNDEF_INT
                              ? user->fusedCluster
                              : env::getInt("ANYR_FUSED_CLUSTER");
  ANYR_REQUIRE_ARG(fusedClusterValid(cluster), "config.fusedCluster / ANYR_FUSED_CLUSTER",
                   std::string(kFusedClusterRule) + " (got " + std::to_string(cluster) + ")");
  c.fusedCluster = static_cast<int>(cluster);
  // how peers map each other's workspace
  if (user && user->peerMemory != ANYR_CONFIG_UNDEF_INT) {
    ANYR_REQUIRE_ARG(user->peerMemory >= 0 && user->peerMemory < anyrNumPeerMemories,
                     "config.peerMemory",
                     "must be an anyrPeerMemory_t value (0..3: none, auto, cuda-ipc, vmm)");
    c.peerMemory = static_cast<anyrPeerMemory_t>(user->peerMemory);
  } else {
    const std::string name = env::getString("ANYR_PEER_MEMORY");
    if (!parsePeerMemory(name, &c.peerMemory)) {
      throwError(anyrInvalidArgument, "environment variable ANYR_PEER_MEMORY='" + name +
                                          "': must be none, auto, cuda-ipc or vmm (or 0 = none, "
                                          "1 = auto)");
    }
  }
  // islands of the two-level all-reduce (the world size is checked at communicator creation)
  const std::string islands = env::getString("ANYR_ISLANDS");
  std::string why;
  if (!parseIslands(islands, &c.islands, &why)) {
    throwError(anyrInvalidArgument, "environment variable ANYR_ISLANDS='" + islands + "': " + why +
                                        " (" + kIslandsRule + ")");
  }
  c.epilogueHints = epilogueHintsFromEnv();
  // the fabric measurement at init (environment only)
  const std::string fabric = env::getString("ANYR_FABRIC");
  if (!parseFabricMode(fabric, &c.fabric)) {
    throwError(anyrInvalidArgument, "environment variable ANYR_FABRIC='" + fabric +
                                        "': must be measure, cached or off (or 1 = measure, 0 = "
                                        "off)");
  }
  return c;
}

}  // namespace anyr
