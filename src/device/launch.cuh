// Launching a kernel with or without programmatic dependent launch (CUDA sources only).
// With `pdl`, the kernel may be scheduled while the previous kernel on the stream is still
// draining (its launch and parameter loads overlap that tail); the kernel calls
// dev::waitForPrevious() before it touches memory, so the results are those of a plain launch.
// The communicator passes pdl only where a probe launch with the attribute succeeded and
// ANYR_PDL asks for it (Capabilities::probeProgrammaticLaunch).
#pragma once

#include <cuda_runtime.h>

#include "device/common.cuh"

namespace anyr {

// cudaLaunchKernelEx with optional programmatic stream serialization (pdl) and a
// one-dimensional cluster dimension (clusterBlocks > 0).
template <typename... Params, typename... Args>
cudaError_t launchKernelEx(void (*kernel)(Params...), dim3 grid, dim3 block, unsigned clusterBlocks,
                           size_t smem, cudaStream_t stream, bool pdl, Args&&... args) {
  cudaLaunchAttribute attr[2] = {};
  unsigned n = 0;
  if (clusterBlocks > 0) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = clusterBlocks;
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = 1;
    ++n;
  }
  if (pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, kernel, static_cast<Params>(args)...);
}

template <typename... Params, typename... Args>
cudaError_t launchKernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                         cudaStream_t stream, bool pdl, Args&&... args) {
  if (!pdl) {
    kernel<<<grid, block, smem, stream>>>(static_cast<Args&&>(args)...);
    return cudaGetLastError();
  }
  return launchKernelEx(kernel, grid, block, 0u, smem, stream, true, static_cast<Args&&>(args)...);
}

// As launchKernel, in one-dimensional clusters of `clusterBlocks` blocks (grid.x a multiple of
// it). Only where the communicator's cluster probe passed (dev::clusterArrive and friends).
template <typename... Params, typename... Args>
cudaError_t launchClusterKernel(void (*kernel)(Params...), dim3 grid, dim3 block,
                                unsigned clusterBlocks, size_t smem, cudaStream_t stream, bool pdl,
                                Args&&... args) {
  return launchKernelEx(kernel, grid, block, clusterBlocks, smem, stream, pdl,
                        static_cast<Args&&>(args)...);
}

// Launches the kernel kernelOf(tag) returns for `dtype` and the shape's alignment (dev::dispatch;
// tag: a dev::KernelTag) with the shape's blocks, threads and pdl (algo.h's LaunchShape) and
// the one argument `a`: every unfused algorithm's launcher.
template <typename Args, typename Shape, typename KernelOf>
cudaError_t launchTagged(anyrDataType_t dtype, const Args& a, const Shape& shape,
                         cudaStream_t stream, KernelOf&& kernelOf) {
  return dev::dispatch(dtype, shape.aligned, [&](auto tag) {
    return launchKernel(kernelOf(tag), dim3(shape.blocks), dim3(shape.threads), 0, stream,
                        shape.pdl, a);
  });
}

}  // namespace anyr
