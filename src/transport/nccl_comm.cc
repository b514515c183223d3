#include "transport/nccl_comm.h"

#include <dlfcn.h>

#include <chrono>
#include <map>
#include <thread>
#include <utility>

#include "base/error.h"
#include "base/log.h"
#include "base/validate.h"
#include "bootstrap/bootstrap.h"
#include "transport/nccl_watchdog.h"

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

// ncclCommRevoke where the loaded NCCL has it, else NULL. Looked up in the library that holds
// ncclCommAbort (RTLD_DEFAULT would miss a library loaded with RTLD_LOCAL, as Python loads us).
using RevokeFn = ncclResult_t (*)(ncclComm_t, int);
RevokeFn revokeFunction() {
  static const RevokeFn fn = []() -> RevokeFn {
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(&ncclCommAbort), &info) == 0 || info.dli_fname == nullptr) {
      return nullptr;
    }
    void* lib = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
    if (lib == nullptr) return nullptr;
    return reinterpret_cast<RevokeFn>(dlsym(lib, "ncclCommRevoke"));  // lib stays loaded
  }();
  return fn;
}

// NCCL's documented fatal errors: the communicator must be aborted.
bool fatalForTheCommunicator(ncclResult_t r) {
  return r == ncclUnhandledCudaError || r == ncclSystemError || r == ncclInternalError ||
         r == ncclRemoteError;
}

struct ExternalRegistry {
  std::mutex mu;
  std::map<ncclComm_t, std::weak_ptr<NcclComm>> entries;
};
ExternalRegistry& externalRegistry() {
  static ExternalRegistry* reg = new ExternalRegistry;  // never destroyed: used at exit
  return *reg;
}

// A stopped communicator leaves the registry (its users keep their NcclComm).
void forgetExternal(const NcclComm* state) {
  ExternalRegistry& reg = externalRegistry();
  std::lock_guard<std::mutex> lock(reg.mu);
  for (auto it = reg.entries.begin(); it != reg.entries.end();) {
    auto shared = it->second.lock();
    if (!shared || shared.get() == state) {
      it = reg.entries.erase(it);
    } else {
      ++it;
    }
  }
}

// How often the watchdog polls outstanding calls.
constexpr int kPollMs = 5;

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

bool ncclHasRevoke() { return revokeFunction() != nullptr; }

std::string NcclComm::stop(anyrResult_t code, const std::string& msg) {
  if (stopped_.load()) return failMsg_;
  stopped_.store(true);
  std::string done;
  if (comm_ == nullptr) {
    done = "";
  } else if (!external_) {
    const ncclResult_t r = ncclCommAbort(comm_);
    done = "; the NCCL communicator was aborted";
    if (r != ncclSuccess) done += std::string(" (ncclCommAbort: ") + ncclGetErrorString(r) + ")";
  } else if (RevokeFn revoke = revokeFunction()) {
    const ncclResult_t r = revoke(comm_, 0);
    if (r == ncclSuccess || r == ncclInProgress) {
      done =
          "; the NCCL communicator you passed was revoked (ncclCommRevoke): NCCL refuses every "
          "further operation on it; destroy it with ncclCommDestroy or ncclCommAbort";
    } else {
      done = std::string("; revoking the NCCL communicator you passed failed (ncclCommRevoke: ") +
             ncclGetErrorString(r) + "): anyreduce no longer uses it";
    }
  } else {
    const ncclResult_t r = ncclCommAbort(comm_);
    done =
        "; the NCCL communicator you passed was aborted and freed (ncclCommAbort; this NCCL has "
        "no ncclCommRevoke): do not use or destroy it";
    if (r != ncclSuccess) done += std::string(" (ncclCommAbort: ") + ncclGetErrorString(r) + ")";
  }
  comm_ = nullptr;
  failCode_ = code;
  failMsg_ = msg + done;
  if (external_) forgetExternal(this);
  return failMsg_;
}

void NcclComm::release(bool ok) {
  if (comm_ != nullptr && !external_) releaseNcclComm(comm_, ok);
  if (!external_) comm_ = nullptr;
}

std::shared_ptr<NcclComm> externalNcclComm(ncclComm_t comm) {
  ExternalRegistry& reg = externalRegistry();
  std::lock_guard<std::mutex> lock(reg.mu);
  for (auto it = reg.entries.begin(); it != reg.entries.end();) {
    if (it->second.expired()) {
      it = reg.entries.erase(it);
    } else {
      ++it;
    }
  }
  auto found = reg.entries.find(comm);
  if (found != reg.entries.end()) {
    if (auto shared = found->second.lock()) return shared;
  }
  auto shared = std::make_shared<NcclComm>(comm, true);
  reg.entries[comm] = shared;
  return shared;
}

NcclHandle::~NcclHandle() {
  release(false);
  std::lock_guard<std::mutex> lock(poolMu_);
  for (cudaEvent_t e : events_) (void)cudaEventDestroy(e);
  events_.clear();
  pool_.clear();
}

void NcclHandle::adopt(ncclComm_t comm, bool owned, int rank, int device, FailureSink onFailure) {
  rank_ = rank;
  device_ = device;
  onFailure_ = std::move(onFailure);
  if (comm == nullptr) return;
  comm_ = owned ? std::make_shared<NcclComm>(comm, false) : externalNcclComm(comm);
  Watchdog::Hooks hooks;
  hooks.threadStart = [device] {
    // The thread's first CUDA call would otherwise create a context on device 0. Thread-local
    // capture mode: an application thread capturing a graph in the global mode must not see
    // this thread's event queries as unsafe calls (that would invalidate its capture).
    (void)cudaSetDevice(device);
    cudaStreamCaptureMode mode = cudaStreamCaptureModeThreadLocal;
    (void)cudaThreadExchangeStreamCaptureMode(&mode);
  };
  hooks.query = [](void* marker) {
    const cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(marker));
    return e == cudaErrorNotReady ? Watchdog::Progress::kPending : Watchdog::Progress::kDone;
  };
  hooks.release = [this](void* marker) { giveEvent(marker); };
  hooks.failed = [this](anyrResult_t* code, std::string* msg) { return pollAsyncError(code, msg); };
  hooks.expire = [this](anyrResult_t code, const std::string& msg) { expired(code, msg); };
  watchdog_ = std::make_unique<Watchdog>(std::move(hooks), std::chrono::milliseconds(kPollMs));
}

ncclComm_t NcclHandle::get() const {
  if (!comm_) return nullptr;
  std::lock_guard<std::mutex> lock(comm_->mutex());
  return released_ ? nullptr : comm_->get();
}

ncclComm_t NcclHandle::liveLocked() const {
  if (!released_ && comm_->get() != nullptr) return comm_->get();
  if (!released_ && comm_->failCode() != anyrSuccess) {
    throwError(comm_->failCode(), comm_->failMsg());
  }
  throwError(anyrAborted, "the NCCL communicator was released (aborted)");
}

cudaEvent_t NcclHandle::takeEvent() {
  std::lock_guard<std::mutex> lock(poolMu_);
  if (!pool_.empty()) {
    cudaEvent_t e = pool_.back();
    pool_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  ANYR_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  events_.push_back(e);
  return e;
}

void NcclHandle::giveEvent(void* event) {
  if (event == nullptr) return;
  std::lock_guard<std::mutex> lock(poolMu_);
  pool_.push_back(static_cast<cudaEvent_t>(event));
}

void NcclHandle::allReduceSum(const void* in, void* out, size_t count, anyrDataType_t dtype,
                              cudaStream_t stream, int timeoutMs) {
  const ncclDataType_t type = ncclType(dtype);
  if (!comm_) throwError(anyrAborted, "the NCCL communicator was released (aborted)");
  // The two events go back to the pool unless the watchdog took them.
  struct Markers {
    NcclHandle* h;
    cudaEvent_t begin = nullptr;
    cudaEvent_t end = nullptr;
    ~Markers() {
      h->giveEvent(begin);
      h->giveEvent(end);
    }
  } markers{this};
  const bool watched = watchdog_ != nullptr && !streamCapturing(stream);
  if (watched) {
    markers.begin = takeEvent();
    markers.end = takeEvent();
  }
  std::unique_lock<std::mutex> lock(comm_->mutex());
  ncclComm_t comm = liveLocked();
  if (watched) ANYR_CUDA_CHECK(cudaEventRecord(markers.begin, stream));
  if (testHook_) testHook_(stream);
  ncclResult_t r = ncclAllReduce(in, out, count, type, ncclSum, comm, stream);
  if (r == ncclInProgress) {
    // The mutex is dropped while sleeping, so that an abort is not held up by this wait.
    bool released = false;
    r = settleWith(
        comm, timeoutMs,
        [&]() -> ncclComm_t {
          lock.unlock();
          std::this_thread::sleep_for(std::chrono::microseconds(100));
          lock.lock();
          return released_ ? nullptr : comm_->get();
        },
        &released);
    if (released) {
      if (!released_ && comm_->failCode() != anyrSuccess) {
        throwError(comm_->failCode(), comm_->failMsg());
      }
      throwError(anyrAborted, "the communicator was aborted while ncclAllReduce was enqueued");
    }
    if (r == ncclInProgress) {
      const std::string msg = comm_->stop(
          anyrTimeout, who() + "NCCL all-reduce was still being enqueued after " +
                           std::to_string(timeoutMs) +
                           " ms (NCCL connects to its peers at first use); NCCL does not say "
                           "which rank");
      lock.unlock();
      if (onFailure_) onFailure_(anyrTimeout, msg);
      throwError(anyrTimeout, msg);
    }
  }
  if (r != ncclSuccess) {
    std::string what = "ncclAllReduce";
    const char* last = ncclGetLastError(comm);
    if (last != nullptr && *last != '\0') what += std::string(" (") + last + ")";
    if (fatalForTheCommunicator(r)) {
      // NCCL: the communicator must be aborted; its kernels may never finish otherwise.
      const anyrResult_t code = r == ncclRemoteError ? anyrRemoteError : anyrNcclError;
      const std::string msg = comm_->stop(code, who() + what + ": " + ncclGetErrorString(r));
      lock.unlock();
      if (onFailure_) onFailure_(code, msg);
      throwError(code, msg);
    }
    throwError(anyrNcclError, what + ": " + ncclGetErrorString(r));
  }
  if (watched) ANYR_CUDA_CHECK(cudaEventRecord(markers.end, stream));
  lock.unlock();
  if (watched) {
    cudaEvent_t begin = markers.begin, end = markers.end;
    markers.begin = markers.end = nullptr;
    watchdog_->watch(begin, end, timeoutMs, who() + "NCCL all-reduce");
  }
}

bool NcclHandle::pollAsyncError(anyrResult_t* code, std::string* msg) {
  // Busy (a call's enqueue, or the NCCL bootstrap inside a blocking NCCL call on the caller's
  // communicator): ask again at the next poll rather than wait.
  std::unique_lock<std::mutex> lock(comm_->mutex(), std::try_to_lock);
  if (!lock.owns_lock()) return false;
  ncclComm_t comm = released_ ? nullptr : comm_->get();
  if (comm == nullptr) return false;
  ncclResult_t state = ncclSuccess;
  if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) return false;
  if (state == ncclSuccess || state == ncclInProgress) return false;
  *code = state == ncclRemoteError ? anyrRemoteError : anyrNcclError;
  *msg = who() + "NCCL reported an asynchronous error while an all-reduce was outstanding: " +
         ncclGetErrorString(state);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') *msg += std::string(" (") + last + ")";
  if (state == ncclRemoteError) *msg += "; a peer or the network failed (NCCL names no rank)";
  return true;
}

void NcclHandle::expired(anyrResult_t code, const std::string& what) {
  std::string msg;
  {
    std::lock_guard<std::mutex> lock(comm_->mutex());
    // Released (anyrCommAbort, destroy) or already stopped by its other user: nothing to add.
    if (released_ || comm_->get() == nullptr) return;
    msg = comm_->stop(code, code == anyrTimeout ? what + "; NCCL does not say which rank" : what);
  }
  ANYR_LOG(Warn, rank_, msg);
  if (onFailure_) onFailure_(code, msg);
}

ncclResult_t NcclHandle::asyncError() const {
  if (!comm_) return ncclSuccess;
  // Non-blocking: while another thread uses the communicator, its state is not asked this time.
  std::unique_lock<std::mutex> lock(comm_->mutex(), std::try_to_lock);
  if (!lock.owns_lock()) return ncclSuccess;
  ncclComm_t comm = released_ ? nullptr : comm_->get();
  if (comm == nullptr) return ncclSuccess;
  ncclResult_t state = ncclSuccess;
  return ncclCommGetAsyncError(comm, &state) == ncclSuccess ? state : ncclSuccess;
}

std::string NcclHandle::stopCallers(anyrResult_t code, const std::string& msg) {
  if (!comm_ || !comm_->external()) return "";
  std::string done;
  {
    std::lock_guard<std::mutex> lock(comm_->mutex());
    if (released_ || comm_->get() == nullptr) return "";
    done = comm_->stop(code, msg).substr(msg.size());
  }
  ANYR_LOG(Warn, rank_, "a refused call: stopping the NCCL communicator you passed" << done);
  return done;
}

void NcclHandle::release(bool ok) {
  // The watchdog first, without the communicator's mutex: its hooks take that mutex.
  const size_t pending = watchdog_ ? watchdog_->stop() : 0;
  if (!comm_) return;
  std::string msg;
  {
    std::lock_guard<std::mutex> lock(comm_->mutex());
    if (released_) return;
    if (!comm_->external()) {
      // ncclCommDestroy waits for outstanding work without a bound: abort then.
      comm_->release(ok && pending == 0);
    } else if (!ok && pending > 0 && comm_->get() != nullptr) {
      msg = comm_->stop(anyrAborted,
                        who() + "the communicator was released while " + std::to_string(pending) +
                            " NCCL all-reduce(s) on the NCCL communicator you passed had not "
                            "completed");
    }
    released_ = true;
  }
  if (!msg.empty()) ANYR_LOG(Warn, rank_, msg);
}

}  // namespace anyr
