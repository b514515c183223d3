// The watchdog that bounds the NCCL path (src/transport/nccl_comm.h, NcclHandle).
//
// One GPU: NCCL refuses two ranks on one GPU, and a one-rank NCCL all-reduce is a local copy
// that always completes. So the one-GPU tests drive NcclHandle directly on a one-rank NCCL
// communicator and hold the call's stream with a kernel placed, through the handle's test hook,
// between the call's first event and its NCCL enqueue: the call cannot complete, the watchdog
// must fire once at the timeout, stop the NCCL communicator (ours: ncclCommAbort; the caller's:
// ncclCommRevoke, or ncclCommAbort where NCCL has no revoke) and report through the failure
// sink; the next call must fail with the same report.
//
// Two GPUs: two ranks, the NCCL path forced, rank 1 stops calling; rank 0's NCCL all-reduce
// (and the fused op's composition over it) must end with anyrTimeout within timeout + 5 s,
// its stream released by the abort, for a communicator of our own and one made from the
// caller's NCCL communicator (anyrCommInitFromNccl). Without the watchdog that call hangs.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "anyreduce/anyreduce.h"
#include "base/error.h"
#include "common/data.h"
#include "gpu/gpu_test_util.h"
#include "gpu/nccl_test_util.h"
#include "gpu/nccl_watchdog_kernels.h"
#include "transport/nccl_comm.h"

namespace anyr {
namespace {

using namespace nccltest;  // the helpers this file shares with the other NCCL tests

// What the watchdog reported through NcclHandle's failure sink.
struct Sink {
  std::mutex mu;
  int count = 0;
  anyrResult_t code = anyrSuccess;
  std::string msg;
  Clock::time_point when{};
  NcclHandle::FailureSink fn() {
    return [this](anyrResult_t c, const std::string& m) {
      std::lock_guard<std::mutex> lock(mu);
      if (count++ == 0) {
        code = c;
        msg = m;
        when = Clock::now();
      }
    };
  }
  int calls() {
    std::lock_guard<std::mutex> lock(mu);
    return count;
  }
};

// One GPU, one rank: a call held behind a stalled stream overruns its deadline. `external`:
// the NCCL communicator is handed over as the caller's (anyrCommInitFromNccl's case).
int stalledCallOnOneGpu(bool external, const Report& report) {
  constexpr int kTimeoutMs = 500;
  R_CUDA(cudaSetDevice(0));
  int failures = 0;
  auto expect = [&](bool ok, const std::string& what) {
    if (!ok) {
      ++failures;
      report("FAIL " + what + "\n");
    }
  };
  ncclComm_t nccl = makeNcclComm(0, 1, /*blocking=*/false);
  Sink sink;
  auto handle = std::make_unique<NcclHandle>();
  handle->adopt(nccl, !external, 0, 0, sink.fn());
  int* hRelease = nullptr;
  R_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&hRelease), sizeof(int), cudaHostAllocMapped));
  *const_cast<volatile int*>(hRelease) = 0;
  int* dRelease = nullptr;
  R_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dRelease), hRelease, 0));
  std::atomic<bool> stallNext{false};
  handle->setTestHookBeforeEnqueue([&](cudaStream_t s) {
    if (stallNext.exchange(false)) R_CUDA(wdtest::launchStall(dRelease, 30ull * 1000000000ull, s));
  });
  cudaStream_t s = nonBlockingStream();
  const uint64_t n = 1 << 20;
  void* in = deviceAlloc<void>(n * 4);
  void* out = deviceAlloc<void>(n * 4);
  unsigned long long* scratch = deviceAlloc<unsigned long long>();

  // 1. Calls that complete: exact, and nothing fires long after their deadlines passed.
  for (uint32_t seed = 1; seed <= 3; ++seed) {
    R_CUDA(data::fillInput(anyrFloat32, in, n, 0, seed, data::kSmallInts, s));
    handle->allReduceSum(in, out, n, anyrFloat32, s, kTimeoutMs);
    unsigned long long wrong = ~0ull;
    R_CUDA(data::mismatchesNow(anyrFloat32, out, n, 1, seed, data::kSmallInts, scratch, s, &wrong));
    expect(wrong == 0, "completed call: " + std::to_string(wrong) + " wrong elements");
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(3 * kTimeoutMs));
  expect(sink.calls() == 0, "the watchdog fired for calls that completed: " + sink.msg);

  // 2. A call that cannot complete: fired once, at the timeout (not before), NCCL stopped.
  // The call is held behind this test's stall kernel, which NCCL cannot release: its abort
  // waits for the queued NCCL kernel to start (and see the abort) once the stall ends. So the
  // stall is released shortly after the deadline, and the watchdog's report (made once the
  // abort returned) is expected between the deadline and that release plus a margin.
  stallNext = true;
  const auto t0 = Clock::now();
  handle->allReduceSum(in, out, n, anyrFloat32, s, kTimeoutMs);
  const double enqueueSec = secondsSince(t0);
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(kTimeoutMs + 500));
    *const_cast<volatile int*>(hRelease) = 1;
  });
  while (sink.calls() == 0 && secondsSince(t0) < 20) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  releaser.join();
  double firedSec = -1;
  {
    std::lock_guard<std::mutex> lock(sink.mu);
    if (sink.count > 0) firedSec = std::chrono::duration<double>(sink.when - t0).count();
  }
  expect(enqueueSec < 1.0, "the stalled call's enqueue blocked " + std::to_string(enqueueSec) +
                               " s (the host must not wait for NCCL's kernel)");
  expect(firedSec >= kTimeoutMs / 1000.0 * 0.9 && firedSec <= kTimeoutMs / 1000.0 + 0.5 + 2.0,
         "the watchdog fired after " + std::to_string(firedSec) + " s (timeout " +
             std::to_string(kTimeoutMs) + " ms)");
  const std::string want =
      "rank 0: NCCL all-reduce did not complete within 500 ms; NCCL does "
      "not say which rank; ";
  std::string msg;
  {
    std::lock_guard<std::mutex> lock(sink.mu);
    msg = sink.msg;
    expect(sink.code == anyrTimeout,
           std::string("code ") + anyrGetErrorString(sink.code) + ": " + sink.msg);
  }
  expect(contains(msg, want), "message: " + msg);
  bool revoked = false;
  if (!external) {
    expect(contains(msg, "the NCCL communicator was aborted"), "message: " + msg);
  } else if (ncclHasRevoke()) {
    revoked = true;
    expect(contains(msg, "the NCCL communicator you passed was revoked (ncclCommRevoke)"),
           "message: " + msg);
  } else {
    expect(contains(msg, "the NCCL communicator you passed was aborted and freed"),
           "message: " + msg);
  }
  expect(handle->get() == nullptr, "the handle still offers the stopped communicator");
  report("NOTE " + msg + "\n");

  // 3. The next call reports the same failure, and enqueues nothing.
  try {
    handle->allReduceSum(in, out, n, anyrFloat32, s, kTimeoutMs);
    expect(false, "a call after the watchdog fired succeeded");
  } catch (const Error& e) {
    expect(e.code() == anyrTimeout && std::string(e.what()) == msg,
           std::string("next call: ") + anyrGetErrorString(e.code()) + ": " + e.what());
  }

  // 4. A revoked communicator refuses work (nothing can pair with a peer's), and stays the
  // caller's to release.
  if (revoked) {
    waitRevokeSettled(nccl);
    const ncclResult_t r = ncclAllReduce(in, out, n, ncclFloat32, ncclSum, nccl, s);
    expect(r != ncclSuccess && r != ncclInProgress,
           std::string("ncclAllReduce on the revoked communicator: ") + ncclGetErrorString(r));
  }

  // 5. The stream drains once released; release() and the handle's end are bounded; no second
  // report.
  *const_cast<volatile int*>(hRelease) = 1;
  expect(waitStream(s, 10) == cudaSuccess, "the stream did not drain after the stall ended");
  const auto t1 = Clock::now();
  handle->release(false);
  handle.reset();
  expect(secondsSince(t1) < 2.0, "release took " + std::to_string(secondsSince(t1)) + " s");
  expect(sink.calls() == 1, "the watchdog reported " + std::to_string(sink.calls()) + " times");
  if (revoked) R_NCCL(ncclCommAbort(nccl));
  for (void* p : {in, out, static_cast<void*>(scratch)}) R_CUDA(cudaFree(p));
  R_CUDA(cudaFreeHost(hRelease));
  R_CUDA(cudaStreamDestroy(s));
  report("CHECKED\n");
  return failures ? 4 : 0;
}

// `body` in one rank (a process of its own), which must pass; its notes are printed.
void expectOneRankPasses(const std::function<int(const Report&)>& body) {
  resetShared();
  auto results = runRanksCatching(
      1, 120, [&](int, int, const anyrUniqueId&, const Report& r) { return body(r); });
  expectRanksPassed(results);
  std::printf("[ info ] %s", results[0].message.c_str());
}

TEST(NcclWatchdogGpu, OneGpuAStalledCallFiresOnceAndAbortsOurNcclCommunicator) {
  REQUIRE_GPU();
  expectOneRankPasses([](const Report& r) { return stalledCallOnOneGpu(false, r); });
}

TEST(NcclWatchdogGpu, OneGpuAStalledCallStopsTheCallersNcclCommunicator) {
  REQUIRE_GPU();
  expectOneRankPasses([](const Report& r) { return stalledCallOnOneGpu(true, r); });
}

// One GPU, one rank: a refused call (FailureState::applyPendingStop) stops the caller's NCCL
// communicator, so that the application's next collective on it cannot join a peer's pending
// NCCL all-reduce, and leaves one of ours alone (only anyreduce's calls use it).
int refusalOnOneGpu(bool external, const Report& report) {
  R_CUDA(cudaSetDevice(0));
  int failures = 0;
  auto expect = [&](bool ok, const std::string& what) {
    if (!ok) {
      ++failures;
      report("FAIL " + what + "\n");
    }
  };
  ncclComm_t nccl = makeNcclComm(0, 1, /*blocking=*/false);
  Sink sink;
  auto handle = std::make_unique<NcclHandle>();
  handle->adopt(nccl, !external, 0, 0, sink.fn());
  cudaStream_t s = nonBlockingStream();
  const uint64_t n = 1 << 16;
  void* in = deviceAlloc<void>(n * 4);
  void* out = deviceAlloc<void>(n * 4);
  unsigned long long* scratch = deviceAlloc<unsigned long long>();
  auto exactCall = [&](uint32_t seed, const std::string& what) {
    R_CUDA(data::fillInput(anyrFloat32, in, n, 0, seed, data::kSmallInts, s));
    handle->allReduceSum(in, out, n, anyrFloat32, s, 5000);
    unsigned long long wrong = ~0ull;
    R_CUDA(data::mismatchesNow(anyrFloat32, out, n, 1, seed, data::kSmallInts, scratch, s, &wrong));
    expect(wrong == 0, what + ": " + std::to_string(wrong) + " wrong elements");
  };
  exactCall(1, "the call before the refusal");
  expect(waitStream(s, 10) == cudaSuccess, "the first call did not complete");

  const std::string refused = "rank 0 refused its call #2 (test)";
  const std::string done = handle->stopCallers(anyrInvalidUsage, refused);
  bool revoked = false;
  if (!external) {
    expect(done.empty(), "our NCCL communicator was stopped: " + done);
    expect(handle->get() != nullptr, "our NCCL communicator was forgotten");
    exactCall(3, "a call on our communicator after the refusal");
  } else {
    if (ncclHasRevoke()) {
      revoked = true;
      expect(contains(done, "the NCCL communicator you passed was revoked (ncclCommRevoke)"),
             "note: " + done);
    } else {
      expect(contains(done, "the NCCL communicator you passed was aborted and freed"),
             "note: " + done);
    }
    expect(handle->get() == nullptr, "the handle still offers the stopped communicator");
    try {
      handle->allReduceSum(in, out, n, anyrFloat32, s, 5000);
      expect(false, "a call after the refusal succeeded");
    } catch (const Error& e) {
      expect(e.code() == anyrInvalidUsage && std::string(e.what()) == refused + done,
             std::string("next call: ") + anyrGetErrorString(e.code()) + ": " + e.what());
    }
    expect(handle->stopCallers(anyrInvalidUsage, refused).empty(), "stopped twice");
    if (revoked) {
      waitRevokeSettled(nccl);
      const ncclResult_t r = ncclAllReduce(in, out, n, ncclFloat32, ncclSum, nccl, s);
      expect(r != ncclSuccess && r != ncclInProgress,
             std::string("ncclAllReduce on the revoked communicator: ") + ncclGetErrorString(r));
    }
    report("NOTE " + done + "\n");
  }
  expect(waitStream(s, 10) == cudaSuccess, "the stream did not drain");
  handle->release(true);
  handle.reset();
  expect(sink.calls() == 0, "the watchdog reported: " + sink.msg);
  if (revoked) R_NCCL(ncclCommAbort(nccl));  // ours: release(true) destroyed it
  for (void* p : {in, out, static_cast<void*>(scratch)}) R_CUDA(cudaFree(p));
  R_CUDA(cudaStreamDestroy(s));
  report("CHECKED\n");
  return failures ? 4 : 0;
}

TEST(NcclWatchdogGpu, OneGpuARefusalLeavesOurNcclCommunicatorAlone) {
  REQUIRE_GPU();
  expectOneRankPasses([](const Report& r) { return refusalOnOneGpu(false, r); });
}

TEST(NcclWatchdogGpu, OneGpuARefusalStopsTheCallersNcclCommunicator) {
  REQUIRE_GPU();
  expectOneRankPasses([](const Report& r) { return refusalOnOneGpu(true, r); });
}

TEST(NcclWatchdogGpu, TwoGpusAPeerThatStopsCallingGivesTheNcclPathATimeout) {
  REQUIRE_GPU();
  if (gpuCount() < 2) {
    GTEST_SKIP() << "needs 2 GPUs: two ranks of one NCCL communicator cannot share a GPU (NCCL "
                    "refuses duplicate GPUs); the one-GPU tests above cover the watchdog";
  }
  const int timeoutMs = 1500;
  for (bool fromNccl : {false, true}) {
    for (bool fused : {false, true}) {
      const std::string label = std::string(fromNccl ? "anyrCommInitFromNccl" : "unique id") +
                                (fused ? ", fused op" : ", all-reduce");
      resetShared();
      auto results = runRanksCatching(
          2, 180, [&](int rank, int n, const anyrUniqueId& id, const Report& report) {
            int failures = 0;
            anyrComm_t comm = nullptr;
            ncclComm_t nccl = nullptr;
            if (fromNccl) {
              useRankGpu(rank);
              nccl = makeNcclComm(rank, n, /*blocking=*/false);
              comm = initFromNccl(nccl, timeoutMs);
            } else {
              comm = initRankComm(rank, n, id, timeoutMs);
            }
            R_ANYR(anyrCommSetAlgorithm(comm, anyrAlgoNccl), comm);
            cudaStream_t s = nonBlockingStream();
            const SkippableCall call(fused, comm, s);
            R_ANYR(call(), comm);  // both ranks: NCCL connected
            R_CUDA(waitStream(s, 30));
            if (rank == 0) {
              const auto t0 = Clock::now();
              const anyrResult_t r = call();
              const cudaError_t ce = waitStream(s, timeoutMs / 1000.0 + 5.0);
              const double sec = secondsSince(t0);
              anyrResult_t async = anyrSuccess;
              anyrCommGetAsyncError(comm, &async);
              const std::string msg = anyrGetLastError(comm);
              // The watchdog's timeout, reported by anyrCommGetAsyncError; or, where NCCL was
              // still connecting at the enqueue, the call's own timeout. Either way NCCL was
              // stopped and the message says so.
              const anyrResult_t got = r != anyrSuccess ? r : async;
              const bool says =
                  (contains(msg, "NCCL all-reduce did not complete within 1500 ms") ||
                   contains(msg, "NCCL all-reduce was still being enqueued after 1500 ms")) &&
                  contains(msg, "NCCL does not say which rank") &&
                  (fromNccl ? contains(msg, "the NCCL communicator you passed was")
                            : contains(msg, "the NCCL communicator was aborted"));
              if (got != anyrTimeout || ce != cudaSuccess || !says ||
                  sec > timeoutMs / 1000.0 + 5.0) {
                ++failures;
                report("FAIL " + label + ": call " + anyrGetErrorString(r) + ", stream " +
                       cudaGetErrorString(ce) + ", state " + anyrGetErrorString(async) + " after " +
                       std::to_string(sec) + " s: " + msg + "\n");
              } else {
                report("NOTE " + label + ": " + std::to_string(sec) + " s: " + msg + "\n");
              }
              const anyrResult_t next = call();
              if (next != anyrTimeout) {
                ++failures;
                report("FAIL " + label + ": the next call returned " + anyrGetErrorString(next) +
                       "\n");
              }
              sharedArea()->flag.store(1);
              // Revoked: still ours to release (after anyreduce's communicator). Aborted: NCCL
              // freed it already.
              if (fromNccl && !contains(msg, "was revoked")) nccl = nullptr;
            } else {
              (void)waitFlag(1, 60);  // skip the call; leave once rank 0 has its error
              anyrCommAbort(comm);
            }
            const auto t1 = Clock::now();
            anyrCommDestroy(comm);
            if (secondsSince(t1) > timeoutMs / 1000.0 + 5.0) {
              ++failures;
              report("FAIL " + label + ": destroy took " + std::to_string(secondsSince(t1)) +
                     " s\n");
            }
            // Rank 1's is healthy but its peer's is gone: abort (destroy could wait for it).
            if (nccl != nullptr) ncclCommAbort(nccl);
            return failures ? 4 : 0;
          });
      const std::string failures = launch::describeFailures(results);
      EXPECT_TRUE(failures.empty()) << label << ": " << failures;
      std::printf("[ info ] %s", results[0].message.c_str());
    }
  }
}

}  // namespace
}  // namespace anyr
