// Device helpers of the startup self-test (src/core/selftest.cc): a checksum pattern whose
// all-reduce is exact in every dtype, and an on-device check of an output against it, so the
// self-test copies back a few counters instead of whole buffers.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "anyreduce/anyreduce.h"

namespace anyr {

// Rank r's input at element i: (r + 1) * (i % 7 + 1). The sum over n ranks is
// (i % 7 + 1) * n (n + 1) / 2 <= 7 * 36 = 252 for n <= 8: an integer every dtype holds exactly
// (bf16 holds every integer up to 256), and every partial sum is exact in fp32.
__host__ __device__ inline float selfTestValue(int rank, uint64_t i) {
  return static_cast<float>((rank + 1) * static_cast<int>(i % 7 + 1));
}
__host__ __device__ inline float selfTestExpected(int nranks, uint64_t i) {
  return static_cast<float>(static_cast<int>(i % 7 + 1) * nranks * (nranks + 1) / 2);
}

// What the check of one output found. Initialized by the host: wrong = 0, firstBad = ~0.
struct SelfCheckResult {
  unsigned long long wrong;     // elements whose value differs from the expected sum
  unsigned long long firstBad;  // smallest wrong index (~0: none)
  float got;                    // value at firstBad
  float want;
  uint64_t pad;
};
static_assert(sizeof(SelfCheckResult) == 32, "SelfCheckResult layout");

// Fills count elements of `p` with rank's pattern (value = -1 for rank < 0: a constant 1,
// used for the RMSNorm weight).
cudaError_t launchSelfTestFill(anyrDataType_t dtype, void* p, uint64_t count, int rank,
                               cudaStream_t s);
// Compares count elements of `out` with the expected sum over nranks; updates *res.
cudaError_t launchSelfTestCheck(anyrDataType_t dtype, const void* out, uint64_t count, int nranks,
                                SelfCheckResult* res, cudaStream_t s);

}  // namespace anyr
