// Fused one-shot pull: all-reduce + residual add + RMSNorm (+ quantization) in one kernel, for
// links where peer reads beat peer writes.
//
// The all-reduce part is oneshot_pull.cu's protocol, in the same buffers and the same launch
// count (a fused launch is one more flag launch: LocalState::syncEpoch and flagUse, the staging
// buffer of the epoch's parity, the per-block start flags), with the rows as the unit: block b
// owns rows b, b + G, ... of the launch (G blocks, at most one per SM, the same grid on every
// rank), and block b of every rank owns the same rows, so block b only waits for block b of
// its peers:
//   1. stage: the block's rows of the input into the own staging buffer, at their place in the
//      launch (row-major, 16-byte vectors);
//   2. raise the block's start flag at every peer, wait for every peer's (dev::blockBarrier);
//   3. for each of its rows: read every peer's staged row, sum the n contributions in rank
//      order in fp32 in registers (the own one from the input), and run the register-resident
//      row epilogue (fused/epilogue.cuh), so the outputs carry exactly the bits of "all-reduce,
//      then the standalone add + RMSNorm kernel".
// The weight, the quantization scale and the first row's residual are loaded before the wait,
// so their latency overlaps it. Reuse of a staging buffer is oneshot_pull.cu's argument: this
// rank rewrites buffer (j % 2) at launch j + 2, after its launch j + 1 received a start flag of
// every peer's launch j + 1, which the peer raised after its launch j (and every read of this
// rank's buffer in it) completed.
// normOut and residualOut may alias partial: a row of partial is read (staged, then summed)
// only by the block that later writes that row's outputs, each vector by the thread that
// writes that vector's outputs; peers read the staged copy, never partial.
// Threads per block: fusedThreads(hidden); VPT (vectors per thread), the quantization mode and
// whether every buffer allows whole vectors are template parameters (launch_rows.cuh), as in
// the fused one-shot push.
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
// registers (as the fused one-shot push).
__global__ void __launch_bounds__(kAlgoThreads, 1)
    fusedOneShotPullKernel(AllReduceArgs a, FusedParams p, int rowBase, int rows) {
  __shared__ float red[kFusedRedFloats];
  const auto start = dev::startKernel(a, &LocalState::syncEpoch, dev::flagEpochOf);
  const T* in = static_cast<const T*>(a.input);  // rows [0, rows) of this launch
  const int rank = a.rank;
  const int n = a.nranks;
  LocalState* st = a.state;
  const uint32_t epoch = start.epoch;
  const uint32_t use = dev::flagUseOf(st);  // what this block's flags carry
  const uint64_t bufOffset = a.layout.stagingOffset + (epoch & 1u) * a.layout.chunkBytes;
  const int H = rowVecs(p.hidden);  // 16-byte vectors per row; thread t owns t + k * blockDim.x
  const bool inAligned = kAligned || dev::isAligned(in, 16);
  const int first = static_cast<int>(blockIdx.x);

  // The weight, the quantization scale and the residual of the block's first row: their
  // latency hides behind the staging and the wait.
  Vec w[VPT];
  Vec res[VPT];
  dev::loadRowRegs<T, VPT>(static_cast<const T*>(p.weight), 0, p.hidden,
                           kAligned || dev::isAligned(p.weight, 16), w);
  const float qscale = dev::quantScale<Q>(p);
  const bool resAligned = kAligned || dev::isAligned(p.residualIn, 16);
  if (p.residualIn != nullptr && first < rows) {
    dev::loadRowRegs<T, VPT>(static_cast<const T*>(p.residualIn), rowBase + first, p.hidden,
                             resAligned, res);
  }

  // 1. Stage the block's rows (the first one stays in registers: its own term).
  char* own = a.peerWorkspace[rank] + bufOffset;
  Vec mine[VPT];
  for (int row = first; row < rows; row += gridDim.x) {
    Vec x[VPT];
    dev::loadInputRow<T, VPT>(in, row, H, a.count, inAligned, x);
    dev::storeRowForPeers<VPT>(own, row, H, x);
    if (row == first) {
#pragma unroll
      for (int k = 0; k < VPT; ++k) mine[k] = x[k];
    }
  }

  // 2. The start round: every peer's block staged the same rows.
  const bool ok = dev::blockBarrier(a, false, use, start.stopped);

  // 3. Each row: the n contributions in rank order (fp32), then the epilogue in registers.
  if (ok) {
    for (int row = first; row < rows; row += gridDim.x) {
      if (row != first) {
        if (p.residualIn != nullptr) {
          dev::loadRowRegs<T, VPT>(static_cast<const T*>(p.residualIn), rowBase + row, p.hidden,
                                   resAligned, res);
        }
        dev::loadInputRow<T, VPT>(in, row, H, a.count, inAligned, mine);
      }
      dev::RowOutputs<T, Q, kAligned> o(p, rowBase + row, qscale);
      o.pin();
      const uint64_t rowOffset = bufOffset + static_cast<uint64_t>(row) * H * 16;
      float acc[VPT][8];
      dev::sumRowInRankOrder<T, VPT>(acc, mine, rank, n, H,
                                     [&](int s) { return a.peerWorkspace[s] + rowOffset; });
      if (row != first) __syncthreads();  // the previous row's epilogue has read red
      dev::fusedRowEpilogueRegs<T, VPT, Q, kAligned>(p, o, acc, res, w, red, true);
    }
  }

  dev::finishEpoch(st->syncEpoch, epoch);
  dev::finishFlagUse(st, use);
}

struct OneShotPullKernels {
  static constexpr int kMaxVpt = dev::kFusedRegsMaxVpt;
  template <typename T, int VPT, int Q, bool kAligned>
  static auto kernel() {
    return fusedOneShotPullKernel<T, VPT, Q, kAligned>;
  }
};

}  // namespace

cudaError_t launchFusedOneShotPull(anyrDataType_t dtype, const AllReduceArgs& a,
                                   const FusedParams& p, int rowBase, int rows, int maxBlocks,
                                   cudaStream_t stream, bool pdl) {
  return launchRowsInRegisters<OneShotPullKernels>(
      dtype, a, p, rowBase, rows, fusedOneShotPullBlocks(rows, maxBlocks), stream, pdl);
}

}  // namespace anyr
