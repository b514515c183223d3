// Host reference for the fused residual add + RMSNorm (+ FP8 / NVFP4) epilogue
// (docs/FUSED.md, src/fused/epilogue.cuh). Written independently of the kernel: fp64 math with
// the contract's roundings to the dtype, table-based e4m3 / e2m1 encoders, and the 128x4 scale
// layout derived from its reshape/permute definition rather than from the offset formula.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <vector>

#include "anyreduce/anyreduce.h"

namespace anyr {
namespace ref {

// ---- bf16 / fp16 --------------------------------------------------------------------------
// Round to nearest even into the dtype (overflow to +-inf); the result is exact in double.
double roundToDtype(double v, anyrDataType_t t);
uint16_t dtypeBits(double v, anyrDataType_t t);  // bits of roundToDtype(v)
double dtypeValue(uint16_t bits, anyrDataType_t t);
// Spacing of the dtype's values at |v| (the subnormal spacing below the smallest normal).
double dtypeUlp(double v, anyrDataType_t t);
// Round to nearest even into `precision` significant bits with exponents clamped at
// minExponent (gradual underflow) and no overflow: an intermediate format of the tests' own.
double roundToPrecision(double v, int precision, int minExponent);

// ---- FP8 e4m3 (e4m3fn: no infinity, 0x7F / 0xFF NaN, max 448) ------------------------------
// Round to nearest even, |v| > 448 saturates to +-448 (0x7E / 0xFE), NaN -> 0x7F, the sign bit
// is kept on zero.
uint8_t e4m3Encode(double v);
double e4m3Decode(uint8_t code);  // NaN for 0x7F / 0xFF
// Spacing of e4m3 values at |v| (2^-9 below 2^-6).
double e4m3Ulp(double v);

// ---- FP4 e2m1 -----------------------------------------------------------------------------
// Nearest of {0, 0.5, 1, 1.5, 2, 3, 4, 6}, ties to the even code, |v| > 6 -> 6, sign bit kept
// (also on zero), NaN -> +6 (code 0x7). Code: bit 3 sign, bits 2..0 magnitude index.
uint8_t e2m1Encode(double v);
double e2m1Decode(uint8_t code);  // low nibble

// ---- 128x4 block-scale layout -------------------------------------------------------------
// Offset of scale (m, k) in a buffer for `rows` x `cols` scales padded to 128 x 4 tiles, from
// the definition: view the padded [Mpad][Kpad] matrix as [Mpad/128][4][32][Kpad/4][4]
// (m = 128*mt + 32*i + o, k = 4*kt + j) and store it permuted to [Mpad/128][Kpad/4][32][4][4].
int64_t swizzleOffset(int64_t m, int64_t k, int64_t cols);
int64_t swizzleBytes(int64_t rows, int64_t cols);

// ---- quantization of given y values, in the kernel's fp32 operations ----------------------
// FP8: out[i] = e4m3(float(y[i]) / scale).
void quantizeFp8(const float* y, size_t n, float scale, uint8_t* out);
// NVFP4 of one row: packed[hidden/2] (element 2i in the low nibble), scales[hidden/16].
void quantizeNvfp4(const float* y, size_t hidden, float g, uint8_t* packed, uint8_t* scales);

// ---- the epilogue of one row in fp64 ------------------------------------------------------
struct RowSpec {
  anyrDataType_t dtype = anyrBfloat16;
  size_t hidden = 0;
  double epsilon = 1e-6;
  bool weightPlusOne = false;
};
struct RowResult {
  std::vector<double> r;       // residualOut: round_T(round_T(x) + residualIn)
  std::vector<double> yExact;  // r / sqrt(mean(r^2) + eps) * w, unrounded
  std::vector<double> y;       // normOut: round_T(yExact)
};
// x: the row before rounding to T; residualIn: T values or NULL; weight: T values.
void referenceRow(const RowSpec& spec, const double* x, const double* residualIn,
                  const double* weight, RowResult* out);

// fp64 quantization of y (reference values): FP8 codes, and NVFP4 codes + block scales with
// s = e4m3(amax / (6 g)), q = e2m1(y / (s g)) (all 0 when s g is not positive).
void quantizeFp8Exact(const double* y, size_t n, double scale, uint8_t* out);
void quantizeNvfp4Exact(const double* y, size_t hidden, double g, uint8_t* packed, uint8_t* scales);

}  // namespace ref
}  // namespace anyr
