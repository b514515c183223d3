// Fused islands: the two-level all-reduce of algo/islands.cu, then the residual add + RMSNorm
// (+ quantization) of every row, in one kernel.
//
// Steps 1-3 are the islands kernel's (algo/islands.cuh), over the whole grid, in the same
// buffers and launch count (a fused launch is one more launch of the two-shot push family):
// gather inside the island, exchange across the islands, and the owners' rank-order sums, which
// go to the island's other members' gather slots and, here, into this rank's own gather slot
// [rank] too. Then the rows: block b takes rows b, b + G, ...; it polls each vector of the row
// where its slice's owner in this island put it (the own slot for the vectors this rank owns,
// written by whichever thread of this grid reduced them) and runs the register epilogue
// (fused/epilogue.cuh). A row reaches its epilogue as the same rounded values on every rank,
// so every rank writes the same bits, and they are those of "islands, then the standalone add
// + RMSNorm kernel". The own gather slot is written by this rank alone (the plain islands
// kernel and the two-shot push write only their peers'): the thread that reads a vector of it
// clears it right away, so it is clear between launches, as in the fused two-shot push.
//
// Waits: steps 1-3 as in the islands kernel; a row waits only for results (step 3), which wait
// only for steps 1-2, which wait for nothing but step 1. Every block of the grid is resident (a
// block per row, at most one per SM), so every wait ends.
//
// normOut and residualOut may alias partial: a row's outputs are written only after every
// owner's result for it arrived, and each result follows every load of that row's vectors of
// partial on this rank (step 1 loads a vector before it sends it; steps 2 and 3 load an owned
// vector before the result that carries it leaves).
#include "algo/algo.h"
#include "algo/islands.cuh"
#include "algo/twoshot_push.cuh"
#include "fused/epilogue.cuh"
#include "fused/fused_algo.h"
#include "fused/launch_rows.cuh"

namespace anyr {
namespace {

using dev::Vec;

template <typename T, int VPT, int Q, bool kAligned>
__global__ void __launch_bounds__(kAlgoThreads, 1)
    fusedIslandsKernel(AllReduceArgs a, FusedParams p, int rowBase, int rows) {
  __shared__ float red[kFusedRedFloats];
  dev::waitForPrevious(a.releaseEarly);
  const T* in = static_cast<const T*>(a.input);
  LocalState* st = a.state;
  const dev::Phases ph = dev::phasesOf(st->tsEpoch);
  const bool stopped = dev::stopRequested(st);
  const int H = rowVecs(p.hidden);
  const bool inAligned = kAligned || dev::isAligned(in, 16);
  const dev::IslandsGrid g(a, static_cast<uint64_t>(rows) * H);
  auto load = [&](uint32_t v) {
    Vec x = dev::loadRowVec(in, v, a.count, inAligned);
    dev::sanitize<T>(x);
    return x;
  };

  // 1. Gather; then the weight and the block's first residual row (their latency hides behind
  // the waits of steps 2 and 3).
  dev::islandsGather(a, g, ph.cur, stopped, load);
  Vec w[VPT];
  Vec res[VPT];
  dev::loadRowRegs<T, VPT>(static_cast<const T*>(p.weight), 0, p.hidden,
                           kAligned || dev::isAligned(p.weight, 16), w);
  const float qscale = dev::quantScale<Q>(p);
  const bool resAligned = kAligned || dev::isAligned(p.residualIn, 16);
  if (p.residualIn != nullptr && static_cast<int>(blockIdx.x) < rows) {
    dev::loadRowRegs<T, VPT>(static_cast<const T*>(p.residualIn), rowBase + blockIdx.x, p.hidden,
                             resAligned, res);
  }

  dev::twoShotClear(a, ph);

  // 2-3. Exchange across the islands; reduce the owned vectors into the island's gather slots,
  // this rank's own included.
  dev::Waiter waiter(a.wait);
  bool ok = dev::islandsExchange<T>(a, g, ph, stopped, waiter, load);
  if (ok) ok = dev::islandsReduce<T, true>(a, g, ph, waiter, load, [](uint32_t, const Vec&) {});

  // 4. Rows: each vector from its owner (second hand: an owner sends a result once its own
  // waits of steps 2 and 3 are done), then the epilogue in registers. A failed wait above leaves
  // `ok` false: the row's barrier then tells the whole block to stop.
  for (int row = blockIdx.x; row < rows; row += gridDim.x) {
    if (row != static_cast<int>(blockIdx.x)) {
      __syncthreads();  // the previous row's epilogue has read red
      if (p.residualIn != nullptr) {
        dev::loadRowRegs<T, VPT>(static_cast<const T*>(p.residualIn), rowBase + row, p.hidden,
                                 resAligned, res);
      }
    }
    dev::RowOutputs<T, Q, kAligned> o(p, rowBase + row, qscale);
    o.pin();
    float acc[VPT][8];
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int j = threadIdx.x + k * blockDim.x;
      Vec x = {};
      if (j < H && ok) {
        int owner = 0;
        char* at = dev::islandsGathered(
            a, g, ph.cur, static_cast<uint32_t>(row) * static_cast<uint32_t>(H) + j, &owner);
        ok = dev::pollVec<T>(at, &x, waiter, owner, ph.epoch, kWaitLaterRound);
        if (ok && owner == a.rank) dev::storeRelaxed(at, dev::clearVec());
      }
#pragma unroll
      for (int q = 0; q < 8; ++q) acc[k][q] = dev::vecElem<T>(x, q);
    }
    // Uniform: the epilogue's barrier tells every thread whether any part failed.
    if (!dev::fusedRowEpilogueRegs<T, VPT, Q, kAligned>(p, o, acc, res, w, red, ok)) break;
  }

  // Every slot of this phase got at most the busiest owner's places.
  dev::finishPushKernel(st->tsEpoch, st->tsVecs, ph, islands::slotExtent(a.islands, g.L));
}

struct IslandsKernels {
  static constexpr int kMaxVpt = dev::kFusedRegsMaxVpt;
  template <typename T, int VPT, int Q, bool kAligned>
  static auto kernel() {
    return fusedIslandsKernel<T, VPT, Q, kAligned>;
  }
};

}  // namespace

cudaError_t launchFusedIslands(anyrDataType_t dtype, const AllReduceArgs& a, const FusedParams& p,
                               int rowBase, int rows, int blocks, cudaStream_t stream, bool pdl) {
  if (a.islands.count < 2) return cudaErrorInvalidValue;  // admission refuses it before this
  return launchRowsInRegisters<IslandsKernels>(dtype, a, p, rowBase, rows, blocks, stream, pdl);
}

}  // namespace anyr
