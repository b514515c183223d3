// Fused two-shot push: reduce-scatter by rows, all-gather of the reduced rows, and the row
// epilogue on every rank as the rows arrive, in one kernel.
//
// Rows are cut into n segments of Lr rows; rank s owns segment s. Block b handles row index
// i = b, b + G, ... of every segment, with twoshot_push.cu's protocol and buffers (a fused
// launch is one more two-shot push launch):
//   1. scatter: row i of segment s goes to slot [rank] of rank s's scatter buffer;
//   2. reduce row i of the own segment in rank order (fp32) into shared memory, send its
//      rounded values to every peer's gather buffer, and run the epilogue on it;
//   3. for every other segment, take row i from the gather buffer as it arrives and run the
//      epilogue on it.
// Every rank normalizes every row itself from the gathered all-reduce result instead of
// gathering normed output and residual: half the gather traffic, and the same bits (the
// epilogue is deterministic and starts by rounding x to the dtype, which the gathered rows
// already are).
// normOut may alias partial: the block that reads a row of partial (scatter or reduce) is the
// block that later writes that row's outputs, after a barrier.
#include <type_traits>

#include "algo/algo.h"
#include "device/lamport.cuh"
#include "device/launch.cuh"
#include "fused/epilogue.cuh"
#include "fused/fused_algo.h"
#include "fused/launch.cuh"
#include "fused/launch_rows.cuh"

namespace anyr {

// Dynamic shared memory of this file's kernels, at most (scripts/check-smem.py reads the line):
// anyr-dynamic-smem-max: 69648
static_assert(fusedSharedBytes(kFusedMaxHidden) == 69648, "update anyr-dynamic-smem-max");
namespace {

using dev::Elem;
using dev::Vec;

template <typename T>
__global__ void __launch_bounds__(kAlgoThreads)
    fusedTwoShotPushKernel(AllReduceArgs a, FusedParams p, int rowBase, int rows) {
  extern __shared__ float4 smemRaw[];
  float* xs = reinterpret_cast<float*>(smemRaw);
  float* red = xs + p.hidden;
  __shared__ int blockFailed;
  dev::waitForPrevious(a.releaseEarly);
  const T* in = static_cast<const T*>(a.input);
  const int rank = a.rank;
  const int n = a.nranks;
  LocalState* st = a.state;
  const dev::Phases ph = dev::phasesOf(st->tsEpoch);
  const bool stopped = dev::stopRequested(st);
  const uint32_t epoch = ph.epoch;
  const uint32_t phase = ph.cur;
  const uint64_t slot = a.layout.tsSlotBytes;
  const int H = rowVecs(p.hidden);
  // Any input alignment: whether a call runs fused must not depend on a rank's own pointers.
  const bool inAligned = dev::isAligned(in, 16);
  const int Lr = (rows + n - 1) / n;                 // rows per segment
  const uint64_t L = static_cast<uint64_t>(Lr) * H;  // vectors per segment slot
  if (threadIdx.x == 0) blockFailed = 0;

  // 1. Scatter.
  for (int i = blockIdx.x; i < Lr; i += gridDim.x) {
    for (int k = 1; k < n; ++k) {
      const int s = (rank + k) % n;
      const int row = s * Lr + i;
      if (row >= rows) continue;
      for (int j = threadIdx.x; j < H; j += blockDim.x) {
        Vec x = dev::loadRowVec(in, static_cast<uint64_t>(row) * H + j, a.count, inAligned);
        dev::sanitize<T>(x);
        if (dev::opaque(stopped)) continue;  // nothing to peers once stopped
        dev::storeSys(dev::twoShotArea(a, s, phase, 0) + static_cast<uint64_t>(rank) * slot +
                          (static_cast<uint64_t>(i) * H + j) * 16,
                      x.u);
      }
    }
  }

  if (a.pushFence) __threadfence_system();

  // 2. Clear what peers wrote one launch ago.
  for (int g = 0; g < 2; ++g) {
    dev::clearPeerSlots(dev::twoShotArea(a, rank, ph.prev, g), slot, n, rank, st->tsVecs[ph.prev]);
  }
  __syncthreads();

  dev::Waiter waiter(a.wait);
  const char* scatter = dev::twoShotArea(a, rank, phase, 0);
  const char* gather = dev::twoShotArea(a, rank, phase, 1);
  for (int i = blockIdx.x; i < Lr; i += gridDim.x) {
    // 3. Reduce the own row, send it, normalize it.
    const int ownRow = rank * Lr + i;
    bool ok = true;
    if (ownRow < rows) {
      for (int j = threadIdx.x; j < H && ok; j += blockDim.x) {
        const uint64_t off = static_cast<uint64_t>(i) * H + j;
        float acc[8] = {};
        for (int s = 0; s < n && ok; ++s) {
          Vec x;
          if (s == rank) {
            x = dev::loadRowVec(in, static_cast<uint64_t>(ownRow) * H + j, a.count, inAligned);
            dev::sanitize<T>(x);
          } else {
            ok = dev::pollVec<T>(scatter + static_cast<uint64_t>(s) * slot + off * 16, &x, waiter,
                                 s, epoch);
          }
          dev::accumulate<T>(acc, x);
        }
        if (!ok) break;  // a partial sum must not reach the peers' gather slots
        Vec y = dev::packVec<T>(acc);
        dev::sanitize<T>(y);
        for (int k = 1; k < n; ++k) {
          const int s = (rank + k) % n;
          dev::storeSys(
              dev::twoShotArea(a, s, phase, 1) + static_cast<uint64_t>(rank) * slot + off * 16,
              y.u);
        }
        // The epilogue starts from round_T(x): keep the rounded (and sanitized) values, so
        // this rank normalizes exactly what its peers receive.
#pragma unroll
        for (int q = 0; q < 8; ++q) xs[8 * j + q] = dev::vecElem<T>(y, q);
      }
      if (!ok) blockFailed = 1;
      __syncthreads();
      if (blockFailed) break;
      dev::fusedRowEpilogue<T>(p, rowBase + ownRow, xs, red);
    }
    // 4. The other segments' row i, as their owners send it (second hand, kWaitLaterRound: an
    // owner sends its row once its own reduce-scatter waits are done).
    for (int k = 1; k < n; ++k) {
      const int s = (rank + k) % n;
      const int row = s * Lr + i;
      if (row >= rows) continue;
      for (int j = threadIdx.x; j < H && ok; j += blockDim.x) {
        Vec x;
        ok = dev::pollVec<T>(
            gather + static_cast<uint64_t>(s) * slot + (static_cast<uint64_t>(i) * H + j) * 16, &x,
            waiter, s, epoch, kWaitLaterRound);
#pragma unroll
        for (int q = 0; q < 8; ++q) xs[8 * j + q] = dev::vecElem<T>(x, q);
      }
      if (!ok) blockFailed = 1;
      __syncthreads();
      if (blockFailed) break;
      dev::fusedRowEpilogue<T>(p, rowBase + row, xs, red);
    }
    if (blockFailed) break;
  }

  if (blockIdx.x == 0 && threadIdx.x == 0) st->tsVecs[phase] = static_cast<uint32_t>(L);
  dev::finishEpoch(st->tsEpoch, dev::nextPushEpoch(epoch));
}

// Steps 1-3 of the register and cluster forms, over the whole grid (thread i of the grid
// handles vector i of every segment): scatterRows() sends, clearAndReduce() clears what peers
// wrote one launch ago and reduces the own segment into every rank's gather buffer (false
// when a wait failed). Kernels load their rows' weight and residual between the two: the
// peers wait for the scatter, and the loads' latency hides behind the reduce's wait.
//
// A launch's vectors as the register and cluster forms' steps 1-3 cut them: segments of L
// vectors (V in all); thread `first` of the grid takes vectors first, first + stride, ... of
// every segment.
struct SegmentGrid {
  uint64_t L, V, stride, first;
  __device__ __forceinline__ SegmentGrid(int rows, int n, int H)
      : L(static_cast<uint64_t>((rows + n - 1) / n) * H),
        V(static_cast<uint64_t>(rows) * H),
        stride(static_cast<uint64_t>(gridDim.x) * blockDim.x),
        first(static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x) {}
};

template <typename T>
__device__ __forceinline__ void scatterRows(const AllReduceArgs& a, const T* in, bool inAligned,
                                            int rows, int H, const dev::Phases& ph, bool stopped) {
  const int rank = a.rank;
  const int n = a.nranks;
  const uint64_t slot = a.layout.tsSlotBytes;
  const SegmentGrid seg(rows, n, H);
  const uint64_t L = seg.L, V = seg.V, stride = seg.stride, first = seg.first;

  // 1. Scatter.
  for (uint64_t i = first; i < L; i += stride) {
    for (int k = 1; k < n; ++k) {
      const int s = (rank + k) % n;
      const uint64_t v = static_cast<uint64_t>(s) * L + i;
      if (v >= V) continue;
      Vec x = dev::loadRowVec(in, v, a.count, inAligned);
      dev::sanitize<T>(x);
      if (dev::opaque(stopped)) continue;  // nothing to peers once stopped (dev::stopRequested)
      dev::storeSys(dev::twoShotArea(a, s, ph.cur, 0) + static_cast<uint64_t>(rank) * slot + i * 16,
                    x.u);
    }
  }

  if (a.pushFence) __threadfence_system();
}

template <typename T>
__device__ __forceinline__ bool clearAndReduce(const AllReduceArgs& a, const T* in, bool inAligned,
                                               int rows, int H, const dev::Phases& ph,
                                               dev::Waiter& waiter) {
  const int rank = a.rank;
  const int n = a.nranks;
  LocalState* st = a.state;
  const uint32_t epoch = ph.epoch;
  const uint32_t phase = ph.cur;
  const uint64_t slot = a.layout.tsSlotBytes;
  const SegmentGrid seg(rows, n, H);
  const uint64_t L = seg.L, V = seg.V, stride = seg.stride, first = seg.first;

  // 2. Clear what peers wrote one launch ago.
  for (int g = 0; g < 2; ++g) {
    dev::clearPeerSlots(dev::twoShotArea(a, rank, ph.prev, g), slot, n, rank, st->tsVecs[ph.prev]);
  }

  // 3. Reduce the own segment; send it to every rank's gather buffer.
  bool ok = true;
  const char* scatter = dev::twoShotArea(a, rank, phase, 0);
  for (uint64_t i = first; i < L && ok; i += stride) {
    const uint64_t v = static_cast<uint64_t>(rank) * L + i;
    if (v >= V) break;
    float acc[8] = {};
    for (int s = 0; s < n && ok; ++s) {
      Vec x;
      if (s == rank) {
        x = dev::loadRowVec(in, v, a.count, inAligned);
        dev::sanitize<T>(x);
      } else {
        ok = dev::pollVec<T>(scatter + static_cast<uint64_t>(s) * slot + i * 16, &x, waiter, s,
                             epoch);
      }
      dev::accumulate<T>(acc, x);
    }
    if (!ok) break;
    Vec y = dev::packVec<T>(acc);
    dev::sanitize<T>(y);
    for (int k = 0; k < n; ++k) {
      const int s = (rank + k) % n;
      dev::storeSys(dev::twoShotArea(a, s, phase, 1) + static_cast<uint64_t>(rank) * slot + i * 16,
                    y.u);
    }
  }

  return ok;
}

// The register form, for rows a block holds in registers (rowVecs(hidden) <= 2 x fusedThreads; in
// the dense shape, fusedTwoShotShape, 256 threads a block with up to four vectors each):
// the traffic is spread over the whole grid as in twoshot_push.cu, and rows are normalized by
// blocks as in fused_oneshot_push.cu. Thread i of the grid handles vector i of every segment:
//   1. scatter: vector i of every peer's segment s into slot [rank] of s's scatter buffer;
//   2. reduce: vector i of the own segment, in rank order (fp32), rounded and sanitized, into
//      slot [rank] of every rank's gather buffer, this rank's own included;
//   3. rows: block b takes rows b, b + G, ...; it polls the row in its owner's gather slot
//      (the own rows come from other blocks of this grid) and runs the register epilogue.
// A row reaches its epilogue as the same rounded values on every rank, so every rank writes
// the same bits, and they are the bits of "two-shot push, then the standalone kernel". The own
// gather slot is written by this rank alone: the block that reads a vector of it clears it
// right away (no other algorithm writes or clears that slot, so it is clear between launches).
// The weight and the block's first residual row are loaded before the wait. No block waits
// for a block that waits for it: the scatter waits for nothing, the reduce only for the peers'
// scatter, the rows only for reduces.
template <typename T, int VPT, int Q, bool kAligned>
__global__ void __launch_bounds__(kAlgoThreads, 1)
    fusedTwoShotPushRegsKernel(AllReduceArgs a, FusedParams p, int rowBase, int rows) {
  __shared__ float red[kFusedRedFloats];
  dev::waitForPrevious(a.releaseEarly);
  const T* in = static_cast<const T*>(a.input);
  const int rank = a.rank;
  const int n = a.nranks;
  LocalState* st = a.state;
  const dev::Phases ph = dev::phasesOf(st->tsEpoch);
  const bool stopped = dev::stopRequested(st);
  const uint32_t epoch = ph.epoch;
  const uint32_t phase = ph.cur;
  const uint64_t slot = a.layout.tsSlotBytes;
  const int H = rowVecs(p.hidden);
  const bool inAligned = kAligned || dev::isAligned(in, 16);
  const int Lr = (rows + n - 1) / n;                 // rows per segment
  const uint64_t L = static_cast<uint64_t>(Lr) * H;  // vectors per segment slot

  // 1. Scatter; then the weight and the block's first residual row (the peers wait for the
  // scatter; the loads' latency hides behind the reduce's wait).
  scatterRows<T>(a, in, inAligned, rows, H, ph, stopped);
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

  // 2-3. Clear, reduce the own segment into every rank's gather buffer.
  dev::Waiter waiter(a.wait);
  bool ok = clearAndReduce<T>(a, in, inAligned, rows, H, ph, waiter);

  // 4. Rows: the owner's reduced row, then the epilogue in registers. A failed wait above
  // leaves `ok` false: the first row's barrier then tells the whole block to stop.
  char* gather = dev::twoShotArea(a, rank, phase, 1);
  for (int row = blockIdx.x; row < rows; row += gridDim.x) {
    if (row != static_cast<int>(blockIdx.x)) {
      __syncthreads();  // the previous row's epilogue has read red
      if (p.residualIn != nullptr) {
        dev::loadRowRegs<T, VPT>(static_cast<const T*>(p.residualIn), rowBase + row, p.hidden,
                                 resAligned, res);
      }
    }
    const int owner = row / Lr;
    char* src = gather + static_cast<uint64_t>(owner) * slot +
                static_cast<uint64_t>(row - owner * Lr) * H * 16;
    dev::RowOutputs<T, Q, kAligned> o(p, rowBase + row, qscale);
    o.pin();
    Vec x[VPT];
    if (ok) ok = dev::pollRowRegs<T, VPT>(src, H, x, waiter, owner, epoch, kWaitLaterRound);
    if (ok && owner == rank) {
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        const int j = threadIdx.x + k * blockDim.x;
        if (j < H) dev::storeRelaxed(src + static_cast<uint64_t>(j) * 16, dev::clearVec());
      }
    }
    float acc[VPT][8];
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
#pragma unroll
      for (int q = 0; q < 8; ++q) acc[k][q] = dev::vecElem<T>(x[k], q);
    }
    // Uniform: the epilogue's barrier tells every thread whether any part failed.
    if (!dev::fusedRowEpilogueRegs<T, VPT, Q, kAligned>(p, o, acc, res, w, red, ok)) {
      break;
    }
  }

  if (blockIdx.x == 0 && threadIdx.x == 0) st->tsVecs[phase] = static_cast<uint32_t>(L);
  dev::finishEpoch(st->tsEpoch, dev::nextPushEpoch(epoch));
}

// The cluster form of the register form (hidden <= 8192, where the communicator's cluster
// probe passed): steps 1-3 as above over the whole grid, then each row is polled and
// normalized by the C blocks of one cluster, thread t of block c holding vector c * B + t
// (fused/epilogue.cuh, fusedRowEpilogueCluster). Same buffers, protocol and bits.
// kPairThreads > 0: the variant for launches beyond one block per SM, compiled for two blocks
// of at most kPairThreads threads per SM (fewer registers).
template <typename T, int Q, bool kAligned, int kPairThreads>
__global__ void __launch_bounds__(kPairThreads > 0 ? kPairThreads : kFusedClusterMaxThreads,
                                  kPairThreads > 0 ? 2 : 1)
    fusedTwoShotPushClusterKernel(AllReduceArgs a, FusedParams p, int rowBase, int rows) {
  __shared__ dev::ClusterExchange xch;
  dev::waitForPrevious(a.releaseEarly);
  const T* in = static_cast<const T*>(a.input);
  const int rank = a.rank;
  const int n = a.nranks;
  LocalState* st = a.state;
  const dev::Phases ph = dev::phasesOf(st->tsEpoch);
  // A stopped communicator (dev::stopRequested): no scatter and no wait; every row then fails
  // through the cluster exchange, so no block leaves its cluster behind.
  const bool stopped = dev::stopRequested(st);
  const uint32_t epoch = ph.epoch;
  const uint64_t slot = a.layout.tsSlotBytes;
  const int H = rowVecs(p.hidden);
  const bool inAligned = kAligned || dev::isAligned(in, 16);
  const int Lr = (rows + n - 1) / n;
  const uint64_t L = static_cast<uint64_t>(Lr) * H;
  dev::ClusterRowThread<T, Q, kAligned> me(p);
  const int cluster = me.cluster, clusters = me.clusters, first = me.first;

  // Scatter; the weight, the first residual row and the exchange's setup; clear and reduce.
  scatterRows<T>(a, in, inAligned, rows, H, ph, stopped);
  me.loadConstants(p);
  if (cluster < rows) me.loadResidual(p, rowBase + cluster);
  dev::clusterExchangeBegin(xch);
  dev::Waiter waiter(a.wait);
  bool ok = !stopped && clearAndReduce<T>(a, in, inAligned, rows, H, ph, waiter);

  char* gather = dev::twoShotArea(a, rank, ph.cur, 1);
  uint32_t rowsDone = 0;
  for (int row = cluster; row < rows; row += clusters) {
    if (row != cluster) me.loadResidual(p, rowBase + row);
    const int owner = row / Lr;
    char* src = gather + static_cast<uint64_t>(owner) * slot +
                (static_cast<uint64_t>(row - owner * Lr) * H + static_cast<uint64_t>(first)) * 16;
    dev::RowOutputs<T, Q, kAligned> o(p, rowBase + row, me.qscale);
    o.pin();
    Vec x[1] = {};
    if (ok) ok = dev::pollRowRegs<T, 1>(src, H - first, x, waiter, owner, epoch, kWaitLaterRound);
    if (ok && owner == rank && me.active) {
      dev::storeRelaxed(src + static_cast<uint64_t>(threadIdx.x) * 16, dev::clearVec());
    }
    float acc[8];
#pragma unroll
    for (int q = 0; q < 8; ++q) acc[q] = dev::vecElem<T>(x[0], q);
    // Cluster-uniform: every block learns whether any part of the row failed.
    if (!dev::fusedRowEpilogueCluster<T, Q, kAligned>(p, o, me.v, acc, me.res, me.w, xch, rowsDone,
                                                      ok, waiter, rank, epoch)) {
      break;
    }
  }
  dev::clusterExchangeEnd(rowsDone);

  if (blockIdx.x == 0 && threadIdx.x == 0) st->tsVecs[ph.cur] = static_cast<uint32_t>(L);
  dev::finishEpoch(st->tsEpoch, dev::nextPushEpoch(epoch));
}

struct TwoShotClusterKernels {
  template <typename T, int Q, bool kAligned>
  static auto kernel() {
    return fusedTwoShotPushClusterKernel<T, Q, kAligned, 0>;
  }
  // The pair variants (aligned buffers), compiled for two blocks per SM: of 448 threads (72
  // registers; hidden 7168 in clusters of two), and where that one spills (ptxas, CUDA 13,
  // sm_90: NVFP4, 8 bytes in bf16, 16 in fp16; fp16 FP8, 12) also of 384 (80 registers; fp16
  // NVFP4 still spills 4 bytes) for blocks of up to 384 threads (hidden 6144). Unlike the
  // one-shot's, their waits' checks stay calls: inlined, they cost more registers here than
  // the call does. NULL for blocks of more than 448 threads.
  template <typename T, int Q>
  static ClusterKernel pairKernelFor(int threads) {
    if constexpr (Q == anyrQuantNvfp4 || (Q == anyrQuantFp8 && std::is_same_v<T, __half>)) {
      if (threads <= 384) return fusedTwoShotPushClusterKernel<T, Q, true, 384>;
    }
    return threads <= 448 ? fusedTwoShotPushClusterKernel<T, Q, true, 448> : nullptr;
  }
};

struct TwoShotKernels {
  // Up to 2 at fusedThreads (fusedRowFitsRegisters: wider rows take the staged form), up to 4
  // at kFusedDenseThreads (hidden 8192).
  static constexpr int kMaxVpt = 4;
  template <typename T, int VPT, int Q, bool kAligned>
  static auto kernel() {
    return fusedTwoShotPushRegsKernel<T, VPT, Q, kAligned>;
  }
};

// Lowers *least to the blocks of kFusedDenseThreads an SM holds of each of T's variants with
// VPT vectors a thread (every quantization mode for aligned buffers, and the general kernel).
template <typename T, int VPT>
cudaError_t lowerDenseResident(int* least) {
  const void* kernels[] = {
      reinterpret_cast<const void*>(fusedTwoShotPushRegsKernel<T, VPT, anyrQuantNone, true>),
      reinterpret_cast<const void*>(fusedTwoShotPushRegsKernel<T, VPT, anyrQuantFp8, true>),
      reinterpret_cast<const void*>(fusedTwoShotPushRegsKernel<T, VPT, anyrQuantNvfp4, true>),
      reinterpret_cast<const void*>(
          fusedTwoShotPushRegsKernel<T, VPT, dev::kQuantAtRunTime, false>)};
  for (const void* k : kernels) {
    int n = 0;
    const cudaError_t e =
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k, kFusedDenseThreads, 0);
    if (e != cudaSuccess) return e;
    if (n < *least) *least = n;
  }
  if constexpr (VPT < TwoShotKernels::kMaxVpt) return lowerDenseResident<T, VPT + 1>(least);
  return cudaSuccess;
}

}  // namespace

cudaError_t fusedTwoShotDenseResidentPerSm(int* least) {
  const cudaError_t e = lowerDenseResident<__half, 1>(least);
  if (e != cudaSuccess) return e;
  return lowerDenseResident<__nv_bfloat16, 1>(least);
}

cudaError_t launchFusedTwoShotPush(anyrDataType_t dtype, const AllReduceArgs& a,
                                   const FusedParams& p, int rowBase, int rows, int blocks,
                                   cudaStream_t stream, bool pdl, int threads) {
  if (fusedRowFitsRegisters(p.hidden)) {
    return launchRowsInRegisters<TwoShotKernels>(dtype, a, p, rowBase, rows, blocks, stream, pdl,
                                                 threads);
  }
  // The staged form: fusedThreads always (the dense shape is the register form's).
  const size_t smem = fusedSharedBytes(p.hidden);
  const size_t maxSmem = fusedSharedBytes(kFusedMaxHidden);
  const int staged = fusedThreads(p.hidden);
  return dev::dispatchDtype<true>(dtype, [&](auto tag) {
    return launchWithSmem(fusedTwoShotPushKernel<typename decltype(tag)::T>, blocks, staged, smem,
                          maxSmem, stream, pdl, a, p, rowBase, rows);
  });
}

cudaError_t launchFusedTwoShotPushCluster(anyrDataType_t dtype, const AllReduceArgs& a,
                                          const FusedParams& p, int rowBase, int rows,
                                          int clusterBlocks, int maxBlocks, cudaStream_t stream,
                                          bool pdl) {
  return launchRowsInClusters<TwoShotClusterKernels>(dtype, a, p, rowBase, rows, clusterBlocks,
                                                     maxBlocks, stream, pdl);
}

cudaError_t fusedTwoShotClusterPairThreads(anyrDataType_t dtype, int quant, int* threads) {
  return clusterPairThreadsOf<TwoShotClusterKernels>(dtype, quant, threads);
}

}  // namespace anyr
