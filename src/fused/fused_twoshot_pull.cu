// Fused two-shot pull: reduce-scatter and all-gather by peer reads, and the row epilogue on
// every rank, in one kernel, for links where peer reads beat peer writes.
//
// The all-reduce part is twoshot.cu's protocol, in the same buffers and the same launch count
// (a fused launch is one more flag launch: LocalState::syncEpoch and flagUse, the staging and
// result buffers of the epoch's parity, the per-block start and end flags), with rows as the
// unit. Rows are cut into n segments of Lr = ceil(rows / n) rows; rank s owns segment s. Block
// b takes row index i = b, b + G, ... of every segment (G blocks, at most one per SM, the same
// grid on every rank), so block b only ever waits for block b of its peers:
//   1. stage row i of every other segment into the own staging buffer (at the row's place in
//      the launch); the start round (dev::blockBarrier);
//   2. for row i of the own segment: read it from every peer's staging, sum the n
//      contributions in rank order in fp32 (the own one from the input), store the sum rounded
//      to the dtype into the own result buffer (the row's place), and run the register epilogue
//      (fused/epilogue.cuh) on it; the end round;
//   3. for row i of every other segment: read its owner's rounded sum from the owner's result
//      buffer and run the epilogue on it.
// Every rank normalizes every row itself from the reduced values, as the fused two-shot push
// does: a row reaches its epilogue as the same values on every rank (the epilogue starts by
// rounding x to the dtype, which the gathered rows already are), so every rank writes the same
// bits, and they are those of "two-shot, then the standalone add + RMSNorm kernel". Reuse of
// the staging and result buffers is twoshot.cu's argument (buffer j % 2 is rewritten at launch
// j + 2, after every peer's launch j + 1 start flag).
// normOut and residualOut may alias partial: the block that reads a row of partial (step 1 or
// 2) is the block that later writes that row's outputs, each vector by the thread that read it,
// and peers read the staged copy, never partial.
// Rows are held in registers at every width: fusedThreads(hidden) threads of VPT <= 4 vectors
// (launch_rows.cuh). Wide rows (fusedRowFitsRegisters false) spill; the communicator composes
// them unless the algorithm is forced, as for the fused one-shot push.
#include "algo/algo.h"
#include "device/flag_barrier.cuh"
#include "fused/epilogue.cuh"
#include "fused/fused_algo.h"
#include "fused/launch_rows.cuh"
#include "fused/pull_rows.cuh"

namespace anyr {
namespace {

using dev::Vec;

template <typename T, int VPT, int Q, bool kAligned>
// (kAlgoThreads, 1): one block per SM may use 128 registers a thread, so the row stays in
// registers.
__global__ void __launch_bounds__(kAlgoThreads, 1)
    fusedTwoShotPullKernel(AllReduceArgs a, FusedParams p, int rowBase, int rows) {
  __shared__ float red[kFusedRedFloats];
  const auto start = dev::startKernel(a, &LocalState::syncEpoch, dev::flagEpochOf);
  const T* in = static_cast<const T*>(a.input);  // rows [0, rows) of this launch
  const int rank = a.rank;
  const int n = a.nranks;
  LocalState* st = a.state;
  const uint32_t epoch = start.epoch;
  const uint32_t use = dev::flagUseOf(st);  // what this block's flags carry
  const uint64_t parity = epoch & 1u;
  const uint64_t stagingOffset = a.layout.stagingOffset + parity * a.layout.chunkBytes;
  const uint64_t resultOffset = a.layout.resultOffset + parity * a.layout.chunkBytes;
  const uint64_t rowBytes = static_cast<uint64_t>(rowVecs(p.hidden)) * 16;
  const int H = rowVecs(p.hidden);  // 16-byte vectors per row; thread t owns t + k * blockDim.x
  const bool inAligned = kAligned || dev::isAligned(in, 16);
  const int Lr = (rows + n - 1) / n;  // rows per segment
  const int first = static_cast<int>(blockIdx.x);
  char* own = a.peerWorkspace[rank];

  // The weight, the quantization scale and the residual of the block's first own row: their
  // latency hides behind the staging and the wait.
  Vec w[VPT];
  Vec res[VPT];
  dev::loadRowRegs<T, VPT>(static_cast<const T*>(p.weight), 0, p.hidden,
                           kAligned || dev::isAligned(p.weight, 16), w);
  const float qscale = dev::quantScale<Q>(p);
  const bool resAligned = kAligned || dev::isAligned(p.residualIn, 16);
  auto loadResidual = [&](int row) {
    if (p.residualIn != nullptr) {
      dev::loadRowRegs<T, VPT>(static_cast<const T*>(p.residualIn), rowBase + row, p.hidden,
                               resAligned, res);
    }
  };
  if (rank * Lr + first < rows) loadResidual(rank * Lr + first);

  // 1. Stage row i of every other segment; the start round.
  for (int i = first; i < Lr; i += gridDim.x) {
    for (int k = 1; k < n; ++k) {
      const int row = ((rank + k) % n) * Lr + i;
      if (row >= rows) continue;
      Vec x[VPT];
      dev::loadInputRow<T, VPT>(in, row, H, a.count, inAligned, x);
      dev::storeRowForPeers<VPT>(own + stagingOffset, row, H, x);
    }
  }
  bool ok = dev::blockBarrier(a, false, use, start.stopped);

  // 2. The own segment's rows: reduce, publish the rounded sum, normalize; the end round.
  if (ok) {
    for (int i = first; i < Lr; i += gridDim.x) {
      const int row = rank * Lr + i;
      if (row >= rows) break;  // so are the later ones
      if (i != first) loadResidual(row);
      Vec mine[VPT];
      dev::loadInputRow<T, VPT>(in, row, H, a.count, inAligned, mine);
      dev::RowOutputs<T, Q, kAligned> o(p, rowBase + row, qscale);
      o.pin();
      const uint64_t rowOffset = stagingOffset + static_cast<uint64_t>(row) * rowBytes;
      float acc[VPT][8];
      dev::sumRowInRankOrder<T, VPT>(acc, mine, rank, n, H,
                                     [&](int s) { return a.peerWorkspace[s] + rowOffset; });
      // What the peers read (before the epilogue, which rounds acc in place): the sum rounded
      // to the dtype, as twoshot.cu stores it.
      Vec y[VPT];
#pragma unroll
      for (int k = 0; k < VPT; ++k) y[k] = dev::packVec<T>(acc[k]);
      dev::storeRowForPeers<VPT>(own + resultOffset, row, H, y);
      if (i != first) __syncthreads();  // the previous row's epilogue has read red
      dev::fusedRowEpilogueRegs<T, VPT, Q, kAligned>(p, o, acc, res, w, red, true);
    }
    ok = dev::blockBarrier(a, true, use, start.stopped);
  }

  // 3. Row i of every other segment, from its owner's result buffer.
  if (ok) {
    for (int i = first; i < Lr; i += gridDim.x) {
      for (int k = 1; k < n; ++k) {
        const int s = (rank + k) % n;
        const int row = s * Lr + i;
        if (row >= rows) continue;
        loadResidual(row);
        dev::RowOutputs<T, Q, kAligned> o(p, rowBase + row, qscale);
        o.pin();
        const char* src = a.peerWorkspace[s] + resultOffset + static_cast<uint64_t>(row) * rowBytes;
        Vec x[VPT];
#pragma unroll
        for (int v = 0; v < VPT; ++v) {
          const int j = static_cast<int>(threadIdx.x) + v * static_cast<int>(blockDim.x);
          x[v] = Vec{};
          if (j < H) x[v].u = dev::loadCg(src + static_cast<uint64_t>(j) * 16);
        }
        float acc[VPT][8];
#pragma unroll
        for (int v = 0; v < VPT; ++v) {
#pragma unroll
          for (int q = 0; q < 8; ++q) acc[v][q] = dev::vecElem<T>(x[v], q);
        }
        // The end round's barrier separates the first of these from the last own row's
        // epilogue; every later one waits for the previous one's reads of red.
        if (i != first || k != 1) __syncthreads();
        dev::fusedRowEpilogueRegs<T, VPT, Q, kAligned>(p, o, acc, res, w, red, true);
      }
    }
  }

  dev::finishEpoch(st->syncEpoch, epoch);
  dev::finishFlagUse(st, use);
}

struct TwoShotPullKernels {
  static constexpr int kMaxVpt = dev::kFusedRegsMaxVpt;
  template <typename T, int VPT, int Q, bool kAligned>
  static auto kernel() {
    return fusedTwoShotPullKernel<T, VPT, Q, kAligned>;
  }
};

}  // namespace

cudaError_t launchFusedTwoShotPull(anyrDataType_t dtype, const AllReduceArgs& a,
                                   const FusedParams& p, int rowBase, int rows, int maxBlocks,
                                   cudaStream_t stream, bool pdl) {
  return launchRowsInRegisters<TwoShotPullKernels>(
      dtype, a, p, rowBase, rows, fusedTwoShotPullBlocks(rows, a.nranks, maxBlocks), stream, pdl);
}

}  // namespace anyr
