// The NCCL algorithm: for large messages, for multi-host communicators, and as the universal
// fallback. Also owns creating an NCCL communicator with a bounded wait, and the watchdog that
// bounds NCCL's calls (its kernels have no deadline of their own).
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "anyreduce/anyreduce.h"
#include "transport/nccl_watchdog.h"

namespace anyr {

class Bootstrap;

// Creates an NCCL communicator over the bootstrap's ranks (non-blocking init polled until
// `timeoutMs`). Returns nullptr and sets *why on failure on this rank; the caller agrees
// across ranks whether NCCL is usable.
ncclComm_t createNcclComm(Bootstrap& bs, int timeoutMs, std::string* why);

// Destroys (ok == true) or aborts an NCCL communicator; never throws.
void releaseNcclComm(ncclComm_t comm, bool ok);

// True when the NCCL library loaded in this process has ncclCommRevoke (2.28.7 or newer; looked
// up at run time, so that one build runs on older NCCL too).
bool ncclHasRevoke();

// One NCCL communicator and the mutex that every use of it holds. NCCL takes one thread at a
// time on a communicator, and allows ncclCommAbort only while no other thread is inside an NCCL
// call on it: every NCCL call on it (enqueue, asynchronous-error query, revoke, abort) holds
// mutex(); a bounded wait for an operation NCCL reports in progress drops it between polls.
//
// The communicator a caller passed to anyrCommInitFromNccl has two users, the NCCL bootstrap
// (src/bootstrap/nccl_bootstrap.cc) and the Communicator's NcclHandle. They share one NcclComm
// (externalNcclComm): one mutex, and once either stopped the communicator the other never
// touches it again (after ncclCommAbort its handle is freed).
class NcclComm {
 public:
  NcclComm(ncclComm_t comm, bool external) : comm_(comm), external_(external) {}
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  std::mutex& mutex() { return mu_; }
  bool external() const { return external_; }
  // True once stop() ran (readable without the mutex).
  bool stopped() const { return stopped_.load(); }

  // Under mutex(): the communicator; NULL once stopped or released.
  ncclComm_t get() const { return comm_; }
  // Under mutex(): why it was stopped (anyrSuccess and "" while it was not).
  anyrResult_t failCode() const { return failCode_; }
  const std::string& failMsg() const { return failMsg_; }

  // Under mutex(): stops every NCCL operation in flight on the communicator, once, and forgets
  // it; returns `msg` followed by what was done, also kept as failMsg() with `code`. Ours is
  // aborted (ncclCommAbort). The caller's is revoked where NCCL has ncclCommRevoke: NCCL then
  // refuses every further operation on it (ncclInvalidUsage), and it stays the caller's to
  // destroy. With an older NCCL it is aborted, which frees it: the message says so, and the
  // caller must neither use nor destroy it. Either way nothing anyreduce enqueued on it can
  // pair with the application's next collective. A second stop() returns failMsg().
  std::string stop(anyrResult_t code, const std::string& msg);
  // Under mutex(): forgets a communicator of ours after ncclCommDestroy (ok) or ncclCommAbort;
  // the caller's is left as it is.
  void release(bool ok);

 private:
  std::mutex mu_;
  ncclComm_t comm_;
  const bool external_;
  std::atomic<bool> stopped_{false};
  anyrResult_t failCode_ = anyrSuccess;
  std::string failMsg_;
};

// The NcclComm shared by every user of the caller's communicator `comm`: created at the first
// request, kept while a user holds it. A communicator that was stopped is forgotten by the
// registry, so that a new communicator NCCL later places at the same address starts afresh.
std::shared_ptr<NcclComm> externalNcclComm(ncclComm_t comm);

// A communicator's NCCL communicator, shared by the thread making a call, a thread calling
// anyrCommAbort or anyrCommGetAsyncError, and the watchdog thread.
//
// Watchdog: every eager call records an event before and after its NCCL enqueue; a thread per
// handle (started at the first call, ended by release()) polls them every 5 ms. A call that has
// not completed `timeoutMs` after it could start (its first event completed), or an asynchronous
// error NCCL reports meanwhile, stops the NCCL communicator (NcclComm::stop: ours aborted, the
// caller's revoked or aborted), which releases NCCL's kernels, and reports the failure through
// `onFailure` so that the next call and anyrCommGetAsyncError return it. NCCL does not say
// which rank failed to join a collective, so a timeout names none and says so.
//
// Calls captured into a CUDA graph are not watched: their events would be recorded once, at
// capture, while the NCCL kernels run at each replay, which the host does not see. A replayed
// NCCL all-reduce whose peer never joins is released, on a communicator of ours, only by
// anyrCommAbort or by destroying the communicator after a failure (both abort NCCL); on the
// caller's NCCL communicator only by the caller stopping it.
class NcclHandle {
 public:
  using FailureSink = std::function<void(anyrResult_t code, const std::string& msg)>;

  NcclHandle() = default;
  ~NcclHandle();
  NcclHandle(const NcclHandle&) = delete;
  NcclHandle& operator=(const NcclHandle&) = delete;

  // Takes `comm` (NULL: none). `owned`: ours, release() destroys or aborts it; otherwise the
  // caller's (anyrCommInitFromNccl), shared with the NCCL bootstrap. `rank` is named in
  // messages; `device` is the communicator's (the watchdog thread works on it); `onFailure`
  // receives a failure the watchdog found, from the watchdog thread. Once, before any call.
  void adopt(ncclComm_t comm, bool owned, int rank, int device, FailureSink onFailure);
  // The handle (NULL once released or stopped), for anyrCommGetNcclComm.
  ncclComm_t get() const;
  bool present() const { return get() != nullptr; }
  // ncclAllReduce(sum), waiting (bounded by timeoutMs) while it reports in progress, then
  // watched (eager calls). Throws the recorded failure once the communicator was stopped,
  // anyrAborted after release(), anyrTimeout (the enqueue overran: the communicator is stopped
  // and onFailure told) or anyrNcclError.
  void allReduceSum(const void* in, void* out, size_t count, anyrDataType_t dtype,
                    cudaStream_t stream, int timeoutMs);
  // NCCL's asynchronous error (ncclSuccess without a communicator, or while another thread
  // holds it: never waits).
  ncclResult_t asyncError() const;
  // Ends the watchdog thread (bounded), then destroys (ok, and no watched call outstanding) or
  // aborts a communicator of ours and forgets it. The caller's is left alone, unless a watched
  // call on it had not completed and ok is false: then it is stopped (NcclComm::stop), since
  // nothing else would release that call's kernels. Never throws.
  void release(bool ok);
  // The caller's communicator (adopted with owned false) is stopped (NcclComm::stop, `msg` with
  // `code`) and forgotten, so that no collective the application makes on it later can pair with
  // a peer's NCCL all-reduce that this rank will never join (a call refused on this rank after
  // its peers may have made it). Returns what was done ("; the NCCL communicator you passed was
  // revoked ..."), or "" where there is nothing to stop: no communicator, ours (its NCCL kernels
  // serve only anyreduce's calls, which have stopped), or one released or stopped already.
  std::string stopCallers(anyrResult_t code, const std::string& msg);

  // Tests only: runs on each call's stream before the NCCL enqueue, after the call's first event
  // (a GPU test stalls the stream there to make a call overrun its deadline on one GPU).
  void setTestHookBeforeEnqueue(std::function<void(cudaStream_t)> hook) {
    testHook_ = std::move(hook);
  }

 private:
  cudaEvent_t takeEvent();
  void giveEvent(void* event);
  // Watchdog hooks.
  bool pollAsyncError(anyrResult_t* code, std::string* msg);
  void expired(anyrResult_t code, const std::string& what);
  // Under the communicator's mutex: the live communicator, or throws why there is none.
  ncclComm_t liveLocked() const;
  std::string who() const { return "rank " + std::to_string(rank_) + ": "; }

  std::shared_ptr<NcclComm> comm_;
  bool released_ = false;  // under comm_->mutex(): this handle let go of the communicator
  int rank_ = -1;
  int device_ = -1;
  FailureSink onFailure_;
  std::unique_ptr<Watchdog> watchdog_;
  std::function<void(cudaStream_t)> testHook_;
  std::mutex poolMu_;
  std::vector<cudaEvent_t> pool_;    // free events
  std::vector<cudaEvent_t> events_;  // every event created, destroyed with the handle
};

// Throws anyrNcclError naming `what` when r is an error.
void checkNccl(ncclResult_t r, ncclComm_t comm, const char* what);

}  // namespace anyr
