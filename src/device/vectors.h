// Size arithmetic shared by the host control plane, the kernels' launchers and the kernels.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace anyr {

// x rounded up to a multiple of a (workspace and host-segment layouts).
inline constexpr uint64_t roundUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// The vector-width row split of the fused kernels: a row of `hidden` 16-bit elements (bf16 or
// fp16; hidden a multiple of kRowVecElems, fusedHiddenValid) is cut into 16-byte vectors of
// kRowVecElems elements (vector v: elements 8v .. 8v + 7). One fact for every kernel, launcher
// and host rule that counts a row's vectors.
inline constexpr int kRowVecElems = 8;
__host__ __device__ constexpr int rowVecs(int hidden) { return hidden / kRowVecElems; }

// The vectors each of `threads` threads holds when they share a row's vectors (rounded up).
__host__ __device__ constexpr int rowVecsPerThread(int hidden, int threads) {
  return (rowVecs(hidden) + threads - 1) / threads;
}

}  // namespace anyr
