// Kernels of the topology probe: pattern fill/check, peer atomics, SM-driven 16-byte copies,
// a bounded flag ping-pong and the programmatic-launch probe. See probe_kernels.h for the
// contracts.
#include <cuda_runtime.h>

#include "device/common.cuh"
#include "device/launch.cuh"
#include "topology/probe_kernels.h"

namespace anyr {
namespace probekernels {

namespace {

constexpr int kThreads = 256;
constexpr int kCopyThreads = 512;
constexpr int kCopyUnroll = 4;  // loads in flight per thread before the stores
constexpr unsigned int kAbort = 0xffffffffu;

__device__ __forceinline__ uint32_t patternAt(uint64_t i, uint32_t seed) {
  // splitmix64 finalizer of (index, seed); OR 1 keeps it non-zero.
  uint64_t z = i * 0x9e3779b97f4a7c15ull + (static_cast<uint64_t>(seed) << 32 | seed);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<uint32_t>(z) | 1u;
}

__device__ __forceinline__ uint4 patternVec(size_t i16, uint32_t seed) {
  const uint64_t w = static_cast<uint64_t>(i16) * 4;
  return make_uint4(patternAt(w, seed), patternAt(w + 1, seed), patternAt(w + 2, seed),
                    patternAt(w + 3, seed));
}

__device__ __forceinline__ void storeReleaseSys(unsigned int* p, unsigned int v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ unsigned int loadAcquireSys(const unsigned int* p) {
  unsigned int v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ unsigned long long globalTimerNs() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Spins until *flag == want. Reads the timer only every 16 polls, so a prompt answer costs no
// timer read. Returns kPingPongOk, kPingPongTimedOut, or kPingPongPartnerAborted.
__device__ __forceinline__ int waitFlag(const unsigned int* flag, unsigned int want,
                                        unsigned long long timeoutNs) {
  unsigned long long start = 0;
  unsigned int spins = 0;
  for (;;) {
    const unsigned int v = loadAcquireSys(flag);
    if (v == want) return kPingPongOk;
    if (v == kAbort) return kPingPongPartnerAborted;
    if ((++spins & 15u) == 0) {
      const unsigned long long now = globalTimerNs();
      if (start == 0) {
        start = now;
      } else if (now - start > timeoutNs) {
        return kPingPongTimedOut;
      }
    }
  }
}

__global__ void fillPatternKernel(uint4* dst, size_t n16, uint32_t seed) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n16;
       i += stride) {
    dst[i] = patternVec(i, seed);
  }
}

__global__ void checkPatternKernel(const uint4* src, size_t n16, uint32_t seed,
                                   unsigned long long* mismatches) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  unsigned long long bad = 0;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n16;
       i += stride) {
    const uint4 v = src[i];
    const uint4 want = patternVec(i, seed);
    bad += (v.x != want.x) + (v.y != want.y) + (v.z != want.z) + (v.w != want.w);
  }
  if (bad != 0) atomicAdd(mismatches, bad);
}

__global__ void atomicAddKernel(unsigned int* counters, int numCounters, int counterStride,
                                int repeats) {
  const unsigned int t = blockIdx.x * blockDim.x + threadIdx.x;
  unsigned int* c = counters + static_cast<size_t>(t % static_cast<unsigned int>(numCounters)) *
                                   static_cast<size_t>(counterStride);
  for (int r = 0; r < repeats; ++r) atomicAdd(c, 1u);
}

__global__ void __launch_bounds__(kCopyThreads)
    copy16Kernel(uint4* __restrict__ dst, const uint4* __restrict__ src, size_t n16) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + (kCopyUnroll - 1) * stride < n16; i += kCopyUnroll * stride) {
    uint4 v[kCopyUnroll];
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) v[u] = src[i + u * stride];
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) dst[i + u * stride] = v[u];
  }
  for (; i < n16; i += stride) dst[i] = src[i];
}

__global__ void pingPongInitiatorKernel(unsigned int* ping, const unsigned int* pong, int batches,
                                        int roundsPerBatch, unsigned long long timeoutNs,
                                        unsigned long long* batchNs, int* status) {
  unsigned int seq = 0;
  for (int b = 0; b < batches; ++b) {
    const unsigned long long t0 = globalTimerNs();
    for (int r = 0; r < roundsPerBatch; ++r) {
      ++seq;
      storeReleaseSys(ping, seq);
      const int rc = waitFlag(pong, seq, timeoutNs);
      if (rc != kPingPongOk) {
        if (rc == kPingPongTimedOut) storeReleaseSys(ping, kAbort);  // release the responder
        *status = rc;
        return;
      }
    }
    batchNs[b] = globalTimerNs() - t0;
  }
  *status = kPingPongOk;
}

__global__ void pingPongResponderKernel(const unsigned int* ping, unsigned int* pong,
                                        int totalRounds, unsigned long long timeoutNs,
                                        int* status) {
  for (unsigned int seq = 1; seq <= static_cast<unsigned int>(totalRounds); ++seq) {
    const int rc = waitFlag(ping, seq, timeoutNs);
    if (rc != kPingPongOk) {
      if (rc == kPingPongTimedOut) storeReleaseSys(pong, kAbort);  // release the initiator
      *status = rc;
      return;
    }
    storeReleaseSys(pong, seq);
  }
  *status = kPingPongOk;
}

}  // namespace

cudaError_t kernelImageStatus() {
  cudaFuncAttributes attrs{};
  const cudaError_t e = cudaFuncGetAttributes(&attrs, fillPatternKernel);
  if (e != cudaSuccess) (void)cudaGetLastError();  // not sticky; leave no trace for callers
  return e;
}

cudaError_t launchFillPattern(void* dst, size_t n16, uint32_t seed, int blocks,
                              cudaStream_t stream) {
  fillPatternKernel<<<blocks, kThreads, 0, stream>>>(static_cast<uint4*>(dst), n16, seed);
  return cudaGetLastError();
}

cudaError_t launchCheckPattern(const void* src, size_t n16, uint32_t seed,
                               unsigned long long* mismatches, int blocks, cudaStream_t stream) {
  checkPatternKernel<<<blocks, kThreads, 0, stream>>>(static_cast<const uint4*>(src), n16, seed,
                                                      mismatches);
  return cudaGetLastError();
}

cudaError_t launchAtomicAdd(unsigned int* counters, int numCounters, int counterStride, int repeats,
                            int blocks, int threads, cudaStream_t stream) {
  if (numCounters <= 0 || counterStride <= 0 || repeats < 0) return cudaErrorInvalidValue;
  atomicAddKernel<<<blocks, threads, 0, stream>>>(counters, numCounters, counterStride, repeats);
  return cudaGetLastError();
}

cudaError_t launchCopy16(void* dst, const void* src, size_t n16, int blocks, cudaStream_t stream) {
  copy16Kernel<<<blocks, kCopyThreads, 0, stream>>>(static_cast<uint4*>(dst),
                                                    static_cast<const uint4*>(src), n16);
  return cudaGetLastError();
}

namespace {
// The programmatic-launch probe: the first kernel releases its dependents at once, then writes
// 1 after a short delay; the second, launched with the attribute, is therefore running during
// that delay, waits for the first (dev::waitForPrevious) and then adds 1. Device code compiled
// for a target without the two instructions (PTX of a target below 9.0, run by JIT on a newer
// GPU) would neither release nor wait: its second kernel writes kDependentNoWait instead, so
// the probe fails there even where the plain stream order happens to give the right sum.
__global__ void dependentFirstKernel(int* word) {
  dev::releaseDependents();
  const uint64_t until = dev::globalTimerNs() + 20000;  // 20 us: the second kernel is in flight
  while (dev::globalTimerNs() < until) {
  }
  *reinterpret_cast<volatile int*>(word) = 1;
}
__global__ void dependentSecondKernel(int* word) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  dev::waitForPrevious();
  *word = *reinterpret_cast<volatile int*>(word) + 1;
#else
  *word = kDependentNoWait;
#endif
}
}  // namespace

namespace {
__global__ void clusterExchangeKernel(unsigned int* out) {
  __shared__ unsigned int word;
  __shared__ uint2 received;
  __shared__ unsigned long long bar;
  const unsigned b = dev::clusterBlockRank();
  if (threadIdx.x == 0) {
    word = 0x5100u + b;
    received = make_uint2(0u, 0u);
    dev::mbarrierInit(&bar, 1);
    dev::fenceMbarrierInitCluster();
  }
  dev::clusterArrive();
  dev::clusterWait();
  const unsigned other = dev::loadClusterShared(&word, b ^ 1u);
  // The fused cluster kernels' exchange: an asynchronous store into the other block's shared
  // memory, counted on its mbarrier (a bounded wait: a probe must not hang).
  unsigned got = 0;
  if (threadIdx.x == 0) {
    dev::stAsyncPair(dev::clusterSharedAddr(&received, b ^ 1u), 0x5200u + b, 0x5300u + b,
                     dev::clusterSharedAddr(&bar, b ^ 1u));
    dev::mbarrierArriveExpectTx(&bar, 8u);
    // Bounded in time (each try_wait may suspend for a system-defined while): 100 ms.
    bool done = false;
    const uint64_t until = dev::globalTimerNs() + 100000000ull;
    while (!done && dev::globalTimerNs() < until) done = dev::mbarrierTryWait(&bar, 0u);
    if (done && received.y == received.x + 0x100u) got = received.x;
  }
  dev::clusterArrive();  // the other block's accesses to this block's memory are done
  dev::clusterWait();
  if (threadIdx.x == 0) {
    out[b] = other;
    out[2 + b] = got;
  }
}
}  // namespace

cudaError_t launchClusterExchange(unsigned int* out, cudaStream_t stream) {
  return launchClusterKernel(clusterExchangeKernel, dim3(2), dim3(32), 2, 0, stream, false, out);
}

cudaError_t launchDependentPair(int* word, cudaStream_t stream) {
  dependentFirstKernel<<<1, 1, 0, stream>>>(word);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  return launchKernel(dependentSecondKernel, dim3(1), dim3(1), 0, stream, true, word);
}

cudaError_t launchPingPongInitiator(unsigned int* ping, const unsigned int* pong, int batches,
                                    int roundsPerBatch, unsigned long long timeoutNs,
                                    unsigned long long* batchNs, int* status, cudaStream_t stream) {
  pingPongInitiatorKernel<<<1, 1, 0, stream>>>(ping, pong, batches, roundsPerBatch, timeoutNs,
                                               batchNs, status);
  return cudaGetLastError();
}

cudaError_t launchPingPongResponder(const unsigned int* ping, unsigned int* pong, int totalRounds,
                                    unsigned long long timeoutNs, int* status,
                                    cudaStream_t stream) {
  pingPongResponderKernel<<<1, 1, 0, stream>>>(ping, pong, totalRounds, timeoutNs, status);
  return cudaGetLastError();
}

}  // namespace probekernels
}  // namespace anyr
