// The islands of the two-level all-reduce ("islands", algo/islands.cu): groups of ranks whose
// GPUs reach each other without crossing the machine's widest PCIe boundary (one switch, one
// socket), or the groups ANYR_ISLANDS forces (base/config.h, parseIslands). A pure function of
// the agreed topology and the agreed configuration, so every rank derives the same islands; the
// admission (algo/registry.cc), the cost model (select/dispatch.cc, costInputs), explain and the
// kernel's map (IslandMap, device/handles.h) all take them from here.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "device/handles.h"
#include "topology/topology.h"

namespace anyr {

struct Islands {
  // Each island's ranks, ascending; islands ordered by their lowest rank.
  std::vector<std::vector<int>> members;
  bool configured = false;  // forced by ANYR_ISLANDS rather than derived from the topology
  // Where they come from, in words: "ANYR_ISLANDS=0-3,4-7", "topology: PCIe switch groups (...)",
  // or, for one island, why the topology gives no more.
  std::string source;

  int count() const { return static_cast<int>(members.size()); }
  int smallest() const;
  int largest() const;
  // "0-3 | 4-7", "0+2+4+6 | 1+3+5+7".
  std::string text() const;
};

// The islands of `nranks` ranks: the configured layout (Config::islands, packed; it must pass
// islandsCoverError for nranks) where it is not 0, else the topology's. From the topology:
// the pairs' PCIe relations (NVML's closest common ancestor: board, switch, switches,
// hostbridge, numa, system); where they differ, the widest one present is the boundary, and
// the islands are the groups of ranks joined by pairs closer than it (two switches under one
// host bridge: the switch groups; two sockets: the sockets); where every pair has the same one
// (one switch, one socket), one island. Ranks on one GPU or joined by NVLink are always in one
// island. Where some PCIe pair's relation is unknown, the GPUs' NUMA nodes where every one is
// known; else one island.
Islands islandsOf(const Topology& rankTopo, uint32_t configured, int nranks);

// The slices a message is cut into: the least common multiple of the island sizes, so that
// every member of an island of m ranks holds slices / m of them (1/m of the message).
int islandSlices(const Islands& is);
// The rank of island `island` that owns slice `slice`: its member slice % size.
int islandHome(const Islands& is, int island, int slice);
// The ordered pairs (src, dst) the algorithm writes over: every pair inside an island, and every
// owner of a slice to the owners of that slice in the other islands. Each pair once, src-major.
std::vector<std::pair<int, int>> islandWritePairs(const Islands& is);
// The most ranks of other islands that one rank writes to.
int islandCrossPeers(const Islands& is);

// The kernel's map of the islands (device/handles.h). count 0 where there is no island (an
// empty `is`, or more ranks than a map holds).
IslandMap islandMapOf(const Islands& is);
// Most bytes one launch of the islands kernel carries with slots of `slotBytes` (the two-shot
// push area's, WorkspaceLayout::tsSlotBytes): the owner of the most slices (a member of the
// smallest island) receives slices / smallest slices of every rank into one slot. A multiple of
// 16 bytes; 0 for a map without islands.
uint64_t islandLaunchBytes(const IslandMap& map, uint64_t slotBytes);

}  // namespace anyr
