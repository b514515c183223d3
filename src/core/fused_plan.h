// Fused planning: how a fused call (all-reduce + add + RMSNorm, optionally quantized) is cut
// into launches of the fused kernels (fused/fused_algo.h) on the peer workspace: rows per
// launch, thread-block cluster size, grid caps, and the launch itself. Every choice here is a
// function of agreed values and the call's shape, so every rank makes the same one.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "anyreduce/anyreduce.h"

namespace anyr {

struct CommContext;
struct FusedParams;
class Capabilities;
class PeerWorkspace;

class FusedPlan {
 public:
  FusedPlan(const CommContext& ctx, const Capabilities& caps, const PeerWorkspace& workspace)
      : ctx_(ctx), caps_(caps), workspace_(workspace) {}
  FusedPlan(const FusedPlan&) = delete;
  FusedPlan& operator=(const FusedPlan&) = delete;

  // Rows of rowBytes one fused-kernel launch of `algo` carries: a one-shot push slot's worth,
  // a two-shot push segment slot's worth per rank, or a staging chunk's worth (the pull
  // kernels); rows are 16-byte vectors; 0: not one row, or no fused kernel.
  uint64_t fusedRowsPerLaunch(anyrAlgo_t algo, uint64_t rowBytes) const;
  // One launch of the fused kernel of `algo` (one-shot or two-shot, push or pull) on `rows`
  // rows of p.hidden elements starting at `rowsIn` (output rows rowBase..), with the
  // communicator's grid (fused/fused_algo.h), in thread-block clusters of `clusterBlocks`
  // blocks (1: a block per row; from fusedClusterBlocks; the pull kernels take 1). Calls and
  // the startup self-test both launch through here. cudaErrorInvalidValue for an algorithm
  // without a fused kernel.
  cudaError_t launchFusedRows(anyrAlgo_t algo, anyrDataType_t dtype, const void* rowsIn,
                              const FusedParams& p, int rowBase, int rows, int clusterBlocks,
                              cudaStream_t stream) const;
  // The cluster size a fused launch of `rows` rows of `hidden` takes (1: a block per row): the
  // configured setting (config.fusedCluster), else pathCluster (the dispatch path's measured
  // size, Path::cluster; 0: none), else the automatic rule (fused_algo.h); 1 where clusters
  // are off or the kernel has no cluster form (the pull kernels).
  int fusedClusterBlocks(int rows, int hidden, int pathCluster, anyrAlgo_t algo,
                         anyrDataType_t dtype, int quant) const;
  // The grid cap of a cluster-form launch of `rows` rows (0: any) of `hidden` in clusters of
  // `clusterBlocks` of the (algo, dtype, quant) variant: maxBlocks where the rows fit one block
  // per SM, else two per SM where that variant's blocks fit it.
  int clusterGridCap(int hidden, int clusterBlocks, int rows, anyrAlgo_t algo, anyrDataType_t dtype,
                     int quant) const;
  // The cluster size the fused kernels take for a few row counts of hidden kClusterSampleHidden
  // (1: a block per row, and always 1 where clusters are off): what explain reports, in its
  // JSON and its text alike.
  static constexpr int kClusterSampleHidden = 6144;
  std::vector<std::pair<int, int>> clusterSizeSamples() const;
  // The cluster sizes tuning measures besides the automatic rule's for `tokens` rows of
  // `hidden` (bf16, quantization `quant`) in fused kernel `algo` (none where clusters are off,
  // configured, or not taken).
  std::vector<int> clusterSizesToMeasure(anyrAlgo_t algo, int tokens, int hidden, int quant) const;

 private:
  const CommContext& ctx_;
  const Capabilities& caps_;
  const PeerWorkspace& workspace_;
};

}  // namespace anyr
