// The public queries and controls for tools (anyreduce.h, "Queries and controls for tools"):
// every argument refused with its name and rule, and the answers that need no GPU.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "anyreduce/anyreduce.h"
#include "base/config.h"
#include "core/comm.h"
#include "processes.h"

namespace {

std::string fixture(const char* name) { return std::string(ANYR_FIXTURE_DIR) + "/" + name; }

// r is anyrInvalidArgument (or `want`) and this thread's last error contains `text`.
void expectRefused(anyrResult_t r, const std::string& text,
                   anyrResult_t want = anyrInvalidArgument) {
  EXPECT_EQ(r, want);
  const std::string msg = anyrGetLastError(nullptr);
  EXPECT_NE(msg.find(text), std::string::npos) << "message: " << msg;
}

TEST(ToolApi, ForcePathNamesTheBadArgument) {
  expectRefused(anyrCommForcePath(nullptr, nullptr, "nccl"),
                "anyrCommForcePath: argument 'op': must not be NULL");
  expectRefused(anyrCommForcePath(nullptr, "reduce", "nccl"),
                "argument 'op': must be one of allreduce, add-rmsnorm, add-rmsnorm-quant (got "
                "'reduce')");
  expectRefused(anyrCommForcePath(nullptr, "allreduce", "bogus"),
                "argument 'path': 'bogus' is not a path of allreduce");
  expectRefused(anyrCommForcePath(nullptr, "allreduce", "fused:oneshot-push"),
                "argument 'path': 'fused:oneshot-push' is not a path of allreduce");
  expectRefused(anyrCommForcePath(nullptr, "add-rmsnorm", "fused:oneshot-push/c3"),
                "'fused:oneshot-push/c3' is not a path of add-rmsnorm");
  // Well-formed names reach the communicator check.
  expectRefused(anyrCommForcePath(nullptr, "add-rmsnorm", "fused:oneshot-push/c2"),
                "argument 'comm': must not be NULL");
  expectRefused(anyrCommForcePath(nullptr, "add-rmsnorm-quant", "nccl+epilogue"),
                "argument 'comm': must not be NULL");
  expectRefused(anyrCommForcePath(nullptr, "allreduce", nullptr), "argument 'comm'");
  expectRefused(anyrCommForcePath(nullptr, "allreduce", ""), "argument 'comm'");
}

TEST(ToolApi, QueryAndDescribePathsNameTheBadArgument) {
  char buf[64];
  size_t needed = 0;
  expectRefused(anyrCommQueryPath(nullptr, nullptr, 1024, buf, sizeof(buf), &needed),
                "anyrCommQueryPath: argument 'op': must not be NULL");
  expectRefused(anyrCommQueryPath(nullptr, "allgather", 1024, buf, sizeof(buf), &needed),
                "argument 'op': must be one of");
  expectRefused(anyrCommQueryPath(nullptr, "allreduce", 1024, nullptr, 8, &needed),
                "argument 'buf': must not be NULL when len > 0");
  expectRefused(anyrCommQueryPath(nullptr, "allreduce", 1024, buf, sizeof(buf), &needed),
                "argument 'comm': must not be NULL");
  expectRefused(anyrCommDescribePaths(nullptr, nullptr, 8, &needed), "argument 'buf'");
  expectRefused(anyrCommDescribePaths(nullptr, buf, sizeof(buf), &needed),
                "anyrCommDescribePaths: argument 'comm': must not be NULL");
}

// anyrCommExplain hands its document out as the tool queries do: a NULL buf with len > 0 is
// refused, named before the communicator.
TEST(ToolApi, ExplainRefusesANullBufferWithALength) {
  size_t needed = 0;
  expectRefused(anyrCommExplain(nullptr, nullptr, 8, &needed),
                "anyrCommExplain: argument 'buf': must not be NULL when len > 0");
  expectRefused(anyrCommExplain(nullptr, nullptr, 0, &needed),
                "anyrCommExplain: argument 'comm': must not be NULL");
}

TEST(ToolApi, TuneOptionsAreChecked) {
  anyrTuneOptions_t o = ANYR_TUNE_OPTIONS_INITIALIZER;
  o.size = 8;
  expectRefused(anyrCommTuneWithOptions(nullptr, &o, nullptr),
                "argument 'options': size must be sizeof(anyrTuneOptions_t)");
  o = ANYR_TUNE_OPTIONS_INITIALIZER;
  o.magic = 0;
  expectRefused(anyrCommTuneWithOptions(nullptr, &o, nullptr),
                "argument 'options': magic must be ANYR_TUNE_MAGIC");
  o = ANYR_TUNE_OPTIONS_INITIALIZER;
  expectRefused(anyrCommTuneWithOptions(nullptr, &o, nullptr),
                "anyrCommTuneWithOptions: argument 'comm': must not be NULL");
  expectRefused(anyrCommTuneWithOptions(nullptr, nullptr, nullptr), "argument 'comm'");
}

TEST(ToolApi, TuneOptionsInitializerIsAnyrCommTunesDefaults) {
  const anyrTuneOptions_t o = ANYR_TUNE_OPTIONS_INITIALIZER;
  const anyr::Communicator::TuneOptions d;
  EXPECT_EQ(o.size, sizeof(anyrTuneOptions_t));
  EXPECT_EQ(o.magic, ANYR_TUNE_MAGIC);
  EXPECT_EQ(o.minBytes, d.minBytes);
  EXPECT_EQ(o.maxBytes, d.maxBytes);
  EXPECT_EQ(o.hidden, d.hidden);
  EXPECT_EQ(o.maxTokens, d.maxTokens);
  EXPECT_EQ(o.budgetMs, d.budgetMs);
  EXPECT_EQ(o.calls, d.calls);
  EXPECT_EQ(o.samples, d.samples);
  EXPECT_EQ(o.progress, nullptr);
  EXPECT_EQ(o.progressArg, nullptr);
}

TEST(ToolApi, ParseSize) {
  size_t v = 0;
  EXPECT_EQ(anyrParseSize("64K", &v), anyrSuccess);
  EXPECT_EQ(v, 65536u);
  EXPECT_EQ(anyrParseSize("8M", &v), anyrSuccess);
  EXPECT_EQ(v, 8u << 20);
  EXPECT_EQ(anyrParseSize("4096", &v), anyrSuccess);
  EXPECT_EQ(v, 4096u);
  expectRefused(anyrParseSize(nullptr, &v), "argument 'text': must not be NULL");
  expectRefused(anyrParseSize("1K", nullptr), "argument 'bytes': must not be NULL");
  expectRefused(anyrParseSize("12X", &v),
                "argument 'text': '12X' is not a size (e.g. 1024, 64K, 8M, 1G)");
  expectRefused(anyrParseSize("", &v), "'' is not a size");
}

TEST(ToolApi, ConfigCheckFieldIsTheCommunicatorsRule) {
  int valid = -1;
  const char* rule = nullptr;
  EXPECT_EQ(anyrConfigCheckField("maxBlocks", 256, &valid, &rule), anyrSuccess);
  EXPECT_EQ(valid, 1);
  EXPECT_STREQ(rule, anyr::kMaxBlocksRule);
  EXPECT_EQ(anyrConfigCheckField("maxBlocks", 257, &valid, nullptr), anyrSuccess);
  EXPECT_EQ(valid, 0);
  for (long long v : {0ll, 1ll, 2ll, 4ll, 8ll}) {
    EXPECT_EQ(anyrConfigCheckField("fusedCluster", v, &valid, &rule), anyrSuccess);
    EXPECT_EQ(valid, 1) << v;
  }
  EXPECT_STREQ(rule, anyr::kFusedClusterRule);
  for (long long v : {3ll, -1ll, 16ll, 4294967298ll}) {
    EXPECT_EQ(anyrConfigCheckField("fusedCluster", v, &valid, nullptr), anyrSuccess);
    EXPECT_EQ(valid, 0) << v;
  }
  expectRefused(anyrConfigCheckField(nullptr, 0, &valid, nullptr),
                "argument 'field': must not be NULL");
  expectRefused(anyrConfigCheckField("maxBlocks", 0, nullptr, nullptr),
                "argument 'valid': must not be NULL");
  expectRefused(anyrConfigCheckField("timeoutMs", 0, &valid, nullptr),
                "argument 'field': must be maxBlocks or fusedCluster (got 'timeoutMs')");
}

TEST(ToolApi, PeerMemoryNames) {
  EXPECT_STREQ(anyrPeerMemoryName(anyrPeerMemoryNone), "none");
  EXPECT_STREQ(anyrPeerMemoryName(anyrPeerMemoryAuto), "auto");
  EXPECT_STREQ(anyrPeerMemoryName(anyrPeerMemoryCudaIpc), "cuda-ipc");
  EXPECT_STREQ(anyrPeerMemoryName(anyrPeerMemoryVmm), "vmm");
  EXPECT_EQ(anyrPeerMemoryName(anyrNumPeerMemories), nullptr);
  EXPECT_EQ(anyrPeerMemoryName(static_cast<anyrPeerMemory_t>(-1)), nullptr);
}

TEST(ToolApi, EnvParamsListTheRegistryAndTruncate) {
  size_t needed = 0;
  ASSERT_EQ(anyrGetEnvParams(nullptr, 0, &needed), anyrSuccess);
  ASSERT_GT(needed, 2u);
  std::vector<char> buf(needed);
  ASSERT_EQ(anyrGetEnvParams(buf.data(), buf.size(), nullptr), anyrSuccess);
  EXPECT_EQ(std::strlen(buf.data()) + 1, needed);
  const auto j = nlohmann::json::parse(buf.data());
  ASSERT_TRUE(j.is_array());
  bool sawAlgo = false;
  for (const auto& p : j) {
    EXPECT_TRUE(p.contains("name") && p.contains("default") && p.contains("meaning"));
    sawAlgo = sawAlgo || p["name"] == "ANYR_ALGO";
  }
  EXPECT_TRUE(sawAlgo);
  char small[4];
  ASSERT_EQ(anyrGetEnvParams(small, sizeof(small), &needed), anyrSuccess);
  EXPECT_EQ(std::strlen(small), 3u);  // truncated, NUL-terminated
  expectRefused(anyrGetEnvParams(nullptr, 8, &needed), "argument 'buf'");
}

// Strings that reach the JSON documents from outside (an environment variable, a path) need not
// be UTF-8: the document is still made, with U+FFFD for the stray byte, not an internal error.
TEST(ToolApi, BytesThatAreNotUtf8InAnswers) {
  anyr::proctest::ScopedEnv ifname("ANYR_SOCKET_IFNAME", "eth\xff");
  size_t needed = 0;
  ASSERT_EQ(anyrGetEnvParams(nullptr, 0, &needed), anyrSuccess) << anyrGetLastError(nullptr);
  std::vector<char> buf(needed);
  ASSERT_EQ(anyrGetEnvParams(buf.data(), buf.size(), &needed), anyrSuccess);
  bool saw = false;
  for (const auto& p : nlohmann::json::parse(buf.data())) {
    if (p["name"] != "ANYR_SOCKET_IFNAME") continue;
    saw = true;
    EXPECT_EQ(p["value"], "eth\xef\xbf\xbd");  // U+FFFD
  }
  EXPECT_TRUE(saw);

  const std::string pair = fixture("nvlink_pair.json");
  const std::string tuning = "/nonexistent/\xff.json";
  ASSERT_EQ(anyrExplainTopology(pair.c_str(), 0, 1, tuning.c_str(), nullptr, nullptr, 0, &needed),
            anyrSuccess)
      << anyrGetLastError(nullptr);
  std::vector<char> ex(needed);
  ASSERT_EQ(anyrExplainTopology(pair.c_str(), 0, 1, tuning.c_str(), nullptr, ex.data(), ex.size(),
                                &needed),
            anyrSuccess);
  const std::string text = nlohmann::json::parse(ex.data()).dump();
  EXPECT_NE(text.find("/nonexistent/\xef\xbf\xbd.json"), std::string::npos) << text;
}

TEST(ToolApi, DescribeTopologyFile) {
  size_t needed = 0;
  expectRefused(anyrDescribeTopology(nullptr, nullptr, 0, &needed),
                "anyrDescribeTopology: argument 'path': must not be NULL");
  expectRefused(anyrDescribeTopology("/nonexistent/topo.json", nullptr, 0, &needed),
                "topology file '/nonexistent/topo.json': cannot open", anyrSystemError);
  const std::string path = fixture("nvlink_pair.json");
  ASSERT_EQ(anyrDescribeTopology(path.c_str(), nullptr, 0, &needed), anyrSuccess);
  std::vector<char> buf(needed);
  ASSERT_EQ(anyrDescribeTopology(path.c_str(), buf.data(), buf.size(), &needed), anyrSuccess);
  const auto j = nlohmann::json::parse(buf.data());
  EXPECT_EQ(j["gpus"], 2);
  EXPECT_EQ(j["source"], "fixture:nvlink_pair");
  EXPECT_NE(j["text"].get<std::string>().find("NV18"), std::string::npos);
}

nlohmann::json explain(const std::string& path, int nranks, int nccl, const anyrConfig_t* cfg) {
  size_t needed = 0;
  EXPECT_EQ(anyrExplainTopology(path.c_str(), nranks, nccl, nullptr, cfg, nullptr, 0, &needed),
            anyrSuccess)
      << anyrGetLastError(nullptr);
  std::vector<char> buf(needed);
  EXPECT_EQ(anyrExplainTopology(path.c_str(), nranks, nccl, nullptr, cfg, buf.data(), buf.size(),
                                &needed),
            anyrSuccess);
  return nlohmann::json::parse(buf.data());
}

TEST(ToolApi, ExplainTopologyFile) {
  size_t needed = 0;
  const std::string pair = fixture("nvlink_pair.json");
  expectRefused(anyrExplainTopology(nullptr, 0, 1, nullptr, nullptr, nullptr, 0, &needed),
                "anyrExplainTopology: argument 'path': must not be NULL");
  expectRefused(anyrExplainTopology(pair.c_str(), -1, 1, nullptr, nullptr, nullptr, 0, &needed),
                "argument 'nranks': must be >= 0");
  expectRefused(anyrExplainTopology(pair.c_str(), 3, 1, nullptr, nullptr, nullptr, 0, &needed),
                "argument 'nranks': 3 but the topology has 2 GPUs");
  expectRefused(anyrExplainTopology(pair.c_str(), 0, 1, nullptr, nullptr, nullptr, 4, &needed),
                "argument 'buf'");

  const auto j = explain(pair, 0, 1, nullptr);
  EXPECT_EQ(j["gpus"], 2);
  ASSERT_EQ(j["admission"].size(), static_cast<size_t>(anyrNumAlgos - 1));
  EXPECT_EQ(j["admission"][0]["algo"], "oneshot-push");
  EXPECT_EQ(j["forcedError"], "");
  EXPECT_NE(j["dispatchText"].get<std::string>().find("allreduce"), std::string::npos);

  const auto noNccl = explain(pair, 0, 0, nullptr);
  for (const auto& a : noNccl["admission"]) {
    if (a["algo"] == "nccl") {
      EXPECT_FALSE(a["admitted"].get<bool>());
      EXPECT_NE(a["reason"].get<std::string>().find("disabled"), std::string::npos);
    }
  }

  // A forced algorithm the topology does not admit: why, and no dispatch.
  anyrConfig_t cfg = ANYR_CONFIG_INITIALIZER;
  cfg.algorithm = anyrAlgoOneShotPush;
  const auto forced = explain(fixture("no_p2p.json"), 0, 1, &cfg);
  EXPECT_NE(forced["forcedError"].get<std::string>(), "");
  EXPECT_EQ(forced["dispatchText"], "");
  cfg.algorithm = 99;
  expectRefused(anyrExplainTopology(pair.c_str(), 0, 1, nullptr, &cfg, nullptr, 0, &needed),
                "config.algorithm");

  // One rank, as a live communicator of one: no peer or host algorithm, every call local.
  const auto one = explain(pair, 1, 1, nullptr);
  EXPECT_EQ(one["gpus"], 1);
  int refusedLocal = 0;
  for (const auto& a : one["admission"]) {
    if (a["algo"] == "nccl") continue;
    EXPECT_FALSE(a["admitted"].get<bool>()) << a.dump();
    refusedLocal +=
        a["reason"].get<std::string>().find("a single rank needs no") != std::string::npos;
  }
  EXPECT_GT(refusedLocal, 0) << one["admission"].dump();
  EXPECT_EQ(one["dispatchText"].get<std::string>().rfind("one rank: anyrAllReduce is a copy", 0),
            0u)
      << one["dispatchText"];

  // A file without GPUs describes no communicator.
  const std::string empty = ::testing::TempDir() + "anyr_no_gpus.json";
  {
    std::ifstream in(pair);
    nlohmann::json topo = nlohmann::json::parse(in);
    topo["gpus"] = nlohmann::json::array();
    topo["pairs"] = nlohmann::json::array();
    std::ofstream(empty) << topo.dump();
  }
  expectRefused(anyrExplainTopology(empty.c_str(), 0, 1, nullptr, nullptr, nullptr, 0, &needed),
                "argument 'path': the topology file '" + empty + "' lists no GPU");
  std::remove(empty.c_str());
}

TEST(ToolApi, ProbeRefusesABadBufferBeforeProbing) {
  size_t needed = 0;
  expectRefused(anyrProbeTopology(0, nullptr, nullptr, 16, &needed),
                "anyrProbeTopology: argument 'buf': must not be NULL when len > 0");
}

}  // namespace
