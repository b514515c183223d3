#include "common/fused_reference.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>

namespace anyr {
namespace ref {
namespace {

struct Format {
  int precision;     // significant bits, implicit bit included
  int minExponent;   // exponent of the smallest normal
  double maxFinite;  // largest finite value
};

Format formatOf(anyrDataType_t t) {
  if (t == anyrFloat16) return {11, -14, 65504.0};
  return {8, -126, std::ldexp(255.0, 120)};  // bf16: (2 - 2^-7) * 2^127
}

// RNE of v to `precision` bits with exponents clamped at minExponent (gradual underflow).
double roundTo(double v, const Format& f) {
  if (v == 0.0 || !std::isfinite(v)) return v;
  int e = 0;
  std::frexp(v, &e);  // |v| in [2^(e-1), 2^e)
  const int exponent = std::max(e - 1, f.minExponent);
  const double quantum = std::ldexp(1.0, exponent - (f.precision - 1));
  const double r = std::nearbyint(v / quantum) * quantum;  // default mode: nearest even
  if (std::fabs(r) > f.maxFinite) return std::copysign(std::numeric_limits<double>::infinity(), v);
  return r;
}

// e4m3 magnitudes of codes 0..0x7E, ascending.
const std::array<double, 127>& e4m3Table() {
  static const std::array<double, 127> table = [] {
    std::array<double, 127> t{};
    for (int c = 0; c < 127; ++c) {
      const int exp = c >> 3, man = c & 7;
      t[c] = exp == 0 ? std::ldexp(man, -9) : std::ldexp(8 + man, exp - 10);
    }
    return t;
  }();
  return table;
}

const double kE2m1[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};

// Index of the nearest entry of an ascending table (ties to the even index); beyond the last
// entry: the last.
template <size_t N>
int nearestEven(const double (&table)[N], double a) {
  int best = 0;
  for (int i = 1; i < static_cast<int>(N); ++i) {
    const double dBest = std::fabs(a - table[best]), d = std::fabs(a - table[i]);
    if (d < dBest || (d == dBest && (i % 2) == 0)) best = i;
  }
  return best;
}

}  // namespace

double roundToDtype(double v, anyrDataType_t t) { return roundTo(v, formatOf(t)); }

double roundToPrecision(double v, int precision, int minExponent) {
  return roundTo(v, {precision, minExponent, std::numeric_limits<double>::infinity()});
}

uint16_t dtypeBits(double v, anyrDataType_t t) {
  const double r = roundToDtype(v, t);
  const uint16_t sign = std::signbit(r) ? 0x8000 : 0;
  const double a = std::fabs(r);
  if (std::isnan(r)) return 0x7fff;
  if (t == anyrBfloat16) {
    if (std::isinf(a)) return sign | 0x7f80;
    const float f = static_cast<float>(a);  // exact: bf16 values are floats
    uint32_t u = 0;
    static_assert(sizeof(u) == sizeof(f), "float");
    std::memcpy(&u, &f, 4);
    return sign | static_cast<uint16_t>(u >> 16);
  }
  if (std::isinf(a)) return sign | 0x7c00;
  if (a < std::ldexp(1.0, -14)) {
    return sign | static_cast<uint16_t>(a / std::ldexp(1.0, -24));  // subnormal (or zero)
  }
  int e = 0;
  const double m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  const uint16_t exponent = static_cast<uint16_t>(e - 1 + 15);
  const uint16_t mantissa = static_cast<uint16_t>((m * 2.0 - 1.0) * 1024.0);
  return sign | static_cast<uint16_t>(exponent << 10) | mantissa;
}

double dtypeValue(uint16_t bits, anyrDataType_t t) {
  const double sign = (bits & 0x8000) ? -1.0 : 1.0;
  if (t == anyrBfloat16) {
    const uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f = 0.0f;
    std::memcpy(&f, &u, 4);
    return static_cast<double>(f);
  }
  const int exponent = (bits >> 10) & 0x1f, mantissa = bits & 0x3ff;
  if (exponent == 0x1f) {
    return mantissa ? std::numeric_limits<double>::quiet_NaN()
                    : sign * std::numeric_limits<double>::infinity();
  }
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

double dtypeUlp(double v, anyrDataType_t t) {
  const Format f = formatOf(t);
  int e = 0;
  std::frexp(v, &e);
  const int exponent = v == 0.0 ? f.minExponent : std::max(e - 1, f.minExponent);
  return std::ldexp(1.0, exponent - (f.precision - 1));
}

uint8_t e4m3Encode(double v) {
  if (std::isnan(v)) return 0x7f;
  const uint8_t sign = std::signbit(v) ? 0x80 : 0;
  const double a = std::fabs(v);
  const auto& t = e4m3Table();
  if (a >= t[126]) return sign | 0x7e;  // saturate (the tie at 464 also goes to 448: even)
  // First entry >= a; the answer is it or the one before.
  const int hi = static_cast<int>(std::lower_bound(t.begin(), t.end(), a) - t.begin());
  if (hi == 0) return sign;
  const int lo = hi - 1;
  const double dLo = a - t[lo], dHi = t[hi] - a;
  const int code = dLo < dHi ? lo : (dHi < dLo ? hi : (lo % 2 == 0 ? lo : hi));
  return sign | static_cast<uint8_t>(code);
}

double e4m3Decode(uint8_t code) {
  if ((code & 0x7f) == 0x7f) return std::numeric_limits<double>::quiet_NaN();
  const double m = e4m3Table()[code & 0x7f];
  return (code & 0x80) ? -m : m;
}

double e4m3Ulp(double v) {
  int e = 0;
  std::frexp(v, &e);
  const int exponent = v == 0.0 ? -6 : std::max(e - 1, -6);
  return std::ldexp(1.0, exponent - 3);
}

uint8_t e2m1Encode(double v) {
  if (std::isnan(v)) return 0x7;
  const uint8_t sign = std::signbit(v) ? 0x8 : 0;
  const double a = std::fabs(v);
  if (a >= 6.0) return sign | 0x7;
  return sign | static_cast<uint8_t>(nearestEven(kE2m1, a));
}

double e2m1Decode(uint8_t code) {
  const double m = kE2m1[code & 7];
  return (code & 8) ? -m : m;
}

int64_t swizzleOffset(int64_t m, int64_t k, int64_t cols) {
  const int64_t kPad = (cols + 3) / 4 * 4;
  // Source view [Mpad/128][4][32][Kpad/4][4]: m = 128*mt + 32*i + o, k = 4*kt + j.
  const int64_t mt = m / 128, i = (m % 128) / 32, o = m % 32, kt = k / 4, j = k % 4;
  // Destination [Mpad/128][Kpad/4][32][4][4], row-major: mixed-radix digits (mt, kt, o, i, j).
  int64_t off = mt;
  off = off * (kPad / 4) + kt;
  off = off * 32 + o;
  off = off * 4 + i;
  off = off * 4 + j;
  return off;
}

int64_t swizzleBytes(int64_t rows, int64_t cols) {
  return (rows + 127) / 128 * 128 * ((cols + 3) / 4 * 4);
}

void quantizeFp8(const float* y, size_t n, float scale, uint8_t* out) {
  const float inv = 1.0f / scale;
  for (size_t i = 0; i < n; ++i) out[i] = e4m3Encode(static_cast<double>(y[i] * inv));
}

void quantizeNvfp4(const float* y, size_t hidden, float g, uint8_t* packed, uint8_t* scales) {
  const float inv6g = 1.0f / (6.0f * g);
  for (size_t b = 0; b < hidden / 16; ++b) {
    const float* yb = y + 16 * b;
    float amax = 0.0f;
    for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(yb[i]));
    const uint8_t s = e4m3Encode(static_cast<double>(amax * inv6g));
    const float d = static_cast<float>(e4m3Decode(s)) * g;
    const float dinv = d > 0.0f ? 1.0f / d : 0.0f;
    scales[b] = s;
    for (int i = 0; i < 16; i += 2) {
      const uint8_t lo = d > 0.0f ? e2m1Encode(static_cast<double>(yb[i] * dinv)) : 0;
      const uint8_t hi = d > 0.0f ? e2m1Encode(static_cast<double>(yb[i + 1] * dinv)) : 0;
      packed[8 * b + i / 2] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

void referenceRow(const RowSpec& spec, const double* x, const double* residualIn,
                  const double* weight, RowResult* out) {
  const size_t n = spec.hidden;
  out->r.resize(n);
  out->yExact.resize(n);
  out->y.resize(n);
  double ss = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double xT = roundToDtype(x[i], spec.dtype);
    const double r = residualIn ? roundToDtype(xT + residualIn[i], spec.dtype) : xT;
    out->r[i] = r;
    ss += r * r;
  }
  const double rstd = 1.0 / std::sqrt(ss / static_cast<double>(n) + spec.epsilon);
  for (size_t i = 0; i < n; ++i) {
    const double w = spec.weightPlusOne ? 1.0 + weight[i] : weight[i];
    out->yExact[i] = out->r[i] * rstd * w;
    out->y[i] = roundToDtype(out->yExact[i], spec.dtype);
  }
}

void quantizeFp8Exact(const double* y, size_t n, double scale, uint8_t* out) {
  for (size_t i = 0; i < n; ++i) out[i] = e4m3Encode(y[i] / scale);
}

void quantizeNvfp4Exact(const double* y, size_t hidden, double g, uint8_t* packed,
                        uint8_t* scales) {
  for (size_t b = 0; b < hidden / 16; ++b) {
    const double* yb = y + 16 * b;
    double amax = 0.0;
    for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(yb[i]));
    const uint8_t s = e4m3Encode(amax / (6.0 * g));
    const double d = e4m3Decode(s) * g;
    scales[b] = s;
    for (int i = 0; i < 16; i += 2) {
      const uint8_t lo = d > 0.0 ? e2m1Encode(yb[i] / d) : 0;
      const uint8_t hi = d > 0.0 ? e2m1Encode(yb[i + 1] / d) : 0;
      packed[8 * b + i / 2] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

}  // namespace ref
}  // namespace anyr
