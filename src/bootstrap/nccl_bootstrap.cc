// Bootstrap through an existing NCCL communicator, for servers that already hold one.
//
// allGather stages through pinned host memory and device memory on a private non-blocking
// stream: host -> device copy, ncclAllGather (as ncclUint8), device -> host copy, then a bounded
// wait that polls cudaStreamQuery and ncclCommGetAsyncError until the deadline. Pinned staging
// matters: a copy to pageable memory would block the host until the collective finished, an
// unbounded wait. On expiry we throw anyrTimeout and do NOT abort the NCCL communicator: it is
// the caller's. Work may then still be in flight, so the staging buffers are leaked rather than
// freed (freeing would synchronize, that is hang); the bootstrap is unusable from then on.
//
// NCCL cannot tell which rank is missing, so a timeout here names none; the TCP bootstrap can.
// One bootstrap must be used by one thread at a time.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/bootstrap.h"
#include "bootstrap/socket.h"
#include "core/error.h"
#include "core/log.h"

namespace anyr {

namespace {

[[noreturn]] void throwNccl(ncclResult_t r, ncclComm_t comm, const char* expr) {
  std::string msg =
      std::string("bootstrap through NCCL: ") + expr + " failed: " + ncclGetErrorString(r);
  const char* last = comm != nullptr ? ncclGetLastError(comm) : nullptr;
  if (last != nullptr && *last != '\0') msg += std::string(" (") + last + ")";
  throw Error(anyrNcclError, msg);
}

// Makes `device` current for the scope; restores the previous device, ignoring errors.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&prev_) != cudaSuccess) prev_ = -1;
    if (prev_ != device) ANYR_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceGuard() {
    int cur = -1;
    if (prev_ >= 0 && cudaGetDevice(&cur) == cudaSuccess && cur != prev_) {
      (void)cudaSetDevice(prev_);
    }
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
};

class NcclBootstrap final : public Bootstrap {
 public:
  NcclBootstrap(ncclComm_t comm, int timeoutMs) : comm_(comm), timeoutMs_(timeoutMs) {}
  ~NcclBootstrap() override;

  // Waits (bounded) for a non-blocking communicator to finish initializing, reads rank, size
  // and device, and creates the stream.
  void init();

  int rank() const override { return rank_; }
  int size() const override { return nranks_; }
  void allGather(const void* in, void* out, size_t bytes) override;
  void barrier() override;

 private:
  void gather(const void* in, void* out, size_t bytes);
  void reserve(size_t bytes);
  void freeStaging();
  // Non-blocking communicators: waits until the communicator leaves ncclInProgress.
  void waitComm(const Deadline& deadline, const char* expr);
  void waitStream(const Deadline& deadline);

  ncclComm_t comm_;
  int timeoutMs_;
  int rank_ = -1;
  int nranks_ = 0;
  int device_ = -1;
  cudaStream_t stream_ = nullptr;
  void* dIn_ = nullptr;   // device staging: capacity_ bytes
  void* dOut_ = nullptr;  // capacity_ * nranks_ bytes
  void* hIn_ = nullptr;   // pinned host staging, same sizes
  void* hOut_ = nullptr;
  size_t capacity_ = 0;
  bool inFlight_ = false;  // a timed-out collective may still use the staging buffers
  bool failed_ = false;
  std::string failMsg_;
};

NcclBootstrap::~NcclBootstrap() {
  if (device_ < 0) return;
  int prev = -1;
  bool switched = cudaGetDevice(&prev) == cudaSuccess && prev != device_ &&
                  cudaSetDevice(device_) == cudaSuccess;
  if (!inFlight_) freeStaging();
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);  // returns at once even if busy
  if (switched) (void)cudaSetDevice(prev);
}

// The device buffers are stream-ordered on stream_ (their only user): freeing them waits for
// nothing else on the GPU, unlike cudaFree (a server's busy NCCL communicator, say).
void NcclBootstrap::freeStaging() {
  if (dIn_ != nullptr) (void)cudaFreeAsync(dIn_, stream_);
  if (dOut_ != nullptr) (void)cudaFreeAsync(dOut_, stream_);
  if (hIn_ != nullptr) (void)cudaFreeHost(hIn_);
  if (hOut_ != nullptr) (void)cudaFreeHost(hOut_);
  dIn_ = dOut_ = hIn_ = hOut_ = nullptr;
  capacity_ = 0;
}

void NcclBootstrap::waitComm(const Deadline& deadline, const char* expr) {
  for (;;) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
    if (r != ncclSuccess) throwNccl(r, comm_, "ncclCommGetAsyncError");
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) throwNccl(state, comm_, expr);
    if (deadline.expired()) {
      throwError(anyrTimeout, std::string("bootstrap through NCCL: ") + expr +
                                  " still in progress after " +
                                  std::to_string(deadline.timeoutMs()) + " ms");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

void NcclBootstrap::init() {
  Deadline deadline(timeoutMs_);
  waitComm(deadline, "communicator initialization");
  ncclResult_t r = ncclCommCount(comm_, &nranks_);
  if (r != ncclSuccess) throwNccl(r, comm_, "ncclCommCount");
  r = ncclCommUserRank(comm_, &rank_);
  if (r != ncclSuccess) throwNccl(r, comm_, "ncclCommUserRank");
  int device = -1;
  r = ncclCommCuDevice(comm_, &device);
  if (r != ncclSuccess) throwNccl(r, comm_, "ncclCommCuDevice");
  DeviceGuard guard(device);
  ANYR_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  device_ = device;  // from here on the destructor cleans up on this device
  ANYR_LOG(
      Info, rank_,
      "bootstrap through NCCL: rank " << rank_ << " of " << nranks_ << " on device " << device_);
}

void NcclBootstrap::reserve(size_t bytes) {
  if (bytes <= capacity_) return;
  // At least 4 KiB, and at least double: few reallocations (pinned host memory is freed with
  // cudaFreeHost).
  const size_t cap = std::max<size_t>({bytes, 2 * capacity_, 4096});
  freeStaging();
  const size_t all = cap * static_cast<size_t>(nranks_);
  ANYR_CUDA_CHECK(cudaMallocAsync(&dIn_, cap, stream_));
  ANYR_CUDA_CHECK(cudaMallocAsync(&dOut_, all, stream_));
  ANYR_CUDA_CHECK(cudaHostAlloc(&hIn_, cap, cudaHostAllocDefault));
  ANYR_CUDA_CHECK(cudaHostAlloc(&hOut_, all, cudaHostAllocDefault));
  capacity_ = cap;
}

void NcclBootstrap::waitStream(const Deadline& deadline) {
  int pauseUs = 20;
  for (;;) {
    cudaError_t e = cudaStreamQuery(stream_);
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) ANYR_CUDA_CHECK(e);
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
    if (r != ncclSuccess) throwNccl(r, comm_, "ncclCommGetAsyncError");
    if (state != ncclSuccess && state != ncclInProgress) throwNccl(state, comm_, "ncclAllGather");
    if (deadline.expired()) {
      inFlight_ = true;
      throwError(anyrTimeout, "bootstrap through NCCL: allGather did not finish within " +
                                  std::to_string(deadline.timeoutMs()) + " ms (rank " +
                                  std::to_string(rank_) + " of " + std::to_string(nranks_) +
                                  "; NCCL cannot tell which rank did not join)");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(pauseUs));
    pauseUs = std::min(pauseUs * 2, 1000);
  }
}

void NcclBootstrap::gather(const void* in, void* out, size_t bytes) {
  Deadline deadline(timeoutMs_);
  DeviceGuard guard(device_);
  reserve(bytes);
  std::memcpy(hIn_, in, bytes);
  ANYR_CUDA_CHECK(cudaMemcpyAsync(dIn_, hIn_, bytes, cudaMemcpyHostToDevice, stream_));
  ncclResult_t r = ncclAllGather(dIn_, dOut_, bytes, ncclUint8, comm_, stream_);
  if (r == ncclInProgress) {
    waitComm(deadline, "ncclAllGather");
  } else if (r != ncclSuccess) {
    throwNccl(r, comm_, "ncclAllGather");
  }
  size_t total = bytes * static_cast<size_t>(nranks_);
  ANYR_CUDA_CHECK(cudaMemcpyAsync(hOut_, dOut_, total, cudaMemcpyDeviceToHost, stream_));
  waitStream(deadline);
  std::memcpy(out, hOut_, total);
}

void NcclBootstrap::allGather(const void* in, void* out, size_t bytes) {
  if (failed_) {
    throwError(anyrInvalidUsage, "bootstrap: unusable after an earlier failure: " + failMsg_);
  }
  ANYR_REQUIRE_ARG(bytes == 0 || (in != nullptr && out != nullptr), "in/out",
                   "must not be NULL when bytes > 0");
  try {
    if (bytes == 0) {
      // Still a synchronization point, as on the TCP bootstrap: exchange one dummy byte.
      uint8_t one = 0;
      std::vector<uint8_t> all(static_cast<size_t>(nranks_));
      gather(&one, all.data(), 1);
    } else {
      gather(in, out, bytes);
    }
  } catch (const Error& e) {
    failed_ = true;
    failMsg_ = e.what();
    // Whatever failed, work still queued on the stream may use the staging buffers.
    if (stream_ != nullptr && cudaStreamQuery(stream_) != cudaSuccess) inFlight_ = true;
    throw;
  }
}

void NcclBootstrap::barrier() { allGather(nullptr, nullptr, 0); }

}  // namespace

std::unique_ptr<Bootstrap> createNcclBootstrap(void* ncclComm, int timeoutMs) {
  ANYR_REQUIRE_ARG(ncclComm != nullptr, "ncclComm", "must not be NULL");
  ANYR_REQUIRE_ARG(timeoutMs > 0, "timeoutMs", "must be positive");
  auto bs = std::make_unique<NcclBootstrap>(static_cast<ncclComm_t>(ncclComm), timeoutMs);
  bs->init();
  return bs;
}

}  // namespace anyr
