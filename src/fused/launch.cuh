// Launching the fused kernels that need more than a plain launch (CUDA sources only): more
// than 48 KB of dynamic shared memory, or thread-block clusters.
#pragma once

#include <cuda_runtime_api.h>

#include "device/launch.cuh"
#include "fused/epilogue.cuh"
#include "fused/fused_algo.h"
#include "fused/kernel_attrs.h"

namespace anyr {

// Raises `kernel`'s limit to `maxSmem` (once), then launches it with `smem` bytes (with
// programmatic dependent launch if `pdl`, see device/launch.cuh).
template <typename... Params, typename... Args>
cudaError_t launchWithSmem(void (*kernel)(Params...), int blocks, int threads, size_t smem,
                           size_t maxSmem, cudaStream_t stream, bool pdl, Args&&... args) {
  cudaError_t e = allowDynamicSmem(reinterpret_cast<const void*>(kernel), maxSmem);
  if (e != cudaSuccess) return e;
  return launchKernel(kernel, dim3(blocks), dim3(threads), smem, stream, pdl,
                      static_cast<Args&&>(args)...);
}

// A cluster-form fused kernel (rows spread over clusters of `clusterBlocks` blocks,
// fused_algo.h): `threads` (fusedClusterThreads) a block, one cluster per row as far as the
// block cap and `resident` (residentClusters of the kernel at that shape) allow (every cluster
// must be resident: blocks poll for data other blocks or peers produce).
// cudaErrorInvalidConfiguration when not one cluster of the shape fits.
template <typename... Params>
cudaError_t launchRowClusters(void (*kernel)(Params...), int threads, int resident,
                              const AllReduceArgs& a, const FusedParams& p, int rowBase, int rows,
                              int clusterBlocks, int maxBlocks, cudaStream_t stream, bool pdl) {
  const int clusters = fusedClusterCount(rows, clusterBlocks, maxBlocks, resident);
  if (clusters < 1) return cudaErrorInvalidConfiguration;
  return launchClusterKernel(kernel, dim3(static_cast<unsigned>(clusters * clusterBlocks)),
                             dim3(static_cast<unsigned>(threads)),
                             static_cast<unsigned>(clusterBlocks), 0, stream, pdl, a, p, rowBase,
                             rows);
}

// Every cluster-form kernel's type.
using ClusterKernel = void (*)(AllReduceArgs, FusedParams, int, int);

// Into *kernel: Family::kernel<T, Q, kAligned>() for `dtype` (T), quantization mode `quant`
// and buffers that allow whole vectors or not (as launch_rows.cuh: one kernel per
// quantization mode for aligned buffers, one general kernel otherwise); with `pair`,
// Family::pairKernelFor<T, Q>(threads), the variant compiled for two blocks per SM that takes
// blocks of `threads` threads (aligned buffers only; NULL where there is none).
// cudaErrorInvalidValue for another dtype or mode.
template <typename Family>
cudaError_t clusterKernelFor(anyrDataType_t dtype, int quant, bool aligned, bool pair, int threads,
                             ClusterKernel* kernel) {
  *kernel = nullptr;
  return dev::dispatchDtype<true>(dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::T;
    if (!aligned) {
      if (!pair) *kernel = Family::template kernel<T, dev::kQuantAtRunTime, false>();
      return cudaSuccess;
    }
    return dev::dispatchQuant(quant, [&](auto q) -> cudaError_t {
      constexpr int Q = decltype(q)::value;
      *kernel = pair ? Family::template pairKernelFor<T, Q>(threads)
                     : Family::template kernel<T, Q, true>();
      return cudaSuccess;
    });
  });
}

// Picks the cluster kernel for the buffers and launches it in clusters. Rows of at most
// kFusedSlots vectors, clusterBlocks 2..kFusedMaxClusterBlocks. Where the launch wants more
// clusters than the kernel holds at once (beyond one block per SM: maxBlocks is then the pair
// cap, fusedClusterPairBlocks), the pair variant runs instead if it holds more; both give the
// same bits.
template <typename Family>
cudaError_t launchRowsInClusters(anyrDataType_t dtype, const AllReduceArgs& a, const FusedParams& p,
                                 int rowBase, int rows, int clusterBlocks, int maxBlocks,
                                 cudaStream_t stream, bool pdl) {
  if (clusterBlocks < 2 || clusterBlocks > kFusedMaxClusterBlocks || !fusedClusterFits(p.hidden)) {
    return cudaErrorInvalidValue;
  }
  const bool aligned = fusedBuffersAligned(a.input, p);
  const int threads = fusedClusterThreads(p.hidden, clusterBlocks);
  ClusterKernel kernel = nullptr;
  cudaError_t e = clusterKernelFor<Family>(dtype, p.quant, aligned, false, threads, &kernel);
  if (e != cudaSuccess) return e;
  int resident = 0;
  e = residentClusters(reinterpret_cast<const void*>(kernel), clusterBlocks, threads, &resident);
  if (e != cudaSuccess) return e;
  const int wanted = fusedClusterCount(rows, clusterBlocks, maxBlocks, rows);
  if (resident < wanted) {
    ClusterKernel pairKernel = nullptr;
    e = clusterKernelFor<Family>(dtype, p.quant, aligned, true, threads, &pairKernel);
    if (e != cudaSuccess) return e;
    if (pairKernel != nullptr) {
      int pairResident = 0;
      e = residentClusters(reinterpret_cast<const void*>(pairKernel), clusterBlocks, threads,
                           &pairResident);
      if (e != cudaSuccess) return e;
      if (pairResident > resident) {
        kernel = pairKernel;
        resident = pairResident;
      }
    }
  }
  return launchRowClusters(kernel, threads, resident, a, p, rowBase, rows, clusterBlocks, maxBlocks,
                           stream, pdl);
}

// Lowers *threads (a multiple of 32) to the largest block size at which an SM holds two blocks
// of the cluster kernel for aligned buffers of `dtype` and mode `quant`, or of its pair variant
// for that block size (cudaOccupancyMaxActiveBlocksPerMultiprocessor; 0 where neither holds two
// blocks of 32 threads).
template <typename Family>
cudaError_t clusterPairThreadsOf(anyrDataType_t dtype, int quant, int* threads) {
  ClusterKernel kernel = nullptr;
  cudaError_t e = clusterKernelFor<Family>(dtype, quant, true, false, *threads, &kernel);
  if (e != cudaSuccess) return e;
  for (int t = *threads - *threads % 32; t >= 32; t -= 32) {
    ClusterKernel pairKernel = nullptr;
    e = clusterKernelFor<Family>(dtype, quant, true, true, t, &pairKernel);
    if (e != cudaSuccess) return e;
    for (ClusterKernel k : {kernel, pairKernel}) {
      if (k == nullptr) continue;
      int held = 0;
      e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&held, reinterpret_cast<const void*>(k), t,
                                                        0);
      if (e != cudaSuccess) return e;
      if (held >= 2) {
        *threads = t;
        return cudaSuccess;
      }
    }
  }
  *threads = 0;
  return cudaSuccess;
}

}  // namespace anyr
