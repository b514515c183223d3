// The two-level all-reduce ("islands") on the CPU: ANYR_ISLANDS parsed and checked against the
// world size, the islands derived from the sourced fixtures, the kernel's schedule walked with
// the kernel's own arithmetic (algo/islands_schedule.h) for every way of cutting 2..6 ranks into
// islands and the interesting ones of 7 and 8, the admission and its reasons, and explain.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "algo/cost.h"
#include "algo/islands_schedule.h"
#include "base/config.h"
#include "base/error.h"
#include "cpu/expect_error.h"
#include "cpu/processes.h"
#include "cpu/select_fixtures.h"
#include "select/admission.h"
#include "select/dispatch.h"
#include "select/explain_topology.h"
#include "topology/islands.h"

namespace anyr {
namespace {

using proctest::ScopedEnv;
using testfix::fixture;

bool mentions(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

uint32_t packed(const std::string& text) {
  uint32_t p = 0;
  std::string why;
  EXPECT_TRUE(parseIslands(text, &p, &why)) << text << ": " << why;
  return p;
}

// ---- ANYR_ISLANDS -----------------------------------------------------------------------------

TEST(Islands, ConfigFormsPackAndPrintCanonically) {
  EXPECT_EQ(packed(""), 0u);
  EXPECT_EQ(packed("auto"), 0u);
  EXPECT_EQ(islandsText(0), "auto");
  // Islands are numbered by their lowest rank, whatever order they are written in.
  EXPECT_EQ(packed("0-3,4-7"), packed("4-7,0-3"));
  EXPECT_EQ(packed("0-3,4-7"), packed(" 0+1+2+3 , 7+4-6 "));
  EXPECT_EQ(islandsText(packed("4-7,0-3")), "0-3,4-7");
  EXPECT_EQ(islandsText(packed("1+3+5+7,0+2+4+6")), "0+2+4+6,1+3+5+7");
  EXPECT_EQ(islandsText(packed("6-7,0-2,3-5")), "0-2,3-5,6-7");
  EXPECT_EQ(islandsText(packed("0,1")), "0,1");
  const uint32_t p = packed("2-3,0-1");
  EXPECT_EQ(islandOfRank(p, 0), 0);
  EXPECT_EQ(islandOfRank(p, 3), 1);
  EXPECT_EQ(islandOfRank(p, 4), -1);
}

TEST(Islands, ConfigErrorsNameTheRuleBroken) {
  const struct {
    const char* text;
    const char* why;
  } bad[] = {{"0-3,3-7", "rank 3 is in two islands"},
             {"0-8", "rank 8 is outside 0..7"},
             {"3-1", "the range '3-1' goes downward"},
             {"0-3,,4-7", "an empty island"},
             {"0-3,", "an empty island"},
             {"0+,1", "an empty rank"},
             {"0-3;4-7", "not a rank"},
             {"x", "'x' is not a rank"},
             {"1-2-3", "'2-3' is not a rank"}};
  for (const auto& b : bad) {
    uint32_t p = 7;
    std::string why;
    EXPECT_FALSE(parseIslands(b.text, &p, &why)) << b.text;
    EXPECT_TRUE(mentions(why, b.why)) << b.text << ": " << why;
  }
  // Through the environment: the variable, its value, the rule broken and the form.
  ScopedEnv env("ANYR_ISLANDS", "0-3,3-7");
  expectError([] { resolveConfig(nullptr); }, anyrInvalidArgument,
              {"ANYR_ISLANDS='0-3,3-7'", "rank 3 is in two islands", "exactly one island"},
              "a rank in two islands was accepted");
}

TEST(Islands, ConfigMustCoverTheWorldSizeExactly) {
  EXPECT_EQ(islandsCoverError(0, 5), "");
  EXPECT_EQ(islandsCoverError(packed("0-3,4-7"), 8), "");
  EXPECT_TRUE(mentions(islandsCoverError(packed("0-3,4-7"), 4),
                       "rank 4 is named, but the communicator has 4 ranks"));
  EXPECT_TRUE(mentions(islandsCoverError(packed("0-3"), 8), "rank 4 is in no island"));
  EXPECT_TRUE(mentions(islandsCoverError(packed("0,2"), 3), "rank 1 is in no island"));
  EXPECT_TRUE(mentions(islandsCoverError(packed("0-3,4-7"), 16),
                       "islands hold at most 8 ranks (those that map each other's memory), the "
                       "communicator has 16"));
  EXPECT_EQ(islandOfRank(packed("0-3,4-7"), 8), -1);
  // The agreed configuration carries it to every rank.
  Config c;
  c.islands = packed("0-2,3-5,6-7");
  EXPECT_EQ(Config::fromWire(c.toWire()).islands, c.islands);
  EXPECT_TRUE(Config::fromWire(c.toWire()) == c);
  EXPECT_TRUE(mentions(c.describe(), "islands=0-2,3-5,6-7"));
  ScopedEnv env("ANYR_ISLANDS", "0+2,1+3");
  EXPECT_EQ(resolveConfig(nullptr).islands, packed("0+2,1+3"));
}

// ---- islands from the topology ----------------------------------------------------------------

TEST(Islands, DerivedFromTheSourcedFixtures) {
  const struct {
    const char* fixture;
    int ranks;
    const char* text;
    const char* source;
  } want[] = {
      {"rtxpro6000_8gpu_switches", 8, "0-3 | 4-7", "PCIe switch groups"},
      {"rtxpro6000_8gpu_dual_socket", 8, "0-3 | 4-7", "CPU sockets"},
      {"l40s_8gpu_numa", 8, "0-3 | 4-7", "CPU sockets"},
      {"rtxpro6000_16gpu_slow_writes", 8, "0-3 | 4-7", "host bridges of one CPU"},
      {"rtxpro6000_8gpu_switches", 6, "0-3 | 4-5", "PCIe switch groups"},  // uneven: 4 + 2
      {"rtxpro6000_8gpu_dual_socket", 5, "0-3 | 4", "CPU sockets"},
      // Every pair under one switch, over NVLink, or on one socket: one island.
      {"rtxpro6000_8gpu_switches", 4, "0-3", "every pair meets at one switch"},
      {"rtxpro6000_8gpu_dual_socket", 4, "0-3", "every pair meets at one numa"},
      {"nvlink_pair", 2, "0-1", "on one GPU or over NVLink"},
      {"nvlink_8gpu", 8, "0-7", "on one GPU or over NVLink"},
  };
  for (const auto& w : want) {
    const Topology t = firstGpus(fixture(w.fixture), w.ranks);
    const Islands is = islandsOf(t, 0, w.ranks);
    EXPECT_EQ(is.text(), w.text) << w.fixture << " x" << w.ranks;
    EXPECT_TRUE(mentions(is.source, w.source)) << w.fixture << ": " << is.source;
    EXPECT_TRUE(mentions(is.source, "topology: ")) << is.source;
    EXPECT_FALSE(is.configured);
  }
  // The configured layout wins over the topology's, and says so.
  const Topology t = fixture("rtxpro6000_8gpu_switches");
  const Islands forced = islandsOf(t, packed("0+2+4+6,1+3+5+7"), 8);
  EXPECT_EQ(forced.text(), "0+2+4+6 | 1+3+5+7");
  EXPECT_TRUE(forced.configured);
  EXPECT_EQ(forced.source, "ANYR_ISLANDS=0+2+4+6,1+3+5+7");
}

TEST(Islands, UnknownRelationsFallBackToNumaNodes) {
  Topology t = fixture("rtxpro6000_8gpu_dual_socket");
  for (PairInfo& p : t.pairs) p.pcieRelation = "";
  Islands is = islandsOf(t, 0, 8);
  EXPECT_EQ(is.text(), "0-3 | 4-7");
  EXPECT_TRUE(mentions(is.source, "NUMA nodes")) << is.source;
  EXPECT_TRUE(mentions(is.source, "ranks 0 and 1 is unknown")) << is.source;
  t.gpus[5].numaNode = -1;
  is = islandsOf(t, 0, 8);
  EXPECT_EQ(is.count(), 1);
  EXPECT_TRUE(mentions(is.source, "unknown")) << is.source;
}

TEST(Islands, RanksSharingAGpuAreOneIsland) {
  // Four ranks on two GPUs under one switch: the ranks of each GPU are an island.
  Topology t = firstGpus(fixture("rtxpro6000_8gpu_switches"), 4);
  t.gpus[1] = t.gpus[0];
  t.gpus[3] = t.gpus[2];
  for (int a : {0, 2}) {
    t.pair(a, a + 1).link = t.pair(a + 1, a).link = LinkType::Self;
  }
  EXPECT_EQ(islandsOf(t, 0, 4).text(), "0-1 | 2-3");
}

// ---- the kernel's schedule --------------------------------------------------------------------

// Walks one launch of V vectors over `is` as the kernel does (algo/islands.cu, steps 1-4, with
// islands_schedule.h's arithmetic): every place written once, inside the recorded extent and a
// slot of `slotVecs`; every owner reading every rank's value of every vector it owns; every rank
// ending with every vector, from its owner. Returns the failures found (as text).
std::string walkSchedule(const Islands& is, uint32_t V, uint32_t slotVecs) {
  const IslandMap map = islandMapOf(is);
  int n = 0;
  for (const auto& i : is.members) n += static_cast<int>(i.size());
  const uint32_t L = islands::sliceVecs(map, V);
  const uint32_t extent = islands::slotExtent(map, L);
  std::string bad;
  auto fail = [&](const std::string& what) {
    if (bad.size() < 400) bad += what + "; ";
  };
  if (extent > slotVecs) fail("extent " + std::to_string(extent) + " > slot");
  // (dst rank, area 0 scatter / 1 gather, source slot, place) -> (rank whose value, vector)
  std::map<std::tuple<int, int, int, uint32_t>, std::pair<int, uint32_t>> written;
  auto write = [&](int dst, int area, int src, uint32_t at, int whose, uint32_t v) {
    if (at >= extent) fail("place past the extent");
    if (src == dst) fail("a rank's own slot written");
    if (!written.emplace(std::make_tuple(dst, area, src, at), std::make_pair(whose, v)).second) {
      fail("place written twice");
    }
  };
  auto expectAt = [&](int dst, int area, int src, uint32_t at, int whose, uint32_t v) {
    auto it = written.find(std::make_tuple(dst, area, src, at));
    if (it == written.end()) {
      fail("rank " + std::to_string(dst) + " waits for a place nobody writes");
    } else if (it->second != std::make_pair(whose, v)) {
      fail("rank " + std::to_string(dst) + " reads the wrong value");
    }
  };
  // 1. Gather.
  for (int r = 0; r < n; ++r) {
    const int c = map.islandOf[r];
    for (uint32_t v = 0; v < V; ++v) {
      const uint32_t j = v / L;
      const islands::Owner o = islands::ownerOf(map, c, j, v - j * L, L);
      if (o.rank != r) write(o.rank, 0, r, o.at, r, v);
    }
  }
  // 2. Exchange: the owner sends its own and its island's values across.
  std::vector<std::vector<uint32_t>> ownedBy(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    const int c = map.islandOf[r];
    bool past = false;
    for (uint32_t t = 0; t < islands::ownedVecs(map, r, L); ++t) {
      uint32_t j = 0;
      const uint32_t v = islands::ownedVector(map, r, t, L, &j);
      if (v >= V) {
        past = true;
        continue;
      }
      if (past) fail("an owned vector after one past the end");
      ownedBy[static_cast<size_t>(r)].push_back(v);
      for (int s : is.members[static_cast<size_t>(c)]) {
        if (s != r) expectAt(r, 0, s, t, s, v);
        for (int d = 0; d < map.count; ++d) {
          if (d == c) continue;
          const islands::Owner o = islands::ownerOf(map, d, j, v - j * L, L);
          write(o.rank, 0, s, o.at, s, v);
        }
      }
    }
  }
  // 3. Reduce: every rank's value of each owned vector, in the owner's own slots.
  std::vector<std::vector<int>> outFrom(static_cast<size_t>(n), std::vector<int>(V, -1));
  for (int r = 0; r < n; ++r) {
    const int c = map.islandOf[r];
    for (uint32_t t = 0; t < islands::ownedVecs(map, r, L); ++t) {
      uint32_t j = 0;
      const uint32_t v = islands::ownedVector(map, r, t, L, &j);
      if (v >= V) continue;
      for (int s = 0; s < n; ++s) {
        if (s != r) expectAt(r, 0, s, t, s, v);
      }
      outFrom[static_cast<size_t>(r)][v] = r;
      for (int q : is.members[static_cast<size_t>(c)]) {
        if (q != r) write(q, 1, r, t, r, v);
      }
    }
  }
  // 4. All-gather.
  for (int r = 0; r < n; ++r) {
    const int c = map.islandOf[r];
    for (uint32_t v = 0; v < V; ++v) {
      const uint32_t j = v / L;
      const islands::Owner o = islands::ownerOf(map, c, j, v - j * L, L);
      if (o.rank == r) continue;
      expectAt(r, 1, o.rank, o.at, o.rank, v);
      outFrom[static_cast<size_t>(r)][v] = o.rank;
    }
  }
  for (int r = 0; r < n; ++r) {
    for (uint32_t v = 0; v < V; ++v) {
      if (outFrom[static_cast<size_t>(r)][v] < 0) fail("a vector missing on a rank");
    }
  }
  // Every vector has exactly one owner per island.
  for (int c = 0; c < map.count; ++c) {
    uint32_t total = 0;
    for (int r : is.members[static_cast<size_t>(c)]) {
      total += static_cast<uint32_t>(ownedBy[static_cast<size_t>(r)].size());
    }
    if (total != V) fail("island " + std::to_string(c) + " owns " + std::to_string(total));
  }
  // Nothing written that nobody reads: each place read above is one written.
  size_t reads = 0;
  for (int r = 0; r < n; ++r) {
    reads += ownedBy[static_cast<size_t>(r)].size() * (n - 1);  // step 3
    reads += V - ownedBy[static_cast<size_t>(r)].size();        // step 4
  }
  if (reads != written.size()) fail("places written but not read");
  return bad;
}

// Every way of cutting n ranks into islands (set partitions), as the packed form.
void eachLayout(int n, const std::function<void(uint32_t)>& f) {
  std::vector<int> island(static_cast<size_t>(n), 0);
  std::function<void(int, int)> next = [&](int r, int used) {
    if (r == n) {
      uint32_t p = 0;
      for (int q = 0; q < n; ++q) p |= static_cast<uint32_t>(island[q] + 1) << (4 * q);
      f(p);
      return;
    }
    for (int c = 0; c <= used && c < n; ++c) {
      island[static_cast<size_t>(r)] = c;
      next(r + 1, std::max(used, c + 1));
    }
  };
  next(0, 0);
}

TEST(Islands, ScheduleDeliversEveryVectorForEveryLayoutOfTwoToSixRanks) {
  const Topology t = fixture("nvlink_8gpu");  // any topology: the layouts are forced
  int layouts = 0;
  for (int n = 2; n <= 6; ++n) {
    eachLayout(n, [&](uint32_t p) {
      const Islands is = islandsOf(t, p, n);
      ASSERT_TRUE(is.configured) << islandsText(p);
      const IslandMap map = islandMapOf(is);
      const uint32_t S = map.slices;
      for (uint32_t V : {1u, 2u, S - 1, S, S + 1, 3 * S + 2, 257u}) {
        if (V == 0) continue;
        const std::string bad = walkSchedule(is, V, 1u << 20);
        EXPECT_EQ(bad, "") << "islands " << islandsText(p) << ", " << V << " vectors";
      }
      ++layouts;
    });
  }
  EXPECT_EQ(layouts, 2 + 5 + 15 + 52 + 203);  // Bell numbers
}

TEST(Islands, ScheduleDeliversEveryVectorAtSevenAndEightRanks) {
  const Topology t = fixture("nvlink_8gpu");
  for (const char* layout :
       {"0-3,4-6", "0-2,3-6", "0,1-6", "0-1,2-3,4-5,6", "0-3,4-7", "0-2,3-5,6-7", "0+2+4+6,1+3+5+7",
        "0-1,2-3,4-5,6-7", "0,1,2,3,4,5,6,7", "0-2,3-7", "0+7,1-6", "0+4,1+5,2+6,3+7"}) {
    const uint32_t p = packed(layout);
    int n = 0;
    for (int r = 0; r < 8; ++r) n += islandOfRank(p, r) >= 0 ? 1 : 0;
    const Islands is = islandsOf(t, p, n);
    ASSERT_TRUE(is.configured) << layout;
    const uint32_t S = islandMapOf(is).slices;
    for (uint32_t V : {1u, S - 1, S + 1, 1000u}) {
      if (V == 0) continue;
      EXPECT_EQ(walkSchedule(is, V, 1u << 20), "") << layout << ", " << V << " vectors";
    }
  }
}

TEST(Islands, SlicesOwnersAndPairs) {
  const Topology t = fixture("nvlink_8gpu");
  // 4 + 4: member j of one island with member j of the other, nothing else across.
  const Islands even = islandsOf(t, packed("0-3,4-7"), 8);
  EXPECT_EQ(islandSlices(even), 4);
  EXPECT_EQ(islandCrossPeers(even), 1);
  const auto pairs = islandWritePairs(even);
  EXPECT_EQ(pairs.size(), 12u + 12u + 8u);
  for (int r = 0; r < 4; ++r) {
    EXPECT_TRUE(std::count(pairs.begin(), pairs.end(), std::make_pair(r, r + 4)));
    EXPECT_TRUE(std::count(pairs.begin(), pairs.end(), std::make_pair(r + 4, r)));
    EXPECT_FALSE(std::count(pairs.begin(), pairs.end(), std::make_pair(r, (r + 1) % 4 + 4)));
  }
  // 3 + 3 + 2: six slices; a member of the island of two owns three of them and meets more
  // partners.
  const Islands uneven = islandsOf(t, packed("0-2,3-5,6-7"), 8);
  EXPECT_EQ(islandSlices(uneven), 6);
  EXPECT_EQ(islandHome(uneven, 2, 0), 6);
  EXPECT_EQ(islandHome(uneven, 2, 3), 7);
  EXPECT_EQ(islandHome(uneven, 0, 4), 1);
  EXPECT_EQ(islandCrossPeers(uneven), 6);  // rank 6: ranks 0, 2, 1 and 3, 5, 4 of the others
  const IslandMap map = islandMapOf(uneven);
  EXPECT_EQ(map.count, 3);
  EXPECT_EQ(map.minSize, 2);
  EXPECT_EQ(map.islandOf[7], 2);
  EXPECT_EQ(map.indexOf[7], 1);
  EXPECT_EQ(map.member[1][2], 5);
}

TEST(Islands, ALaunchFitsTheTwoShotPushSlots) {
  const Topology t = fixture("nvlink_8gpu");
  for (const char* layout : {"0-3,4-7", "0-2,3-5,6-7", "0,1-7", "0-3,4-6", "0,1"}) {
    const uint32_t p = packed(layout);
    int n = 0;
    for (int r = 0; r < 8; ++r) n += islandOfRank(p, r) >= 0 ? 1 : 0;
    const IslandMap map = islandMapOf(islandsOf(t, p, n));
    for (uint64_t slotBytes : {8192ull, 4096ull * 3, 1ull << 20}) {
      const uint64_t bytes = islandLaunchBytes(map, slotBytes);
      EXPECT_GT(bytes, 0u) << layout;
      EXPECT_EQ(bytes % 16, 0u) << layout;
      // The largest launch, and one vector more than it, against the slot.
      const uint32_t V = static_cast<uint32_t>(bytes / 16);
      EXPECT_LE(islands::slotExtent(map, islands::sliceVecs(map, V)) * 16ull, slotBytes) << layout;
      EXPECT_GT(islands::slotExtent(map, islands::sliceVecs(map, V + map.slices)) * 16ull,
                slotBytes)
          << layout;
    }
  }
  EXPECT_EQ(islandLaunchBytes(islandMapOf(Islands{}), 8192), 0u);
  // 4 + 4 in slots of 8 KiB: four slices of 512 vectors, 32 KiB a launch.
  EXPECT_EQ(islandLaunchBytes(islandMapOf(islandsOf(t, packed("0-3,4-7"), 8)), 8192), 32768u);
}

// ---- admission --------------------------------------------------------------------------------

AlgoAdmission islandsAdmission(const Topology& t, uint32_t configured = 0) {
  CommFacts f = testfix::facts(t, true, true, "");
  f.islands = configured;
  return admit(t, f)[anyrAlgoIslands];
}

TEST(Islands, AdmissionNamesTheIslandsAndWhereTheyCameFrom) {
  const AlgoAdmission sw = islandsAdmission(fixture("rtxpro6000_8gpu_switches"));
  EXPECT_TRUE(sw.admitted) << sw.reason;
  EXPECT_TRUE(mentions(sw.reason, "2 islands 0-3 | 4-7 (topology: PCIe switch groups"))
      << sw.reason;
  const AlgoAdmission pair = islandsAdmission(fixture("nvlink_pair"));
  EXPECT_FALSE(pair.admitted);
  EXPECT_TRUE(
      mentions(pair.reason, "one island (topology: every pair is on one GPU or over NVLink"))
      << pair.reason;
  EXPECT_TRUE(mentions(pair.reason, "ANYR_ISLANDS forces a layout")) << pair.reason;
  const AlgoAdmission forced = islandsAdmission(fixture("nvlink_pair"), packed("0,1"));
  EXPECT_TRUE(forced.admitted) << forced.reason;
  EXPECT_TRUE(mentions(forced.reason, "2 islands 0 | 1 (ANYR_ISLANDS=0,1)")) << forced.reason;
  // A forced layout that does not fit the world size.
  const AlgoAdmission wide =
      islandsAdmission(firstGpus(fixture("nvlink_8gpu"), 4), packed("0-3,4-7"));
  EXPECT_FALSE(wide.admitted);
  EXPECT_TRUE(mentions(wide.reason, "ANYR_ISLANDS=0-3,4-7: rank 4 is named")) << wide.reason;
  // Structural conditions come first, as for every peer algorithm.
  const Topology t = fixture("rtxpro6000_8gpu_switches");
  CommFacts f = testfix::facts(t, true, true, "");
  f.peerMemory = false;
  f.peerMemoryReason = "off for the test";
  EXPECT_TRUE(mentions(admit(t, f)[anyrAlgoIslands].reason, "no peer-mapped workspace"));
}

TEST(Islands, AdmissionNeedsPeerWritesOnlyOnThePairsItUses) {
  Topology t = fixture("rtxpro6000_8gpu_switches");
  // Rank 0 -> rank 5 crosses the islands but is not a pair of slice owners: the two-level form
  // stays admitted where the all-to-all one-shot is not.
  t.pair(0, 5).peerWriteOk = false;
  CommFacts f = testfix::facts(t, true, true, "");
  Admission adm = admit(t, f);
  EXPECT_TRUE(adm[anyrAlgoIslands].admitted) << adm[anyrAlgoIslands].reason;
  EXPECT_FALSE(adm[anyrAlgoOneShotPush].admitted);
  // Rank 0 -> rank 4 (owners of the same slices) and rank 1 -> rank 2 (one island) are used.
  for (auto [s, d] : {std::make_pair(0, 4), std::make_pair(1, 2)}) {
    Topology u = fixture("rtxpro6000_8gpu_switches");
    u.pair(s, d).peerWriteOk = false;
    const AlgoAdmission x = admit(u, f)[anyrAlgoIslands];
    EXPECT_FALSE(x.admitted);
    EXPECT_TRUE(mentions(x.reason, "peer write rank " + std::to_string(s) + " -> rank " +
                                       std::to_string(d) + " (islands 0-3 | 4-7) failed"))
        << x.reason;
  }
  // It reads only its own workspace: failed peer reads do not matter.
  Topology r = fixture("rtxpro6000_8gpu_switches");
  for (PairInfo& p : r.pairs) p.peerReadOk = false;
  EXPECT_TRUE(admit(r, f)[anyrAlgoIslands].admitted);
}

// ---- cost and explain -------------------------------------------------------------------------

TEST(Islands, CostInputsComeFromTheIslands) {
  const testfix::Seeded s = testfix::seeded("rtxpro6000_8gpu_dual_socket");
  EXPECT_EQ(s.in.islandCount, 2);
  EXPECT_EQ(s.in.islandMin, 4);
  EXPECT_EQ(s.in.islandMax, 4);
  EXPECT_EQ(s.in.islandCrossPeers, 1);
  EXPECT_DOUBLE_EQ(s.in.islandWriteGBps, 54.5);       // inside a socket
  EXPECT_DOUBLE_EQ(s.in.islandCrossWriteGBps, 45.0);  // between the sockets
  EXPECT_EQ(s.in.islandLoadGBps, 0);                  // not measured in the fixture
  EXPECT_EQ(s.in.islandLaunchBytes,
            islandLaunchBytes(islandMapOf(islandsOf(s.t, 0, 8)), Config().chunkBytes / 8));
  EXPECT_TRUE(mentions(s.in.summary, "islands 0-3 | 4-7 (topology: CPU sockets")) << s.in.summary;
  // A measured island figure at this world size replaces the pairs'.
  Topology t = s.t;
  t.load.islandGBps = 30;
  EXPECT_DOUBLE_EQ(costInputs(t, Config(), 8).islandLoadGBps, 30);
  EXPECT_GT(islandsUs(1 << 20, costInputs(t, Config(), 8)), islandsUs(1 << 20, s.in));
  // Measured over these islands: used and said; over others (ANYR_ISLANDS changed since the
  // record was cached): not used, and explain says over which it was measured.
  t.load.islands = "0-3 | 4-7";
  const CostInputs same = costInputs(t, Config(), 8);
  EXPECT_DOUBLE_EQ(same.islandLoadGBps, 30);
  EXPECT_TRUE(mentions(same.summary, "inside each island under load 30 GB/s")) << same.summary;
  t.load.islands = "0-1 | 2-7";
  const CostInputs other = costInputs(t, Config(), 8);
  EXPECT_EQ(other.islandLoadGBps, 0);
  EXPECT_DOUBLE_EQ(islandsUs(1 << 20, other), islandsUs(1 << 20, s.in));
  EXPECT_TRUE(mentions(other.summary, "not used (measured over 0-1 | 2-7)")) << other.summary;
  Config moved;
  moved.islands = packed("0-1,2-7");
  EXPECT_DOUBLE_EQ(costInputs(t, moved, 8).islandLoadGBps, 30);
  // One island: no number.
  const testfix::Seeded pair = testfix::seeded("nvlink_pair");
  EXPECT_EQ(pair.in.islandCount, 0);
  EXPECT_LT(islandsUs(4096, pair.in), 0);
  // Forced islands where the topology has one.
  Config cfg;
  cfg.islands = packed("0,1");
  const CostInputs forced = costInputs(pair.t, cfg, 2);
  EXPECT_EQ(forced.islandCount, 2);
  EXPECT_GT(islandsUs(4096, forced), 0);
}

TEST(Islands, CostChargesWhatTheKernelMoves) {
  const testfix::Seeded s = testfix::seeded("rtxpro6000_8gpu_dual_socket");
  // Three hops: more than the one-shot's one round for the smallest message.
  EXPECT_GT(islandsUs(256, s.in), oneShotPushUs(256, s.in));
  // Larger messages run as several launches, each paying its hops.
  CostInputs small = s.in;
  small.islandLaunchBytes = 64 << 10;
  EXPECT_GT(islandsUs(1 << 20, small), islandsUs(1 << 20, s.in) + 15 * kLaunchUs);
  // Uneven islands: the smallest island's members own more and receive more across.
  Config cfg;
  cfg.islands = packed("0-4,5-7");
  const CostInputs uneven = costInputs(s.t, cfg, 8);
  EXPECT_EQ(uneven.islandMin, 3);
  EXPECT_EQ(uneven.islandMax, 5);
  EXPECT_GT(islandsUs(1 << 20, uneven), islandsUs(1 << 20, s.in));
  // Monotonic in size.
  double last = 0;
  for (uint64_t b = 16; b <= (64u << 20); b *= 2) {
    const double us = islandsUs(static_cast<double>(b), s.in);
    EXPECT_GE(us, last) << b;
    last = us;
  }
}

TEST(Islands, ExplainShowsTheIslandsAndChecksTheConfiguredOnes) {
  TopologyExplainOptions o;
  o.path = std::string(ANYR_FIXTURE_DIR) + "/rtxpro6000_8gpu_switches.json";
  {
    const nlohmann::json j = nlohmann::json::parse(explainTopologyJson(o, nullptr));
    const std::string text = j.at("dispatchText").get<std::string>();
    EXPECT_TRUE(mentions(text, "islands 0-3 | 4-7 (topology: PCIe switch groups")) << text;
    bool found = false;
    for (const auto& a : j.at("admission")) {
      if (a.at("algo") == "islands") {
        found = true;
        EXPECT_TRUE(a.at("admitted").get<bool>());
      }
    }
    EXPECT_TRUE(found);
  }
  {
    ScopedEnv env("ANYR_ISLANDS", "0+2+4+6,1+3+5+7");
    const nlohmann::json j = nlohmann::json::parse(explainTopologyJson(o, nullptr));
    EXPECT_TRUE(mentions(j.at("dispatchText").get<std::string>(),
                         "islands 0+2+4+6 | 1+3+5+7 (ANYR_ISLANDS=0+2+4+6,1+3+5+7)"));
  }
  {
    ScopedEnv env("ANYR_ISLANDS", "0-3,4-7");
    o.nranks = 4;
    expectError([&] { explainTopologyJson(o, nullptr); }, anyrInvalidArgument,
                {"ANYR_ISLANDS='0-3,4-7'", "rank 4 is named, but the communicator has 4 ranks"},
                "islands beyond the world size were accepted");
  }
}

}  // namespace
}  // namespace anyr
