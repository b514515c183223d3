// Test and benchmark data: every rank's input is a pure function of (rank, index, seed), so
// any process can compute any rank's input and the exact expected result without moving data.
// Modes: small integers (sums are exact in every dtype) and random fractions (sums round; the
// expected bits follow anyreduce's contract: fp32 sum in ascending rank order, then round to
// nearest-even into the dtype).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <stdint.h>

#include <string>
#include <vector>

#include "anyreduce/anyreduce.h"

namespace anyr {
namespace data {

enum Mode : int { kSmallInts = 0, kRandom = 1 };

__host__ __device__ inline uint32_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<uint32_t>(x);
}

// Input value of `rank` at element `i`, before rounding to the dtype.
__host__ __device__ inline float genValue(int mode, int rank, uint64_t i, uint32_t seed) {
  uint32_t h = mix((static_cast<uint64_t>(seed) << 40) ^ (static_cast<uint64_t>(rank) << 56) ^ i);
  if (mode == kSmallInts) return static_cast<float>(static_cast<int>(h % 17u) - 8);
  return static_cast<float>(h & 0xffffu) / 8192.0f - 4.0f;
}

size_t dtypeBytes(anyrDataType_t t);
const char* dtypeName(anyrDataType_t t);
bool parseDtype(const std::string& s, anyrDataType_t* out);

// Device helpers (stream-ordered).
cudaError_t fillInput(anyrDataType_t t, void* p, uint64_t count, int rank, uint32_t seed, int mode,
                      cudaStream_t s);
// Adds to *dMismatches the number of elements of `out` whose bits differ from the expected
// all-reduce of `nranks` ranks' inputs.
cudaError_t countMismatches(anyrDataType_t t, const void* out, uint64_t count, int nranks,
                            uint32_t seed, int mode, unsigned long long* dMismatches,
                            cudaStream_t s);
// countMismatches counted afresh (the device word `dScratch` zeroed first), and the count in
// *wrong once the stream got there (synchronizes `s`).
cudaError_t mismatchesNow(anyrDataType_t t, const void* out, uint64_t count, int nranks,
                          uint32_t seed, int mode, unsigned long long* dScratch, cudaStream_t s,
                          unsigned long long* wrong);
// Adds to *dMismatches the elements of `in` that differ from rank's generated input.
cudaError_t countInputChanges(anyrDataType_t t, const void* in, uint64_t count, int rank,
                              uint32_t seed, int mode, unsigned long long* dMismatches,
                              cudaStream_t s);

// Adds to *dCount the number of bytes where a and b differ.
cudaError_t countDiffBytes(const void* a, const void* b, uint64_t bytes, unsigned long long* dCount,
                           cudaStream_t s);
// Adds to *dHash an order-sensitive hash of the bytes (equal bytes give equal hashes).
cudaError_t hashBytes(const void* p, uint64_t bytes, unsigned long long* dHash, cudaStream_t s);

// Host reference: the expected output bits, as raw bytes of the dtype.
std::vector<unsigned char> hostExpected(anyrDataType_t t, uint64_t count, int nranks, uint32_t seed,
                                        int mode);

uint64_t fnv1a(const void* p, size_t n);

}  // namespace data
}  // namespace anyr
