// Device-side helpers shared by every algorithm: element conversion, 16-byte vector access
// with a scalar tail, memory-ordering primitives, and the bounded wait. Included by .cu files
// only. No framework headers: raw pointers and the plain structs of device_handles.h.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include <type_traits>
#include <utility>

#include "anyreduce/anyreduce.h"
#include "device/handles.h"

namespace anyr {
namespace dev {

// ---- dtype dispatch -----------------------------------------------------------------------
// The one switch from an anyrDataType_t to the element type a kernel template is instantiated
// for: calls f(DtypeTag<T>{}) (T: float, __half or __nv_bfloat16) and returns its result, or
// cudaErrorInvalidValue for a dtype the kernels do not take. k16BitOnly: the kernels exist for
// fp16 and bf16 only (the fused ones); fp32 is then refused like an unknown dtype, and f is not
// instantiated for it.
template <typename T_>
struct DtypeTag {
  using T = T_;
};

template <bool k16BitOnly = false, typename F>
cudaError_t dispatchDtype(anyrDataType_t dtype, F&& f) {
  switch (dtype) {
    case anyrFloat32:
      if constexpr (k16BitOnly) {
        return cudaErrorInvalidValue;
      } else {
        return f(DtypeTag<float>{});
      }
    case anyrFloat16:
      return f(DtypeTag<__half>{});
    case anyrBfloat16:
      return f(DtypeTag<__nv_bfloat16>{});
    default:
      return cudaErrorInvalidValue;
  }
}

template <typename T_, bool kAligned_>
struct KernelTag {
  using T = T_;
  static constexpr bool kAligned = kAligned_;
};

// Calls f(KernelTag<T, aligned>{}) for the dtype (dispatchDtype); f launches and returns
// cudaGetLastError().
template <typename F>
cudaError_t dispatch(anyrDataType_t dtype, bool aligned, F&& f) {
  return dispatchDtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::T;
    return aligned ? f(KernelTag<T, true>{}) : f(KernelTag<T, false>{});
  });
}

// The one switch from a run-time integer setting to the kernel compiled for its value (the
// wire format, the quantization mode, the vectors a thread holds): calls
// f(std::integral_constant<int, V>{}) for the V among kValues that equals v and returns its
// result; cudaErrorInvalidValue where none does.
template <int... kValues, typename F>
cudaError_t dispatchInt(int v, F&& f) {
  cudaError_t r = cudaErrorInvalidValue;
  (void)((v == kValues ? (r = f(std::integral_constant<int, kValues>{}), true) : false) || ...);
  return r;
}
template <int... kIndex, typename F>
cudaError_t dispatchCountOf(int v, std::integer_sequence<int, kIndex...>, F&& f) {
  return dispatchInt<(kIndex + 1)...>(v, static_cast<F&&>(f));
}
// dispatchInt over 1..kMax.
template <int kMax, typename F>
cudaError_t dispatchCount(int v, F&& f) {
  return dispatchCountOf(v, std::make_integer_sequence<int, kMax>{}, static_cast<F&&>(f));
}

// Lowers *least to the fewest blocks of `threads` threads that one SM of the current device
// holds at once (cudaOccupancyMaxActiveBlocksPerMultiprocessor, no dynamic shared memory) of
// the kernels kernelOf(tag) names for every dtype and alignment.
template <typename F>
cudaError_t lowerResidentPerSm(int threads, F&& kernelOf, int* least) {
  for (anyrDataType_t t : {anyrFloat32, anyrFloat16, anyrBfloat16}) {
    for (bool aligned : {false, true}) {
      const cudaError_t e = dispatch(t, aligned, [&](auto tag) {
        int n = 0;
        const cudaError_t err =
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernelOf(tag), threads, 0);
        if (err == cudaSuccess && n < *least) *least = n;
        return err;
      });
      if (e != cudaSuccess) return e;
    }
  }
  return cudaSuccess;
}

// ---- element types ------------------------------------------------------------------------
template <typename T>
struct Elem;
template <>
struct Elem<float> {
  static constexpr int kPerVec = 4;
  __device__ static float toFloat(float x) { return x; }
  __device__ static float fromFloat(float x) { return x; }
};
template <>
struct Elem<__half> {
  static constexpr int kPerVec = 8;
  __device__ static float toFloat(__half x) { return __half2float(x); }
  __device__ static __half fromFloat(float x) { return __float2half_rn(x); }
};
template <>
struct Elem<__nv_bfloat16> {
  static constexpr int kPerVec = 8;
  __device__ static float toFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
  __device__ static __nv_bfloat16 fromFloat(float x) { return __float2bfloat16_rn(x); }
};

union Vec {
  uint4 u;
  uint32_t w[4];
  unsigned char b[16];
};

// Loads vector `v` of `in` (count elements). kAligned: the pointer is 16-byte aligned, so
// full vectors are loaded with one instruction; a partial last vector, or an unaligned
// pointer, goes element by element with zero padding.
template <typename T, bool kAligned>
__device__ __forceinline__ Vec loadVec(const T* in, uint64_t v, uint64_t count) {
  constexpr int E = Elem<T>::kPerVec;
  Vec r;
  uint64_t first = v * E;
  if (kAligned && first + E <= count) {
    r.u = *reinterpret_cast<const uint4*>(in + first);
    return r;
  }
  r.u = make_uint4(0, 0, 0, 0);
  T* e = reinterpret_cast<T*>(&r);
#pragma unroll
  for (int i = 0; i < E; ++i) {
    if (first + i < count) e[i] = in[first + i];
  }
  return r;
}

template <typename T, bool kAligned>
__device__ __forceinline__ void storeVec(T* out, uint64_t v, uint64_t count, const Vec& x) {
  constexpr int E = Elem<T>::kPerVec;
  uint64_t first = v * E;
  if (kAligned && first + E <= count) {
    *reinterpret_cast<uint4*>(out + first) = x.u;
    return;
  }
  const T* e = reinterpret_cast<const T*>(&x);
#pragma unroll
  for (int i = 0; i < E; ++i) {
    if (first + i < count) out[first + i] = e[i];
  }
}

// Element i of a vector as fp32 (i a constant after unrolling): a 16-bit element is one shift,
// mask or conversion of its 32-bit word, not an extraction followed by a conversion.
template <typename T>
__device__ __forceinline__ float vecElem(const Vec& x, int i) {
  if constexpr (Elem<T>::kPerVec == 4) {
    return __uint_as_float(x.w[i]);
  } else {
    const uint32_t w = x.w[i >> 1];
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      return __uint_as_float((i & 1) ? (w & 0xFFFF0000u) : (w << 16));
    } else {
      return __half2float(__ushort_as_half(static_cast<unsigned short>((i & 1) ? (w >> 16) : w)));
    }
  }
}

// Two fp32 values rounded (RNE) to T and packed, a in the low half: one conversion instruction
// for the pair, the bits of converting each alone (Elem<T>::fromFloat).
template <typename T>
__device__ __forceinline__ uint32_t packPair(float a, float b) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
}

// Two packed pairs of T added elementwise, each sum rounded once (RNE) to T: the bits of
// packPair<T>(float(a) + float(b)) for each pair, which rounds the exact sum twice, to fp32 and
// then to T. The second rounding of a sum of two values of p bits changes nothing when the
// first keeps at least 2p + 2 bits (S. A. Figueroa, "When is double rounding innocuous?",
// SIGNUM Newsletter 30(3), 1995): fp32 keeps 24, fp16 has 11 and bf16 8. Subnormals and
// signed zeros are kept (no flush to zero on either path), an overflow is infinity on both, and
// a NaN the canonical NaN on both. One add instruction per pair instead of four conversions,
// two adds and a pack.
template <typename T>
__device__ __forceinline__ uint32_t addPair(uint32_t a, uint32_t b) {
  static_assert(Elem<T>::kPerVec == 8, "16-bit types only");
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 s = __hadd2_rn(*reinterpret_cast<const __nv_bfloat162*>(&a),
                                        *reinterpret_cast<const __nv_bfloat162*>(&b));
    return *reinterpret_cast<const uint32_t*>(&s);
  } else {
    const __half2 s =
        __hadd2_rn(*reinterpret_cast<const __half2*>(&a), *reinterpret_cast<const __half2*>(&b));
    return *reinterpret_cast<const uint32_t*>(&s);
  }
}

// Two vectors of a 16-bit T added elementwise (addPair: each sum rounded once to T).
template <typename T>
__device__ __forceinline__ Vec addVec(const Vec& a, const Vec& b) {
  Vec r;
#pragma unroll
  for (int i = 0; i < 4; ++i) r.w[i] = addPair<T>(a.w[i], b.w[i]);
  return r;
}

// Fixed-order accumulation: acc += vector x, elementwise in fp32.
template <typename T>
__device__ __forceinline__ void accumulate(float (&acc)[Elem<T>::kPerVec], const Vec& x) {
#pragma unroll
  for (int i = 0; i < Elem<T>::kPerVec; ++i) acc[i] += vecElem<T>(x, i);
}

// The values rounded (RNE) to T, packed in order.
template <typename T>
__device__ __forceinline__ Vec packVec(const float (&acc)[Elem<T>::kPerVec]) {
  Vec r;
  if constexpr (Elem<T>::kPerVec == 4) {
#pragma unroll
    for (int i = 0; i < 4; ++i) r.w[i] = __float_as_uint(acc[i]);
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) r.w[i] = packPair<T>(acc[2 * i], acc[2 * i + 1]);
  }
  return r;
}

// ---- memory ordering ----------------------------------------------------------------------
__device__ __forceinline__ uint4 loadVolatile(const void* p) {
  uint4 r;
  asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p)
               : "memory");
  return r;
}
__device__ __forceinline__ uint4 loadCg(const void* p) {
  return __ldcg(reinterpret_cast<const uint4*>(p));
}
__device__ __forceinline__ void storeRelaxed(void* p, const uint4& v) {
  asm volatile("st.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z),
               "r"(v.w)
               : "memory");
}
// Data stores into a peer's memory: volatile (relaxed, system scope) so they leave the SM
// promptly instead of waiting in a write-combining buffer while the kernel spins.
__device__ __forceinline__ void storeSys(void* p, const uint4& v) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
}
__device__ __forceinline__ void storeReleaseSys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t loadAcquireSys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint64_t globalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// ---- programmatic dependent launch ---------------------------------------------------------
// A kernel launched with programmatic stream serialization (device/launch.cuh, ANYR_PDL) may
// start while the work before it on the stream is still finishing; it must call this before
// its first access to memory (a buffer, its own state, a peer's). Without that launch
// attribute, and on GPUs without the instruction, it returns at once.
__device__ __forceinline__ void waitForPrevious() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the launch after this one on the stream be scheduled once every block of this grid has
// executed this (griddepcontrol.launch_dependents); without programmatic launch, and on GPUs
// without the instruction, nothing.
__device__ __forceinline__ void releaseDependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// waitForPrevious, then, where `releaseEarly` (AllReduceArgs or HostArgs, uniform over the
// grid), lets the launch after this one on the stream be scheduled as soon as every block of
// this grid has passed this point (griddepcontrol.launch_dependents). That launch still waits
// in its own waitForPrevious until this grid completed and its writes are visible, so only its
// scheduling moves earlier: its blocks are resident and waiting when this grid ends, instead
// of being launched then. Every block of this grid is resident by the time the release takes
// effect, so a waiting block never holds an SM this grid still needs.
__device__ __forceinline__ void waitForPrevious(int32_t releaseEarly) {
  waitForPrevious();
  if (releaseEarly != 0) releaseDependents();
}

// ---- thread-block clusters ------------------------------------------------------------------
// For kernels launched with a cluster dimension (device/launch.cuh, launchClusterKernel), which
// the host does only where a probe launch of clusters worked (probe_kernels.h,
// launchClusterExchange). One-dimensional clusters: the blocks of cluster k are blockIdx.x
// k * size .. k * size + size - 1. Without cluster instructions (GPUs before them) these
// compile to nothing, the probe then reads a wrong value, and no cluster kernel is launched.
__device__ __forceinline__ unsigned clusterSize() {
  unsigned v = 1;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(v));
#endif
  return v;
}
__device__ __forceinline__ unsigned clusterBlockRank() {
  unsigned v = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(v));
#endif
  return v;
}
// Split cluster barrier: every thread of every block of the cluster arrives (release: its
// earlier shared-memory writes become visible to the cluster), then waits (acquire). Warp-
// uniform (.aligned): every thread of a warp executes the same call.
__device__ __forceinline__ void clusterArrive() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#endif
}
// Relaxed arrive: no ordering of this thread's earlier memory accesses (no wait for them to
// complete); for barriers that only say "this block got this far".
__device__ __forceinline__ void clusterArriveRelaxed() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void clusterWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}
// Shared-memory addresses: this block's, and the same place in block `block` of the cluster.
__device__ __forceinline__ uint32_t sharedAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ uint32_t clusterSharedAddr(const void* local, unsigned block) {
  uint32_t remote = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
               : "=r"(remote)
               : "r"(sharedAddr(local)), "r"(block));
#else
  (void)local;
  (void)block;
#endif
  return remote;
}
// The word at the address of `local` (this block's shared memory) in block `block` of the
// cluster (distributed shared memory).
__device__ __forceinline__ uint32_t loadClusterShared(const void* local, unsigned block) {
  uint32_t v = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("ld.shared::cluster.u32 %0, [%1];"
               : "=r"(v)
               : "r"(clusterSharedAddr(local, block))
               : "memory");
#else
  (void)local;
  (void)block;
#endif
  return v;
}

// ---- mbarriers and asynchronous stores into a cluster peer's shared memory -----------------
// A block's mbarrier completes a phase when its pending arrivals reach zero and the bytes it
// was told to expect (arrive.expect_tx) have landed; st.async writes a register value into a
// block of the cluster and counts its bytes on that block's mbarrier, with no fence on the
// sender's side (a release barrier would wait for every store the thread still has in flight,
// its pushes to peer GPUs included). The waiter's acquire makes the data visible.
__device__ __forceinline__ void mbarrierInit(unsigned long long* bar, uint32_t arrivals) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(sharedAddr(bar)), "r"(arrivals)
               : "memory");
#else
  (void)bar;
  (void)arrivals;
#endif
}
// After mbarrierInit, before the cluster barrier that tells the peers they may use it.
__device__ __forceinline__ void fenceMbarrierInitCluster() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}
__device__ __forceinline__ void mbarrierArriveExpectTx(unsigned long long* bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n .reg .b64 state;\n"
      " mbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n}" ::"r"(sharedAddr(bar)),
      "r"(bytes)
      : "memory");
#else
  (void)bar;
  (void)bytes;
#endif
}
// True once the phase of parity `parity` completed (acquire at cluster scope).
__device__ __forceinline__ bool mbarrierTryWait(unsigned long long* bar, uint32_t parity) {
  uint32_t done = 1;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n .reg .pred p;\n"
      " mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
      " selp.u32 %0, 1, 0, p;\n}"
      : "=r"(done)
      : "r"(sharedAddr(bar)), "r"(parity)
      : "memory");
#else
  (void)bar;
  (void)parity;
#endif
  return done != 0;
}
// Two words into shared-memory address `remote` of a cluster peer (clusterSharedAddr), counted
// on that peer's mbarrier at `remoteBar`. 8-byte aligned.
__device__ __forceinline__ void stAsyncPair(uint32_t remote, uint32_t a, uint32_t b,
                                            uint32_t remoteBar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.b32 [%0], {%1, %2}, [%3];" ::"r"(
          remote),
      "r"(a), "r"(b), "r"(remoteBar)
      : "memory");
#else
  (void)remote;
  (void)a;
  (void)b;
  (void)remoteBar;
#endif
}

// ---- bounded waits ------------------------------------------------------------------------
// A waiter checks, every kCheckEvery spins, the deadline, whether another thread of this
// communicator already failed, and whether a peer announced a failure: all in device memory,
// so the check is cheap. The host's abort word lives in host-mapped memory, and a read of it
// crosses PCIe (slow under virtualization): it is read at most every kHostPollNs. This matters
// for speed, not only for latency: a slow check delays this rank, which makes its peers wait
// long enough to reach their own slow checks, and two ranks can lock each other into one slow
// check per launch. On any failure the waiter records why in the host-visible ErrorRecord
// (first failing thread wins), tells every peer to stop, and returns false; the kernel then
// exits without finishing (the communicator is failed from then on).
constexpr uint32_t kCheckEvery = 1024;
constexpr uint64_t kHostPollNs = 5u * 1000u * 1000u;
// A wait on a party that itself waits for a peer times out this much after the deadline
// (waitIsSecondHand, device/handles.h: the other blocks of the own cluster, a later round's or
// an all-gather's data, a pull round's end flag, a host two-shot owner's result). The party's
// own wait, or the wait of the rank that takes the missing rank's data first hand, times out
// first, names the peer (the root cause) and stops this one, rather than this wait naming its
// own rank or a healthy peer held up by the missing one.
constexpr uint64_t kSecondHandGraceNs = 1000ull * 1000u * 1000u;

// kInlineChecks: by default the periodic check and the failure report are functions the wait
// loops call, so that they are not copied into every loop; a call, though, makes the kernel keep
// registers for the callee across it (and the waiter in local memory). A kernel that must fit
// few registers (the fused cluster forms at two blocks per SM) inlines them instead: fewer
// registers and no stack, more code on the never-taken path.
template <bool kInlineChecks = false>
struct WaiterT {
  const WaitControl* wcp;
  uint64_t deadline = 0;
  // Time added to this wait's deadline: a chain's later waits give up after its earlier ones
  // (algo/ring.cu), so the first to give up names the rank that broke the chain.
  uint64_t graceNs = 0;
  uint64_t nextHostPoll = 0;
  uint32_t spins = 0;
  __device__ explicit WaiterT(const WaitControl* c) : wcp(c) {}

  __device__ __noinline__ void fail(int32_t code, int32_t waitedRank, int32_t what, uint32_t epoch,
                                    int32_t cause = 0) {
    report(code, waitedRank, what, epoch, cause);
  }

  // Records the failure (first failing thread wins) and tells every peer to stop.
  __device__ __forceinline__ void report(int32_t code, int32_t waitedRank, int32_t what,
                                         uint32_t epoch, int32_t cause = 0) {
    const WaitControl& wc = *wcp;
    if (atomicCAS(&wc.state->failClaim, 0, 1) == 0) {
      ErrorRecord* e = wc.error;
      e->waitedRank = waitedRank;
      e->what = what;
      e->block = static_cast<int32_t>(blockIdx.x);
      e->epoch = epoch;
      e->cause = cause;
      __threadfence_system();
      *reinterpret_cast<volatile int32_t*>(&e->code) = code;
      __threadfence_system();
      if (code != kFailPeerAborted) {
        // The rank this one timed out on, so every peer's error names it too (with more than
        // two ranks the stopped peers were not waiting for it themselves).
        const int32_t culprit = code == kFailTimeout ? waitedRank + 1 : 0;
        for (int p = 0; p < wc.nranks; ++p) {
          if (p != wc.rank && wc.peerHeaders[p] != nullptr) {
            *reinterpret_cast<volatile int32_t*>(&wc.peerHeaders[p]->abortCause) = culprit;
          }
        }
        __threadfence_system();
        for (int p = 0; p < wc.nranks; ++p) {
          if (p != wc.rank && wc.peerHeaders[p] != nullptr) {
            *reinterpret_cast<volatile int32_t*>(&wc.peerHeaders[p]->abortedBy) = wc.rank + 1;
          }
        }
        __threadfence_system();
      }
    }
  }

  // Returns true to keep spinning, false when the wait must be abandoned.
  __device__ __forceinline__ bool keepWaiting(int32_t waitedRank, int32_t what, uint32_t epoch) {
    if (++spins % kCheckEvery != 0) return true;
    if constexpr (kInlineChecks) {
      return check(waitedRank, what, epoch);
    } else {
      return slowCheck(waitedRank, what, epoch);
    }
  }

  __device__ __noinline__ bool slowCheck(int32_t waitedRank, int32_t what, uint32_t epoch) {
    return check(waitedRank, what, epoch);
  }

  __device__ __forceinline__ void failOrReport(int32_t code, int32_t waitedRank, int32_t what,
                                               uint32_t epoch, int32_t cause = 0) {
    if constexpr (kInlineChecks) {
      report(code, waitedRank, what, epoch, cause);
    } else {
      fail(code, waitedRank, what, epoch, cause);
    }
  }

  // The deadline, a peer's failure, the host's abort (at most every kHostPollNs).
  __device__ __forceinline__ bool check(int32_t waitedRank, int32_t what, uint32_t epoch) {
    const WaitControl& wc = *wcp;
    const uint64_t now = globalTimerNs();
    if (deadline == 0) {
      deadline = now + wc.timeoutNs + graceNs;
      nextHostPoll = now + kHostPollNs;
    }
    if (*reinterpret_cast<volatile const int32_t*>(&wc.state->failClaim) != 0) return false;
    const int32_t by = *reinterpret_cast<volatile int32_t*>(&wc.ownHeader->abortedBy);
    if (by != 0) {
      failOrReport(kFailPeerAborted, by - 1, what, epoch,
                   *reinterpret_cast<volatile int32_t*>(&wc.ownHeader->abortCause));
      return false;
    }
    if (now >= nextHostPoll) {
      nextHostPoll = now + kHostPollNs;
      if (*wc.hostAbort != 0) {
        failOrReport(kFailAborted, waitedRank, what, epoch);
        return false;
      }
    }
    if (now > deadline + (waitIsSecondHand(what) ? kSecondHandGraceNs : 0)) {
      failOrReport(kFailTimeout, waitedRank, what, epoch);
      return false;
    }
    return true;
  }
};
using Waiter = WaiterT<false>;

// Whether this communicator has stopped: a wait of this rank gave up, or its host refused a
// call, was aborted or destroyed, and set failClaim (FailureState::stopEverywhere). A kernel
// that starts on a stopped communicator -- one still queued, or replayed from a captured graph
// -- must make nothing visible to a peer: each kernel reads this at its start and skips its
// first peer-visible write (its pushes, its staged data's flag, its published lines). Every
// later step of a kernel waits for its peers first, and a stopped rank's waits give up at their
// first check, so nothing of its call can pair with a peer's. The load is not waited for here:
// its value is first needed at that write, behind the kernel's own input loads, so the check
// adds no round trip to the fast path. Per thread, no barrier: threads that read it at the
// moment it is set may differ, and a stopped rank's results are errors either way.
__device__ __forceinline__ bool stopRequested(const LocalState* st) {
  return *reinterpret_cast<const volatile int32_t*>(&st->failClaim) != 0;
}
// `v` as a value the compiler cannot take as invariant: a test of stopRequested's result inside
// a loop, after the loop's own loads, is then not hoisted in front of the loop (which would make
// those loads wait for the flag's). Emits no instruction.
__device__ __forceinline__ bool opaque(bool v) {
  int x = v ? 1 : 0;
  asm volatile("" : "+r"(x));
  return x != 0;
}

// Per-block epochs (see LocalState). Every thread reads its block's slot at kernel start;
// finishEpoch() writes the next value after the block is done, and block 0 also advances the
// slots of blocks this launch did not use. Every thread of the block must call it.
__device__ __forceinline__ uint32_t readEpoch(const uint32_t* slots) { return slots[blockIdx.x]; }

// The flag algorithms' per-block use count for this launch (LocalState::flagUse): what this
// block's flags carry and wait for. Read after griddepcontrol.wait, as the epochs are.
__device__ __forceinline__ uint32_t flagUseOf(const LocalState* st) {
  return st->flagUse[blockIdx.x] + 1;
}
// Records this launch's use of the block; call after finishEpoch (its barrier).
__device__ __forceinline__ void finishFlagUse(LocalState* st, uint32_t use) {
  if (threadIdx.x == 0) st->flagUse[blockIdx.x] = use;
}

// finishEpoch's writes without its barrier: for a second set of slots, written right after
// finishEpoch on the first (whose barrier already ordered every thread's read of them).
__device__ __forceinline__ void advanceSlots(uint32_t* slots, uint32_t next) {
  if (blockIdx.x == 0) {
    for (uint32_t i = gridDim.x + threadIdx.x; i < static_cast<uint32_t>(kMaxBlocks);
         i += blockDim.x) {
      slots[i] = next;
    }
  }
  if (threadIdx.x == 0) slots[blockIdx.x] = next;
}

__device__ __forceinline__ void finishEpoch(uint32_t* slots, uint32_t next) {
  __syncthreads();
  advanceSlots(slots, next);
}

// ---- the kernel preamble ------------------------------------------------------------------
// The start every all-reduce kernel shares, in this order: the wait for the work before it on
// the stream (waitForPrevious, releasing the next launch early where `a` asks for it), the
// block's slot of its launch counter (a.state->*slots: readEpoch) turned into the kernel's epoch
// by epochOf, then the stop test (stopRequested; its load is not waited for here, see there).
// Args: AllReduceArgs or HostArgs. Flag kernels: epochOf = flagEpochOf; push kernels: phasesOf
// (lamport.cuh).
using EpochSlots = uint32_t (LocalState::*)[kMaxBlocks];
template <typename E>
struct KernelStart {
  E epoch;       // epochOf(the slot as this launch found it)
  bool stopped;  // stopRequested
};
template <typename Args, typename EpochOf>
__device__ __forceinline__ auto startKernel(const Args& a, EpochSlots slots, EpochOf&& epochOf) {
  waitForPrevious(a.releaseEarly);
  const LocalState* st = a.state;
  using E = std::decay_t<decltype(epochOf(0u))>;
  const E epoch = epochOf(readEpoch(st->*slots));
  return KernelStart<E>{epoch, stopRequested(st)};
}

// The flag kernels' epoch: this launch's number, one past the slot (finishEpoch writes it back).
__device__ __forceinline__ uint32_t flagEpochOf(uint32_t slot) { return slot + 1; }

// Vector v of `in` (count elements), or zeros for v >= numVecs: the lanes past the end of a
// range rounded up to whole groups (the wire formats, the host algorithms' block ranges).
template <typename T, bool kAligned>
__device__ __forceinline__ Vec loadVecOrZero(const T* in, uint64_t v, uint64_t numVecs,
                                             uint64_t count) {
  Vec x;
  x.u = make_uint4(0, 0, 0, 0);
  if (v < numVecs) x = loadVec<T, kAligned>(in, v, count);
  return x;
}

}  // namespace dev
}  // namespace anyr
