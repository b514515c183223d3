// Launching a kernel that needs more than 48 KB of dynamic shared memory (CUDA sources only).
#pragma once

#include <cuda_runtime_api.h>

#include "algo/launch.cuh"
#include "fused/kernel_attrs.h"

namespace anyr {

// Raises `kernel`'s limit to `maxSmem` (once), then launches it with `smem` bytes (with
// programmatic dependent launch if `pdl`, see algo/launch.cuh).
template <typename... Params, typename... Args>
cudaError_t launchWithSmem(void (*kernel)(Params...), int blocks, int threads, size_t smem,
                           size_t maxSmem, cudaStream_t stream, bool pdl, Args&&... args) {
  cudaError_t e = allowDynamicSmem(reinterpret_cast<const void*>(kernel), maxSmem);
  if (e != cudaSuccess) return e;
  return launchKernel(kernel, dim3(blocks), dim3(threads), smem, stream, pdl,
                      static_cast<Args&&>(args)...);
}

}  // namespace anyr
