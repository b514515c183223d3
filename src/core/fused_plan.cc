// Fused planning (core/fused_plan.h).
#include "core/fused_plan.h"

#include <algorithm>

#include "algo/registry.h"
#include "core/capabilities.h"
#include "core/context.h"
#include "core/peer_workspace.h"
#include "fused/fused.h"
#include "fused/fused_algo.h"
#include "topology/islands.h"

namespace anyr {

namespace {

// Whether the fused kernel of `algo` has a thread-block cluster form (its registry row says).
bool hasClusterForm(anyrAlgo_t algo) {
  const AlgoInfo* r = findAlgo(algo);
  return r != nullptr && r->fused != nullptr && r->fused->clusterForm;
}

}  // namespace

cudaError_t FusedPlan::launchFusedRows(anyrAlgo_t algo, anyrDataType_t dtype, const void* rowsIn,
                                       const FusedParams& p, int rowBase, int rows,
                                       int clusterBlocks, cudaStream_t stream) const {
  AllReduceArgs a = workspace_.args();
  a.input = rowsIn;
  a.output = nullptr;
  a.count = static_cast<uint64_t>(rows) * static_cast<uint64_t>(p.hidden);
  a.numVecs = static_cast<uint64_t>(rows) * static_cast<uint64_t>(rowVecs(p.hidden));
  // The pull kernels: a block per row (fusedClusterBlocks gives them 1).
  if (algo == anyrAlgoOneShotPull) {
    return launchFusedOneShotPull(dtype, a, p, rowBase, rows, caps_.maxBlocks(), stream,
                                  caps_.pdlOn());
  }
  if (algo == anyrAlgoTwoShot) {
    return launchFusedTwoShotPull(dtype, a, p, rowBase, rows, caps_.maxBlocks(), stream,
                                  caps_.pdlOn());
  }
  // The doubling push's: the fused one-shot push's block-per-row form and grid.
  if (algo == anyrAlgoDoublingPush) {
    return launchFusedDoublingPush(dtype, a, p, rowBase, rows,
                                   fusedOneShotBlocks(rows, a.numVecs, caps_.maxBlocks()), stream,
                                   caps_.pdlOn());
  }
  // Islands: its steps over a grid of the fused one-shot push's size, a block per row.
  if (algo == anyrAlgoIslands) {
    return launchFusedIslands(dtype, a, p, rowBase, rows,
                              fusedOneShotBlocks(rows, a.numVecs, caps_.maxBlocks()), stream,
                              caps_.pdlOn());
  }
  if (algo != anyrAlgoOneShotPush && algo != anyrAlgoTwoShotPush) return cudaErrorInvalidValue;
  // Rows spread over thread-block clusters of clusterBlocks blocks (1: a block per row; the
  // same bits either way).
  if (algo == anyrAlgoOneShotPush) {
    if (clusterBlocks > 1) {
      return launchFusedOneShotPushCluster(
          dtype, a, p, rowBase, rows, clusterBlocks,
          clusterGridCap(p.hidden, clusterBlocks, rows, algo, dtype, p.quant), stream,
          caps_.pdlOn());
    }
    return launchFusedOneShotPush(dtype, a, p, rowBase, rows,
                                  fusedOneShotBlocks(rows, a.numVecs, caps_.maxBlocks()), stream,
                                  caps_.pdlOn());
  }
  if (clusterBlocks > 1) {
    return launchFusedTwoShotPushCluster(
        dtype, a, p, rowBase, rows, clusterBlocks,
        clusterGridCap(p.hidden, clusterBlocks, rows, algo, dtype, p.quant), stream, caps_.pdlOn());
  }
  const FusedLaunchShape shape = fusedTwoShotShape(rows, ctx_.nranks, p.hidden, a.numVecs,
                                                   caps_.maxBlocks(), caps_.fusedDenseBlocks());
  // The dense shape (two blocks per SM) measured 0.5-1% slower with the early release at 256
  // to 1024 rows of 6144 and 7168 on 2 x H200 (docs/PERFORMANCE.md, "Polling"):
  // not taken apart further (the next launch's waiting blocks may crowd the second blocks).
  if (shape.threads == kFusedDenseThreads) a.releaseEarly = 0;
  return launchFusedTwoShotPush(dtype, a, p, rowBase, rows, shape.blocks, stream, caps_.pdlOn(),
                                shape.threads);
}

int FusedPlan::fusedClusterBlocks(int rows, int hidden, int pathCluster, anyrAlgo_t algo,
                                  anyrDataType_t dtype, int quant) const {
  if (!hasClusterForm(algo)) return 1;
  const int setting = ctx_.cfg.fusedCluster != 0 ? ctx_.cfg.fusedCluster : pathCluster;
  return caps_.clusterOn() ? fusedClusterSize(rows, hidden, caps_.maxBlocks(), setting,
                                              clusterGridCap(hidden, 2, 0, algo, dtype, quant))
                           : 1;
}

int FusedPlan::clusterGridCap(int hidden, int clusterBlocks, int rows, anyrAlgo_t algo,
                              anyrDataType_t dtype, int quant) const {
  // Within one block per SM, one block per SM; beyond it two where the variant holds them.
  if (rows > 0 && static_cast<int64_t>(rows) * clusterBlocks <= caps_.maxBlocks())
    return caps_.maxBlocks();
  return fusedClusterPairBlocks(hidden, clusterBlocks, caps_.maxBlocks(),
                                caps_.clusterPairThreads(algo, dtype, quant),
                                caps_.clusterPairBlocks());
}

uint64_t FusedPlan::fusedRowsPerLaunch(anyrAlgo_t algo, uint64_t rowBytes) const {
  switch (algo) {
    case anyrAlgoOneShotPush:
    case anyrAlgoDoublingPush:
      return workspace_.layout().pushSlotBytes / rowBytes;
    case anyrAlgoTwoShotPush:
      return (workspace_.layout().tsSlotBytes / rowBytes) * static_cast<uint64_t>(ctx_.nranks);
    case anyrAlgoIslands:
      // The plain kernel's launch capacity (topology/islands.h).
      return islandLaunchBytes(workspace_.args().islands, workspace_.layout().tsSlotBytes) /
             rowBytes;
    case anyrAlgoOneShotPull:
    case anyrAlgoTwoShot:
      // Staging (and the two-shot's result buffer) hold the launch's rows at their places.
      return workspace_.layout().chunkBytes / rowBytes;
    default:
      return 0;
  }
}

std::vector<std::pair<int, int>> FusedPlan::clusterSizeSamples() const {
  std::vector<std::pair<int, int>> out;
  for (int rows : {1, 8, 16, 32, 64, 96, 128}) {
    out.emplace_back(
        rows,
        caps_.clusterOn()
            ? fusedClusterSize(
                  rows, kClusterSampleHidden, caps_.maxBlocks(), ctx_.cfg.fusedCluster,
                  clusterGridCap(kClusterSampleHidden, 2, 0, anyrAlgoOneShotPush, anyrBfloat16, 0))
            : 1);
  }
  return out;
}

std::vector<int> FusedPlan::clusterSizesToMeasure(anyrAlgo_t algo, int tokens, int hidden,
                                                  int quant) const {
  std::vector<int> sizes;
  // Only where the sizes are this communicator's to choose: clusters admitted, the configured
  // size automatic, rows that clusters take (fused_algo.h), and the fused kernel itself.
  if (!hasClusterForm(algo) || !caps_.clusterOn() || ctx_.cfg.fusedCluster != 0 ||
      !fusedClusterFits(hidden) || !fusedRowFitsRegisters(hidden)) {
    return sizes;
  }
  const uint64_t rowBytes = static_cast<uint64_t>(hidden) * 2;
  const uint64_t perLaunch = fusedRowsPerLaunch(algo, rowBytes);
  if (perLaunch == 0) return sizes;
  const int rows = static_cast<int>(std::min<uint64_t>(static_cast<uint64_t>(tokens), perLaunch));
  const int rule = fusedClusterSize(rows, hidden, caps_.maxBlocks(), 0,
                                    clusterGridCap(hidden, 2, 0, algo, anyrBfloat16, quant));
  for (int c : {1, 2, 4, 8}) {
    if (c != rule) sizes.push_back(c);
  }
  return sizes;
}

}  // namespace anyr
