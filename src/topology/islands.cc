#include "topology/islands.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

#include "base/config.h"

namespace anyr {

namespace {

// NVML's common ancestors of a pair (PairInfo::pcieRelation), closest first; -1: unknown.
constexpr const char* kRelations[] = {"board",      "switch", "switches",
                                      "hostbridge", "numa",   "system"};
int relationLevel(const std::string& r) {
  for (int i = 0; i < static_cast<int>(sizeof(kRelations) / sizeof(kRelations[0])); ++i) {
    if (r == kRelations[i]) return i;
  }
  return -1;
}
// What the islands are when the widest relation between two ranks is kRelations[level].
const char* islandKind(int level) {
  switch (level) {
    case 1:
      return "GPUs on one board (between boards: a PCIe switch)";
    case 2:
      return "PCIe switches (between them: further switches)";
    case 3:
      return "PCIe switch groups (between them: the host bridge)";
    case 4:
      return "host bridges of one CPU (between them: the CPU)";
    case 5:
      return "CPU sockets (between them: the inter-socket link)";
    default:
      return "GPUs with a peer path (between them: none)";
  }
}
// Pairs on one GPU or over NVLink are always in one island; pairs without a peer path are
// further apart than any PCIe relation.
constexpr int kTogether = -2;
constexpr int kNoPeerPath = 6;

std::string rankList(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) {
    size_t last = i;
    while (last + 1 < ranks.size() && ranks[last + 1] == ranks[last] + 1) ++last;
    out += (out.empty() ? "" : "+") + std::to_string(ranks[i]) +
           (last > i ? "-" + std::to_string(ranks[last]) : "");
    i = last;
  }
  return out;
}

// Islands from a rank -> group key map, ordered by their lowest rank.
std::vector<std::vector<int>> groupsOf(const std::vector<int>& key) {
  std::vector<std::vector<int>> out;
  std::map<int, size_t> at;
  for (size_t r = 0; r < key.size(); ++r) {
    auto it = at.find(key[r]);
    if (it == at.end()) {
      at[key[r]] = out.size();
      out.push_back({static_cast<int>(r)});
    } else {
      out[it->second].push_back(static_cast<int>(r));
    }
  }
  return out;
}

Islands fromTopology(const Topology& t, int n) {
  Islands is;
  std::vector<int> level(static_cast<size_t>(n) * static_cast<size_t>(n), kTogether);
  int widest = kTogether, closest = kNoPeerPath;
  std::string unknown;  // the first pair whose relation is unknown
  for (int s = 0; s < n; ++s) {
    for (int d = s + 1; d < n; ++d) {
      int l = kTogether;
      for (const PairInfo* p : {&t.pair(s, d), &t.pair(d, s)}) {
        if (p->link == LinkType::PCIe) {
          const int r = relationLevel(p->pcieRelation);
          if (r < 0 && unknown.empty()) {
            unknown = "ranks " + std::to_string(s) + " and " + std::to_string(d);
          }
          l = std::max(l, r);
        } else if (p->link == LinkType::None) {
          l = kNoPeerPath;
        } else if (p->link == LinkType::Unknown && unknown.empty()) {
          unknown = "ranks " + std::to_string(s) + " and " + std::to_string(d);
        }
      }
      level[static_cast<size_t>(s * n + d)] = level[static_cast<size_t>(d * n + s)] = l;
      widest = std::max(widest, l);
      closest = std::min(closest, l);
    }
  }
  if (!unknown.empty()) {
    // The GPUs' NUMA nodes where every one is known.
    std::vector<int> node(static_cast<size_t>(n));
    bool known = true;
    for (int r = 0; r < n; ++r) {
      node[static_cast<size_t>(r)] = t.gpus[static_cast<size_t>(r)].numaNode;
      known = known && node[static_cast<size_t>(r)] >= 0;
    }
    if (known) {
      is.members = groupsOf(node);
      is.source =
          "topology: NUMA nodes of the GPUs (the PCIe relation of " + unknown + " is unknown)";
      return is;
    }
    is.members = {std::vector<int>(static_cast<size_t>(n))};
    std::iota(is.members[0].begin(), is.members[0].end(), 0);
    is.source =
        "topology: the PCIe relation of " + unknown + " and some GPU's NUMA node are unknown";
    return is;
  }
  // One island where every pair is as close as every other (one switch, one socket: no
  // boundary to keep traffic off), or none is further apart than one board.
  if (widest <= 0 || closest == widest) {
    is.members = {std::vector<int>(static_cast<size_t>(n))};
    std::iota(is.members[0].begin(), is.members[0].end(), 0);
    if (n < 2) {
      is.source = "topology: one rank";
    } else if (widest == kTogether) {
      is.source = "topology: every pair is on one GPU or over NVLink (one island)";
    } else if (widest == kNoPeerPath) {
      is.source = "topology: no pair has a peer path (one island)";
    } else {
      is.source = std::string("topology: every pair meets at one ") +
                  (widest >= 0 ? kRelations[widest] : "GPU") + " (one island)";
    }
    return is;
  }
  // Groups joined by pairs closer than the widest relation (union-find, smallest rank as root).
  std::vector<int> root(static_cast<size_t>(n));
  std::iota(root.begin(), root.end(), 0);
  auto find = [&](int x) {
    while (root[static_cast<size_t>(x)] != x) x = root[static_cast<size_t>(x)];
    return x;
  };
  for (int s = 0; s < n; ++s) {
    for (int d = s + 1; d < n; ++d) {
      if (level[static_cast<size_t>(s * n + d)] < widest) {
        const int a = find(s), b = find(d);
        root[static_cast<size_t>(std::max(a, b))] = std::min(a, b);
      }
    }
  }
  std::vector<int> key(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) key[static_cast<size_t>(r)] = find(r);
  is.members = groupsOf(key);
  is.source = std::string("topology: ") + islandKind(widest);
  return is;
}

}  // namespace

int Islands::smallest() const {
  int m = 0;
  for (const auto& i : members)
    m = m == 0 ? static_cast<int>(i.size()) : std::min<int>(m, i.size());
  return m;
}

int Islands::largest() const {
  int m = 0;
  for (const auto& i : members) m = std::max<int>(m, static_cast<int>(i.size()));
  return m;
}

std::string Islands::text() const {
  std::string out;
  for (const auto& i : members) out += (out.empty() ? "" : " | ") + rankList(i);
  return out;
}

Islands islandsOf(const Topology& t, uint32_t configured, int nranks) {
  if (configured == 0 || !islandsCoverError(configured, nranks).empty()) {
    return fromTopology(t, std::min(nranks, t.size()));
  }
  Islands is;
  std::vector<int> key(static_cast<size_t>(nranks));
  for (int r = 0; r < nranks; ++r) key[static_cast<size_t>(r)] = islandOfRank(configured, r);
  is.members = groupsOf(key);
  is.configured = true;
  is.source = "ANYR_ISLANDS=" + islandsText(configured);
  return is;
}

int islandSlices(const Islands& is) {
  int s = 1;
  for (const auto& i : is.members) s = std::lcm(s, static_cast<int>(i.size()));
  return s;
}

int islandHome(const Islands& is, int island, int slice) {
  const auto& m = is.members[static_cast<size_t>(island)];
  return m[static_cast<size_t>(slice) % m.size()];
}

std::vector<std::pair<int, int>> islandWritePairs(const Islands& is) {
  std::set<std::pair<int, int>> pairs;
  for (const auto& i : is.members) {
    for (int s : i) {
      for (int d : i) {
        if (s != d) pairs.insert({s, d});
      }
    }
  }
  const int S = islandSlices(is);
  for (int j = 0; j < S; ++j) {
    for (int c = 0; c < is.count(); ++c) {
      for (int d = 0; d < is.count(); ++d) {
        if (c != d) pairs.insert({islandHome(is, c, j), islandHome(is, d, j)});
      }
    }
  }
  return {pairs.begin(), pairs.end()};
}

int islandCrossPeers(const Islands& is) {
  std::map<int, std::set<int>> to;
  const int S = islandSlices(is);
  for (int j = 0; j < S; ++j) {
    for (int c = 0; c < is.count(); ++c) {
      for (int d = 0; d < is.count(); ++d) {
        if (c != d) to[islandHome(is, c, j)].insert(islandHome(is, d, j));
      }
    }
  }
  size_t most = 0;
  for (const auto& [r, peers] : to) most = std::max(most, peers.size());
  return static_cast<int>(most);
}

IslandMap islandMapOf(const Islands& is) {
  IslandMap m{};
  int ranks = 0;
  for (const auto& i : is.members) ranks += static_cast<int>(i.size());
  if (is.count() == 0 || ranks > kMaxLocalRanks) return m;
  m.count = static_cast<uint8_t>(is.count());
  m.slices = static_cast<uint8_t>(islandSlices(is));
  m.minSize = static_cast<uint8_t>(is.smallest());
  for (int c = 0; c < is.count(); ++c) {
    const auto& i = is.members[static_cast<size_t>(c)];
    m.size[c] = static_cast<uint8_t>(i.size());
    for (size_t k = 0; k < i.size(); ++k) {
      m.member[c][k] = static_cast<uint8_t>(i[k]);
      m.islandOf[i[k]] = static_cast<uint8_t>(c);
      m.indexOf[i[k]] = static_cast<uint8_t>(k);
    }
  }
  return m;
}

uint64_t islandLaunchBytes(const IslandMap& map, uint64_t slotBytes) {
  if (map.count == 0 || map.minSize == 0) return 0;
  const uint64_t perSlot = map.slices / map.minSize;  // slices the busiest owner holds
  const uint64_t slicesVecs = slotBytes / 16 / perSlot;
  return static_cast<uint64_t>(map.slices) * slicesVecs * 16;
}

}  // namespace anyr
