// Fused one-shot push: all-reduce + residual add + RMSNorm (+ quantization) in one kernel.
//
// The all-reduce part is oneshot_push.cu's protocol, in the same buffers and the same epoch
// sequence (a fused launch is one more push launch): each rank writes its partial rows into
// slot [rank] of every peer's push buffer, readers poll for arrival (lamport.cuh), and the
// previous phase is cleared. Work is split by rows: block b owns rows b, b + G, ...; it pushes
// its rows, then for each of them sums the n contributions in rank order (fp32) into shared
// memory and runs the row epilogue (fused/epilogue.cuh), so the outputs carry exactly the bits
// of "all-reduce, then the standalone add + RMSNorm kernel".
// normOut may alias partial: a block reads a row of partial (push, then reduce) before it
// writes that row's outputs, and no other block touches the row.
#include "algo/algo.h"
#include "algo/lamport.cuh"
#include "fused/epilogue.cuh"
#include "fused/fused_algo.h"
#include "fused/launch.cuh"

namespace anyr {
namespace {

using dev::Elem;
using dev::Vec;

template <typename T>
__global__ void __launch_bounds__(kAlgoThreads)
    fusedOneShotPushKernel(AllReduceArgs a, FusedParams p, int rowBase, int rows) {
  extern __shared__ float4 smemRaw[];
  float* xs = reinterpret_cast<float*>(smemRaw);
  float* red = xs + p.hidden;
  __shared__ int blockFailed;
  const T* in = static_cast<const T*>(a.input);  // rows [0, rows) of this launch
  const int rank = a.rank;
  const int n = a.nranks;
  LocalState* st = a.state;
  const dev::Phases ph = dev::phasesOf(st->pushEpoch);
  const uint32_t epoch = ph.epoch;
  const uint32_t phase = ph.cur;
  const uint64_t slot = a.layout.pushSlotBytes;
  const uint64_t phaseBytes = slot * static_cast<uint64_t>(n);
  const int H = p.hidden / 8;  // 16-byte vectors per row
  if (threadIdx.x == 0) blockFailed = 0;

  // 1. Push this block's rows to every peer.
  for (int row = blockIdx.x; row < rows; row += gridDim.x) {
    for (int j = threadIdx.x; j < H; j += blockDim.x) {
      const uint64_t v = static_cast<uint64_t>(row) * H + j;
      Vec x = dev::loadVec<T, true>(in, v, a.count);
      dev::sanitize<T>(x);
      for (int k = 1; k < n; ++k) {
        const int s = (rank + k) % n;
        dev::storeSys(a.peerWorkspace[s] + a.layout.pushOffset + phase * phaseBytes +
                          static_cast<uint64_t>(rank) * slot + v * 16,
                      x.u);
      }
    }
  }

  if (a.pushFence) __threadfence_system();

  // 2. Clear what peers wrote one launch ago.
  char* own = a.peerWorkspace[rank] + a.layout.pushOffset;
  dev::clearPeerSlots(own + ph.prev * phaseBytes, slot, n, rank, st->pushVecs[ph.prev]);

  // 3. Reduce each row into shared memory, then the epilogue.
  dev::Waiter waiter(a.wait);
  const char* cur = own + phase * phaseBytes;
  __syncthreads();
  for (int row = blockIdx.x; row < rows; row += gridDim.x) {
    bool ok = true;
    for (int j = threadIdx.x; j < H && ok; j += blockDim.x) {
      const uint64_t v = static_cast<uint64_t>(row) * H + j;
      float acc[8] = {};
      for (int s = 0; s < n && ok; ++s) {
        Vec x;
        if (s == rank) {
          x = dev::loadVec<T, true>(in, v, a.count);
          dev::sanitize<T>(x);
        } else {
          ok =
              dev::pollVec<T>(cur + static_cast<uint64_t>(s) * slot + v * 16, &x, waiter, s, epoch);
        }
        dev::accumulate<T>(acc, x);
      }
      reinterpret_cast<float4*>(xs)[2 * j] = make_float4(acc[0], acc[1], acc[2], acc[3]);
      reinterpret_cast<float4*>(xs)[2 * j + 1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
    }
    if (!ok) blockFailed = 1;
    __syncthreads();
    if (blockFailed) break;  // uniform: every thread read the same shared flag
    dev::fusedRowEpilogue<T>(p, rowBase + row, xs, red);
  }

  if (blockIdx.x == 0 && threadIdx.x == 0) st->pushVecs[phase] = static_cast<uint32_t>(a.numVecs);
  dev::finishEpoch(st->pushEpoch, epoch + 1);
}

}  // namespace

cudaError_t launchFusedOneShotPush(anyrDataType_t dtype, const AllReduceArgs& a,
                                   const FusedParams& p, int rowBase, int rows, int blocks,
                                   cudaStream_t stream) {
  const size_t smem = fusedSharedBytes(p.hidden);
  const size_t maxSmem = fusedSharedBytes(kFusedMaxHidden);
  const int threads = fusedThreads(p.hidden);
  switch (dtype) {
    case anyrFloat16:
      return launchWithSmem(fusedOneShotPushKernel<__half>, blocks, threads, smem, maxSmem, stream,
                            a, p, rowBase, rows);
    case anyrBfloat16:
      return launchWithSmem(fusedOneShotPushKernel<__nv_bfloat16>, blocks, threads, smem, maxSmem,
                            stream, a, p, rowBase, rows);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace anyr
