// Bootstrap through an existing NCCL communicator, for servers that already hold one
// (anyrCommInitFromNccl).
//
// allGather stages through pinned host memory and device memory on a private non-blocking
// stream: host -> device copy, ncclAllGather (as ncclUint8), device -> host copy, then a bounded
// wait that polls cudaStreamQuery and ncclCommGetAsyncError until the deadline. Pinned staging
// matters: a copy to pageable memory would block the host until the collective finished, an
// unbounded wait. Every contribution starts with a header (src/bootstrap/nccl_exchange.h) that
// names the ranks an exchange waited for, and catches an operation of someone else that paired
// with it. The first exchange runs in init(), so that a rank that never calls
// anyrCommInitFromNccl is named there.
//
// Failure: an NCCL operation that does not complete within the timeout cannot be withdrawn, and
// left queued it would pair with the application's next collective on the same communicator
// (wrong data, or a hang there). So on a timeout (or an error NCCL calls fatal) the
// communicator the caller passed is stopped (NcclComm::stop, src/transport/nccl_comm.h): revoked
// where NCCL has ncclCommRevoke (NCCL then refuses further operations on it; it stays the
// caller's to destroy), otherwise aborted, which frees it. The error message says which, and
// the bootstrap is unusable from then on. Staging buffers are freed once the stream drained
// (bounded); work still in flight after that bound leaks them rather than freeing under it.
//
// Bounds hold for a non-blocking NCCL communicator (ncclConfig_t.blocking = 0), and for a
// blocking one whose connections for the all-gather exist (a server's first collectives make
// them). Otherwise a blocking one can block inside ncclAllGather while NCCL connects to a peer
// that never calls: NCCL allows no abort while a thread is inside an NCCL call on the
// communicator, so no timeout of ours applies there.
//
// Every NCCL call holds the communicator's shared mutex (NcclComm), shared with the
// Communicator's NcclHandle on the same communicator; waits drop it between polls.
// One bootstrap must be used by one thread at a time.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "base/log.h"
#include "bootstrap/bootstrap.h"
#include "bootstrap/nccl_exchange.h"
#include "bootstrap/socket.h"
#include "transport/nccl_comm.h"

namespace anyr {

namespace ncclexchange {

std::vector<int> notArrived(const std::vector<Header>& headers, uint32_t seq) {
  std::vector<int> missing;
  for (size_t r = 0; r < headers.size(); ++r) {
    const Header& h = headers[r];
    if (h.magic != kMagic || h.rank != static_cast<int32_t>(r) || h.seq != seq) {
      missing.push_back(static_cast<int>(r));
    }
  }
  return missing;
}

std::string timeoutMessage(int rank, int nranks, int timeoutMs, uint32_t seq, bool started,
                           bool known, const std::vector<int>& missing) {
  const bool first = seq == 1;
  const std::string prefix = first ? "anyrCommInitFromNccl: " : "bootstrap through NCCL: ";
  const std::string what = first ? "the first exchange" : "exchange #" + std::to_string(seq);
  const std::string within = " within " + std::to_string(timeoutMs) + " ms";
  const std::string at = " at rank " + std::to_string(rank) + " of " + std::to_string(nranks);
  if (!started) {
    return prefix + what + " did not start" + within + at +
           ": NCCL was still connecting to its peers, which a rank that does not call never "
           "completes; NCCL does not say which rank";
  }
  if (!known) {
    return prefix + what + " did not complete" + within + at +
           "; NCCL does not say which rank, and the contributions that arrived could not be read";
  }
  if (missing.empty()) {
    return prefix + what + " did not complete" + within + at +
           ", although every rank's contribution arrived; NCCL does not say why";
  }
  const std::string verb = first ? "call anyrCommInitFromNccl" : "join " + what;
  if (missing.size() == 1) {
    return prefix + "rank " + std::to_string(missing[0]) + " did not " + verb + within +
           " (its contribution to " + what + " did not arrive" + at + ")";
  }
  std::string list;
  for (size_t i = 0; i < missing.size(); ++i) {
    list += (i == 0 ? "" : i + 1 == missing.size() ? " and " : ", ") + std::to_string(missing[i]);
  }
  return prefix + "the contributions of ranks " + list + " to " + what + " did not arrive" + at +
         within + ": at least one of them did not " + verb +
         " (NCCL may pass contributions along a ring, where a missing rank also holds back the "
         "ones after it)";
}

std::string checkHeaders(const std::vector<Header>& headers, uint32_t seq) {
  for (size_t r = 0; r < headers.size(); ++r) {
    const Header& h = headers[r];
    std::string got;
    if (h.magic != kMagic) {
      got = "data that is not anyreduce's";
    } else if (h.rank != static_cast<int32_t>(r)) {
      got = "rank " + std::to_string(h.rank) + "'s contribution";
    } else if (h.seq != seq) {
      got = "its contribution to exchange #" + std::to_string(h.seq);
    } else {
      continue;
    }
    return "bootstrap through NCCL: in exchange #" + std::to_string(seq) + ", the slot of rank " +
           std::to_string(r) + " holds " + got +
           ": another operation on the NCCL communicator paired with the exchange (every rank "
           "must issue the same NCCL operations on it in the same order)";
  }
  return "";
}

}  // namespace ncclexchange

namespace {

using ncclexchange::Header;
constexpr size_t kHeader = sizeof(Header);

// How long a failure waits for the private stream to drain once NCCL was stopped, before
// leaving its staging buffers allocated.
constexpr int kDrainMs = 5000;
// How long a timed-out exchange waits for the copy of the headers that arrived.
constexpr int kPeekMs = 1000;

std::string ncclFailure(const char* expr, ncclResult_t r, ncclComm_t comm) {
  std::string msg =
      std::string("bootstrap through NCCL: ") + expr + " failed: " + ncclGetErrorString(r);
  const char* last = comm != nullptr ? ncclGetLastError(comm) : nullptr;
  if (last != nullptr && *last != '\0') msg += std::string(" (") + last + ")";
  return msg;
}

// NCCL's documented fatal errors: the communicator must be aborted.
bool fatal(ncclResult_t r) {
  return r == ncclUnhandledCudaError || r == ncclSystemError || r == ncclInternalError ||
         r == ncclRemoteError;
}

bool waitIdle(cudaStream_t s, int ms) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (cudaStreamQuery(s) == cudaErrorNotReady && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  const bool idle = cudaStreamQuery(s) == cudaSuccess;
  (void)cudaGetLastError();
  return idle;
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
  NcclBootstrap(ncclComm_t comm, int timeoutMs)
      : shared_(externalNcclComm(comm)), timeoutMs_(timeoutMs) {}
  ~NcclBootstrap() override;

  // Waits (bounded) for a non-blocking communicator to finish initializing, reads rank, size
  // and device, creates the streams, and runs the first exchange (every rank present?).
  void init();

  int rank() const override { return rank_; }
  int size() const override { return nranks_; }
  void allGather(const void* in, void* out, size_t bytes) override;
  void barrier() override;

 private:
  enum class Wait { kDone, kTimedOut };

  // allGather's work: one exchange; the caller marks the bootstrap failed on an error.
  void exchange(const void* in, void* out, size_t bytes);
  void reserve(size_t slotBytes);
  void freeStaging();
  // Locks the shared mutex; returns the communicator, or throws when it was stopped.
  ncclComm_t lockComm(std::unique_lock<std::mutex>& lock);
  // Runs one NCCL enqueue under the mutex; returns ncclSuccess or ncclInProgress (errors are
  // thrown, fatal ones after stopping the communicator).
  template <typename Call>
  ncclResult_t enqueue(const char* expr, Call&& call);
  // Polls NCCL's state until it leaves ncclInProgress (a non-blocking communicator's enqueue)
  // or the deadline; an asynchronous error fails.
  Wait waitComm(const Deadline& deadline, const char* expr);
  // Polls the stream and NCCL's asynchronous error until the stream is idle or the deadline.
  Wait waitStream(const Deadline& deadline, const char* expr);
  // After a timed-out exchange whose all-gather NCCL accepted: copies the slots' headers on the
  // second stream (bounded) and returns the ranks whose contribution had not arrived; false
  // when they could not be read.
  bool peekMissing(size_t slotBytes, std::vector<int>* missing);
  // Stops the caller's communicator (revoke or abort), waits (bounded) for the stream, and
  // throws `msg` with what was done.
  [[noreturn]] void fail(anyrResult_t code, const std::string& msg);
  // After an error that did not stop the communicator (a CUDA error, say): when an NCCL
  // operation of ours may still be queued, it could pair with the application's next
  // collective, so the communicator is stopped (fail() with e's code and message).
  void stopIfQueued(const Error& e);

  std::shared_ptr<NcclComm> shared_;
  int timeoutMs_;
  int rank_ = -1;
  int nranks_ = 0;
  int device_ = -1;
  uint32_t seq_ = 0;               // exchanges started
  cudaStream_t stream_ = nullptr;  // staging copies and NCCL's all-gather
  cudaStream_t peek_ = nullptr;    // reads the headers while NCCL's kernel holds stream_
  cudaEvent_t staged_ = nullptr;   // on stream_, before the all-gather: the staging exists
  void* dIn_ = nullptr;            // device staging: capacity_ bytes
  void* dOut_ = nullptr;           // capacity_ * nranks_ bytes
  void* hIn_ = nullptr;            // pinned host staging, same sizes
  void* hOut_ = nullptr;
  void* hPeek_ = nullptr;      // pinned, nranks_ headers
  size_t capacity_ = 0;        // bytes of one slot: header + payload
  bool inFlight_ = false;      // work still queued may use the staging buffers
  bool peekInFlight_ = false;  // a copy into hPeek_ may still be pending
  bool ncclQueued_ = false;    // an NCCL operation of ours was enqueued and not seen complete
  bool failed_ = false;
  std::string failMsg_;
};

NcclBootstrap::~NcclBootstrap() {
  if (device_ < 0) return;
  int prev = -1;
  bool switched = cudaGetDevice(&prev) == cudaSuccess && prev != device_ &&
                  cudaSetDevice(device_) == cudaSuccess;
  if (inFlight_ && stream_ != nullptr && cudaStreamQuery(stream_) == cudaSuccess) {
    inFlight_ = false;  // it drained since
  }
  if (peekInFlight_ && peek_ != nullptr && cudaStreamQuery(peek_) == cudaSuccess) {
    peekInFlight_ = false;
  }
  if (!inFlight_) freeStaging();
  if (!peekInFlight_ && hPeek_ != nullptr) (void)cudaFreeHost(hPeek_);
  if (staged_ != nullptr) (void)cudaEventDestroy(staged_);
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);  // returns at once even if busy
  if (peek_ != nullptr) (void)cudaStreamDestroy(peek_);
  (void)cudaGetLastError();
  if (switched) (void)cudaSetDevice(prev);
}

// The device buffers are stream-ordered on stream_ (their only user but for the headers'
// copy, which waits for staged_): freeing them waits for nothing else on the GPU, unlike
// cudaFree (a server's busy NCCL communicator, say).
void NcclBootstrap::freeStaging() {
  if (dIn_ != nullptr) (void)cudaFreeAsync(dIn_, stream_);
  if (dOut_ != nullptr) (void)cudaFreeAsync(dOut_, stream_);
  if (hIn_ != nullptr) (void)cudaFreeHost(hIn_);
  if (hOut_ != nullptr) (void)cudaFreeHost(hOut_);
  dIn_ = dOut_ = hIn_ = hOut_ = nullptr;
  capacity_ = 0;
}

ncclComm_t NcclBootstrap::lockComm(std::unique_lock<std::mutex>& lock) {
  lock = std::unique_lock<std::mutex>(shared_->mutex());
  ncclComm_t comm = shared_->get();
  if (comm == nullptr) {
    const std::string why = shared_->failMsg();
    lock.unlock();
    throwError(anyrInvalidUsage,
               "bootstrap through NCCL: the NCCL communicator was stopped earlier" +
                   (why.empty() ? std::string() : ": " + why));
  }
  return comm;
}

template <typename Call>
ncclResult_t NcclBootstrap::enqueue(const char* expr, Call&& call) {
  std::unique_lock<std::mutex> lock;
  ncclComm_t comm = lockComm(lock);
  const ncclResult_t r = call(comm);
  if (r == ncclSuccess || r == ncclInProgress) {
    ncclQueued_ = true;
    return r;
  }
  const std::string msg = ncclFailure(expr, r, comm);
  lock.unlock();
  // A non-fatal error (invalid argument or usage): the call had no effect, nothing is queued.
  if (!fatal(r)) throwError(anyrNcclError, msg);
  fail(r == ncclRemoteError ? anyrRemoteError : anyrNcclError, msg);
}

NcclBootstrap::Wait NcclBootstrap::waitComm(const Deadline& deadline, const char* expr) {
  for (;;) {
    ncclResult_t state = ncclSuccess;
    std::string msg;
    {
      std::unique_lock<std::mutex> lock;
      ncclComm_t comm = lockComm(lock);
      const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
      if (r != ncclSuccess) {
        state = r;
        expr = "ncclCommGetAsyncError";
      }
      if (state != ncclSuccess && state != ncclInProgress) msg = ncclFailure(expr, state, comm);
    }
    if (state == ncclSuccess) return Wait::kDone;
    if (!msg.empty()) fail(state == ncclRemoteError ? anyrRemoteError : anyrNcclError, msg);
    if (deadline.expired()) return Wait::kTimedOut;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

NcclBootstrap::Wait NcclBootstrap::waitStream(const Deadline& deadline, const char* expr) {
  int pauseUs = 20;
  for (;;) {
    const cudaError_t e = cudaStreamQuery(stream_);
    if (e == cudaSuccess) return Wait::kDone;
    if (e != cudaErrorNotReady) ANYR_CUDA_CHECK(e);
    ncclResult_t state = ncclSuccess;
    std::string msg;
    {
      std::unique_lock<std::mutex> lock;
      ncclComm_t comm = lockComm(lock);
      const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
      if (r != ncclSuccess) state = r;
      if (state != ncclSuccess && state != ncclInProgress) msg = ncclFailure(expr, state, comm);
    }
    if (!msg.empty()) fail(state == ncclRemoteError ? anyrRemoteError : anyrNcclError, msg);
    if (deadline.expired()) return Wait::kTimedOut;
    std::this_thread::sleep_for(std::chrono::microseconds(pauseUs));
    pauseUs = std::min(pauseUs * 2, 1000);
  }
}

bool NcclBootstrap::peekMissing(size_t slotBytes, std::vector<int>* missing) {
  if (cudaStreamWaitEvent(peek_, staged_, 0) != cudaSuccess ||
      cudaMemcpy2DAsync(hPeek_, kHeader, dOut_, slotBytes, kHeader, static_cast<size_t>(nranks_),
                        cudaMemcpyDeviceToHost, peek_) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  peekInFlight_ = true;
  if (!waitIdle(peek_, kPeekMs)) return false;
  peekInFlight_ = false;
  std::vector<Header> headers(static_cast<size_t>(nranks_));
  std::memcpy(headers.data(), hPeek_, kHeader * headers.size());
  *missing = ncclexchange::notArrived(headers, seq_);
  return true;
}

void NcclBootstrap::fail(anyrResult_t code, const std::string& msg) {
  std::string full;
  {
    std::lock_guard<std::mutex> lock(shared_->mutex());
    if (shared_->stopped()) {
      full = msg + " (the NCCL communicator had been stopped already: " + shared_->failMsg() + ")";
    } else {
      full = shared_->stop(code, msg);
    }
  }
  ANYR_LOG(Warn, rank_, full);
  // NCCL's kernels are released now: let the stream drain so the staging can be freed.
  if (stream_ != nullptr) inFlight_ = !waitIdle(stream_, kDrainMs);
  ncclQueued_ = false;
  throwError(code, full);
}

void NcclBootstrap::stopIfQueued(const Error& e) {
  if (!ncclQueued_ || shared_->stopped() || stream_ == nullptr) return;
  const cudaError_t q = cudaStreamQuery(stream_);
  (void)cudaGetLastError();
  if (q == cudaSuccess) {
    ncclQueued_ = false;
    return;
  }
  fail(e.code(), e.what());
}

void NcclBootstrap::init() {
  // A non-blocking communicator may still be initializing. Nothing of ours is queued on it yet,
  // so a failure here leaves it as it is.
  Deadline deadline(timeoutMs_);
  for (;;) {
    std::unique_lock<std::mutex> lock;
    ncclComm_t comm = lockComm(lock);
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) throwError(anyrNcclError, ncclFailure("ncclCommGetAsyncError", r, comm));
    if (state == ncclSuccess) break;
    if (state != ncclInProgress) {
      throwError(anyrNcclError, ncclFailure("communicator initialization", state, comm));
    }
    lock.unlock();
    if (deadline.expired()) {
      throwError(anyrTimeout,
                 "bootstrap through NCCL: the NCCL communicator was still initializing after " +
                     std::to_string(timeoutMs_) + " ms");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  int device = -1;
  {
    std::unique_lock<std::mutex> lock;
    ncclComm_t comm = lockComm(lock);
    ncclResult_t r = ncclCommCount(comm, &nranks_);
    if (r == ncclSuccess) r = ncclCommUserRank(comm, &rank_);
    if (r == ncclSuccess) r = ncclCommCuDevice(comm, &device);
    if (r != ncclSuccess) {
      throwError(anyrNcclError, ncclFailure("querying the communicator", r, comm));
    }
  }
  DeviceGuard guard(device);
  ANYR_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  device_ = device;  // from here on the destructor cleans up on this device
  ANYR_CUDA_CHECK(cudaStreamCreateWithFlags(&peek_, cudaStreamNonBlocking));
  ANYR_CUDA_CHECK(cudaEventCreateWithFlags(&staged_, cudaEventDisableTiming));
  ANYR_CUDA_CHECK(
      cudaHostAlloc(&hPeek_, kHeader * static_cast<size_t>(nranks_), cudaHostAllocDefault));
  ANYR_LOG(
      Info, rank_,
      "bootstrap through NCCL: rank " << rank_ << " of " << nranks_ << " on device " << device_);
  // The first exchange: every rank present, and of one communicator size.
  const int32_t mine = nranks_;
  std::vector<int32_t> all(static_cast<size_t>(nranks_));
  allGather(&mine, all.data(), sizeof(mine));
  for (int r = 0; r < nranks_; ++r) {
    if (all[static_cast<size_t>(r)] != nranks_) {
      throwError(anyrInvalidUsage, "anyrCommInitFromNccl: rank " + std::to_string(r) +
                                       " has an NCCL communicator of " +
                                       std::to_string(all[static_cast<size_t>(r)]) +
                                       " ranks, rank " + std::to_string(rank_) + " one of " +
                                       std::to_string(nranks_));
    }
  }
}

void NcclBootstrap::reserve(size_t slotBytes) {
  if (slotBytes <= capacity_) return;
  // At least 4 KiB, and at least double: few reallocations (pinned host memory is freed with
  // cudaFreeHost).
  const size_t cap = std::max<size_t>({slotBytes, 2 * capacity_, 4096});
  freeStaging();
  const size_t all = cap * static_cast<size_t>(nranks_);
  ANYR_CUDA_CHECK(cudaMallocAsync(&dIn_, cap, stream_));
  ANYR_CUDA_CHECK(cudaMallocAsync(&dOut_, all, stream_));
  ANYR_CUDA_CHECK(cudaHostAlloc(&hIn_, cap, cudaHostAllocDefault));
  ANYR_CUDA_CHECK(cudaHostAlloc(&hOut_, all, cudaHostAllocDefault));
  capacity_ = cap;
}

void NcclBootstrap::exchange(const void* in, void* out, size_t bytes) {
  Deadline deadline(timeoutMs_);
  DeviceGuard guard(device_);
  const uint32_t seq = ++seq_;
  const size_t slot = kHeader + bytes;
  reserve(slot);
  Header h;
  h.magic = ncclexchange::kMagic;
  h.rank = rank_;
  h.seq = seq;
  std::memcpy(hIn_, &h, kHeader);
  if (bytes > 0) std::memcpy(static_cast<char*>(hIn_) + kHeader, in, bytes);
  ANYR_CUDA_CHECK(cudaMemcpyAsync(dIn_, hIn_, slot, cudaMemcpyHostToDevice, stream_));
  // Cleared each time: a header in a slot then arrived in this exchange (not left over from
  // memory used before, which could hold one).
  ANYR_CUDA_CHECK(cudaMemsetAsync(dOut_, 0, slot * static_cast<size_t>(nranks_), stream_));
  ANYR_CUDA_CHECK(cudaEventRecord(staged_, stream_));
  const ncclResult_t r = enqueue("ncclAllGather", [&](ncclComm_t comm) {
    return ncclAllGather(dIn_, dOut_, slot, ncclUint8, comm, stream_);
  });
  if (r == ncclInProgress && waitComm(deadline, "ncclAllGather") == Wait::kTimedOut) {
    fail(anyrTimeout, ncclexchange::timeoutMessage(rank_, nranks_, timeoutMs_, seq,
                                                   /*started=*/false, false, {}));
  }
  const size_t total = slot * static_cast<size_t>(nranks_);
  ANYR_CUDA_CHECK(cudaMemcpyAsync(hOut_, dOut_, total, cudaMemcpyDeviceToHost, stream_));
  if (waitStream(deadline, "ncclAllGather") == Wait::kTimedOut) {
    std::vector<int> missing;
    const bool known = peekMissing(slot, &missing);
    // A rank that arrived at the last moment: the exchange may have completed since.
    if (cudaStreamQuery(stream_) != cudaSuccess) {
      (void)cudaGetLastError();
      fail(anyrTimeout, ncclexchange::timeoutMessage(rank_, nranks_, timeoutMs_, seq,
                                                     /*started=*/true, known, missing));
    }
  }
  ncclQueued_ = false;
  std::vector<Header> headers(static_cast<size_t>(nranks_));
  for (int r2 = 0; r2 < nranks_; ++r2) {
    std::memcpy(&headers[static_cast<size_t>(r2)],
                static_cast<const char*>(hOut_) + slot * static_cast<size_t>(r2), kHeader);
  }
  const std::string wrong = ncclexchange::checkHeaders(headers, seq);
  if (!wrong.empty()) fail(anyrInvalidUsage, wrong);
  for (int r2 = 0; r2 < nranks_ && bytes > 0; ++r2) {
    std::memcpy(static_cast<char*>(out) + bytes * static_cast<size_t>(r2),
                static_cast<const char*>(hOut_) + slot * static_cast<size_t>(r2) + kHeader, bytes);
  }
}

void NcclBootstrap::allGather(const void* in, void* out, size_t bytes) {
  if (failed_) {
    throwError(anyrInvalidUsage, "bootstrap: unusable after an earlier failure: " + failMsg_);
  }
  ANYR_REQUIRE_ARG(bytes == 0 || (in != nullptr && out != nullptr), "in/out",
                   "must not be NULL when bytes > 0");
  try {
    try {
      // bytes == 0 is still a synchronization point, as on the TCP bootstrap: the headers.
      exchange(in, out, bytes);
    } catch (const Error& e) {
      stopIfQueued(e);
      throw;
    }
  } catch (const Error& e) {
    failed_ = true;
    failMsg_ = e.what();
    // Whatever failed, work still queued on the stream may use the staging buffers.
    if (stream_ != nullptr && cudaStreamQuery(stream_) != cudaSuccess) inFlight_ = true;
    (void)cudaGetLastError();
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
