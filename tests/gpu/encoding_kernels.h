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

}  // namespace enctest
}  // namespace anyr
