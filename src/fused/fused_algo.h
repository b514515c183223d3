// Launchers of the fused all-reduce + add + RMSNorm (+ quantization) kernels. Each takes the
// all-reduce arguments of one launch (input = the launch's first row of `partial`, count =
// rows x hidden) and the epilogue parameters (rows addressed as rowBase + row).
#pragma once

#include <cuda_runtime_api.h>

#include "anyreduce/anyreduce.h"
#include "device/handles.h"
#include "device/vectors.h"
#include "fused/fused.h"

namespace anyr {

// Threads per block of the fused all-reduce kernels for a row of `hidden` elements: a power
// of two, one 8-element vector per thread up to 512 vectors (at least 64 threads), else 512
// threads with up to four vectors each (the register epilogue's rule, fused/epilogue.cuh).
inline int fusedThreads(int hidden) {
  const int nvec = rowVecs(hidden);
  int t = 64;
  while (t < nvec && t < 512) t *= 2;
  return t;
}

// Whether a fused kernel holds a row of `hidden` in registers at two vectors per thread at most
// (hidden 8192). Wider rows spill in the one-shot kernel and are staged in shared memory by the
// two-shot one (fused_twoshot_push.cu has both forms); the communicator composes there unless
// the algorithm is forced.
inline bool fusedRowFitsRegisters(int hidden) {
  return rowVecs(hidden) <= 2 * fusedThreads(hidden);
}

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

// The fused pull kernels' grids (fused_oneshot_pull.cu, fused_twoshot_pull.cu): a block per
// row (one-shot), or per row index of a segment (two-shot: ceil(rows / nranks) rows a rank),
// at most maxBlocks (one per SM). Block b of every rank takes the same rows and waits only for
// block b of its peers (per-block flags), so the grid is a function of agreed values.
inline int fusedOneShotPullBlocks(int rows, int maxBlocks) {
  return rows < maxBlocks ? rows : maxBlocks;
}
inline int fusedTwoShotPullBlocks(int rows, int nranks, int maxBlocks) {
  const int perRank = (rows + nranks - 1) / nranks;
  return perRank < maxBlocks ? perRank : maxBlocks;
}

// ---- the two-shot register form at two blocks per SM -------------------------------------
// A block of the register form runs its rows one after the other, each bound by the latency of
// its epilogue. A launch of more rows than maxBlocks (one block per SM) takes the dense shape:
// kFusedDenseThreads threads a block (VPT up to 4 at hidden 8192) over up to denseBlocks blocks,
// two per SM where the occupancy of every variant allows it on every rank
// (Communicator::fusedDenseBlocks_; config.maxBlocks caps it like every grid), so a second block
// overlaps each block's rows. Measured on 2 x H200 (docs/PERFORMANCE.md): 256 / 512 tokens of
// hidden 6144 in 15.1 / 25.5 us against 16.6 / 28.4 with one block of 512 threads per SM, 7168
// in 16.9 / 30.3 against 17.6 / 33.4.
constexpr int kFusedDenseThreads = 256;
constexpr int kFusedDensePerSm = 2;

// Blocks and threads of a fused two-shot launch (the register or the staged form; threads 0:
// fusedThreads(hidden)).
struct FusedLaunchShape {
  int blocks = 1;
  int threads = 0;
};
inline FusedLaunchShape fusedTwoShotShape(int rows, int nranks, int hidden, uint64_t numVecs,
                                          int maxBlocks, int denseBlocks) {
  FusedLaunchShape s;
  if (fusedRowFitsRegisters(hidden) && denseBlocks > maxBlocks && rows > maxBlocks) {
    s.blocks = fusedOneShotBlocks(rows, numVecs, denseBlocks);
    s.threads = kFusedDenseThreads;
    return s;
  }
  s.blocks = fusedTwoShotBlocks(rows, nranks, hidden, numVecs, maxBlocks);
  return s;
}

// ---- the cluster forms (fused_oneshot_push.cu, fused_twoshot_push.cu) --------------------
// A row spread over the blocks of a thread-block cluster: C blocks of fusedClusterThreads
// threads, one 16-byte vector of the row each, for rows of at most kFusedSlots vectors (hidden
// 8192). C is 2, 4 or 8 (8: the portable cluster size of every GPU with clusters).
constexpr int kFusedMaxClusterBlocks = 8;
constexpr int kFusedClusterMaxThreads = kFusedSlots / 2;  // C >= 2 blocks cover 1024 vectors

inline bool fusedClusterFits(int hidden) { return rowVecs(hidden) <= kFusedSlots; }

// Threads per block: the row's vectors over C blocks, rounded up to whole warps.
inline int fusedClusterThreads(int hidden, int clusterBlocks) {
  const int nvec = rowVecs(hidden);
  const int per = (nvec + clusterBlocks - 1) / clusterBlocks;
  const int t = (per + 31) / 32 * 32;
  return t < 32 ? 32 : t;
}

// The cluster size of a fused one-shot launch of `rows` rows: 1 (no clusters: the block-per-
// row kernel) or 2, 4, 8. `setting` is the agreed config (config.fusedCluster /
// ANYR_FUSED_CLUSTER): 0 automatic, 1 off, 2/4/8 forced (for rows that fit). Automatic: the
// largest C that leaves a block at least 64 vectors (2 warps) and lets every row of the launch
// have its own cluster within maxBlocks (one block per SM); then clusters of two within
// pairBlocks (fusedClusterPairBlocks: two blocks per SM, where the launch's kernel variant holds
// two such blocks; 0: not admitted); rows beyond that keep the block-per-row kernel, whose grid
// already fills the GPU. Measured on 2 x H200, hidden 6144, each size forced
// (docs/PERFORMANCE.md, "Fused shapes"): the one-shot 1 row 3.92 us at C = 8
// against 4.89 without, 16 rows 5.19 against 5.45, 32 rows 6.22 at C = 4 against 7.30; the two-shot
// 64 rows 8.35 at C = 2 against 9.52, 96 rows 10.20 at C = 2 and 10.18 without. Forced sizes
// at 8-128 tokens of 6144 and 7168 (docs/PERFORMANCE.md, "Fused shapes"): this rule is the
// fastest or within 0.05 us everywhere but 7168 x 16 and 96 tokens, where C = 2 is faster;
// `anyreduce tune` measures the sizes per bucket at its hidden size (Path::cluster), which
// comes here as a forced `setting`.
inline int fusedClusterSize(int rows, int hidden, int maxBlocks, int setting, int pairBlocks = 0) {
  if (setting == 1 || !fusedClusterFits(hidden)) return 1;
  if (setting > 1) return setting;
  const int nvec = rowVecs(hidden);
  for (int c = kFusedMaxClusterBlocks; c >= 2; c /= 2) {
    if (nvec / c >= 64 && static_cast<int64_t>(rows) * c <= maxBlocks) return c;
  }
  if (nvec / 2 >= 64 && static_cast<int64_t>(rows) * 2 <= pairBlocks) return 2;
  return 1;
}

// ---- clusters at two blocks per SM ---------------------------------------------------------
// From 67 rows (with 132 SMs) clusters of two no longer fit one block per SM, and the cluster
// form looped rows over the clusters it had (slower than the block-per-row kernel); where an SM
// holds two blocks of the kernel variant a launch runs, every row keeps its own cluster of two.
// Measured at world size 1 on one H200, hidden 6144, bf16 (docs/PERFORMANCE.md, "Fused shapes"):
// the fused one-shot at 80 / 96 / 128 rows 3.74 / 3.80 / 3.83 us against 4.58 with the
// block-per-row kernel at 80 and 4.80 / 4.83 / 4.90 in clusters of two at one block per SM; the
// two-shot's cluster form at 96 / 128 rows 5.65 / 5.75 against 6.89 (block per row) and
// 7.05 / 7.05. The pair kernels (compiled for two blocks per SM, fused/launch.cuh) extended it
// to hidden 7168 and the quantized variants (same machine): 7168 at 80 rows
// 4.05 us against 4.83 (block per row), 6144 NVFP4 at 80 rows 4.71 against 5.84 (looping), the
// two-shot at 7168 x 128 6.30 against 7.31 (its dense shape); NVFP4 at 7168 x 80 5.27-5.29
// against 5.59 (block per row). The grid cap of a cluster launch of
// rows of `hidden` in clusters of `clusterBlocks` beyond one block per SM: pairBlocks (two blocks
// per SM, the communicator's agreed cap; 0 where not admitted) where its blocks of
// fusedClusterThreads threads are at most pairThreads (the largest block at which an SM holds
// two blocks of the launch's kernel variant on every rank), else maxBlocks.
inline int fusedClusterPairBlocks(int hidden, int clusterBlocks, int maxBlocks, int pairThreads,
                                  int pairBlocks) {
  return fusedClusterThreads(hidden, clusterBlocks) <= pairThreads && pairBlocks > maxBlocks
             ? pairBlocks
             : maxBlocks;
}

// Clusters in the grid of a cluster launch: one per row (a row's own threads push it), within
// maxBlocks and within `resident`, how many clusters of the shape the GPU holds at once (every
// cluster must be resident: blocks poll for data peers push). 0: not even one fits.
inline int fusedClusterCount(int rows, int clusterBlocks, int maxBlocks, int resident) {
  int want = rows;
  const int cap = maxBlocks / clusterBlocks;
  if (want > cap) want = cap;
  if (want > resident) want = resident;
  return want;
}

// Each lowers *threads (a multiple of 32) to the largest block size at which an SM of the
// current device holds two blocks of that cluster-form kernel for aligned buffers of `dtype`
// (fp16 or bf16) and quantization mode `quant` (0: none; unaligned buffers run the general
// kernel, whose residency caps its grid, so its rows may loop over fewer clusters).
cudaError_t fusedOneShotClusterPairThreads(anyrDataType_t dtype, int quant, int* threads);
cudaError_t fusedTwoShotClusterPairThreads(anyrDataType_t dtype, int quant, int* threads);

// The cluster forms of the fused one-shot push and of the fused two-shot push's register form
// (rows of at most kFusedSlots vectors; clusterBlocks from fusedClusterSize, 2..8).
cudaError_t launchFusedTwoShotPushCluster(anyrDataType_t dtype, const AllReduceArgs& a,
                                          const FusedParams& p, int rowBase, int rows,
                                          int clusterBlocks, int maxBlocks, cudaStream_t stream,
                                          bool pdl);
cudaError_t launchFusedOneShotPushCluster(anyrDataType_t dtype, const AllReduceArgs& a,
                                          const FusedParams& p, int rowBase, int rows,
                                          int clusterBlocks, int maxBlocks, cudaStream_t stream,
                                          bool pdl);

// pdl: programmatic dependent launch (device/launch.cuh).
cudaError_t launchFusedOneShotPush(anyrDataType_t dtype, const AllReduceArgs& a,
                                   const FusedParams& p, int rowBase, int rows, int blocks,
                                   cudaStream_t stream, bool pdl = false);
// The fused doubling push: the block-per-row form of the fused one-shot push with the doubling
// push's order (fused_oneshot_push.cu); no cluster form.
cudaError_t launchFusedDoublingPush(anyrDataType_t dtype, const AllReduceArgs& a,
                                    const FusedParams& p, int rowBase, int rows, int blocks,
                                    cudaStream_t stream, bool pdl = false);
// The fused islands kernel: the islands kernel's steps over the whole grid, then a block per row
// in registers (fused_islands.cu); no cluster or dense form.
cudaError_t launchFusedIslands(anyrDataType_t dtype, const AllReduceArgs& a, const FusedParams& p,
                               int rowBase, int rows, int blocks, cudaStream_t stream,
                               bool pdl = false);
// threads: 0 (fusedThreads) or kFusedDenseThreads (the register form only; fusedTwoShotShape).
cudaError_t launchFusedTwoShotPush(anyrDataType_t dtype, const AllReduceArgs& a,
                                   const FusedParams& p, int rowBase, int rows, int blocks,
                                   cudaStream_t stream, bool pdl, int threads = 0);

// The fused pull kernels, a block a row in registers (fusedThreads(hidden) threads, up to four
// vectors each) over fusedOneShotPullBlocks / fusedTwoShotPullBlocks blocks, at most maxBlocks.
cudaError_t launchFusedOneShotPull(anyrDataType_t dtype, const AllReduceArgs& a,
                                   const FusedParams& p, int rowBase, int rows, int maxBlocks,
                                   cudaStream_t stream, bool pdl = false);
cudaError_t launchFusedTwoShotPull(anyrDataType_t dtype, const AllReduceArgs& a,
                                   const FusedParams& p, int rowBase, int rows, int maxBlocks,
                                   cudaStream_t stream, bool pdl = false);

// The fewest blocks of kFusedDenseThreads threads of the two-shot register form that an SM of
// this device holds at once, over every variant such a launch can run (lowers *least).
cudaError_t fusedTwoShotDenseResidentPerSm(int* least);

}  // namespace anyr
