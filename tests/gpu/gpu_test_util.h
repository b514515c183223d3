// Helpers shared by the multi-process GPU tests.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

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

}  // namespace anyr
