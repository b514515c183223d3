// One-shot pull: each rank stages its input in its own registered buffer, tells every peer
// so with a per-block flag, waits for every peer's flag, then reads all peers' staged data
// and reduces in rank order. For links where peer reads beat peer writes.
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
// every rank sums dequantize(quantize(x_r)) in rank order, its own term included.
#include "algo/algo.h"
#include "device/launch.cuh"
#include "device/opening.cuh"
#include "device/wire.cuh"

namespace anyr {
namespace {

using dev::Elem;
using dev::Vec;

template <typename T, bool kAligned, int kWire>
__global__ void __launch_bounds__(kAlgoThreads, kPeerBlocksPerSm)
    oneShotPullKernel(AllReduceArgs a) {
  constexpr int E = Elem<T>::kPerVec;
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

    // 3. Read every rank's staged range in rank order and reduce.
    if (!blockFailed) {
      for (uint64_t v = lo + threadIdx.x; v < hi; v += blockDim.x) {
        float acc[E] = {};
        if constexpr (kWire == kWireNative) {
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

}  // namespace

cudaError_t launchOneShotPull(anyrDataType_t dtype, const AllReduceArgs& a,
                              const LaunchShape& shape, cudaStream_t stream) {
  return dev::launchWireTagged(dtype, a, shape, stream, [](auto tag, auto wire) {
    using Tag = decltype(tag);
    return oneShotPullKernel<typename Tag::T, Tag::kAligned, decltype(wire)::value>;
  });
}

cudaError_t oneShotPullResidentPerSm(int* least) {
  for (int w : {kWireNative, kWireFp8, kWireInt8}) {
    const cudaError_t e = dev::dispatchWire(w, [&](auto wire) {
      return dev::lowerResidentPerSm(
          kAlgoThreads,
          [](auto tag) {
            using Tag = decltype(tag);
            return oneShotPullKernel<typename Tag::T, Tag::kAligned, decltype(wire)::value>;
          },
          least);
    });
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace anyr
