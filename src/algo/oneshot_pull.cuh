// One-shot pull: the kernel of two algorithms that differ only in the order of their peer reads
// (PullOrder): "oneshot-pull" reads every peer at once (oneshot_pull.cu), "staged-pull" one peer
// per round (staged_pull.cu, which says why).
//
// Each rank stages its input in its own registered buffer, tells every peer so with a
// per-block flag, waits for every peer's flag, then reads all peers' staged data and reduces
// in rank order. For links where peer reads beat peer writes.
//
// Buffers and flags: staging alternates between two buffers by the parity of a device-side
// epoch that is equal in every block (LocalState keeps it per block slot). Block b of every
// rank covers the same vector range (same grid on every rank: the shape is computed from
// agreed values), so block b only waits for block b of its peers. A flag holds the epoch of
// the last call in which its writer's block signalled; waiting is "flag - epoch >= 0".
// Reuse is safe: this rank overwrites staging buffer (j % 2) only at call j+2, after its call
// j+1 received every peer's call-j+1 flag, which each peer raised only after its whole call-j
// kernel (and so all its reads of this rank's buffer) completed.
//
// The opt-in compressed wire (AllReduceArgs::wire, docs/WIRE.md) stages fp8/int8 values with
// per-group power-of-two scales instead of the input: peers read about half the bytes, and
// every rank sums dequantize(quantize(x_r)) in rank order, its own term included. The staged
// order is built for the native wire only (its launcher ignores the setting).
#pragma once

#include "algo/algo.h"
#include "device/opening.cuh"
#include "device/wire.cuh"

namespace anyr {
namespace oneshot {

// Which peer a rank reads, and when.
enum class PullOrder {
  AllAtOnce,  // every peer's vector at once, in rank order (one round)
  Staged,     // round k = 1..n-1: peer rank + k only, after round k - 1's data came back
};

// 0, computed from `x`'s data with `zero`, a value that is 0 at run time but that no compiler can
// know to be: added to the address of the next read, it makes that read wait until x's has come
// back. A thread's reads of independent addresses otherwise leave back to back, every peer at
// once.
__device__ __forceinline__ uint64_t afterData(const dev::Vec& x, uint32_t zero) {
  return x.w[0] & zero;
}

template <typename T, bool kAligned, int kWire, PullOrder kOrder>
__global__ void __launch_bounds__(kAlgoThreads, kPeerBlocksPerSm)
    oneShotPullKernel(AllReduceArgs a) {
  using dev::Vec;
  constexpr int E = dev::Elem<T>::kPerVec;
  static_assert(kOrder == PullOrder::AllAtOnce || kWire == kWireNative,
                "the staged order reads the native wire only");
  dev::runFlagKernel<T>(a, [&](const T* in, T* out, const int rank, const int n, LocalState* st,
                               const uint32_t epoch, const bool stopped) {
    const uint32_t use = dev::flagUseOf(st);  // what this block's flags carry
    const uint64_t bufOffset = a.layout.stagingOffset + (epoch & 1u) * a.layout.chunkBytes;

    // This block's vector range. With a compressed wire (wire.cuh) the ranges are whole
    // multiples of kHostBlockQuantum vectors, so every wire group lies in one warp, and lanes
    // past numVecs carry zeros and store nothing.
    const uint64_t V = a.numVecs;
    uint64_t per = (V + gridDim.x - 1) / gridDim.x;
    uint64_t vEnd = V;
    if constexpr (kWire != kWireNative) {
      per = (per + kHostBlockQuantum - 1) / kHostBlockQuantum * kHostBlockQuantum;
      vEnd = (V + kHostBlockQuantum - 1) / kHostBlockQuantum * kHostBlockQuantum;
    }
    const uint64_t lo = per * blockIdx.x;
    const uint64_t hi = min(vEnd, lo + per);
    const uint64_t scaleOff = a.layout.chunkBytes / 2;
    auto loadIn = [&](uint64_t v) { return dev::loadVecOrZero<T, kAligned>(in, v, V, a.count); };

    // 1. Stage this block's range of the input.
    char* own = a.peerWorkspace[rank];
    for (uint64_t v = lo + threadIdx.x; v < hi; v += blockDim.x) {
      if constexpr (kWire == kWireNative) {
        dev::storeRelaxed(own + bufOffset + v * 16, loadIn(v).u);
      } else {
        float unused[E];
        dev::wirePut<T, kWire>(loadIn(v), own + bufOffset, own + bufOffset + scaleOff, v, v < V,
                               unused);
      }
    }
    __syncthreads();

    // 2. Signal every peer (release: orders the block's staging stores before the flag), then
    //    wait for every peer's signal.
    __shared__ int blockFailed;
    if (threadIdx.x == 0) blockFailed = 0;
    const int t = static_cast<int>(threadIdx.x);
    if (t < n && t != rank && !stopped) {
      FlagArea* peerFlags = reinterpret_cast<FlagArea*>(a.peerWorkspace[t] + a.layout.flagsOffset);
      dev::storeReleaseSys(&peerFlags->start[blockIdx.x][rank], use);
    }
    __syncthreads();
    if (t < n && t != rank) {
      const FlagArea* flags = reinterpret_cast<const FlagArea*>(own + a.layout.flagsOffset);
      dev::Waiter waiter(a.wait);
      while (static_cast<int32_t>(dev::loadAcquireSys(&flags->start[blockIdx.x][t]) - use) < 0) {
        if (!waiter.keepWaiting(t, kWaitStartFlag, epoch)) {
          blockFailed = 1;
          break;
        }
      }
    }
    __syncthreads();

    // 3. Read every rank's staged range and reduce in rank order.
    if (!blockFailed) {
      // The staged order's chain of reads: each waits for the one before it, across this
      // thread's vectors too, so no two of the thread's reads are in flight at once.
      uint64_t dep = 0;
      for (uint64_t v = lo + threadIdx.x; v < hi; v += blockDim.x) {
        float acc[E] = {};
        if constexpr (kOrder == PullOrder::Staged) {
          // Round k reads rank + k: ranks rank + 1..n - 1 first, then 0..rank - 1. The sum must
          // start at rank 0, so the ranks above this one wait in registers (their round is the
          // index: no dynamic indexing), the ones below are added as they come (in ascending
          // order), then this rank's own vector, then the waiting ones.
          static_assert(kMaxLocalRanks < 256, "n >> 8 is the run-time zero of afterData");
          const uint32_t zero = static_cast<uint32_t>(n) >> 8;
          Vec above[kMaxLocalRanks - 1];
#pragma unroll
          for (int k = 1; k < kMaxLocalRanks; ++k) {
            if (k < n) {
              const int s = rank + k < n ? rank + k : rank + k - n;
              Vec x;
              x.u = dev::loadCg(a.peerWorkspace[s] + bufOffset + v * 16 + dep);
              dep = afterData(x, zero);
              if (rank + k < n) {
                above[k - 1] = x;
              } else {
                dev::accumulate<T>(acc, x);
              }
            }
          }
          dev::accumulate<T>(acc, dev::loadVec<T, kAligned>(in, v, a.count));
#pragma unroll
          for (int k = 1; k < kMaxLocalRanks; ++k) {
            if (k < n && rank + k < n) dev::accumulate<T>(acc, above[k - 1]);
          }
        } else if constexpr (kWire == kWireNative) {
          for (int s = 0; s < n; ++s) {
            Vec x;
            if (s == rank) {
              x = dev::loadVec<T, kAligned>(in, v, a.count);
            } else {
              x.u = dev::loadCg(a.peerWorkspace[s] + bufOffset + v * 16);
            }
            dev::accumulate<T>(acc, x);
          }
        } else {
          // The own contribution as the peers see it: quantized and dequantized.
          float mine[E];
          dev::wirePut<T, kWire>(loadIn(v), nullptr, nullptr, v, false, mine);
          dev::wireSumRanks<T, kWire>(
              mine, rank, n, v, V, [&](int s) { return a.peerWorkspace[s]; }, bufOffset, scaleOff,
              acc);
        }
        if (v < V) dev::storeVec<T, kAligned>(out, v, a.count, dev::packVec<T>(acc));
      }
    }

    dev::finishEpoch(st->syncEpoch, epoch);
    dev::finishFlagUse(st, use);
  });
}

// The kernel of `order` and wire format kWire for a dispatch tag (dev::KernelTag).
template <PullOrder kOrder, int kWire>
struct PullKernelOf {
  template <typename Tag>
  auto operator()(Tag) const {
    return oneShotPullKernel<typename Tag::T, Tag::kAligned, kWire, kOrder>;
  }
};

}  // namespace oneshot
}  // namespace anyr
