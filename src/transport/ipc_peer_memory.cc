#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>

#include "base/error.h"
#include "base/log.h"
#include "bootstrap/bootstrap.h"
#include "transport/peer_memory.h"

namespace anyr {
namespace {

// What each rank publishes about its region. Crosses process boundaries: fixed layout.
struct IpcRecord {
  int32_t ok;  // 1 if the handle below is valid
  int32_t pad;
  uint64_t bytes;
  cudaIpcMemHandle_t handle;
  char error[176];  // why export failed, when ok == 0
};
static_assert(sizeof(cudaIpcMemHandle_t) == 64, "cudaIpcMemHandle_t size");
static_assert(sizeof(IpcRecord) == 256, "IpcRecord layout");

class IpcPeerMemory final : public PeerMemory {
 public:
  explicit IpcPeerMemory(size_t bytes) : bytes_(bytes) {}

  // Separate from the constructor so that a failure half way is cleaned up by the destructor.
  void init(Bootstrap& bs, bool failOpens) {
    const int n = bs.size();
    const int me = bs.rank();
    ptrs_.assign(static_cast<size_t>(n), nullptr);
    errors_.assign(static_cast<size_t>(n), "");
    opened_.assign(static_cast<size_t>(n), false);
    ANYR_CUDA_CHECK(cudaMalloc(&base_, bytes_));
    ptrs_[static_cast<size_t>(me)] = static_cast<char*>(base_);

    IpcRecord mine{};
    mine.bytes = bytes_;
    cudaError_t e = cudaIpcGetMemHandle(&mine.handle, base_);
    if (e == cudaSuccess) {
      mine.ok = 1;
    } else {
      (void)cudaGetLastError();
      std::snprintf(mine.error, sizeof(mine.error), "cudaIpcGetMemHandle: %s",
                    cudaGetErrorString(e));
    }
    std::vector<IpcRecord> all = bs.allGatherValue(mine);
    for (int r = 0; r < n; ++r) {
      if (r == me) continue;
      const IpcRecord& rec = all[static_cast<size_t>(r)];
      if (!rec.ok) {
        errors_[static_cast<size_t>(r)] =
            std::string("rank ") + std::to_string(r) +
            " could not export: " + std::string(rec.error, strnlen(rec.error, sizeof(rec.error)));
        continue;
      }
      if (rec.bytes != bytes_) {
        errors_[static_cast<size_t>(r)] = "rank " + std::to_string(r) + " exported " +
                                          std::to_string(rec.bytes) + " bytes, expected " +
                                          std::to_string(bytes_);
        continue;
      }
      if (failOpens) {
        errors_[static_cast<size_t>(r)] =
            "cudaIpcOpenMemHandle: failed by ANYR_FAULT_INJECT=ipc-open:" + std::to_string(me) +
            " (tests only)";
        continue;
      }
      void* p = nullptr;
      cudaError_t oe = cudaIpcOpenMemHandle(&p, rec.handle, cudaIpcMemLazyEnablePeerAccess);
      if (oe != cudaSuccess) {
        (void)cudaGetLastError();
        errors_[static_cast<size_t>(r)] =
            std::string("cudaIpcOpenMemHandle: ") + cudaGetErrorString(oe);
        continue;
      }
      ptrs_[static_cast<size_t>(r)] = static_cast<char*>(p);
      opened_[static_cast<size_t>(r)] = true;
    }
  }

  ~IpcPeerMemory() override {
    unmapPeers();
    if (base_ != nullptr) {
      cudaError_t e = cudaFree(base_);
      if (e != cudaSuccess) {
        (void)cudaGetLastError();
        ANYR_LOG(Warn, -1, "cudaFree(workspace): " << cudaGetErrorString(e));
      }
    }
  }

  void unmapPeers() override {
    for (size_t r = 0; r < ptrs_.size(); ++r) {
      if (!opened_[r]) continue;
      cudaError_t e = cudaIpcCloseMemHandle(ptrs_[r]);
      if (e != cudaSuccess) {
        (void)cudaGetLastError();
        ANYR_LOG(Warn, -1, "cudaIpcCloseMemHandle: " << cudaGetErrorString(e));
      }
      opened_[r] = false;
      ptrs_[r] = nullptr;
    }
  }

  const char* kind() const override { return "cuda-ipc"; }
  char* local() const override { return static_cast<char*>(base_); }
  char* peer(int r) const override { return ptrs_[static_cast<size_t>(r)]; }
  const std::string& mapError(int r) const override { return errors_[static_cast<size_t>(r)]; }
  size_t bytes() const override { return bytes_; }

 private:
  size_t bytes_;
  void* base_ = nullptr;
  std::vector<char*> ptrs_;
  std::vector<std::string> errors_;
  std::vector<bool> opened_;
};

}  // namespace

std::unique_ptr<PeerMemory> createIpcPeerMemory(Bootstrap& bs, size_t bytes, bool failOpens) {
  auto m = std::make_unique<IpcPeerMemory>(bytes);
  m->init(bs, failOpens);
  return m;
}

}  // namespace anyr
