// Helpers shared by the multi-process GPU tests.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "anyreduce/anyreduce.h"
#include "common/launcher.h"

namespace anyr {

// Visible GPUs, asked once in a child process (the test process must stay CUDA-free: it forks
// the ranks).
inline int gpuCount() {
  static int n = -1;
  if (n < 0) {
    std::string why;
    n = launch::countGpus(&why);
  }
  return n;
}

#define REQUIRE_GPU()                                           \
  do {                                                          \
    if (gpuCount() == 0) GTEST_SKIP() << "no CUDA GPU visible"; \
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

using Report = std::function<void(const std::string&)>;
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

}  // namespace anyr
