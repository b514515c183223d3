// Host-memory transport: one POSIX shared-memory segment mapped into every rank's process and
// registered with CUDA (cudaHostRegisterMapped | Portable), so kernels of every rank read and
// write it over PCIe without any peer access between the GPUs. Works where CUDA IPC mappings
// do not (GeForce cards, IOMMU/ACS in the way, VMs), as long as the ranks share a host.
//
// Lifetime: rank 0 creates the segment (O_EXCL, mode 0600) under a name made of a random
// nonce broadcast by rank 0; the others open it after a barrier; rank 0 unlinks the name as
// soon as every rank has opened it (before mapping), so nothing is left in /dev/shm if a
// process dies after that (a kill between creation and the others' open can leave it).
//
// NUMA placement: before it reserves the pages, rank 0 gives each rank's region a policy that
// prefers that rank's GPU's NUMA node (transport/numa_placement.h), where the caller asks for
// it, the host has several nodes and the rank's node is known. The pages are then reserved
// where each region prefers; a placement that fails is a warning, never a failure of the setup.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace anyr {

class Bootstrap;

class HostMemory {
 public:
  virtual ~HostMemory() = default;
  virtual char* host() const = 0;    // the mapping in this process
  virtual char* device() const = 0;  // the same bytes as seen by this process's CUDA device
  virtual size_t bytes() const = 0;
};

// The NUMA placement of the segment's rank regions: what the caller asks (rank 0's request is
// the one carried out), and what rank 0 did, the same record on every rank.
struct HostPlacement {
  // Asked by the caller:
  std::vector<int> wanted;  // per rank: its GPU's NUMA node, -1 unknown (its region left alone)
  uint64_t rankBytes = 0;   // rank r's region: [r * rankBytes, (r + 1) * rankBytes)
  // Set by the caller to turn placement off (the phrase explain shows), or by
  // createHostMemory: why no region was placed; "" when placement ran.
  std::string refusal;
  // Set by createHostMemory, per rank:
  std::vector<int> placed;  // the node its region prefers; -1 left to rank 0's own policy
  std::vector<int> error;   // errno of its region's failed mbind; 0 none
};

// One line for explain: "rank regions on NUMA nodes 0,0,1,1 (each rank's GPU's node)", the
// ranks left alone and why, or the refusal.
std::string describeHostPlacement(const HostPlacement& p);

// Collective over `bs`. Returns nullptr (and sets *why) on every rank when any rank could not
// create, open, map or register the segment: ranks agree on the outcome. With `placement`
// (may be null: no placement), rank 0 places the regions as asked and every rank receives what
// it did, once the segment is created, whatever the later steps' outcome.
std::unique_ptr<HostMemory> createHostMemory(Bootstrap& bs, size_t bytes, HostPlacement* placement,
                                             std::string* why);

// Rank 0's part of the creation, on the segment's descriptor: sizes it to `bytes`, places the
// regions as `placement` asks (may be null; the outcome written into it), reserves the pages.
// "" or why it failed (a failed placement is not a failure). Exposed for tests: it needs no
// GPU.
std::string reserveSegment(int fd, size_t bytes, HostPlacement* placement);

}  // namespace anyr
