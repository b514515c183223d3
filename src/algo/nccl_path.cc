#include "algo/nccl_path.h"

#include <chrono>
#include <thread>

#include "bootstrap/bootstrap.h"
#include "core/error.h"
#include "core/log.h"

namespace anyr {

namespace {

ncclDataType_t ncclType(anyrDataType_t t) {
  switch (t) {
    case anyrFloat32:
      return ncclFloat32;
    case anyrFloat16:
      return ncclFloat16;
    case anyrBfloat16:
      return ncclBfloat16;
    default:
      throwError(anyrInvalidArgument, "argument 'datatype': unsupported");
  }
}

// Polls a non-blocking communicator until its pending operation settles or the deadline
// (then ncclInProgress). Between polls `pause()` sleeps and returns the communicator to poll
// next; NULL (it was released meanwhile) stops the wait with *released set.
template <typename Pause>
ncclResult_t settleWith(ncclComm_t comm, int timeoutMs, Pause&& pause, bool* released) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs);
  ncclResult_t state = ncclInProgress;
  while (true) {
    ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) return r;
    if (state != ncclInProgress) return state;
    if (std::chrono::steady_clock::now() > deadline) return ncclInProgress;
    comm = pause();
    if (comm == nullptr) {
      *released = true;
      return ncclInProgress;
    }
  }
}

ncclResult_t settle(ncclComm_t comm, int timeoutMs) {
  bool released = false;
  return settleWith(
      comm, timeoutMs,
      [comm] {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        return comm;
      },
      &released);
}

}  // namespace

void checkNccl(ncclResult_t r, ncclComm_t comm, const char* what) {
  if (r == ncclSuccess) return;
  std::string msg = std::string(what) + ": " + ncclGetErrorString(r);
  if (comm != nullptr) {
    const char* last = ncclGetLastError(comm);
    if (last != nullptr && *last != '\0') msg += " (" + std::string(last) + ")";
  }
  throwError(anyrNcclError, msg);
}

ncclComm_t createNcclComm(Bootstrap& bs, int timeoutMs, std::string* why) {
  ncclUniqueId id{};
  ncclResult_t idResult = ncclSuccess;
  if (bs.rank() == 0) idResult = ncclGetUniqueId(&id);
  int32_t rootOk = idResult == ncclSuccess ? 1 : 0;
  bs.broadcast(&rootOk, sizeof(rootOk), 0);
  if (!rootOk) {
    *why = "ncclGetUniqueId failed on rank 0";
    return nullptr;
  }
  bs.broadcast(&id, sizeof(id), 0);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, bs.size(), id, bs.rank(), &config);
  if (r == ncclInProgress || r == ncclSuccess) r = settle(comm, timeoutMs);
  if (r == ncclSuccess) return comm;
  if (r == ncclInProgress) {
    *why = "ncclCommInitRankConfig did not finish within " + std::to_string(timeoutMs) + " ms";
  } else {
    *why = std::string("ncclCommInitRankConfig: ") + ncclGetErrorString(r);
  }
  if (comm != nullptr) ncclCommAbort(comm);
  return nullptr;
}

void releaseNcclComm(ncclComm_t comm, bool ok) {
  if (comm == nullptr) return;
  ncclResult_t r = ok ? ncclCommDestroy(comm) : ncclCommAbort(comm);
  if (r != ncclSuccess)
    ANYR_LOG(Warn, -1, "releasing NCCL communicator: " << ncclGetErrorString(r));
}

void NcclHandle::adopt(ncclComm_t comm, bool owned) {
  std::lock_guard<std::mutex> lock(mu_);
  comm_ = comm;
  owned_ = owned;
}

ncclComm_t NcclHandle::get() const {
  std::lock_guard<std::mutex> lock(mu_);
  return comm_;
}

void NcclHandle::allReduceSum(const void* in, void* out, size_t count, anyrDataType_t dtype,
                              cudaStream_t stream, int timeoutMs) {
  const ncclDataType_t type = ncclType(dtype);
  std::unique_lock<std::mutex> lock(mu_);
  if (comm_ == nullptr) throwError(anyrAborted, "the NCCL communicator was released (aborted)");
  ncclResult_t r = ncclAllReduce(in, out, count, type, ncclSum, comm_, stream);
  if (r == ncclInProgress) {
    // The mutex is dropped while sleeping, so that an abort is not held up by this wait.
    bool released = false;
    r = settleWith(
        comm_, timeoutMs,
        [&] {
          lock.unlock();
          std::this_thread::sleep_for(std::chrono::microseconds(100));
          lock.lock();
          return comm_;
        },
        &released);
    if (released) {
      throwError(anyrAborted, "the communicator was aborted while ncclAllReduce was enqueued");
    }
    if (r == ncclInProgress) {
      throwError(anyrTimeout, "ncclAllReduce was still being enqueued after " +
                                  std::to_string(timeoutMs) + " ms");
    }
  }
  checkNccl(r, comm_, "ncclAllReduce");
}

ncclResult_t NcclHandle::asyncError() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (comm_ == nullptr) return ncclSuccess;
  ncclResult_t state = ncclSuccess;
  return ncclCommGetAsyncError(comm_, &state) == ncclSuccess ? state : ncclSuccess;
}

void NcclHandle::release(bool ok) {
  std::lock_guard<std::mutex> lock(mu_);
  if (comm_ != nullptr && owned_) releaseNcclComm(comm_, ok);
  comm_ = nullptr;
  owned_ = false;
}

}  // namespace anyr
