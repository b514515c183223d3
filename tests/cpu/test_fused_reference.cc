// The fused epilogue's host side, without a GPU: the reference encoders against CUDA's own
// host conversions (cuda_fp8.h, cuda_fp4.h, cuda_bf16.h, cuda_fp16.h), the kernel's e2m1
// encoder, the 128x4 scale layout, every argument rule, and crafted rows through the reference.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp4.h>
#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "common/fused_reference.h"
#include "fused/fused.h"
#include "fused/fused_algo.h"

namespace anyr {
namespace {

float floatFromBits(uint32_t u) {
  float f = 0.0f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t bitsOf(float f) {
  uint32_t u = 0;
  std::memcpy(&u, &f, 4);
  return u;
}

uint8_t cudaE4m3(float v) { return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3); }
uint8_t cudaE2m1(float v) { return __nv_cvt_float_to_fp4(v, __NV_E2M1, cudaRoundNearest); }

// Values around every point of `grid` and every midpoint between neighbours: the point, and
// one float ulp either side, with both signs.
std::vector<float> probesAround(const std::vector<double>& grid) {
  std::vector<double> points = grid;
  for (size_t i = 0; i + 1 < grid.size(); ++i) points.push_back((grid[i] + grid[i + 1]) / 2);
  std::vector<float> out;
  for (double p : points) {
    const float f = static_cast<float>(p);
    for (float v : {f, std::nextafter(f, 0.0f), std::nextafter(f, 1e30f)}) {
      out.push_back(v);
      out.push_back(-v);
    }
  }
  return out;
}

// Every bf16 bit pattern as a float (all exponents, both signs, NaN and infinity included).
std::vector<float> allBf16() {
  std::vector<float> out;
  for (uint32_t b = 0; b < 65536; ++b) out.push_back(floatFromBits(b << 16));
  return out;
}

// ---- e2m1 ---------------------------------------------------------------------------------
TEST(FusedReference, E2m1GridTiesSignAndSaturation) {
  const double grid[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (int c = 0; c < 8; ++c) {
    EXPECT_EQ(ref::e2m1Encode(grid[c]), c);
    EXPECT_EQ(ref::e2m1Encode(-grid[c]), c | 8);
    EXPECT_EQ(ref::e2m1Decode(static_cast<uint8_t>(c)), grid[c]);
    EXPECT_EQ(ref::e2m1Decode(static_cast<uint8_t>(c | 8)), -grid[c]);
  }
  // Ties go to the even code.
  const struct {
    double v;
    uint8_t code;
  } ties[] = {{0.25, 0}, {0.75, 2}, {1.25, 2}, {1.75, 4}, {2.5, 4}, {3.5, 6}, {5.0, 6}};
  for (const auto& t : ties) {
    EXPECT_EQ(ref::e2m1Encode(t.v), t.code) << t.v;
    EXPECT_EQ(ref::e2m1Encode(-t.v), t.code | 8) << -t.v;
    EXPECT_EQ(e2m1Code(static_cast<float>(t.v)), t.code) << t.v;
    EXPECT_EQ(e2m1Code(static_cast<float>(-t.v)), t.code | 8u) << -t.v;
  }
  // Saturation at 6, infinities, NaN, signed zeros.
  for (double v : {6.0, 6.5, 7.0, 1e30, std::numeric_limits<double>::infinity()}) {
    EXPECT_EQ(ref::e2m1Encode(v), 7) << v;
    EXPECT_EQ(ref::e2m1Encode(-v), 15) << -v;
    EXPECT_EQ(e2m1Code(static_cast<float>(v)), 7u) << v;
    EXPECT_EQ(e2m1Code(static_cast<float>(-v)), 15u) << -v;
  }
  EXPECT_EQ(ref::e2m1Encode(std::nan("")), 7);
  EXPECT_EQ(e2m1Code(std::nanf("")), 7u);
  EXPECT_EQ(ref::e2m1Encode(0.0), 0);
  EXPECT_EQ(ref::e2m1Encode(-0.0), 8);
  EXPECT_EQ(ref::e2m1Encode(-0.1), 8);  // rounds to zero, keeps the sign
  EXPECT_EQ(e2m1Code(-0.0f), 8u);
  EXPECT_EQ(e2m1Code(-0.1f), 8u);
}

// Beyond the grid: every bf16 value, 200,000 uniform in [-range, range] (generator seeded with
// `seed`), and bit patterns across the whole fp32 range (every exponent, subnormals, infinities,
// NaNs).
void addEncoderProbes(std::vector<float>* probes, unsigned seed, float range) {
  for (float v : allBf16()) probes->push_back(v);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-range, range);
  for (int i = 0; i < 200000; ++i) probes->push_back(dist(rng));
  for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += 4099) {
    const uint32_t bits = static_cast<uint32_t>(u);
    float v;
    std::memcpy(&v, &bits, sizeof(v));
    probes->push_back(v);
  }
}

// The reference and the kernel's encoder agree with CUDA's host conversion everywhere that
// matters: around every grid point and midpoint, over every bf16 value, at random, and across
// fp32's bit patterns.
TEST(FusedReference, E2m1MatchesCudaFp4) {
  std::vector<float> probes = probesAround({0, 0.5, 1, 1.5, 2, 3, 4, 6, 8});
  addEncoderProbes(&probes, 7, 8.0f);
  for (float v : probes) {
    const uint8_t want = cudaE2m1(v);
    ASSERT_EQ(ref::e2m1Encode(v), want) << "v=" << v << " bits=" << std::hex << bitsOf(v);
    ASSERT_EQ(e2m1Code(v), want) << "v=" << v << " bits=" << std::hex << bitsOf(v);
    // The kernels' encoder for vectors without NaN: the same code for every value but NaN.
    if (v == v) {
      ASSERT_EQ(e2m1CodeNotNaN(v), want) << "v=" << v << " bits=" << std::hex << bitsOf(v);
      // The floating-point form (host emulation of fma.rn.sat; the GPU test runs the device's).
      ASSERT_EQ(e2m1MagnitudeF(v), static_cast<float>(want & 7u))
          << "v=" << v << " bits=" << std::hex << bitsOf(v);
    }
  }
  // e2m1Pack8 over the same probes, eight at a time, signs included (-0.0 too).
  std::vector<float> finite;
  for (float v : probes) finite.push_back(v == v ? v : -0.0f);
  for (size_t i = 0; i + 8 <= finite.size(); i += 3) {
    float q[8];
    uint32_t want = 0;
    for (int k = 0; k < 8; ++k) {
      q[k] = finite[i + k];
      want |= static_cast<uint32_t>(cudaE2m1(q[k])) << (4 * k);
    }
    ASSERT_EQ(e2m1Pack8(q), want) << "at probe " << i;
  }
  // ... and for the positive NaNs GPU arithmetic produces (0 * inf), the same code too.
  for (uint32_t bits : {0x7FFFFFFFu, 0x7FC00000u}) {
    float v;
    std::memcpy(&v, &bits, sizeof(v));
    EXPECT_EQ(e2m1CodeNotNaN(v), 7u) << std::hex << bits;
    EXPECT_EQ(e2m1Code(v), 7u) << std::hex << bits;
  }
}

// ---- e4m3 ---------------------------------------------------------------------------------
TEST(FusedReference, E4m3ScaleConversion) {
  EXPECT_EQ(ref::e4m3Encode(1.0), 0x38);
  EXPECT_EQ(ref::e4m3Encode(448.0), 0x7e);
  EXPECT_EQ(ref::e4m3Encode(464.0), 0x7e);  // tie between 448 and (absent) 480: saturates
  EXPECT_EQ(ref::e4m3Encode(1e9), 0x7e);
  EXPECT_EQ(ref::e4m3Encode(std::numeric_limits<double>::infinity()), 0x7e);
  EXPECT_EQ(ref::e4m3Encode(-448.0), 0xfe);
  EXPECT_EQ(ref::e4m3Encode(-1e9), 0xfe);
  EXPECT_EQ(ref::e4m3Encode(std::nan("")), 0x7f);
  EXPECT_EQ(ref::e4m3Encode(0.0), 0x00);
  EXPECT_EQ(ref::e4m3Encode(-0.0), 0x80);
  EXPECT_EQ(ref::e4m3Encode(std::ldexp(1.0, -9)), 0x01);    // smallest subnormal
  EXPECT_EQ(ref::e4m3Encode(std::ldexp(1.0, -10)), 0x00);   // tie with 0: even
  EXPECT_EQ(ref::e4m3Encode(std::ldexp(1.5, -10)), 0x01);   // above the tie
  EXPECT_EQ(ref::e4m3Encode(std::ldexp(1.0, -6)), 0x08);    // smallest normal
  EXPECT_EQ(ref::e4m3Encode(std::ldexp(15.0, -10)), 0x08);  // 7.5 * 2^-9: tie -> 0x08
  EXPECT_EQ(ref::e4m3Encode(1.0 + 1.0 / 16), 0x38);         // tie 1 / 1.125 -> even
  EXPECT_EQ(ref::e4m3Encode(1.125 + 1.0 / 16), 0x3a);       // tie 1.125 / 1.25 -> 1.25
  EXPECT_EQ(ref::e4m3Decode(0x7e), 448.0);
  EXPECT_EQ(ref::e4m3Decode(0xfe), -448.0);
  EXPECT_EQ(ref::e4m3Decode(0x01), std::ldexp(1.0, -9));
  EXPECT_TRUE(std::isnan(ref::e4m3Decode(0x7f)));
  EXPECT_TRUE(std::isnan(ref::e4m3Decode(0xff)));
  // Block-scale arithmetic as the kernel does it: s = e4m3(amax / (6 g)).
  const float g = 1.0f / 64;
  EXPECT_EQ(ref::e4m3Encode(static_cast<double>(6.0f / (6.0f * g))), 0x68);   // 64
  EXPECT_EQ(ref::e4m3Encode(static_cast<double>(1e6f / (6.0f * g))), 0x7e);   // saturates
  EXPECT_EQ(ref::e4m3Encode(static_cast<double>(1e-7f / (6.0f * g))), 0x00);  // underflows
}

TEST(FusedReference, E4m3MatchesCudaFp8) {
  std::vector<double> grid;
  for (int c = 0; c < 127; ++c) grid.push_back(ref::e4m3Decode(static_cast<uint8_t>(c)));
  grid.push_back(480.0);
  std::vector<float> probes = probesAround(grid);
  addEncoderProbes(&probes, 11, 500.0f);
  for (float v : probes) {
    ASSERT_EQ(ref::e4m3Encode(v), cudaE4m3(v)) << "v=" << v << " bits=" << std::hex << bitsOf(v);
  }
  for (int c = 0; c < 256; ++c) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(c), __NV_E4M3);
    const double want = __half2float(__half(h));
    const double got = ref::e4m3Decode(static_cast<uint8_t>(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << c;
    } else {
      EXPECT_EQ(got, want) << c;
    }
  }
}

// ---- bf16 / fp16 rounding -----------------------------------------------------------------
TEST(FusedReference, DtypeRoundingMatchesCuda) {
  std::vector<float> probes = allBf16();
  std::mt19937 rng(3);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 300000; ++i) probes.push_back(floatFromBits(bits(rng)));
  for (float v : {65504.0f, 65519.99f, 65520.0f, 1e-8f, 2.9802322e-08f, 5.9604645e-08f}) {
    probes.push_back(v);
    probes.push_back(-v);
  }
  for (float v : probes) {
    if (std::isnan(v)) continue;
    const __nv_bfloat16 b = __float2bfloat16_rn(v);
    const __half h = __float2half_rn(v);
    const double rb = ref::roundToDtype(v, anyrBfloat16);
    const double rh = ref::roundToDtype(v, anyrFloat16);
    ASSERT_EQ(rb, static_cast<double>(__bfloat162float(b))) << v;
    ASSERT_EQ(rh, static_cast<double>(__half2float(h))) << v;
    uint16_t bb = 0, hb = 0;
    std::memcpy(&bb, &b, 2);
    std::memcpy(&hb, &h, 2);
    ASSERT_EQ(ref::dtypeBits(v, anyrBfloat16), bb) << v;
    ASSERT_EQ(ref::dtypeBits(v, anyrFloat16), hb) << v;
    ASSERT_EQ(ref::dtypeValue(bb, anyrBfloat16), rb) << v;
    ASSERT_EQ(ref::dtypeValue(hb, anyrFloat16), rh) << v;
  }
  EXPECT_EQ(ref::dtypeUlp(1.0, anyrBfloat16), 1.0 / 128);
  EXPECT_EQ(ref::dtypeUlp(1.0, anyrFloat16), 1.0 / 1024);
  EXPECT_EQ(ref::dtypeUlp(0.0, anyrFloat16), std::ldexp(1.0, -24));
}

// The residual add (epilogue step 2) runs on packed pairs (addPair, device/common.cuh): one
// rounding of the exact sum to T. It gives the spec's bits, the fp32 sum rounded to T, because
// fp32 keeps 2p + 2 bits of T's p: checked here for every value a of T against the sums that
// sit near T's rounding boundaries (b = a's neighbours, its negation, and the T values within two
// of a x 2^-k for k = 1..24, both signs) and random b. The reference rounds the double sum, exact
// wherever the two could differ (fp16 always; bf16 while the exponents are within 45 of each
// other, beyond which b is far below half an ulp of a). The same probes with an intermediate of
// 2p - 2 bits in place of fp32's 24 (ref::roundToPrecision, fp32's exponent range) must find
// sums rounded differently: the probes reach the cases where double rounding can go wrong.
TEST(FusedReference, ResidualAddRoundsTheSumOnce) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<uint32_t> bits16(0, 0xFFFF);
  for (const anyrDataType_t t : {anyrBfloat16, anyrFloat16}) {
    uint64_t checked = 0, coarseDiffers = 0;
    const int coarse = 2 * (t == anyrFloat16 ? 11 : 8) - 2;
    for (uint32_t ab = 0; ab < 65536; ++ab) {
      const double a = ref::dtypeValue(static_cast<uint16_t>(ab), t);
      if (std::isnan(a)) continue;
      std::vector<uint16_t> bs = {static_cast<uint16_t>(ab), static_cast<uint16_t>(ab ^ 0x8000),
                                  static_cast<uint16_t>(ab + 1), static_cast<uint16_t>(ab - 1)};
      for (int k = 1; k <= 24; ++k) {
        const uint16_t near = ref::dtypeBits(std::ldexp(a, -k), t);
        for (int d = -2; d <= 2; ++d) {
          bs.push_back(static_cast<uint16_t>(near + d));
          bs.push_back(static_cast<uint16_t>((near + d) ^ 0x8000));
        }
      }
      for (int i = 0; i < 32; ++i) bs.push_back(static_cast<uint16_t>(bits16(rng)));
      for (const uint16_t bb : bs) {
        const double b = ref::dtypeValue(bb, t);
        if (std::isnan(b)) continue;
        const float viaFp32 = static_cast<float>(a) + static_cast<float>(b);
        const uint16_t once = ref::dtypeBits(a + b, t);
        ASSERT_EQ(ref::dtypeBits(viaFp32, t), once) << "dtype " << t << ": " << a << " + " << b;
        if (ref::dtypeBits(ref::roundToPrecision(a + b, coarse, -126), t) != once) {
          ++coarseDiffers;
        }
        ++checked;
      }
    }
    EXPECT_GT(checked, 65536u * 200u) << "dtype " << t;
    EXPECT_GT(coarseDiffers, 0u) << "dtype " << t;
  }
}

// ---- 128x4 layout -------------------------------------------------------------------------
TEST(FusedSwizzle, HandComputedOffsets) {
  // (m, k, cols) -> offset, worked out by hand from the tile description in docs/FUSED.md.
  const struct {
    int64_t m, k, cols, offset;
  } cases[] = {
      {0, 0, 8, 0},      {0, 1, 8, 1},      {0, 3, 8, 3},      {0, 4, 8, 512},  {1, 0, 8, 16},
      {31, 3, 8, 499},   {32, 0, 8, 4},     {33, 2, 8, 22},    {96, 0, 8, 12},  {127, 3, 8, 511},
      {127, 7, 8, 1023}, {128, 0, 8, 1024}, {130, 5, 8, 1569}, {5, 8, 9, 1104}, {128, 0, 9, 1536},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(swizzledScaleOffset(c.m, c.k, c.cols), c.offset) << c.m << "," << c.k;
    EXPECT_EQ(ref::swizzleOffset(c.m, c.k, c.cols), c.offset) << c.m << "," << c.k;
  }
  // hidden 7168: 448 scale columns, 112 column tiles of 512 bytes per 128-row tile.
  // m = 300: row tile 2, o = 300 % 32 = 12, i = (300 % 128) / 32 = 1; k = 447: kt 111, j 3.
  const int64_t want = 2 * 112 * 512 + 111 * 512 + 12 * 16 + 1 * 4 + 3;
  EXPECT_EQ(swizzledScaleOffset(300, 447, 448), want);
  EXPECT_EQ(ref::swizzleOffset(300, 447, 448), want);
  // Rows pad to a multiple of 128, scale columns to a multiple of 4.
  for (const auto& [rows, padded] : {std::pair{1, 128}, {128, 128}, {129, 256}}) {
    EXPECT_EQ(swizzledPaddedRows(rows), padded) << rows << " rows";
  }
  for (const auto& [cols, padded] : {std::pair{8, 8}, {9, 12}}) {
    EXPECT_EQ(swizzledPaddedCols(cols), padded) << cols << " columns";
  }
  EXPECT_EQ(nvfp4ScaleCols(7168), 448);
  EXPECT_EQ(swizzledScaleBytes(3, 9), 128 * 12);
}

TEST(FusedSwizzle, BijectionOntoPaddedBuffer) {
  for (int64_t rows : {1, 5, 127, 128, 129, 300}) {
    for (int64_t cols : {1, 3, 4, 8, 9, 384, 448, 1024}) {
      const int64_t bytes = swizzledScaleBytes(rows, cols);
      ASSERT_EQ(bytes, ref::swizzleBytes(rows, cols));
      std::vector<char> seen(static_cast<size_t>(bytes), 0);
      for (int64_t m = 0; m < swizzledPaddedRows(rows); ++m) {
        for (int64_t k = 0; k < swizzledPaddedCols(cols); ++k) {
          const int64_t off = swizzledScaleOffset(m, k, cols);
          ASSERT_GE(off, 0);
          ASSERT_LT(off, bytes) << rows << "x" << cols << " (" << m << "," << k << ")";
          ASSERT_EQ(off, ref::swizzleOffset(m, k, cols)) << m << "," << k;
          // The kernels' split form (a row's part once, then a column's).
          ASSERT_EQ(off, swizzledScaleRowPart(m, cols) +
                             static_cast<int64_t>(swizzledScaleColPart(static_cast<uint32_t>(k))))
              << m << "," << k;
          ASSERT_EQ(seen[off], 0) << "offset " << off << " hit twice";
          seen[off] = 1;
        }
      }
      for (int64_t i = 0; i < bytes; ++i) ASSERT_EQ(seen[i], 1) << "offset " << i << " missed";
    }
  }
}

// ---- argument rules -----------------------------------------------------------------------
struct Args {
  const void* input = reinterpret_cast<const void*>(0x100000);
  const void* residualIn = reinterpret_cast<const void*>(0x200000);
  void* residualOut = reinterpret_cast<void*>(0x300000);
  const void* weight = reinterpret_cast<const void*>(0x400000);
  float epsilon = 1e-6f;
  void* normOut = reinterpret_cast<void*>(0x500000);
  size_t tokens = 4;
  size_t hidden = 256;
  anyrDataType_t datatype = anyrBfloat16;
  anyrFusedOptions_t options = ANYR_FUSED_OPTIONS_INITIALIZER;
  bool nullOptions = false;  // pass options = NULL

  void validate() const {
    validateFused(input, "x", residualIn, residualOut, weight, epsilon, normOut, tokens, hidden,
                  datatype, nullOptions ? nullptr : &options);
  }
};

Args nvfp4Args() {
  Args a;
  a.options.quant = anyrQuantNvfp4;
  a.options.scale = reinterpret_cast<const float*>(0x600000);
  a.options.quantOut = reinterpret_cast<void*>(0x700000);
  a.options.blockScales = reinterpret_cast<void*>(0x800000);
  return a;
}

void expectRejected(const Args& a, const std::string& arg, const std::string& rule) {
  try {
    a.validate();
    ADD_FAILURE() << "accepted; expected a rejection of '" << arg << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), anyrInvalidArgument);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("argument '" + arg + "': "), std::string::npos) << msg;
    EXPECT_NE(msg.find(rule), std::string::npos) << msg;
  }
}

// One broken rule: `change` made to the plain arguments (Args()) or the NVFP4 ones (nvfp4Args()),
// and what the rejection must name.
enum Base { kPlain, kNvfp4 };
struct BrokenRule {
  Base base;
  std::function<void(Args&)> change;
  const char* arg;
  const char* rule;
};

template <size_t N>
void expectEachRejected(const BrokenRule (&rules)[N]) {
  for (const BrokenRule& r : rules) {
    Args a = r.base == kNvfp4 ? nvfp4Args() : Args();
    r.change(a);
    expectRejected(a, r.arg, r.rule);
  }
}

TEST(FusedValidate, AcceptsValidArguments) {
  Args a;
  EXPECT_NO_THROW(a.validate());
  a.residualOut = const_cast<void*>(a.residualIn);  // in place
  EXPECT_NO_THROW(a.validate());
  a.normOut = const_cast<void*>(a.input);  // x aliasing normOut
  EXPECT_NO_THROW(a.validate());
  a.residualIn = nullptr;  // no residual, no residual output
  a.residualOut = nullptr;
  EXPECT_NO_THROW(a.validate());
  a.nullOptions = true;  // default options
  EXPECT_NO_THROW(a.validate());
  for (size_t h : {128, 136, 6144, 7168, 16384}) {
    a.hidden = h;
    EXPECT_NO_THROW(a.validate()) << h;
  }
  Args n = nvfp4Args();
  n.normOut = nullptr;  // quantized output only
  EXPECT_NO_THROW(n.validate());
  n.options.blockScales = nullptr;
  n.options.blockScalesSwizzled = reinterpret_cast<void*>(0x900000);
  EXPECT_NO_THROW(n.validate());
  n.options.quant = anyrQuantFp8;
  n.options.blockScalesSwizzled = nullptr;
  EXPECT_NO_THROW(n.validate());
  // tokens == 0: nothing is touched, so missing buffers are fine.
  Args z;
  z.tokens = 0;
  z.input = z.weight = z.residualIn = nullptr;
  z.normOut = z.residualOut = nullptr;
  z.options.quant = anyrQuantNvfp4;
  EXPECT_NO_THROW(z.validate());
}

TEST(FusedValidate, RejectsEachBrokenRule) {
  Args a;
  a.datatype = anyrFloat32;
  expectRejected(a, "datatype", "fused op supports bf16 and fp16");
  a = Args();
  a.datatype = static_cast<anyrDataType_t>(7);
  expectRejected(a, "datatype", "fused op supports bf16 and fp16");
  for (size_t h : {0, 8, 120, 130, 16392, 32768}) {
    a = Args();
    a.hidden = h;
    expectRejected(a, "hidden", "multiple of 8 in 128..16384");
  }
  a = nvfp4Args();
  a.hidden = 136;
  expectRejected(a, "hidden", "multiple of 16");
  a = Args();
  a.tokens = size_t{1} << 31;
  expectRejected(a, "tokens", "exceeds");
  for (float eps : {0.0f, -1e-6f, std::numeric_limits<float>::infinity(), std::nanf("")}) {
    a = Args();
    a.epsilon = eps;
    expectRejected(a, "epsilon", "positive and finite");
  }
  // The options, and the buffers that must be given: each case one change to the plain (or
  // the NVFP4) arguments.
  const BrokenRule optionAndNullRules[] = {
      {kPlain, [](Args& b) { b.options.magic = 0; }, "options", "ANYR_FUSED_OPTIONS_INITIALIZER"},
      {kPlain, [](Args& b) { b.options.size = sizeof(anyrFusedOptions_t) - 8; }, "options",
       "size field"},
      {kPlain, [](Args& b) { b.options.quant = -1; }, "options.quant", "unknown quantization"},
      {kPlain, [](Args& b) { b.options.quant = 3; }, "options.quant", "unknown quantization"},
      {kNvfp4,
       [](Args& b) {
         b.options.quant = anyrQuantFp8;
         b.options.scale = nullptr;
       },
       "options.scale", "FP8 needs"},
      {kNvfp4, [](Args& b) { b.options.scale = nullptr; }, "options.scale", "NVFP4 needs"},
      {kNvfp4,
       [](Args& b) {
         b.options.quant = anyrQuantFp8;
         b.options.quantOut = nullptr;
       },
       "options.quantOut", "must not be NULL"},
      {kNvfp4, [](Args& b) { b.options.quantOut = nullptr; }, "options.quantOut",
       "must not be NULL"},
      {kNvfp4, [](Args& b) { b.options.blockScales = nullptr; }, "options.blockScales",
       "blockScales or blockScalesSwizzled"},
      {kPlain, [](Args& b) { b.normOut = nullptr; }, "normOut",
       "unless a quantized output is requested"},
      {kPlain, [](Args& b) { b.residualOut = nullptr; }, "residualOut", "when residualIn is given"},
      {kPlain, [](Args& b) { b.input = nullptr; }, "x", "must not be NULL"},
      {kPlain, [](Args& b) { b.weight = nullptr; }, "weight", "must not be NULL"},
  };
  expectEachRejected(optionAndNullRules);
  // Partial overlaps (rows are 4 x 256 x 2 = 2048 bytes).
  a = Args();
  a.residualOut = reinterpret_cast<char*>(const_cast<void*>(a.residualIn)) + 512;
  expectRejected(a, "residualOut", "partly overlaps residualIn");
  a = Args();
  a.residualOut = reinterpret_cast<char*>(const_cast<void*>(a.residualIn)) - 2046;
  expectRejected(a, "residualOut", "partly overlaps residualIn");
  a = Args();
  a.normOut = reinterpret_cast<char*>(const_cast<void*>(a.input)) + 16;
  expectRejected(a, "normOut", "partly overlaps x");
  a = Args();
  a.normOut = a.residualOut;
  expectRejected(a, "normOut", "overlaps residualOut");
  a = Args();
  a.residualOut = reinterpret_cast<char*>(const_cast<void*>(a.input)) + 2;
  expectRejected(a, "residualOut", "partly overlaps x");
  a = Args();
  a.normOut = reinterpret_cast<char*>(const_cast<void*>(a.residualIn)) + 512;
  expectRejected(a, "normOut", "partly overlaps residualIn");
  // The same buffer is fine: residualOut over x, normOut over residualIn.
  a = Args();
  a.residualOut = const_cast<void*>(a.input);
  EXPECT_NO_THROW(a.validate());
  a = Args();
  a.normOut = const_cast<void*>(a.residualIn);
  EXPECT_NO_THROW(a.validate());
  // Quantized outputs overlap nothing (FP8 quantOut 1024 bytes; NVFP4 quantOut 512, linear
  // scales 64, swizzled 128 x 16 = 2048).
  a = nvfp4Args();
  a.options.quant = anyrQuantFp8;
  a.options.quantOut = reinterpret_cast<char*>(const_cast<void*>(a.input)) + 1000;
  expectRejected(a, "options.quantOut", "overlaps x");
  a = nvfp4Args();
  a.options.quantOut = reinterpret_cast<char*>(a.normOut) - 511;
  expectRejected(a, "options.quantOut", "overlaps normOut");
  a = nvfp4Args();
  a.options.quantOut = reinterpret_cast<char*>(a.normOut) - 512;  // adjacent: fine
  EXPECT_NO_THROW(a.validate());
  a = nvfp4Args();
  a.options.blockScales = reinterpret_cast<char*>(a.options.quantOut) + 500;
  expectRejected(a, "options.blockScales", "overlaps options.quantOut");
  a = nvfp4Args();
  a.options.blockScalesSwizzled = reinterpret_cast<char*>(a.options.blockScales) - 2047;
  expectRejected(a, "options.blockScalesSwizzled", "overlaps options.blockScales");
  a = nvfp4Args();
  a.options.blockScales = reinterpret_cast<char*>(const_cast<void*>(a.weight)) + 4;
  expectRejected(a, "options.blockScales", "overlaps weight");
  // Alignment to the element size: each buffer one byte off.
  const auto oneByteOff = [](const void* p) { return static_cast<const char*>(p) + 1; };
  const BrokenRule alignmentRules[] = {
      {kPlain, [&](Args& b) { b.input = oneByteOff(b.input); }, "x", "not aligned to 2 bytes"},
      {kPlain, [&](Args& b) { b.weight = oneByteOff(b.weight); }, "weight",
       "not aligned to 2 bytes"},
      {kPlain, [&](Args& b) { b.residualIn = oneByteOff(b.residualIn); }, "residualIn",
       "not aligned to 2 bytes"},
      {kPlain, [&](Args& b) { b.residualOut = const_cast<char*>(oneByteOff(b.residualOut)); },
       "residualOut", "not aligned to 2 bytes"},
      {kPlain, [&](Args& b) { b.normOut = const_cast<char*>(oneByteOff(b.normOut)); }, "normOut",
       "not aligned to 2 bytes"},
  };
  expectEachRejected(alignmentRules);
  a = nvfp4Args();
  a.options.scale = reinterpret_cast<const float*>(0x600002);
  expectRejected(a, "options.scale", "not aligned to 4 bytes");
}

// weight (hidden x 2 = 512 bytes here) and the quantization scale are read for every row while
// the outputs are written: they may overlap no output, partly or wholly; the read-only buffers
// (x / partial, residualIn) they may overlap. Rows are 4 x 256 x 2 = 2048 bytes.
TEST(FusedValidate, WeightAndScaleOverlapNoOutput) {
  const std::string rule = "must not overlap any output buffer";
  auto at = [](const void* base, long off) {
    return reinterpret_cast<char*>(const_cast<void*>(base)) + off;
  };
  Args a;
  a.weight = at(a.residualOut, 2048 - 256);  // its first half in residualOut's last 256 bytes
  expectRejected(a, "weight", "overlaps residualOut");
  expectRejected(a, "weight", rule);
  a = Args();
  a.weight = at(a.residualOut, -256);  // its second half in residualOut's first 256 bytes
  expectRejected(a, "weight", "overlaps residualOut");
  a = Args();
  a.weight = at(a.normOut, 512);  // wholly inside normOut
  expectRejected(a, "weight", "overlaps normOut");
  expectRejected(a, "weight", rule);
  a = Args();
  a.weight = a.normOut;  // the same start
  expectRejected(a, "weight", "overlaps normOut");
  a = Args();
  a.weight = a.residualOut;
  expectRejected(a, "weight", "overlaps residualOut");
  a = Args();
  a.normOut = const_cast<void*>(a.input);  // x aliasing normOut: weight inside x is inside normOut
  a.weight = at(a.input, 1024);
  expectRejected(a, "weight", "overlaps normOut");
  a = Args();
  a.residualOut = const_cast<void*>(a.residualIn);  // in place: residualIn is written too
  a.weight = at(a.residualIn, 2);
  expectRejected(a, "weight", "overlaps residualOut");
  // The all-reduce's name for its input is "partial"; the rule is the same.
  a = Args();
  a.weight = at(a.normOut, 1536);
  try {
    validateFused(a.input, "partial", a.residualIn, a.residualOut, a.weight, a.epsilon, a.normOut,
                  a.tokens, a.hidden, a.datatype, &a.options);
    ADD_FAILURE() << "weight inside normOut accepted with input 'partial'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("argument 'weight': overlaps normOut"), std::string::npos)
        << e.what();
  }
  // The scale of a quantized output, likewise.
  a = nvfp4Args();
  a.options.scale = reinterpret_cast<const float*>(at(a.normOut, 2044));
  expectRejected(a, "options.scale", "overlaps normOut");
  expectRejected(a, "options.scale", rule);
  a = nvfp4Args();
  a.options.quant = anyrQuantFp8;
  a.options.scale = reinterpret_cast<const float*>(at(a.residualOut, 0));
  expectRejected(a, "options.scale", "overlaps residualOut");
  // Allowed: adjacent to an output, inside a read-only input, no output given.
  a = Args();
  a.weight = at(a.residualOut, 2048);
  EXPECT_NO_THROW(a.validate());
  a = Args();
  a.weight = at(a.normOut, -512);
  EXPECT_NO_THROW(a.validate());
  a = Args();
  a.weight = at(a.input, 100);
  EXPECT_NO_THROW(a.validate());
  a = Args();
  a.weight = at(a.residualIn, 0);
  EXPECT_NO_THROW(a.validate());
  a = nvfp4Args();
  a.normOut = nullptr;
  a.residualIn = nullptr;
  a.residualOut = nullptr;
  a.weight = reinterpret_cast<const void*>(0x500000);  // where normOut would have been
  a.options.scale = reinterpret_cast<const float*>(at(a.input, 4));
  EXPECT_NO_THROW(a.validate());
  // Without quantization the scale is not read, so not checked.
  a = Args();
  a.options.scale = reinterpret_cast<const float*>(a.normOut);
  EXPECT_NO_THROW(a.validate());
}

TEST(FusedValidate, MakeFusedParamsCopiesTheArguments) {
  Args a = nvfp4Args();
  a.options.weightPlusOne = 7;
  a.options.blockScalesSwizzled = reinterpret_cast<void*>(0x900000);
  const FusedParams p =
      makeFusedParams(a.input, "x", a.residualIn, a.residualOut, a.weight, a.epsilon, a.normOut,
                      a.tokens, a.hidden, a.datatype, &a.options);
  EXPECT_EQ(p.residualIn, a.residualIn);
  EXPECT_EQ(p.residualOut, a.residualOut);
  EXPECT_EQ(p.weight, a.weight);
  EXPECT_EQ(p.normOut, a.normOut);
  EXPECT_EQ(p.epsilon, a.epsilon);
  EXPECT_EQ(p.tokens, 4);
  EXPECT_EQ(p.hidden, 256);
  EXPECT_EQ(p.weightPlusOne, 1);
  EXPECT_EQ(p.quant, anyrQuantNvfp4);
  EXPECT_EQ(p.scale, a.options.scale);
  EXPECT_EQ(p.quantOut, a.options.quantOut);
  EXPECT_EQ(p.blockScales, a.options.blockScales);
  EXPECT_EQ(p.blockScalesSwizzled, a.options.blockScalesSwizzled);
  // Quantization buffers of other modes are not passed on.
  a.options.quant = anyrQuantNone;
  const FusedParams q =
      makeFusedParams(a.input, "x", a.residualIn, a.residualOut, a.weight, a.epsilon, a.normOut,
                      a.tokens, a.hidden, a.datatype, &a.options);
  EXPECT_EQ(q.scale, nullptr);
  EXPECT_EQ(q.quantOut, nullptr);
  EXPECT_EQ(q.blockScales, nullptr);
  EXPECT_EQ(q.blockScalesSwizzled, nullptr);
}

// Which fused one-shot kernel a call gets: the per-quantization-mode ones need every row
// buffer aligned for whole-vector access; anything else takes the general kernel.
TEST(FusedValidate, BuffersAlignedForTheVectorKernels) {
  auto at = [](uintptr_t a) { return reinterpret_cast<void*>(a); };
  FusedParams aligned{};
  aligned.residualIn = at(0x10000);
  aligned.residualOut = at(0x20000);
  aligned.weight = at(0x30000);
  aligned.normOut = at(0x40000);
  void* const input = at(0x50000);
  EXPECT_TRUE(fusedBuffersAligned(input, aligned));
  EXPECT_FALSE(fusedBuffersAligned(at(0x50002), aligned));
  // Each row buffer 8 bytes off (not enough for 16-byte vectors), then absent (fine).
  for (int field = 0; field < 4; ++field) {
    for (uintptr_t where : {uintptr_t{0x70008}, uintptr_t{0}}) {
      FusedParams p = aligned;
      if (field == 0) p.residualIn = at(where);
      if (field == 1) p.residualOut = at(where);
      if (field == 2) p.weight = at(where);
      if (field == 3) p.normOut = at(where);
      EXPECT_EQ(fusedBuffersAligned(input, p), where == 0) << "field " << field;
    }
  }
  FusedParams q = aligned;
  q.quant = anyrQuantFp8;  // 8 bytes hold a vector's 8 codes
  q.quantOut = at(0x60008);
  EXPECT_TRUE(fusedBuffersAligned(input, q));
  q.quantOut = at(0x60004);
  EXPECT_FALSE(fusedBuffersAligned(input, q));
  q.quant = anyrQuantNvfp4;  // 4 bytes hold a vector's 8 nibbles
  EXPECT_TRUE(fusedBuffersAligned(input, q));
  q.quantOut = at(0x60002);
  EXPECT_FALSE(fusedBuffersAligned(input, q));
}

// The launch shapes of the fused kernels (fused_algo.h), the same on every rank: rows up to
// hidden 8192 fit registers (two vectors a thread of 512); there the two-shot spreads its grid
// like the one-shot (a block per row, at least one per 64 vectors, at most the cap), wider rows
// take the staged form with a block per owned row.
TEST(FusedLaunchShape, TwoShotRegisterFormSpreadsOverTheGridUpToHidden8192) {
  for (int hidden : {128, 4096, 6144, 7168, 8192}) {
    EXPECT_TRUE(fusedRowFitsRegisters(hidden)) << hidden;
  }
  for (int hidden : {8200, 12288, 16384}) EXPECT_FALSE(fusedRowFitsRegisters(hidden)) << hidden;
  EXPECT_EQ(fusedThreads(6144), 512);
  EXPECT_EQ(fusedThreads(128), 64);
  // 64 rows of 6144 (49,152 vectors): the whole grid; 2 rows: 24 blocks (64 vectors each).
  EXPECT_EQ(fusedTwoShotBlocks(64, 2, 6144, 64 * 768, 132), 132);
  EXPECT_EQ(fusedTwoShotBlocks(2, 2, 6144, 2 * 768, 132), 24);
  EXPECT_EQ(fusedTwoShotBlocks(2, 2, 6144, 2 * 768, 132), fusedOneShotBlocks(2, 2 * 768, 132));
  // Staged form: one block per row this rank owns.
  EXPECT_EQ(fusedTwoShotBlocks(64, 2, 16384, 64 * 2048, 132), 32);
  EXPECT_EQ(fusedTwoShotBlocks(3, 2, 16384, 3 * 2048, 132), 2);
  EXPECT_EQ(fusedTwoShotBlocks(1000, 4, 16384, 1000 * 2048, 132), 132);
}

// The two-shot register form's dense shape (fused_algo.h): only for launches of more rows than
// one block per SM, only where two blocks of kFusedDenseThreads fit an SM on every rank
// (denseBlocks above maxBlocks), only for rows that fit registers; a block per row up to the
// dense cap, 256 threads holding up to four vectors of hidden 8192.
TEST(FusedLaunchShape, TwoShotDenseShapeOnlyAboveOneBlockPerSm) {
  // 128 rows of 6144 on 132 SMs: the 512-thread form, as before.
  FusedLaunchShape s = fusedTwoShotShape(128, 2, 6144, 128 * 768, 132, 256);
  EXPECT_EQ(s.blocks, 132);
  EXPECT_EQ(s.threads, 0);
  // 133 and 1024 rows: 256 blocks of 256 threads (three vectors each at 6144, four at 8192).
  s = fusedTwoShotShape(133, 2, 6144, 133 * 768, 132, 256);
  EXPECT_EQ(s.blocks, 256);
  EXPECT_EQ(s.threads, kFusedDenseThreads);
  EXPECT_EQ((6144 / 8 + kFusedDenseThreads - 1) / kFusedDenseThreads, 3);
  s = fusedTwoShotShape(1024, 2, 8192, 1024 * 1024, 132, 256);
  EXPECT_EQ(s.blocks, 256);
  EXPECT_EQ(s.threads, kFusedDenseThreads);
  EXPECT_LE(8192 / 8, 4 * kFusedDenseThreads);
  // Not admitted (one block per SM on some rank, or config.maxBlocks at or under the SMs).
  s = fusedTwoShotShape(1024, 2, 6144, 1024 * 768, 132, 132);
  EXPECT_EQ(s.blocks, 132);
  EXPECT_EQ(s.threads, 0);
  // Rows wider than registers hold: the staged form, a block per owned row.
  s = fusedTwoShotShape(1024, 2, 16384, 1024 * 2048, 132, 256);
  EXPECT_EQ(s.blocks, 132);
  EXPECT_EQ(s.threads, 0);
  s = fusedTwoShotShape(64, 2, 16384, 64 * 2048, 132, 256);
  EXPECT_EQ(s.blocks, 32);
  // kFusedDenseThreads divides the slot count (fusedRowEpilogueRegs's rule).
  EXPECT_EQ(kFusedSlots % kFusedDenseThreads, 0);
}

// The fused one-shot's cluster form (fused_algo.h): every row of a launch gets a cluster of
// the largest size that leaves a block at least 64 vectors and keeps rows x size within the
// block cap; the setting forces a size or turns clusters off; rows wider than 1024 vectors
// never take it. The block size covers the row in whole warps.
TEST(FusedLaunchShape, ClusterSizeFollowsRowsHiddenAndSetting) {
  // hidden 6144 (768 vectors), 132 blocks: 8 up to 16 rows, 4 up to 33, 2 up to 66, then none.
  EXPECT_EQ(fusedClusterSize(1, 6144, 132, 0), 8);
  EXPECT_EQ(fusedClusterSize(8, 6144, 132, 0), 8);
  EXPECT_EQ(fusedClusterSize(9, 6144, 132, 0), 8);
  EXPECT_EQ(fusedClusterSize(16, 6144, 132, 0), 8);
  EXPECT_EQ(fusedClusterSize(17, 6144, 132, 0), 4);
  EXPECT_EQ(fusedClusterSize(32, 6144, 132, 0), 4);
  EXPECT_EQ(fusedClusterSize(34, 6144, 132, 0), 2);
  EXPECT_EQ(fusedClusterSize(66, 6144, 132, 0), 2);
  EXPECT_EQ(fusedClusterSize(67, 6144, 132, 0), 1);
  // Narrow rows: a block keeps at least 64 vectors (hidden 1024 = 128 vectors: 2 blocks).
  EXPECT_EQ(fusedClusterSize(1, 1024, 132, 0), 2);
  EXPECT_EQ(fusedClusterSize(1, 512, 132, 0), 1);
  EXPECT_EQ(fusedClusterSize(1, 128, 132, 0), 1);
  // Wider than 8192: never.
  EXPECT_EQ(fusedClusterSize(1, 8192, 132, 0), 8);
  EXPECT_EQ(fusedClusterSize(1, 8200, 132, 0), 1);
  EXPECT_EQ(fusedClusterSize(1, 16384, 132, 4), 1);
  // The setting: 1 off, 2/4/8 forced whatever the rows.
  EXPECT_EQ(fusedClusterSize(1, 6144, 132, 1), 1);
  EXPECT_EQ(fusedClusterSize(1, 6144, 132, 2), 2);
  EXPECT_EQ(fusedClusterSize(100, 6144, 132, 8), 8);
  EXPECT_EQ(fusedClusterSize(1, 128, 132, 4), 4);
  // A smaller block cap (ANYR_MAX_BLOCKS) moves the thresholds.
  EXPECT_EQ(fusedClusterSize(4, 6144, 16, 0), 4);
  EXPECT_EQ(fusedClusterSize(17, 6144, 40, 0), 2);
  EXPECT_EQ(fusedClusterSize(21, 6144, 40, 0), 1);

  // Clusters of two at two blocks per SM (pairBlocks 256): from 67 rows up to 128, then none;
  // never before a larger size fits at one block per SM; 0 turns it off.
  EXPECT_EQ(fusedClusterSize(16, 6144, 132, 0, 256), 8);
  EXPECT_EQ(fusedClusterSize(66, 6144, 132, 0, 256), 2);
  EXPECT_EQ(fusedClusterSize(67, 6144, 132, 0, 256), 2);
  EXPECT_EQ(fusedClusterSize(128, 6144, 132, 0, 256), 2);
  EXPECT_EQ(fusedClusterSize(129, 6144, 132, 0, 256), 1);
  EXPECT_EQ(fusedClusterSize(67, 6144, 132, 0, 0), 1);
  EXPECT_EQ(fusedClusterSize(67, 6144, 132, 1, 256), 1);
  EXPECT_EQ(fusedClusterSize(67, 512, 132, 0, 256), 1);  // 64 vectors: one block of 32 each
  // The cap a cluster launch takes: two per SM where its blocks are at most pairThreads
  // threads and the pair cap is above one per SM, else one per SM.
  EXPECT_EQ(fusedClusterPairBlocks(6144, 2, 132, 384, 256), 256);  // 384 threads
  EXPECT_EQ(fusedClusterPairBlocks(7168, 2, 132, 384, 256), 132);  // 448 threads
  EXPECT_EQ(fusedClusterPairBlocks(7168, 4, 132, 384, 256), 256);  // 224 threads
  EXPECT_EQ(fusedClusterPairBlocks(6144, 2, 132, 0, 0), 132);
  EXPECT_EQ(fusedClusterPairBlocks(6144, 2, 132, 384, 132), 132);
  // H200's pair kernels hold two blocks of 448 threads per SM in every variant: 7168 in
  // clusters of two takes the pair cap; 8192's 512 threads do not.
  EXPECT_EQ(fusedClusterPairBlocks(7168, 2, 132, 448, 264), 264);
  EXPECT_EQ(fusedClusterPairBlocks(8192, 2, 132, 448, 264), 132);
  EXPECT_EQ(fusedClusterSize(80, 7168, 132, 0, fusedClusterPairBlocks(7168, 2, 132, 448, 264)), 2);
  EXPECT_EQ(fusedClusterSize(80, 8192, 132, 0, fusedClusterPairBlocks(8192, 2, 132, 448, 264)), 1);

  EXPECT_EQ(fusedClusterThreads(6144, 8), 96);
  EXPECT_EQ(fusedClusterThreads(6144, 4), 192);
  EXPECT_EQ(fusedClusterThreads(7168, 8), 128);  // 896 / 8 = 112 -> 4 warps
  EXPECT_EQ(fusedClusterThreads(8192, 2), 512);
  EXPECT_EQ(fusedClusterThreads(128, 8), 32);
  for (int hidden = 128; hidden <= 8192; hidden += 8) {
    for (int c : {2, 4, 8}) {
      const int t = fusedClusterThreads(hidden, c);
      ASSERT_EQ(t % 32, 0) << hidden << " " << c;
      ASSERT_GE(t * c, hidden / 8) << hidden << " " << c;
      ASSERT_LE(t, kFusedClusterMaxThreads) << hidden << " " << c;
      if (t > 32) {
        ASSERT_LT(t - 32, (hidden / 8 + c - 1) / c) << hidden << " " << c;  // fewest warps
      }
    }
  }

  // Clusters in the grid: a row each, within the cap and within what the GPU holds at once.
  EXPECT_EQ(fusedClusterCount(1, 8, 132, 16), 1);
  EXPECT_EQ(fusedClusterCount(32, 4, 132, 40), 32);
  EXPECT_EQ(fusedClusterCount(64, 4, 132, 40), 33);  // 132 / 4: clusters loop over rows
  EXPECT_EQ(fusedClusterCount(32, 4, 132, 20), 20);  // residency caps it
  EXPECT_EQ(fusedClusterCount(1, 8, 132, 0), 0);     // nothing fits: refused
}

// The standalone kernel's forms (fused.h): the Rows forms' block is the smallest power of two
// that keeps a thread at maxVpt vectors (a power of two dividing the slot count, at most 512,
// four vectors at most at hidden 16384); the Cluster form gives every row a cluster of the
// largest size within one block per SM that leaves a block a warp's vectors; Auto takes it
// where it fits, else Rows.
// With programmatic launch the standalone kernel releases the next launch early only where its
// grid holds at most one block an SM (Auto); Early and AtExit are what they say at any grid.
TEST(FusedLaunchShape, StandaloneReleasesEarlyOnlyAtOneBlockAnSm) {
  EXPECT_TRUE(addRmsNormReleasesEarly(AddRmsNormRelease::Auto, 1, 132));
  EXPECT_TRUE(addRmsNormReleasesEarly(AddRmsNormRelease::Auto, 132, 132));
  EXPECT_FALSE(addRmsNormReleasesEarly(AddRmsNormRelease::Auto, 133, 132));
  EXPECT_FALSE(addRmsNormReleasesEarly(AddRmsNormRelease::Auto, 512, 132));
  EXPECT_TRUE(addRmsNormReleasesEarly(AddRmsNormRelease::Auto, 188, 188));
  EXPECT_TRUE(addRmsNormReleasesEarly(AddRmsNormRelease::Early, 2048, 132));
  EXPECT_FALSE(addRmsNormReleasesEarly(AddRmsNormRelease::AtExit, 1, 132));
}

// The Rows form's cache hints (Auto): on where the bytes a launch moves are 5/6 to 3/2 of the
// L2, counted over the distinct buffers (a residual in place once; x as normOut once).
TEST(FusedLaunchShape, StandaloneHintsWhereTheBytesAboutFillTheL2) {
  const int64_t l2 = 50 << 20;                      // an H100's L2
  EXPECT_FALSE(addRmsNormHintsAt(l2 * 5 / 6, l2));  // 5/6 of 50 MiB is not a whole byte
  EXPECT_TRUE(addRmsNormHintsAt(l2 * 5 / 6 + 1, l2));
  EXPECT_TRUE(addRmsNormHintsAt(l2, l2));
  EXPECT_TRUE(addRmsNormHintsAt(l2 * 3 / 2, l2));
  EXPECT_FALSE(addRmsNormHintsAt(l2 * 3 / 2 + 1, l2));
  EXPECT_FALSE(addRmsNormHintsAt(l2, 0));                         // L2 size unknown: no hints
  EXPECT_TRUE(addRmsNormHintsAt(int64_t{7168} * 768 * 8, l2));    // 0.84 of the L2
  EXPECT_FALSE(addRmsNormHintsAt(int64_t{5120} * 1024 * 8, l2));  // 0.80
  EXPECT_FALSE(addRmsNormHintsAt(int64_t{5120} * 2048 * 8, l2));  // 1.60

  alignas(16) static char buf[5][16];
  FusedParams p{};
  p.tokens = 2048;
  p.hidden = 2880;
  p.residualIn = buf[1];
  p.residualOut = buf[2];
  p.normOut = buf[3];
  const int64_t tensor = int64_t{2048} * 2880 * 2;
  EXPECT_EQ(addRmsNormBytes(buf[0], p, 2), 4 * tensor);
  EXPECT_TRUE(addRmsNormHintsAt(addRmsNormBytes(buf[0], p, 2), l2));  // 2880 x 2048: 0.90 L2
  p.residualOut = buf[1];                                             // in place
  EXPECT_EQ(addRmsNormBytes(buf[0], p, 2), 3 * tensor);
  p.normOut = buf[0];  // x as normOut too
  EXPECT_EQ(addRmsNormBytes(buf[0], p, 2), 2 * tensor);
  p.residualIn = nullptr;
  p.residualOut = buf[2];
  p.normOut = nullptr;
  p.quant = anyrQuantNvfp4;
  p.quantOut = buf[3];
  p.blockScales = buf[4];
  EXPECT_EQ(addRmsNormBytes(buf[0], p, 2), 2 * tensor + tensor / 4 + tensor / 32);
  p.tokens = 8192;
  p.hidden = 6144;
  p.residualIn = buf[1];
  p.normOut = buf[3];
  p.quant = anyrQuantNone;
  p.quantOut = nullptr;
  p.blockScales = nullptr;
  EXPECT_FALSE(addRmsNormHintsAt(addRmsNormBytes(buf[0], p, 2), l2));  // 6144 x 8192: 7.7 L2
}

TEST(FusedLaunchShape, StandaloneFormsFollowRowsAndHidden) {
  EXPECT_EQ(addRmsNormRowThreads(2880, 3), 128);  // 360 vectors: 3 a thread
  EXPECT_EQ(addRmsNormRowThreads(4096, 3), 256);
  EXPECT_EQ(addRmsNormRowThreads(6144, 3), 256);
  EXPECT_EQ(addRmsNormRowThreads(7168, 3), 512);  // 896 vectors: 4 at 256, 2 at 512
  EXPECT_EQ(addRmsNormRowThreads(8192, 3), 512);
  EXPECT_EQ(addRmsNormRowThreads(16384, 3), 512);  // 4 a thread: the most there is
  EXPECT_EQ(addRmsNormRowThreads(6144, 2), 512);
  EXPECT_EQ(addRmsNormRowThreads(6144, 4), 256);
  EXPECT_EQ(addRmsNormRowThreads(128, 3), 32);
  for (int hidden = 128; hidden <= kFusedMaxHidden; hidden += 8) {
    for (int maxVpt = 1; maxVpt <= 4; ++maxVpt) {
      const int t = addRmsNormRowThreads(hidden, maxVpt);
      const int vpt = rowVecsPerThread(hidden, t);
      ASSERT_TRUE(t >= 32 && t <= 512 && (t & (t - 1)) == 0) << hidden << " " << maxVpt;
      ASSERT_EQ(kFusedSlots % t, 0) << hidden;
      ASSERT_TRUE(vpt >= 1 && vpt <= 4) << hidden << " " << maxVpt;
      if (t < 512) {
        ASSERT_LE(vpt, maxVpt) << hidden << " " << maxVpt;
      }
      if (t > 32) {
        ASSERT_GT(rowVecsPerThread(hidden, t / 2), maxVpt) << hidden << " " << maxVpt;
      }
    }
  }

  // 132 SMs, hidden 6144 (768 vectors): 8 up to 16 rows, 4 up to 33, 2 up to 66, then none.
  EXPECT_EQ(addRmsNormClusterBlocks(6144, 1, 132), 8);
  EXPECT_EQ(addRmsNormClusterBlocks(6144, 16, 132), 8);
  EXPECT_EQ(addRmsNormClusterBlocks(6144, 17, 132), 4);
  EXPECT_EQ(addRmsNormClusterBlocks(6144, 33, 132), 4);
  EXPECT_EQ(addRmsNormClusterBlocks(6144, 34, 132), 2);
  EXPECT_EQ(addRmsNormClusterBlocks(6144, 66, 132), 2);
  EXPECT_EQ(addRmsNormClusterBlocks(6144, 67, 132), 1);
  EXPECT_EQ(addRmsNormClusterBlocks(2880, 1, 132), 8);  // 360 vectors: 45 a block
  EXPECT_EQ(addRmsNormClusterBlocks(1024, 1, 132), 4);  // 128 vectors: a warp's each
  EXPECT_EQ(addRmsNormClusterBlocks(256, 1, 132), 1);   // 32 vectors: one block is enough
  EXPECT_EQ(addRmsNormClusterBlocks(8192, 1, 132), 8);
  EXPECT_EQ(addRmsNormClusterBlocks(8200, 1, 132), 1);  // beyond kFusedSlots vectors
  for (int hidden = 128; hidden <= 8192; hidden += 8) {
    for (int tokens : {1, 2, 16, 33, 66, 67, 1000}) {
      const int c = addRmsNormClusterBlocks(hidden, tokens, 132);
      if (c == 1) continue;
      const int t = fusedClusterThreads(hidden, c);
      ASSERT_LE(tokens * c, 132);
      ASSERT_LE(t, kFusedClusterMaxThreads);
      ASSERT_LE(c * t / 32, 32) << hidden << " " << c;  // the exchange's 32 groups
    }
  }

  EXPECT_EQ(addRmsNormAutoForm(6144, 1, 132, true), AddRmsNormForm::Cluster);
  EXPECT_EQ(addRmsNormAutoForm(6144, 66, 132, true), AddRmsNormForm::Cluster);
  EXPECT_EQ(addRmsNormAutoForm(6144, 1, 132, false), AddRmsNormForm::Rows);
  EXPECT_EQ(addRmsNormAutoForm(6144, 67, 132, true), AddRmsNormForm::Rows);
  EXPECT_EQ(addRmsNormAutoForm(6144, 8192, 132, true), AddRmsNormForm::Rows);
  EXPECT_EQ(addRmsNormAutoForm(16384, 1, 132, true), AddRmsNormForm::Rows);
  // A row that one Rows block holds at one vector a thread (up to 512 vectors, hidden 4096)
  // takes Rows even where it would get a cluster.
  EXPECT_EQ(addRmsNormAutoForm(2880, 1, 132, true), AddRmsNormForm::Rows);
  EXPECT_EQ(addRmsNormAutoForm(4096, 1, 132, true), AddRmsNormForm::Rows);
  EXPECT_EQ(addRmsNormAutoForm(4104, 1, 132, true), AddRmsNormForm::Cluster);
  EXPECT_EQ(addRmsNormAutoForm(5120, 1, 132, true), AddRmsNormForm::Cluster);

  // The Rows form's vectors a thread where the launch leaves them open: one up to a row an SM,
  // two up to four rows an SM (three above two rows an SM where that leaves blocks of 256
  // threads or more: for a quantized output up to four rows an SM, for the unquantized one up
  // to 3.5), then three; and the block that follows from it.
  for (bool q : {false, true}) {
    EXPECT_EQ(addRmsNormRowsVpt(1, 132, 6144, q), 1);
    EXPECT_EQ(addRmsNormRowsVpt(132, 132, 6144, q), 1);
    EXPECT_EQ(addRmsNormRowsVpt(529, 132, 6144, q), 3);
    EXPECT_EQ(addRmsNormRowsVpt(1 << 30, 1 << 27, 6144, q), 3);  // 4 x sms beyond int
    EXPECT_EQ(addRmsNormRowsVpt(133, 132, 2880, q), 2);          // three: blocks of 128
    EXPECT_EQ(addRmsNormRowsVpt(528, 132, 2880, q), 2);
  }
  EXPECT_EQ(addRmsNormRowsVpt(133, 132, 6144, false), 2);
  EXPECT_EQ(addRmsNormRowsVpt(264, 132, 6144, false), 2);
  EXPECT_EQ(addRmsNormRowsVpt(265, 132, 6144, false), 3);
  EXPECT_EQ(addRmsNormRowsVpt(462, 132, 6144, false), 3);  // 3.5 rows an SM
  EXPECT_EQ(addRmsNormRowsVpt(463, 132, 6144, false), 2);
  EXPECT_EQ(addRmsNormRowsVpt(528, 132, 6144, false), 2);
  EXPECT_EQ(addRmsNormRowsVpt(300, 132, 5120, false), 3);
  EXPECT_EQ(addRmsNormRowsVpt(300, 132, 2880, false), 2);          // three: blocks of 128
  EXPECT_EQ(addRmsNormRowsVpt(3 << 29, 1 << 29, 6144, false), 3);  // 2 x tokens beyond int
  EXPECT_EQ(addRmsNormRowsVpt(133, 132, 6144, true), 2);
  EXPECT_EQ(addRmsNormRowsVpt(264, 132, 6144, true), 2);
  EXPECT_EQ(addRmsNormRowsVpt(265, 132, 6144, true), 3);
  EXPECT_EQ(addRmsNormRowsVpt(528, 132, 6144, true), 3);
  EXPECT_EQ(addRmsNormRowsVpt(512, 132, 5120, true), 3);
  EXPECT_EQ(addRmsNormRowsVpt(1 << 29, 1 << 27, 6144, true), 3);  // 2 x sms beyond int
  EXPECT_EQ(addRmsNormRowThreads(2880, addRmsNormRowsVpt(1, 132, 2880, false)), 512);
  EXPECT_EQ(addRmsNormRowThreads(2880, addRmsNormRowsVpt(512, 132, 2880, false)), 256);
  EXPECT_EQ(addRmsNormRowThreads(2880, addRmsNormRowsVpt(512, 132, 2880, true)), 256);
  EXPECT_EQ(addRmsNormRowThreads(2880, addRmsNormRowsVpt(8192, 132, 2880, false)), 128);
  EXPECT_EQ(
      rowVecsPerThread(6144, addRmsNormRowThreads(6144, addRmsNormRowsVpt(1, 132, 6144, false))),
      2);
  // At 512 rows of 6144: blocks of 512 threads holding one or two vectors unquantized, of 256
  // threads holding three with a quantized output; at 4096, 7168 and 8192 both rules give the
  // same block.
  EXPECT_EQ(addRmsNormRowThreads(6144, addRmsNormRowsVpt(512, 132, 6144, false)), 512);
  EXPECT_EQ(addRmsNormRowThreads(6144, addRmsNormRowsVpt(512, 132, 6144, true)), 256);
  EXPECT_EQ(addRmsNormRowThreads(5120, addRmsNormRowsVpt(512, 132, 5120, true)), 256);
  for (int h : {4096, 7168, 8192}) {
    EXPECT_EQ(addRmsNormRowThreads(h, addRmsNormRowsVpt(512, 132, h, true)),
              addRmsNormRowThreads(h, addRmsNormRowsVpt(512, 132, h, false)));
  }

  // The Rows form's automatic grid: one block per row from three rows a resident block.
  EXPECT_FALSE(addRmsNormRowsPerRow(512, 264));  // hidden 8192 at 512 tokens on 132 SMs
  EXPECT_FALSE(addRmsNormRowsPerRow(791, 264));
  EXPECT_TRUE(addRmsNormRowsPerRow(792, 264));
  EXPECT_TRUE(addRmsNormRowsPerRow(2048, 528));  // hidden 6144 at 2048 tokens
  EXPECT_FALSE(addRmsNormRowsPerRow(2048, 2112));
  EXPECT_TRUE(addRmsNormRowsPerRow(int64_t{1} << 40, int64_t{1} << 20));
  for (AddRmsNormForm f : {AddRmsNormForm::Auto, AddRmsNormForm::Staged, AddRmsNormForm::Regs,
                           AddRmsNormForm::Rows, AddRmsNormForm::Cluster}) {
    EXPECT_NE(addRmsNormFormName(f), nullptr);
  }
}

TEST(FusedCApi, RejectsInvalidArgumentsBeforeTouchingTheGpu) {
  std::vector<uint16_t> host(256 * 4);
  void* p = host.data();
  EXPECT_EQ(
      anyrAddRmsNorm(p, nullptr, nullptr, p, 1e-6f, p, 4, 130, anyrBfloat16, nullptr, nullptr),
      anyrInvalidArgument);
  EXPECT_EQ(anyrAddRmsNorm(p, nullptr, nullptr, p, 1e-6f, p, 4, 256, anyrFloat32, nullptr, nullptr),
            anyrInvalidArgument);
  EXPECT_EQ(anyrAddRmsNorm(nullptr, nullptr, nullptr, nullptr, 1e-6f, nullptr, 0, 256, anyrBfloat16,
                           nullptr, nullptr),
            anyrSuccess);  // tokens == 0: a no-op
}

// The standalone call refuses a weight overlapping an output (here partly, its first 8 bytes
// being normOut's last 8) with the argument, the other buffer and the rule named.
TEST(FusedCApi, RefusesAWeightOverlappingAnOutput) {
  std::vector<uint16_t> host(256 * 4 * 2 + 256);
  uint16_t* x = host.data();
  uint16_t* norm = x + 256 * 4;
  uint16_t* weight = norm + 256 * 4 - 4;
  EXPECT_EQ(anyrAddRmsNorm(x, nullptr, nullptr, weight, 1e-6f, norm, 4, 256, anyrBfloat16, nullptr,
                           nullptr),
            anyrInvalidArgument);
  const std::string msg = anyrGetLastError(nullptr);
  EXPECT_NE(msg.find("anyrAddRmsNorm: argument 'weight': overlaps normOut"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("must not overlap any output buffer"), std::string::npos) << msg;
}

// ---- crafted rows through the reference ---------------------------------------------------
struct Crafted {
  ref::RowSpec spec;
  std::vector<double> x, weight;
  ref::RowResult out;
  void run() { ref::referenceRow(spec, x.data(), nullptr, weight.data(), &out); }
};

Crafted crafted(anyrDataType_t t, size_t hidden, double xv, double wv) {
  Crafted c;
  c.spec.dtype = t;
  c.spec.hidden = hidden;
  c.x.assign(hidden, xv);
  c.weight.assign(hidden, wv);
  return c;
}

TEST(FusedReference, CraftedAllZeros) {
  for (anyrDataType_t t : {anyrBfloat16, anyrFloat16}) {
    Crafted c = crafted(t, 256, 0.0, 1.0);
    c.run();
    std::vector<float> yf(c.out.y.begin(), c.out.y.end());
    for (double y : c.out.y) ASSERT_EQ(y, 0.0);
    std::vector<uint8_t> fp8(256), packed(128), scales(16);
    ref::quantizeFp8(yf.data(), 256, 0.5f, fp8.data());
    for (uint8_t q : fp8) ASSERT_EQ(q, 0);
    ref::quantizeNvfp4(yf.data(), 256, 0.25f, packed.data(), scales.data());
    for (uint8_t s : scales) ASSERT_EQ(s, 0);
    for (uint8_t q : packed) ASSERT_EQ(q, 0);
    ref::quantizeNvfp4Exact(c.out.y.data(), 256, 0.25, packed.data(), scales.data());
    for (uint8_t s : scales) ASSERT_EQ(s, 0);
    for (uint8_t q : packed) ASSERT_EQ(q, 0);
  }
}

TEST(FusedReference, CraftedNegativeZero) {
  Crafted c = crafted(anyrBfloat16, 128, -0.0, 1.0);
  c.run();
  for (size_t i = 0; i < 128; ++i) {
    ASSERT_TRUE(std::signbit(c.out.r[i]));
    ASSERT_EQ(c.out.y[i], 0.0);
    ASSERT_TRUE(std::signbit(c.out.y[i]));
    ASSERT_EQ(ref::dtypeBits(c.out.y[i], anyrBfloat16), 0x8000);
  }
  std::vector<float> yf(c.out.y.begin(), c.out.y.end());
  std::vector<uint8_t> fp8(128), packed(64), scales(8);
  ref::quantizeFp8(yf.data(), 128, 1.0f, fp8.data());
  for (uint8_t q : fp8) ASSERT_EQ(q, 0x80);  // FP8 keeps the sign of zero
  ref::quantizeNvfp4(yf.data(), 128, 1.0f, packed.data(), scales.data());
  for (uint8_t s : scales) ASSERT_EQ(s, 0);
  for (uint8_t q : packed) ASSERT_EQ(q, 0);  // block scale 0: every code is +0
  // -0.0 + 0.0 = +0.0 in the residual add.
  const std::vector<double> zeros(128, 0.0);
  ref::referenceRow(c.spec, c.x.data(), zeros.data(), c.weight.data(), &c.out);
  for (double r : c.out.r) ASSERT_FALSE(std::signbit(r));
}

TEST(FusedReference, CraftedOneHugeValue) {
  for (anyrDataType_t t : {anyrBfloat16, anyrFloat16}) {
    const double huge = t == anyrBfloat16 ? 1e18 : 60000.0;
    Crafted c = crafted(t, 1024, 1.0, 1.0);
    c.x[5] = huge;
    c.run();
    const double hugeT = ref::roundToDtype(huge, t);
    const double rms = std::sqrt((hugeT * hugeT + 1023.0) / 1024.0 + c.spec.epsilon);
    EXPECT_EQ(c.out.y[5], ref::roundToDtype(hugeT / rms, t));
    EXPECT_NEAR(c.out.y[5], 32.0, 32.0 * 1e-2);
    for (size_t i = 0; i < 1024; ++i) ASSERT_TRUE(std::isfinite(c.out.y[i]));
    std::vector<uint8_t> packed(512), scales(64);
    const double g = 1.0 / 64;
    ref::quantizeNvfp4Exact(c.out.y.data(), 1024, g, packed.data(), scales.data());
    EXPECT_EQ(scales[0], ref::e4m3Encode(c.out.y[5] / (6 * g)));
    EXPECT_EQ(packed[2] >> 4, 7);  // element 5: the block maximum maps to 6
    EXPECT_EQ(packed[0], 0);       // the small ones vanish
    EXPECT_EQ(scales[1], ref::e4m3Encode(c.out.y[16] / (6 * g)));
  }
}

TEST(FusedReference, CraftedFp8SaturationLimit) {
  // y / scale at and around 448, with scale = 1/64 (y values exact in bf16 and fp16).
  const float scale = 1.0f / 64;
  const struct {
    float y;
    uint8_t code;
  } cases[] = {{7.0f, 0x7e},  {-7.0f, 0xfe}, {7.25f, 0x7e}, {7.5f, 0x7e},   {1000.0f, 0x7e},
               {-1e4f, 0xfe}, {6.5f, 0x7d},  {6.75f, 0x7e}, {6.625f, 0x7d}, {0.0f, 0x00}};
  for (const auto& c : cases) {
    uint8_t q = 0;
    ref::quantizeFp8(&c.y, 1, scale, &q);
    EXPECT_EQ(q, c.code) << c.y;
    double yd = c.y;
    ref::quantizeFp8Exact(&yd, 1, scale, &q);
    EXPECT_EQ(q, c.code) << c.y;
  }
}

// An NVFP4 block whose values sit exactly on the e2m1 grid and on its ties.
TEST(FusedReference, CraftedNvfp4TiesAndSaturation) {
  const float g = 1.0f / 16;  // block amax 6 * g -> s = 1.0 (0x38), d = g
  const float units[16] = {6,      0.25f,  0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5,
                           -0.25f, -0.75f, -5,    0,     -0.0f, 0.5f, 4,    -6};
  const uint8_t codes[16] = {7, 0, 2, 2, 4, 4, 6, 6, 8, 10, 14, 0, 8, 1, 6, 15};
  float y[16];
  for (int i = 0; i < 16; ++i) y[i] = units[i] * g;
  uint8_t packed[8], s = 0;
  ref::quantizeNvfp4(y, 16, g, packed, &s);
  EXPECT_EQ(s, 0x38);
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ((packed[i / 2] >> (4 * (i % 2))) & 15, codes[i]) << i;
  }
  // Saturation: amax above 448 * 6 * g -> s = 448, values beyond 6 * 448 * g -> +-6.
  float big[16];
  for (int i = 0; i < 16; ++i) big[i] = (i % 2 ? -1.0f : 1.0f) * 4000.0f * g;
  ref::quantizeNvfp4(big, 16, g, packed, &s);
  EXPECT_EQ(s, 0x7e);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(packed[i], 0xf7) << i;
}

}  // namespace
}  // namespace anyr
