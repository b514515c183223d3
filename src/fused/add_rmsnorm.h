// The standalone add + RMSNorm kernel's forms, one file each (CUDA sources only): the launcher
// (fused/add_rmsnorm.cu, launchAddRmsNormWith) picks the form and calls the form's launcher
// below, which picks the kernel compiled for the dtype, the quantization mode, the alignment and
// the vectors a thread holds, sizes the grid and launches it.
#pragma once

#include <cuda_runtime_api.h>

#include "fused/fused.h"

namespace anyr {

// The most blocks a form launches; more rows are taken in turn by the same blocks.
constexpr int kAddRmsNormMaxGrid = 1 << 16;

// What a form's launcher needs besides the call: the current device and its SM count, the
// launch options, and the shape to fill in (form, threads and vpt set by the caller; the
// launcher sets blocks, smem and the cluster size).
struct AddRmsNormTarget {
  int device = 0;
  int sms = 1;
  bool pdl = false;
  AddRmsNormRelease release = AddRmsNormRelease::AtExit;  // with pdl
  bool clusterExitBarrier = true;                         // AddRmsNormLaunch::clusterExitBarrier
  AddRmsNormGrid grid = AddRmsNormGrid::Auto;             // AddRmsNormLaunch::grid
  bool cacheHints = false;  // AddRmsNormLaunch::hints, decided (On, or Auto's rule held)
};

// The kernels' releaseEarly argument for a grid of `blocks` (dev::waitForPrevious): 1 where the
// launch is programmatic and its release rule lets the next launch go early at that grid.
inline int32_t addRmsNormReleaseArg(const AddRmsNormTarget& t, int blocks) {
  return t.pdl && addRmsNormReleasesEarly(t.release, blocks, t.sms) ? 1 : 0;
}

// Rows with shape->threads threads of shape->vpt vectors (fused/add_rmsnorm_rows.cu).
cudaError_t launchAddRmsNormRows(anyrDataType_t dtype, const void* x, const FusedParams& p,
                                 cudaStream_t stream, const AddRmsNormTarget& t,
                                 AddRmsNormShape* shape);
// Cluster, in clusters of shape->clusterBlocks (2, 4 or 8) blocks of fusedClusterThreads
// threads (fused/add_rmsnorm_cluster.cu).
cudaError_t launchAddRmsNormCluster(anyrDataType_t dtype, const void* x, const FusedParams& p,
                                    cudaStream_t stream, const AddRmsNormTarget& t,
                                    AddRmsNormShape* shape);

}  // namespace anyr
