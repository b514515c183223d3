// Launching a kernel that needs more than 48 KB of dynamic shared memory (CUDA sources only).
#pragma once

#include <cuda_runtime_api.h>

#include "fused/kernel_attrs.h"

namespace anyr {

// Raises `kernel`'s limit to `maxSmem` (once), then launches it with `smem` bytes.
template <typename... Params, typename... Args>
cudaError_t launchWithSmem(void (*kernel)(Params...), int blocks, int threads, size_t smem,
                           size_t maxSmem, cudaStream_t stream, Args&&... args) {
  cudaError_t e = allowDynamicSmem(reinterpret_cast<const void*>(kernel), maxSmem);
  if (e != cudaSuccess) return e;
  kernel<<<blocks, threads, smem, stream>>>(static_cast<Args&&>(args)...);
  return cudaGetLastError();
}

}  // namespace anyr
