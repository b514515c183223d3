// Peer memory from the CUDA virtual-memory calls: each rank creates its region with cuMemCreate
// as an allocation exportable as a POSIX file descriptor, maps it, and hands the descriptor to
// every peer over a Unix-domain socket (fd_exchange.h); each peer imports it, reserves an
// address range and maps it with access for its own device. Unlike legacy CUDA IPC this needs
// no shared PID namespace, and memory stays alive until every process released its handle and
// mapping, so no rank can free a region under a peer.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <vector>

#include "base/error.h"
#include "base/log.h"
#include "bootstrap/bootstrap.h"
#include "transport/cu_driver.h"
#include "transport/fd_exchange.h"
#include "transport/peer_memory.h"

namespace anyr {
namespace {

// One mapped allocation (own or imported): handle, reserved range, mapping.
struct Mapping {
  CUmemGenericAllocationHandle handle = 0;
  bool haveHandle = false;
  CUdeviceptr va = 0;
  bool reserved = false;
  bool mapped = false;
};

// What every rank publishes about its region. Crosses process boundaries: fixed layout.
struct VmmRecord {
  int32_t ok;  // 1: allocated, mapped and exported
  int32_t pad;
  uint64_t bytes;  // the value agreed on: the rank's granularity, then its allocation's size
  char error[240];
};
static_assert(sizeof(VmmRecord) == 256, "VmmRecord layout");

// Collective: every rank's local outcome, a value (its allocation granularity in the first
// round, its region's size in the second) or why it has none, into *all (the value in .bytes).
// Returns "" when every rank succeeded, else the first failing rank's reason (the same on every
// rank).
std::string agreeOnRegions(Bootstrap& bs, const std::string& localWhy, uint64_t bytes,
                           std::vector<VmmRecord>* all) {
  VmmRecord mine{};
  mine.ok = localWhy.empty() ? 1 : 0;
  mine.bytes = bytes;
  std::snprintf(mine.error, sizeof(mine.error), "%s", localWhy.c_str());
  *all = bs.allGatherValue(mine);
  for (int r = 0; r < bs.size(); ++r) {
    const VmmRecord& rec = (*all)[static_cast<size_t>(r)];
    if (!rec.ok) {
      return "rank " + std::to_string(r) + ": " +
             std::string(rec.error, strnlen(rec.error, sizeof(rec.error)));
    }
  }
  return "";
}

// What this rank's regions are created with: device memory exportable as a POSIX descriptor.
CUmemAllocationProp allocationProp(CUdevice dev) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

// This rank's recommended allocation granularity in *gran; "" on success, else why.
// `coarser` (tests only, ANYR_FAULT_INJECT=vmm-granularity:R): report the smallest power of two
// above `bytes` instead, as a GPU of another model might, so this rank's region would differ
// in size from its peers' unless the ranks agree on one granularity.
std::string localGranularity(const CuDriver& d, CUdevice dev, size_t bytes, bool coarser,
                             uint64_t* gran) {
  const CUmemAllocationProp prop = allocationProp(dev);
  size_t g = 0;
  const CUresult r = d.memGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
  if (r != CUDA_SUCCESS) return d.text("cuMemGetAllocationGranularity", r);
  *gran = g == 0 ? uint64_t{2} << 20 : g;
  if (coarser) {
    uint64_t p = *gran;
    while (p <= bytes) p *= 2;
    ANYR_LOG(
        Warn, -1,
        "ANYR_FAULT_INJECT: vmm granularity " << p << " instead of " << *gran << " (tests only)");
    *gran = p;
  }
  return "";
}

class VmmPeerMemory final : public PeerMemory {
 public:
  VmmPeerMemory(const CuDriver& d, size_t bytes) : d_(d), requested_(bytes) {}

  // Local part: allocation, mapping, export, with the granularity every rank agreed on (a
  // multiple of each rank's own: vmmCommonGranularity), so every region has the same size. ""
  // on success, else why (nothing thrown: the outcome is agreed with the peers first).
  std::string createLocal(CUdevice dev, uint64_t granularity) {
    device_ = dev;
    const CUmemAllocationProp prop = allocationProp(dev);
    granularity_ = granularity;
    bytes_ = (requested_ + granularity_ - 1) / granularity_ * granularity_;
    CUresult r = d_.memCreate(&own_.handle, bytes_, &prop, 0);
    if (r != CUDA_SUCCESS) return d_.text("cuMemCreate", r);
    own_.haveHandle = true;
    const std::string why = mapHere(&own_);
    if (!why.empty()) return why;
    int fd = -1;
    r = d_.memExportToShareableHandle(&fd, own_.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                      0);
    if (r != CUDA_SUCCESS) return d_.text("cuMemExportToShareableHandle", r);
    exported_ = Socket(fd);
    return "";
  }

  size_t allocatedBytes() const { return bytes_; }

  // Collective, once every rank has its region (agreeOnRegions gave `all`): exchange
  // descriptors and map every peer's region. Peers' mapping failures are per pair, in mapError.
  void connect(Bootstrap& bs, const std::vector<VmmRecord>& all, int timeoutMs) {
    const int n = bs.size();
    const int me = bs.rank();
    me_ = me;
    ptrs_.assign(static_cast<size_t>(n), nullptr);
    errors_.assign(static_cast<size_t>(n), "");
    peers_.resize(static_cast<size_t>(n));
    ptrs_[static_cast<size_t>(me)] = reinterpret_cast<char*>(own_.va);
    FdExchange ex = exchangeFds(bs, exported_.fd(), "", timeoutMs);
    for (int r = 0; r < n; ++r) {
      if (r == me) continue;
      const size_t i = static_cast<size_t>(r);
      if (!ex.fds[i].valid()) {
        errors_[i] = "descriptor exchange: " + ex.errors[i];
        continue;
      }
      if (all[i].bytes != bytes_) {
        errors_[i] = "rank " + std::to_string(r) + " exported " + std::to_string(all[i].bytes) +
                     " bytes, expected " + std::to_string(bytes_);
        continue;
      }
      Mapping& m = peers_[i];
      const CUresult res = d_.memImportFromShareableHandle(
          &m.handle, reinterpret_cast<void*>(static_cast<intptr_t>(ex.fds[i].fd())),
          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
      ex.fds[i].close();  // the imported handle holds the allocation
      if (res != CUDA_SUCCESS) {
        errors_[i] = d_.text("cuMemImportFromShareableHandle", res);
        continue;
      }
      m.haveHandle = true;
      const std::string why = mapHere(&m);
      if (!why.empty()) {
        errors_[i] = why;
        release(&m);
        continue;
      }
      ptrs_[i] = reinterpret_cast<char*>(m.va);
    }
    exported_.close();  // every peer that could import has
  }

  ~VmmPeerMemory() override {
    unmapPeers();
    release(&own_);
  }

  void unmapPeers() override {
    for (size_t r = 0; r < peers_.size(); ++r) {
      release(&peers_[r]);
      if (static_cast<int>(r) != me_) ptrs_[r] = nullptr;
    }
  }

  const char* kind() const override { return "vmm"; }
  char* local() const override { return reinterpret_cast<char*>(own_.va); }
  char* peer(int r) const override { return ptrs_[static_cast<size_t>(r)]; }
  const std::string& mapError(int r) const override { return errors_[static_cast<size_t>(r)]; }
  size_t bytes() const override { return requested_; }

 private:
  // Reserves an address range for m->handle, maps it and gives this rank's device read and
  // write access. "" on success.
  std::string mapHere(Mapping* m) {
    CUresult r = d_.memAddressReserve(&m->va, bytes_, granularity_, 0, 0);
    if (r != CUDA_SUCCESS) return d_.text("cuMemAddressReserve", r);
    m->reserved = true;
    r = d_.memMap(m->va, bytes_, 0, m->handle, 0);
    if (r != CUDA_SUCCESS) return d_.text("cuMemMap", r);
    m->mapped = true;
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = device_;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = d_.memSetAccess(m->va, bytes_, &access, 1);
    if (r != CUDA_SUCCESS) return d_.text("cuMemSetAccess", r);
    return "";
  }

  void release(Mapping* m) {
    auto warn = [&](const char* call, CUresult r) {
      if (r != CUDA_SUCCESS) ANYR_LOG(Warn, -1, "vmm workspace: " << d_.text(call, r));
    };
    if (m->mapped) warn("cuMemUnmap", d_.memUnmap(m->va, bytes_));
    if (m->reserved) warn("cuMemAddressFree", d_.memAddressFree(m->va, bytes_));
    if (m->haveHandle) warn("cuMemRelease", d_.memRelease(m->handle));
    *m = Mapping{};
  }

  const CuDriver& d_;
  size_t requested_;
  size_t bytes_ = 0;
  size_t granularity_ = 0;
  CUdevice device_ = 0;
  int me_ = -1;
  Mapping own_;
  Socket exported_;
  std::vector<Mapping> peers_;
  std::vector<char*> ptrs_;
  std::vector<std::string> errors_;
};

}  // namespace

std::unique_ptr<PeerMemory> createVmmPeerMemory(Bootstrap& bs, size_t bytes, int timeoutMs,
                                                bool coarserGranularity, std::string* whyNot) {
  std::string why;
  const CuDriver* d = cuDriver(&why);
  CUdevice dev = 0;
  uint64_t gran = 0;
  if (d != nullptr) {
    int device = 0;
    const cudaError_t e = cudaGetDevice(&device);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      why = std::string("cudaGetDevice: ") + cudaGetErrorString(e);
    } else if (!vmmPosixFdSupported(device, &why)) {
      // why says which capability is missing
    } else if (const CUresult r = d->deviceGet(&dev, device); r != CUDA_SUCCESS) {
      why = d->text("cuDeviceGet", r);
    } else {
      why = localGranularity(*d, dev, bytes, coarserGranularity, &gran);
    }
  }
  // Collective whatever happened here: first every rank's granularity (or why it has none), so
  // that all regions get one size even on GPUs whose granularities differ.
  std::vector<VmmRecord> all;
  *whyNot = agreeOnRegions(bs, why, gran, &all);
  if (!whyNot->empty()) return nullptr;
  std::vector<uint64_t> grans;
  for (const VmmRecord& rec : all) grans.push_back(rec.bytes);
  const uint64_t common = vmmCommonGranularity(grans, &why);
  std::unique_ptr<VmmPeerMemory> m;
  if (why.empty()) {
    m = std::make_unique<VmmPeerMemory>(*d, bytes);
    why = m->createLocal(dev, common);
  }
  // Then each rank's region (m null means `why` says why): the peers learn it.
  *whyNot = agreeOnRegions(bs, why, m ? m->allocatedBytes() : 0, &all);
  if (!whyNot->empty()) return nullptr;
  m->connect(bs, all, timeoutMs);
  return m;
}

uint64_t vmmCommonGranularity(const std::vector<uint64_t>& grans, std::string* why) {
  uint64_t common = 1;
  for (size_t r = 0; r < grans.size(); ++r) {
    const uint64_t g = grans[r];
    // Both at most 2^30 here, so the product below stays within 64 bits.
    const uint64_t lcm = g == 0 || g > kVmmMaxGranularity ? 0 : common / std::gcd(common, g) * g;
    if (lcm == 0 || lcm > kVmmMaxGranularity) {
      *why = "rank " + std::to_string(r) + "'s allocation granularity " + std::to_string(g) +
             " leaves no common granularity of the ranks in 1.." +
             std::to_string(kVmmMaxGranularity) + " bytes";
      return 0;
    }
    common = lcm;
  }
  why->clear();
  return common;
}

bool vmmPosixFdSupported(int device, std::string* why) {
  const CuDriver* d = cuDriver(why);
  if (d == nullptr) return false;
  CUdevice dev = 0;
  CUresult r = d->deviceGet(&dev, device);
  if (r != CUDA_SUCCESS) {
    *why = d->text("cuDeviceGet", r);
    return false;
  }
  int vmm = 0;
  int fd = 0;
  r = d->deviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev);
  if (r != CUDA_SUCCESS) {
    *why = d->text("cuDeviceGetAttribute", r);
    return false;
  }
  r = d->deviceGetAttribute(&fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                            dev);
  if (r != CUDA_SUCCESS) {
    *why = d->text("cuDeviceGetAttribute", r);
    return false;
  }
  if (!vmm) {
    *why = "device " + std::to_string(device) + " has no virtual memory management";
    return false;
  }
  if (!fd) {
    *why =
        "device " + std::to_string(device) + " cannot export allocations as POSIX file descriptors";
    return false;
  }
  return true;
}

}  // namespace anyr
