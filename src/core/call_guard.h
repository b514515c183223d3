// Per-communicator call discipline (docs/RELIABILITY.md, "Concurrency" and "Validation mode"):
//
//  - Concurrency: one call at a time per communicator. A collective call entered while another
//    thread is inside one on the same communicator is refused with anyrInvalidUsage ("in use by
//    another thread"); it is not queued, because two threads issuing collectives on one
//    communicator cannot give every rank the same call order, and a wrong order hangs or
//    corrupts. anyrCommAbort, anyrCommGetAsyncError and the queries never take the guard.
//
//  - Validation mode (ANYR_VALIDATE_CALLS=1 on any rank; agreed at init): before launching,
//    every collective call exchanges its signature (call kind, count, datatype, op, fused shape,
//    and a per-communicator call number) and its local argument check result with every rank
//    through the bootstrap, bounded by the communicator's timeout. A rank whose arguments were
//    refused makes every rank fail the call (the others with anyrRemoteError naming it); a
//    signature that differs from rank 0's fails the call on every rank with anyrInvalidUsage
//    naming the ranks and both signatures. Nothing is launched in either case, so the
//    communicator stays usable. During CUDA-graph capture the comparison runs once, when the
//    call is captured (replays are not compared).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "anyreduce/anyreduce.h"
#include "base/error.h"

namespace anyr {

class Bootstrap;

enum class SignatureKind : uint32_t {
  kAllReduce = 1,
  kAllReduceAddRmsNorm = 2,
  kSetAlgorithm = 3,
};

// What every rank must agree on for one collective call. Fixed layout: crosses processes.
struct CallSignature {
  uint32_t kind = 0;    // SignatureKind
  int32_t dtype = -1;   // anyrDataType_t (-1: not applicable)
  int32_t op = -1;      // anyrRedOp_t (-1: not applicable)
  int32_t extra = -1;   // fused: anyrQuant_t; setAlgorithm: the algorithm
  uint64_t count = 0;   // elements (fused: tokens)
  uint64_t hidden = 0;  // fused: hidden size; else 0
  uint64_t seq = 0;     // call number on this communicator, from 1 (filled by CallGuard)

  static CallSignature allReduce(size_t count, anyrDataType_t dtype, anyrRedOp_t op);
  static CallSignature fused(size_t tokens, size_t hidden, anyrDataType_t dtype, int quant);
  static CallSignature setAlgorithm(anyrAlgo_t algo);
  bool operator==(const CallSignature& o) const;
  bool operator!=(const CallSignature& o) const { return !(*this == o); }
  // "call #7 anyrAllReduce(count=1024, datatype=bf16, op=sum)"
  std::string describe() const;
};
static_assert(sizeof(CallSignature) == 40, "CallSignature crosses processes: fixed layout");

// One rank's contribution to the exchange: its signature and its local argument check.
struct CallVote {
  CallSignature sig;
  int32_t code = anyrSuccess;  // anyrResult_t of the local argument check
  char reason[108] = {0};      // its message, truncated, NUL-terminated
};
static_assert(sizeof(CallVote) == 152, "CallVote crosses processes: fixed layout");

// Pure decision over every rank's vote (index = rank), the same on every rank: returns
// anyrSuccess, or the code and message every rank reports. A refused rank wins over a
// signature mismatch (the mismatch may be a consequence); mismatches are named against rank 0.
anyrResult_t judgeVotes(const std::vector<CallVote>& votes, int myRank, std::string* msg);

// Parses ANYR_VALIDATE_CALLS ("0" or "1"); throws anyrInvalidArgument otherwise.
bool validateCallsFromEnv();

class CallGuard {
 public:
  // Collective: agrees validation mode (on when any rank asked for it) through `bs`.
  void init(Bootstrap& bs, bool wantValidation);
  bool validating() const { return validating_; }

  // Holds the guard for one call; throws anyrInvalidUsage when another thread holds it. A
  // Scope taken by the thread that already holds the guard (the calls anyrCommTune makes
  // inside its own) holds nothing more and releases nothing.
  class Scope {
   public:
    Scope(CallGuard& g, const char* fn);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    CallGuard& g_;
    bool nested_ = false;
  };

  // While it lives, the holding thread runs the application's code (anyrCommTune's progress
  // callback): a Scope that thread takes meanwhile is refused with anyrInvalidUsage, not nested.
  // Nested, a destroy from the callback would free the communicator under the tuning, and a
  // collective would be made on this rank alone. Taken by the holder only; not nested itself.
  class CallbackScope {
   public:
    explicit CallbackScope(CallGuard& g) : g_(g) { g_.inCallback_.store(true); }
    ~CallbackScope() { g_.inCallback_.store(false); }
    CallbackScope(const CallbackScope&) = delete;
    CallbackScope& operator=(const CallbackScope&) = delete;

   private:
    CallGuard& g_;
  };

  // Runs the local argument check `check` (throws anyr::Error on bad arguments). Without
  // validation mode, that is all. With it, exchanges {sig, check result} with every rank and
  // throws judgeVotes' verdict; `settled` becomes true once every rank's vote is in, so that
  // the verdict (a refusal or a mismatch, the same on every rank, nothing launched anywhere)
  // needs no repair. It stays false when the local check refused without validation mode, or
  // when the exchange itself failed (a rank that never made the call: anyrTimeout naming it).
  // A template so the fast path (validation off) costs one branch: no std::function is made.
  template <typename Check>
  void checked(Bootstrap& bs, int rank, CallSignature sig, Check&& check, bool& settled) {
    if (!validating_) {
      check();
      return;
    }
    exchange(bs, rank, sig, check, settled);
  }

 private:
  void exchange(Bootstrap& bs, int rank, CallSignature sig, const std::function<void()>& check,
                bool& settled);

  std::mutex mu_;
  std::atomic<const char*> holder_{nullptr};
  std::atomic<std::thread::id> owner_{};  // the holding thread (default id: none)
  std::atomic<bool> inCallback_{false};   // the holder is in the application's callback
  bool validating_ = false;
  uint64_t seq_ = 0;
};

}  // namespace anyr
