// The NVFP4 block scales' 128x4 swizzled layout (anyrFusedOptions_t.blockScalesSwizzled), as
// docs/FUSED.md documents it for callers: a matrix of M = tokens rows and K = hidden / 16
// columns, rows padded to a multiple of 128 and columns to a multiple of 4 (Kpad), in tiles of
// 128 rows x 4 columns (512 bytes each) ordered row-tile major:
//   offset(m, k) = (m / 128) * (Kpad / 4) * 512 + (k / 4) * 512
//                + (m % 32) * 16 + ((m % 128) / 32) * 4 + (k % 4)
// The padding is never written.
#pragma once

#include <cstdint>

namespace anyr {
namespace tool {

constexpr int64_t nvfp4ScaleCols(int64_t hidden) { return hidden / 16; }
constexpr int64_t swizzledPaddedCols(int64_t cols) { return (cols + 3) / 4 * 4; }
// Bytes of the 128x4 buffer of `rows` x `cols` scales, padding included.
constexpr int64_t swizzledScaleBytes(int64_t rows, int64_t cols) {
  return (rows + 127) / 128 * 128 * swizzledPaddedCols(cols);
}
constexpr int64_t swizzledScaleOffset(int64_t m, int64_t k, int64_t cols) {
  return (m / 128) * (swizzledPaddedCols(cols) / 4) * 512 + (k / 4) * 512 + (m % 32) * 16 +
         ((m % 128) / 32) * 4 + (k % 4);
}

}  // namespace tool
}  // namespace anyr
