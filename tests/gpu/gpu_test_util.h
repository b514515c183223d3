// Helpers shared by the multi-process GPU tests.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <initializer_list>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "anyreduce/anyreduce.h"
#include "common/data.h"
#include "common/launcher.h"

namespace anyr {

// Visible GPUs, asked once in a child process (the test process must stay CUDA-free: it forks
// the ranks); `why` gets what CUDA said ("ok", or its error).
inline int gpuCount(std::string* why = nullptr) {
  static int n = -1;
  static std::string said;
  if (n < 0) n = launch::countGpus(&said);
  if (why) *why = said;
  return n;
}

// Skips a test where no GPU is visible, saying what CUDA said. Where the NVIDIA device nodes
// exist but CUDA finds no GPU (a broken driver, a mismatched runtime), that is a failure, not a
// skip: the GPU suite must not turn into skips on a GPU machine.
#define REQUIRE_GPU()                                                     \
  do {                                                                    \
    std::string why_;                                                     \
    if (gpuCount(&why_) == 0) {                                           \
      if (::access("/dev/nvidiactl", F_OK) == 0) {                        \
        FAIL() << "/dev/nvidiactl exists but CUDA sees no GPU: " << why_; \
      }                                                                   \
      GTEST_SKIP() << "no CUDA GPU visible (" << why_ << ")";             \
    }                                                                     \
  } while (0)

// Fails the rank (exit code 3) with a message when a call fails.
struct RankError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
#define R_CUDA(expr)                                                                            \
  do {                                                                                          \
    cudaError_t e_ = (expr);                                                                    \
    if (e_ != cudaSuccess) throw RankError(std::string(#expr) + ": " + cudaGetErrorString(e_)); \
  } while (0)
#define R_ANYR(expr, comm)                                                        \
  do {                                                                            \
    anyrResult_t r_ = (expr);                                                     \
    if (r_ != anyrSuccess) {                                                      \
      throw RankError(std::string(#expr) + ": " + anyrGetErrorString(r_) + ": " + \
                      anyrGetLastError(comm));                                    \
    }                                                                             \
  } while (0)

// cudaMalloc of `bytes` (one T by default), as a T*.
template <typename T>
inline T* deviceAlloc(size_t bytes = sizeof(T)) {
  void* p = nullptr;
  R_CUDA(cudaMalloc(&p, bytes));
  return static_cast<T*>(p);
}

// A new stream that does not synchronize with the legacy default stream.
inline cudaStream_t nonBlockingStream() {
  cudaStream_t s;
  R_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

// Puts the calling rank on GPU rank % (visible GPUs): one per GPU, or shared when there are
// fewer GPUs than ranks.
inline void useRankGpu(int rank) {
  int ngpus = 0;
  R_CUDA(cudaGetDeviceCount(&ngpus));
  R_CUDA(cudaSetDevice(rank % ngpus));
}

// The calling rank's communicator, on its GPU (useRankGpu): the default config with every wait
// bounded by timeoutMs, then whatever `configure` sets.
inline anyrComm_t initRankComm(int rank, int n, const anyrUniqueId& id, int timeoutMs,
                               const std::function<void(anyrConfig_t&)>& configure = {}) {
  useRankGpu(rank);
  anyrConfig_t cfg = ANYR_CONFIG_INITIALIZER;
  cfg.timeoutMs = timeoutMs;
  if (configure) configure(cfg);
  anyrComm_t comm = nullptr;
  R_ANYR(anyrCommInitRankConfig(&comm, n, id, rank, &cfg), nullptr);
  return comm;
}

// The communicator's anyrCommExplain text, and the same parsed.
inline std::string explainText(anyrComm_t comm) {
  size_t need = 0;
  R_ANYR(anyrCommExplain(comm, nullptr, 0, &need), comm);
  std::vector<char> buf(need + 1);
  R_ANYR(anyrCommExplain(comm, buf.data(), buf.size(), &need), comm);
  return std::string(buf.data());
}
inline nlohmann::json explainJson(anyrComm_t comm) {
  return nlohmann::json::parse(explainText(comm));
}

// Waits for the stream's work, at most maxSec seconds (cudaErrorTimeout past that).
inline cudaError_t waitStream(cudaStream_t s, double maxSec) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(maxSec);
  while (true) {
    const cudaError_t e = cudaStreamQuery(s);
    if (e != cudaErrorNotReady) return e;
    if (std::chrono::steady_clock::now() > deadline) return cudaErrorTimeout;
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

using Report = std::function<void(const std::string&)>;

// Rank 0's side of an abort test: an all-reduce of 100,000 bf16 elements in `buf` that no peer
// joins, aborted by anyrCommAbort from another thread after 500 ms. The kernel must be released
// (the stream finishes, within 10 s) and the communicator must report anyrAborted; returns 1
// with a FAIL line otherwise, else 0.
inline int abortAWaitingAllReduce(anyrComm_t comm, void* buf, cudaStream_t s,
                                  const Report& report) {
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    anyrCommAbort(comm);
  });
  const auto t0 = std::chrono::steady_clock::now();
  R_ANYR(anyrAllReduce(buf, buf, 100000, anyrBfloat16, anyrSum, comm, s), comm);
  const cudaError_t e = waitStream(s, 20);
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  aborter.join();
  anyrResult_t async = anyrSuccess;
  anyrCommGetAsyncError(comm, &async);
  if (e == cudaSuccess && async == anyrAborted && sec <= 10) return 0;
  report("FAIL abort: stream " + std::string(cudaGetErrorString(e)) + ", state " +
         anyrGetErrorString(async) + ", " + std::to_string(sec) + " s: " + anyrGetLastError(comm) +
         "\n");
  return 1;
}
// Rank 0's side of a missing-peer test: `call` enqueues on `s` a collective that rank 1 never
// joins. The stream must finish (within 30 s: the kernel gives up), and the communicator must
// report anyrTimeout with a message naming rank 1 and, where not empty, `mentions`; where
// boundSec > 0, within boundSec of the call. Returns the failures, each with a FAIL line
// starting with `what`; the message itself goes out as a NOTE line.
inline int expectTimeoutNamingRank1(anyrComm_t comm, cudaStream_t s,
                                    const std::function<anyrResult_t()>& call,
                                    const std::string& what, const std::string& mentions,
                                    double boundSec, const Report& report) {
  int failures = 0;
  const auto t0 = std::chrono::steady_clock::now();
  R_ANYR(call(), comm);
  const cudaError_t e = waitStream(s, 30);
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (e != cudaSuccess) {
    ++failures;
    report("FAIL " + what + ": the stream did not finish: " + cudaGetErrorString(e) + "\n");
  }
  anyrResult_t async = anyrSuccess;
  R_ANYR(anyrCommGetAsyncError(comm, &async), comm);
  const std::string msg = anyrGetLastError(comm);
  if (async != anyrTimeout || msg.find("rank 1") == std::string::npos ||
      (!mentions.empty() && msg.find(mentions) == std::string::npos)) {
    ++failures;
    report("FAIL " + what + ": expected a timeout naming rank 1" +
           (mentions.empty() ? std::string() : " and '" + mentions + "'") + ", got " +
           anyrGetErrorString(async) + ": " + msg + "\n");
  }
  if (boundSec > 0 && sec > boundSec) {
    ++failures;
    report("FAIL " + what + ": the wait took " + std::to_string(sec) + " s (bound " +
           std::to_string(boundSec) + " s)\n");
  }
  report("NOTE " + what + ": " + msg + "\n");
  return failures;
}

using RankBody = std::function<int(int rank, int nranks, const anyrUniqueId& id, const Report&)>;

// 1 (and a "FAIL async error" line) when the communicator recorded an asynchronous error, else 0.
inline int asyncErrorFailures(anyrComm_t comm, const Report& report) {
  anyrResult_t async = anyrSuccess;
  R_ANYR(anyrCommGetAsyncError(comm, &async), comm);
  if (async == anyrSuccess) return 0;
  report(std::string("FAIL async error: ") + anyrGetLastError(comm) + "\n");
  return 1;
}

// Runs `body` in n forked ranks (launch::runRanks); an exception thrown by a rank (R_CUDA,
// R_ANYR, or any other) fails that rank with exit code 3 and a "FAIL <what>" line.
inline std::vector<launch::RankResult> runRanksCatching(int n, double timeoutSec,
                                                        const RankBody& body) {
  return launch::runRanks(
      n,
      [&](int rank, int nr, const anyrUniqueId& id, const Report& report) {
        try {
          return body(rank, nr, id, report);
        } catch (const std::exception& e) {
          report(std::string("FAIL ") + e.what() + "\n");
          return 3;
        }
      },
      timeoutSec);
}

// Forces `algo` on the communicator; where it is not admitted here, reports "SKIP <algo>: <why>"
// (the tests' convention for a subject not run, see subjectsNotRun) and returns false.
inline bool forceOrSkip(anyrComm_t comm, anyrAlgo_t algo, const Report& report) {
  if (anyrCommSetAlgorithm(comm, algo) == anyrSuccess) return true;
  report(std::string("SKIP ") + anyrAlgoName(algo) + ": " + anyrGetLastError(comm) + "\n");
  return false;
}

// One automatic choice: anyrCommQueryAlgorithm for `count` bf16 elements must give one of
// `allowed`; 1 and a "FAIL <size> chose <algorithm>" line otherwise, else 0.
inline int expectChoice(anyrComm_t comm, size_t count, const std::string& size,
                        std::initializer_list<anyrAlgo_t> allowed, const Report& report) {
  anyrAlgo_t got = anyrAlgoAuto;
  R_ANYR(anyrCommQueryAlgorithm(comm, count, anyrBfloat16, &got), comm);
  for (anyrAlgo_t a : allowed) {
    if (got == a) return 0;
  }
  report("FAIL " + size + " chose " + anyrAlgoName(got) + "\n");
  return 1;
}

// runRanksCatching of a rank function taking more than the four rank arguments: each rank runs
// body(rank, nranks, id, report, args...).
template <typename Body, typename... Args>
inline std::vector<launch::RankResult> runRanksWith(int n, double timeoutSec, const Body& body,
                                                    const Args&... args) {
  return runRanksCatching(n, timeoutSec,
                          [&](int rank, int nr, const anyrUniqueId& id, const Report& report) {
                            return body(rank, nr, id, report, args...);
                          });
}

// Parent-side verdict on the exit codes alone: every rank exited 0 in time. `context` leads the
// failure message (which case of a loop failed).
inline void expectRanksExitedZero(const std::vector<launch::RankResult>& results,
                                  const std::string& context = "") {
  const std::string failures = launch::describeFailures(results);
  EXPECT_TRUE(failures.empty()) << context << failures;
}

// The end of a rank's body: frees `buffers`, destroys `s` (where not null) and the communicator;
// the rank's exit code, 4 where there were failures, else 0.
inline int releaseRank(anyrComm_t comm, cudaStream_t s, std::initializer_list<void*> buffers,
                       int failures) {
  for (void* p : buffers) R_CUDA(cudaFree(p));
  if (s != nullptr) R_CUDA(cudaStreamDestroy(s));
  R_ANYR(anyrCommDestroy(comm), nullptr);
  return failures ? 4 : 0;
}

// releaseRank, after counting an asynchronous error the communicator recorded as a failure
// (asyncErrorFailures).
inline int finishRank(anyrComm_t comm, cudaStream_t s, std::initializer_list<void*> buffers,
                      int failures, const Report& report) {
  failures += asyncErrorFailures(comm, report);
  return releaseRank(comm, s, buffers, failures);
}

// One anyrAllReduce(src, dst, count, dt, anyrSum) captured on `s`, instantiated (the graph
// itself is destroyed; the caller destroys the executable).
inline cudaGraphExec_t captureAllReduce(const void* src, void* dst, uint64_t count,
                                        anyrDataType_t dt, anyrComm_t comm, cudaStream_t s) {
  cudaGraph_t g;
  cudaGraphExec_t exec = nullptr;
  R_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  R_ANYR(anyrAllReduce(src, dst, count, dt, anyrSum, comm, s), comm);
  R_CUDA(cudaStreamEndCapture(s, &g));
  R_CUDA(cudaGraphInstantiate(&exec, g, 0));
  R_CUDA(cudaGraphDestroy(g));
  return exec;
}

// One call on `s`: the replay of `exec` where there is one (captureAllReduce of the same
// arguments), else anyrAllReduce(src, dst, count, dt, anyrSum) itself.
inline void allReduceOrReplay(cudaGraphExec_t exec, const void* src, void* dst, uint64_t count,
                              anyrDataType_t dt, anyrComm_t comm, cudaStream_t s) {
  if (exec != nullptr) {
    R_CUDA(cudaGraphLaunch(exec, s));
  } else {
    R_ANYR(anyrAllReduce(src, dst, count, dt, anyrSum, comm, s), comm);
  }
}

// The call one rank skips in a skipped-call test, on buffers of its own (left to the process's
// exit): an in-place bf16 all-reduce of 65536 elements of a zeroed 1 MiB buffer, or (fused)
// anyrAllReduceAddRmsNorm of 4 tokens of 1024 from that buffer, with a small-integer weight, its
// output and norm in a second 1 MiB buffer.
struct SkippableCall {
  static constexpr int kTokens = 4, kHidden = 1024;
  SkippableCall(bool fusedOp, anyrComm_t c, cudaStream_t st) : fused(fusedOp), comm(c), s(st) {
    R_CUDA(cudaMemset(buf, 0, 1 << 20));
    R_CUDA(data::fillInput(anyrBfloat16, weight, kHidden, 101, 7, data::kSmallInts, s));
  }
  anyrResult_t operator()() const {
    return fused ? anyrAllReduceAddRmsNorm(buf, nullptr, out, weight, 1e-6f,
                                           static_cast<char*>(out) + (1 << 19), kTokens, kHidden,
                                           anyrBfloat16, nullptr, comm, s)
                 : anyrAllReduce(buf, buf, 65536, anyrBfloat16, anyrSum, comm, s);
  }
  bool fused;
  anyrComm_t comm;
  cudaStream_t s;
  void* buf = deviceAlloc<void>(1 << 20);
  void* out = deviceAlloc<void>(1 << 20);
  void* weight = deviceAlloc<void>(kHidden * 2);
};

using OnComm = std::function<int(anyrComm_t, char*, cudaStream_t)>;

// The shape of a two-rank fault test: each rank opens a communicator (every wait bounded at
// timeoutMs) with a 1 MiB buffer, a stream and `algo` forced; where firstCount > 0 both ranks
// first make one firstCount-element bf16 all-reduce together. Then rank 0 runs `onRank0` (its
// failures count) while the peer sleeps peerSleepMs (staying away from what rank 0 waits on) and
// leaves. Exit code 4 on any failure.
inline int peerFaultRank(int rank, int n, const anyrUniqueId& id, int timeoutMs, anyrAlgo_t algo,
                         uint64_t firstCount, int peerSleepMs, const OnComm& onRank0) {
  anyrComm_t comm = initRankComm(rank, n, id, timeoutMs);
  char* buf = deviceAlloc<char>(1 << 20);
  cudaStream_t s;
  R_CUDA(cudaStreamCreate(&s));
  int failures = 0;
  R_ANYR(anyrCommSetAlgorithm(comm, algo), comm);
  if (firstCount > 0) {
    R_ANYR(anyrAllReduce(buf, buf, firstCount, anyrBfloat16, anyrSum, comm, s), comm);
    R_CUDA(cudaStreamSynchronize(s));
  }
  if (rank == 0) {
    failures += onRank0(comm, buf, s);
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(peerSleepMs));
  }
  anyrCommDestroy(comm);
  return failures ? 4 : 0;
}

// A missing-peer rank body on two ranks (peerFaultRank, waits bounded at 1.5 s): after one
// `count`-element bf16 all-reduce with `algo` forced, rank 1 skips the next call and leaves after
// 3 s, once rank 0 has given up; rank 0 checks it with expectTimeoutNamingRank1(what, mentions,
// boundSec), then runs `thenOnRank0` (where given) on the failed communicator.
inline int missingPeerRank(int rank, int n, const anyrUniqueId& id, const Report& report,
                           anyrAlgo_t algo, uint64_t count, const std::string& what,
                           const std::string& mentions, double boundSec,
                           const OnComm& thenOnRank0 = {}) {
  return peerFaultRank(
      rank, n, id, 1500, algo, count, 3000, [&](anyrComm_t comm, char* buf, cudaStream_t s) {
        int failures = expectTimeoutNamingRank1(
            comm, s, [&] { return anyrAllReduce(buf, buf, count, anyrBfloat16, anyrSum, comm, s); },
            what, mentions, boundSec, report);
        if (thenOnRank0) failures += thenOnRank0(comm, buf, s);
        return failures;
      });
}

// Parent-side verdict: every rank exited 0 in time, and no rank reported a line starting with
// "FAIL" (each one is a failure of its own).
inline void expectRanksPassed(const std::vector<launch::RankResult>& results) {
  const std::string failures = launch::describeFailures(results);
  EXPECT_TRUE(failures.empty()) << failures.substr(0, 8000);
  for (const auto& r : results) {
    std::istringstream is(r.message);
    for (std::string line; std::getline(is, line);) {
      if (line.rfind("FAIL", 0) == 0) ADD_FAILURE() << "rank " << r.rank << ": " << line;
    }
  }
}

// Prints rank 0's "SKIP" lines (algorithms not admitted on this machine) as notes.
inline void printSkipNotes(const std::vector<launch::RankResult>& results) {
  for (const auto& r : results) {
    if (r.rank != 0) continue;
    std::istringstream is(r.message);
    for (std::string line; std::getline(is, line);) {
      if (line.rfind("SKIP", 0) == 0) std::printf("[ note ] %s\n", line.c_str());
    }
  }
}

// Which of `subjects` rank 0 could not force here: its "SKIP <name>: why" lines (the tests'
// convention for an algorithm not admitted on this machine), one per skipped subject.
inline std::string subjectsNotRun(const std::vector<launch::RankResult>& results,
                                  const std::vector<anyrAlgo_t>& subjects) {
  std::string out;
  for (const auto& r : results) {
    if (r.rank != 0) continue;
    std::istringstream is(r.message);
    for (std::string line; std::getline(is, line);) {
      for (anyrAlgo_t a : subjects) {
        const std::string head = std::string("SKIP ") + anyrAlgoName(a);
        if (line.rfind(head, 0) == 0 && line.size() > head.size() &&
            (line[head.size()] == ':' || line[head.size()] == ' ')) {
          out += (out.empty() ? "" : "; ") + line.substr(5);
        }
      }
    }
  }
  return out;
}

// A test whose subject is these algorithms, every one of them: when one was not admitted here
// the test is reported skipped (with the reason), not passed with its subject not run. Call it
// after the checks of what did run.
#define SKIP_UNLESS_EVERY_SUBJECT_RAN(results, ...)                                 \
  do {                                                                              \
    const std::string notRun_ = subjectsNotRun((results), __VA_ARGS__);             \
    if (!notRun_.empty()) GTEST_SKIP() << "subject not admitted here: " << notRun_; \
  } while (0)

// expectRanksPassed, and the ranks' outputs bit-identical: every "HASH <key...> <hash>" line
// (the last word is the hash, the words before it the key) came from all n ranks with the same
// hash, and at least one output was checked. Rank 0's "SKIP" lines are printed as notes, its
// "INFO" and "CHECKED" lines as information.
inline void expectRanksPassedWithEqualHashes(const std::vector<launch::RankResult>& results,
                                             int n) {
  expectRanksPassed(results);
  printSkipNotes(results);
  std::map<std::string, std::vector<std::string>> hashes;
  for (const auto& r : results) {
    std::istringstream is(r.message);
    for (std::string line; std::getline(is, line);) {
      if (r.rank == 0 && (line.rfind("INFO", 0) == 0 || line.rfind("CHECKED", 0) == 0)) {
        std::printf("[ info ] %s\n", line.c_str());
      }
      if (line.rfind("HASH ", 0) != 0) continue;
      const size_t cut = line.find_last_of(' ');
      hashes[line.substr(5, cut > 5 ? cut - 5 : 0)].push_back(line.substr(cut + 1));
    }
  }
  EXPECT_FALSE(hashes.empty()) << "no output was checked";
  for (const auto& kv : hashes) {
    ASSERT_EQ(kv.second.size(), static_cast<size_t>(n)) << kv.first << ": not every rank reported";
    for (const std::string& h : kv.second)
      EXPECT_EQ(h, kv.second[0]) << kv.first << ": ranks differ";
  }
  std::printf("[ info ] %zu outputs compared across %d ranks\n", hashes.size(), n);
}

}  // namespace anyr
