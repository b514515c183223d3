// Kernels of the fabric measurement (transport/fabric_kernels.h).
#include <cuda_runtime.h>

#include "device/common.cuh"
#include "transport/fabric_kernels.h"

namespace anyr {

namespace {

constexpr int kCopyThreads = 512;
constexpr int kCopyUnroll = 4;  // loads in flight per thread before its stores
constexpr int kRoundThreads = 256;
constexpr int kSyncVectors = 1024 / 16;  // 1 KB to every peer per round

__device__ __forceinline__ bool failed(const FabricStatus* st) {
  return st != nullptr && *reinterpret_cast<const volatile int32_t*>(&st->code) != kFabricOk;
}

// The first failure of this rank's measurement: recorded, and the abort value written into
// every flag this rank owns at its peers (their waits for it end at once).
__device__ void fail(const FabricPeers& p, FabricStatus* st, int32_t code, int peer, int32_t what,
                     uint32_t step) {
  if (atomicCAS(&st->code, kFabricOk, code) != kFabricOk) return;
  st->peer = peer;
  st->what = what;
  st->step = step;
  __threadfence();
  for (int r = 0; r < p.nranks; ++r) {
    if (r == p.rank) continue;
    for (int w = 0; w < kFabricWords; ++w) {
      dev::storeReleaseSys(p.flags[r] + p.rank * kFabricWords + w, kFabricAbort);
    }
  }
}

// Waits until *flag >= want. kFabricOk; kFabricPeerGaveUp (the abort value); kFabricTimedOut past
// the deadline; -1 when another thread of this rank already failed (nothing to record).
__device__ int32_t waitAtLeast(const uint32_t* flag, uint32_t want, unsigned long long deadline,
                               const FabricStatus* st) {
  for (uint32_t spins = 1;; ++spins) {
    const uint32_t v = dev::loadAcquireSys(flag);
    if (v == kFabricAbort) return kFabricPeerGaveUp;
    if (v >= want) return kFabricOk;
    if ((spins & 63u) == 0) {
      if (dev::globalTimerNs() > deadline) return kFabricTimedOut;
      if (failed(st)) return -1;
    }
  }
}

__global__ void __launch_bounds__(kCopyThreads)
    copyKernel(FabricCopy c, FabricTimes* times, const FabricStatus* st) {
  if (failed(st)) return;
  if (threadIdx.x == 0) atomicMin(&times->startNs, dev::globalTimerNs());
  const int seg = static_cast<int>(blockIdx.x) % c.segs;
  const uint64_t perSeg = gridDim.x / static_cast<unsigned>(c.segs);
  const uint64_t stride = perSeg * blockDim.x;
  const uint4* src = static_cast<const uint4*>(c.src[seg]);
  uint4* dst = static_cast<uint4*>(c.dst[seg]);
  uint64_t i = (blockIdx.x / static_cast<unsigned>(c.segs)) * static_cast<uint64_t>(blockDim.x) +
               threadIdx.x;
  for (; i + (kCopyUnroll - 1) * stride < c.n16; i += kCopyUnroll * stride) {
    uint4 v[kCopyUnroll];
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) v[u] = dev::loadCg(src + i + u * stride);
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) dev::storeSys(dst + i + u * stride, v[u]);
  }
  for (; i < c.n16; i += stride) dev::storeSys(dst + i, dev::loadCg(src + i));
  __threadfence_system();  // the stores have left before the end is taken
  __syncthreads();
  if (threadIdx.x == 0) atomicMax(&times->endNs, dev::globalTimerNs());
}

__global__ void roundTripKernel(uint32_t* word, int peer, int warm, int rounds,
                                unsigned long long timeoutNs, FabricTimes* times,
                                FabricStatus* st) {
  if (threadIdx.x != 0 || failed(st)) return;
  const unsigned long long deadline = dev::globalTimerNs() + timeoutNs;
  uint32_t seq = dev::loadAcquireSys(word);
  unsigned long long t0 = dev::globalTimerNs();
  for (int r = 1; r <= warm + rounds; ++r) {
    if (r == warm + 1) t0 = dev::globalTimerNs();
    seq = seq + 1 == kFabricAbort ? 1 : seq + 1;
    dev::storeReleaseSys(word, seq);
    for (uint32_t spins = 1; dev::loadAcquireSys(word) != seq; ++spins) {
      if ((spins & 63u) == 0 && dev::globalTimerNs() > deadline) {
        if (atomicCAS(&st->code, kFabricOk, kFabricTimedOut) == kFabricOk) {
          st->peer = peer;
          st->what = kFabricWhatRoundTrip;
          st->step = static_cast<uint32_t>(r);
        }
        return;
      }
    }
  }
  times->startNs = t0;
  times->endNs = dev::globalTimerNs();
}

__global__ void barrierKernel(FabricPeers p, uint32_t seq, FabricStatus* st) {
  if (failed(st)) return;
  const unsigned long long deadline = dev::globalTimerNs() + p.timeoutNs;
  const int t = static_cast<int>(threadIdx.x);
  if (t >= p.nranks || t == p.rank) return;
  dev::storeReleaseSys(p.flags[t] + p.rank * kFabricWords + kFabricBarrierWord, seq);
  const int32_t rc =
      waitAtLeast(p.flags[p.rank] + t * kFabricWords + kFabricBarrierWord, seq, deadline, st);
  if (rc > 0) fail(p, st, rc, t, kFabricWhatBarrier, seq);
}

// Timed rounds, every rank at once. kOnePartner false (synchronisation rounds): 1 KB and a flag
// to every peer, then a wait for every peer's flag (thread t signals and waits for rank t).
// kOnePartner true (one-partner rounds): 1 KB and a flag to the next rank, then a wait for the
// previous rank's (thread 0). Each round's flag carries its number, so a flag of an earlier
// round never satisfies a later wait.
template <bool kOnePartner>
__global__ void __launch_bounds__(kRoundThreads)
    roundsKernel(FabricPeers p, int warm, int rounds, FabricTimes* times, FabricStatus* st) {
  __shared__ int stop;
  const int t = static_cast<int>(threadIdx.x);
  // One thread reads the status for the block: a thread of this kernel may record a failure
  // while another has yet to start, and every thread must reach the same barriers.
  if (t == 0) stop = failed(st) ? 1 : 0;
  __syncthreads();
  if (stop) return;
  const unsigned long long deadline = dev::globalTimerNs() + p.timeoutNs;
  const int next = (p.rank + 1) % p.nranks;
  const int prev = (p.rank + p.nranks - 1) % p.nranks;
  // The peers this thread's vectors go to (one, or every other rank), and the flag it signals
  // and waits for (to / from; -1: none).
  const int peers = kOnePartner ? 1 : p.nranks - 1;
  int to = -1, from = -1;
  if (kOnePartner) {
    if (t == 0) to = next, from = prev;
  } else if (t < p.nranks && t != p.rank) {
    to = from = t;
  }
  const int word = kOnePartner ? kFabricHopWord : kFabricSyncWord;
  const uint32_t what = kOnePartner ? kFabricWhatHop : kFabricWhatSync;
  unsigned long long t0 = 0;
  for (int r = 1; r <= warm + rounds; ++r) {
    if (r == warm + 1 && t == 0) t0 = dev::globalTimerNs();
    for (int i = t; i < peers * kSyncVectors; i += blockDim.x) {
      const int k = i / kSyncVectors;
      const int peer = kOnePartner ? next : k < p.rank ? k : k + 1;
      uint4* dst =
          reinterpret_cast<uint4*>(p.region[peer] + p.slotBytes * p.rank) + (i % kSyncVectors);
      dev::storeSys(dst, make_uint4(static_cast<uint32_t>(r), static_cast<uint32_t>(p.rank),
                                    static_cast<uint32_t>(i), 0u));
    }
    __syncthreads();
    if (to >= 0) {
      // A release at system scope: the block's data (ordered before it by the barrier) lands
      // before the flag, as in the peer algorithms.
      dev::storeReleaseSys(p.flags[to] + p.rank * kFabricWords + word, static_cast<uint32_t>(r));
      const int32_t rc = waitAtLeast(p.flags[p.rank] + from * kFabricWords + word,
                                     static_cast<uint32_t>(r), deadline, st);
      if (rc != kFabricOk) {
        if (rc > 0) fail(p, st, rc, from, what, static_cast<uint32_t>(r));
        stop = 1;
      }
    }
    __syncthreads();
    if (stop) return;
  }
  if (t == 0) {
    times->startNs = t0;
    times->endNs = dev::globalTimerNs();
  }
}

}  // namespace

cudaError_t preloadFabricKernels() {
  cudaFuncAttributes a{};
  for (const void* f :
       {reinterpret_cast<const void*>(copyKernel), reinterpret_cast<const void*>(roundTripKernel),
        reinterpret_cast<const void*>(barrierKernel),
        reinterpret_cast<const void*>(roundsKernel<false>),
        reinterpret_cast<const void*>(roundsKernel<true>)}) {
    const cudaError_t e = cudaFuncGetAttributes(&a, f);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

cudaError_t launchFabricCopy(const FabricCopy& c, int blocks, FabricTimes* times,
                             const FabricStatus* status, cudaStream_t stream) {
  if (c.segs < 1 || c.segs > kMaxLocalRanks) return cudaErrorInvalidValue;
  const int grid = blocks < c.segs ? c.segs : blocks / c.segs * c.segs;
  copyKernel<<<grid, kCopyThreads, 0, stream>>>(c, times, status);
  return cudaGetLastError();
}

cudaError_t launchFabricRoundTrip(uint32_t* word, int peer, int warm, int rounds,
                                  unsigned long long timeoutNs, FabricTimes* times,
                                  FabricStatus* status, cudaStream_t stream) {
  roundTripKernel<<<1, 32, 0, stream>>>(word, peer, warm, rounds, timeoutNs, times, status);
  return cudaGetLastError();
}

cudaError_t launchFabricBarrier(const FabricPeers& p, uint32_t seq, FabricStatus* status,
                                cudaStream_t stream) {
  barrierKernel<<<1, 32, 0, stream>>>(p, seq, status);
  return cudaGetLastError();
}

cudaError_t launchFabricSyncRounds(const FabricPeers& p, int warm, int rounds, FabricTimes* times,
                                   FabricStatus* status, cudaStream_t stream) {
  roundsKernel<false><<<1, kRoundThreads, 0, stream>>>(p, warm, rounds, times, status);
  return cudaGetLastError();
}

cudaError_t launchFabricHopRounds(const FabricPeers& p, int warm, int rounds, FabricTimes* times,
                                  FabricStatus* status, cudaStream_t stream) {
  roundsKernel<true><<<1, kRoundThreads, 0, stream>>>(p, warm, rounds, times, status);
  return cudaGetLastError();
}

}  // namespace anyr
