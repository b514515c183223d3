// Host one-shot, low-latency protocol: the small-message form of host-oneshot (host_oneshot.cu),
// used for a launch of at most HostLayout::llMaxBytes with the native wire.
//
// Where the flag protocol costs a flag write, a flag poll and then a data read (two PCIe round
// trips after the data landed), here every 16-byte line a rank writes carries its own flag:
// {data word 0, tag, data word 1, tag}. A reader polls the data itself and takes a line when
// both of its flag words equal this launch's tag: one round trip. A line is stored with one
// 16-byte store; each 8-byte half {data, tag} is written at once (8-byte writes are not torn
// on PCIe or in host memory), and checking both halves' flags covers a line that lands in two
// halves. The payload is half the line, so a launch moves twice its bytes: this is for
// messages where latency, not bandwidth, decides.
//
// Tags and buffers: two buffers per rank in the segment's LL area, separate from the flag
// protocol's data buffers (stale raw data there could look like any flag). The tag is this
// protocol's own launch count (LocalState::llUse + 1; hostLLBuffer, hostLLSweeps in
// device/host_handles.h): it picks the buffer, and a launch whose tag hostLLSweeps (two in
// every 2^30) also rewrites the rest of its buffer with a recent older tag, so no line is ever
// older than 2^30 + 2 launches of the protocol and none can carry the tag of the launch reading
// it. (The
// host kernels' shared epoch, syncEpoch, tagged the lines before: a line a large launch left
// matched again when the epoch came round 2^32 host launches later, and a zeroed line matched
// epoch 0; either was taken as the peer's data when the peer was late.) Reuse: a rank rewrites
// buffer (k % 2) at its launch k only after its launch k-1 read every peer's launch-(k-1)
// lines (every launch reads some of every peer's), which each peer wrote only after its launch
// k-2, and so its reads of this buffer, completed.
//
// The sum is fp32 in rank order 0..n-1, as in every anyreduce algorithm: the same bits on
// every rank and on every path.
#include "algo/algo.h"
#include "device/launch.cuh"
#include "device/ll_lines.cuh"
#include "device/opening.cuh"
#include "device/wire.cuh"

namespace anyr {
namespace {

using dev::Elem;
using dev::Vec;

// Vectors each thread handles per pass: their lines are all requested before any is checked,
// so a thread has several PCIe reads in flight.
constexpr int kLLVecsPerPass = 2;
// Pause between two polls of a line that has not landed yet (a PCIe round trip is ~1.5 us),
// where one lane a warp probes first. Eager launches poll again at once: on 2 x H200 a pause
// of 200 ns there cost up to 0.7 us at 1 KB and never helped (docs/PERFORMANCE.md).
constexpr unsigned kLLPollPauseNs = 200;

template <typename T, bool kAligned>
__global__ void __launch_bounds__(kAlgoThreads) hostOneShotLLKernel(HostArgs a) {
  dev::runFlagKernel<T>(a, [&](const T* in, T* out, const int rank, const int n, LocalState* st,
                               const uint32_t epoch, const bool stopped) {
    const HostLayout& L = a.layout;
    // `epoch`, the host kernels' shared launch epoch: advanced by this kernel too, it names the
    // launch in a failure report; the lines carry the protocol's own count (tag).
    const uint32_t tag = dev::readEpoch(st->llUse) + 1;
    const uint64_t buf = L.llOffset + hostLLBuffer(tag) * L.llBytes;
    const uint64_t V = a.numVecs;
    const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
    const uint64_t first = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    auto lines = [&](int r) { return a.base + static_cast<uint64_t>(r) * L.rankBytes + buf; };

    // Publish: every vector of this thread, as two flagged lines.
    char* own = lines(rank);
    for (uint64_t v = first; v < V && !stopped; v += stride) {
      const Vec x = dev::loadVec<T, kAligned>(in, v, a.count);
      dev::storeSys(own + v * 32, make_uint4(x.w[0], tag, x.w[1], tag));
      dev::storeSys(own + v * 32 + 16, make_uint4(x.w[2], tag, x.w[3], tag));
    }
    // The sweep: the rest of the buffer, after this launch's own lines (which peers wait for).
    if (hostLLSweeps(tag)) {
      const uint32_t old = hostLLSweepTag(tag);
      const uint64_t bufLines = L.llBytes / 16;
      for (uint64_t l = 2 * V + first; l < bufLines; l += stride) {
        dev::storeSys(own + l * 16, make_uint4(0u, old, 0u, old));
      }
    }

    // Collect: kLLVecsPerPass vectors at a time, every peer's lines requested at once, then
    // polled again only where they had not landed.
    dev::Waiter waiter(a.wait);
    bool ok = true;
    for (uint64_t v0 = first; v0 < V && ok; v0 += stride * kLLVecsPerPass) {
      float acc[kLLVecsPerPass][Elem<T>::kPerVec] = {};
      for (int s = 0; s < n && ok; ++s) {
        Vec x[kLLVecsPerPass];
        if (s == rank) {
#pragma unroll
          for (int k = 0; k < kLLVecsPerPass; ++k) {
            const uint64_t v = v0 + k * stride;
            if (v < V) x[k] = dev::loadVec<T, kAligned>(in, v, a.count);
          }
        } else {
          const char* src = lines(s);
          // Eager (a.llEager: launches up to ANYR_HOST_LL_EAGER_BYTES, by default every
          // low-latency launch): every lane polls its own lines, which saves the round trip of
          // the reads after a probe. Otherwise one lane per warp polls first (the warp's last
          // line of this pass), with a pause between polls, and the other lanes read once it
          // landed: in the earlier shape (blocks of 128 threads, 8 at 16 KB) every lane polling
          // flooded the link with reads that returned stale lines and delayed the very writes
          // they waited for (2 x H200, 16 KB / 64 KB: 45 / 336 us against 9.4 / 21 us probing
          // first); in today's shape it did not (docs/WIRE.md).
          const unsigned active = __activemask();
          if (!a.llEager && static_cast<int>(threadIdx.x % 32) == 31 - __clz(active)) {
            uint4 probe = dev::loadVolatile(src + v0 * 32 + 16);
            while (probe.y != tag || probe.w != tag) {
              if (!waiter.keepWaiting(s, kWaitHostData, epoch)) {
                ok = false;
                break;
              }
              __nanosleep(kLLPollPauseNs);
              probe = dev::loadVolatile(src + v0 * 32 + 16);
            }
          }
          if (__any_sync(active, !ok)) ok = false;
          if (!ok) break;
          // The rest of the warp's lines were written with the probe's: most have landed (or,
          // eager, every lane's first poll).
          uint4 lo[kLLVecsPerPass], hi[kLLVecsPerPass];
          dev::loadLLPass(src, v0, stride, V, lo, hi);
#pragma unroll
          for (int k = 0; k < kLLVecsPerPass; ++k) {
            const uint64_t v = v0 + k * stride;
            if (v >= V) continue;
            while (lo[k].y != tag || lo[k].w != tag || hi[k].y != tag || hi[k].w != tag) {
              if (!waiter.keepWaiting(s, kWaitHostData, epoch)) {
                ok = false;
                break;
              }
              if (!a.llEager) __nanosleep(kLLPollPauseNs);
              lo[k] = dev::loadVolatile(src + v * 32);
              hi[k] = dev::loadVolatile(src + v * 32 + 16);
            }
            if (!ok) break;
          }
          if (!ok) break;
#pragma unroll
          for (int k = 0; k < kLLVecsPerPass; ++k) {
            if (v0 + k * stride >= V) continue;
            x[k].u = make_uint4(lo[k].x, lo[k].z, hi[k].x, hi[k].z);
          }
        }
        if (!ok) break;
#pragma unroll
        for (int k = 0; k < kLLVecsPerPass; ++k) {
          if (v0 + k * stride < V) dev::accumulate<T>(acc[k], x[k]);
        }
      }
      if (!ok) break;
#pragma unroll
      for (int k = 0; k < kLLVecsPerPass; ++k) {
        const uint64_t v = v0 + k * stride;
        if (v < V) dev::storeVec<T, kAligned>(out, v, a.count, dev::packVec<T>(acc[k]));
      }
    }
    // Every block ends the launch the same way whether or not its wait failed: the epoch and the
    // launch count advance (a failed communicator refuses later calls anyway).
    dev::finishEpoch(st->syncEpoch, epoch);
    dev::advanceSlots(st->llUse, tag);
  });
}

}  // namespace

cudaError_t launchHostOneShotLL(anyrDataType_t dtype, const HostArgs& a, const LaunchShape& shape,
                                cudaStream_t stream) {
  return launchTagged(dtype, a, shape, stream, [](auto tag) {
    using Tag = decltype(tag);
    return hostOneShotLLKernel<typename Tag::T, Tag::kAligned>;
  });
}

}  // namespace anyr
