// Helpers of the GPU tests that make NCCL communicators of their own (test_nccl_bootstrap.cc,
// test_nccl_watchdog.cc): an NCCL unique id passed from rank 0 to the other forked ranks
// through shared memory mapped before the fork, a flag between them, and communicator
// creation with a bounded wait.
#pragma once

#include <nccl.h>
#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "gpu/gpu_test_util.h"

namespace anyr {
namespace nccltest {

#define R_NCCL(expr)                                                                            \
  do {                                                                                          \
    ncclResult_t n_ = (expr);                                                                   \
    if (n_ != ncclSuccess) throw RankError(std::string(#expr) + ": " + ncclGetErrorString(n_)); \
  } while (0)

using Clock = std::chrono::steady_clock;

inline bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

inline double secondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Shared {
  std::atomic<int> flag;     // test-specific signal between ranks
  std::atomic<int> idRound;  // NCCL unique ids published by rank 0
  ncclUniqueId id;
};

// Mapped at the first call: the test body calls resetShared() before forking the ranks.
inline Shared* sharedArea() {
  static Shared* s = [] {
    void* p =
        mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? nullptr : static_cast<Shared*>(p);
  }();
  return s;
}

inline void resetShared() {
  Shared* s = sharedArea();
  ASSERT_NE(s, nullptr) << "mmap failed";
  s->flag.store(0);
  s->idRound.store(0);
  std::memset(&s->id, 0, sizeof(s->id));
}

// Waits (bounded) until the flag reaches `value`; false on expiry.
inline bool waitFlag(int value, int seconds) {
  const auto until = Clock::now() + std::chrono::seconds(seconds);
  while (sharedArea()->flag.load() < value) {
    if (Clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// Waits (bounded) until a non-blocking NCCL communicator leaves ncclInProgress.
inline void settleNccl(ncclComm_t c, const char* what) {
  const auto until = Clock::now() + std::chrono::seconds(60);
  for (;;) {
    ncclResult_t st = ncclSuccess;
    R_NCCL(ncclCommGetAsyncError(c, &st));
    if (st == ncclSuccess) return;
    if (st != ncclInProgress) throw RankError(std::string(what) + ": " + ncclGetErrorString(st));
    if (Clock::now() > until) throw RankError(std::string(what) + ": still in progress after 60 s");
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

// Waits (bounded, 10 s) until a revoked NCCL communicator's state leaves ncclInProgress.
inline void waitRevokeSettled(ncclComm_t c) {
  const auto until = Clock::now() + std::chrono::seconds(10);
  ncclResult_t st = ncclInProgress;
  while (st == ncclInProgress && Clock::now() < until) {
    (void)ncclCommGetAsyncError(c, &st);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// A communicator over the caller's NCCL communicator (anyrCommInitFromNccl), every wait bounded
// by timeoutMs.
inline anyrComm_t initFromNccl(ncclComm_t nccl, int timeoutMs) {
  anyrConfig_t cfg = ANYR_CONFIG_INITIALIZER;
  cfg.timeoutMs = timeoutMs;
  anyrComm_t comm = nullptr;
  R_ANYR(anyrCommInitFromNccl(&comm, nccl, &cfg), nullptr);
  return comm;
}

// An NCCL communicator of `n` ranks on the current device (this process is `rank`), blocking
// or not; `round` numbers the communicators a test makes (rank 0 publishes one id per round).
inline ncclComm_t makeNcclComm(int rank, int n, bool blocking, int round = 1) {
  Shared* sh = sharedArea();
  if (rank == 0) {
    ncclUniqueId id;
    R_NCCL(ncclGetUniqueId(&id));
    std::memcpy(&sh->id, &id, sizeof(id));
    sh->idRound.store(round);
  } else {
    const auto until = Clock::now() + std::chrono::seconds(60);
    while (sh->idRound.load() < round) {
      if (Clock::now() > until) throw RankError("no NCCL unique id from rank 0 within 60 s");
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  ncclUniqueId id;
  std::memcpy(&id, &sh->id, sizeof(id));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = blocking ? 1 : 0;
  ncclComm_t c = nullptr;
  const ncclResult_t r = ncclCommInitRankConfig(&c, n, id, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    throw RankError(std::string("ncclCommInitRankConfig: ") + ncclGetErrorString(r));
  }
  settleNccl(c, "ncclCommInitRankConfig");
  return c;
}

}  // namespace nccltest
}  // namespace anyr
