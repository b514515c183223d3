// NUMA placement of the host-memory transport's segment (libnuma): each rank's region is given
// a memory policy that prefers the NUMA node of that rank's GPU, so the PCIe writes of a rank
// into its own region, and its peers' reads of it, cross the socket interconnect only where
// the GPUs do. The mechanism only: which nodes are wanted, and whether to place at all, is the
// caller's (transport/host_memory.cc, rank 0 before it reserves the pages).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace anyr {

// "" when this host can place memory on NUMA nodes and there is a choice to make, else why not,
// as a phrase: libnuma reports no NUMA support (numa_available() < 0: no kernel support, or
// the calls refused), or the host has one node with memory.
std::string numaPlacementRefusal();

// The outcome of placeRegions, per region.
struct RegionPlacement {
  std::vector<int> placed;  // the node the region's policy now prefers; -1: left alone
  std::vector<int> error;   // errno of the region's failed mbind; 0: none failed
};

// Gives region r of a shared mapping (bytes [r * rankBytes, (r + 1) * rankBytes) from `base`,
// page-aligned; a page that straddles two regions goes with the first) the policy
// MPOL_PREFERRED for nodes[r] (mbind), for nodes.size() regions. A region whose node is < 0 is
// left alone. MPOL_PREFERRED, not MPOL_BIND: a full node gives pages elsewhere rather than
// failing the allocation. For a mapping of a shmem object (POSIX shared memory, tmpfs,
// MAP_SHARED | MAP_ANONYMOUS) the policy is the object's shared policy: it governs pages the
// object gets later, through any mapping or by fallocate, and outlives this mapping. Pages
// already present are not moved. A failure (a node that does not exist, or that this process
// may not use) is recorded in the result, never thrown: the memory works either way.
RegionPlacement placeRegions(void* base, size_t rankBytes, const std::vector<int>& nodes);

// The node of the page at `addr` (get_mempolicy with MPOL_F_NODE | MPOL_F_ADDR; the page is
// faulted in if absent); -1 when the kernel does not say. For checks and tests.
int nodeOfPage(const void* addr);

// The node the memory policy at `addr` prefers (get_mempolicy with MPOL_F_ADDR): the node of an
// MPOL_PREFERRED policy; -1 for any other policy (the default among them) or when the kernel
// does not say. For checks and tests.
int preferredNodeAt(const void* addr);

}  // namespace anyr
