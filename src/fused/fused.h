// Fused residual add + RMSNorm (+ FP8 / NVFP4 quantization): the kernel parameters, the
// argument rules, the NVFP4 scale-layout index helpers and the standalone launcher.
//
// The math, its rounding points and both block-scale layouts are specified at the top of
// fused/epilogue.cuh and in docs/FUSED.md. Host code includes this header; so does device code
// (the index helpers are __host__ __device__).
#pragma once

#include <cuda_runtime_api.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <array>

#include "anyreduce/anyreduce.h"
#include "base/config.h"
#include "device/vectors.h"

namespace anyr {

constexpr int kFusedMinHidden = 128;
constexpr int kFusedMaxHidden = 16384;
constexpr int kFusedHiddenMultiple = 8;  // one 16-byte vector of bf16/fp16
constexpr int kNvfp4BlockElems = 16;     // elements sharing one NVFP4 block scale

// The fused op's rule for a row width: a multiple of 8 (of 16 with NVFP4) in 128..16384.
constexpr int fusedHiddenMultiple(int quant) {
  return quant == anyrQuantNvfp4 ? kNvfp4BlockElems : kFusedHiddenMultiple;
}
constexpr bool fusedHiddenValid(uint64_t hidden, int quant = anyrQuantNone) {
  return hidden >= kFusedMinHidden && hidden <= kFusedMaxHidden &&
         hidden % static_cast<uint64_t>(fusedHiddenMultiple(quant)) == 0;
}

// Shared scratch of the row epilogue, in floats: one partial sum of squares per slot
// (kFusedSlots of them, a fixed summation order independent of the block size) and the total.
constexpr int kFusedSlots = 1024;
constexpr int kFusedRedFloats = kFusedSlots + 4;  // + total, padded to 16 bytes

// Shared memory a block needs for one row: the fp32 row plus the scratch.
// 16384 -> 69,648 bytes, far under the 99 KB a block may use on every supported GPU.
constexpr size_t fusedSharedBytes(int hidden) {
  return (static_cast<size_t>(hidden) + kFusedRedFloats) * sizeof(float);
}

// Everything the epilogue reads and writes, as raw pointers: a POD passed by value to kernels.
// T below is the dtype (bf16 or fp16); every T buffer is row-major [tokens][hidden].
struct FusedParams {
  const void* residualIn;     // T; NULL: r = x
  void* residualOut;          // T; may equal residualIn (in place); NULL only if residualIn is
  const void* weight;         // T[hidden]
  void* normOut;              // T; NULL only when quant != anyrQuantNone
  float epsilon;              // > 0, finite
  int tokens;                 // rows, 0..INT_MAX
  int hidden;                 // multiple of 8 in 128..16384 (of 16 for NVFP4)
  int weightPlusOne;          // 1: w = 1 + weight; 0: w = weight
  int quant;                  // anyrQuant_t
  const float* scale;         // device pointer to one fp32: FP8 scale or NVFP4 global scale g
  void* quantOut;             // FP8: bytes [tokens][hidden]; NVFP4: bytes [tokens][hidden / 2]
  void* blockScales;          // NVFP4: e4m3 bytes [tokens][hidden / 16], or NULL
  void* blockScalesSwizzled;  // NVFP4: e4m3 bytes in the 128x4 layout, or NULL
};

// ---- NVFP4 block-scale layouts (docs/FUSED.md) -------------------------------------------
// The scales form a matrix of M = tokens rows and K = hidden / 16 columns.
//  linear:   offset(m, k) = m * K + k
//  128x4:    rows padded to a multiple of 128, columns to a multiple of 4 (Kpad); tiles of
//            128 rows x 4 columns, 512 bytes each, ordered row-tile major:
//            offset(m, k) = (m / 128) * (Kpad / 4) * 512 + (k / 4) * 512
//                         + (m % 32) * 16 + ((m % 128) / 32) * 4 + (k % 4)
//            (TensorRT-LLM / FlashInfer get_sf_out_offset_128x4, vLLM swizzle_blockscale,
//            CUTLASS Sm1xxBlockScaledConfig: the layout NVFP4 GEMMs read).
__host__ __device__ constexpr int64_t nvfp4ScaleCols(int64_t hidden) {
  return hidden / kNvfp4BlockElems;
}
__host__ __device__ constexpr int64_t swizzledPaddedRows(int64_t rows) {
  return (rows + 127) / 128 * 128;
}
__host__ __device__ constexpr int64_t swizzledPaddedCols(int64_t cols) {
  return (cols + 3) / 4 * 4;
}
// Bytes of the 128x4 buffer, padding included.
__host__ __device__ constexpr int64_t swizzledScaleBytes(int64_t rows, int64_t cols) {
  return swizzledPaddedRows(rows) * swizzledPaddedCols(cols);
}
__host__ __device__ constexpr int64_t swizzledScaleOffset(int64_t m, int64_t k, int64_t cols) {
  return (m / 128) * (swizzledPaddedCols(cols) / 4) * 512 + (k / 4) * 512 + (m % 32) * 16 +
         ((m % 128) / 32) * 4 + (k % 4);
}
// The same offset in two parts, for a kernel that writes many columns of one row:
// swizzledScaleOffset(m, k, cols) == swizzledScaleRowPart(m, cols) + swizzledScaleColPart(k)
// for m, k >= 0 (a CPU test checks it).
__host__ __device__ constexpr int64_t swizzledScaleRowPart(int64_t m, int64_t cols) {
  return (m / 128) * (swizzledPaddedCols(cols) / 4) * 512 + (m % 32) * 16 + ((m % 128) / 32) * 4;
}
__host__ __device__ constexpr uint32_t swizzledScaleColPart(uint32_t k) {
  return ((k >> 2) << 9) | (k & 3u);
}

// ---- FP4 e2m1 encoding (the kernel's; host-callable so CPU tests check it) ----------------
// Round to nearest even onto {0, 0.5, 1, 1.5, 2, 3, 4, 6}, |v| above 6 saturates to 6, the sign
// bit is kept (also on zero), NaN -> +6 (code 0x7): the semantics of cvt.rn.satfinite.e2m1x2.f32
// and of cuda_fp4.h, ties going to the even code (0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2,
// 2.5 -> 2, 3.5 -> 4, 5 -> 4). Integer and fp32 arithmetic only, the same instructions on every
// architecture, so every GPU gives the same bits:
//   |v| < 1: the code is rint(2 |v|) (0, 1 or 2), from one fmaf: 2 |v| + 2^23 rounds once, to an
//            integer, RNE; the integer is the sum's low mantissa bits;
//   |v| >= 1: e2m1's normal codes are fp32's exponent and top mantissa bit, so the code is the
//            bits rounded RNE to one mantissa bit (add 2^21 - 1 plus the kept bit) >> 22, less
//            the exponent bias difference (252), saturated at 7; NaN and infinities land above
//            the cap.
__host__ __device__ inline uint32_t floatBits(float v) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(v);
#else
  uint32_t u;
  memcpy(&u, &v, sizeof(u));
  return u;
#endif
}

// e2m1Code of a value known not to be NaN (the kernels test a whole vector at once).
__host__ __device__ inline uint32_t e2m1CodeNotNaN(float v) {
  const float a = fabsf(v);
  const uint32_t b = floatBits(a);
  const uint32_t small = floatBits(fmaf(a, 2.0f, 8388608.0f)) - 0x4B000000u;
  const uint32_t top = (b + 0x1FFFFFu + ((b >> 22) & 1u)) >> 22;
  const uint32_t c = a < 1.0f ? small : (top < 259u ? top : 259u) - 252u;
  return c | ((floatBits(v) >> 28) & 0x8u);  // the sign bit, as copysign would keep it
}

// fma with the result clamped to [0, 1] (fma.rn.sat.f32, one instruction on the GPU). The
// encoders below use it on non-NaN values only.
__host__ __device__ inline float fmaSat(float a, float b, float c) {
#ifdef __CUDA_ARCH__
  float r;
  asm("fma.rn.sat.f32 %0, %1, %2, %3;" : "=f"(r) : "f"(a), "f"(b), "f"(c));
  return r;
#else
  const float r = fmaf(a, b, c);
  return r < 0.0f ? 0.0f : (r > 1.0f ? 1.0f : r);
#endif
}

// 2^23 + e2m1CodeNotNaN(v) & 7 (the magnitude's code, 0..7, in the low mantissa bits), from fp32
// arithmetic only (the GPU's integer and logic pipe is the busier one in the quantizing
// epilogue; these go to its fma pipe): rint(2 |v|) (one fmaf with 2^23, RNE) capped at 4, plus
// one for each of |v| > 2.5, |v| >= 3.5 and |v| > 5, each an fmaSat of (|v| - t) times the
// inverse of the spacing of floats next to t (plus 1 for >=), which is exactly 0 or 1. Every
// sum is exact. v must not be NaN.
__host__ __device__ inline float e2m1CodeBiased(float v) {
  const float a = fabsf(v);
  const float low = fminf(fmaf(a, 2.0f, 8388608.0f), 8388612.0f);
  const float above2p5 = fmaSat(a, 4194304.0f, -10485760.0f);  // 2^22 (a - 2.5)
  const float from3p5 = fmaSat(a, 4194304.0f, -14680063.0f);   // 2^22 (a - 3.5) + 1
  const float above5 = fmaSat(a, 2097152.0f, -10485760.0f);    // 2^21 (a - 5)
  return (low + above2p5) + (from3p5 + above5);
}

// The magnitude's code as a float (0..7).
__host__ __device__ inline float e2m1MagnitudeF(float v) { return e2m1CodeBiased(v) - 8388608.0f; }

// Bit 3 of nibble i: the sign bit of v[i]. On the GPU six byte permutes with sign replication
// and no per-element shifts.
__host__ __device__ inline uint32_t signNibbles(const float (&v)[8]) {
#ifdef __CUDA_ARCH__
  auto prmt = [](uint32_t x, uint32_t y, uint32_t sel) {
    uint32_t r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(x), "r"(y), "r"(sel));
    return r;
  };
  // 0x00FB: byte 0 = x's sign bit replicated (byte 3), byte 1 = y's (byte 7).
  const uint32_t e01 = prmt(__float_as_uint(v[0]), __float_as_uint(v[2]), 0x00FBu);
  const uint32_t e23 = prmt(__float_as_uint(v[4]), __float_as_uint(v[6]), 0x00FBu);
  const uint32_t o01 = prmt(__float_as_uint(v[1]), __float_as_uint(v[3]), 0x00FBu);
  const uint32_t o23 = prmt(__float_as_uint(v[5]), __float_as_uint(v[7]), 0x00FBu);
  const uint32_t even = prmt(e01, e23, 0x5410u);  // byte j: sign of v[2j], replicated
  const uint32_t odd = prmt(o01, o23, 0x5410u);   // byte j: sign of v[2j + 1]
  return (even & 0x08080808u) | (odd & 0x80808080u);
#else
  uint32_t s = 0;
  for (int i = 0; i < 8; ++i) s |= (floatBits(v[i]) >> 31) << (4 * i + 3);
  return s;
#endif
}

// ANYR_E2M1_CVT: 1 where this compilation has the GPU's conversion of two fp32 values to e2m1
// (cvt.rn.satfinite.e2m1x2.f32). PTX offers it to the family- and architecture-specific targets
// of compute capability 10.0 to 12.x (the build's sm_100f and sm_120f machine code, CMakeLists.txt;
// the same condition cuda_fp4.h's conversions test); every other compilation, the host's
// included, encodes in fp32 arithmetic (e2m1CodeBiased).
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FAMILY_SPECIFIC__) && \
    __CUDA_ARCH_FAMILY_SPECIFIC__ >= 1000 && __CUDA_ARCH_FAMILY_SPECIFIC__ < 1300
#define ANYR_E2M1_CVT 1
#else
#define ANYR_E2M1_CVT 0
#endif

// e2m1CodeNotNaN of 8 values packed, element i in bits 4i..4i+3 (quantOut's nibble order). No
// value may be NaN. With ANYR_E2M1_CVT, four conversions of pairs (the instruction puts its first
// operand in the high nibble) and one byte pack; for values that are not NaN its rounding (RNE,
// saturated to +-6, the sign kept) is e2m1CodeNotNaN's, so every GPU gives the same bits (a GPU
// test compares the two over every float bit pattern where the instruction exists). Otherwise
// the bits of the biased codes combined in 32-bit integers, sum over i of (0x4B000000 + code_i) *
// 16^i, less the biases' part that stays in 32 bits (0x4B000000 + 0xB0000000; from i = 2 on it
// is shifted out); the sum is taken as a tree of depth three (integer addition modulo 2^32 is
// associative, so the bits are those of Horner's rule; an eight-deep chain of multiply-adds sat
// on the one-token epilogue's critical path).
__host__ __device__ inline uint32_t e2m1Pack8(const float (&q)[8]) {
#if ANYR_E2M1_CVT
  uint32_t packed;
  asm("{\n"
      ".reg .b8 c0, c1, c2, c3;\n"
      "cvt.rn.satfinite.e2m1x2.f32 c0, %2, %1;\n"
      "cvt.rn.satfinite.e2m1x2.f32 c1, %4, %3;\n"
      "cvt.rn.satfinite.e2m1x2.f32 c2, %6, %5;\n"
      "cvt.rn.satfinite.e2m1x2.f32 c3, %8, %7;\n"
      "mov.b32 %0, {c0, c1, c2, c3};\n"
      "}"
      : "=r"(packed)
      : "f"(q[0]), "f"(q[1]), "f"(q[2]), "f"(q[3]), "f"(q[4]), "f"(q[5]), "f"(q[6]), "f"(q[7]));
  return packed;
#else
  uint32_t b[8];
  for (int i = 0; i < 8; ++i) b[i] = floatBits(e2m1CodeBiased(q[i]));
  const uint32_t lo = (b[0] + (b[1] << 4)) + ((b[2] + (b[3] << 4)) << 8);
  const uint32_t hi = (b[4] + (b[5] << 4)) + ((b[6] + (b[7] << 4)) << 8);
  const uint32_t packed = lo + (hi << 16);
  return (packed - 0xFB000000u) | signNibbles(q);
#endif
}

__host__ __device__ inline uint32_t e2m1Code(float v) {
  if (v != v) return 0x7u;  // NaN: +6, no sign
  return e2m1CodeNotNaN(v);
}

// ---- host: argument rules -----------------------------------------------------------------
// Checks every argument rule of anyrAllReduceAddRmsNorm / anyrAddRmsNorm and throws
// anyr::Error(anyrInvalidArgument, "argument 'NAME': RULE") for the first one broken.
// `input` is the row source, named `inputName` in messages ("partial" or "x"); it may equal
// normOut but not partly overlap it. `weight` and the quantization scale overlap no output
// (residualOut, normOut, the quantized ones), partly or wholly: they are read for every row
// while rows are written. options may be NULL (ANYR_FUSED_OPTIONS_INITIALIZER).
// With tokens == 0 nothing is read or written, so only the rules on values (datatype, hidden,
// epsilon, options) apply, not those on buffers.
void validateFused(const void* input, const char* inputName, const void* residualIn,
                   const void* residualOut, const void* weight, float epsilon, const void* normOut,
                   size_t tokens, size_t hidden, anyrDataType_t datatype,
                   const anyrFusedOptions_t* options);

// validateFused, then the kernel parameters.
FusedParams makeFusedParams(const void* input, const char* inputName, const void* residualIn,
                            void* residualOut, const void* weight, float epsilon, void* normOut,
                            size_t tokens, size_t hidden, anyrDataType_t datatype,
                            const anyrFusedOptions_t* options);

// Every buffer of a fused call with the argument name errors give it: the input (`partial` or
// `x`) and each pointer of `p` (NULL where the call does not use it). The callers check that
// each lives on the device the call runs on.
struct FusedBuffer {
  const void* ptr;
  const char* name;
};
std::array<FusedBuffer, 9> fusedBuffers(const void* input, const char* inputName,
                                        const FusedParams& p);

// Whether every row buffer of a fused call allows whole-vector access: the input, residuals,
// weight and normOut 16-byte aligned, quantOut 8-byte (FP8) or 4-byte (NVFP4) aligned (block
// scales are written byte by byte). NULL buffers count as aligned.
bool fusedBuffersAligned(const void* input, const FusedParams& p);

// ---- host: the standalone kernel ----------------------------------------------------------
// Add + RMSNorm (+ quantization) of an already all-reduced tensor x (dtype T, [tokens][hidden],
// may equal p.normOut, residualOut or both). `p` must come from makeFusedParams. Asynchronous
// on `stream`; returns the launch's error. tokens == 0: no launch. Padding rows
// (tokens..padded) of blockScalesSwizzled are not written. Every form below gives the same bits
// (the epilogue's summation order does not depend on the launch shape; the GPU tests compare
// them), so a form is a choice of speed only.
//
// The forms (fused/add_rmsnorm.cu; docs/FUSED.md, "The standalone kernel"):
//  Staged     one block of `threads` threads per row, the row staged in shared memory as fp32
//             (fusedSharedBytes(hidden) bytes); only where a caller gives a block size (tests).
//  Regs       the first register kernel: one block of fusedThreads(hidden) threads per row, the
//             general code (quantization mode and alignment read at run time). Kept to be
//             measured against the forms that replace it.
//  Rows       blocks of B threads (addRmsNormRowThreads), each holding up to `maxVpt`
//             vectors of a row in registers (addRmsNormRowsVpt where open); kernels compiled per
//             quantization mode for aligned buffers; as many blocks as the GPU holds at once or
//             one per row (AddRmsNormGrid), each taking rows blockIdx.x, blockIdx.x + grid, ...
//  Cluster    one row per thread-block cluster of C blocks, one vector a thread, the sum of
//             squares exchanged through distributed shared memory (fusedRowEpilogueCluster):
//             a row of few tokens runs on C SMs instead of one. Rows up to hidden 8192 (others
//             run Rows) where clusters can be launched (others run Rows).
//  Auto       Cluster where a row exceeds one Rows block at one vector a thread and every
//             row gets a cluster of at least two blocks of one warp's vectors within one block
//             per SM (addRmsNormAutoForm), else Rows.
enum class AddRmsNormForm : int { Auto = 0, Staged, Regs, Rows, Cluster };

// The Rows form's grid (AddRmsNormLaunch::grid).
enum class AddRmsNormGrid : int { Auto = 0, Resident, PerRow };

// With programmatic launch, when the kernel lets the next launch on the stream be scheduled
// (AddRmsNormLaunch::release). The next launch still waits for this kernel to complete before
// it touches memory; only where its blocks wait moves.
enum class AddRmsNormRelease : int {
  AtExit = 0,  // once every block of this grid exited
  Early,       // once every block passed its own wait (dev::waitForPrevious(releaseEarly))
  Auto,        // addRmsNormReleasesEarly
};

// Auto's rule: early where the grid holds at most one block an SM (the standalone kernel's
// grids up to 128 tokens), so the next launch's waiting blocks find SM slots beside this grid's
// blocks; a larger grid's successor fills whatever slots its blocks left, in places unevenly.
// Against the release at exit, in a chain of calls on one H100: 1.00-1.14x at 1-32 tokens
// (median 1.09-1.12), 0.98-1.06x at 128; 0.86-0.93x at some shapes of 512 and 2048 tokens
// (docs/PERFORMANCE.md, "Fused shapes").
inline bool addRmsNormReleasesEarly(AddRmsNormRelease release, int blocks, int sms) {
  return release == AddRmsNormRelease::Early ||
         (release == AddRmsNormRelease::Auto && blocks <= sms);
}

// Whether the Rows form's loads carry cache eviction hints (AddRmsNormLaunch::hints): Auto
// (addRmsNormHintsAt), Off, On; ANYR_EPILOGUE_HINTS's mode (base/config.h).
using AddRmsNormHints = HintsMode;

// Auto's rule for the hints, from the bytes a launch reads and writes (addRmsNormBytes) and the
// GPU's L2 cache size: on where those bytes are 5/6 to 3/2 of the L2. Measured in a chain of
// calls on the same buffers on one H100, hinted against plain (median time ratio, range):
// below 5/6 of the L2 the data stays in it from one call to the next either way and the hints
// gain nothing (0.997, 0.95-1.04; 1.02-1.03 at 0.72-0.80); from 5/6 to 1.3 the plain calls fall
// off that cliff and the hinted ones do not as far (0.92, 0.86-0.98; the likely reason: reads
// marked evict-first leave the written lines resident, where the next kernel's loads or the next
// call's stores find them); from 1.3 to 1.5 even (0.997); beyond, where the written lines alone
// no longer fit, the hints' extra instructions cost (1.012, 0.99-1.03). Not measured on other
// GPUs. docs/FUSED.md, "The standalone kernel".
inline bool addRmsNormHintsAt(int64_t bytes, int64_t l2Bytes) {
  return l2Bytes > 0 && 6 * bytes >= 5 * l2Bytes && 2 * bytes <= 3 * l2Bytes;
}

// The bytes one launch of the standalone kernel on `x` moves: each distinct buffer of tokens x
// hidden elements of `elemBytes` (x, residualIn, residualOut, normOut; a buffer given twice, as
// the residual in place, counted once), the quantized output and its block scales.
inline int64_t addRmsNormBytes(const void* x, const FusedParams& p, int elemBytes) {
  const int64_t elems = static_cast<int64_t>(p.tokens) * p.hidden;
  const void* rows[] = {x, p.residualIn, p.residualOut, p.normOut};
  int64_t bytes = 0;
  for (int i = 0; i < 4; ++i) {
    bool seen = rows[i] == nullptr;
    for (int j = 0; j < i && !seen; ++j) seen = rows[j] == rows[i];
    if (!seen) bytes += elems * elemBytes;
  }
  if (p.quantOut != nullptr) bytes += p.quant == anyrQuantNvfp4 ? elems / 2 : elems;
  const int64_t scales = elems / kNvfp4BlockElems;
  if (p.blockScales != nullptr) bytes += scales;
  if (p.blockScalesSwizzled != nullptr) bytes += scales;
  return bytes;
}

// How to launch the standalone kernel.
struct AddRmsNormLaunch {
  AddRmsNormForm form = AddRmsNormForm::Auto;
  int threads = 0;  // Staged: threads per block, a multiple of 32 in 32..1024
  int maxVpt = 0;   // Rows: vectors a thread holds at most (1..4; 0: addRmsNormRowsVpt)
  // Rows: as many blocks as the GPU holds at once, each looping over rows (Resident), or one
  // block per row (PerRow, up to kAddRmsNormMaxGrid blocks, each then looping): a block that
  // finishes makes room for the next row's loads while the others reduce, at the cost of a
  // weight read per block (from L2). Auto: addRmsNormRowsPerRow.
  AddRmsNormGrid grid = AddRmsNormGrid::Auto;
  int clusterBlocks = 0;  // Cluster: 2, 4 or 8; 0: addRmsNormClusterBlocks, at least 2
  bool clusters = true;   // Auto may choose Cluster (the caller knows clusters launch here)
  bool pdl = false;       // programmatic dependent launch (device/launch.cuh)
  AddRmsNormRelease release = AddRmsNormRelease::AtExit;  // with pdl
  // Cluster: false lets a block leave after its last row without the final cluster barrier
  // (every store into its shared memory has landed by then: its mbarrier counted them); a
  // variant to measure (anyr_epilogue_bench's -e0).
  bool clusterExitBarrier = true;
  // Rows, aligned buffers: x and the residual loaded evict-first (L1 and L2: each byte is read
  // once) and the weight evict-last (every row reads it), as torch.compile's Triton kernel marks
  // them; the same values. Compiled for the unquantized output: plain loads for quantized
  // outputs, unaligned buffers and GPUs before compute capability 8.0. Auto:
  // addRmsNormHintsAt (anyr_epilogue_bench's -h0 / -h1 force Off / On).
  AddRmsNormHints hints = AddRmsNormHints::Auto;
};

// The shape a launch took (launchAddRmsNormWith): form, blocks, threads, vectors a thread holds
// (Rows forms; 1 for Cluster) and cluster size (1 without clusters).
struct AddRmsNormShape {
  AddRmsNormForm form = AddRmsNormForm::Auto;
  int blocks = 0;
  int threads = 0;
  int vpt = 0;
  int clusterBlocks = 1;
  size_t smem = 0;          // dynamic shared memory per block
  bool cacheHints = false;  // Rows: its loads carry the cache eviction hints
};

// The Rows form's largest block.
constexpr int kAddRmsNormRowThreads = 512;

// The Rows forms' block size for a row of `hidden`: the smallest power of two from 32 to
// kAddRmsNormRowThreads at which a thread holds at most `maxVpt` vectors, else the largest (up
// to four vectors at hidden 16384). A power of two that divides kFusedSlots:
// fusedRowEpilogueRegs's rule.
inline int addRmsNormRowThreads(int hidden, int maxVpt) {
  int t = 32;
  while (t < kAddRmsNormRowThreads && rowVecsPerThread(hidden, t) > maxVpt) t *= 2;
  return t;
}

// The vectors a thread of the Rows form holds at most where the launch leaves it open, for
// `tokens` rows of `hidden` on `sms` SMs, `quantized` for an FP8 or NVFP4 output: where every
// row has an SM of its own, one (each row spread over the most threads: the row's latency is
// the kernel's); up to four rows an SM, two; beyond, three (fewer, larger blocks, the weight read
// by fewer of them). Above two rows an SM, two blocks of 512 threads an SM no longer hold every
// row at once: the rows beyond run in a second round. Where three vectors still leave blocks of
// 256 threads or more (hidden 5120 and 6144: four blocks an SM, every row of up to four an SM at
// once), they take three:
//  - a quantized output up to four rows an SM: it issues about twice the instructions a vector
//    and gains from every row in flight (384 tokens 1.23-1.39x, 512 tokens 1.09-1.24x);
//  - the unquantized output up to 3.5 rows an SM, while the second round would be at most three
//    quarters full and so run on a GPU at least a quarter idle (300-450 tokens 1.04-1.19x);
//    nearer four rows an SM the two rounds measured as fast or faster at 6144 (512 and 528
//    tokens 0.96-0.98x; 5120 1.02-1.06x).
// At two rows an SM or fewer the two-vector blocks measured as fast or faster (FP8 0.98-0.99x,
// unquantized 0.87-0.96x with three). Measured on one H100 (docs/FUSED.md, "The standalone
// kernel"; docs/PERFORMANCE.md, "Fused shapes").
inline int addRmsNormRowsVpt(int tokens, int sms, int hidden, bool quantized) {
  const int64_t t = tokens, s = sms;
  if (t <= s) return 1;
  if (t > 4 * s) return 3;
  const bool threeFill = t > 2 * s && addRmsNormRowThreads(hidden, 3) >= 256;
  const bool inRange = quantized || 2 * t <= 7 * s;  // unquantized: t <= 3.5 s
  return threeFill && inRange ? 3 : 2;
}

// Whether the Rows form's Auto grid takes one block per row: where there are at least three
// rows for every block the GPU holds at once (`resident`). Below that the resident blocks win or
// tie; from about four rows a block, one block per row measured 4-8% faster (docs/FUSED.md).
inline bool addRmsNormRowsPerRow(int64_t tokens, int64_t resident) {
  return tokens >= 3 * resident;
}

// The Cluster form's size for `tokens` rows of `hidden` on `sms` SMs: the largest C of 8, 4, 2
// that gives every row its own cluster within one block per SM and every block at least 32
// vectors (one warp's); 1 where none does or the row exceeds kFusedSlots vectors.
inline int addRmsNormClusterBlocks(int hidden, int tokens, int sms) {
  const int nvec = rowVecs(hidden);
  if (nvec > kFusedSlots) return 1;
  for (int c = 8; c >= 2; c /= 2) {
    if (nvec >= 32 * c && static_cast<int64_t>(tokens) * c <= sms) return c;
  }
  return 1;
}

// The form Auto takes for `tokens` rows of `hidden` on `sms` SMs (`clusters`: whether clusters
// launch there): Cluster where the row does not fit one Rows block at one vector a thread and
// every row gets a cluster (addRmsNormClusterBlocks); else Rows. A row that fits one block at
// one vector a thread has the cluster's parallelism without its exchange.
inline AddRmsNormForm addRmsNormAutoForm(int hidden, int tokens, int sms, bool clusters) {
  if (clusters && rowVecs(hidden) > kAddRmsNormRowThreads &&
      addRmsNormClusterBlocks(hidden, tokens, sms) > 1) {
    return AddRmsNormForm::Cluster;
  }
  return AddRmsNormForm::Rows;
}

// Launches the standalone kernel in the form `l` asks for (Auto: addRmsNormAutoForm on the
// current device). A forced form the buffers or the GPU cannot run takes Rows instead (see the
// forms above); *shape (if not NULL) tells what ran. cudaErrorInvalidValue for a Staged block
// size or maxVpt outside its range.
cudaError_t launchAddRmsNormWith(anyrDataType_t datatype, const void* x, const FusedParams& p,
                                 cudaStream_t stream, const AddRmsNormLaunch& l,
                                 AddRmsNormShape* shape = nullptr);

// launchAddRmsNormWith: threads 0, Auto (clusters where the device launches them); threads > 0,
// the Staged form with that block size. pdl as in AddRmsNormLaunch.
cudaError_t launchAddRmsNorm(anyrDataType_t datatype, const void* x, const FusedParams& p,
                             cudaStream_t stream, int threads = 0, bool pdl = false);

// The form's name ("auto", "staged", "regs", "rows", "cluster"), or NULL.
const char* addRmsNormFormName(AddRmsNormForm form);

// Whether the machine code the current device runs encodes NVFP4 with the GPU's e2m1
// conversion instruction (ANYR_E2M1_CVT) rather than in fp32 arithmetic: sets *word to -1,
// then one single-thread kernel writes 1 (the instruction) or 0 (fp32 arithmetic) into it, on
// `stream`; the caller reads it back. Every kernel of the library is built for the same
// targets, so this one answers for all of them.
cudaError_t launchE2m1InstructionProbe(int* word, cudaStream_t stream);

}  // namespace anyr
