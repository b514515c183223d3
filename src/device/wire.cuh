// Compressed wire format of the host-memory algorithms (opt-in; docs/WIRE.md): each 16-byte
// input vector travels as one byte per element (e4m3 or int8) and each group of
// kWireGroupVecs vectors carries one power-of-two fp32 scale s = 2^k, the smallest with
// amax(group) <= qmax * s (qmax = 448 for e4m3, 127 for int8). Power-of-two scales make the
// scaling itself exact, so the only error is the 8-bit rounding of x / s.
//
// Determinism: every rank, the writer included, sums dequantize(quantize(x_r)) for every rank
// r, so every rank adds the same fp32 values in the same order and gets the same bits.
//
// Lane mapping: the 16 vectors of one group are held by 16 consecutive lanes of one warp (block
// ranges are multiples of kHostBlockQuantum vectors and blockDim is a multiple of 32), so the
// group maximum is a 4-step butterfly; all 32 lanes of a warp must call wirePut together.
#pragma once

#include <cuda_fp8.h>

#include <type_traits>

#include "device/common.cuh"
#include "device/host_handles.h"
#include "device/launch.cuh"

namespace anyr {
namespace dev {

// Payload of one vector on the wire: one byte per element (8 for 16-bit types, 4 for fp32).
template <typename T>
struct WireVec {
  static constexpr int E = Elem<T>::kPerVec;
  unsigned char b[E];
};

// Calls f(std::integral_constant<int, W>{}) for the wire format `wire` (kWireNative, kWireFp8,
// kWireInt8); cudaErrorInvalidValue for anything else. The launchers' one switch over it.
template <typename F>
cudaError_t dispatchWire(int wire, F&& f) {
  return dispatchInt<kWireNative, kWireFp8, kWireInt8>(wire, static_cast<F&&>(f));
}

__device__ __forceinline__ float pow2f(int k) { return __int_as_float((127 + k) << 23); }

// Smallest k with amax <= qmax * 2^k, clamped to [-126, 126] (so 2^k and 2^-k are normal
// floats; every finite group of fp32 or bf16, up to 3.4e38, needs k <= 122, so nothing finite
// saturates; below qmax * 2^-127 the scale stays 2^-126). amax is the group's largest finite
// |x| (non-finite elements travel as a NaN code, below). amax = m * 2^e, m in [0.5, 1): qmax =
// 0.875 * 2^9 (e4m3) or (127/128) * 2^7 (int8).
template <int kWire>
__device__ __forceinline__ int scaleExponent(float amax) {
  if (!(amax > 0.f)) return 0;  // an all-zero (or all non-finite) group
  int e = 0;
  const float m = frexpf(amax, &e);
  const int k = kWire == kWireFp8 ? e - 9 + (m > 0.875f ? 1 : 0) : e - 7 + (m > 127.f / 128.f);
  return max(-126, min(126, k));
}

// The int8 code of a non-finite element (values use -127..127): it decodes to NaN.
constexpr signed char kInt8NaN = -128;

// One element's code. A non-finite element (inf or NaN) gets the code that decodes to NaN
// (e4m3 0x7F / 0xFF, int8 -128): it reaches the sum as NaN, and the group's other elements keep
// their scale.
template <int kWire>
__device__ __forceinline__ unsigned char quantize1(float x, float inv) {
  if constexpr (kWire == kWireFp8) {
    if (!isfinite(x)) return 0x7F;
    return static_cast<unsigned char>(__nv_cvt_float_to_fp8(x * inv, __NV_SATFINITE, __NV_E4M3));
  } else {
    if (!isfinite(x)) return static_cast<unsigned char>(kInt8NaN);
    const float r = rintf(fminf(fmaxf(x * inv, -127.f), 127.f));
    return static_cast<unsigned char>(static_cast<signed char>(static_cast<int>(r)));
  }
}

template <int kWire>
__device__ __forceinline__ float dequantize1(unsigned char q, float s) {
  if constexpr (kWire == kWireFp8) {
    __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(q), __NV_E4M3);
    return __half2float(__half(h)) * s;
  } else {
    const signed char c = static_cast<signed char>(q);
    return c == kInt8NaN ? __int_as_float(0x7fc00000) : static_cast<float>(c) * s;
  }
}

// Quantizes vector x (all 32 lanes call; lanes 16j..16j+15 hold one group), writes its payload
// to pay + v * E and, from the group's first lane, the scale to scales + 4 * (v / 16), when
// `store`; returns the dequantized values every reader will compute in `deq`.
template <typename T, int kWire>
__device__ __forceinline__ void wirePut(const Vec& x, char* pay, char* scales, uint64_t v,
                                        bool store, float (&deq)[Elem<T>::kPerVec]) {
  constexpr int E = Elem<T>::kPerVec;
  float f[E];
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < E; ++i) {
    f[i] = vecElem<T>(x, i);
    if (isfinite(f[i])) amax = fmaxf(amax, fabsf(f[i]));
  }
#pragma unroll
  for (int m = 1; m < kWireGroupVecs; m <<= 1) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
  }
  const int k = scaleExponent<kWire>(amax);
  const float inv = pow2f(-k), s = pow2f(k);
  WireVec<T> q;
#pragma unroll
  for (int i = 0; i < E; ++i) {
    q.b[i] = quantize1<kWire>(f[i], inv);
    deq[i] = dequantize1<kWire>(q.b[i], s);
  }
  if (!store) return;
  if constexpr (E == 8) {
    uint2 w;
    memcpy(&w, q.b, 8);
    asm volatile("st.volatile.global.v2.u32 [%0], {%1,%2};" ::"l"(pay + v * 8), "r"(w.x), "r"(w.y)
                 : "memory");
  } else {
    uint32_t w;
    memcpy(&w, q.b, 4);
    asm volatile("st.volatile.global.u32 [%0], %1;" ::"l"(pay + v * 4), "r"(w) : "memory");
  }
  if (v % kWireGroupVecs == 0) {
    asm volatile("st.volatile.global.f32 [%0], %1;" ::"l"(scales + (v / kWireGroupVecs) * 4), "f"(s)
                 : "memory");
  }
}

// Reads vector v from a wire buffer and dequantizes it into `deq`.
template <typename T, int kWire>
__device__ __forceinline__ void wireGet(const char* pay, const char* scales, uint64_t v,
                                        float (&deq)[Elem<T>::kPerVec]) {
  constexpr int E = Elem<T>::kPerVec;
  float s;
  asm volatile("ld.volatile.global.f32 %0, [%1];"
               : "=f"(s)
               : "l"(scales + (v / kWireGroupVecs) * 4)
               : "memory");
  WireVec<T> q;
  if constexpr (E == 8) {
    uint2 w;
    asm volatile("ld.volatile.global.v2.u32 {%0,%1}, [%2];"
                 : "=r"(w.x), "=r"(w.y)
                 : "l"(pay + v * 8)
                 : "memory");
    memcpy(q.b, &w, 8);
  } else {
    uint32_t w;
    asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(w) : "l"(pay + v * 4) : "memory");
    memcpy(q.b, &w, 4);
  }
#pragma unroll
  for (int i = 0; i < E; ++i) deq[i] = dequantize1<kWire>(q.b[i], s);
}

// Waits until the flag word of every peer t (threads t < n, t != rank) reached `target`; the
// block then reads what those peers wrote before raising their flags. Returns false, for the
// whole block, when a wait was abandoned. Every thread of the block must call it (it ends with
// a barrier whose result every thread gets).
__device__ __forceinline__ bool hostWaitFlags(const char* base, uint64_t rankBytes,
                                              uint64_t flagWordOffset, int rank, int n,
                                              uint32_t target, uint32_t epoch,
                                              const WaitControl* wait, int32_t what) {
  int failed = 0;
  const int t = static_cast<int>(threadIdx.x);
  if (t < n && t != rank) {
    const uint32_t* flag = reinterpret_cast<const uint32_t*>(
        base + static_cast<uint64_t>(t) * rankBytes + flagWordOffset);
    Waiter waiter(wait);
    while (static_cast<int32_t>(loadAcquireSys(flag) - target) < 0) {
      if (!waiter.keepWaiting(t, what, epoch)) {
        failed = 1;
        break;
      }
    }
  }
  return __syncthreads_or(failed) == 0;
}

// acc += the n contributions to vector v in rank order, each as every rank sees it: this
// rank's own `mine` (quantized and dequantized by wirePut), every peer's read from its wire
// area (payload at regionOf(s) + dataOff, its scales at that + scalesOff); vectors at or past
// V add zeros. The same order and values on every rank, so the same bits.
template <typename T, int kWire, typename RegionOf>
__device__ __forceinline__ void wireSumRanks(const float (&mine)[Elem<T>::kPerVec], int rank, int n,
                                             uint64_t v, uint64_t V, RegionOf regionOf,
                                             uint64_t dataOff, uint64_t scalesOff,
                                             float (&acc)[Elem<T>::kPerVec]) {
  constexpr int E = Elem<T>::kPerVec;
  for (int s = 0; s < n; ++s) {
    float d[E];
    if (s == rank) {
#pragma unroll
      for (int e = 0; e < E; ++e) d[e] = mine[e];
    } else if (v < V) {
      const char* src = regionOf(s) + dataOff;
      wireGet<T, kWire>(src, src + scalesOff, v, d);
    } else {
#pragma unroll
      for (int e = 0; e < E; ++e) d[e] = 0.f;
    }
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] += d[e];
  }
}

// launchTagged for a kernel that also takes the wire format: the kernel kernelOf(tag, wire)
// returns, wire being what dispatchWire passes for a.wire. The wire algorithms' launcher.
template <typename Args, typename Shape, typename KernelOf>
cudaError_t launchWireTagged(anyrDataType_t dtype, const Args& a, const Shape& shape,
                             cudaStream_t stream, KernelOf&& kernelOf) {
  return dispatchWire(a.wire, [&](auto wire) {
    return launchTagged(dtype, a, shape, stream, [&](auto tag) { return kernelOf(tag, wire); });
  });
}

}  // namespace dev
}  // namespace anyr
