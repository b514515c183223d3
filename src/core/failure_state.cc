// The failure state and the stop (core/failure_state.h; docs/RELIABILITY.md, section 3c).
#include "core/failure_state.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdio>
#include <cstring>

#include "base/log.h"
#include "base/names.h"
#include "core/context.h"
#include "core/host_transport.h"
#include "core/nccl_path.h"
#include "core/peer_workspace.h"

namespace anyr {

void FailureState::init() {
  ANYR_CUDA_CHECK(
      cudaHostAlloc(&hostMapped_, kHostMappedBytes, cudaHostAllocMapped | cudaHostAllocPortable));
  std::memset(hostMapped_, 0, kHostMappedBytes);
  hError_ = static_cast<ErrorRecord*>(hostMapped_);
  hAbort_ =
      reinterpret_cast<volatile int32_t*>(static_cast<char*>(hostMapped_) + sizeof(ErrorRecord));
  void* dMapped = nullptr;
  ANYR_CUDA_CHECK(cudaHostGetDevicePointer(&dMapped, hostMapped_, 0));
  dError_ = static_cast<ErrorRecord*>(dMapped);
  dAbort_ = reinterpret_cast<const int32_t*>(static_cast<char*>(dMapped) + sizeof(ErrorRecord));
}

void FailureState::freeHostMapped() {
  if (hostMapped_ != nullptr) (void)cudaFreeHost(hostMapped_);
  hostMapped_ = nullptr;
}

void FailureState::setFailed(anyrResult_t code, const std::string& msg) {
  std::lock_guard<std::mutex> lock(failMu_);
  if (failCode_.load() == anyrSuccess) {
    failMsg_ = msg;
    failCode_.store(code);
  }
}

anyrResult_t FailureState::asyncError(std::string* msg) {
  if (failCode_.load() == anyrSuccess && hError_ != nullptr) {
    int32_t code = *reinterpret_cast<volatile int32_t*>(&hError_->code);
    if (code != kFailNone) {
      const ErrorRecord e = *const_cast<const ErrorRecord*>(hError_);
      std::string where = std::string(waitWhatName(e.what)) + ", block " + std::to_string(e.block) +
                          ", call " + std::to_string(e.epoch);
      if (code == kFailTimeout) {
        setFailed(anyrTimeout, "rank " + std::to_string(ctx_.rank) + " timed out after " +
                                   std::to_string(ctx_.cfg.timeoutMs) + " ms waiting for rank " +
                                   std::to_string(e.waitedRank) + " (" + where + ")");
      } else if (code == kFailAborted) {
        setFailed(anyrAborted, "rank " + std::to_string(ctx_.rank) +
                                   " was aborted (anyrCommAbort) while "
                                   "waiting for rank " +
                                   std::to_string(e.waitedRank) + " (" + where + ")");
      } else {
        std::string failed = " failed";
        if (e.cause > 0) {
          failed += " (it timed out waiting for rank " + std::to_string(e.cause - 1) + ")";
        } else if (e.cause == kCauseRefused || e.cause == kCauseAborted) {
          if (e.cause == kCauseRefused) {
            const std::string note = stopNote();
            failed = " refused a call that this rank made";
            if (!note.empty()) failed += " (its " + note + ")";
          } else {
            failed = " was aborted or destroyed while this rank waited for it";
          }
        }
        setFailed(anyrRemoteError, "rank " + std::to_string(e.waitedRank) + failed +
                                       " and stopped the communicator (rank " +
                                       std::to_string(ctx_.rank) + " was waiting in " + where +
                                       ")");
      }
    }
  }
  if (failCode_.load() == anyrSuccess) {
    const ncclResult_t st = nccl_.asyncError();
    if (st != ncclSuccess && st != ncclInProgress) {
      setFailed(anyrNcclError, std::string("NCCL asynchronous error: ") + ncclGetErrorString(st));
    }
  }
  // Healthy (every call comes here): no lock and no copy. setFailed writes the message before
  // the code, so a code other than success always has its message.
  if (failCode_.load() == anyrSuccess) {
    if (msg != nullptr) msg->clear();
    return anyrSuccess;
  }
  std::lock_guard<std::mutex> lock(failMu_);
  if (msg != nullptr) *msg = failMsg_;
  return static_cast<anyrResult_t>(failCode_.load());
}

void FailureState::requireHealthy(bool& settled) {
  std::string msg;
  const anyrResult_t failed = asyncError(&msg);
  settled = failed != anyrSuccess;
  if (settled) throwError(failed, "communicator has failed: " + msg);
}

namespace {

// While it lives, this thread may make the calls a graph capture in progress on it would
// otherwise refuse, and be invalidated by (event and stream queries, copies on other streams):
// the stop runs on the communicator's own stream, outside any capture, even when the refused
// call was made while capturing.
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() { ok_ = cudaThreadExchangeStreamCaptureMode(&mode_) == cudaSuccess; }
  ~RelaxedCaptureMode() {
    if (ok_) (void)cudaThreadExchangeStreamCaptureMode(&mode_);
  }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
  bool ok_ = false;
};

// "argument 'NAME': ..." -> "NAME"; otherwise the message's first words (what a peer's error
// repeats about this rank's refusal: WorkspaceHeader::stopWhat holds 27 characters).
std::string refusedWhat(const std::string& msg) {
  const std::string tag = "argument '";
  const size_t a = msg.find(tag);
  if (a != std::string::npos) {
    const size_t b = msg.find('\'', a + tag.size());
    if (b != std::string::npos)
      return "argument '" + msg.substr(a + tag.size(), b - a - tag.size()) + "'";
  }
  return msg;
}

}  // namespace

void FailureState::refuse(const char* fn, const Error& e, bool holdingGuard) {
  const uint64_t call = callCount_ + (holdingGuard ? 0 : 1);
  const std::string msg =
      "rank " + std::to_string(ctx_.rank) + " refused its call #" + std::to_string(call) + " (" +
      fn + ": " + e.what() +
      "); its peers may have made that call, so the communicator is stopped on every rank (no "
      "later call can pair with theirs): destroy it and create a new one";
  ANYR_LOG(Warn, ctx_.rank,
           fn << " refused after its peers may have made it; stopping the communicator on "
                 "every rank: "
              << e.what());
  {
    std::lock_guard<std::mutex> lock(failMu_);
    pendingFailMsg_ = msg;
    stopWhat_ = refusedWhat(e.what());
  }
  stopPending_.store(true);
  // Another thread is inside a call that the peers have matched: it fails the communicator
  // once that call is launched (applyPendingStop at its end), not before.
  if (holdingGuard) applyPendingStop();
}

void FailureState::applyPendingStop() {
  if (!stopPending_.exchange(false)) return;
  std::string msg, what;
  {
    std::lock_guard<std::mutex> lock(failMu_);
    msg = pendingFailMsg_;
    what = stopWhat_;
  }
  setFailed(anyrInvalidUsage, msg);
  stopEverywhere(kCauseRefused, what, true);
  // On the caller's NCCL communicator (anyrCommInitFromNccl) the peers' matching call may be an
  // NCCL all-reduce, which nothing above reaches: were the application to make its next
  // collective on that communicator, it would pair with the peers' pending one. So it is stopped
  // here too, after this rank's own last call (stopEverywhere waited for it), and the failure
  // says so.
  const std::string done = nccl_.stopCallers(anyrInvalidUsage, msg);
  if (!done.empty()) {
    std::lock_guard<std::mutex> lock(failMu_);
    if (failMsg_ == msg) failMsg_ += done;
  }
}

void FailureState::stopEverywhere(int32_t cause, const std::string& what, bool afterOwnWork,
                                  bool tellPeers) {
  if (stopped_.exchange(true)) return;
  // Every copy is asynchronous from pinned memory on the communicator's own stream, in the
  // relaxed capture mode, so a graph the calling thread is capturing is left as it was; bounded
  // by the timeout as a whole: a copy that cannot complete is logged, not waited for.
  RelaxedCaptureMode relaxed;
  try {
    if (afterOwnWork && ctx_.haveLastWork &&
        !ctx_.eventDoneWithin(ctx_.lastWork, ctx_.cfg.timeoutMs)) {
      ANYR_LOG(Warn, ctx_.rank,
               "stopping: this rank's last call had not finished; stopping anyway");
    }
    StopStaging* stage = stopStaging();
    std::memset(stage, 0, sizeof(*stage));
    stage->one = 1;
    stage->cause = cause;
    stage->by = ctx_.rank + 1;
    stage->call = static_cast<uint32_t>(callCount_);
    std::snprintf(stage->what, sizeof(stage->what), "%s", what.c_str());
    for (LocalState* st : {workspace_.state(), host_.state()}) {
      if (st == nullptr) continue;
      ANYR_CUDA_CHECK(cudaMemcpyAsync(&st->failClaim, &stage->one, sizeof(stage->one),
                                      cudaMemcpyHostToDevice, ctx_.internalStream));
    }
    constexpr size_t kNoteOffset = offsetof(WorkspaceHeader, stopCall);
    constexpr size_t kNoteBytes =
        sizeof(WorkspaceHeader::stopCall) + sizeof(WorkspaceHeader::stopWhat);
    static_assert(offsetof(WorkspaceHeader, stopWhat) == kNoteOffset + sizeof(uint32_t),
                  "stopCall and stopWhat are adjacent");
    static_assert(offsetof(StopStaging, what) == offsetof(StopStaging, call) + sizeof(uint32_t) &&
                      sizeof(StopStaging::what) == sizeof(WorkspaceHeader::stopWhat),
                  "the staged note has the header's layout");
    // The peer workspaces: device memory mapped into this process (a copy engine writes them,
    // so spinning kernels do not hold it up). Note, then cause, then the word waits check.
    if (tellPeers && workspace_.mapped() && ctx_.nranks <= kMaxLocalRanks) {
      for (int p = 0; p < ctx_.nranks; ++p) {
        char* h = workspace_.args().peerWorkspace[p];
        if (p == ctx_.rank || h == nullptr) continue;
        h += workspace_.layout().headerOffset;
        ANYR_CUDA_CHECK(cudaMemcpyAsync(h + kNoteOffset, &stage->call, kNoteBytes,
                                        cudaMemcpyHostToDevice, ctx_.internalStream));
        ANYR_CUDA_CHECK(cudaMemcpyAsync(h + offsetof(WorkspaceHeader, abortCause), &stage->cause,
                                        sizeof(int32_t), cudaMemcpyHostToDevice,
                                        ctx_.internalStream));
        ANYR_CUDA_CHECK(cudaMemcpyAsync(h + offsetof(WorkspaceHeader, abortedBy), &stage->by,
                                        sizeof(int32_t), cudaMemcpyHostToDevice,
                                        ctx_.internalStream));
      }
    }
    // The host segment: this process's own mapping of it.
    if (tellPeers && host_.present()) {
      for (int p = 0; p < ctx_.nranks; ++p) {
        if (p == ctx_.rank) continue;
        char* h = host_.memory()->host() + static_cast<uint64_t>(p) * host_.layout().rankBytes +
                  host_.layout().headerOffset;
        std::memcpy(h + kNoteOffset, &stage->call, kNoteBytes);
        std::atomic_thread_fence(std::memory_order_seq_cst);
        *reinterpret_cast<volatile int32_t*>(h + offsetof(WorkspaceHeader, abortCause)) = cause;
        std::atomic_thread_fence(std::memory_order_seq_cst);
        *reinterpret_cast<volatile int32_t*>(h + offsetof(WorkspaceHeader, abortedBy)) =
            ctx_.rank + 1;
        std::atomic_thread_fence(std::memory_order_seq_cst);
      }
    }
    if (!ctx_.streamIdleWithin(ctx_.internalStream, ctx_.cfg.timeoutMs)) {
      ANYR_LOG(Warn, ctx_.rank,
               "stopping: telling the peers to stop did not finish within " << ctx_.cfg.timeoutMs
                                                                            << " ms");
    }
  } catch (const Error& e) {
    ANYR_LOG(Warn, ctx_.rank, "stopping the communicator on every rank: " << e.what());
  }
}

std::string FailureState::stopNote() {
  std::lock_guard<std::mutex> lock(stopNoteMu_);
  RelaxedCaptureMode relaxed;  // asyncError runs inside calls made while capturing
  WorkspaceHeader h{};
  bool have = false;
  if (host_.present()) {
    const char* mine = host_.memory()->host() +
                       static_cast<uint64_t>(ctx_.rank) * host_.layout().rankBytes +
                       host_.layout().headerOffset;
    std::memcpy(&h, mine, sizeof(h));
    have = h.stopWhat[0] != '\0';
  }
  if (!have && workspace_.mapped() && ctx_.nranks <= kMaxLocalRanks &&
      workspace_.args().peerWorkspace[ctx_.rank]) {
    // Into pinned memory, asynchronously: allowed while this thread captures a graph.
    WorkspaceHeader* pinned = &stopStaging()->readBack;
    if (cudaMemcpyAsync(
            pinned, workspace_.args().peerWorkspace[ctx_.rank] + workspace_.layout().headerOffset,
            sizeof(h), cudaMemcpyDeviceToHost, ctx_.internalStream) == cudaSuccess &&
        ctx_.streamIdleWithin(ctx_.internalStream, ctx_.cfg.timeoutMs)) {
      std::memcpy(&h, pinned, sizeof(h));
      have = h.stopWhat[0] != '\0';
    }
    (void)cudaGetLastError();
  }
  if (!have) return "";
  h.stopWhat[sizeof(h.stopWhat) - 1] = '\0';
  return "call #" + std::to_string(h.stopCall) + ": " + h.stopWhat;
}

void FailureState::throwIfFailed() {
  bool settled = false;
  requireHealthy(settled);
}

bool FailureState::stoppedByPeer() const {
  return hError_ != nullptr &&
         *reinterpret_cast<const volatile int32_t*>(&hError_->code) == kFailPeerAborted;
}

}  // namespace anyr
