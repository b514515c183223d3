// Peer-mapped device memory: every rank allocates one region, exports it, and maps every
// peer's. Two implementations: legacy CUDA IPC (cudaIpcGetMemHandle / cudaIpcOpenMemHandle)
// and virtual-memory allocations exported as POSIX file descriptors ("vmm": cuMemCreate, the
// descriptors passed over a Unix-domain socket), which uses no process ids, for where legacy
// IPC fails (as reported between containers that do not share a PID namespace; not reproduced
// with unshare on the lent H200s, docs/DESIGN.md). The communicator chooses between them
// (core/peer_workspace.cc, mapPeerMemory; ANYR_PEER_MEMORY).
#pragma once

#include <cstddef>
#include <cstdint>
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
  // Releases this process's mappings of the peers' regions (peer(r) is then nullptr for every
  // r but this rank). Before a collective release: every rank unmaps, a barrier, then the
  // objects are destroyed, so no region is freed while a peer still maps it.
  virtual void unmapPeers() = 0;
};

// Collective over `bs`: allocates `bytes` on the current device, exports it with CUDA IPC,
// exchanges handles and maps every peer's region. Mapping failures are recorded per peer, not
// thrown; allocation or export failures throw.
// `failOpens` (tests only, ANYR_FAULT_INJECT=ipc-open:R): this rank treats every
// cudaIpcOpenMemHandle as failed, as where legacy IPC does not work.
std::unique_ptr<PeerMemory> createIpcPeerMemory(Bootstrap& bs, size_t bytes, bool failOpens);

// Collective over `bs`: the same with virtual-memory allocations whose POSIX file descriptors
// travel over Unix-domain sockets (transport/fd_exchange.h), every wait bounded by timeoutMs.
// The ranks first agree on one allocation granularity (vmmCommonGranularity of each device's
// recommended one), so every region has the same size on GPUs whose granularities differ.
// Returns nullptr on every rank, with *whyNot naming the first rank and its reason, when some
// rank cannot allocate or export one (no virtual memory management, no POSIX descriptor
// export, a driver without the calls); peers' mapping failures are per pair, as for IPC.
// `coarserGranularity` (tests only, ANYR_FAULT_INJECT=vmm-granularity:R): this rank reports a
// granularity above `bytes`, as a GPU of another model might report a larger one.
std::unique_ptr<PeerMemory> createVmmPeerMemory(Bootstrap& bs, size_t bytes, int timeoutMs,
                                                bool coarserGranularity, std::string* whyNot);

// The largest allocation granularity the ranks may agree on (1 GiB).
constexpr uint64_t kVmmMaxGranularity = uint64_t{1} << 30;

// The least common multiple of every rank's allocation granularity (grans[r]: rank r's), the
// granularity every rank's region is sized and aligned with; 0 with *why naming the first rank
// whose granularity is 0 or leaves no common one up to kVmmMaxGranularity.
uint64_t vmmCommonGranularity(const std::vector<uint64_t>& grans, std::string* why);

// Whether `device` supports the vmm kind (virtual memory management and POSIX file descriptor
// export); *why says what is missing.
bool vmmPosixFdSupported(int device, std::string* why);

}  // namespace anyr
