// Multi-process GPU tests of the call discipline (docs/RELIABILITY.md): validation mode
// (ANYR_VALIDATE_CALLS=1) reports mismatched calls on every rank instead of hanging, eagerly and
// during graph capture; a second thread on a busy communicator is refused, never deadlocked;
// calls alternating between two streams stay ordered and correct; calls work whatever the
// caller's current device; anyrAddRmsNorm checks where its buffers live.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "anyreduce/anyreduce.h"
#include "common/data.h"
#include "common/launcher.h"
#include "gpu/gpu_test_util.h"

namespace anyr {
namespace {

using Clock = std::chrono::steady_clock;

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

double secondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Rank r on GPU r % ngpus; validation mode from the argument (the variable is read at init).
anyrComm_t initComm(int rank, int n, const anyrUniqueId& id, int timeoutMs, bool validate) {
  if (validate) {
    setenv("ANYR_VALIDATE_CALLS", "1", 1);
  } else {
    unsetenv("ANYR_VALIDATE_CALLS");
  }
  return initRankComm(rank, n, id, timeoutMs);
}

// expectRanksPassed, and stricter: no "FAIL" anywhere in a rank's report.
void expectAllPassed(const std::vector<launch::RankResult>& results) {
  expectRanksPassed(results);
  for (const auto& r : results) {
    EXPECT_FALSE(contains(r.message, "FAIL")) << "rank " << r.rank << ": " << r.message;
  }
  printSkipNotes(results);
}

// Runs an exact all-reduce of `count` small integers in place on `buf` and returns the number of
// wrong elements (after synchronizing `s`).
unsigned long long checkedAllReduce(anyrComm_t comm, void* buf, uint64_t count, anyrDataType_t dt,
                                    int rank, int n, uint32_t seed, cudaStream_t s) {
  R_CUDA(data::fillInput(dt, buf, count, rank, seed, data::kSmallInts, s));
  R_ANYR(anyrAllReduce(buf, buf, count, dt, anyrSum, comm, s), comm);
  unsigned long long* bad = deviceAlloc<unsigned long long>();
  unsigned long long h = ~0ull;
  R_CUDA(data::mismatchesNow(dt, buf, count, n, seed, data::kSmallInts, bad, s, &h));
  R_CUDA(cudaFree(bad));
  return h;
}

// ---- validation mode ------------------------------------------------------------------------

using ValidationBody = std::function<int(int rank, int n, anyrComm_t comm, cudaStream_t s,
                                         char* buf, const Report& report)>;

// Two ranks, each with a communicator in validation mode (waits bounded at 5 s), a non-blocking
// stream and a 1 MiB buffer; `body` returns its failures, then the buffer, stream and
// communicator are released (exit code 4 on any failure).
std::vector<launch::RankResult> runValidatingRanks(const ValidationBody& body) {
  return runRanksCatching(2, 180,
                          [&](int rank, int n, const anyrUniqueId& id, const Report& report) {
                            anyrComm_t comm = initComm(rank, n, id, 5000, true);
                            cudaStream_t s = nonBlockingStream();
                            char* buf = deviceAlloc<char>(1 << 20);
                            const int failures = body(rank, n, comm, s, buf, report);
                            return releaseRank(comm, s, {buf}, failures);
                          });
}

TEST(ReliabilityCallsGpu, ValidationModeReportsMismatchedCallsOnEveryRank) {
  REQUIRE_GPU();
  auto results = runValidatingRanks(
      [&](int rank, int n, anyrComm_t comm, cudaStream_t s, char* buf, const Report& report) {
        int failures = 0;
        auto fail = [&](const std::string& what) {
          ++failures;
          report("FAIL " + what + "\n");
        };
        // 1. Matching calls work.
        if (checkedAllReduce(comm, buf, 4096, anyrBfloat16, rank, n, 11, s) != 0)
          fail("first call");
        // 2. Different counts: every rank gets anyrInvalidUsage naming both signatures, fast.
        auto t0 = Clock::now();
        const size_t count = rank == 0 ? 1024 : 2048;
        anyrResult_t r = anyrAllReduce(buf, buf, count, anyrBfloat16, anyrSum, comm, s);
        std::string msg = anyrGetLastError(comm);
        if (r != anyrInvalidUsage || !contains(msg, "rank 0 made call #") ||
            !contains(msg, "anyrAllReduce(count=1024, datatype=bfloat16, op=sum)") ||
            !contains(msg, "rank 1 made call #") ||
            !contains(msg, "anyrAllReduce(count=2048, datatype=bfloat16, op=sum)")) {
          fail(std::string("count mismatch: ") + anyrGetErrorString(r) + ": " + msg);
        }
        if (secondsSince(t0) > 2.0)
          fail("count mismatch took " + std::to_string(secondsSince(t0)) + " s");
        report("NOTE " + msg + "\n");
        // 3. Different datatypes.
        r = anyrAllReduce(buf, buf, 512, rank == 0 ? anyrFloat16 : anyrFloat32, anyrSum, comm, s);
        msg = anyrGetLastError(comm);
        if (r != anyrInvalidUsage || !contains(msg, "datatype=float16") ||
            !contains(msg, "datatype=float32")) {
          fail(std::string("dtype mismatch: ") + anyrGetErrorString(r) + ": " + msg);
        }
        // 4. Rank 1 passes NULL: it reports its own argument error, rank 0 names rank 1.
        r = anyrAllReduce(rank == 1 ? nullptr : buf, buf, 256, anyrFloat32, anyrSum, comm, s);
        msg = anyrGetLastError(comm);
        if (rank == 1 && (r != anyrInvalidArgument || !contains(msg, "'sendbuff'"))) {
          fail(std::string("own refusal: ") + anyrGetErrorString(r) + ": " + msg);
        }
        if (rank == 0 && (r != anyrRemoteError || !contains(msg, "rank 1 refused call #") ||
                          !contains(msg, "'sendbuff'"))) {
          fail(std::string("peer refusal: ") + anyrGetErrorString(r) + ": " + msg);
        }
        // 5. Nothing was launched and the communicator still works.
        anyrResult_t async = anyrSuccess;
        R_ANYR(anyrCommGetAsyncError(comm, &async), comm);
        if (async != anyrSuccess) fail(std::string("async error: ") + anyrGetLastError(comm));
        if (checkedAllReduce(comm, buf, 100000, anyrFloat32, rank, n, 12, s) != 0) {
          fail("call after the mismatches");
        }
        // 6. Different forced algorithms are caught too: rank 0 forces the algorithm the
        // automatic choice takes for 512 elements (admitted here by definition, so this part
        // always runs), rank 1 asks for the automatic choice.
        anyrAlgo_t forced = anyrAlgoAuto;
        R_ANYR(anyrCommQueryAlgorithm(comm, 512, anyrFloat32, &forced), comm);
        const std::string forcedCall =
            std::string("anyrCommSetAlgorithm(") + anyrAlgoName(forced) + ")";
        r = anyrCommSetAlgorithm(comm, rank == 0 ? forced : anyrAlgoAuto);
        msg = anyrGetLastError(comm);
        if (forced == anyrAlgoAuto || r != anyrInvalidUsage || !contains(msg, forcedCall) ||
            !contains(msg, "anyrCommSetAlgorithm(auto)")) {
          fail(std::string("algorithm mismatch (") + forcedCall +
               " on rank 0): " + anyrGetErrorString(r) + ": " + msg);
        }
        return failures;
      });
  expectAllPassed(results);
  std::printf("[ info ] %s", results[0].message.c_str());
}

TEST(ReliabilityCallsGpu, ValidationModeComparesAtCaptureTime) {
  REQUIRE_GPU();
  auto results = runValidatingRanks([&](int rank, int n, anyrComm_t comm, cudaStream_t s, char* buf,
                                        const Report& report) {
    int failures = 0;
    // A mismatched call during capture fails at capture time on every rank.
    cudaGraph_t g = nullptr;
    R_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    anyrResult_t r =
        anyrAllReduce(buf, buf, rank == 0 ? 4096 : 4095, anyrBfloat16, anyrSum, comm, s);
    std::string msg = anyrGetLastError(comm);
    R_CUDA(cudaStreamEndCapture(s, &g));
    if (g != nullptr) R_CUDA(cudaGraphDestroy(g));
    if (r != anyrInvalidUsage || !contains(msg, "count=4096") || !contains(msg, "count=4095")) {
      ++failures;
      report(std::string("FAIL capture-time mismatch: ") + anyrGetErrorString(r) + ": " + msg +
             "\n");
    }
    // A matched capture works; its replays are not compared (no bootstrap traffic) and are
    // exact.
    R_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    R_ANYR(anyrAllReduce(buf, buf, 4096, anyrBfloat16, anyrSum, comm, s), comm);
    R_CUDA(cudaStreamEndCapture(s, &g));
    cudaGraphExec_t exec = nullptr;
    R_CUDA(cudaGraphInstantiate(&exec, g, 0));
    R_CUDA(cudaGraphDestroy(g));
    unsigned long long* bad = deviceAlloc<unsigned long long>();
    for (uint32_t seed = 20; seed < 25; ++seed) {
      R_CUDA(data::fillInput(anyrBfloat16, buf, 4096, rank, seed, data::kSmallInts, s));
      R_CUDA(cudaGraphLaunch(exec, s));
      unsigned long long h = ~0ull;
      R_CUDA(data::mismatchesNow(anyrBfloat16, buf, 4096, n, seed, data::kSmallInts, bad, s, &h));
      if (h != 0) {
        ++failures;
        report("FAIL replay seed " + std::to_string(seed) + ": " + std::to_string(h) + " wrong\n");
      }
    }
    R_CUDA(cudaGraphExecDestroy(exec));
    R_CUDA(cudaFree(bad));
    return failures;
  });
  expectAllPassed(results);
}

TEST(ReliabilityCallsGpu, ValidationModeSkippedCallIsABoundedTimeoutNamingTheRank) {
  REQUIRE_GPU();
  const int kTimeoutMs = 1500;
  auto results =
      runRanksCatching(2, 120, [&](int rank, int n, const anyrUniqueId& id, const Report& report) {
        anyrComm_t comm = initComm(rank, n, id, kTimeoutMs, true);
        cudaStream_t s = nonBlockingStream();
        char* buf = deviceAlloc<char>(1 << 16);
        int failures = 0;
        if (rank == 0) {
          auto t0 = Clock::now();
          anyrResult_t r = anyrAllReduce(buf, buf, 1024, anyrFloat32, anyrSum, comm, s);
          const double sec = secondsSince(t0);
          std::string msg = anyrGetLastError(comm);
          if (r != anyrTimeout || !contains(msg, "rank(s) 1 of 2 did not send") ||
              !contains(msg, "(ANYR_VALIDATE_CALLS)")) {
            ++failures;
            report(std::string("FAIL skipped call: ") + anyrGetErrorString(r) + ": " + msg + "\n");
          }
          if (sec > kTimeoutMs / 1000.0 + 5.0) {
            ++failures;
            report("FAIL the skipped call took " + std::to_string(sec) + " s\n");
          }
          // The communicator is failed now; the next call says so at once.
          r = anyrAllReduce(buf, buf, 1024, anyrFloat32, anyrSum, comm, s);
          if (r == anyrSuccess) {
            ++failures;
            report("FAIL a call on the failed communicator succeeded\n");
          }
          report("NOTE " + msg + "\n");
        } else {
          std::this_thread::sleep_for(std::chrono::milliseconds(kTimeoutMs + 1500));
        }
        anyrCommDestroy(comm);
        R_CUDA(cudaFree(buf));
        return failures ? 4 : 0;
      });
  expectAllPassed(results);
  std::printf("[ info ] %s", results[0].message.c_str());
}

// ---- concurrency ----------------------------------------------------------------------------

TEST(ReliabilityCallsGpu, SecondThreadOnABusyCommunicatorIsRefusedNotDeadlocked) {
  // Also: anyrCommDestroy during the first thread's call is refused and frees nothing.
  REQUIRE_GPU();
  auto results =
      runRanksCatching(2, 180, [&](int rank, int n, const anyrUniqueId& id, const Report& report) {
        // Validation mode makes a call wait in the bootstrap for the other rank, which holds the
        // communicator long enough for a second thread to find it busy, deterministically.
        anyrComm_t comm = initComm(rank, n, id, 20000, true);
        cudaStream_t s1, s2;
        R_CUDA(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
        R_CUDA(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
        char* a = deviceAlloc<char>(1 << 20);
        char* b = deviceAlloc<char>(1 << 20);
        int failures = 0;
        if (rank == 0) {
          std::atomic<bool> done{false};
          unsigned long long wrong = ~0ull;
          std::string firstError;
          std::thread first([&] {
            try {
              wrong = checkedAllReduce(comm, a, 65536, anyrBfloat16, rank, n, 31, s1);
            } catch (const std::exception& e) {
              firstError = e.what();
            }
            done = true;
          });
          std::this_thread::sleep_for(std::chrono::milliseconds(300));
          auto t0 = Clock::now();
          anyrResult_t r = anyrAllReduce(b, b, 1024, anyrFloat32, anyrSum, comm, s2);
          const double sec = secondsSince(t0);
          std::string msg = anyrGetLastError(nullptr);  // this thread's last error
          if (done.load()) {
            ++failures;
            report("FAIL the first call finished before rank 1 joined\n");
          }
          if (r != anyrInvalidUsage || !contains(msg, "communicator in use by another thread")) {
            ++failures;
            report(std::string("FAIL second thread: ") + anyrGetErrorString(r) + ": " + msg + "\n");
          }
          if (sec > 0.5) {
            ++failures;
            report("FAIL the refusal took " + std::to_string(sec) + " s (it must not wait)\n");
          }
          // Destroy is refused too while the call is in progress, and frees nothing.
          r = anyrCommDestroy(comm);
          const std::string destroyMsg = anyrGetLastError(nullptr);
          if (r != anyrInvalidUsage || !contains(destroyMsg, "inside anyrAllReduce")) {
            ++failures;
            report(std::string("FAIL destroy during a call: ") + anyrGetErrorString(r) + ": " +
                   destroyMsg + "\n");
          }
          first.join();
          if (!firstError.empty() || wrong != 0) {
            ++failures;
            report("FAIL first thread: " + firstError + " wrong=" + std::to_string(wrong) + "\n");
          }
          report("NOTE " + msg + "\n");
        } else {
          std::this_thread::sleep_for(std::chrono::milliseconds(1500));
          if (checkedAllReduce(comm, a, 65536, anyrBfloat16, rank, n, 31, s1) != 0) {
            ++failures;
            report("FAIL rank 1's call\n");
          }
        }
        // Both ranks: the refused call may have been matched by the peer (it was not here, but
        // a rank cannot know), so the refusal stopped the communicator once the first thread's
        // call was done: a later call is refused, naming rank 0's refusal, on both ranks.
        R_CUDA(data::fillInput(anyrFloat32, b, 4096, rank, 32, data::kSmallInts, s2));
        const anyrResult_t later = anyrAllReduce(b, b, 4096, anyrFloat32, anyrSum, comm, s2);
        R_CUDA(waitStream(s2, 30));
        anyrResult_t async = anyrSuccess;
        if (later == anyrSuccess) anyrCommGetAsyncError(comm, &async);
        const std::string laterMsg = anyrGetLastError(comm);
        if ((later == anyrSuccess && async == anyrSuccess) ||
            laterMsg.find("rank 0 refused") == std::string::npos) {
          ++failures;
          report(std::string("FAIL call after the refusal: ") + anyrGetErrorString(later) + "/" +
                 anyrGetErrorString(async) + ": " + laterMsg + "\n");
        }
        return releaseRank(comm, nullptr, {a, b}, failures);
      });
  expectAllPassed(results);
  std::printf("[ info ] %s", results[0].message.c_str());
}

TEST(ReliabilityCallsGpu, CallsAlternatingBetweenStreamsStayOrdered) {
  REQUIRE_GPU();
  auto results =
      runRanksCatching(2, 300, [&](int rank, int n, const anyrUniqueId& id, const Report& report) {
        anyrComm_t comm = initComm(rank, n, id, 20000, false);
        cudaStream_t st[3];
        for (auto& x : st) R_CUDA(cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking));
        const int kCalls = 64;
        const uint64_t counts[] = {1000, 65536, 1 << 20};
        int failures = 0;
        unsigned long long* bad = deviceAlloc<unsigned long long>();
        for (anyrAlgo_t algo : {anyrAlgoOneShotPush, anyrAlgoOneShotPull, anyrAlgoTwoShot,
                                anyrAlgoTwoShotPush, anyrAlgoAuto}) {
          if (anyrCommSetAlgorithm(comm, algo) != anyrSuccess) {
            report(std::string("SKIP ") + anyrAlgoName(algo) + ": " + anyrGetLastError(comm) +
                   "\n");
            continue;
          }
          for (uint64_t count : counts) {
            // One buffer per call, filled and synchronized first; then every call launched with no
            // host synchronization, round-robin over three streams.
            std::vector<void*> bufs(kCalls);
            for (int i = 0; i < kCalls; ++i) {
              R_CUDA(cudaMalloc(&bufs[i], count * 2));
              R_CUDA(data::fillInput(anyrBfloat16, bufs[i], count, rank, 100 + i, data::kSmallInts,
                                     st[0]));
            }
            R_CUDA(cudaStreamSynchronize(st[0]));
            for (int i = 0; i < kCalls; ++i) {
              R_ANYR(anyrAllReduce(bufs[i], bufs[i], count, anyrBfloat16, anyrSum, comm, st[i % 3]),
                     comm);
            }
            for (auto& x : st) R_CUDA(cudaStreamSynchronize(x));
            R_CUDA(cudaMemset(bad, 0, sizeof(*bad)));
            for (int i = 0; i < kCalls; ++i) {
              R_CUDA(data::countMismatches(anyrBfloat16, bufs[i], count, n, 100 + i,
                                           data::kSmallInts, bad, st[0]));
            }
            unsigned long long h = ~0ull;
            R_CUDA(cudaMemcpyAsync(&h, bad, sizeof(h), cudaMemcpyDeviceToHost, st[0]));
            R_CUDA(cudaStreamSynchronize(st[0]));
            if (h != 0) {
              ++failures;
              report(std::string("FAIL ") + anyrAlgoName(algo) + " count " + std::to_string(count) +
                     ": " + std::to_string(h) + " wrong elements over " + std::to_string(kCalls) +
                     " calls on 3 streams\n");
            }
            for (void* p : bufs) R_CUDA(cudaFree(p));
          }
        }
        failures += asyncErrorFailures(comm, report);
        for (auto& x : st) R_CUDA(cudaStreamDestroy(x));
        return releaseRank(comm, nullptr, {bad}, failures);
      });
  expectAllPassed(results);
}

// ---- validation of where things live -------------------------------------------------------

TEST(ReliabilityCallsGpu, CallsRunOnTheCommunicatorsDeviceWhateverIsCurrent) {
  REQUIRE_GPU();
  if (gpuCount() < 2) GTEST_SKIP() << "needs 2 GPUs";
  auto results =
      runRanksCatching(2, 120, [&](int rank, int n, const anyrUniqueId& id, const Report& report) {
        anyrComm_t comm = initComm(rank, n, id, 20000, false);
        int dev = -1;
        R_ANYR(anyrCommCuDevice(comm, &dev), comm);
        cudaStream_t s = nonBlockingStream();
        char* buf = deviceAlloc<char>(1 << 20);
        int failures = 0;
        const int other = (dev + 1) % gpuCount();
        const uint64_t count = 50000;
        R_CUDA(data::fillInput(anyrFloat16, buf, count, rank, 41, data::kSmallInts, s));
        // Only the anyreduce call runs with the other device current (the test's own kernels must
        // launch on the stream's device).
        R_CUDA(cudaSetDevice(other));
        anyrResult_t r = anyrAllReduce(buf, buf, count, anyrFloat16, anyrSum, comm, s);
        int now = -1;
        R_CUDA(cudaGetDevice(&now));
        R_CUDA(cudaSetDevice(dev));
        if (r != anyrSuccess) {
          ++failures;
          report(std::string("FAIL all-reduce with device ") + std::to_string(other) +
                 " current: " + anyrGetErrorString(r) + ": " + anyrGetLastError(comm) + "\n");
        }
        if (now != other) {
          ++failures;
          report("FAIL the call changed the caller's current device to " + std::to_string(now) +
                 "\n");
        }
        unsigned long long* bad = deviceAlloc<unsigned long long>();
        unsigned long long h = ~0ull;
        R_CUDA(data::mismatchesNow(anyrFloat16, buf, count, n, 41, data::kSmallInts, bad, s, &h));
        R_CUDA(cudaFree(bad));
        if (h != 0) {
          ++failures;
          report("FAIL " + std::to_string(h) + " wrong elements\n");
        }
        R_CUDA(cudaSetDevice(dev));
        return releaseRank(comm, s, {buf}, failures);
      });
  expectAllPassed(results);
}

// anyrAddRmsNorm on device 0's stream: buffers that are not device 0's memory are refused,
// naming the argument (host memory; with otherDevice, device 1's memory), and a valid call
// still works.
int addRmsNormRefusalRank(const Report& report, bool otherDevice) {
  R_CUDA(cudaSetDevice(0));
  const size_t tokens = 4, hidden = 256, bytes = tokens * hidden * 2;
  char* x = deviceAlloc<char>(bytes);
  char* w = deviceAlloc<char>(hidden * 2);
  char* out = deviceAlloc<char>(bytes);
  cudaStream_t s = nonBlockingStream();
  int failures = 0;
  auto expectArg = [&](anyrResult_t r, const char* arg, const char* rule) {
    std::string msg = anyrGetLastError(nullptr);
    if (r != anyrInvalidArgument || !contains(msg, std::string("'") + arg + "'") ||
        !contains(msg, rule)) {
      ++failures;
      report(std::string("FAIL ") + arg + ": " + anyrGetErrorString(r) + ": " + msg + "\n");
    }
  };
  if (otherDevice) {
    char* far = nullptr;
    R_CUDA(cudaSetDevice(1));
    R_CUDA(cudaMalloc(&far, bytes));
    R_CUDA(cudaSetDevice(0));
    expectArg(anyrAddRmsNorm(x, nullptr, nullptr, w, 1e-6f, far, tokens, hidden, anyrBfloat16,
                             nullptr, s),
              "normOut", "is memory of device 1, the stream's device is 0");
    R_CUDA(cudaFree(far));
  } else {
    std::vector<char> host(bytes);
    expectArg(anyrAddRmsNorm(host.data(), nullptr, nullptr, w, 1e-6f, out, tokens, hidden,
                             anyrBfloat16, nullptr, s),
              "x", "must point to device memory");
    expectArg(anyrAddRmsNorm(x, nullptr, nullptr, host.data(), 1e-6f, out, tokens, hidden,
                             anyrBfloat16, nullptr, s),
              "weight", "must point to device memory");
  }
  // A valid call still works.
  R_CUDA(cudaMemset(x, 0, bytes));
  R_CUDA(cudaMemset(w, 0, hidden * 2));
  R_ANYR(
      anyrAddRmsNorm(x, nullptr, nullptr, w, 1e-6f, out, tokens, hidden, anyrBfloat16, nullptr, s),
      nullptr);
  R_CUDA(cudaStreamSynchronize(s));
  R_CUDA(cudaFree(x));
  R_CUDA(cudaFree(w));
  R_CUDA(cudaFree(out));
  R_CUDA(cudaStreamDestroy(s));
  return failures ? 4 : 0;
}

TEST(ReliabilityCallsGpu, AddRmsNormRefusesHostBuffers) {
  REQUIRE_GPU();
  auto results = runRanksCatching(1, 120, [&](int, int, const anyrUniqueId&, const Report& report) {
    return addRmsNormRefusalRank(report, false);
  });
  expectAllPassed(results);
}

// (Its own test, so that with one GPU it is reported skipped, not passed.)
TEST(ReliabilityCallsGpu, AddRmsNormRefusesABufferOfAnotherDevice) {
  REQUIRE_GPU();
  if (gpuCount() < 2) GTEST_SKIP() << "needs 2 GPUs (a buffer on the device the stream is not of)";
  auto results = runRanksCatching(1, 120, [&](int, int, const anyrUniqueId&, const Report& report) {
    return addRmsNormRefusalRank(report, true);
  });
  expectAllPassed(results);
}

// ---- counts over one launch's buffers --------------------------------------------------------

TEST(ReliabilityCallsGpu, FusedRowWiderThanATwoShotSlotFallsBackInsteadOfLooping) {
  REQUIRE_GPU();
  // 3 ranks, ANYR_CHUNK_BYTES = 64 KiB: a two-shot push slot holds less than one 16384-wide
  // bf16 row, so the forced fused two-shot kernel cannot take even one row. The call must use
  // the unfused composition (it used to loop forever launching nothing) and give the same bits
  // as anyrAllReduce + anyrAddRmsNorm.
  const int n = 3;
  auto results =
      runRanksCatching(n, 300, [&](int rank, int nr, const anyrUniqueId& id, const Report& report) {
        unsetenv("ANYR_VALIDATE_CALLS");
        anyrComm_t comm =
            initRankComm(rank, nr, id, 20000, [&](anyrConfig_t& c) { c.chunkBytes = 64 << 10; });
        if (anyrCommSetAlgorithm(comm, anyrAlgoTwoShotPush) != anyrSuccess) {
          report(std::string("SKIP twoshot-push: ") + anyrGetLastError(comm) + "\n");
          anyrCommDestroy(comm);
          return 0;
        }
        const size_t tokens = 5, hidden = 16384, elems = tokens * hidden, bytes = elems * 2;
        cudaStream_t s = nonBlockingStream();
        char* partial = deviceAlloc<char>(bytes);
        char* weight = deviceAlloc<char>(hidden * 2);
        char* norm = deviceAlloc<char>(bytes);
        char* sum = deviceAlloc<char>(bytes);
        char* ref = deviceAlloc<char>(bytes);
        R_CUDA(data::fillInput(anyrBfloat16, partial, elems, rank, 51, data::kSmallInts, s));
        R_CUDA(data::fillInput(anyrBfloat16, weight, hidden, 0, 52, data::kRandom, s));
        R_CUDA(cudaMemsetAsync(norm, 0xff, bytes, s));
        auto t0 = Clock::now();
        R_ANYR(anyrAllReduceAddRmsNorm(partial, nullptr, nullptr, weight, 1e-6f, norm, tokens,
                                       hidden, anyrBfloat16, nullptr, comm, s),
               comm);
        R_ANYR(anyrAllReduce(partial, sum, elems, anyrBfloat16, anyrSum, comm, s), comm);
        R_ANYR(anyrAddRmsNorm(sum, nullptr, nullptr, weight, 1e-6f, ref, tokens, hidden,
                              anyrBfloat16, nullptr, s),
               nullptr);
        unsigned long long* diff = deviceAlloc<unsigned long long>();
        R_CUDA(cudaMemsetAsync(diff, 0, sizeof(*diff), s));
        R_CUDA(data::countDiffBytes(norm, ref, bytes, diff, s));
        unsigned long long h = ~0ull;
        R_CUDA(cudaMemcpyAsync(&h, diff, sizeof(h), cudaMemcpyDeviceToHost, s));
        R_CUDA(cudaStreamSynchronize(s));
        int failures = 0;
        if (h != 0) {
          ++failures;
          report("FAIL fused vs all-reduce + add-rmsnorm: " + std::to_string(h) +
                 " bytes differ\n");
        }
        if (secondsSince(t0) > 30) {
          ++failures;
          report("FAIL took " + std::to_string(secondsSince(t0)) + " s\n");
        }
        return releaseRank(comm, s, {partial, weight, norm, sum, ref, diff}, failures);
      });
  expectAllPassed(results);
  SKIP_UNLESS_EVERY_SUBJECT_RAN(results, {anyrAlgoTwoShotPush});
}

}  // namespace
}  // namespace anyr
