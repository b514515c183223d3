// Device checks of the quantization encoders' building blocks against the CUDA intrinsics they
// stand in for, over whole ranges of floats (test_fused_kernel.cc).
#pragma once

#include <cuda_runtime_api.h>
#include <stdint.h>

namespace anyr {
namespace enctest {

// For every float bit pattern in [firstBits, lastBits] (positive floats), compares
// dev::reciprocalNormal(d) with __frcp_rn(d) bit for bit. *mismatches: how many differ;
// *firstBad: the smallest pattern that differs (0xffffffff when none). Synchronous.
cudaError_t reciprocalMismatches(uint32_t firstBits, uint32_t lastBits,
                                 unsigned long long* mismatches, uint32_t* firstBad);

// For every float bit pattern that is not NaN, compares e2m1MagnitudeF with e2m1CodeNotNaN's
// magnitude, and e2m1Pack8 of eight patterns (p + k * 0x10003 for k = 0..7, the sign of every
// fourth one flipped, NaNs replaced by -0.0) with the eight e2m1CodeNotNaN codes packed. Where
// the GPU's machine code has the e2m1 conversion instruction, e2m1Pack8 is that instruction
// (ANYR_E2M1_CVT, fused/fused.h), so this checks the instruction against the fp32 encoder.
// *mismatches: how many differ (both counts together); *firstBad: the smallest pattern p involved
// (0xffffffff when none). Synchronous.
cudaError_t e2m1Mismatches(unsigned long long* mismatches, uint32_t* firstBad);

// For every pair (a, b) of 16-bit patterns of bf16 (bf16 true) or fp16, compares
// dev::addPair (one packed add, the sum rounded once) with the sum taken in fp32 and rounded
// to the type (dev::packPair of the two widened values added), bit for bit, in both halves of
// the packed pair (a + b in the low half, b + a in the high one). *mismatches: how many pairs
// differ (either half); *firstBad: the smallest (a << 16 | b) that differs (0xffffffff when
// none). Synchronous.
cudaError_t packedAddMismatches(bool bf16, unsigned long long* mismatches, uint32_t* firstBad);

}  // namespace enctest
}  // namespace anyr
