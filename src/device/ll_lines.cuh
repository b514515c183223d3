// The host low-latency protocol's read of a pass of flagged lines (algo/host_oneshot_ll.cu;
// tests/diag/host_phases.cu times the same sequence).
#pragma once

#include "device/common.cuh"

namespace anyr {
namespace dev {

// Reads vectors v0, v0 + stride, ... (kPass of them, those below V) of a peer's flagged lines
// at `src`, each two 16-byte lines (lo, hi), all requested before any is checked; volatile:
// lines still landing are read again by the caller.
template <int kPass>
__device__ __forceinline__ void loadLLPass(const char* src, uint64_t v0, uint64_t stride,
                                           uint64_t V, uint4 (&lo)[kPass], uint4 (&hi)[kPass]) {
#pragma unroll
  for (int k = 0; k < kPass; ++k) {
    const uint64_t v = v0 + k * stride;
    if (v < V) {
      lo[k] = loadVolatile(src + v * 32);
      hi[k] = loadVolatile(src + v * 32 + 16);
    }
  }
}

}  // namespace dev
}  // namespace anyr
