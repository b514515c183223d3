// libFuzzer target: the configuration parsers: env::parseSize (environment variables and CLI
// sizes), env::getInt, parseAlgo, and resolveConfig on an arbitrary anyrConfig_t combined with
// arbitrary ANYR_* environment values. Properties checked beyond "no crash, no sanitizer report":
//  - bad values are refused with anyr::Error(anyrInvalidArgument) whose message names the
//    argument or the variable, never another exception type;
//  - an accepted configuration satisfies the documented rules (timeout in 1..86400000 ms,
//    chunk size a multiple of 4096 in 64 KiB..1 GiB, one-shot maximum <= 64 MiB, maxBlocks in
//    0..256, fusedCluster 0, 1, 2, 4 or 8, a valid algorithm, islands of ranks 0..7) and
//    survives the wire round trip (Config::toWire/fromWire); an accepted ANYR_ISLANDS layout
//    prints and reads back to itself.
// Input layout: [sizeof(anyrConfig_t) bytes of config][flags byte][NUL-separated env values].
// tests/fuzz/make_seeds.py packs the seeds' config with this layout; it must follow the struct.
// Build and run: scripts/fuzz.sh (tests/fuzz/corpus/config_env is the seed corpus).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "base/config.h"
#include "base/env.h"
#include "base/error.h"

static_assert(sizeof(void*) != 8 || sizeof(anyrConfig_t) == 80,
              "anyrConfig_t changed: update config() in tests/fuzz/make_seeds.py and rerun it");

namespace {

void require(bool cond, const char* what, const std::string& detail = "") {
  if (!cond) {
    std::fprintf(stderr, "fuzz_config_env: property violated: %s %s\n", what, detail.c_str());
    std::abort();  // the fuzzer's way to report a finding (test harness, not the library)
  }
}

// The environment variables resolveConfig reads.
const char* const kVars[] = {
    "ANYR_ALGO",        "ANYR_TIMEOUT_MS", "ANYR_ONESHOT_MAX_BYTES", "ANYR_TWOSHOT_MAX_BYTES",
    "ANYR_CHUNK_BYTES", "ANYR_USE_NCCL",   "ANYR_MAX_BLOCKS",        "ANYR_FUSED_CLUSTER",
    "ANYR_ISLANDS"};
constexpr size_t kNumVars = sizeof(kVars) / sizeof(kVars[0]);

bool namesSomething(const std::string& msg) {
  return msg.find("argument '") != std::string::npos ||
         msg.find("environment variable ANYR_") != std::string::npos;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace anyr;
  // 1. parseSize / parseAlgo on the whole input as text.
  const std::string whole(reinterpret_cast<const char*>(data), size);
  uint64_t v = 0;
  if (env::parseSize(whole, &v)) {
    uint64_t again = 0;
    require(env::parseSize(std::to_string(v), &again) && again == v, "size round trip", whole);
  }
  anyrAlgo_t algo = anyrAlgoAuto;
  if (parseAlgo(whole, &algo)) require(algo >= 0 && algo < anyrNumAlgos, "algo range");
  // An accepted island layout prints canonically and reads back to the same packed form.
  uint32_t islands = 0;
  std::string why;
  if (parseIslands(whole, &islands, &why)) {
    uint32_t again = 1;
    require(parseIslands(islandsText(islands), &again, &why) && again == islands,
            "islands round trip", whole);
  }

  // 2. resolveConfig on a fuzzed struct and environment.
  anyrConfig_t cfg = ANYR_CONFIG_INITIALIZER;
  size_t pos = 0;
  bool useStruct = false;
  if (size >= sizeof(cfg) + 1) {
    std::memcpy(&cfg, data, sizeof(cfg));
    const uint8_t flags = data[sizeof(cfg)];
    useStruct = (flags & 1) != 0;
    // Keep the header fields valid half of the time so the field rules get exercised.
    if (flags & 2) {
      cfg.size = sizeof(cfg);
      cfg.magic = ANYR_CONFIG_MAGIC;
    }
    // Pointer fields are the caller's contract (NULL or a C string), not data to fuzz: NULL,
    // or a string of the fuzzed bytes.
    static std::string tuningPath;
    tuningPath.assign(reinterpret_cast<const char*>(data), std::min<size_t>(size, 32));
    tuningPath.erase(std::find(tuningPath.begin(), tuningPath.end(), '\0'), tuningPath.end());
    cfg.tuningFile = (flags & 4) ? tuningPath.c_str() : nullptr;
    pos = sizeof(cfg) + 1;
  }
  std::vector<std::string> values;
  std::string cur;
  for (size_t i = pos; i < size && values.size() < kNumVars; ++i) {
    if (data[i] == 0) {
      values.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(static_cast<char>(data[i]));
    }
  }
  if (values.size() < kNumVars && !cur.empty()) values.push_back(cur);
  for (size_t i = 0; i < kNumVars; ++i) {
    if (i < values.size() && !values[i].empty()) {
      setenv(kVars[i], values[i].c_str(), 1);
    } else {
      unsetenv(kVars[i]);
    }
  }
  try {
    Config c = resolveConfig(useStruct ? &cfg : nullptr);
    require(c.timeoutMs > 0 && c.timeoutMs <= 86400000, "timeoutMs in 1..86400000");
    require(c.chunkBytes >= (64u << 10) && c.chunkBytes <= (1ull << 30) && c.chunkBytes % 4096 == 0,
            "chunkBytes rule");
    require(c.oneShotMaxBytes <= (64ull << 20), "oneShotMaxBytes rule");
    require(c.maxBlocks >= 0 && c.maxBlocks <= 256, "maxBlocks rule");
    require(c.fusedCluster == 0 || c.fusedCluster == 1 || c.fusedCluster == 2 ||
                c.fusedCluster == 4 || c.fusedCluster == 8,
            "fusedCluster rule");
    require(c.algorithm >= 0 && c.algorithm < anyrNumAlgos, "algorithm rule");
    for (int r = 0; r < 8; ++r) require(islandOfRank(c.islands, r) < 8, "islands: at most 8");
    require(Config::fromWire(c.toWire()) == c, "wire round trip");
    (void)c.describe();
  } catch (const Error& e) {
    require(e.code() == anyrInvalidArgument, "error code", e.what());
    require(namesSomething(e.what()), "message names no argument or variable:", e.what());
  } catch (const std::exception& e) {
    require(false, "non-anyr exception escaped resolveConfig:", e.what());
  }
  // 3. getInt on each variable as set above.
  for (const char* name :
       {"ANYR_TIMEOUT_MS", "ANYR_USE_NCCL", "ANYR_MAX_BLOCKS", "ANYR_FUSED_CLUSTER"}) {
    try {
      (void)env::getInt(name);
    } catch (const Error& e) {
      require(e.code() == anyrInvalidArgument && namesSomething(e.what()), "getInt error",
              e.what());
    }
  }
  return 0;
}
