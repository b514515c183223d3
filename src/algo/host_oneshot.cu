// Host one-shot: all-reduce through pinned shared host memory, for GPUs without peer access.
//
// Each rank writes its contribution once, into its own region of the shared segment (one
// write over PCIe, whatever the world size), raises a per-block flag there, waits for the same
// block's flag of every peer, then reads every peer's contribution from host memory and sums
// in fp32 in rank order 0..n-1: every rank gets the same bits, and (with the native wire) the
// bits of every other anyreduce algorithm.
//
// Flags and buffer reuse follow the one-shot pull protocol (oneshot_pull.cu): block b covers
// the same vector range on every rank (same grid: computed from agreed values) and waits only
// for block b of its peers; the data buffer alternates by epoch parity. A rank overwrites
// buffer (j % 2) only at launch j+2, after its launch j+1 saw a launch-j+1 flag of every peer
// (block 0 always has work), which each peer raised only after its whole launch-j kernel (and
// so its reads of this buffer) completed.
//
// Pipelining: a block's range is cut into rounds (at most ANYR_HOST_ROUND x blockDim vectors);
// round k is written and published (flag = the block's running round count, kept per block in
// LocalState::pushEpoch of this transport's own state, equal on every rank) before round k-1
// is waited for and reduced, so writes to and reads from host memory share the link's two
// directions instead of taking turns. The flag only ever grows, so a peer already one launch
// ahead still satisfies the wait; its next-launch data goes to the other parity buffer.
//
// With a compressed wire (wire.cuh) the contribution travels as 8-bit values with per-group
// power-of-two scales; the own contribution is quantized too, so every rank sums the same
// values.
#include "algo/algo.h"
#include "device/launch.cuh"
#include "device/opening.cuh"
#include "device/wire.cuh"

namespace anyr {
namespace {

using dev::Elem;
using dev::Vec;

template <typename T, bool kAligned, int kWire>
__global__ void __launch_bounds__(kAlgoThreads) hostOneShotKernel(HostArgs a) {
  constexpr int E = Elem<T>::kPerVec;
  dev::runFlagKernel<T>(a, [&](const T* in, T* out, const int rank, const int n, LocalState* st,
                               const uint32_t epoch, const bool stopped) {
    const HostLayout& L = a.layout;
    const uint64_t buf = L.dataOffset + (epoch & 1u) * L.dataBytes;
    const uint64_t V = a.numVecs;
    // This block's range: a multiple of kHostBlockQuantum vectors, so wire groups and warps
    // never straddle two blocks. Lanes past V carry zeros (wire) and store nothing.
    const uint64_t q = kHostBlockQuantum;
    const uint64_t per = ((V + gridDim.x - 1) / gridDim.x + q - 1) / q * q;
    const uint64_t lo = per * blockIdx.x;
    const uint64_t vEnd = kWire == kWireNative ? V : (V + q - 1) / q * q;
    const uint64_t hi = min(vEnd, lo + per);
    auto region = [&](int r) { return a.base + static_cast<uint64_t>(r) * L.rankBytes; };
    char* own = region(rank) + buf;
    const uint64_t scaleOff = L.dataBytes / 2;
    // Round size R (vectors, a multiple of 32, computed from values equal on every rank and in
    // every block): about a quarter of the block's range, so large messages get several rounds
    // to overlap; at most roundVecs per thread (ANYR_HOST_ROUND); and at least 128 KiB per round
    // over the whole grid, so small messages keep one round (a round costs a flag round trip).
    const uint64_t rMax = static_cast<uint64_t>(blockDim.x) * static_cast<uint64_t>(a.roundVecs);
    const uint64_t rMin = ((128u << 10) / 16 / gridDim.x + q - 1) / q * q;
    const uint64_t rQuarter = ((per + 3) / 4 + q - 1) / q * q;
    const uint64_t R = min(rMax, max(rMin, rQuarter));
    const uint64_t rounds = hi > lo ? (hi - lo + R - 1) / R : 0;
    // Rounds this block published before this launch (same on every rank: same launches).
    const uint32_t seq0 = st->pushEpoch[blockIdx.x];
    const uint64_t flagOff = L.flagsOffset + offsetof(HostFlags, rounds) + blockIdx.x * 4u;

    auto loadIn = [&](uint64_t v) { return dev::loadVecOrZero<T, kAligned>(in, v, V, a.count); };
    // Round k covers vectors lo + k R + j, j < R; thread t takes j = t, t + blockDim, ...
    auto writeRound = [&](uint64_t k) {
      for (uint64_t j = threadIdx.x; j < R; j += blockDim.x) {
        const uint64_t v = lo + k * R + j;
        if (v >= hi) break;  // warp-uniform: hi - lo and R are multiples of 32
        if constexpr (kWire == kWireNative) {
          dev::storeSys(own + v * 16, loadIn(v).u);
        } else {
          float unused[E];
          dev::wirePut<T, kWire>(loadIn(v), own, own + scaleOff, v, v < V, unused);
        }
      }
    };
    auto reduceRound = [&](uint64_t k) {
      for (uint64_t j = threadIdx.x; j < R; j += blockDim.x) {
        const uint64_t v = lo + k * R + j;
        if (v >= hi) break;
        float acc[E] = {};
        if constexpr (kWire == kWireNative) {
          for (int s = 0; s < n; ++s) {
            Vec x;
            if (s == rank) {
              x = loadIn(v);
            } else {
              x.u = dev::loadVolatile(region(s) + buf + v * 16);
            }
            dev::accumulate<T>(acc, x);
          }
        } else {
          // The own contribution as the peers see it: quantized and dequantized.
          float mine[E];
          dev::wirePut<T, kWire>(loadIn(v), nullptr, nullptr, v, false, mine);
          dev::wireSumRanks<T, kWire>(mine, rank, n, v, V, region, buf, scaleOff, acc);
        }
        if (v < V) dev::storeVec<T, kAligned>(out, v, a.count, dev::packVec<T>(acc));
      }
    };

    // Software pipeline, one round deep: write round k, publish it, then wait for and reduce
    // round k-1, so this GPU's writes to host memory and its reads from it overlap on the link.
    for (uint64_t k = 0; k <= rounds; ++k) {
      if (k < rounds) {
        writeRound(k);
        __syncthreads();
        if (threadIdx.x == 0 && !stopped) {
          dev::storeReleaseSys(reinterpret_cast<uint32_t*>(region(rank) + flagOff),
                               seq0 + static_cast<uint32_t>(k) + 1);
        }
      }
      if (k >= 1) {
        if (!dev::hostWaitFlags(a.base, L.rankBytes, flagOff, rank, n,
                                seq0 + static_cast<uint32_t>(k), epoch, a.wait, kWaitHostData)) {
          break;
        }
        reduceRound(k - 1);
      }
    }

    __syncthreads();
    if (threadIdx.x == 0) st->pushEpoch[blockIdx.x] = seq0 + static_cast<uint32_t>(rounds);
    dev::finishEpoch(st->syncEpoch, epoch);
  });
}

}  // namespace

cudaError_t launchHostOneShot(anyrDataType_t dtype, const HostArgs& a, const LaunchShape& shape,
                              cudaStream_t stream) {
  return dev::launchWireTagged(dtype, a, shape, stream, [](auto tag, auto wire) {
    using Tag = decltype(tag);
    return hostOneShotKernel<typename Tag::T, Tag::kAligned, decltype(wire)::value>;
  });
}

}  // namespace anyr
