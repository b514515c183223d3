// Topology model without a GPU: link names, fixtures, the JSON round trip, the strict reader's
// error messages, and the printed tables.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "topology/nvml.h"
#include "topology/probe.h"
#include "topology/topology.h"

namespace anyr {
namespace {

using nlohmann::json;

const char* const kFixtures[] = {"nvlink_pair", "pcie_no_atomics",        "pcie_slow_writes",
                                 "no_p2p",      "pcie_8gpu_two_switches", "nvlink_8gpu"};

std::string fixturePath(const std::string& name) {
  return std::string(ANYR_FIXTURE_DIR) + "/" + name + ".json";
}

std::string readText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

json fixtureJson(const std::string& name) { return json::parse(readText(fixturePath(name))); }

// A scratch file removed at scope exit.
class TempFile {
 public:
  TempFile() {
    char tmpl[] = "/tmp/anyr_topology_test_XXXXXX";
    int fd = mkstemp(tmpl);
    EXPECT_GE(fd, 0);
    if (fd >= 0) close(fd);
    path_ = tmpl;
  }
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }
  void write(const std::string& text) const {
    std::ofstream out(path_, std::ios::binary | std::ios::trunc);
    out << text;
  }

 private:
  std::string path_;
};

void expectSameGpu(const GpuInfo& a, const GpuInfo& b, const std::string& where) {
  SCOPED_TRACE(where);
  EXPECT_EQ(a.index, b.index);
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.pciBusId, b.pciBusId);
  EXPECT_EQ(a.uuid, b.uuid);
  EXPECT_EQ(a.hostHash, b.hostHash);
  EXPECT_EQ(a.ccMajor, b.ccMajor);
  EXPECT_EQ(a.ccMinor, b.ccMinor);
  EXPECT_EQ(a.smCount, b.smCount);
  EXPECT_EQ(a.sharedMemPerBlockOptin, b.sharedMemPerBlockOptin);
  EXPECT_EQ(a.sharedMemPerSm, b.sharedMemPerSm);
  EXPECT_EQ(a.clusterLaunch, b.clusterLaunch);
  EXPECT_EQ(a.hostNativeAtomics, b.hostNativeAtomics);
  EXPECT_EQ(a.totalMemBytes, b.totalMemBytes);
  EXPECT_EQ(a.numaNode, b.numaNode);
  EXPECT_EQ(a.pcieGen, b.pcieGen);
  EXPECT_EQ(a.pcieWidth, b.pcieWidth);
  EXPECT_EQ(a.pcieMaxGen, b.pcieMaxGen);
  EXPECT_EQ(a.pcieMaxWidth, b.pcieMaxWidth);
}

void expectSamePair(const PairInfo& a, const PairInfo& b, const std::string& where) {
  SCOPED_TRACE(where);
  EXPECT_EQ(a.src, b.src);
  EXPECT_EQ(a.dst, b.dst);
  EXPECT_EQ(a.link, b.link);
  EXPECT_EQ(a.nvlinkCount, b.nvlinkCount);
  EXPECT_EQ(a.linkGBps, b.linkGBps);  // exact: the writer keeps every bit of a double
  EXPECT_EQ(a.pcieRelation, b.pcieRelation);
  EXPECT_EQ(a.driverPeerAccess, b.driverPeerAccess);
  EXPECT_EQ(a.driverAtomics, b.driverAtomics);
  EXPECT_EQ(a.peerWriteOk, b.peerWriteOk);
  EXPECT_EQ(a.peerReadOk, b.peerReadOk);
  EXPECT_EQ(a.peerAtomicOk, b.peerAtomicOk);
  EXPECT_EQ(a.writeGBps, b.writeGBps);
  EXPECT_EQ(a.readGBps, b.readGBps);
  EXPECT_EQ(a.latencyUs, b.latencyUs);
}

void expectSameTopology(const Topology& a, const Topology& b) {
  EXPECT_EQ(a.source, b.source);
  EXPECT_EQ(a.hostName, b.hostName);
  EXPECT_EQ(a.driverVersion, b.driverVersion);
  EXPECT_EQ(a.cudaDriverVersion, b.cudaDriverVersion);
  EXPECT_EQ(a.cudaRuntimeVersion, b.cudaRuntimeVersion);
  ASSERT_EQ(a.gpus.size(), b.gpus.size());
  ASSERT_EQ(a.pairs.size(), b.pairs.size());
  for (size_t i = 0; i < a.gpus.size(); ++i) {
    expectSameGpu(a.gpus[i], b.gpus[i], "gpus[" + std::to_string(i) + "]");
  }
  for (size_t i = 0; i < a.pairs.size(); ++i) {
    expectSamePair(a.pairs[i], b.pairs[i], "pairs[" + std::to_string(i) + "]");
  }
}

// Runs topologyFromJson and returns the anyrInvalidArgument message ("" and a failure when it
// did not throw, or threw something else).
std::string loadError(const std::string& text) {
  try {
    topologyFromJson(text);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), anyrInvalidArgument) << e.what();
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "unexpected exception type: " << e.what();
    return "";
  }
  ADD_FAILURE() << "no error for: " << text.substr(0, 200);
  return "";
}

std::string loadError(const json& j) { return loadError(j.dump()); }
std::string loadError(const char* text) { return loadError(std::string(text)); }

// ---------------------------------------------------------------------------------------------

TEST(TopologyLinkType, NamesRoundTrip) {
  const LinkType all[] = {LinkType::Unknown, LinkType::Self, LinkType::NVLink, LinkType::PCIe,
                          LinkType::None};
  for (LinkType t : all) {
    LinkType back = LinkType::Unknown;
    ASSERT_TRUE(parseLinkType(linkTypeName(t), &back)) << linkTypeName(t);
    EXPECT_EQ(back, t);
  }
  EXPECT_STREQ(linkTypeName(LinkType::NVLink), "nvlink");
  EXPECT_STREQ(linkTypeName(LinkType::PCIe), "pcie");
  EXPECT_STREQ(linkTypeName(LinkType::None), "none");
  EXPECT_STREQ(linkTypeName(LinkType::Self), "self");
  EXPECT_STREQ(linkTypeName(LinkType::Unknown), "unknown");
}

TEST(TopologyLinkType, ParseIsCaseInsensitiveAndRejectsOthers) {
  LinkType t = LinkType::Unknown;
  EXPECT_TRUE(parseLinkType("NVLink", &t));
  EXPECT_EQ(t, LinkType::NVLink);
  EXPECT_TRUE(parseLinkType("PCIe", &t));
  EXPECT_EQ(t, LinkType::PCIe);
  t = LinkType::Self;
  EXPECT_FALSE(parseLinkType("infiniband", &t));
  EXPECT_FALSE(parseLinkType("", &t));
  EXPECT_FALSE(parseLinkType("nvlink ", &t));
  EXPECT_EQ(t, LinkType::Self);  // untouched on failure
}

TEST(TopologyModel, ResizePairsFillsIndicesAndDiagonal) {
  Topology t;
  t.gpus.resize(3);
  t.resizePairs();
  ASSERT_EQ(t.pairs.size(), 9u);
  for (int s = 0; s < 3; ++s) {
    for (int d = 0; d < 3; ++d) {
      EXPECT_EQ(t.pair(s, d).src, s);
      EXPECT_EQ(t.pair(s, d).dst, d);
      EXPECT_EQ(t.pair(s, d).link, s == d ? LinkType::Self : LinkType::Unknown);
      EXPECT_LT(t.pair(s, d).writeGBps, 0);
    }
  }
  t.pair(1, 2).writeGBps = 12.5;
  EXPECT_EQ(t.pairs[1 * 3 + 2].writeGBps, 12.5);
}

TEST(TopologyModel, PairOutOfRangeThrows) {
  Topology t;
  t.gpus.resize(2);
  t.resizePairs();
  try {
    t.pair(2, 0);
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), anyrInternalError);
  }
  EXPECT_THROW(t.pair(0, -1), Error);
  t.pairs.pop_back();  // inconsistent size
  EXPECT_THROW(t.pair(0, 0), Error);
}

// ---------------------------------------------------------------------------------------------
// Fixtures

class TopologyFixture : public ::testing::TestWithParam<const char*> {};

TEST_P(TopologyFixture, LoadsAndRoundTrips) {
  const std::string name = GetParam();
  const Topology t = loadTopologyFile(fixturePath(name));
  EXPECT_EQ(t.source, "fixture:" + name);
  ASSERT_GE(t.size(), 2);
  ASSERT_EQ(t.pairs.size(), static_cast<size_t>(t.size() * t.size()));
  for (int i = 0; i < t.size(); ++i) {
    EXPECT_EQ(t.gpus[static_cast<size_t>(i)].index, i);
    EXPECT_EQ(t.pair(i, i).link, LinkType::Self);
    EXPECT_GT(t.gpus[static_cast<size_t>(i)].smCount, 0);
    EXPECT_EQ(t.gpus[static_cast<size_t>(i)].hostHash, t.gpus[0].hostHash);
  }

  const std::string text = topologyToJson(t);
  const Topology back = topologyFromJson(text);
  expectSameTopology(t, back);
  // Writing again gives the same bytes.
  EXPECT_EQ(topologyToJson(back), text);
  // Compact output reads back the same too.
  expectSameTopology(t, topologyFromJson(topologyToJson(t, -1)));

  // Through a file.
  TempFile f;
  saveTopologyFile(t, f.path());
  expectSameTopology(t, loadTopologyFile(f.path()));
}

INSTANTIATE_TEST_SUITE_P(All, TopologyFixture, ::testing::ValuesIn(kFixtures));

TEST(TopologyFixtures, NvlinkPairValues) {
  const Topology t = loadTopologyFile(fixturePath("nvlink_pair"));
  ASSERT_EQ(t.size(), 2);
  const GpuInfo& g = t.gpus[0];
  EXPECT_EQ(g.name, "NVIDIA H200");
  EXPECT_EQ(g.pciBusId, "0000:19:00.0");
  EXPECT_EQ(g.smCount, 132);
  EXPECT_EQ(g.sharedMemPerBlockOptin, 227 * 1024);
  EXPECT_TRUE(g.clusterLaunch);
  EXPECT_EQ(g.pcieGen, 5);
  EXPECT_EQ(g.pcieWidth, 16);
  for (int s = 0; s < 2; ++s) {
    const PairInfo& p = t.pair(s, 1 - s);
    EXPECT_EQ(p.link, LinkType::NVLink);
    EXPECT_EQ(p.nvlinkCount, 18);
    EXPECT_DOUBLE_EQ(p.linkGBps, 18 * 26.5625);
    EXPECT_TRUE(p.driverPeerAccess && p.driverAtomics);
    EXPECT_TRUE(p.peerWriteOk && p.peerReadOk && p.peerAtomicOk);
    EXPECT_NEAR(p.writeGBps, 366, 3);
    EXPECT_NEAR(p.readGBps, 333, 3);
    EXPECT_NEAR(p.latencyUs, 1.2, 0.05);
  }
  EXPECT_EQ(t.pair(0, 1).writeGBps, 366.1);
  EXPECT_EQ(t.pair(0, 1).latencyUs, 1.21);
}

TEST(TopologyFixtures, PcieNoAtomicsValues) {
  const Topology t = loadTopologyFile(fixturePath("pcie_no_atomics"));
  ASSERT_EQ(t.size(), 4);
  EXPECT_EQ(t.gpus[3].smCount, 188);
  EXPECT_EQ(t.gpus[3].sharedMemPerBlockOptin, 101376);
  for (int s = 0; s < 4; ++s) {
    for (int d = 0; d < 4; ++d) {
      if (s == d) continue;
      const PairInfo& p = t.pair(s, d);
      EXPECT_EQ(p.link, LinkType::PCIe);
      EXPECT_TRUE(p.driverPeerAccess);
      EXPECT_FALSE(p.driverAtomics);
      EXPECT_TRUE(p.peerWriteOk && p.peerReadOk);
      EXPECT_FALSE(p.peerAtomicOk);
      EXPECT_NEAR(p.writeGBps, 25, 2);
      EXPECT_NEAR(p.readGBps, 25, 2);
    }
  }
}

TEST(TopologyFixtures, PcieSlowWritesValues) {
  const Topology t = loadTopologyFile(fixturePath("pcie_slow_writes"));
  ASSERT_EQ(t.size(), 2);
  for (int s = 0; s < 2; ++s) {
    const PairInfo& p = t.pair(s, 1 - s);
    EXPECT_EQ(p.link, LinkType::PCIe);
    EXPECT_NEAR(p.readGBps, 52, 1);
    EXPECT_NEAR(p.writeGBps, 2.6, 0.1);
    EXPECT_GT(p.readGBps, 10 * p.writeGBps);
  }
}

TEST(TopologyFixtures, NoP2pValues) {
  const Topology t = loadTopologyFile(fixturePath("no_p2p"));
  ASSERT_EQ(t.size(), 4);
  for (const PairInfo& p : t.pairs) {
    if (p.src == p.dst) continue;
    EXPECT_EQ(p.link, LinkType::None);
    EXPECT_FALSE(p.driverPeerAccess || p.driverAtomics || p.peerWriteOk || p.peerReadOk ||
                 p.peerAtomicOk);
    EXPECT_EQ(p.writeGBps, -1);
    EXPECT_EQ(p.readGBps, -1);
    EXPECT_EQ(p.latencyUs, -1);
  }
}

TEST(TopologyFixtures, TwoSwitchesValues) {
  const Topology t = loadTopologyFile(fixturePath("pcie_8gpu_two_switches"));
  ASSERT_EQ(t.size(), 8);
  for (int s = 0; s < 8; ++s) {
    for (int d = 0; d < 8; ++d) {
      if (s == d) continue;
      const PairInfo& p = t.pair(s, d);
      const bool same = s / 4 == d / 4;
      EXPECT_EQ(p.link, LinkType::PCIe);
      EXPECT_EQ(p.pcieRelation, same ? "switch" : "system");
      EXPECT_EQ(p.peerAtomicOk, same) << s << "->" << d;
      EXPECT_EQ(p.driverAtomics, same) << s << "->" << d;
      EXPECT_TRUE(p.peerWriteOk && p.peerReadOk);
      if (!same) {
        EXPECT_LT(p.writeGBps, t.pair(s, (s / 4) * 4 + (s % 4 + 1) % 4).writeGBps);
        EXPECT_LT(p.readGBps, t.pair(s, (s / 4) * 4 + (s % 4 + 1) % 4).readGBps);
      }
    }
  }
}

TEST(TopologyFixtures, Nvlink8Values) {
  const Topology t = loadTopologyFile(fixturePath("nvlink_8gpu"));
  ASSERT_EQ(t.size(), 8);
  for (const PairInfo& p : t.pairs) {
    if (p.src == p.dst) continue;
    EXPECT_EQ(p.link, LinkType::NVLink);
    EXPECT_EQ(p.nvlinkCount, 18);
    EXPECT_TRUE(p.peerWriteOk && p.peerReadOk && p.peerAtomicOk);
    EXPECT_GT(p.writeGBps, 300);
  }
}

// ---------------------------------------------------------------------------------------------
// The strict reader

TEST(TopologyJson, MessageNamesThePathOfTheBadField) {
  json j = fixtureJson("pcie_no_atomics");
  j["gpus"][2]["smCount"] = -4;
  EXPECT_EQ(loadError(j), "topology: gpus[2].smCount: must be an integer >= 0");
}

TEST(TopologyJson, TruncatedFile) {
  const std::string text = readText(fixturePath("nvlink_pair"));
  const std::string msg = loadError(text.substr(0, text.size() / 2));
  EXPECT_NE(msg.find("topology: not valid JSON"), std::string::npos) << msg;
  EXPECT_NE(msg.find("parse error"), std::string::npos) << msg;  // the parser's own words
}

TEST(TopologyJson, NotJson) {
  EXPECT_NE(loadError("hello").find("not valid JSON"), std::string::npos);
  EXPECT_NE(loadError("").find("not valid JSON"), std::string::npos);
  EXPECT_NE(loadError(std::string("\xff\xfe\x00\x01", 4)).find("not valid JSON"),
            std::string::npos);
  EXPECT_NE(loadError(std::string(100000, '[')).find("not valid JSON"), std::string::npos);
  EXPECT_NE(loadError("[1, 2]").find("must be a JSON object"), std::string::npos);
  // Deep nesting in a field is a type error, not a crash.
  json j = fixtureJson("nvlink_pair");
  json deep = json::array();
  for (int i = 0; i < 1000; ++i) deep = json::array({deep});
  j["gpus"][0]["name"] = deep;
  EXPECT_EQ(loadError(j), "topology: gpus[0].name: must be a string (got an array)");
}

TEST(TopologyJson, WrongType) {
  json j = fixtureJson("nvlink_pair");
  j["gpus"][1]["smCount"] = "132";
  EXPECT_EQ(loadError(j), "topology: gpus[1].smCount: must be an integer >= 0 (got a string)");

  j = fixtureJson("nvlink_pair");
  j["gpus"][0]["smCount"] = 132.5;
  EXPECT_EQ(loadError(j),
            "topology: gpus[0].smCount: must be an integer >= 0 (got a fractional number)");

  j = fixtureJson("nvlink_pair");
  j["pairs"][1]["peerWriteOk"] = 1;
  EXPECT_EQ(loadError(j), "topology: pairs[1].peerWriteOk: must be true or false (got an integer)");

  j = fixtureJson("nvlink_pair");
  j["gpus"] = json::object();
  EXPECT_EQ(loadError(j), "topology: gpus: must be an array (got an object)");

  j = fixtureJson("nvlink_pair");
  j["pairs"][2] = 7;
  EXPECT_EQ(loadError(j), "topology: pairs[2]: must be an object, not an integer");

  j = fixtureJson("nvlink_pair");
  j["pairs"][1]["writeGBps"] = "fast";
  EXPECT_NE(loadError(j).find("pairs[1].writeGBps: must be a number >= 0, or -1"),
            std::string::npos);
}

TEST(TopologyJson, OutOfRange) {
  json j = fixtureJson("nvlink_pair");
  j["gpus"][0]["numaNode"] = -2;
  EXPECT_EQ(loadError(j), "topology: gpus[0].numaNode: must be an integer >= -1");

  j = fixtureJson("nvlink_pair");
  j["gpus"][1]["smCount"] = 5000000000ll;  // does not fit an int
  EXPECT_EQ(loadError(j), "topology: gpus[1].smCount: must be an integer >= 0");

  j = fixtureJson("nvlink_pair");
  j["gpus"][1]["totalMemBytes"] = std::numeric_limits<uint64_t>::max();
  EXPECT_EQ(loadError(j), "topology: gpus[1].totalMemBytes: must be an integer >= 0");

  j = fixtureJson("nvlink_pair");
  j["pairs"][1]["latencyUs"] = -2.5;
  EXPECT_EQ(loadError(j),
            "topology: pairs[1].latencyUs: must be a number >= 0, or -1 when not measured");

  j = fixtureJson("nvlink_pair");
  j["gpus"][1]["index"] = -2;
  EXPECT_EQ(loadError(j), "topology: gpus[1].index: must be an integer >= -1");

  j = fixtureJson("nvlink_pair");
  j["gpus"][0]["hostHash"] = "xyz";
  EXPECT_NE(loadError(j).find("gpus[0].hostHash: must be a string of 1 to 16 hexadecimal"),
            std::string::npos);

  j = fixtureJson("nvlink_pair");
  j["gpus"][0]["hostHash"] = "00112233445566778";  // 17 digits
  EXPECT_NE(loadError(j).find("gpus[0].hostHash"), std::string::npos);

  j = fixtureJson("nvlink_pair");
  j["cudaDriverVersion"] = -1;
  EXPECT_EQ(loadError(j), "topology: cudaDriverVersion: must be an integer >= 0");
}

TEST(TopologyJson, EnumeratedStrings) {
  json j = fixtureJson("nvlink_pair");
  j["pairs"][1]["link"] = "ethernet";
  EXPECT_NE(loadError(j).find("pairs[1].link: must be one of"), std::string::npos);

  j = fixtureJson("nvlink_pair");
  j["pairs"][3]["link"] = "nvlink";  // the diagonal (1, 1)
  EXPECT_EQ(loadError(j), "topology: pairs[3].link: must be \"self\" on the diagonal");

  j = fixtureJson("nvlink_pair");
  j["pairs"][1]["pcieRelation"] = "cousin";
  EXPECT_NE(loadError(j).find("pairs[1].pcieRelation: must be one of"), std::string::npos);
}

TEST(TopologyJson, WrongPairCount) {
  json j = fixtureJson("pcie_no_atomics");
  j["pairs"].erase(j["pairs"].size() - 1);
  EXPECT_EQ(loadError(j), "topology: pairs: must hold exactly 16 entries (4 GPUs squared), not 15");

  j = fixtureJson("pcie_no_atomics");
  j["gpus"].erase(3);
  EXPECT_EQ(loadError(j), "topology: pairs: must hold exactly 9 entries (3 GPUs squared), not 16");
}

TEST(TopologyJson, PairsOutOfOrder) {
  json j = fixtureJson("nvlink_pair");
  std::swap(j["pairs"][1], j["pairs"][2]);
  EXPECT_EQ(loadError(j),
            "topology: pairs[1].src: must be 0 (pairs are row-major by src, then dst)");

  j = fixtureJson("nvlink_pair");
  j["pairs"][1]["dst"] = 0;
  EXPECT_EQ(loadError(j),
            "topology: pairs[1].dst: must be 1 (pairs are row-major by src, then dst)");
}

TEST(TopologyJson, MissingAndUnknownFields) {
  json j = fixtureJson("nvlink_pair");
  j["gpus"][0].erase("uuid");
  EXPECT_EQ(loadError(j), "topology: gpus[0].uuid: missing field");

  j = fixtureJson("nvlink_pair");
  j["pairs"][2].erase("latencyUs");
  EXPECT_EQ(loadError(j), "topology: pairs[2].latencyUs: missing field");

  j = fixtureJson("nvlink_pair");
  j.erase("pairs");
  EXPECT_EQ(loadError(j), "topology: pairs: missing field");

  j = fixtureJson("nvlink_pair");
  j["gpus"][1]["smcount"] = 132;  // a typo is not silently ignored
  EXPECT_EQ(loadError(j), "topology: gpus[1].smcount: unknown field");
}

TEST(TopologyJson, ForeignFormatAndVersion) {
  json j = fixtureJson("nvlink_pair");
  j["format"] = "nccl-topology";
  EXPECT_EQ(loadError(j),
            "topology: format: must be \"anyreduce-topology\" (got \"nccl-topology\")");

  j = fixtureJson("nvlink_pair");
  j.erase("format");
  EXPECT_NE(loadError(j).find("topology: format: missing field"), std::string::npos);

  EXPECT_NE(loadError("{\"system\": {\"cpu\": []}}").find("format: missing field"),
            std::string::npos);

  j = fixtureJson("nvlink_pair");
  j["version"] = 2;
  EXPECT_EQ(loadError(j), "topology: version: unsupported version; this build reads version 1");
}

TEST(TopologyJson, WriterNormalizesUnmeasuredValues) {
  Topology t = loadTopologyFile(fixturePath("nvlink_pair"));
  t.pair(0, 1).writeGBps = std::nan("");
  t.pair(0, 1).readGBps = std::numeric_limits<double>::infinity();
  t.pair(1, 0).latencyUs = -7;
  const Topology back = topologyFromJson(topologyToJson(t));
  EXPECT_EQ(back.pair(0, 1).writeGBps, -1);
  EXPECT_EQ(back.pair(0, 1).readGBps, -1);
  EXPECT_EQ(back.pair(1, 0).latencyUs, -1);
  EXPECT_EQ(back.pair(1, 0).writeGBps, t.pair(1, 0).writeGBps);
}

TEST(TopologyJson, EmptyTopologyRoundTrips) {
  Topology t;
  t.source = "probe";
  const Topology back = topologyFromJson(topologyToJson(t));
  EXPECT_EQ(back.size(), 0);
  EXPECT_TRUE(back.pairs.empty());
  EXPECT_EQ(back.source, "probe");
}

// How a communicator rank sends its own GPU: one GPU numbered by its rank, pairs sized.
TEST(TopologyJson, SingleGpuNumberedByRank) {
  Topology t = loadTopologyFile(fixturePath("nvlink_pair"));
  Topology one;
  one.gpus.push_back(t.gpus[1]);
  one.gpus[0].index = 5;
  std::string msg = loadError(topologyToJson(one));  // pairs not sized: rejected
  EXPECT_EQ(msg, "topology: pairs: must hold exactly 1 entries (1 GPUs squared), not 0");
  one.resizePairs();
  const Topology back = topologyFromJson(topologyToJson(one, -1));
  ASSERT_EQ(back.size(), 1);
  expectSameGpu(one.gpus[0], back.gpus[0], "gpus[0]");
  EXPECT_EQ(back.pair(0, 0).link, LinkType::Self);
}

TEST(TopologyJson, HostHashKeepsAll64Bits) {
  Topology t = loadTopologyFile(fixturePath("nvlink_pair"));
  t.gpus[0].hostHash = 0xfedcba9876543210ull;
  t.gpus[1].hostHash = 1;
  const std::string text = topologyToJson(t);
  EXPECT_NE(text.find("\"fedcba9876543210\""), std::string::npos);
  const Topology back = topologyFromJson(text);
  EXPECT_EQ(back.gpus[0].hostHash, 0xfedcba9876543210ull);
  EXPECT_EQ(back.gpus[1].hostHash, 1u);
}

TEST(TopologyFile, ErrorsNameThePath) {
  const std::string missing = "/nonexistent/anyr/topology.json";
  try {
    loadTopologyFile(missing);
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }

  TempFile f;
  json j = fixtureJson("nvlink_pair");
  j["gpus"][1]["smCount"] = -1;
  f.write(j.dump(2));
  try {
    loadTopologyFile(f.path());
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), anyrInvalidArgument);
    EXPECT_EQ(std::string(e.what()),
              "topology file '" + f.path() + "': gpus[1].smCount: must be an integer >= 0");
  }

  f.write(readText(fixturePath("nvlink_pair")).substr(0, 100));
  try {
    loadTopologyFile(f.path());
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), anyrInvalidArgument);
    EXPECT_NE(std::string(e.what()).find(f.path()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("not valid JSON"), std::string::npos) << e.what();
  }

  const Topology t = loadTopologyFile(fixturePath("nvlink_pair"));
  try {
    saveTopologyFile(t, "/nonexistent/anyr/out.json");
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/anyr/out.json"), std::string::npos);
  }
}

// ---------------------------------------------------------------------------------------------
// Tables

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string l;
  while (std::getline(in, l)) out.push_back(l);
  return out;
}

// The lines of the matrix whose title starts with `title` (header row and one row per GPU).
std::vector<std::string> matrix(const std::string& text, const std::string& title, int n) {
  std::vector<std::string> all = lines(text);
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i].rfind(title, 0) == 0) {
      EXPECT_LE(i + 1 + static_cast<size_t>(n), all.size() - 1);
      return std::vector<std::string>(all.begin() + static_cast<long>(i) + 1,
                                      all.begin() + static_cast<long>(i) + 2 + n);
    }
  }
  ADD_FAILURE() << "no matrix titled '" << title << "' in:\n" << text;
  return {};
}

// printTopology's text.
std::string printed(const Topology& t) {
  std::ostringstream os;
  printTopology(t, os);
  return os.str();
}

// Row `row` of the n-GPU matrix titled `title` (0: the header row, then one row per GPU), which
// must have its n + 1 rows; "" where it has not.
std::string matrixRow(const std::string& text, const std::string& title, int n, size_t row) {
  const std::vector<std::string> m = matrix(text, title, n);
  EXPECT_EQ(m.size(), static_cast<size_t>(n) + 1) << title;
  return row < m.size() ? m[row] : std::string();
}

TEST(TopologyPrint, NvlinkPairTables) {
  const std::string out = printed(loadTopologyFile(fixturePath("nvlink_pair")));

  // GPU table: fixed-width columns, one row per GPU.
  std::vector<std::string> all = lines(out);
  size_t head = 0;
  while (head < all.size() && all[head].find("Bus id") == std::string::npos) ++head;
  ASSERT_LT(head + 2, all.size()) << out;
  const std::string& header = all[head];
  const std::string& row0 = all[head + 1];
  const std::string& row1 = all[head + 2];
  EXPECT_EQ(row0.find("0000:19:00.0"), header.find("Bus id")) << out;
  EXPECT_EQ(row1.find("0000:3b:00.0"), header.find("Bus id")) << out;
  EXPECT_EQ(row0.find("NVIDIA H200"), header.find("Name")) << out;
  for (const char* cell : {" 132 ", " 227 ", " yes ", " 140.4 ", "Gen5 x16"}) {
    EXPECT_NE(row0.find(cell), std::string::npos) << "'" << cell << "' in: " << row0;
  }
  // SMs right-aligned under their header.
  const size_t smsEnd = header.find("SMs") + 3;
  EXPECT_EQ(row0.substr(smsEnd - 3, 3), "132") << out;

  EXPECT_EQ(matrix(out, "Link", 2),
            (std::vector<std::string>{"      GPU0  GPU1", "GPU0     X  NV18", "GPU1  NV18     X"}))
      << out;
  EXPECT_EQ(matrix(out, "Driver peer access", 2),
            (std::vector<std::string>{"         GPU0     GPU1", "GPU0        X  yes/yes",
                                      "GPU1  yes/yes        X"}))
      << out;
  EXPECT_EQ(matrix(out, "Confirmed write/read/atomic", 2),
            (std::vector<std::string>{"          GPU0      GPU1", "GPU0         X  ok/ok/ok",
                                      "GPU1  ok/ok/ok         X"}))
      << out;
  EXPECT_EQ(
      matrix(out, "Measured write GB/s", 2),
      (std::vector<std::string>{"       GPU0   GPU1", "GPU0      X  366.1", "GPU1  366.3      X"}))
      << out;
  EXPECT_EQ(
      matrix(out, "Measured read GB/s", 2),
      (std::vector<std::string>{"       GPU0   GPU1", "GPU0      X  332.9", "GPU1  333.8      X"}))
      << out;
  EXPECT_EQ(matrix(out, "One-way flag latency us", 2),
            (std::vector<std::string>{"      GPU0  GPU1", "GPU0     X  1.21", "GPU1  1.20     X"}))
      << out;
  EXPECT_NE(out.find("Driver 580.95.05, CUDA driver 13.0, CUDA runtime 13.0"), std::string::npos);
}

TEST(TopologyPrint, PcieAndNoP2pCells) {
  {
    const std::string out = printed(loadTopologyFile(fixturePath("pcie_no_atomics")));
    EXPECT_EQ(matrixRow(out, "Link", 4, 1), "GPU0     X  PCIe  PCIe  PCIe");
    EXPECT_EQ(matrixRow(out, "Confirmed", 4, 2), "GPU1  ok/ok/-        X  ok/ok/-  ok/ok/-");
    EXPECT_NE(out.find("yes/no"), std::string::npos);
  }
  {
    const std::string out = printed(loadTopologyFile(fixturePath("no_p2p")));
    EXPECT_EQ(matrixRow(out, "Link", 4, 4), "GPU3     -     -     -     X");
    EXPECT_EQ(matrixRow(out, "Measured write", 4, 1), "GPU0     X     -     -     -");
    EXPECT_EQ(matrixRow(out, "Confirmed", 4, 1), "GPU0      X  -/-/-  -/-/-  -/-/-");
    // L40S: no cluster launch, NUMA nodes 0 and 1, PCIe Gen4.
    EXPECT_NE(out.find("Gen4 x16"), std::string::npos);
    EXPECT_NE(out.find(" no "), std::string::npos);
  }
}

TEST(TopologyPrint, FailedConfirmationIsVisible) {
  Topology t = loadTopologyFile(fixturePath("pcie_8gpu_two_switches"));
  t.pair(0, 5).peerWriteOk = false;  // driver said yes, the transfer said no
  const std::string out = printed(t);
  const std::string conf = matrixRow(out, "Confirmed", 8, 1);
  EXPECT_NE(conf.find("FAIL/ok/-"), std::string::npos) << conf;
  EXPECT_NE(conf.find("ok/ok/ok"), std::string::npos) << conf;  // within the switch
  EXPECT_EQ(matrixRow(out, "PCIe common ancestor", 8, 1),
            "GPU0       X  switch  switch  switch  system  system  system  system");
}

TEST(TopologyPrint, EmptyTopology) {
  const std::string out = printed(Topology());
  EXPECT_NE(out.find("0 GPUs"), std::string::npos) << out;
  EXPECT_NE(out.find("(no GPUs)"), std::string::npos) << out;
}

// ---------------------------------------------------------------------------------------------
// NVML helpers that need no GPU

TEST(TopologyNvml, NormalizeBusId) {
  EXPECT_EQ(nvml::normalizeBusId("0000:1B:00.0"), "0000:1b:00.0");
  EXPECT_EQ(nvml::normalizeBusId("00000000:1b:00.0"), "0000:1b:00.0");
  EXPECT_EQ(nvml::normalizeBusId("1b:00.0"), "0000:1b:00.0");
  EXPECT_EQ(nvml::normalizeBusId("00010000:c1:1f.7"), "00010000:c1:1f.7");
  EXPECT_EQ(nvml::normalizeBusId(""), "");
  EXPECT_EQ(nvml::normalizeBusId("GPU-1234"), "");
  EXPECT_EQ(nvml::normalizeBusId("0000:1b:00.0 trailing"), "");
  EXPECT_EQ(nvml::normalizeBusId("0000:1b:20.0"), "");   // device numbers stop at 0x1f
  EXPECT_EQ(nvml::normalizeBusId("0000:100:00.0"), "");  // bus numbers stop at 0xff
}

TEST(TopologyNvml, NominalNvlinkSpeeds) {
  EXPECT_DOUBLE_EQ(18 * nvml::nvlinkGBpsPerLink(6), 478.125);  // NVLink 4.0 (H100/H200)
  EXPECT_DOUBLE_EQ(12 * nvml::nvlinkGBpsPerLink(4), 300.0);    // NVLink 3.0 (A100)
  EXPECT_DOUBLE_EQ(nvml::nvlinkGBpsPerLink(7), 53.125);        // NVLink 5.0
  EXPECT_LT(nvml::nvlinkGBpsPerLink(0), 0);
  EXPECT_LT(nvml::nvlinkGBpsPerLink(99), 0);
}

TEST(TopologyNvml, QueriesDegradeWithoutNvml) {
  // On a machine without the driver every answer is "unknown"; with one, a bus id that no GPU
  // has is unknown too. Neither throws.
  nvml::PcieLink link;
  link.gen = link.width = link.maxGen = link.maxWidth = -5;
  EXPECT_FALSE(nvml::pcieLink("0000:ff:1f.7", &link));
  EXPECT_EQ(link.gen, 0);
  EXPECT_EQ(link.width, 0);
  EXPECT_EQ(link.maxGen, 0);
  EXPECT_EQ(link.maxWidth, 0);
  EXPECT_EQ(nvml::commonAncestor("0000:ff:1f.7", "0000:fe:1f.7"), "");
  const nvml::P2PStatus st = nvml::p2pStatus("0000:ff:1f.7", "0000:fe:1f.7");
  EXPECT_EQ(st.read, nvml::Tri::Unknown);
  EXPECT_EQ(st.atomics, nvml::Tri::Unknown);
  std::vector<nvml::NvLink> links(3);
  EXPECT_FALSE(nvml::activeNvLinks("0000:ff:1f.7", &links));
  EXPECT_LT(nvml::nvlinkSpeedGBps("0000:ff:1f.7"), 0);
  EXPECT_TRUE(links.empty());
  if (!nvml::available()) {
    EXPECT_EQ(nvml::driverVersion(), "");
  }
  nvml::shutdown();
  nvml::shutdown();  // idempotent
}

// The host identity: the host name and boot id by default, so containers of one host with
// different host names look like different hosts, unless they share ANYR_HOST_ID; an
// ANYR_HOST_ID never equals a default identity by accident of its text.
TEST(Topology, HostIdentity) {
  const std::string boot = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
  EXPECT_EQ(hostHashOf("", "node7", boot), hostHashOf("", "node7", boot));
  EXPECT_NE(hostHashOf("", "node7", boot), hostHashOf("", "node7-c2", boot));     // another name
  EXPECT_NE(hostHashOf("", "node7", boot), hostHashOf("", "node7", boot + "0"));  // another boot
  EXPECT_EQ(hostHashOf("rack3-node7", "c1", boot), hostHashOf("rack3-node7", "c2", "x"));
  EXPECT_NE(hostHashOf("rack3-node7", "c1", boot), hostHashOf("rack3-node8", "c1", boot));
  EXPECT_NE(hostHashOf("node7\n" + boot, "", ""), hostHashOf("", "node7", boot));
}

}  // namespace
}  // namespace anyr
