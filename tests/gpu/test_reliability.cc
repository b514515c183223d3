// Multi-process GPU tests of the reliability guarantees (issue 5, docs/RELIABILITY.md, section
// "GPU-demonstrated guarantees"):
//  - the startup self-test passes on healthy hardware (and says what it cost), and catches a
//    corrupted peer mapping injected with ANYR_FAULT_INJECT on every rank; the communicator then
//    still computes exact results through the fallback;
//  - kill -9 of one rank in the middle of a loop of collectives: every survivor gets an error
//    naming that rank within the timeout + 5 s, and no process is left hung;
//  - a rank that skips a call: a bounded error on the others, naming it;
//  - anyrCommAbort from another thread releases a waiting kernel; the communicator can then be
//    destroyed and a new one created in the same processes;
//  - a stress run of random all-reduce and fused add+RMSNorm calls with guard canaries, exact
//    checks and cross-rank hashes (ANYR_TEST_STRESS_CALLS, default 3000; scripts/device.sh
//    reliability runs 100000);
//  - 200 create/destroy cycles without leaking device memory.
// Ranks that need a second communicator in the same processes exchange a fresh unique id
// through a shared anonymous mapping made before the ranks are forked.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "anyreduce/anyreduce.h"
#include "common/data.h"
#include "common/launcher.h"
#include "gpu/gpu_test_util.h"
#include "gpu/reliability_kernels.h"

namespace anyr {
namespace {

using Clock = std::chrono::steady_clock;

// ---- helpers ----------------------------------------------------------------------------------

// Shared by the forked ranks of one run (mapped before the fork).
struct Shared {
  std::atomic<long long> killNs;  // steady_clock time the victim killed itself (0: not yet)
  std::atomic<int> idRound;       // rounds of unique ids published by rank 0
  std::atomic<int> flag;          // test-specific signal between ranks
  anyrUniqueId id;
};
static_assert(std::atomic<long long>::is_always_lock_free, "shared atomics");

Shared* sharedArea() {
  static Shared* s = [] {
    void* p =
        mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? nullptr : static_cast<Shared*>(p);
  }();
  return s;
}
void resetShared() {
  Shared* s = sharedArea();
  ASSERT_NE(s, nullptr) << "mmap failed";
  s->killNs.store(0);
  s->idRound.store(0);
  s->flag.store(0);
  std::memset(&s->id, 0, sizeof(s->id));
}

long long nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

int envInt(const char* name, int dflt) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : dflt;
}

anyrComm_t initComm(int rank, int n, const anyrUniqueId& id, int timeoutMs, int useNccl = 1) {
  anyrComm_t comm =
      initRankComm(rank, n, id, timeoutMs, [&](anyrConfig_t& c) { c.useNccl = useNccl; });
  return comm;
}

// Round `round` (1, 2, ...) of a fresh unique id: rank 0 creates it (and so keeps its
// rendezvous socket) and publishes it; the others wait for it, bounded.
anyrUniqueId shareNewId(int rank, int round) {
  Shared* sh = sharedArea();
  if (rank == 0) {
    anyrUniqueId id;
    R_ANYR(anyrGetUniqueId(&id), nullptr);
    std::memcpy(&sh->id, &id, sizeof(id));
    sh->idRound.store(round, std::memory_order_release);
    return id;
  }
  auto deadline = Clock::now() + std::chrono::seconds(60);
  while (sh->idRound.load(std::memory_order_acquire) < round) {
    if (Clock::now() > deadline) throw RankError("no unique id from rank 0 within 60 s");
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  anyrUniqueId id;
  std::memcpy(&id, &sh->id, sizeof(id));
  return id;
}

// "rank R" as a whole word in msg.
bool namesRank(const std::string& msg, int r) {
  const std::string key = "rank " + std::to_string(r);
  for (size_t p = msg.find(key); p != std::string::npos; p = msg.find(key, p + 1)) {
    const size_t e = p + key.size();
    if (e == msg.size() || !std::isdigit(static_cast<unsigned char>(msg[e]))) return true;
  }
  return false;
}

// One all-reduce of small-integer data, checked exactly on this rank; returns wrong elements.
unsigned long long checkedAllReduce(anyrComm_t comm, int rank, int n, anyrDataType_t dt,
                                    uint64_t count, uint32_t seed, cudaStream_t s) {
  const size_t bytes = count * data::dtypeBytes(dt);
  void* in = deviceAlloc<void>(bytes);
  void* out = deviceAlloc<void>(bytes);
  unsigned long long* dWrong = deviceAlloc<unsigned long long>();
  R_CUDA(cudaMemsetAsync(dWrong, 0, sizeof(*dWrong), s));
  R_CUDA(data::fillInput(dt, in, count, rank, seed, data::kSmallInts, s));
  R_CUDA(cudaMemsetAsync(out, 0xff, bytes, s));
  R_ANYR(anyrAllReduce(in, out, count, dt, anyrSum, comm, s), comm);
  R_CUDA(data::countMismatches(dt, out, count, n, seed, data::kSmallInts, dWrong, s));
  unsigned long long wrong = 0;
  R_CUDA(cudaMemcpyAsync(&wrong, dWrong, sizeof(wrong), cudaMemcpyDeviceToHost, s));
  R_CUDA(waitStream(s, 30));
  R_CUDA(cudaFree(in));
  R_CUDA(cudaFree(out));
  R_CUDA(cudaFree(dWrong));
  return wrong;
}

// anyrCommDestroy of a communicator that failed (its result is not the subject), bounded: 1 and
// a "FAIL destroy took" line where it took longer than timeoutMs and 5 s, else 0.
int destroyWithinBound(anyrComm_t comm, int timeoutMs, const Report& report) {
  const auto t0 = Clock::now();
  anyrCommDestroy(comm);
  const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
  if (sec <= timeoutMs / 1000.0 + 5.0) return 0;
  report("FAIL destroy took " + std::to_string(sec) + " s\n");
  return 1;
}

// ---- startup self-test --------------------------------------------------------------------

TEST(ReliabilityGpu, SelfTestPassesAndReportsItsCost) {
  REQUIRE_GPU();
  resetShared();
  auto results =
      runRanksCatching(2, 180, [&](int rank, int n, const anyrUniqueId& id, const Report& report) {
        int failures = 0;
        auto t0 = Clock::now();
        anyrComm_t comm = initComm(rank, n, id, 10000);
        const double initMs = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        nlohmann::json j = explainJson(comm);
        if (!j.contains("selfTest") || !j["selfTest"].value("ran", false)) {
          ++failures;
          report("FAIL the self-test did not run: " + j.dump() + "\n");
        } else {
          for (auto& [name, verdict] : j["selfTest"]["results"].items()) {
            const std::string v = verdict.get<std::string>();
            if (v != "passed" && v.rfind("not run", 0) != 0) {
              ++failures;
              report("FAIL self-test of " + name + " on healthy hardware: " + v + "\n");
            }
          }
          std::ostringstream os;
          os << "NOTE rank " << rank << ": self-test " << j["selfTest"]["ms"].get<double>()
             << " ms of a " << initMs << " ms init; " << j["selfTest"]["results"].dump() << "\n";
          report(os.str());
        }
        anyrCommDestroy(comm);
        // ANYR_SELFTEST=0 on rank 0 skips it on every rank (rank 0's value decides).
        if (rank == 0) setenv("ANYR_SELFTEST", "0", 1);
        anyrUniqueId id2 = shareNewId(rank, 1);
        t0 = Clock::now();
        comm = initComm(rank, n, id2, 10000);
        const double offMs = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        j = explainJson(comm);
        if (j["selfTest"].value("ran", true)) {
          ++failures;
          report("FAIL ANYR_SELFTEST=0 on rank 0 did not skip the self-test: " +
                 j["selfTest"].dump() + "\n");
        }
        report("NOTE rank " + std::to_string(rank) + ": init without self-test " +
               std::to_string(offMs) + " ms\n");
        anyrCommDestroy(comm);
        return failures ? 4 : 0;
      });
  expectRanksExitedZero(results);
  for (auto& r : results) std::printf("[ info ] %s", r.message.c_str());
}

TEST(ReliabilityGpu, SelfTestCatchesACorruptPeerMappingOnEveryRank) {
  REQUIRE_GPU();
  resetShared();
  auto results =
      runRanksCatching(2, 240, [&](int rank, int n, const anyrUniqueId& id, const Report& report) {
        // Every rank sets the same value; only rank 1 corrupts its view of rank 0's workspace.
        setenv("ANYR_FAULT_INJECT", "corrupt-peer:1", 1);
        int failures = 0;
        auto t0 = Clock::now();
        anyrComm_t comm = initComm(rank, n, id, 10000);
        const double initMs = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        nlohmann::json j = explainJson(comm);
        for (const char* algo : {"oneshot-push", "oneshot-pull", "twoshot", "twoshot-push"}) {
          const auto& a = j["admission"][algo];
          const std::string reason = a.value("reason", "");
          if (a.value("admitted", true) ||
              reason.find("self-test failed on rank") == std::string::npos) {
            ++failures;
            report(std::string("FAIL ") + algo + " not disabled by the self-test: " + a.dump() +
                   "\n");
          } else {
            report(std::string("NOTE rank ") + std::to_string(rank) + " " + algo + ": " + reason +
                   "\n");
          }
        }
        for (const char* fused :
             {"fused-oneshot-push", "fused-twoshot-push", "fused-oneshot-pull", "fused-twoshot"}) {
          const std::string v = j["selfTest"]["results"].value(fused, std::string("missing"));
          if (v == "passed" || v == "missing") {
            ++failures;
            report(std::string("FAIL ") + fused + " still enabled: " + v + "\n");
          }
        }
        cudaStream_t s = nonBlockingStream();
        anyrAlgo_t chosen = anyrAlgoAuto;
        R_ANYR(anyrCommQueryAlgorithm(comm, 1024, anyrBfloat16, &chosen), comm);
        // The fallback is a path that does not read the corrupted mapping: the host-memory
        // transport (whose own self-test must then have passed) or, in the end, NCCL.
        if (chosen == anyrAlgoHostOneShot || chosen == anyrAlgoHostTwoShot) {
          const std::string v =
              j["selfTest"]["results"].value(anyrAlgoName(chosen), std::string("missing"));
          if (v != "passed") {
            ++failures;
            report(std::string("FAIL fallback ") + anyrAlgoName(chosen) + " self-test: " + v +
                   "\n");
          }
        } else if (chosen != anyrAlgoNccl) {
          ++failures;
          report(std::string("FAIL expected the host-memory or NCCL fallback, the choice is ") +
                 anyrAlgoName(chosen) + "\n");
        }
        report(std::string("NOTE rank ") + std::to_string(rank) + " falls back to " +
               anyrAlgoName(chosen) + "\n");
        // The communicator still computes exact results, through the fallback.
        uint32_t seed = 77;
        for (anyrDataType_t dt : {anyrFloat32, anyrFloat16, anyrBfloat16}) {
          for (uint64_t count : {1ull, 1000ull, 65537ull, 3000000ull}) {
            unsigned long long wrong = checkedAllReduce(comm, rank, n, dt, count, ++seed, s);
            if (wrong) {
              ++failures;
              report("FAIL fallback all-reduce " + std::string(data::dtypeName(dt)) +
                     " n=" + std::to_string(count) + ": " + std::to_string(wrong) + " wrong\n");
            }
          }
        }
        // The fused op too (it composes the NCCL all-reduce with the standalone epilogue).
        {
          const int tokens = 8, hidden = 1024;
          const uint64_t count = static_cast<uint64_t>(tokens) * hidden;
          void *partial, *resid, *out, *weight, *norm;
          unsigned long long* dWrong;
          R_CUDA(cudaMalloc(&partial, count * 2));
          R_CUDA(cudaMalloc(&resid, count * 2));
          R_CUDA(cudaMalloc(&out, count * 2));
          R_CUDA(cudaMalloc(&norm, count * 2));
          R_CUDA(cudaMalloc(&weight, hidden * 2));
          R_CUDA(cudaMalloc(&dWrong, 8));
          R_CUDA(cudaMemsetAsync(dWrong, 0, 8, s));
          R_CUDA(data::fillInput(anyrBfloat16, partial, count, rank, 5, data::kSmallInts, s));
          R_CUDA(data::fillInput(anyrBfloat16, resid, count, 100, 6, data::kSmallInts, s));
          R_CUDA(data::fillInput(anyrBfloat16, weight, hidden, 101, 7, data::kSmallInts, s));
          R_CUDA(cudaMemsetAsync(out, 0xff, count * 2, s));
          R_ANYR(anyrAllReduceAddRmsNorm(partial, resid, out, weight, 1e-6f, norm, tokens, hidden,
                                         anyrBfloat16, nullptr, comm, s),
                 comm);
          R_CUDA(
              reltest::countResidualMismatches(anyrBfloat16, out, count, n, 5, 100, 6, dWrong, s));
          unsigned long long wrong = 0;
          R_CUDA(cudaMemcpyAsync(&wrong, dWrong, 8, cudaMemcpyDeviceToHost, s));
          R_CUDA(waitStream(s, 30));
          if (wrong) {
            ++failures;
            report("FAIL fallback fused op: " + std::to_string(wrong) +
                   " wrong residual elements\n");
          }
        }
        report("NOTE rank " + std::to_string(rank) + ": init with the injected fault took " +
               std::to_string(initMs) + " ms\n");
        return releaseRank(comm, nullptr, {}, failures);
      });
  expectRanksExitedZero(results);
  for (auto& r : results) std::printf("[ info ] %s", r.message.c_str());
}

// ---- kill -9 one rank ---------------------------------------------------------------------

TEST(ReliabilityGpu, KillOneRankSurvivorsNameItWithinTimeout) {
  REQUIRE_GPU();
  const int trials = envInt("ANYR_TEST_KILL_TRIALS", 3);
  const int n = 2;
  const int timeoutMs = 2000;
  double worstSec = 0;
  int passed = 0;
  const anyrAlgo_t cycle[] = {anyrAlgoAuto, anyrAlgoOneShotPush, anyrAlgoOneShotPull,
                              anyrAlgoTwoShot, anyrAlgoTwoShotPush};
  for (int trial = 0; trial < trials; ++trial) {
    resetShared();
    const int victim = trial % n;
    const int killAt = 20 + (trial * 37) % 200;
    auto results = runRanksCatching(
        n, 90, [&](int rank, int nr, const anyrUniqueId& id, const Report& report) {
          Shared* sh = sharedArea();
          // NCCL off: only anyreduce's bounded kernels run (NCCL's own kernels have no deadline;
          // see docs/RELIABILITY.md).
          anyrComm_t comm = initComm(rank, nr, id, timeoutMs, 0);
          cudaStream_t s = nonBlockingStream();
          void* buf = deviceAlloc<void>(4 << 20);
          R_CUDA(cudaMemset(buf, 0, 4 << 20));
          // The algorithms this communicator admits (all of them on healthy hardware).
          std::vector<anyrAlgo_t> algos;
          for (anyrAlgo_t a : cycle) {
            if (anyrCommSetAlgorithm(comm, a) == anyrSuccess) algos.push_back(a);
          }
          for (int i = 0;; ++i) {
            const anyrAlgo_t algo = algos[static_cast<size_t>(i) % algos.size()];
            const size_t count = 1024ull << (i % 10);  // 2 KiB .. 1 MiB of bf16
            anyrResult_t r = anyrCommSetAlgorithm(comm, algo);
            if (r == anyrSuccess)
              r = anyrAllReduce(buf, buf, count, anyrBfloat16, anyrSum, comm, s);
            if (rank == victim && i == killAt) {
              // Mid-loop, with this call possibly in flight on every rank.
              sh->killNs.store(nowNs());
              raise(SIGKILL);
            }
            cudaError_t ce = cudaSuccess;
            if (r == anyrSuccess) {
              ce = waitStream(s, timeoutMs / 1000.0 + 30);
              if (ce == cudaErrorTimeout) {
                report("FAIL iteration " + std::to_string(i) + ": the stream did not finish\n");
                return 5;
              }
              anyrResult_t async = anyrSuccess;
              R_ANYR(anyrCommGetAsyncError(comm, &async), comm);
              r = async;
            }
            if (r == anyrSuccess && ce == cudaSuccess) {
              if (i > killAt + 100000) {
                report("FAIL no error after the kill\n");
                return 6;
              }
              continue;
            }
            // The failure: name, latency, and the next call.
            const long long killNs = sh->killNs.load();
            const double sec = killNs ? (nowNs() - killNs) / 1e9 : -1;
            const std::string msg = anyrGetLastError(comm);
            int failures = 0;
            if (ce != cudaSuccess) {
              ++failures;
              report(std::string("FAIL CUDA error instead of a communicator error: ") +
                     cudaGetErrorString(ce) + "\n");
            }
            if (!namesRank(msg, victim)) {
              ++failures;
              report(std::string("FAIL the error does not name rank ") + std::to_string(victim) +
                     ": " + anyrGetErrorString(r) + ": " + msg + "\n");
            }
            if (killNs == 0 || sec > timeoutMs / 1000.0 + 5.0) {
              ++failures;
              report("FAIL detected " + std::to_string(sec) + " s after the kill (limit " +
                     std::to_string(timeoutMs / 1000.0 + 5.0) + " s)\n");
            }
            anyrResult_t next = anyrAllReduce(buf, buf, 1024, anyrBfloat16, anyrSum, comm, s);
            if (next == anyrSuccess || !namesRank(anyrGetLastError(comm), victim)) {
              ++failures;
              report(std::string("FAIL the next call: ") + anyrGetErrorString(next) + ": " +
                     anyrGetLastError(comm) + "\n");
            }
            failures += destroyWithinBound(comm, timeoutMs, report);
            report("LATENCY " + std::to_string(sec) + "\nNOTE " + msg + "\n");
            return failures ? 4 : 0;
          }
        });
    bool ok = true;
    std::string why;
    for (const auto& r : results) {
      if (r.timedOut) {
        ok = false;
        why += "rank " + std::to_string(r.rank) + " hung (killed at the deadline); ";
      } else if (r.rank == victim) {
        if (r.signal != SIGKILL) {
          ok = false;
          why += "victim did not die by SIGKILL: " + r.message + "; ";
        }
      } else if (r.exitCode != 0) {
        ok = false;
        why += "survivor rank " + std::to_string(r.rank) + " exit " + std::to_string(r.exitCode) +
               ": " + r.message + "; ";
      } else {
        const size_t p = r.message.find("LATENCY ");
        if (p != std::string::npos)
          worstSec = std::max(worstSec, std::atof(r.message.c_str() + p + 8));
        if (trial == 0) std::printf("[ info ] trial 0 survivor: %s", r.message.c_str());
      }
    }
    EXPECT_TRUE(ok) << "trial " << trial << " (victim rank " << victim << ", killed at call "
                    << killAt << "): " << why;
    if (ok) ++passed;
  }
  std::printf(
      "[ info ] kill -9: %d of %d trials passed; worst detection %.2f s after the kill "
      "(timeout %.1f s, limit %.1f s)\n",
      passed, trials, worstSec, timeoutMs / 1000.0, timeoutMs / 1000.0 + 5.0);
  EXPECT_EQ(passed, trials);
}

// ---- a rank that skips a call ---------------------------------------------------------------

TEST(ReliabilityGpu, SkippedCallGivesBoundedErrorNamingTheRank) {
  REQUIRE_GPU();
  const int timeoutMs = 1500;
  // anyrNumAlgos stands for the fused op (one-shot push fused kernel).
  for (int which : {static_cast<int>(anyrAlgoOneShotPush), static_cast<int>(anyrAlgoOneShotPull),
                    static_cast<int>(anyrAlgoTwoShot), static_cast<int>(anyrAlgoTwoShotPush),
                    static_cast<int>(anyrNumAlgos)}) {
    const bool fused = which == anyrNumAlgos;
    const anyrAlgo_t algo = fused ? anyrAlgoOneShotPush : static_cast<anyrAlgo_t>(which);
    const std::string label = fused ? "fused oneshot-push" : anyrAlgoName(algo);
    resetShared();
    auto results = runRanksCatching(
        2, 120, [&](int rank, int n, const anyrUniqueId& id, const Report& report) {
          anyrComm_t comm = initComm(rank, n, id, timeoutMs, 0);
          cudaStream_t s = nonBlockingStream();
          R_ANYR(anyrCommSetAlgorithm(comm, algo), comm);
          const SkippableCall call(fused, comm, s);
          R_ANYR(call(), comm);
          R_CUDA(waitStream(s, 30));
          int failures = 0;
          if (rank == 0) {
            auto t0 = Clock::now();
            anyrResult_t r = call();
            cudaError_t ce = waitStream(s, timeoutMs / 1000.0 + 5.0);
            const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
            anyrResult_t async = anyrSuccess;
            if (r == anyrSuccess) anyrCommGetAsyncError(comm, &async);
            const std::string msg = anyrGetLastError(comm);
            if (ce != cudaSuccess || async != anyrTimeout || !namesRank(msg, 1) ||
                sec > timeoutMs / 1000.0 + 5.0) {
              ++failures;
              report("FAIL " + label + ": stream " + cudaGetErrorString(ce) + ", " +
                     anyrGetErrorString(async) + " after " + std::to_string(sec) + " s: " + msg +
                     "\n");
            } else {
              report("NOTE " + label + ": " + std::to_string(sec) + " s: " + msg + "\n");
            }
            sharedArea()->flag.store(1);
          } else {
            // Skip the call; once rank 0 has its error, leave like an application that was told
            // the communicator failed: abort, then destroy (bounded).
            auto deadline = Clock::now() + std::chrono::seconds(30);
            while (sharedArea()->flag.load() == 0 && Clock::now() < deadline) {
              std::this_thread::sleep_for(std::chrono::milliseconds(1));
            }
            anyrCommAbort(comm);
          }
          failures += destroyWithinBound(comm, timeoutMs, report);
          return failures ? 4 : 0;
        });
    std::string failures = launch::describeFailures(results);
    EXPECT_TRUE(failures.empty()) << label << ": " << failures;
    std::printf("[ info ] %s", results[0].message.c_str());
  }
}

// ---- abort from another thread, then a new communicator -------------------------------------

TEST(ReliabilityGpu, AbortReleasesAWaitingKernelThenANewCommWorks) {
  REQUIRE_GPU();
  resetShared();
  auto results =
      runRanksCatching(2, 180, [&](int rank, int n, const anyrUniqueId& id, const Report& report) {
        int failures = 0;
        anyrComm_t comm = initComm(rank, n, id, 60000);  // only the abort can end the wait
        cudaStream_t s = nonBlockingStream();
        void* buf = deviceAlloc<void>(1 << 20);
        R_CUDA(cudaMemset(buf, 0, 1 << 20));
        R_ANYR(anyrCommSetAlgorithm(comm, anyrAlgoTwoShot), comm);
        if (rank == 0) {
          failures += abortAWaitingAllReduce(comm, buf, s, report);
          anyrResult_t next = anyrAllReduce(buf, buf, 1024, anyrBfloat16, anyrSum, comm, s);
          if (next != anyrAborted) {
            ++failures;
            report(std::string("FAIL a call after abort returned ") + anyrGetErrorString(next) +
                   "\n");
          }
          sharedArea()->flag.store(1);
        } else {
          // Never calls; aborts its side once rank 0 is released.
          auto deadline = Clock::now() + std::chrono::seconds(30);
          while (sharedArea()->flag.load() == 0 && Clock::now() < deadline) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
          R_ANYR(anyrCommAbort(comm), comm);
        }
        auto t0 = Clock::now();
        anyrCommDestroy(comm);
        const double destroySec = std::chrono::duration<double>(Clock::now() - t0).count();
        if (destroySec > 5) {
          ++failures;
          report("FAIL destroying the aborted communicator took " + std::to_string(destroySec) +
                 " s\n");
        }
        // A new communicator in the same processes, every algorithm exact.
        anyrUniqueId id2 = shareNewId(rank, 1);
        comm = initComm(rank, n, id2, 20000);
        uint32_t seed = 900;
        for (anyrAlgo_t a : {anyrAlgoAuto, anyrAlgoOneShotPush, anyrAlgoOneShotPull,
                             anyrAlgoTwoShot, anyrAlgoTwoShotPush, anyrAlgoNccl}) {
          if (anyrCommSetAlgorithm(comm, a) != anyrSuccess) continue;
          for (uint64_t count : {1000ull, 300000ull}) {
            unsigned long long wrong =
                checkedAllReduce(comm, rank, n, anyrBfloat16, count, ++seed, s);
            if (wrong) {
              ++failures;
              report(std::string("FAIL new communicator, ") + anyrAlgoName(a) +
                     " n=" + std::to_string(count) + ": " + std::to_string(wrong) + " wrong\n");
            }
          }
        }
        return releaseRank(comm, nullptr, {}, failures);
      });
  expectRanksExitedZero(results);
}

// ---- stress -----------------------------------------------------------------------------------

// One rank of the stress run. Every rank draws the same random sequence (same seed), so all
// ranks make the same calls. Device counters accumulate; they are read every kSyncEvery calls.
int stressRank(int rank, int n, const anyrUniqueId& id, const Report& report, int calls) {
  anyrComm_t comm = initComm(rank, n, id, 20000);
  cudaStream_t s = nonBlockingStream();
  std::vector<anyrAlgo_t> algos = {anyrAlgoAuto};
  for (anyrAlgo_t a : {anyrAlgoOneShotPush, anyrAlgoOneShotPull, anyrAlgoTwoShot,
                       anyrAlgoTwoShotPush, anyrAlgoNccl}) {
    if (anyrCommSetAlgorithm(comm, a) == anyrSuccess) algos.push_back(a);
  }
  R_ANYR(anyrCommSetAlgorithm(comm, anyrAlgoAuto), comm);
  constexpr uint64_t kMaxCount = 1ull << 20;  // elements
  constexpr uint64_t kGuard = 256;            // guard bytes on each side of every output
  const uint64_t bufBytes = kMaxCount * 4 + 4 * kGuard;
  const int kMaxHidden = 8192, kMaxTokens = 64;
  char *inBuf, *outBuf, *residBuf, *normBuf, *weight;
  R_CUDA(cudaMalloc(&inBuf, bufBytes));
  R_CUDA(cudaMalloc(&outBuf, bufBytes));
  R_CUDA(cudaMalloc(&residBuf, bufBytes));
  R_CUDA(cudaMalloc(&normBuf, bufBytes));
  R_CUDA(cudaMalloc(&weight, kMaxHidden * 2));
  enum { kWrong, kGuardHit, kInput, kResid, kHash, kNumCounters };
  unsigned long long* dc =
      deviceAlloc<unsigned long long>(sizeof(unsigned long long) * kNumCounters);
  R_CUDA(cudaMemsetAsync(dc, 0, sizeof(unsigned long long) * kNumCounters, s));
  auto guard = [&](char* p, uint64_t bytes) {  // canaries just outside [p, p + bytes)
    R_CUDA(cudaMemsetAsync(p - kGuard, reltest::kGuardByte, kGuard, s));
    R_CUDA(cudaMemsetAsync(p + bytes, reltest::kGuardByte, kGuard, s));
  };
  auto checkGuard = [&](char* p, uint64_t bytes) {
    R_CUDA(reltest::countBytesNot(p - kGuard, kGuard, reltest::kGuardByte, dc + kGuardHit, s));
    R_CUDA(reltest::countBytesNot(p + bytes, kGuard, reltest::kGuardByte, dc + kGuardHit, s));
  };
  std::mt19937_64 rng(20261129);
  std::map<std::string, int> histogram;
  constexpr int kSyncEvery = 512;
  int failures = 0;
  anyrAlgo_t current = anyrAlgoAuto;
  for (int i = 0; i < calls && failures == 0; ++i) {
    const uint32_t seed = static_cast<uint32_t>(i) * 2654435761u + 1;
    const bool fusedOp = rng() % 4 == 0;
    const anyrAlgo_t algo = algos[rng() % algos.size()];
    if (algo != current) {
      R_ANYR(anyrCommSetAlgorithm(comm, algo), comm);
      current = algo;
    }
    if (!fusedOp) {
      const anyrDataType_t dt = static_cast<anyrDataType_t>(rng() % 3);
      const int bits = static_cast<int>(rng() % 21);
      const uint64_t count = 1 + rng() % (1ull << bits);
      const bool inPlace = rng() % 2 == 0;
      const uint64_t shift = rng() % 4 == 0 ? 1 : 0;  // one element off 16-byte alignment
      const size_t es = data::dtypeBytes(dt);
      const uint64_t bytes = count * es;
      char* src = inBuf + 2 * kGuard + shift * es;
      char* dst = inPlace ? src : outBuf + 2 * kGuard + shift * es;
      R_CUDA(data::fillInput(dt, src, count, rank, seed, data::kSmallInts, s));
      if (!inPlace) R_CUDA(cudaMemsetAsync(dst, 0xff, bytes, s));
      guard(dst, bytes);
      if (!inPlace) guard(src, bytes);
      R_ANYR(anyrAllReduce(src, dst, count, dt, anyrSum, comm, s), comm);
      R_CUDA(data::countMismatches(dt, dst, count, n, seed, data::kSmallInts, dc + kWrong, s));
      checkGuard(dst, bytes);
      if (!inPlace) {
        checkGuard(src, bytes);
        R_CUDA(
            data::countInputChanges(dt, src, count, rank, seed, data::kSmallInts, dc + kInput, s));
      }
      R_CUDA(data::hashBytes(dst, bytes, dc + kHash, s));
      ++histogram[std::string("allreduce/") + anyrAlgoName(algo)];
    } else {
      const anyrDataType_t dt = rng() % 2 ? anyrBfloat16 : anyrFloat16;
      const int hidden = 8 * static_cast<int>(16 + rng() % (kMaxHidden / 8 - 16 + 1));
      const int tokens = 1 + static_cast<int>(rng() % kMaxTokens);
      const bool inPlace = rng() % 2 == 0;
      const uint64_t count = static_cast<uint64_t>(tokens) * hidden;
      const uint64_t bytes = count * 2;
      char* partial = inBuf + 2 * kGuard;
      char* residIn = residBuf + 2 * kGuard;
      char* residOut = inPlace ? residIn : outBuf + 2 * kGuard;
      char* norm = normBuf + 2 * kGuard;
      R_CUDA(data::fillInput(dt, partial, count, rank, seed, data::kSmallInts, s));
      R_CUDA(data::fillInput(dt, residIn, count, 100, seed ^ 0x5151u, data::kSmallInts, s));
      R_CUDA(data::fillInput(dt, weight, hidden, 101, seed, data::kSmallInts, s));
      if (!inPlace) R_CUDA(cudaMemsetAsync(residOut, 0xff, bytes, s));
      R_CUDA(cudaMemsetAsync(norm, 0xff, bytes, s));
      guard(residOut, bytes);
      guard(norm, bytes);
      R_ANYR(anyrAllReduceAddRmsNorm(partial, residIn, residOut, weight, 1e-6f, norm, tokens,
                                     hidden, dt, nullptr, comm, s),
             comm);
      R_CUDA(reltest::countResidualMismatches(dt, residOut, count, n, seed, 100, seed ^ 0x5151u,
                                              dc + kResid, s));
      checkGuard(residOut, bytes);
      checkGuard(norm, bytes);
      // normOut rounds, so it is not compared with a reference here (tests of the fused op
      // do that); it must be bit-identical on every rank: it enters the cross-rank hash.
      R_CUDA(data::hashBytes(norm, bytes, dc + kHash, s));
      R_CUDA(data::hashBytes(residOut, bytes, dc + kHash, s));
      ++histogram[std::string("fused/") + anyrAlgoName(algo)];
    }
    if ((i + 1) % kSyncEvery == 0 || i + 1 == calls) {
      unsigned long long c[kNumCounters];
      R_CUDA(cudaMemcpyAsync(c, dc, sizeof(c), cudaMemcpyDeviceToHost, s));
      cudaError_t e = waitStream(s, 60);
      if (e != cudaSuccess) {
        report("FAIL stream after call " + std::to_string(i) + ": " + cudaGetErrorString(e) + "\n");
        return 5;
      }
      if (c[kWrong] || c[kGuardHit] || c[kInput] || c[kResid]) {
        ++failures;
        report("FAIL by call " + std::to_string(i) + ": " + std::to_string(c[kWrong]) +
               " wrong all-reduce elements, " + std::to_string(c[kResid]) +
               " wrong residual elements, " + std::to_string(c[kGuardHit]) +
               " guard bytes overwritten, " + std::to_string(c[kInput]) +
               " input elements changed\n");
      }
      if (i + 1 == calls) report("HASH " + std::to_string(c[kHash]) + "\n");
    }
  }
  std::ostringstream os;
  os << "NOTE rank " << rank << ": " << calls << " calls:";
  for (auto& [k, v] : histogram) os << " " << k << "=" << v;
  report(os.str() + "\n");
  return releaseRank(comm, nullptr, {}, failures);
}

TEST(ReliabilityGpu, StressRandomCallsWithCanariesBitIdentical) {
  REQUIRE_GPU();
  const int calls = envInt("ANYR_TEST_STRESS_CALLS", 3000);
  const double limitSec = 120 + calls * 0.01;
  auto t0 = Clock::now();
  auto results = runRanksCatching(
      2, limitSec, [&](int rank, int n, const anyrUniqueId& id, const Report& report) {
        return stressRank(rank, n, id, report, calls);
      });
  const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
  expectRanksExitedZero(results);
  std::string hash0;
  for (const auto& r : results) {
    const size_t p = r.message.find("HASH ");
    ASSERT_NE(p, std::string::npos) << "rank " << r.rank << " reported no hash: " << r.message;
    const std::string h = r.message.substr(p + 5, r.message.find('\n', p) - p - 5);
    if (hash0.empty()) hash0 = h;
    EXPECT_EQ(h, hash0) << "rank " << r.rank << "'s outputs differ from rank 0's";
    std::printf("[ info ] %s", r.message.c_str());
  }
  std::printf("[ info ] stress: %d calls on every rank in %.1f s, zero corruption, hashes equal\n",
              calls, sec);
}

// ---- create / destroy ---------------------------------------------------------------------

TEST(ReliabilityGpu, CreateDestroy200TimesWithoutLeakingThenAbortAndRecreate) {
  REQUIRE_GPU();
  if (gpuCount() < 2) GTEST_SKIP() << "needs 2 GPUs (memory accounting per GPU)";
  resetShared();
  const int cycles = envInt("ANYR_TEST_CYCLES", 200);
  auto results =
      runRanksCatching(2, 900, [&](int rank, int n, const anyrUniqueId& id, const Report& report) {
        int failures = 0;
        int round = 0;
        cudaStream_t s;
        R_CUDA(cudaSetDevice(rank));
        R_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        // One cycle: create (NCCL off: NCCL's own resources are NCCL's; the NCCL path is covered by
        // the final communicator), one exact all-reduce, destroy.
        auto cycle = [&](const anyrUniqueId& cid) {
          anyrComm_t comm = initComm(rank, n, cid, 10000, 0);
          unsigned long long wrong =
              checkedAllReduce(comm, rank, n, anyrBfloat16, 100000, 31u + round, s);
          if (wrong) {
            ++failures;
            report("FAIL cycle " + std::to_string(round) + ": " + std::to_string(wrong) +
                   " wrong\n");
          }
          R_ANYR(anyrCommDestroy(comm), nullptr);
        };
        cycle(id);  // warm-up: context, modules, allocator pools
        for (int w = 0; w < 2; ++w) cycle(shareNewId(rank, ++round));
        R_CUDA(cudaDeviceSynchronize());
        size_t free0 = 0, total = 0;
        R_CUDA(cudaMemGetInfo(&free0, &total));
        auto t0 = Clock::now();
        for (int c = 0; c < cycles && failures == 0; ++c) cycle(shareNewId(rank, ++round));
        const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
        R_CUDA(cudaDeviceSynchronize());
        size_t free1 = 0;
        R_CUDA(cudaMemGetInfo(&free1, &total));
        const long long leaked = static_cast<long long>(free0) - static_cast<long long>(free1);
        // 8 MiB: less than one workspace (several MiB of staging alone) and than 200 x 64 KiB, so
        // any per-cycle leak of a workspace, a mapping's backing or a 64 KiB buffer fails; more
        // than the driver's allocation granularity (2 MiB), which may keep a chunk cached.
        const long long kTolerance = 8ll << 20;
        if (leaked > kTolerance) {
          ++failures;
          report("FAIL " + std::to_string(cycles) + " cycles leaked " + std::to_string(leaked) +
                 " bytes of device memory (tolerance " + std::to_string(kTolerance) + ")\n");
        }
        report("NOTE rank " + std::to_string(rank) + ": " + std::to_string(cycles) + " cycles in " +
               std::to_string(sec) + " s, device memory change " + std::to_string(-leaked) +
               " bytes\n");
        // An aborted communicator (with NCCL) destroyed, and a new one created.
        anyrComm_t comm = initComm(rank, n, shareNewId(rank, ++round), 10000, 1);
        R_ANYR(anyrCommAbort(comm), comm);
        if (anyrAllReduce(nullptr, nullptr, 0, anyrBfloat16, anyrSum, comm, s) != anyrAborted) {
          ++failures;
          report("FAIL a call on the aborted communicator did not return anyrAborted\n");
        }
        anyrCommDestroy(comm);
        comm = initComm(rank, n, shareNewId(rank, ++round), 10000, 1);
        for (anyrAlgo_t a : {anyrAlgoAuto, anyrAlgoNccl}) {
          R_ANYR(anyrCommSetAlgorithm(comm, a), comm);
          unsigned long long wrong = checkedAllReduce(comm, rank, n, anyrFloat32, 3000000, 5, s);
          if (wrong) {
            ++failures;
            report(std::string("FAIL after abort + recreate, ") + anyrAlgoName(a) + ": " +
                   std::to_string(wrong) + " wrong\n");
          }
        }
        return releaseRank(comm, nullptr, {}, failures);
      });
  expectRanksExitedZero(results);
  for (auto& r : results) std::printf("[ info ] %s", r.message.c_str());
}

}  // namespace
}  // namespace anyr
