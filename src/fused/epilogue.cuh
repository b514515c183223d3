// The fused row epilogue: residual add + RMSNorm (+ FP8 or NVFP4 quantization) of one row,
// computed by a whole thread block. Device code only, framework-free: raw pointers in a
// FusedParams (fused/fused.h). Used by the standalone kernel (fused/add_rmsnorm.cu, also the
// NCCL path's epilogue) and by the fused all-reduce kernels, so both give the same bits.
//
// Semantics, for row `row` (T = bf16 or fp16; every operation below is one IEEE fp32 operation,
// round to nearest even; round_T(v) is the RNE conversion of an fp32 value to T):
//   x[i]   = xs[i]                                 the all-reduced fp32 row, before rounding
//   xT[i]  = round_T(x[i])
//   r[i]   = round_T(float(xT[i]) + float(residualIn[row][i]))     (r = xT when residualIn NULL)
//   residualOut[row][i] = r[i]                                     (when residualOut != NULL)
//   ss     = sum over i of float(r[i])^2 in fp32, in the fixed order below
//   mean   = ss / float(hidden)
//   rstd   = rsqrtf(mean + epsilon)
//   w[i]   = float(weight[i])        or  1.0f + float(weight[i])   (weightPlusOne)
//   y[i]   = round_T((float(r[i]) * rstd) * w[i])
//   normOut[row][i] = y[i]                                         (when normOut != NULL)
// Quantization reads the ROUNDED y, so quantOut equals quantizing normOut:
//   FP8:   q[i] = e4m3(float(y[i]) * (1.0f / scale[0])), e4m3 as __nv_cvt_float_to_fp8(...,
//          __NV_SATFINITE, __NV_E4M3): RNE, |values| above 448 saturate to +-448, sign kept
//          on zero.
//          quantOut[row * hidden + i] = q[i].
//   NVFP4: g = scale[0]. Block b holds elements 16b..16b+15:
//          amax = max |float(y[i])|;  s = e4m3(amax * (1.0f / (6.0f * g)))  (as above; s >= 0);
//          d = float(s) * g;  q[i] = e2m1(float(y[i]) * (1.0f / d)), or 0 for the whole block if
//          !(d > 0) (each 1.0f / x correctly rounded: reciprocalNormal or __frcp_rn);
//          e2m1: RNE onto {0, 0.5, 1, 1.5, 2, 3, 4, 6}, |values| above 6 saturate to 6, sign bit
//          kept (also on zero), NaN -> +6 (as cvt.rn.satfinite.e2m1x2.f32 and cuda_fp4.h).
//          quantOut[row * hidden / 2 + i / 2] holds element i in its low nibble for even i,
//          high nibble for odd i. s goes to blockScales[row * hidden / 16 + b] and to
//          blockScalesSwizzled[swizzledScaleOffset(row, b, hidden / 16)] (fused.h).
//          g must be positive and finite.
//
// Summation order of ss (independent of the block size, so every kernel that uses this
// epilogue, and every rank, gets the same bits): the row is cut into 8-element vectors
// v = 0..hidden/8-1; slot s (0..kFusedSlots-1) sums, with fmaf, the squares of the vectors
// v = s, s + kFusedSlots, ... in ascending order, elements 0..7 within a vector (a slot with
// no vector is +0.0); group g (0..31) combines slots 32g..32g+31 by an xor butterfly (offsets
// 16, 8, 4, 2, 1; slot 32g + l in position l), and the 32 group sums are combined by the same
// butterfly. A butterfly leaves the same bits in every position. rsqrtf is the hardware
// approximation (deterministic per architecture). A row whose sum of squares overflows fp32
// (|r| ~ 1e19, bf16 only) gets y = 0.
//
// Calling rules: every thread of the block calls fusedRowEpilogue with the same arguments;
// blockDim.x is a multiple of 32, at most 1024 (one-dimensional block). `xs` (shared, 16-byte
// aligned) holds the hidden fp32 values of x on entry and float(r) on return; `red` (shared)
// holds kFusedRedFloats floats. The epilogue ends with __syncthreads(), so xs and red may be
// refilled right after it returns. Buffers may have any element alignment: 16-byte aligned
// ones are accessed with 16-byte vectors.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "device/common.cuh"
#include "device/vectors.h"
#include "fused/fused.h"

namespace anyr {
namespace dev {

// ---- scalar encodings ---------------------------------------------------------------------
// max(a, b), NaN if either is NaN (fmaxf returns the other operand).
__device__ __forceinline__ float maxNaN(float a, float b) {
#if __CUDA_ARCH__ >= 800
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  // max.NaN needs compute capability 8.0: the same result (the canonical NaN) by compares.
  return a != a || b != b ? __int_as_float(0x7fffffff) : fmaxf(a, b);
#endif
}

__device__ __forceinline__ uint32_t e4m3Code(float v) {
  return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
}

// Two values at once (one conversion instruction where the GPU has it), a in the low byte.
__device__ __forceinline__ uint32_t e4m3Pair(float a, float b) {
  return __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
}

// 1 / d rounded to nearest even, as __frcp_rn, for d = 0 (any result) or 2^-120 <= |d| <=
// 2^120 (FUSED.md; checked on the GPU against __frcp_rn for every float of that range): the
// approximate reciprocal and one fma Newton step, without __frcp_rn's special-case branch.
__device__ __forceinline__ float reciprocalNormal(float d) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));
  return fmaf(r, fmaf(-d, r, 1.0f), r);
}

__device__ __forceinline__ float e4m3Value(uint32_t code) {
  __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), __NV_E4M3);
  return __half2float(__half(h));
}

// ---- vector access ------------------------------------------------------------------------
__device__ __forceinline__ bool isAligned(const void* p, uintptr_t bytes) {
  return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0;
}

// Vector v (8 elements) of a row (or any run) of `n` elements; aligned: its start is 16-byte
// aligned.
template <typename T>
__device__ __forceinline__ Vec loadRowVec(const T* row, uint64_t v, uint64_t n, bool aligned) {
  return aligned ? loadVec<T, true>(row, v, n) : loadVec<T, false>(row, v, n);
}
template <typename T>
__device__ __forceinline__ void storeRowVec(T* row, int v, int n, bool aligned, const Vec& x) {
  if (aligned) {
    storeVec<T, true>(row, v, n, x);
  } else {
    storeVec<T, false>(row, v, n, x);
  }
}

// A 16-byte load with an eviction priority: Plain (none), Stream (read once: evict first from
// L1 and L2) or Keep (read by every row: evict last from L2). The same value either way; a plain
// load before compute capability 8.0 (no L2 cache policies).
enum class LoadHint : int { Plain, Stream, Keep };
template <LoadHint H>
__device__ __forceinline__ uint4 loadHinted(const uint4* p) {
  if constexpr (H == LoadHint::Plain) return *p;
  uint4 r;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint64_t policy;
  if constexpr (H == LoadHint::Stream) {
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    asm volatile("ld.global.L1::evict_first.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p), "l"(policy));
  } else {
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
    asm volatile("ld.global.L1::evict_last.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p), "l"(policy));
  }
#else
  r = *p;
#endif
  return r;
}

// Vector v of a row of `hidden` elements, v < hidden / 8 (a whole vector: hidden is a multiple
// of 8). kAligned (the caller guarantees the row 16-byte aligned): one 16-byte access without
// loadRowVec's tail test, which a kernel latency-bound on its instructions pays for every
// vector, with the eviction priority H (loadHinted); otherwise loadRowVec / storeRowVec with
// `aligned`. Same values either way.
template <typename T, bool kAligned, LoadHint H = LoadHint::Plain>
__device__ __forceinline__ Vec loadWholeVec(const T* row, int v, int hidden, bool aligned) {
  if constexpr (kAligned) {
    Vec r;
    r.u = loadHinted<H>(reinterpret_cast<const uint4*>(row) + v);
    return r;
  } else {
    static_assert(H == LoadHint::Plain, "eviction priorities only for aligned rows");
    return loadRowVec(row, v, hidden, aligned);
  }
}
template <typename T, bool kAligned>
__device__ __forceinline__ void storeWholeVec(T* row, int v, int hidden, bool aligned,
                                              const Vec& x) {
  if constexpr (kAligned) {
    reinterpret_cast<uint4*>(row)[v] = x.u;
  } else {
    storeRowVec(row, v, hidden, aligned, x);
  }
}

__device__ __forceinline__ void storeBytes(unsigned char* p, uint2 x, int n, bool aligned) {
  if (aligned) {
    if (n == 8) {
      *reinterpret_cast<uint2*>(p) = x;
    } else {
      *reinterpret_cast<uint32_t*>(p) = x.x;
    }
    return;
  }
  const unsigned char* b = reinterpret_cast<const unsigned char*>(&x);
  for (int i = 0; i < n; ++i) p[i] = b[i];
}

// Vector v of xs: eight floats, two float4. A 128-bit shared access is served a quarter warp
// (8 lanes, 128 bytes) at a time; with lanes on consecutive vectors (32 bytes apart) lanes k
// and k + 4 would hit the same banks, so lanes 4..7 of each quarter take the second float4
// first: no bank conflict. Callers give consecutive lanes consecutive vectors.
__device__ __forceinline__ void loadXs8(const float* xs, int v, float (&f)[8]) {
  const int h = (threadIdx.x >> 2) & 1;
  const float4 a = reinterpret_cast<const float4*>(xs)[2 * v + h];
  const float4 b = reinterpret_cast<const float4*>(xs)[2 * v + (h ^ 1)];
  const float4 lo = h ? b : a, hi = h ? a : b;
  f[0] = lo.x, f[1] = lo.y, f[2] = lo.z, f[3] = lo.w;
  f[4] = hi.x, f[5] = hi.y, f[6] = hi.z, f[7] = hi.w;
}

__device__ __forceinline__ void storeXs8(float* xs, int v, const float (&f)[8]) {
  const int h = (threadIdx.x >> 2) & 1;
  const float4 lo = make_float4(f[0], f[1], f[2], f[3]);
  const float4 hi = make_float4(f[4], f[5], f[6], f[7]);
  reinterpret_cast<float4*>(xs)[2 * v + h] = h ? hi : lo;
  reinterpret_cast<float4*>(xs)[2 * v + (h ^ 1)] = h ? lo : hi;
}

// The epilogue's arithmetic on one 8-element vector, shared by the shared-memory and the
// register epilogues so both give the same bits (the rounding points are the header's).
// r = round_T(r), in place (the all-reduced x rounded to T); returns r packed.
template <typename T>
__device__ __forceinline__ Vec roundToT(float (&r)[8]) {
  const Vec t = packVec<T>(r);
#pragma unroll
  for (int i = 0; i < 8; ++i) r[i] = vecElem<T>(t, i);
  return t;
}

// r = round_T(r + residual), in place; returns r packed.
template <typename T>
__device__ __forceinline__ Vec addResidual(float (&r)[8], const Vec& res) {
#pragma unroll
  for (int i = 0; i < 8; ++i) r[i] += vecElem<T>(res, i);
  return roundToT<T>(r);
}

// acc + r[0]^2 + ... + r[7]^2, in that order, with fmaf.
__device__ __forceinline__ float addSquares(const float (&r)[8], float acc) {
#pragma unroll
  for (int i = 0; i < 8; ++i) acc = fmaf(r[i], r[i], acc);
  return acc;
}

// y = round_T((r * rstd) * w) with w = weight or 1 + weight; returns y packed, and as floats.
template <typename T>
__device__ __forceinline__ Vec normalize(const float (&r)[8], const Vec& weight, bool plusOne,
                                         float rstd, float (&y)[8]) {
  float f[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float wf = vecElem<T>(weight, i);
    const float w = plusOne ? 1.0f + wf : wf;
    f[i] = (r[i] * rstd) * w;
  }
  const Vec out = packVec<T>(f);
#pragma unroll
  for (int i = 0; i < 8; ++i) y[i] = vecElem<T>(out, i);
  return out;
}

// y for vector v: reads float(r) from xs and the weights.
template <typename T>
__device__ __forceinline__ Vec normVec(const FusedParams& p, const float* xs, int v, float rstd,
                                       bool weightAligned, float (&y)[8]) {
  float r[8];
  loadXs8(xs, v, r);
  const Vec wv = loadRowVec(static_cast<const T*>(p.weight), v, p.hidden, weightAligned);
  return normalize<T>(r, wv, p.weightPlusOne != 0, rstd, y);
}

// ---- phase 2 outputs ----------------------------------------------------------------------
// Where one row's outputs go: residualOut (writeResidual), normOut and the quantized forms.
// write() takes vector v's y (rounded to T, as floats, and packed) and must be called
// warp-uniformly with consecutive lanes on consecutive vectors (the NVFP4 block maximum is
// combined across lanes 2j, 2j + 1). kQuant: the quantization mode when the kernel is compiled
// for one (kQuantAtRunTime: read p.quant); kAligned: the caller guarantees normOut and
// residualOut 16-byte and quantOut 8-byte (FP8) or 4-byte (NVFP4) alignment. Both only remove
// code: the bits are the same.
constexpr int kQuantAtRunTime = -1;

// Calls f(std::integral_constant<int, Q>{}) for quantization mode `quant` (dispatchInt):
// the kernel compiled for that mode; cudaErrorInvalidValue for another mode.
template <typename F>
cudaError_t dispatchQuant(int quant, F&& f) {
  return dispatchInt<anyrQuantNone, anyrQuantFp8, anyrQuantNvfp4>(quant, static_cast<F&&>(f));
}

// The quantization mode: kQuant, or p.quant when the kernel reads it at run time.
template <int kQuant = kQuantAtRunTime>
__device__ __forceinline__ int quantMode(const FusedParams& p) {
  return kQuant == kQuantAtRunTime ? p.quant : kQuant;
}

// The quantization scale (FP8 scale or NVFP4 g), or 1 without quantization.
template <int kQuant = kQuantAtRunTime>
__device__ __forceinline__ float quantScale(const FusedParams& p) {
  return quantMode<kQuant>(p) != anyrQuantNone ? *p.scale : 1.0f;
}

// p itself, computed at this point of the program (see RowOutputs::pin).
template <typename P>
__device__ __forceinline__ void pinPointer(P*& p) {
  uint64_t u = reinterpret_cast<uint64_t>(p);
  asm volatile("" : "+l"(u));
  p = reinterpret_cast<P*>(u);
}

// v itself, used only after every load issued before this point: an empty asm that v passes
// through and that the compiler must keep after those loads (it may read memory). The
// standalone Cluster form passes the quantization scale through it after issuing a row's
// loads, so that RowOutputs' IEEE division by the scale, hoisted out of the row loop, does not
// sit between the scale's load and the row's (the division waited for the scale's load, and
// only then were the row's loads issued: two trips to memory, one after the other, before a
// row's first add; docs/FUSED.md, "The standalone kernel"). The Rows form does not: there the
// same change measured faster at some shapes and slower at others.
__device__ __forceinline__ float afterIssuedLoads(float v) {
  asm volatile("" : "+f"(v) : : "memory");
  return v;
}

template <typename T, int kQuant = kQuantAtRunTime, bool kAligned = false>
struct RowOutputs {
  const FusedParams& p;
  int row, nblocks, quant;
  float qscale;  // FP8 scale or NVFP4 g
  float qinv;    // FP8: 1 / scale; NVFP4: 1 / (6 g) (IEEE divisions, once per row)
  T* normOut;
  T* resOut;  // the row of residualOut, or NULL
  unsigned char* quantRow;
  unsigned char* linear;
  unsigned char* swizzled;  // this row's part of the 128x4 layout (swizzledScaleRowPart)
  bool weightAligned, normAligned, resOutAligned, quantAligned;
  // NVFP4: every block scale d = s * g (s an e4m3 value, at most 448) is 0 or within
  // reciprocalNormal's range, so the reciprocal needs no special-case path.
  bool fastReciprocal;

  // qscale: *p.scale when quantizing (callers may load it early), else unused.
  __device__ __forceinline__ RowOutputs(const FusedParams& params, int r, float scaleValue)
      : p(params), row(r) {
    const int hidden = p.hidden;
    const int64_t rowStart = static_cast<int64_t>(row) * hidden;
    nblocks = hidden / kNvfp4BlockElems;
    quant = quantMode<kQuant>(p);
    qscale = quant != anyrQuantNone ? scaleValue : 1.0f;
    qinv = quant == anyrQuantNvfp4 ? 1.0f / (6.0f * qscale) : 1.0f / qscale;
    normOut = p.normOut ? static_cast<T*>(p.normOut) + rowStart : nullptr;
    resOut = p.residualOut ? static_cast<T*>(p.residualOut) + rowStart : nullptr;
    quantRow = p.quantOut ? static_cast<unsigned char*>(p.quantOut) +
                                (quant == anyrQuantFp8 ? rowStart : rowStart / 2)
                          : nullptr;
    linear = p.blockScales
                 ? static_cast<unsigned char*>(p.blockScales) + static_cast<int64_t>(row) * nblocks
                 : nullptr;
    swizzled = p.blockScalesSwizzled ? static_cast<unsigned char*>(p.blockScalesSwizzled) +
                                           swizzledScaleRowPart(row, nblocks)
                                     : nullptr;
    weightAligned = kAligned || isAligned(p.weight, 16);
    normAligned = kAligned || isAligned(p.normOut, 16);
    resOutAligned = kAligned || isAligned(p.residualOut, 16);
    quantAligned = kAligned || isAligned(p.quantOut, quant == anyrQuantFp8 ? 8 : 4);
    fastReciprocal = qscale >= 0x1p-100f && qscale <= 0x1p100f;
  }

  // Computes the row's addresses here: a kernel builds a row's outputs before it waits for the
  // row's data and calls pin(), so that the compiler does not move the address arithmetic
  // after the wait, onto the row's critical path (an empty asm the values pass through).
  __device__ __forceinline__ void pin() {
    pinPointer(normOut);
    pinPointer(resOut);
    pinPointer(quantRow);
    pinPointer(linear);
    pinPointer(swizzled);
  }

  // qinv computed here, not next to its first use after the row's reduction, where the
  // compiler would otherwise sink the division (the standalone Cluster form calls it once a
  // row's loads are issued: the division then runs during their latency).
  __device__ __forceinline__ void pinScale() { asm volatile("" : "+f"(qinv)); }

  // Vector v's residualOut (when the caller asked for it): r, rounded to T.
  __device__ __forceinline__ void writeResidual(int v, bool active, const float (&r)[8]) const {
    writeResidualVec(v, active, packVec<T>(r));
  }
  // The same from r already packed (roundToT's result).
  __device__ __forceinline__ void writeResidualVec(int v, bool active, const Vec& r) const {
    if (active && resOut != nullptr) {
      storeWholeVec<T, kAligned>(resOut, v, p.hidden, resOutAligned, r);
    }
  }

  // Vector v's normOut (when the caller asked for it).
  __device__ __forceinline__ void writeNorm(int v, bool active, const Vec& out) const {
    if (active && normOut != nullptr)
      storeWholeVec<T, kAligned>(normOut, v, p.hidden, normAligned, out);
  }

  __device__ __forceinline__ void write(int v, bool active, const Vec& out,
                                        const float (&y)[8]) const {
    writeNorm(v, active, out);
    if (quant == anyrQuantFp8) {
      if (active) {
        uint2 packed = make_uint2(0u, 0u);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          packed.x |= e4m3Pair(y[2 * i] * qinv, y[2 * i + 1] * qinv) << (16 * i);
          packed.y |= e4m3Pair(y[4 + 2 * i] * qinv, y[5 + 2 * i] * qinv) << (16 * i);
        }
        storeBytes(quantRow + 8 * static_cast<int64_t>(v), packed, 8, quantAligned);
      }
    } else if (quant == anyrQuantNvfp4) {
      const int vs[1] = {v};
      const bool act[1] = {active};
      const float(&ys)[1][8] = reinterpret_cast<const float(&)[1][8]>(y);
      writeNvfp4Vecs<1>(vs, act, ys);
    }
  }

  // NVFP4 of N vectors of a thread (vs[k], active[k], rounded values y[k]), warp-uniformly.
  // max over {0, |y[i]|} (inactive lanes hold zeros) as a tree, exact, so the order does not
  // change the bits, only the dependency depth. First with NaN propagating: a NaN in any of the
  // warp's vectors, or a global scale outside reciprocalNormal's range (fastReciprocal false),
  // sends the whole warp (the shuffles need it whole) to the general form, one vector at a
  // time, whose maximum ignores NaN (fmaxf), whose reciprocal is __frcp_rn and whose encoder
  // tests every element. Otherwise all N vectors run in one straight line, without a branch
  // between them, so their dependency chains interleave, and the encoder leaves the
  // per-element NaN test out. Same bits either way. (A second straight line with __frcp_rn for
  // the rare scale outside the range made the kernel 150 instructions longer and measured
  // 0.05-0.07 us slower at 16 tokens on 2 x H200: docs/PERFORMANCE.md, "Fused shapes".)
  template <int N>
  __device__ __forceinline__ void writeNvfp4Vecs(const int (&vs)[N], const bool (&active)[N],
                                                 const float (&y)[N][8]) const {
    float amax[N];
    bool nan = false;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      amax[k] = absMaxNaN(y[k]);
      nan = nan || amax[k] != amax[k];
    }
    if (__any_sync(0xffffffffu, nan) || !fastReciprocal) {
#pragma unroll
      for (int k = 0; k < N; ++k) {
        const float a = absMaxIgnoringNaN(y[k]);
        writeNvfp4(vs[k], active[k], a, y[k]);
      }
      return;
    }
    writeNvfp4Straight<N>(vs, active, y, amax);
  }

  // The NaN-free straight line of writeNvfp4Vecs, for a global scale where fastReciprocal holds:
  // reciprocalNormal is then the IEEE reciprocal of every block scale d (any value where d is 0:
  // that block's codes are 0).
  template <int N>
  __device__ __forceinline__ void writeNvfp4Straight(const int (&vs)[N], const bool (&active)[N],
                                                     const float (&y)[N][8],
                                                     float (&amax)[N]) const {
    uint32_t s[N], packed[N];
#pragma unroll
    for (int k = 0; k < N; ++k) {
      amax[k] = fmaxf(amax[k], __shfl_xor_sync(0xffffffffu, amax[k], 1));  // the other half
      s[k] = e4m3Code(amax[k] * qinv);
      const float d = e4m3Value(s[k]) * qscale;
      const float dinv = reciprocalNormal(d);
      // Without a NaN in y, q holds a NaN only where d is 0 (its reciprocal is inf or NaN; with
      // d > 0 finite an infinite y gives an infinite q), and the select below replaces that
      // block's codes by 0.
      float q[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) q[i] = y[k][i] * dinv;
      packed[k] = d > 0.0f ? e2m1Pack8(q) : 0u;
    }
#pragma unroll
    for (int k = 0; k < N; ++k) {
      if (active[k]) storeNvfp4(vs[k], packed[k], s[k]);
    }
  }

  // max |y[i]| as a tree of depth 3, NaN if any y[i] is NaN; otherwise at least +0 (fabsf
  // clears the sign of -0.0), so no maximum with 0 is needed, unlike absMaxIgnoringNaN's.
  __device__ __forceinline__ static float absMaxNaN(const float (&y)[8]) {
    return maxNaN(maxNaN(maxNaN(fabsf(y[0]), fabsf(y[1])), maxNaN(fabsf(y[2]), fabsf(y[3]))),
                  maxNaN(maxNaN(fabsf(y[4]), fabsf(y[5])), maxNaN(fabsf(y[6]), fabsf(y[7]))));
  }

  // max over {0, |y[i]|}, NaN ignored (fmaxf), as a tree of depth 3: 0 when all eight are NaN.
  __device__ __forceinline__ static float absMaxIgnoringNaN(const float (&y)[8]) {
    return fmaxf(
        fmaxf(fmaxf(fabsf(y[0]), fabsf(y[1])), fmaxf(fabsf(y[2]), fabsf(y[3]))),
        fmaxf(fmaxf(fabsf(y[4]), fabsf(y[5])), fmaxf(fmaxf(fabsf(y[6]), fabsf(y[7])), 0.0f)));
  }

  // One vector's NVFP4 codes and, from the even lane of each 16-element block, its scale, for
  // a warp with a NaN somewhere (writeNvfp4Vecs' general form: every element's NaN test).
  // `amax`: this lane's maximum |y| (NaN ignored); combined here with the block's other half.
  __device__ __forceinline__ void writeNvfp4(int v, bool active, float amax,
                                             const float (&y)[8]) const {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));  // the block's other half
    if (!active) return;
    const uint32_t s = e4m3Code(amax * qinv);
    const float d = e4m3Value(s) * qscale;
    uint32_t packed = 0;
    if (d > 0.0f) {
      const float dinv = __frcp_rn(d);  // IEEE 1 / d, as the division (cheaper)
#pragma unroll
      for (int i = 0; i < 8; ++i) packed |= e2m1Code(y[i] * dinv) << (4 * i);
    }
    storeNvfp4(v, packed, s);
  }

  // Vector v's four code bytes and, from the block's even vector, the block scale s.
  __device__ __forceinline__ void storeNvfp4(int v, uint32_t packed, uint32_t s) const {
    storeBytes(quantRow + 4 * static_cast<int64_t>(v), make_uint2(packed, 0u), 4, quantAligned);
    if ((v & 1) == 0) {
      const int b = v >> 1;
      if (linear != nullptr) linear[b] = static_cast<unsigned char>(s);
      if (swizzled != nullptr) {
        swizzled[swizzledScaleColPart(static_cast<uint32_t>(b))] = static_cast<unsigned char>(s);
      }
    }
  }
};

// The xor butterfly (16, 8, 4, 2, 1) over a warp: every lane gets the same sum.
__device__ __forceinline__ float warpButterfly(float t) {
#pragma unroll
  for (int m = 16; m >= 1; m >>= 1) t += __shfl_xor_sync(0xffffffffu, t, m);
  return t;
}

// rstd from the group sums in red[0..groups) (groups <= 32; the others count as +0.0), in the
// documented order. Every warp computes it (the same bits), so no barrier follows; the caller
// places one between the writes of red and this call.
__device__ __forceinline__ float rstdFromGroups(const FusedParams& p, int groups,
                                                const float* red) {
  const int lane = threadIdx.x & 31;
  const float ss = warpButterfly(lane < groups ? red[lane] : 0.0f);
  return rsqrtf(ss / static_cast<float>(p.hidden) + p.epsilon);
}

// ---- the epilogue -------------------------------------------------------------------------
template <typename T>
__device__ void fusedRowEpilogue(const FusedParams& p, int row, float* xs, float* red) {
  const int hidden = p.hidden;
  const int nvec = rowVecs(hidden);
  const int nslots = nvec < kFusedSlots ? nvec : kFusedSlots;
  const int64_t rowStart = static_cast<int64_t>(row) * hidden;
  const T* resIn = p.residualIn ? static_cast<const T*>(p.residualIn) + rowStart : nullptr;
  T* resOut = p.residualOut ? static_cast<T*>(p.residualOut) + rowStart : nullptr;
  // Rows start 16-byte aligned when the buffer does (hidden is a multiple of 8).
  const bool resInAligned = isAligned(p.residualIn, 16);
  const bool resOutAligned = isAligned(p.residualOut, 16);

  // Phase 1: r = round_T(round_T(x) + residual); residualOut; xs = float(r); slot sums, and
  // each warp's 32 consecutive slots combined into their group's sum (red[group]).
  const int lane = threadIdx.x & 31;
  for (int base = threadIdx.x - lane; base < nslots; base += blockDim.x) {
    const int s = base + lane;
    float acc = 0.0f;
    for (int v = s; s < nslots && v < nvec; v += kFusedSlots) {
      float r[8];
      loadXs8(xs, v, r);
      roundToT<T>(r);
      if (resIn != nullptr) addResidual<T>(r, loadRowVec(resIn, v, hidden, resInAligned));
      if (resOut != nullptr) storeRowVec(resOut, v, hidden, resOutAligned, packVec<T>(r));
      storeXs8(xs, v, r);
      acc = addSquares(r, acc);
    }
    acc = warpButterfly(acc);
    if (lane == 0) red[base / 32] = acc;
  }
  __syncthreads();
  const float rstd = rstdFromGroups(p, (nslots + 31) / 32, red);

  // Phase 2: y, normOut, quantization. One vector per lane, consecutive lanes on consecutive
  // vectors; the loop runs warp-uniformly, so the two lanes holding an NVFP4 block (vectors
  // 2b and 2b + 1 on lanes 2j and 2j + 1) combine their maxima with one shuffle.
  const RowOutputs<T> o(p, row, quantScale(p));
  for (int v0 = threadIdx.x - lane; v0 < nvec; v0 += blockDim.x) {
    const int v = v0 + lane;
    const bool active = v < nvec;
    float y[8] = {};
    Vec out = {};
    if (active) out = normVec<T>(p, xs, v, rstd, o.weightAligned, y);
    o.write(v, active, out, y);
  }
  __syncthreads();
}

// ---- the register-resident epilogue ------------------------------------------------------
// The same math and the same bits as fusedRowEpilogue, for kernels that hold the row in
// registers: thread t of a block of B threads owns vectors v = t + k * B, k < VPT, so callers
// can load the residual and the weight before the all-reduced values arrive and hide their
// latency behind the wait. Rules: every thread calls it with the same row; B is a power of two
// from 32 to kFusedSlots with B * VPT >= hidden / 8. Vector v belongs to slot v mod kFusedSlots,
// and B divides kFusedSlots, so a thread's vectors k and k + kFusedSlots / B share a slot: the
// thread sums them in that order, which keeps the documented slot order (B = 512 holds slots t
// and t + 512; B = 256, slots t, t + 256, t + 512, t + 768). `o` is the row's outputs, built
// by the caller with quantScale(p) loaded early (and pinned before the wait for the row's
// data: RowOutputs::pin). `x` holds the all-reduced fp32 row on entry. `ok`: this thread's part of
// the row arrived; when any thread of the block passes false, nothing is written and every thread
// returns false (the block's one barrier decides it). `red` (shared) holds kFusedGroups floats
// (only red[0..31] is used, one per group); the caller places a barrier before the next row
// reuses it (or alternates two arrays: a thread writes the next row's array only after the
// barrier that followed every read of it). kQuant / kAligned as for RowOutputs (kAligned: the
// residual and the weight too). kFlags (kEpi*, below; 0 for the fused kernels) only remove work
// whose result the caller already knows: the bits are the same.
constexpr int kFusedRegsMaxVpt = 4;  // kFusedMaxHidden / 8 vectors over kFusedSlots / 2 threads
static_assert(rowVecs(kFusedMaxHidden) <= kFusedRegsMaxVpt * (kFusedSlots / 2), "VPT too small");
constexpr int kFusedGroups = kFusedSlots / 32;  // butterfly groups of 32 slots

// The epilogues' flags (fusedRowEpilogueRegs, fusedRowEpilogueCluster):
//  kEpiInputIsT: x holds values of T already (the standalone kernel's input, not an fp32 sum),
//                so round_T(x) = x and the rounding is left out.
//  kEpiNoFailure: every thread of the row passes ok = true (no wait that could fail): the
//                residualOut of a vector is written in phase 1, as soon as r is known (from the
//                packed r: one conversion less, and the store leaves before the reduction), and
//                the barrier need not tell whether any thread failed.
//  kEpiXIsR:    the caller added the residual itself (addVec: r = round_T(x + residual), x of
//                T, kEpiInputIsT): x holds float(r) and the residual argument r packed, which
//                phase 1 stores as residualOut without packing x again.
constexpr int kEpiInputIsT = 1;
constexpr int kEpiNoFailure = 2;
constexpr int kEpiXIsR = 4;

template <typename T, int VPT, bool kAligned = false, LoadHint H = LoadHint::Plain>
__device__ __forceinline__ void loadRowRegs(const T* base, int row, int hidden, bool aligned,
                                            Vec (&out)[VPT]) {
  const T* r = base + static_cast<int64_t>(row) * hidden;
  const int nvec = rowVecs(hidden);
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int v = threadIdx.x + k * blockDim.x;
    out[k] = Vec{};
    if (v < nvec) out[k] = loadWholeVec<T, kAligned, H>(r, v, hidden, aligned);
  }
}

// Phase 1 of one vector (both epilogues): r = round_T(round_T(x) + residual) in x, and, with
// kEpiNoFailure, r's residualOut.
template <int kFlags, typename T, int kQuant, bool kAligned>
__device__ __forceinline__ void phase1Vec(const RowOutputs<T, kQuant, kAligned>& o, int v,
                                          float (&x)[8], bool haveRes, const Vec& res) {
  Vec r = {};
  if constexpr ((kFlags & kEpiXIsR) != 0) {
    static_assert((kFlags & kEpiInputIsT) != 0, "r from an input of T");
    r = res;
  } else if constexpr ((kFlags & kEpiInputIsT) != 0) {
    if (haveRes) {
      r = addResidual<T>(x, res);
    } else if constexpr ((kFlags & kEpiNoFailure) != 0) {
      r = packVec<T>(x);  // x is r; packed only for residualOut
    }
  } else {
    r = roundToT<T>(x);
    if (haveRes) r = addResidual<T>(x, res);
  }
  if constexpr ((kFlags & kEpiNoFailure) != 0) o.writeResidualVec(v, true, r);
}

template <typename T, int VPT, int kQuant = kQuantAtRunTime, bool kAligned = false, int kFlags = 0>
__device__ __forceinline__ bool fusedRowEpilogueRegs(const FusedParams& p,
                                                     const RowOutputs<T, kQuant, kAligned>& o,
                                                     float (&x)[VPT][8], const Vec (&res)[VPT],
                                                     const Vec (&w)[VPT], float* red, bool ok) {
  static_assert(VPT >= 1 && VPT <= kFusedRegsMaxVpt, "unsupported vectors per thread");
  const int hidden = p.hidden;
  const int nvec = rowVecs(hidden);
  const int t = threadIdx.x;
  const int B = blockDim.x;
  const int lane = t & 31;

  // Phase 1: r = round_T(round_T(x) + residual); slot sums (vectors ascending within each
  // slot, as in fusedRowEpilogue): ss[k] continues the sum of vector k - m (m = kFusedSlots / B,
  // the same slot) and ends it when k + m >= VPT; each warp's 32 slots combined into their
  // group's sum.
  const bool haveRes = p.residualIn != nullptr;
  const int m = kFusedSlots / B;
  float ss[VPT];
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    float prev = 0.0f;
#pragma unroll
    for (int j = 1; j <= k; ++j) {
      if (j == m) prev = ss[k - j];
    }
    ss[k] = prev;
    const int v = t + k * B;
    if (v >= nvec) continue;
    phase1Vec<kFlags>(o, v, x[k], haveRes, res[k]);
    ss[k] = addSquares(x[k], prev);
  }
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    if (k + m < VPT) continue;  // the slot's sum goes on in ss[k + m]
    const float g = warpButterfly(ss[k]);
    // Slot (t + k * B) mod kFusedSlots, whose group is this warp's part of the row.
    if (lane == 0) red[((t + k * B) % kFusedSlots) / 32] = g;
  }
  if constexpr ((kFlags & kEpiNoFailure) != 0) {
    __syncthreads();
  } else {
    if (__syncthreads_or(!ok)) return false;
  }
  const int slotsUsed = (VPT < m ? VPT : m) * B;
  const float rstd = rstdFromGroups(p, slotsUsed / 32, red);

  // Phase 2: residualOut, y, normOut, quantization; k runs warp-uniformly (RowOutputs::write's
  // rule).
  // NVFP4: every vector normalized first, then the NVFP4 work of all of them in one straight
  // line (RowOutputs::writeNvfp4Vecs); the other modes write each vector as it is normalized.
  int vs[VPT];
  bool act[VPT];
  float y[VPT][8];
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    vs[k] = t + k * B;
    act[k] = vs[k] < nvec;
    if constexpr ((kFlags & kEpiNoFailure) == 0) o.writeResidual(vs[k], act[k], x[k]);
#pragma unroll
    for (int i = 0; i < 8; ++i) y[k][i] = 0.0f;
    if constexpr (kQuant == anyrQuantNvfp4) {
      if (act[k]) {
        o.writeNorm(vs[k], true, normalize<T>(x[k], w[k], p.weightPlusOne != 0, rstd, y[k]));
      }
    } else {
      Vec out = {};
      if (act[k]) out = normalize<T>(x[k], w[k], p.weightPlusOne != 0, rstd, y[k]);
      o.write(vs[k], act[k], out, y[k]);
    }
  }
  if constexpr (kQuant == anyrQuantNvfp4) o.template writeNvfp4Vecs<VPT>(vs, act, y);
  return true;
}

// ---- the cluster epilogue ----------------------------------------------------------------
// The same math and the same bits as fusedRowEpilogueRegs, for a row spread over the C blocks
// of a one-dimensional thread-block cluster (C = clusterSize(); the fused kernels launch clusters
// only where the communicator's cluster probe passed, the standalone kernel where the device
// says it launches them): block c of B threads holds vectors c * B .. c * B +
// B - 1 of every row, one a thread (v = c * B + threadIdx.x), and C * B covers the row, at
// most kFusedSlots vectors (hidden <= 8192), so slot s is vector s and warp w of block c sums
// group c * B / 32 + w of the documented order (C * B / 32 <= 32 groups). Each warp sends its
// group sum and whether any of its threads failed to every block of the cluster (st.async into
// the block's ClusterExchange, counted on its mbarrier); every block waits for the row's
// groups on its own mbarrier and every warp combines them by the same butterfly as
// rstdFromGroups. A row's time on one SM is bound by the latency of its instructions (a row of
// 6144 is 24 instructions deep per element), so spreading it over C SMs shortens a launch of
// few rows. No release barrier sits on a row's path: a release waits until every store the
// thread has in flight completed, its pushes to peer GPUs included.
//
// Reuse: rows alternate two slot arrays and two mbarriers (row parity). A block sends row i + 2
// into a peer's array i % 2 only after it received row i + 1 from that peer, which the peer
// sent after reading its row-i array; so no barrier is needed between rows.
//
// kFlags as for fusedRowEpilogueRegs (kEpiNoFailure: `ok` true on every thread, and `waiter`
// gives up only on a fault).
//
// Rules: B is a multiple of 32 and C * B >= rowVecs(hidden); every thread of every block of the
// cluster calls clusterExchangeBegin once, then fusedRowEpilogueCluster for the same rows in
// the same order (one count `rowsDone`, starting at 0), then clusterExchangeEnd (a block's
// shared memory must outlive its peers' stores into it). `o` is the row's outputs (as for
// fusedRowEpilogueRegs); `x` holds this thread's all-reduced fp32 vector; `res` and `w` its
// residual and weight vectors (zeros past the row).
struct ClusterExchange {
  uint2 slot[2][32];  // [row parity][group]: the group's sum of squares (bits), whether it failed
  unsigned long long bar[2];  // [row parity]: one arrival (thread 0, expecting the bytes) a phase
};

// A thread's place in a cluster-form kernel: its cluster takes rows cluster, cluster +
// clusters, ...; the thread holds vector v of each (first: its block's first vector), and the
// row data that does not depend on the all-reduce: the weight vector and the quantization
// scale (loadConstants) and the current row's residual vector (loadResidual). Kernels call
// both after their own pushes (see fused_oneshot_push.cu: the peers wait for those).
template <typename T, int kQuant, bool kAligned>
struct ClusterRowThread {
  int cluster, clusters, first, v;
  bool active;  // v < hidden / 8
  bool resAligned;
  float qscale = 0.0f;
  Vec w = {}, res = {};

  __device__ __forceinline__ explicit ClusterRowThread(const FusedParams& p) {
    const int blocks = static_cast<int>(clusterSize());
    cluster = static_cast<int>(blockIdx.x) / blocks;
    clusters = static_cast<int>(gridDim.x) / blocks;
    first = static_cast<int>(clusterBlockRank() * blockDim.x);
    v = first + static_cast<int>(threadIdx.x);
    active = v < rowVecs(p.hidden);
    resAligned = kAligned || isAligned(p.residualIn, 16);
  }

  // The weight vector and the quantization scale.
  __device__ __forceinline__ void loadConstants(const FusedParams& p) {
    if (active) {
      w = loadWholeVec<T, kAligned>(static_cast<const T*>(p.weight), v, p.hidden,
                                    kAligned || isAligned(p.weight, 16));
    }
    qscale = quantScale<kQuant>(p);
  }

  // The residual vector of row `row` (of the whole call, rowBase included).
  __device__ __forceinline__ void loadResidual(const FusedParams& p, int row) {
    if (p.residualIn != nullptr && active) {
      res = loadWholeVec<T, kAligned>(
          static_cast<const T*>(p.residualIn) + static_cast<int64_t>(row) * p.hidden, v, p.hidden,
          resAligned);
    }
  }
};

// Sets up the block's mbarriers and arrives on the cluster barrier that tells the peers they
// may send; the first row waits for it (fusedRowEpilogueCluster), so the kernel's first loads
// overlap it.
__device__ __forceinline__ void clusterExchangeBegin(ClusterExchange& xch) {
  if (threadIdx.x == 0) {
    mbarrierInit(&xch.bar[0], 1);
    mbarrierInit(&xch.bar[1], 1);
    fenceMbarrierInitCluster();
  }
  clusterArriveRelaxed();
}

template <typename T, int kQuant = kQuantAtRunTime, bool kAligned = false, typename W = Waiter,
          int kFlags = 0>
__device__ __forceinline__ bool fusedRowEpilogueCluster(const FusedParams& p,
                                                        const RowOutputs<T, kQuant, kAligned>& o,
                                                        int v, float (&x)[8], const Vec& res,
                                                        const Vec& w, ClusterExchange& xch,
                                                        uint32_t& rowsDone, bool ok, W& waiter,
                                                        int rank, uint32_t epoch) {
  const int hidden = p.hidden;
  const bool active = v < rowVecs(hidden);
  const int lane = threadIdx.x & 31;
  const unsigned blocks = clusterSize();
  const int groupsPerBlock = static_cast<int>(blockDim.x) / 32;
  const int groups = static_cast<int>(blocks) * groupsPerBlock;  // <= 32 (rules above)
  const int group =
      static_cast<int>(clusterBlockRank()) * groupsPerBlock + static_cast<int>(threadIdx.x) / 32;
  const uint32_t par = rowsDone & 1u;

  // Phase 1, as fusedRowEpilogueRegs with one vector a thread.
  float ss = 0.0f;
  if (active) {
    phase1Vec<kFlags>(o, v, x, p.residualIn != nullptr, res);
    ss = addSquares(x, 0.0f);
  }
  ss = warpButterfly(ss);
  const uint32_t warpFailed = __any_sync(0xffffffffu, !ok) ? 1u : 0u;
  if (rowsDone == 0) clusterWait();  // every block's mbarriers are initialized
  if (static_cast<unsigned>(lane) < blocks) {
    stAsyncPair(clusterSharedAddr(&xch.slot[par][group], static_cast<unsigned>(lane)),
                __float_as_uint(ss), warpFailed,
                clusterSharedAddr(&xch.bar[par], static_cast<unsigned>(lane)));
  }
  if (threadIdx.x == 0) mbarrierArriveExpectTx(&xch.bar[par], static_cast<uint32_t>(groups) * 8u);
  bool gaveUp = false;
  while (!mbarrierTryWait(&xch.bar[par], (rowsDone >> 1) & 1u)) {
    if (!waiter.keepWaiting(rank, kWaitClusterRow, epoch)) {
      gaveUp = true;
      break;
    }
  }
  ++rowsDone;
  const uint2 mine = lane < groups ? xch.slot[par][lane] : make_uint2(0u, 0u);
  const bool anyFailed = __any_sync(0xffffffffu, gaveUp || mine.y != 0u);
  if (anyFailed) return false;
  const float rstd =
      rsqrtf(warpButterfly(__uint_as_float(mine.x)) / static_cast<float>(hidden) + p.epsilon);

  // Phase 2: residualOut, y, normOut, quantization (warp-uniform: RowOutputs::write's rule;
  // B is a multiple of 32, so lane parity is vector parity).
  if constexpr ((kFlags & kEpiNoFailure) == 0) o.writeResidual(v, active, x);
  float y[8] = {};
  Vec out = {};
  if (active) out = normalize<T>(x, w, p.weightPlusOne != 0, rstd, y);
  o.write(v, active, out, y);
  return true;
}

// The last cluster barrier of a block of a cluster-form kernel: no block exits while a peer
// may still send into its shared memory (or before the barrier clusterExchangeBegin arrived
// on completed, where no row was exchanged).
__device__ __forceinline__ void clusterExchangeEnd(uint32_t rowsDone) {
  if (rowsDone == 0) clusterWait();
  clusterArriveRelaxed();
  clusterWait();
}

}  // namespace dev
}  // namespace anyr
