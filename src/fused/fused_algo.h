// Launchers of the fused all-reduce + add + RMSNorm (+ quantization) kernels. Each takes the
// all-reduce arguments of one launch (input = the launch's first row of `partial`, count =
// rows x hidden) and the epilogue parameters (rows addressed as rowBase + row).
#pragma once

#include <cuda_runtime_api.h>

#include "anyreduce/anyreduce.h"
#include "fused/fused.h"
#include "transport/device_handles.h"

namespace anyr {

// Threads per block of the fused all-reduce kernels for a row of `hidden` elements: a power
// of two, one 8-element vector per thread up to 512 vectors (at least 64 threads), else 512
// threads with up to four vectors each (the register epilogue's rule, fused/epilogue.cuh).
inline int fusedThreads(int hidden) {
  const int nvec = hidden / 8;
  int t = 64;
  while (t < nvec && t < 512) t *= 2;
  return t;
}

// Whether a fused kernel holds a row of `hidden` in registers at two vectors per thread at most
// (hidden 8192). Wider rows spill in the one-shot kernel and are staged in shared memory by the
// two-shot one (fused_twoshot_push.cu has both forms); the communicator composes there unless
// the algorithm is forced.
inline bool fusedRowFitsRegisters(int hidden) { return hidden / 8 <= 2 * fusedThreads(hidden); }

// Grid of one fused launch of `rows` rows (numVecs 16-byte vectors), at most maxBlocks blocks.
// One-shot, and the two-shot's register form: a block per row, and at least one per 64 vectors
// so the traffic leaves from many SMs. The two-shot's staged form: a block per row this rank
// owns.
inline int fusedOneShotBlocks(int rows, uint64_t numVecs, int maxBlocks) {
  const int pushBlocks = static_cast<int>((numVecs + 63) / 64);
  const int want = rows > pushBlocks ? rows : pushBlocks;
  return want < maxBlocks ? want : maxBlocks;
}
inline int fusedTwoShotBlocks(int rows, int nranks, int hidden, uint64_t numVecs, int maxBlocks) {
  if (fusedRowFitsRegisters(hidden)) return fusedOneShotBlocks(rows, numVecs, maxBlocks);
  const int owned = (rows + nranks - 1) / nranks;
  return owned < maxBlocks ? owned : maxBlocks;
}

// pdl: programmatic dependent launch (algo/launch.cuh).
cudaError_t launchFusedOneShotPush(anyrDataType_t dtype, const AllReduceArgs& a,
                                   const FusedParams& p, int rowBase, int rows, int blocks,
                                   cudaStream_t stream, bool pdl = false);
cudaError_t launchFusedTwoShotPush(anyrDataType_t dtype, const AllReduceArgs& a,
                                   const FusedParams& p, int rowBase, int rows, int blocks,
                                   cudaStream_t stream, bool pdl);

}  // namespace anyr
