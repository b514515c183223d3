// Launching the fused kernels that need more than a plain launch (CUDA sources only): more
// than 48 KB of dynamic shared memory, or thread-block clusters.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include "algo/launch.cuh"
#include "fused/epilogue.cuh"
#include "fused/fused_algo.h"
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

// A cluster-form fused kernel (rows spread over clusters of `clusterBlocks` blocks,
// fused_algo.h): fusedClusterThreads threads a block, one cluster per row as far as the block
// cap and residency allow (every cluster must be resident: blocks poll for data other blocks
// or peers produce). cudaErrorInvalidConfiguration when not one cluster of the shape fits.
template <typename... Params>
cudaError_t launchRowClusters(void (*kernel)(Params...), const AllReduceArgs& a,
                              const FusedParams& p, int rowBase, int rows, int clusterBlocks,
                              int maxBlocks, cudaStream_t stream, bool pdl) {
  const int threads = fusedClusterThreads(p.hidden, clusterBlocks);
  int resident = 0;
  const cudaError_t e =
      residentClusters(reinterpret_cast<const void*>(kernel), clusterBlocks, threads, &resident);
  if (e != cudaSuccess) return e;
  const int clusters = fusedClusterCount(rows, clusterBlocks, maxBlocks, resident);
  if (clusters < 1) return cudaErrorInvalidConfiguration;
  return launchClusterKernel(kernel, dim3(static_cast<unsigned>(clusters * clusterBlocks)),
                             dim3(static_cast<unsigned>(threads)),
                             static_cast<unsigned>(clusterBlocks), 0, stream, pdl, a, p, rowBase,
                             rows);
}

// Calls go(Family::kernel<T, Q, kAligned>()) for `dtype` (T), quantization mode `quant` and
// buffers that allow whole vectors or not (as launch_rows.cuh: one kernel per quantization mode
// for aligned buffers, one general kernel otherwise); cudaErrorInvalidValue for another dtype
// or mode.
template <typename Family, typename Go>
cudaError_t withClusterKernel(anyrDataType_t dtype, int quant, bool aligned, Go go) {
  auto typed = [&](auto t) -> cudaError_t {
    using T = decltype(t);
    if (!aligned) return go(Family::template kernel<T, dev::kQuantAtRunTime, false>());
    switch (quant) {
      case anyrQuantNone:
        return go(Family::template kernel<T, anyrQuantNone, true>());
      case anyrQuantFp8:
        return go(Family::template kernel<T, anyrQuantFp8, true>());
      case anyrQuantNvfp4:
        return go(Family::template kernel<T, anyrQuantNvfp4, true>());
      default:
        return cudaErrorInvalidValue;
    }
  };
  switch (dtype) {
    case anyrFloat16:
      return typed(__half{});
    case anyrBfloat16:
      return typed(__nv_bfloat16{});
    default:
      return cudaErrorInvalidValue;
  }
}

// Picks the cluster kernel for the buffers (withClusterKernel) and launches it in clusters.
// Rows of at most kFusedSlots vectors, clusterBlocks 2..kFusedMaxClusterBlocks.
template <typename Family>
cudaError_t launchRowsInClusters(anyrDataType_t dtype, const AllReduceArgs& a, const FusedParams& p,
                                 int rowBase, int rows, int clusterBlocks, int maxBlocks,
                                 cudaStream_t stream, bool pdl) {
  if (clusterBlocks < 2 || clusterBlocks > kFusedMaxClusterBlocks || !fusedClusterFits(p.hidden)) {
    return cudaErrorInvalidValue;
  }
  return withClusterKernel<Family>(
      dtype, p.quant, fusedBuffersAligned(a.input, p), [&](auto kernel) {
        return launchRowClusters(kernel, a, p, rowBase, rows, clusterBlocks, maxBlocks, stream,
                                 pdl);
      });
}

// Lowers *threads to the largest block size at which an SM holds two blocks of the cluster
// kernel for aligned buffers of `dtype` and mode `quant`, as lowerPairThreads.
template <typename Family>
cudaError_t clusterPairThreadsOf(anyrDataType_t dtype, int quant, int* threads) {
  return withClusterKernel<Family>(dtype, quant, true, [&](auto kernel) {
    const void* k = reinterpret_cast<const void*>(kernel);
    return lowerPairThreads(&k, 1, threads);
  });
}

}  // namespace anyr
