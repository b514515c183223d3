// Peer-mapped device memory: every rank allocates one region, exports it, and maps every
// peer's. The CUDA IPC implementation is the first; a second one (virtual-memory allocations
// exported as POSIX file descriptors, for allocators and containers where legacy IPC fails)
// can be added behind the same interface.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace anyr {

class Bootstrap;

class PeerMemory {
 public:
  virtual ~PeerMemory() = default;
  virtual const char* kind() const = 0;
  // This rank's region (device pointer).
  virtual char* local() const = 0;
  // Rank r's region as mapped in this process (local() for r == own rank), or nullptr when
  // mapping failed; mapError(r) then says why.
  virtual char* peer(int r) const = 0;
  virtual const std::string& mapError(int r) const = 0;
  virtual size_t bytes() const = 0;
};

// Collective over `bs`: allocates `bytes` on the current device, exports it with CUDA IPC,
// exchanges handles and maps every peer's region. Mapping failures are recorded per peer, not
// thrown; allocation or export failures throw.
std::unique_ptr<PeerMemory> createIpcPeerMemory(Bootstrap& bs, size_t bytes);

}  // namespace anyr
