// Device checks of the reliability tests (test_reliability.cc): guard canaries and the exact
// residual output of the fused op on small-integer data. Stream-ordered; counts are added to a
// device counter so a long run copies back a few words, not whole buffers.
#pragma once

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "anyreduce/anyreduce.h"

namespace anyr {
namespace reltest {

constexpr unsigned char kGuardByte = 0xA5;

// Adds to *dCount the bytes of p[0..bytes) that are not `value`.
cudaError_t countBytesNot(const void* p, uint64_t bytes, unsigned char value,
                          unsigned long long* dCount, cudaStream_t s);

// residualOut of anyrAllReduceAddRmsNorm when every rank's partial is data::fillInput(rank,
// seed, kSmallInts) and residualIn is data::fillInput(residRank, residSeed, kSmallInts): adds
// to *dCount the elements differing from round(round(sum) + residual) (exact: small integers).
cudaError_t countResidualMismatches(anyrDataType_t t, const void* residualOut, uint64_t count,
                                    int nranks, uint32_t seed, int residRank, uint32_t residSeed,
                                    unsigned long long* dCount, cudaStream_t s);

}  // namespace reltest
}  // namespace anyr
