// Host two-shot: reduce-scatter and all-gather through pinned shared host memory.
//
// The vectors are cut into n segments of S vectors (S a multiple of kHostBlockQuantum); rank
// s owns segment s. Block b covers the same index range [lo, hi) inside every segment, on
// every rank:
//   1. scatter: write vectors s*S + i (i in range) of every peer's segment s into the own
//      region's data buffer, at the same positions; raise data flag [b];
//   2. reduce: wait for data flag [b] of every peer; sum vector rank*S + i of every rank in
//      rank order (fp32, the own input for the own term), round to the dtype, write it to the
//      output and into the own region's result buffer at position i; raise result flag [b];
//   3. gather: wait for result flag [b] of every peer s; copy its reduced vectors to the
//      output at s*S + i.
// Each segment is reduced once, by its owner, and everyone else copies the owner's bits: all
// ranks hold the same bits, the bits of the other algorithms (same order, same accumulation).
// With a compressed wire, the reduced segment travels compressed too, and the owner keeps the
// dequantized value it sent (so its output matches what the others decode): two roundings,
// see docs/WIRE.md.
//
// Buffers alternate by the parity of the epoch host_oneshot.cu shares (so switching between the
// two host algorithms still alternates buffers), the flags hold epochs (see host_oneshot.cu
// for why reuse at launch j+2 is safe; the result buffer follows the same argument, because a peer
// raises its launch-j+1 data flag only after its launch-j kernel completed). In place is safe: the
// thread that writes output vector v read input vector v earlier in the same launch, and no other
// thread touches v.
#include "algo/algo.h"
#include "device/launch.cuh"
#include "device/opening.cuh"
#include "device/wire.cuh"

namespace anyr {
namespace {

using dev::Elem;
using dev::Vec;

template <typename T, bool kAligned, int kWire>
__global__ void __launch_bounds__(kAlgoThreads) hostTwoShotKernel(HostArgs a) {
  constexpr int E = Elem<T>::kPerVec;
  dev::runFlagKernel<T>(a, [&](const T* in, T* out, const int rank, const int n, LocalState* st,
                               const uint32_t epoch, const bool stopped) {
    const HostLayout& L = a.layout;
    const uint32_t use = dev::flagUseOf(st);  // what this block's flags carry
    const uint64_t dataBuf = L.dataOffset + (epoch & 1u) * L.dataBytes;
    const uint64_t resBuf = L.resultOffset + (epoch & 1u) * L.resultBytes;
    const uint64_t V = a.numVecs;
    const uint64_t q = kHostBlockQuantum;
    const uint64_t S = ((V + n - 1) / n + q - 1) / q * q;  // segment length
    const uint64_t per = ((S + gridDim.x - 1) / gridDim.x + q - 1) / q * q;
    const uint64_t lo = per * blockIdx.x;
    const uint64_t hi = min(S, lo + per);
    auto region = [&](int r) { return a.base + static_cast<uint64_t>(r) * L.rankBytes; };
    char* ownData = region(rank) + dataBuf;
    char* ownRes = region(rank) + resBuf;
    const uint64_t dataScales = L.dataBytes / 2;
    const uint64_t resScales = L.resultBytes / 2;
    auto loadIn = [&](uint64_t v) { return dev::loadVecOrZero<T, kAligned>(in, v, V, a.count); };

    // 1. Scatter: the peers' segments of the own input, into the own data buffer.
    for (int k = 1; k < n; ++k) {
      const int s = (rank + k) % n;
      for (uint64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        const uint64_t v = static_cast<uint64_t>(s) * S + i;
        if constexpr (kWire == kWireNative) {
          if (v < V) dev::storeSys(ownData + v * 16, loadIn(v).u);
        } else {
          float unused[E];
          dev::wirePut<T, kWire>(loadIn(v), ownData, ownData + dataScales, v, v < V, unused);
        }
      }
    }
    __syncthreads();
    const uint64_t dataFlag = L.flagsOffset + offsetof(HostFlags, data) + blockIdx.x * 4u;
    if (threadIdx.x == 0 && !stopped) {
      dev::storeReleaseSys(reinterpret_cast<uint32_t*>(region(rank) + dataFlag), use);
    }
    bool ok = dev::hostWaitFlags(a.base, L.rankBytes, dataFlag, rank, n, use, epoch, a.wait,
                                 kWaitHostData);

    // 2. Reduce the own segment; publish it.
    if (ok) {
      for (uint64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        const uint64_t v = static_cast<uint64_t>(rank) * S + i;
        float acc[E] = {};
        if constexpr (kWire == kWireNative) {
          for (int s = 0; s < n; ++s) {
            Vec x;
            if (s == rank) {
              x = loadIn(v);
            } else if (v < V) {
              x.u = dev::loadVolatile(region(s) + dataBuf + v * 16);
            } else {
              x.u = make_uint4(0, 0, 0, 0);
            }
            dev::accumulate<T>(acc, x);
          }
          const Vec y = dev::packVec<T>(acc);
          if (v < V) {
            dev::storeSys(ownRes + i * 16, y.u);
            dev::storeVec<T, kAligned>(out, v, a.count, y);
          }
        } else {
          float mine[E];
          dev::wirePut<T, kWire>(loadIn(v), nullptr, nullptr, v, false, mine);
          dev::wireSumRanks<T, kWire>(mine, rank, n, v, V, region, dataBuf, dataScales, acc);
          // Round to the dtype first (what a native reduction would produce), then send that.
          float sent[E];
          dev::wirePut<T, kWire>(dev::packVec<T>(acc), ownRes, ownRes + resScales, i, v < V, sent);
          if (v < V) dev::storeVec<T, kAligned>(out, v, a.count, dev::packVec<T>(sent));
        }
      }
    }
    __syncthreads();
    const uint64_t resFlag = L.flagsOffset + offsetof(HostFlags, result) + blockIdx.x * 4u;
    if (ok && threadIdx.x == 0) {
      dev::storeReleaseSys(reinterpret_cast<uint32_t*>(region(rank) + resFlag), use);
    }
    if (ok) {
      ok = dev::hostWaitFlags(a.base, L.rankBytes, resFlag, rank, n, use, epoch, a.wait,
                              kWaitHostResult);
    }

    // 3. Gather the owners' reduced segments.
    if (ok) {
      for (int k = 1; k < n; ++k) {
        const int s = (rank + k) % n;
        const char* res = region(s) + resBuf;
        for (uint64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
          const uint64_t v = static_cast<uint64_t>(s) * S + i;
          if (v >= V) continue;
          Vec y;
          if constexpr (kWire == kWireNative) {
            y.u = dev::loadVolatile(res + i * 16);
          } else {
            float d[E];
            dev::wireGet<T, kWire>(res, res + resScales, i, d);
            y = dev::packVec<T>(d);
          }
          dev::storeVec<T, kAligned>(out, v, a.count, y);
        }
      }
    }

    dev::finishEpoch(st->syncEpoch, epoch);
    dev::finishFlagUse(st, use);
  });
}

}  // namespace

cudaError_t launchHostTwoShot(anyrDataType_t dtype, const HostArgs& a, const LaunchShape& shape,
                              cudaStream_t stream) {
  return dev::launchWireTagged(dtype, a, shape, stream, [](auto tag, auto wire) {
    using Tag = decltype(tag);
    return hostTwoShotKernel<typename Tag::T, Tag::kAligned, decltype(wire)::value>;
  });
}

}  // namespace anyr
