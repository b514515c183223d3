// Per NCCL communicator: its anyreduce twin, set up at the first eligible ncclAllReduce, the
// all-reduces it serves, its teardown and its errors.
//
// Every rank must make the same choice at the same call: a rank that serves a call while a peer
// forwards it waits for that peer in an anyreduce kernel, and the peer in an NCCL kernel.
//  - Eligibility is decided from what the ranks of an SPMD program have alike: the call's
//    arguments (ncclSum; fp32, fp16 or bf16; count > 0), the communicator's size (2..8: larger
//    ones anyreduce sends to NCCL anyway), whether the call is inside ncclGroupStart/End and
//    whether its stream is capturing a CUDA graph (no setup then: it allocates, synchronizes and
//    runs collectives on its own streams). A program that groups or captures a call on one rank
//    and not on another is outside what is served.
//  - The twin is made over a child communicator (ncclCommSplit of the application's, with
//    blocking = 0 so that its creation is bounded by ANYR_TIMEOUT_MS), never over the
//    application's own: when a rank fails during anyrCommInitFromNccl, anyreduce stops the NCCL
//    communicator it was given (revoked, or aborted and freed with an NCCL older than 2.28.7);
//    the child is ours to lose, the application's communicator is left as it was.
//  - anyrCommInitFromNccl does not agree on its outcome: a rank can fail on its own (a CUDA
//    error) while its peers time out, and a peer can fail after the last exchange of a rank that
//    succeeded. So after it every rank votes on the application's communicator (one integer,
//    ncclAllReduce with ncclMin, on a private stream), which every rank reaches in bounded time
//    (each rank's setup steps are bounded): the twin serves only where every rank succeeded;
//    otherwise every rank discards its twin and the communicator forwards everything from then
//    on, after one log line.
//  - Local steps that could fail on one rank alone (loading libanyreduce, CUDA queries, the
//    vote's buffers) come before the first collective step: a rank that fails there forwards,
//    and so do its peers, which fail the same way in any realistic case (the same installation
//    on every rank, or a GPU this rank cannot use, where its NCCL fails too).
//  - Which all-reduces the twin serves is its own agreed choice (anyrCommQueryAlgorithm, a pure
//    function of the facts agreed at init): the sizes it would give to NCCL are forwarded here.
//  - Once the twin failed mid-job, no rank can tell where its peers stopped: the all-reduces it
//    would have served fail with its error from then on, and ncclCommGetAsyncError reports it,
//    as NCCL does after an asynchronous error; the application aborts the communicator.
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "anyreduce_lib.h"
#include "shim.h"

namespace anyrn {

namespace {

constexpr int kMinRanks = 2;
constexpr int kMaxRanks = 8;  // anyreduce's peer and host-memory algorithms: 2..8 ranks

enum class State {
  kUnset,    // not decided yet (no eligible call outside a group and a capture so far)
  kServing,  // the twin serves the eligible calls it chooses
  kForward,  // everything is forwarded (refused, set up and discarded, or ending)
  kFailed,   // the twin failed mid-job: the calls it would serve fail with `message`
};

struct Record {
  std::mutex mu;                    // held by the setup, a served call and the teardown
  std::atomic<bool> ending{false};  // an abort or revoke waits: a setup in progress gives up
  State state = State::kUnset;
  anyrComm_t twin = nullptr;
  ncclComm_t child = nullptr;  // the communicator the twin was made over
  int rank = -1;
  int nranks = 0;
  int device = -1;
  ncclResult_t code = ncclSuccess;  // kFailed
  std::string message;              // kFailed
};

// A child communicator of ours. seen: libanyreduce's NCCL calls on it come through this
// library (so its abort of the child would be seen); freed: anyreduce aborted it (freed).
struct Child {
  bool seen = false;
  bool freed = false;
};

// The communicators' records and our children. Never destroyed: a thread of the application
// (a watchdog polling ncclCommGetAsyncError) may still call in while the process exits.
struct Registry {
  std::mutex mu;  // never held across a call out
  std::unordered_map<ncclComm_t, std::shared_ptr<Record>> records;
  std::unordered_map<ncclComm_t, Child> children;
};
Registry& registry() {
  static Registry* r = new Registry();
  return *r;
}

thread_local int tGroupDepth = 0;

// ANYR_NCCL_SERVE: 1 (default) serves, 0 forwards everything; anything else is reported once
// and forwards everything (a switch meant to turn serving off must not turn it on by a typo).
bool serveEnabled() {
  static const bool on = [] {
    const char* v = std::getenv("ANYR_NCCL_SERVE");
    const std::string s = v != nullptr ? v : "";
    if (s.empty() || s == "1") return true;
    if (s != "0") {
      logLine(Level::kWarn, "ANYR_NCCL_SERVE=" + s +
                                " is neither 0 nor 1: serving is off, every call is forwarded");
    }
    return false;
  }();
  return on;
}

// Bound on the child communicator's creation: ANYR_TIMEOUT_MS (anyreduce's own bound on every
// wait; anyrCommInitFromNccl validates it), default 30000 ms.
int timeoutMs() {
  static const int ms = [] {
    const char* v = std::getenv("ANYR_TIMEOUT_MS");
    if (v == nullptr || *v == '\0') return 30000;
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    return end != nullptr && *end == '\0' && n >= 1 && n <= 86400000 ? static_cast<int>(n) : 30000;
  }();
  return ms;
}

bool anyrTypeOf(ncclDataType_t t, anyrDataType_t* out) {
  switch (t) {
    case ncclFloat32:
      *out = anyrFloat32;
      return true;
    case ncclFloat16:
      *out = anyrFloat16;
      return true;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
    case ncclBfloat16:
      *out = anyrBfloat16;
      return true;
#endif
    default:
      return false;
  }
}

ncclResult_t ncclResultOf(anyrResult_t r) {
  switch (r) {
    case anyrSuccess:
      return ncclSuccess;
    case anyrCudaError:
      return ncclUnhandledCudaError;
    case anyrSystemError:
      return ncclSystemError;
    case anyrInvalidArgument:
      return ncclInvalidArgument;
    case anyrInvalidUsage:
    case anyrAborted:
    case anyrUnsupported:
      return ncclInvalidUsage;
    case anyrRemoteError:
    case anyrTimeout:  // a peer did not arrive
      return ncclRemoteError;
    default:  // anyrInternalError, anyrNcclError
      return ncclInternalError;
  }
}

std::string realErrorString(ncclResult_t r) {
  auto fn = realFn<decltype(&::ncclGetErrorString)>(kSlot_ncclGetErrorString);
  const char* s = fn != nullptr ? fn(r) : nullptr;
  return s != nullptr ? s : "NCCL error " + std::to_string(static_cast<int>(r));
}

// "<error string> (<NCCL's last error>)"
std::string ncclFailure(ncclResult_t r, ncclComm_t comm) {
  std::string msg = realErrorString(r);
#ifdef ANYRN_HAS_ncclGetLastError
  auto last = realFn<decltype(&::ncclGetLastError)>(kSlot_ncclGetLastError);
  const char* s = last != nullptr ? last(comm) : nullptr;
  if (s != nullptr && *s != '\0') msg += std::string(" (") + s + ")";
#endif
  return msg;
}

std::string anyrFailure(anyrComm_t twin, anyrResult_t r) {
  const Anyreduce& a = anyreduce();
  const char* last = a.anyrGetLastError(twin);
  if (last != nullptr && *last != '\0') return last;
  const char* s = a.anyrGetErrorString(r);
  return s != nullptr ? s : "anyreduce error " + std::to_string(static_cast<int>(r));
}

std::string who(const Record& rec) {
  return "rank " + std::to_string(rec.rank) + " of " + std::to_string(rec.nranks) + ": ";
}

// The record of an application communicator (created at the first eligible call); NULL for a
// child of ours, whose calls are anyreduce's own and are forwarded as they are.
std::shared_ptr<Record> recordFor(ncclComm_t comm) {
  std::lock_guard<std::mutex> lock(registry().mu);
  if (registry().children.count(comm) != 0) return nullptr;
  std::shared_ptr<Record>& rec = registry().records[comm];
  if (!rec) rec = std::make_shared<Record>();
  return rec;
}

std::shared_ptr<Record> findRecord(ncclComm_t comm) {
  std::lock_guard<std::mutex> lock(registry().mu);
  auto it = registry().records.find(comm);
  return it == registry().records.end() ? nullptr : it->second;
}

// True for a child of ours; a call on it is anyreduce's, which makes the child "seen".
bool isChild(ncclComm_t comm) {
  std::lock_guard<std::mutex> lock(registry().mu);
  auto it = registry().children.find(comm);
  if (it == registry().children.end()) return false;
  it->second.seen = true;
  return true;
}

bool realHasRevoke() {
#ifdef ANYRN_HAS_ncclCommRevoke
  return realFn<void*>(kSlot_ncclCommRevoke) != nullptr;
#else
  return false;
#endif
}

// Ends a child communicator of ours: aborted (local and bounded; nothing of ours is in flight
// on it once its twin is gone). `mayBeStopped`: its twin failed, so anyreduce may have stopped
// it; where that would have freed it (no ncclCommRevoke) and libanyreduce's calls did not come
// through this library (so an abort of it would not have been seen), it is left alone: a leak
// rather than a second free.
void releaseChild(ncclComm_t child, bool mayBeStopped) {
  if (child == nullptr) return;
  Child info;
  {
    std::lock_guard<std::mutex> lock(registry().mu);
    auto it = registry().children.find(child);
    if (it != registry().children.end()) {
      info = it->second;
      registry().children.erase(it);
    }
  }
  if (info.freed) return;
  if (mayBeStopped && !info.seen && !realHasRevoke()) {
    logLine(Level::kInfo, "a child communicator anyreduce may have freed is left as it is");
    return;
  }
  (void)ANYRN_REAL(ncclCommAbort, child);
}

// A twin that will not serve: released on this rank alone (abort, then destroy: no peer barrier).
void discard(anyrComm_t twin, ncclComm_t child, bool mayBeStopped) {
  const Anyreduce& a = anyreduce();
  if (twin != nullptr) {
    (void)a.anyrCommAbort(twin);
    (void)a.anyrCommDestroy(twin);
  }
  releaseChild(child, mayBeStopped);
}

// The memory of the setup votes: one int per vote on the device and in pinned host memory, from
// blocks kept for the life of the process (cudaFree and cudaFreeHost could wait for the device,
// behind the application's work). Slots are handed round; a slot is reused only after
// kSlots later votes, long after its own vote ended.
class VoteMemory {
 public:
  static constexpr unsigned kSlots = 1024;

  // A slot on `device` (current): its device and host ints, or why there is none.
  std::string take(int device, int** dev, volatile int** host) {
    const Anyreduce& a = anyreduce();
    std::lock_guard<std::mutex> lock(mu_);
    if (host_ == nullptr) {
      void* p = nullptr;
      const cudaError_t e = a.cudaHostAlloc(&p, kSlots * sizeof(int), cudaHostAllocPortable);
      if (e != cudaSuccess) return cudaFailure("cudaHostAlloc", e);
      host_ = static_cast<int*>(p);
    }
    int*& block = device_[device];
    if (block == nullptr) {
      void* p = nullptr;
      const cudaError_t e = a.cudaMalloc(&p, kSlots * sizeof(int));
      if (e != cudaSuccess) return cudaFailure("cudaMalloc", e);
      block = static_cast<int*>(p);
    }
    const unsigned i = next_++ % kSlots;
    *dev = block + i;
    *host = host_ + i;
    return "";
  }

 private:
  std::mutex mu_;
  int* host_ = nullptr;
  std::unordered_map<int, int*> device_;
  unsigned next_ = 0;
};

VoteMemory& voteMemory() {
  static VoteMemory* m = new VoteMemory();  // never destroyed: used until the process ends
  return *m;
}

// What one rank's vote needs, made before any collective step.
struct VoteKit {
  cudaStream_t stream = nullptr;
  int* dev = nullptr;
  volatile int* host = nullptr;

  std::string prepare(int device) {
    const Anyreduce& a = anyreduce();
    const cudaError_t e = a.cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
      stream = nullptr;
      return cudaFailure("cudaStreamCreateWithFlags", e);
    }
    return voteMemory().take(device, &dev, &host);
  }
  ~VoteKit() {
    if (stream != nullptr) (void)anyreduce().cudaStreamDestroy(stream);
  }
};

// Every rank's `ok`, combined (ncclMin) over the application's communicator. False, with *why,
// when the vote could not complete: the communicator failed (NCCL reports that itself) or is
// being aborted. Waits for the peers without a bound, as the application's own next collective
// would: every rank reaches its vote in bounded time.
bool vote(Record& rec, ncclComm_t comm, VoteKit& kit, bool ok, bool* all, std::string* why) {
  const Anyreduce& a = anyreduce();
  cudaError_t e = a.cudaMemsetAsync(kit.dev, ok ? 1 : 0, sizeof(int), kit.stream);
  if (e != cudaSuccess) {
    *why = cudaFailure("cudaMemsetAsync", e);
    return false;
  }
  const ncclResult_t r =
      ANYRN_REAL(ncclAllReduce, kit.dev, kit.dev, 1, ncclInt32, ncclMin, comm, kit.stream);
  if (r != ncclSuccess && r != ncclInProgress) {
    *why = "the vote (ncclAllReduce) failed: " + ncclFailure(r, comm);
    return false;
  }
  bool copied = false;
  const auto start = std::chrono::steady_clock::now();
  bool warned = false;
  for (;;) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t q = ANYRN_REAL(ncclCommGetAsyncError, comm, &state);
    if (q != ncclSuccess) state = q;
    if (state != ncclSuccess && state != ncclInProgress) {
      *why = "the communicator failed during the vote: " + ncclFailure(state, comm);
      return false;
    }
    if (state == ncclSuccess && !copied) {  // the all-reduce is enqueued (non-blocking NCCL)
      e = a.cudaMemcpyAsync(const_cast<int*>(kit.host), kit.dev, sizeof(int),
                            cudaMemcpyDeviceToHost, kit.stream);
      if (e != cudaSuccess) {
        *why = cudaFailure("cudaMemcpyAsync", e);
        return false;
      }
      copied = true;
    }
    if (copied) {
      e = a.cudaStreamQuery(kit.stream);
      if (e == cudaSuccess) break;
      if (e != cudaErrorNotReady) {
        *why = cudaFailure("cudaStreamQuery", e);
        return false;
      }
    }
    if (rec.ending.load()) {
      *why = "the communicator is being aborted";
      return false;
    }
    const auto waited = std::chrono::steady_clock::now() - start;
    if (!warned && waited > std::chrono::milliseconds(timeoutMs())) {
      logLine(Level::kWarn, who(rec) +
                                "still waiting for the other ranks' vote on the twin after " +
                                std::to_string(timeoutMs()) +
                                " ms (a rank that never makes this ncclAllReduce holds every "
                                "rank here, as it would hold NCCL)");
      warned = true;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  *all = *kit.host != 0;
  return true;
}

// The child communicator (every rank, color 0, key = rank: the same ranks in the same order),
// ready; NULL with *why when it could not be made within timeoutMs().
ncclComm_t makeChild(Record& rec, ncclComm_t comm, std::string* why) {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclComm_t child = nullptr;
  const ncclResult_t r = ANYRN_REAL(ncclCommSplit, comm, 0, rec.rank, &child, &cfg);
  if (r != ncclSuccess && r != ncclInProgress) {
    *why = "ncclCommSplit failed: " + ncclFailure(r, comm);
    if (child != nullptr) (void)ANYRN_REAL(ncclCommAbort, child);
    return nullptr;
  }
  if (child == nullptr) {
    *why = "ncclCommSplit gave no communicator";
    return nullptr;
  }
  {
    std::lock_guard<std::mutex> lock(registry().mu);
    registry().children[child] = Child();
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs());
  for (;;) {
    ncclResult_t state = ncclInProgress;
    const ncclResult_t q = ANYRN_REAL(ncclCommGetAsyncError, child, &state);
    if (q != ncclSuccess) state = q;
    if (state == ncclSuccess) return child;
    if (state != ncclInProgress) {
      *why = "the child communicator (ncclCommSplit) failed: " + ncclFailure(state, child);
      break;
    }
    if (rec.ending.load()) {
      *why = "the communicator is being aborted";
      break;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      *why = "the child communicator (ncclCommSplit) was not ready within " +
             std::to_string(timeoutMs()) + " ms (ANYR_TIMEOUT_MS)";
      break;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  releaseChild(child, false);
  return nullptr;
}

// Refusals that hold for the whole process are logged once; the communicator forwards.
void refuseForProcess(Record& rec, const std::string& why) {
  static std::once_flag once;
  std::call_once(once, [&] {
    logLine(Level::kWarn,
            "ncclAllReduce is not served in this process (every NCCL call is "
            "forwarded): " +
                why);
  });
  rec.state = State::kForward;
}

// A refusal of this communicator: one log line, then it forwards forever.
void refuse(Record& rec, const std::string& why) {
  logLine(Level::kWarn, who(rec) +
                            "ncclAllReduce is not served on this communicator (every "
                            "call on it is forwarded): " +
                            why);
  rec.state = State::kForward;
}

// Decides the communicator at its first eligible call outside a group: sets rec.state, unless
// the stream is capturing (returns false: asked again at a later call).
bool setUp(Record& rec, ncclComm_t comm, cudaStream_t stream) {
  const Anyreduce& a = anyreduce();
  if (!a.error.empty()) {
    refuseForProcess(rec, a.error);
    return true;
  }
  int nranks = 0;
  int rank = -1;
  int device = -1;
  ncclResult_t r = ANYRN_REAL(ncclCommCount, comm, &nranks);
  if (r == ncclSuccess) r = ANYRN_REAL(ncclCommUserRank, comm, &rank);
  if (r == ncclSuccess) r = ANYRN_REAL(ncclCommCuDevice, comm, &device);
  if (r != ncclSuccess) {
    refuse(rec, "querying the communicator failed: " + ncclFailure(r, comm));
    return true;
  }
  rec.rank = rank;
  rec.nranks = nranks;
  rec.device = device;
  if (nranks < kMinRanks || nranks > kMaxRanks) {
    logLine(Level::kInfo, who(rec) + "not served: anyreduce serves communicators of " +
                              std::to_string(kMinRanks) + ".." + std::to_string(kMaxRanks) +
                              " ranks");
    rec.state = State::kForward;
    return true;
  }
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  const cudaError_t e = a.cudaStreamIsCapturing(stream, &capture);
  if (e != cudaSuccess) {
    refuse(rec, cudaFailure("cudaStreamIsCapturing", e));
    return true;
  }
  if (capture != cudaStreamCaptureStatusNone) return false;
  DeviceGuard guard(device);
  if (guard.status() != cudaSuccess) {
    refuse(rec, cudaFailure("cudaSetDevice", guard.status()));
    return true;
  }
  VoteKit kit;
  const std::string noKit = kit.prepare(device);
  if (!noKit.empty()) {
    refuse(rec, noKit);
    return true;
  }
  // From here every rank takes the same collective steps, whatever happens on it.
  std::string reason;  // why this rank cannot serve ("" when it can)
  ncclComm_t child = makeChild(rec, comm, &reason);
  anyrComm_t twin = nullptr;
  if (child != nullptr) {
    const anyrConfig_t cfg = ANYR_CONFIG_INITIALIZER;
    const anyrResult_t ar = a.anyrCommInitFromNccl(&twin, child, &cfg);
    if (ar != anyrSuccess) {
      reason = "anyrCommInitFromNccl failed: " + anyrFailure(nullptr, ar);
      twin = nullptr;
    }
  }
  bool all = false;
  std::string voteWhy;
  const bool voted = vote(rec, comm, kit, reason.empty(), &all, &voteWhy);
  if (voted && all) {
    rec.twin = twin;
    rec.child = child;
    rec.state = State::kServing;
    logLine(Level::kInfo, who(rec) + "ncclAllReduce is served by anyreduce on this communicator");
    return true;
  }
  discard(twin, child, !reason.empty());
  if (!voted) {
    refuse(rec, voteWhy + (reason.empty() ? "" : " (and this rank: " + reason + ")"));
  } else {
    refuse(rec, reason.empty() ? "another rank could not set up its twin" : reason);
  }
  return true;
}

// The twin failed: from now on the calls it would serve fail with its error.
void fail(Record& rec, anyrResult_t r, const std::string& what) {
  rec.state = State::kFailed;
  rec.code = ncclResultOf(r);
  rec.message = who(rec) + what + ": " + anyrFailure(rec.twin, r);
  logLine(Level::kWarn, rec.message +
                            "; the all-reduces it served fail from now on, and "
                            "ncclCommGetAsyncError reports it: abort the communicator");
}

ncclResult_t forwardAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                              ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                              cudaStream_t stream) {
  const ncclResult_t r =
      ANYRN_REAL(ncclAllReduce, sendbuff, recvbuff, count, datatype, op, comm, stream);
  noteResult(r);
  return r;
}

}  // namespace

ncclResult_t allReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                       ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream, const void* caller) {
  anyrDataType_t type = anyrFloat32;
  if (!serveEnabled() || tGroupDepth > 0 || op != ncclSum || count == 0 || comm == nullptr ||
      !anyrTypeOf(datatype, &type) || realNccl().handle == nullptr || fromAnyreduce(caller)) {
    return forwardAllReduce(sendbuff, recvbuff, count, datatype, op, comm, stream);
  }
  std::shared_ptr<Record> rec = recordFor(comm);
  if (!rec) return forwardAllReduce(sendbuff, recvbuff, count, datatype, op, comm, stream);
  std::unique_lock<std::mutex> lock(rec->mu);
  if (rec->state == State::kUnset && !setUp(*rec, comm, stream)) {
    lock.unlock();  // capturing: decided at a later call
    return forwardAllReduce(sendbuff, recvbuff, count, datatype, op, comm, stream);
  }
  if (rec->state == State::kFailed) {
    setOurError(rec->message);
    return rec->code;
  }
  if (rec->state != State::kServing) {
    lock.unlock();
    return forwardAllReduce(sendbuff, recvbuff, count, datatype, op, comm, stream);
  }
  const Anyreduce& a = anyreduce();
  anyrAlgo_t algo = anyrAlgoAuto;
  anyrResult_t r = a.anyrCommQueryAlgorithm(rec->twin, count, type, &algo);
  if (r != anyrSuccess) {
    fail(*rec, r, "anyrCommQueryAlgorithm failed");
  } else if (algo == anyrAlgoNccl) {
    lock.unlock();  // the twin would hand it to NCCL: so do we, on the application's communicator
    return forwardAllReduce(sendbuff, recvbuff, count, datatype, op, comm, stream);
  } else {
    DeviceGuard guard(rec->device);
    r = guard.status() != cudaSuccess
            ? anyrCudaError
            : a.anyrAllReduce(sendbuff, recvbuff, count, type, anyrSum, rec->twin, stream);
    if (r == anyrSuccess) return ncclSuccess;
    fail(*rec, r, "anyrAllReduce failed");
  }
  setOurError(rec->message);
  return rec->code;
}

ncclResult_t groupStart() {
  ++tGroupDepth;
  const ncclResult_t r = ANYRN_REAL(ncclGroupStart);
  if (r != ncclSuccess && r != ncclInProgress) --tGroupDepth;
  noteResult(r);
  return r;
}

ncclResult_t groupEnd() {
  const ncclResult_t r = ANYRN_REAL(ncclGroupEnd);
  if (tGroupDepth > 0) --tGroupDepth;
  noteResult(r);
  return r;
}

ncclResult_t endComm(ncclComm_t comm, Ending how, int revokeFlags) {
  auto forward = [&]() -> ncclResult_t {
    switch (how) {
      case Ending::kFinalize:
#ifdef ANYRN_HAS_ncclCommFinalize
        return ANYRN_REAL(ncclCommFinalize, comm);
#else
        return ncclInvalidUsage;
#endif
      case Ending::kDestroy:
        return ANYRN_REAL(ncclCommDestroy, comm);
      case Ending::kAbort:
        return ANYRN_REAL(ncclCommAbort, comm);
      case Ending::kRevoke:
#ifdef ANYRN_HAS_ncclCommRevoke
        return ANYRN_REAL(ncclCommRevoke, comm, revokeFlags);
#else
        return ncclInvalidUsage;
#endif
    }
    return ncclInvalidUsage;
  };
  if (comm != nullptr && isChild(comm)) {
    // anyreduce stopping the child it was given (NcclComm::stop).
    ncclResult_t r = ncclSuccess;
    if (how == Ending::kRevoke && !realHasRevoke()) {
      // libanyreduce found ncclCommRevoke here, the real NCCL has none: abort the child instead,
      // which anyreduce, having revoked it as it believes, never touches again.
      (void)ANYRN_REAL(ncclCommAbort, comm);
      how = Ending::kAbort;
    } else {
      r = forward();
      noteResult(r);
    }
    if (how == Ending::kDestroy || how == Ending::kAbort) {
      std::lock_guard<std::mutex> lock(registry().mu);
      auto it = registry().children.find(comm);
      if (it != registry().children.end()) it->second.freed = true;
    }
    return r;
  }
  if (std::shared_ptr<Record> rec = comm != nullptr ? findRecord(comm) : nullptr) {
    if (how == Ending::kAbort || how == Ending::kRevoke) rec->ending.store(true);
    std::lock_guard<std::mutex> lock(rec->mu);
    if (rec->twin != nullptr) {
      const Anyreduce& a = anyreduce();
      const bool failed = rec->state == State::kFailed;
      if (how == Ending::kAbort || how == Ending::kRevoke || failed) {
        (void)a.anyrCommAbort(rec->twin);
      }
      if (how != Ending::kRevoke) {  // a revoked communicator still gets destroyed or aborted
        const anyrResult_t r = a.anyrCommDestroy(rec->twin);
        if (r != anyrSuccess && !failed && how != Ending::kAbort) {
          logLine(Level::kWarn, who(*rec) + "destroying the twin: " + anyrFailure(nullptr, r));
        }
        rec->twin = nullptr;
        releaseChild(rec->child, failed || how == Ending::kAbort || r != anyrSuccess);
        rec->child = nullptr;
      }
    }
    rec->state = State::kForward;
    if (how == Ending::kDestroy || how == Ending::kAbort) {
      // Forgotten before NCCL frees it: a communicator NCCL later places at the same address
      // starts afresh.
      std::lock_guard<std::mutex> mapLock(registry().mu);
      auto it = registry().records.find(comm);
      if (it != registry().records.end() && it->second == rec) registry().records.erase(it);
    }
  }
  const ncclResult_t r = forward();
  noteResult(r);
  return r;
}

ncclResult_t commGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError, const void* caller) {
  const ncclResult_t r = ANYRN_REAL(ncclCommGetAsyncError, comm, asyncError);
  noteResult(r);
  if (r != ncclSuccess || asyncError == nullptr || *asyncError != ncclSuccess) return r;
  if (comm == nullptr || isChild(comm) || fromAnyreduce(caller)) return r;
  std::shared_ptr<Record> rec = findRecord(comm);
  if (!rec) return r;
  // Never waits: a setup or teardown holding the record is asked again at the next poll.
  std::unique_lock<std::mutex> lock(rec->mu, std::try_to_lock);
  if (!lock.owns_lock()) return r;
  if (rec->state == State::kServing && rec->twin != nullptr) {
    anyrResult_t err = anyrSuccess;
    const anyrResult_t q = anyreduce().anyrCommGetAsyncError(rec->twin, &err);
    if (q != anyrSuccess) err = q;
    if (err != anyrSuccess) fail(*rec, err, "the twin's device work failed");
  }
  if (rec->state == State::kFailed) {
    *asyncError = rec->code;
    setOurError(rec->message);
  }
  return r;
}

const char* getLastError(ncclComm_t comm, const void* caller) {
  if ((comm == nullptr || !isChild(comm)) && !fromAnyreduce(caller)) {
    if (const char* ours = ourError()) return ours;
  }
#ifdef ANYRN_HAS_ncclGetLastError
  auto fn = realFn<decltype(&::ncclGetLastError)>(kSlot_ncclGetLastError);
  if (fn == nullptr) return missing<const char*>("ncclGetLastError");
  return fn(comm);
#else
  return "";
#endif
}

anyrResult_t commGetTwin(void* comm, anyrComm_t* twin) {
  if (twin == nullptr) return anyrInvalidArgument;
  *twin = nullptr;
  std::shared_ptr<Record> rec = findRecord(static_cast<ncclComm_t>(comm));
  if (!rec) return anyrSuccess;
  std::lock_guard<std::mutex> lock(rec->mu);
  if (rec->state == State::kServing) *twin = rec->twin;
  return anyrSuccess;
}

}  // namespace anyrn
