// Host-memory transport: one POSIX shared-memory segment mapped into every rank's process and
// registered with CUDA (cudaHostRegisterMapped | Portable), so kernels of every rank read and
// write it over PCIe without any peer access between the GPUs. Works where CUDA IPC mappings
// do not (GeForce cards, IOMMU/ACS in the way, VMs), as long as the ranks share a host.
//
// Lifetime: rank 0 creates the segment (O_EXCL, mode 0600) under a name made of a random
// nonce broadcast by rank 0; the others open it after a barrier; rank 0 unlinks the name as
// soon as every rank has opened it (before mapping), so nothing is left in /dev/shm if a
// process dies after that (a kill between creation and the others' open can leave it).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace anyr {

class Bootstrap;

class HostMemory {
 public:
  virtual ~HostMemory() = default;
  virtual char* host() const = 0;    // the mapping in this process
  virtual char* device() const = 0;  // the same bytes as seen by this process's CUDA device
  virtual size_t bytes() const = 0;
};

// Collective over `bs`. Returns nullptr (and sets *why) on every rank when any rank could not
// create, open, map or register the segment: ranks agree on the outcome.
std::unique_ptr<HostMemory> createHostMemory(Bootstrap& bs, size_t bytes, std::string* why);

}  // namespace anyr
