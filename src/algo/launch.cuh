// Launching a kernel with or without programmatic dependent launch (CUDA sources only).
// With `pdl`, the kernel may be scheduled while the previous kernel on the stream is still
// draining (its launch and parameter loads overlap that tail); the kernel calls
// dev::waitForPrevious() before it touches memory, so the results are those of a plain launch.
// The communicator passes pdl only where a probe launch with the attribute succeeded and
// ANYR_PDL asks for it (Communicator::probeProgrammaticLaunch).
#pragma once

#include <cuda_runtime.h>

namespace anyr {

template <typename... Params, typename... Args>
cudaError_t launchKernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                         cudaStream_t stream, bool pdl, Args&&... args) {
  if (!pdl) {
    kernel<<<grid, block, smem, stream>>>(static_cast<Args&&>(args)...);
    return cudaGetLastError();
  }
  cudaLaunchAttribute attr[1] = {};
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, static_cast<Params>(args)...);
}

// As launchKernel, in one-dimensional clusters of `clusterBlocks` blocks (grid.x a multiple of
// it). Only where the communicator's cluster probe passed (dev::clusterArrive and friends).
template <typename... Params, typename... Args>
cudaError_t launchClusterKernel(void (*kernel)(Params...), dim3 grid, dim3 block,
                                unsigned clusterBlocks, size_t smem, cudaStream_t stream, bool pdl,
                                Args&&... args) {
  cudaLaunchAttribute attr[2] = {};
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = clusterBlocks;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 2 : 1;
  return cudaLaunchKernelEx(&cfg, kernel, static_cast<Params>(args)...);
}

}  // namespace anyr
