// Fused one-shot push: all-reduce + residual add + RMSNorm (+ quantization) in one kernel.
//
// The all-reduce part is oneshot_push.cu's protocol, in the same buffers and the same epoch
// sequence (a fused launch is one more push launch): each rank writes its partial rows into
// slot [rank] of every peer's push buffer, readers poll for arrival (lamport.cuh), and the
// previous phase is cleared. Pushes are spread over the whole grid (one SM injects into the
// links at a limited rate, so a launch with few rows runs more blocks than rows). Rows are
// reduced by blocks: block b owns rows b, b + G, ...; for each it sums the n contributions in
// rank order (fp32) in registers and runs the register-resident row epilogue
// (fused/epilogue.cuh), so the outputs carry exactly the bits of "all-reduce, then the
// standalone add + RMSNorm kernel". The weight and the residual row are loaded before the
// wait, so their latency overlaps it. Threads per block: fusedThreads(hidden); VPT, the
// vectors per thread (1..4), the quantization mode and whether every buffer allows whole
// vectors (fusedBuffersAligned) are template parameters: a launch of one row is bound by the
// latency of its instructions, and fetching code it never runs costs instruction-cache misses.
// Aligned buffers get one kernel per quantization mode; other buffers one kernel that reads
// the mode at run time and checks each buffer's alignment (the input's too: whether a call
// runs fused must not depend on a rank's own pointers, or ranks could run different protocols).
// normOut may alias partial: then each block pushes its own rows (step 1), so a row of partial
// is read only by the block that later writes that row's outputs.
//
// The doubling form (kDoubling, "fused:doubling-push"): the same kernel with the doubling push's
// order (algo/doubling_push.cu, doubling_schedule.h): step 1 stores this rank's vectors into
// its first partner only, and before step 3 every thread relays, round by round, the vectors of
// its share (the same vectors it pushed) that earlier rounds brought into this rank's slots,
// polled as they arrive, into the round's partner. Every slot has one writer a call, so the
// clears and the rank-order sums are unchanged: the same bits. No cluster form.
#include "algo/algo.h"
#include "algo/doubling_schedule.h"
#include "device/lamport.cuh"
#include "fused/epilogue.cuh"
#include "fused/fused_algo.h"
#include "fused/launch.cuh"
#include "fused/launch_rows.cuh"

namespace anyr {
namespace {

using dev::Elem;
using dev::Vec;

// Vector x into slot [rank] of every peer's push buffer (only peer `to`, where to >= 0), `off`
// bytes into the push area (the phase, the slot and the vector's place included).
// Nothing once the communicator stopped (`stopped`: dev::stopRequested).
__device__ __forceinline__ void pushToPeers(const AllReduceArgs& a, uint64_t off, const uint4& x,
                                            bool stopped, int to = -1) {
  if (to >= 0) {
    if (!stopped) dev::storeSys(a.peerWorkspace[to] + a.layout.pushOffset + off, x);
    return;
  }
  for (int d = 1; d < a.nranks && !stopped; ++d) {
    dev::storeSys(a.peerWorkspace[(a.rank + d) % a.nranks] + a.layout.pushOffset + off, x);
  }
}

// The vectors [first, last) of the launch that block blockIdx.x pushes where pushes are spread
// over the whole grid (pushLaunchRows; the doubling form relays the same ones).
struct PushShare {
  uint64_t first, last;
};
__device__ __forceinline__ PushShare pushShareOf(int rows, int H) {
  const uint64_t total = static_cast<uint64_t>(rows) * H;
  const uint64_t share = (total + gridDim.x - 1) / gridDim.x;
  const uint64_t first = blockIdx.x * share;
  return PushShare{first, first + share < total ? first + share : total};
}

// Step 1 of the block-per-row kernel: this rank's rows of the launch into slot [rank] of every
// peer's push buffer, phase at phaseOffset. Every block of the grid takes part, block b the b-th
// contiguous share of the launch's vectors: one SM injects into the links at a limited rate, so a
// launch with few rows runs more blocks than rows (the extra ones only push and clear).
template <typename T>
__device__ __forceinline__ void pushLaunchRows(const AllReduceArgs& a, const T* in, bool inAligned,
                                               int rows, int H, uint64_t phaseOffset, bool stopped,
                                               int to = -1) {
  const uint64_t slotOffset = phaseOffset + static_cast<uint64_t>(a.rank) * a.layout.pushSlotBytes;
  constexpr int kBatch = 4;
  const PushShare sh = pushShareOf(rows, H);
  const uint64_t first = sh.first, last = sh.last;
  for (uint64_t v0 = first + threadIdx.x; v0 < last; v0 += kBatch * blockDim.x) {
    Vec x[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const uint64_t v = v0 + static_cast<uint64_t>(u) * blockDim.x;
      x[u] = Vec{};
      if (v < last) x[u] = dev::loadRowVec(in, v, a.count, inAligned);
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const uint64_t v = v0 + static_cast<uint64_t>(u) * blockDim.x;
      if (v >= last) continue;
      dev::sanitize<T>(x[u]);
      pushToPeers(a, slotOffset + v * 16, x[u].u, stopped, to);
    }
  }
}

template <typename T, int VPT, int Q, bool kAligned, bool kDoubling>
// (kAlgoThreads, 1): one block per SM may use 128 registers a thread, so the row stays in
// registers (without the 1, ptxas aimed at two blocks per SM and spilled).
__global__ void __launch_bounds__(kAlgoThreads, 1)
    fusedOneShotPushKernel(AllReduceArgs a, FusedParams p, int rowBase, int rows) {
  __shared__ float red[kFusedRedFloats];
  dev::waitForPrevious(a.releaseEarly);
  const T* in = static_cast<const T*>(a.input);  // rows [0, rows) of this launch
  const int rank = a.rank;
  const int n = a.nranks;
  LocalState* st = a.state;
  const dev::Phases ph = dev::phasesOf(st->pushEpoch);
  const bool stopped = dev::stopRequested(st);
  const uint32_t epoch = ph.epoch;
  const uint32_t phase = ph.cur;
  const uint64_t slot = a.layout.pushSlotBytes;
  const uint64_t phaseBytes = slot * static_cast<uint64_t>(n);
  const int H = rowVecs(p.hidden);  // 16-byte vectors per row; thread t owns t + k * blockDim.x
  const bool inAligned = kAligned || dev::isAligned(in, 16);
  // Which rank stores each source's vectors into this rank's slots: what a wait names. The
  // doubling form's relay, from this rank's schedule (packed on the host,
  // AllReduceArgs::doubling); the one-shot: the source itself. A wait for data of a round
  // after the first is second hand (kWaitLaterRound, algo/oneshot_push.cuh).
  auto writerOf = [&](int s) {
    if constexpr (kDoubling) {
      return doubling::planWriter(a.doubling, s);
    } else {
      return s;
    }
  };
  auto waitKind = [&](int s) {
    return kDoubling ? doubling::planWaitWhat(a.doubling, s) : int32_t{kWaitPushData};
  };
  // Step 1 stores into every peer, or (doubling) into round 0's partner only.
  const int firstTo = kDoubling ? doubling::planTo(a.doubling, 0) : -1;

  // The weight, the quantization scale and the residual of this block's first row are loaded
  // first: their latency hides behind the pushes and the wait for the peers' data. (The cluster
  // form below loads them after its push instead; this kernel, whose pushes are spread over the
  // whole grid, measured faster this way on 2 x H200: 1 / 16 rows of 6144 4.41 / 5.04 us against
  // 4.68 / 5.20 loaded after, in two runs; docs/PERFORMANCE.md, "Fused shapes".)
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

  // Loads are issued in batches (all of a thread's vectors, then their uses): a load placed
  // after a volatile store or poll would wait for it, one round trip per vector.
  auto loadMine = [&](int row, Vec(&mine)[VPT]) {
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int j = threadIdx.x + k * blockDim.x;
      mine[k] = Vec{};
      if (j < H)
        mine[k] = dev::loadRowVec(in, static_cast<uint64_t>(row) * H + j, a.count, inAligned);
    }
#pragma unroll
    for (int k = 0; k < VPT; ++k) dev::sanitize<T>(mine[k]);
  };

  // 1. Push. Spread over the whole grid, unless normOut or residualOut aliases partial: then
  // a block could write a row's outputs before another block of this grid read that row to
  // push it (the block waits for the peers' copies of the row, not for this rank's), so each
  // block pushes its own rows, the vectors its threads later overwrite.
  Vec mine[VPT];  // this rank's vectors of the row being reduced
  const int64_t base = static_cast<int64_t>(rowBase) * p.hidden;
  const bool spread =
      static_cast<const void*>(static_cast<const T*>(p.normOut) + base) != a.input &&
      static_cast<const void*>(static_cast<const T*>(p.residualOut) + base) != a.input;
  if (spread) {
    pushLaunchRows<T>(a, in, inAligned, rows, H, phase * phaseBytes, stopped, firstTo);
    if (static_cast<int>(blockIdx.x) < rows) loadMine(blockIdx.x, mine);
  } else {
    const uint64_t off0 = phase * phaseBytes + static_cast<uint64_t>(rank) * slot;
    for (int row = blockIdx.x; row < rows; row += gridDim.x) {
      Vec x[VPT];
      loadMine(row, x);
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        const int j = threadIdx.x + k * blockDim.x;
        if (j >= H) continue;
        pushToPeers(a, off0 + (static_cast<uint64_t>(row) * H + j) * 16, x[k].u, stopped, firstTo);
      }
      if (row == static_cast<int>(blockIdx.x)) {
#pragma unroll
        for (int k = 0; k < VPT; ++k) mine[k] = x[k];
      }
    }
  }

  if (a.pushFence) __threadfence_system();

  // 2. Clear what peers wrote one launch ago.
  char* own = a.peerWorkspace[rank] + a.layout.pushOffset;
  dev::clearPeerSlots(own + ph.prev * phaseBytes, slot, n, rank, st->pushVecs[ph.prev]);

  dev::Waiter waiter(a.wait);
  const char* cur = own + phase * phaseBytes;
  // 2b. (doubling) Rounds 1..: the vectors this thread pushed in step 1 (its share, or its
  // block's rows where the outputs alias partial), of every source the round sends: the own
  // read again from the input, the others polled from this rank's slots as earlier rounds bring
  // them (the only wait), stored into the round's partner's slot of the same source. A failed
  // wait ends the relays; the rows below then fail through the epilogue's vote.
  bool relayOk = true;
  if constexpr (kDoubling) {
    auto relay = [&](uint64_t v, uint32_t send, char* dst) {
      for (int s = 0; s < n; ++s) {
        if (!(send & (1u << s))) continue;
        Vec x;
        if (s == rank) {
          x = dev::loadRowVec(in, v, a.count, inAligned);
          dev::sanitize<T>(x);
        } else if (!dev::pollVec<T>(cur + static_cast<uint64_t>(s) * slot + v * 16, &x, waiter,
                                    writerOf(s), epoch, waitKind(s))) {
          return false;
        }
        if (!stopped) dev::storeSys(dst + static_cast<uint64_t>(s) * slot + v * 16, x.u);
      }
      return true;
    };
    const PushShare sh = pushShareOf(rows, H);
    for (int j = 1; j < static_cast<int>(a.doubling.count) && relayOk; ++j) {
      const uint32_t send = doubling::planSend(a.doubling, j);
      char* dst = a.peerWorkspace[doubling::planTo(a.doubling, j)] + a.layout.pushOffset +
                  phase * phaseBytes;
      if (spread) {
        for (uint64_t v = sh.first + threadIdx.x; v < sh.last && relayOk; v += blockDim.x) {
          relayOk = relay(v, send, dst);
        }
      } else {
        for (int row = blockIdx.x; row < rows && relayOk; row += gridDim.x) {
#pragma unroll
          for (int k = 0; k < VPT; ++k) {
            const int jv = threadIdx.x + k * blockDim.x;
            if (jv < H && relayOk) relayOk = relay(static_cast<uint64_t>(row) * H + jv, send, dst);
          }
        }
      }
      if (a.pushFence) __threadfence_system();
    }
  }

  // 3. Sum each row's n contributions in rank order (fp32), then the epilogue in registers.
  for (int row = blockIdx.x; row < rows; row += gridDim.x) {
    if (row != static_cast<int>(blockIdx.x)) {
      __syncthreads();  // the previous row's epilogue has read red
      if (p.residualIn != nullptr) {
        dev::loadRowRegs<T, VPT>(static_cast<const T*>(p.residualIn), rowBase + row, p.hidden,
                                 resAligned, res);
      }
      loadMine(row, mine);
    }
    dev::RowOutputs<T, Q, kAligned> o(p, rowBase + row, qscale);
    o.pin();
    float acc[VPT][8] = {};
    bool ok = relayOk;
    for (int s = 0; s < n && ok; ++s) {
      if (s == rank) {
#pragma unroll
        for (int k = 0; k < VPT; ++k) dev::accumulate<T>(acc[k], mine[k]);
        continue;
      }
      const char* src = cur + static_cast<uint64_t>(s) * slot + static_cast<uint64_t>(row) * H * 16;
      Vec x[VPT];
      ok = dev::pollRowRegs<T, VPT>(src, H, x, waiter, writerOf(s), epoch, waitKind(s));
      if (!ok) break;
#pragma unroll
      for (int k = 0; k < VPT; ++k) dev::accumulate<T>(acc[k], x[k]);
    }
    // Uniform: the epilogue's barrier tells every thread whether any part failed.
    if (!dev::fusedRowEpilogueRegs<T, VPT, Q, kAligned>(p, o, acc, res, w, red, ok)) {
      break;
    }
  }

  if (blockIdx.x == 0 && threadIdx.x == 0) st->pushVecs[phase] = static_cast<uint32_t>(a.numVecs);
  dev::finishEpoch(st->pushEpoch, dev::nextPushEpoch(epoch));
}

// The cluster form (launched in one-dimensional clusters of C = clusterSize() blocks, where the
// communicator's cluster probe passed; hidden <= 8192): the same protocol, buffers and clears,
// the same bits, but each row is pushed, reduced and normalized by the C blocks of one cluster,
// thread t of block c holding vector c * B + t of the row (B = blockDim.x), and the row's sum
// of squares combined through distributed shared memory (fused/epilogue.cuh,
// fusedRowEpilogueCluster). Cluster k owns rows k, k + K, ... (K clusters). A launch of few
// rows then runs each row's instructions on C SMs instead of one. kPairThreads > 0: the variant
// for launches beyond one block per SM, compiled for two blocks of at most kPairThreads threads
// per SM (fewer registers), its waits' checks inlined (dev::WaiterT).
template <typename T, int Q, bool kAligned, int kPairThreads>
__global__ void __launch_bounds__(kPairThreads > 0 ? kPairThreads : kFusedClusterMaxThreads,
                                  kPairThreads > 0 ? 2 : 1)
    fusedOneShotPushClusterKernel(AllReduceArgs a, FusedParams p, int rowBase, int rows) {
  __shared__ dev::ClusterExchange xch;
  dev::waitForPrevious(a.releaseEarly);
  const T* in = static_cast<const T*>(a.input);
  const int rank = a.rank;
  const int n = a.nranks;
  LocalState* st = a.state;
  const dev::Phases ph = dev::phasesOf(st->pushEpoch);
  // A stopped communicator (dev::stopRequested): no push and no wait; every row then fails
  // through the cluster exchange, so no block leaves its cluster behind.
  const bool stopped = dev::stopRequested(st);
  const uint32_t epoch = ph.epoch;
  const uint64_t slot = a.layout.pushSlotBytes;
  const uint64_t phaseBytes = slot * static_cast<uint64_t>(n);
  const int H = rowVecs(p.hidden);
  const bool inAligned = kAligned || dev::isAligned(in, 16);
  dev::ClusterRowThread<T, Q, kAligned> me(p);
  const int cluster = me.cluster, clusters = me.clusters, first = me.first, v = me.v;
  const bool mineV = me.active;
  auto loadMine = [&](int row, Vec& mine) {
    mine = Vec{};
    if (mineV) mine = dev::loadRowVec(in, static_cast<uint64_t>(row) * H + v, a.count, inAligned);
    dev::sanitize<T>(mine);
  };
  // 1. Push, by the rows' own threads: thread (cluster k, block c, t) sends vector v of rows
  // k, k + K, ... (loads first, then the stores). A vector of partial is read only by the
  // thread that later writes that vector's outputs, so normOut may alias partial.
  Vec mine = {};
  {
    const uint64_t off0 = ph.cur * phaseBytes + static_cast<uint64_t>(rank) * slot;
    for (int row = cluster; row < rows; row += clusters) {
      Vec x;
      loadMine(row, x);
      if (mineV) pushToPeers(a, off0 + (static_cast<uint64_t>(row) * H + v) * 16, x.u, stopped);
      if (row == cluster) mine = x;
    }
  }
  if (a.pushFence) __threadfence_system();
  // The weight, the scale and the first row's residual, and the cluster exchange's setup: after
  // the push, which the peers wait for (their latency hides behind the wait).
  me.loadConstants(p);
  if (cluster < rows) me.loadResidual(p, rowBase + cluster);
  dev::clusterExchangeBegin(xch);
  char* own = a.peerWorkspace[rank] + a.layout.pushOffset;
  dev::clearPeerSlots(own + ph.prev * phaseBytes, slot, n, rank, st->pushVecs[ph.prev]);

  dev::WaiterT<(kPairThreads > 0)> waiter(a.wait);
  const char* cur = own + ph.cur * phaseBytes;
  uint32_t rowsDone = 0;
  for (int row = cluster; row < rows; row += clusters) {
    if (row != cluster) {
      me.loadResidual(p, rowBase + row);
      loadMine(row, mine);
    }
    dev::RowOutputs<T, Q, kAligned> o(p, rowBase + row, me.qscale);
    o.pin();
    float acc[8] = {};
    bool ok = !stopped;
    for (int s = 0; s < n && ok; ++s) {
      if (s == rank) {
        dev::accumulate<T>(acc, mine);
        continue;
      }
      // This block's part of the row: vectors first .. first + B - 1 (pollRowRegs counts from
      // the pointer it is given).
      const char* src = cur + static_cast<uint64_t>(s) * slot +
                        (static_cast<uint64_t>(row) * H + static_cast<uint64_t>(first)) * 16;
      Vec x[1];
      ok = dev::pollRowRegs<T, 1>(src, H - first, x, waiter, s, epoch);
      if (ok) dev::accumulate<T>(acc, x[0]);
    }
    // Cluster-uniform: every block learns whether any part of the row failed.
    if (!dev::fusedRowEpilogueCluster<T, Q, kAligned>(p, o, v, acc, me.res, me.w, xch, rowsDone, ok,
                                                      waiter, rank, epoch)) {
      break;
    }
  }
  dev::clusterExchangeEnd(rowsDone);

  if (blockIdx.x == 0 && threadIdx.x == 0) st->pushVecs[ph.cur] = static_cast<uint32_t>(a.numVecs);
  dev::finishEpoch(st->pushEpoch, dev::nextPushEpoch(epoch));
}

struct OneShotClusterKernels {
  template <typename T, int Q, bool kAligned>
  static auto kernel() {
    return fusedOneShotPushClusterKernel<T, Q, kAligned, 0>;
  }
  // The pair variants (aligned buffers), compiled for two blocks per SM: of 448 threads (72
  // registers; hidden 7168 in clusters of two), and where that one spills (ptxas, CUDA 13,
  // sm_90: NVFP4, 8 bytes in bf16, 4 in fp16) also of 384 (80 registers, no spill) for blocks
  // of up to 384 threads (hidden 6144), 3-4% faster there (docs/PERFORMANCE.md, "Fused shapes").
  // NULL for blocks of more than 448 threads.
  template <typename T, int Q>
  static ClusterKernel pairKernelFor(int threads) {
    if constexpr (Q == anyrQuantNvfp4) {
      if (threads <= 384) return fusedOneShotPushClusterKernel<T, Q, true, 384>;
    }
    return threads <= 448 ? fusedOneShotPushClusterKernel<T, Q, true, 448> : nullptr;
  }
};

template <bool kDoubling>
struct OneShotKernels {
  static constexpr int kMaxVpt = dev::kFusedRegsMaxVpt;
  template <typename T, int VPT, int Q, bool kAligned>
  static auto kernel() {
    return fusedOneShotPushKernel<T, VPT, Q, kAligned, kDoubling>;
  }
};

}  // namespace

cudaError_t launchFusedOneShotPush(anyrDataType_t dtype, const AllReduceArgs& a,
                                   const FusedParams& p, int rowBase, int rows, int blocks,
                                   cudaStream_t stream, bool pdl) {
  return launchRowsInRegisters<OneShotKernels<false>>(dtype, a, p, rowBase, rows, blocks, stream,
                                                      pdl);
}

cudaError_t launchFusedDoublingPush(anyrDataType_t dtype, const AllReduceArgs& a,
                                    const FusedParams& p, int rowBase, int rows, int blocks,
                                    cudaStream_t stream, bool pdl) {
  return launchRowsInRegisters<OneShotKernels<true>>(dtype, a, p, rowBase, rows, blocks, stream,
                                                     pdl);
}

cudaError_t launchFusedOneShotPushCluster(anyrDataType_t dtype, const AllReduceArgs& a,
                                          const FusedParams& p, int rowBase, int rows,
                                          int clusterBlocks, int maxBlocks, cudaStream_t stream,
                                          bool pdl) {
  return launchRowsInClusters<OneShotClusterKernels>(dtype, a, p, rowBase, rows, clusterBlocks,
                                                     maxBlocks, stream, pdl);
}

cudaError_t fusedOneShotClusterPairThreads(anyrDataType_t dtype, int quant, int* threads) {
  return clusterPairThreadsOf<OneShotClusterKernels>(dtype, quant, threads);
}

}  // namespace anyr
