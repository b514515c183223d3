// Configuration resolution and the environment registry.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <functional>
#include <utility>

#include "base/config.h"
#include "base/env.h"
#include "base/error.h"
#include "cpu/expect_error.h"

namespace anyr {
namespace {

struct EnvGuard {
  std::string name;
  explicit EnvGuard(const char* n, const char* v) : name(n) { setenv(n, v, 1); }
  ~EnvGuard() { unsetenv(name.c_str()); }
};

TEST(Env, ParsesSizes) {
  uint64_t v = 0;
  EXPECT_TRUE(env::parseSize("4096", &v));
  EXPECT_EQ(v, 4096u);
  EXPECT_TRUE(env::parseSize("64K", &v));
  EXPECT_EQ(v, 65536u);
  EXPECT_TRUE(env::parseSize("8M", &v));
  EXPECT_EQ(v, 8u << 20);
  EXPECT_TRUE(env::parseSize("1G", &v));
  EXPECT_EQ(v, 1ull << 30);
  EXPECT_FALSE(env::parseSize("", &v));
  EXPECT_FALSE(env::parseSize("-1", &v));
  EXPECT_FALSE(env::parseSize("12X", &v));
  EXPECT_FALSE(env::parseSize("99999999999999999999G", &v));
}

TEST(Env, UnregisteredNameIsABug) {
  try {
    env::getString("ANYR_NOT_A_VARIABLE");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), anyrInternalError);
    EXPECT_NE(std::string(e.what()).find("ANYR_NOT_A_VARIABLE"), std::string::npos);
  }
}

TEST(Config, DefaultsWithoutEnvironment) {
  Config c = resolveConfig(nullptr);
  EXPECT_EQ(c.algorithm, anyrAlgoAuto);
  EXPECT_EQ(c.timeoutMs, 30000);
  EXPECT_EQ(c.chunkBytes, 8ull << 20);
  EXPECT_TRUE(c.useNccl);
  EXPECT_EQ(c.maxBlocks, 0);
  EXPECT_EQ(c.fusedCluster, 0);
}

TEST(Config, EnvironmentThenExplicitFieldsWin) {
  EnvGuard a("ANYR_ALGO", "twoshot");
  EnvGuard t("ANYR_TIMEOUT_MS", "1234");
  EnvGuard c("ANYR_CHUNK_BYTES", "1M");
  Config fromEnv = resolveConfig(nullptr);
  EXPECT_EQ(fromEnv.algorithm, anyrAlgoTwoShot);
  EXPECT_EQ(fromEnv.timeoutMs, 1234);
  EXPECT_EQ(fromEnv.chunkBytes, 1u << 20);
  anyrConfig_t user = ANYR_CONFIG_INITIALIZER;
  user.algorithm = anyrAlgoOneShotPull;
  user.timeoutMs = 77;
  Config explicitCfg = resolveConfig(&user);
  EXPECT_EQ(explicitCfg.algorithm, anyrAlgoOneShotPull);
  EXPECT_EQ(explicitCfg.timeoutMs, 77);
  EXPECT_EQ(explicitCfg.chunkBytes, 1u << 20);  // not set explicitly: the environment's
}

void expectInvalid(const anyrConfig_t* cfg, const std::string& mentions) {
  expectError([&] { resolveConfig(cfg); }, anyrInvalidArgument, mentions,
              "expected an error mentioning " + mentions);
}

TEST(Config, BadValuesNameTheFieldAndRule) {
  // One bad field at a time, and what the error must mention.
  const struct {
    std::function<void(anyrConfig_t&)> spoil;
    const char* mentions;
  } badFields[] = {
      {[](anyrConfig_t& c) { c.algorithm = 17; }, "config.algorithm"},
      {[](anyrConfig_t& c) { c.timeoutMs = 0; }, "config.timeoutMs"},
      {[](anyrConfig_t& c) { c.chunkBytes = 1000; }, "multiple of 4096"},
      {[](anyrConfig_t& c) { c.useNccl = 5; }, "config.useNccl"},
      {[](anyrConfig_t& c) { c.magic = 0; }, "ANYR_CONFIG_INITIALIZER"},
      {[](anyrConfig_t& c) { c.size = 3; }, "size field"},
  };
  for (const auto& bad : badFields) {
    anyrConfig_t c = ANYR_CONFIG_INITIALIZER;
    bad.spoil(c);
    expectInvalid(&c, bad.mentions);
  }
  {
    EnvGuard g("ANYR_ALGO", "fastest");
    expectInvalid(nullptr, "ANYR_ALGO='fastest'");
  }
  {
    EnvGuard g("ANYR_TIMEOUT_MS", "soon");
    expectInvalid(nullptr, "ANYR_TIMEOUT_MS");
  }
  {
    EnvGuard g("ANYR_DEBUG", "info");
    expectInvalid(nullptr, "ANYR_DEBUG='info': must be NONE, WARN, INFO or TRACE");
  }
  {
    // A malformed variable does not matter where the explicit field is set.
    EnvGuard g("ANYR_CHUNK_BYTES", "lots");
    expectInvalid(nullptr, "ANYR_CHUNK_BYTES");
    anyrConfig_t set = ANYR_CONFIG_INITIALIZER;
    set.chunkBytes = 1 << 20;
    EXPECT_EQ(resolveConfig(&set).chunkBytes, 1u << 20);
  }
}

TEST(Config, WireRoundTrip) {
  anyrConfig_t u = ANYR_CONFIG_INITIALIZER;
  u.algorithm = anyrAlgoTwoShot;
  u.oneShotMaxBytes = 12345 * 16;
  u.maxBlocks = 7;
  Config c = resolveConfig(&u);
  EXPECT_TRUE(Config::fromWire(c.toWire()) == c);
  Config d = c;
  d.maxBlocks = 8;
  EXPECT_FALSE(d == c);
}

TEST(Config, FusedClusterFromFieldOrEnvironment) {
  for (int k : {0, 1, 2, 4, 8}) {
    anyrConfig_t u = ANYR_CONFIG_INITIALIZER;
    u.fusedCluster = k;
    EXPECT_EQ(resolveConfig(&u).fusedCluster, k) << "config.fusedCluster=" << k;
    const std::string text = std::to_string(k);
    EnvGuard g("ANYR_FUSED_CLUSTER", text.c_str());
    EXPECT_EQ(resolveConfig(nullptr).fusedCluster, k) << "ANYR_FUSED_CLUSTER=" << k;
    anyrConfig_t undef = ANYR_CONFIG_INITIALIZER;  // the field left undefined: the variable
    EXPECT_EQ(resolveConfig(&undef).fusedCluster, k) << "ANYR_FUSED_CLUSTER=" << k;
  }
  {
    EnvGuard g("ANYR_FUSED_CLUSTER", "8");
    anyrConfig_t u = ANYR_CONFIG_INITIALIZER;
    u.fusedCluster = 2;
    EXPECT_EQ(resolveConfig(&u).fusedCluster, 2);  // the field wins over the environment
    u.fusedCluster = 0;
    EXPECT_EQ(resolveConfig(&u).fusedCluster, 0);  // explicit 0 (automatic) too
  }
  {
    EnvGuard g("ANYR_FUSED_CLUSTER", "3");     // a bad variable is not consulted when the field
    anyrConfig_t u = ANYR_CONFIG_INITIALIZER;  // is set (as for every other field)
    u.fusedCluster = 4;
    EXPECT_EQ(resolveConfig(&u).fusedCluster, 4);
  }
}

TEST(Config, FusedClusterBadValuesNameTheArgumentAndRule) {
  const std::string rule = "must be 0 (automatic), 1 (off), 2, 4 or 8";
  for (int k : {3, -1, 16, 5, 6, 7, 9, 32}) {
    anyrConfig_t u = ANYR_CONFIG_INITIALIZER;
    u.fusedCluster = k;
    expectInvalid(&u, "config.fusedCluster / ANYR_FUSED_CLUSTER");
    expectInvalid(&u, rule);
    expectInvalid(&u, "(got " + std::to_string(k) + ")");
  }
  for (const char* text : {"3", "-1", "16", "4294967298", "two", "2x", " "}) {
    EnvGuard g("ANYR_FUSED_CLUSTER", text);
    expectInvalid(nullptr, "ANYR_FUSED_CLUSTER");
    anyrConfig_t undef = ANYR_CONFIG_INITIALIZER;
    expectInvalid(&undef, "ANYR_FUSED_CLUSTER");
  }
  {
    EnvGuard g("ANYR_FUSED_CLUSTER", "16");
    expectInvalid(nullptr, rule);
    expectInvalid(nullptr, "(got 16)");
  }
  {
    EnvGuard g("ANYR_FUSED_CLUSTER", "4294967298");  // 2^32 + 2: would read as 2 after an int cast
    expectInvalid(nullptr, "(got 4294967298)");
  }
}

TEST(Config, FusedClusterCrossesProcesses) {
  anyrConfig_t u = ANYR_CONFIG_INITIALIZER;
  u.fusedCluster = 4;
  Config c = resolveConfig(&u);
  Config back = Config::fromWire(c.toWire());
  EXPECT_EQ(back.fusedCluster, 4);
  EXPECT_TRUE(back == c);
  Config d = c;
  d.fusedCluster = 8;
  EXPECT_FALSE(d == c);
  EXPECT_NE(c.describe().find("fusedCluster=4"), std::string::npos) << c.describe();
}

TEST(Config, PeerMemoryFromFieldOrEnvironment) {
  EXPECT_EQ(resolveConfig(nullptr).peerMemory, anyrPeerMemoryAuto);  // the default
  const std::pair<const char*, anyrPeerMemory_t> names[] = {
      {"none", anyrPeerMemoryNone},        {"auto", anyrPeerMemoryAuto},
      {"cuda-ipc", anyrPeerMemoryCudaIpc}, {"vmm", anyrPeerMemoryVmm},
      {"0", anyrPeerMemoryNone},           {"1", anyrPeerMemoryAuto}};
  for (const auto& [text, kind] : names) {
    EnvGuard g("ANYR_PEER_MEMORY", text);
    EXPECT_EQ(resolveConfig(nullptr).peerMemory, kind) << "ANYR_PEER_MEMORY=" << text;
    anyrConfig_t u = ANYR_CONFIG_INITIALIZER;
    u.peerMemory = anyrPeerMemoryVmm;  // the field wins over the variable
    EXPECT_EQ(resolveConfig(&u).peerMemory, anyrPeerMemoryVmm);
  }
  for (int k = 0; k < anyrNumPeerMemories; ++k) {
    anyrConfig_t u = ANYR_CONFIG_INITIALIZER;
    u.peerMemory = k;
    const Config c = resolveConfig(&u);
    EXPECT_EQ(c.peerMemory, k);
    EXPECT_TRUE(Config::fromWire(c.toWire()) == c);  // crosses processes
    anyrPeerMemory_t back = anyrPeerMemoryAuto;
    EXPECT_TRUE(parsePeerMemory(peerMemoryName(c.peerMemory), &back));
    EXPECT_EQ(back, c.peerMemory);
    EXPECT_NE(c.describe().find(std::string("peerMemory=") + peerMemoryName(c.peerMemory)),
              std::string::npos)
        << c.describe();
  }
  Config a = resolveConfig(nullptr);
  Config b = a;
  b.peerMemory = anyrPeerMemoryVmm;
  EXPECT_FALSE(a == b);
}

TEST(Config, PeerMemoryBadValuesNameTheArgumentAndRule) {
  for (int k : {-1, 4, 17}) {
    anyrConfig_t u = ANYR_CONFIG_INITIALIZER;
    u.peerMemory = k;
    expectInvalid(&u, "config.peerMemory");
    expectInvalid(&u, "none, auto, cuda-ipc, vmm");
  }
  for (const char* text : {"2", "ipc", "VMM", "posix", " vmm", "auto "}) {
    EnvGuard g("ANYR_PEER_MEMORY", text);
    expectInvalid(nullptr, std::string("ANYR_PEER_MEMORY='") + text + "'");
    expectInvalid(nullptr, "must be none, auto, cuda-ipc or vmm");
    anyrConfig_t set = ANYR_CONFIG_INITIALIZER;  // an explicit field does not read the variable
    set.peerMemory = anyrPeerMemoryCudaIpc;
    EXPECT_EQ(resolveConfig(&set).peerMemory, anyrPeerMemoryCudaIpc);
  }
}

// ANYR_EPILOGUE_HINTS: auto by default, off / on (0 / 1); anything else refused, naming the
// variable and its values. Each rank's own: not part of what rank 0 broadcasts.
TEST(Config, EpilogueHintsParseAndStayRankLocal) {
  EXPECT_EQ(resolveConfig(nullptr).epilogueHints, HintsMode::Auto);
  const struct {
    const char* text;
    HintsMode mode;
  } cases[] = {{"auto", HintsMode::Auto}, {"off", HintsMode::Off}, {"0", HintsMode::Off},
               {"on", HintsMode::On},     {"1", HintsMode::On},    {"", HintsMode::Auto}};
  for (const auto& c : cases) {
    EnvGuard g("ANYR_EPILOGUE_HINTS", c.text);
    const Config cfg = resolveConfig(nullptr);
    EXPECT_EQ(cfg.epilogueHints, c.mode) << c.text;
    EXPECT_EQ(epilogueHintsFromEnv(), c.mode) << c.text;
    EXPECT_NE(cfg.describe().find(std::string("epilogueHints=") + hintsModeName(c.mode)),
              std::string::npos)
        << cfg.describe();
    EXPECT_EQ(Config::fromWire(cfg.toWire()).epilogueHints, HintsMode::Auto) << c.text;
  }
  for (const char* text : {"2", "yes", "On", " on", "auto "}) {
    EnvGuard g("ANYR_EPILOGUE_HINTS", text);
    expectInvalid(nullptr, std::string("ANYR_EPILOGUE_HINTS='") + text + "'");
    expectInvalid(nullptr, "must be auto, off or on");
  }
}

TEST(Config, AlgoNames) {
  for (int i = 0; i < anyrNumAlgos; ++i) {
    anyrAlgo_t a;
    ASSERT_TRUE(parseAlgo(anyrAlgoName(static_cast<anyrAlgo_t>(i)), &a));
    EXPECT_EQ(a, i);
  }
  anyrAlgo_t a;
  EXPECT_FALSE(parseAlgo("oneshot", &a));
  EXPECT_EQ(anyrAlgoName(static_cast<anyrAlgo_t>(99)), nullptr);
}

}  // namespace
}  // namespace anyr
