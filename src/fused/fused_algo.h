// Launchers of the fused all-reduce + add + RMSNorm (+ quantization) kernels. Each takes the
// all-reduce arguments of one launch (input = the launch's first row of `partial`, count =
// rows x hidden) and the epilogue parameters (rows addressed as rowBase + row).
#pragma once

#include <cuda_runtime_api.h>

#include "anyreduce/anyreduce.h"
#include "fused/fused.h"
#include "transport/device_handles.h"

namespace anyr {

// Threads per block of the fused all-reduce kernels for a row of `hidden` elements.
inline int fusedThreads(int hidden) {
  int t = (hidden / 8 + 31) / 32 * 32;
  return t < 64 ? 64 : (t > 512 ? 512 : t);
}

cudaError_t launchFusedOneShotPush(anyrDataType_t dtype, const AllReduceArgs& a,
                                   const FusedParams& p, int rowBase, int rows, int blocks,
                                   cudaStream_t stream);
cudaError_t launchFusedTwoShotPush(anyrDataType_t dtype, const AllReduceArgs& a,
                                   const FusedParams& p, int rowBase, int rows, int blocks,
                                   cudaStream_t stream);

}  // namespace anyr
