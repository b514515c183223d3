// The communicator's failure state and the stop that makes a refusal safe (docs/RELIABILITY.md,
// section 3c): the first failure (code and message) every later call returns, the host-mapped
// error record and abort word its kernels share, the collective calls' count, and the stop that
// fails the communicator on every rank when this rank refuses a call its peers may have made.
// Behaviour is the trust machinery's: every step here runs in the order the section describes.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

#include "anyreduce/anyreduce.h"
#include "base/error.h"
#include "device/handles.h"

namespace anyr {

struct CommContext;
class PeerWorkspace;
class HostTransport;
class NcclPath;

class FailureState {
 public:
  // The parts whose state a stop writes (the transports' headers and fail claims) and whose
  // failure counts (NCCL's asynchronous error). Nothing is used before init().
  FailureState(CommContext& ctx, const PeerWorkspace& workspace, const HostTransport& host,
               NcclPath& nccl)
      : ctx_(ctx), workspace_(workspace), host_(host), nccl_(nccl) {}
  FailureState(const FailureState&) = delete;
  FailureState& operator=(const FailureState&) = delete;

  // Host-mapped failure record and abort word: kernels write/read them without any host
  // synchronization; the host reads them on every call.
  void init();
  void freeHostMapped();  // at the communicator's destruction

  // The first failure wins; later ones are dropped.
  void setFailed(anyrResult_t code, const std::string& msg);
  bool failed() const { return failCode_.load() != anyrSuccess; }
  // anyrSuccess, or the failure recorded by device waits / abort; *msg receives the text.
  anyrResult_t asyncError(std::string* msg);
  // In every collective call after its argument check (arguments are judged first, also on a
  // failed communicator): throws the communicator's failure, which is `settled` (nothing new
  // to repair); else clears `settled`, since from here on a failure is this rank's alone.
  void requireHealthy(bool& settled);
  void throwIfFailed();  // requireHealthy without the settled flag
  // Whether this rank failed because a peer told it to stop (its ErrorRecord says so): such a
  // rank does not tell the peers again at abort or destroy.
  bool stoppedByPeer() const;
  // Sets the abort word every kernel of this rank checks (anyrCommAbort, a destroy after a
  // failure).
  void raiseAbort() {
    if (hAbort_ != nullptr) *hAbort_ = 1;
  }

  // Refusals (Communicator::collectiveCall). The call count: collective calls entered on this
  // rank since init (the number a refusal names).
  void noteCallEntered() { ++callCount_; }
  void resetCallCount() { callCount_ = 0; }  // the application's calls are numbered from 1
  void refuse(const char* fn, const Error& e, bool holdingGuard);
  // A refusal by a thread that found another inside a call is applied (the communicator failed,
  // the kernels and the peers stopped) when the holder's call is launched, or at the next
  // call's entry, so the holder's own call, which the peers have matched, is neither refused nor
  // cut short.
  void applyPendingStop();
  // Sets this rank's failClaim in each transport's state (its kernels that start afterwards
  // make nothing visible to a peer: dev::stopRequested) and writes {stopCall, stopWhat, abortCause
  // = cause, abortedBy = this rank} into every peer's headers, so that their waits stop.
  // Waits for this rank's last eager work first when `afterOwnWork` (bounded by the timeout);
  // without `tellPeers`, stops this rank's kernels only. Best effort and bounded: failures are
  // logged.
  void stopEverywhere(int32_t cause, const std::string& what, bool afterOwnWork,
                      bool tellPeers = true);

  // What the transports' wait controls point at (device addresses of the mapped record).
  ErrorRecord* deviceError() const { return dError_; }
  const int32_t* deviceAbort() const { return dAbort_; }
  ErrorRecord* hostError() const { return hError_; }  // the self-test reads and clears it

 private:
  // What a peer that stopped this rank from its host wrote in this rank's headers:
  // "call #N: WHAT", or empty.
  std::string stopNote();

  CommContext& ctx_;
  const PeerWorkspace& workspace_;
  const HostTransport& host_;
  NcclPath& nccl_;

  std::mutex failMu_;
  std::atomic<int> failCode_{anyrSuccess};
  std::string failMsg_;

  uint64_t callCount_ = 0;
  std::atomic<bool> stopPending_{false};
  std::atomic<bool> stopped_{false};  // stopEverywhere ran (it runs once)
  std::string stopWhat_;              // under failMu_: what to write in the peers' headers
  std::string pendingFailMsg_;        // under failMu_: the refusal's message, until applied
  std::mutex stopNoteMu_;             // stopNote's use of the pinned read-back staging

  void* hostMapped_ = nullptr;  // ErrorRecord followed by the abort word
  ErrorRecord* hError_ = nullptr;
  volatile int32_t* hAbort_ = nullptr;
  ErrorRecord* dError_ = nullptr;
  const int32_t* dAbort_ = nullptr;
  // Pinned staging of stopEverywhere's copies and stopNote's read-back, in hostMapped_ after
  // the ErrorRecord and the abort word (asynchronous copies need a pinned source).
  struct StopStaging {
    int32_t one;
    int32_t cause;
    int32_t by;
    uint32_t call;
    char what[28];
    int32_t pad[7];
    WorkspaceHeader readBack;
  };
  static constexpr size_t kStopStagingOffset = 64;
  static constexpr size_t kHostMappedBytes = kStopStagingOffset + sizeof(StopStaging);
  StopStaging* stopStaging() {
    return reinterpret_cast<StopStaging*>(static_cast<char*>(hostMapped_) + kStopStagingOffset);
  }
};

}  // namespace anyr
