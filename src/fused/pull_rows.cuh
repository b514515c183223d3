// What the fused pull kernels (fused_oneshot_pull.cu, fused_twoshot_pull.cu) share: a row's
// vectors read from every rank's buffer and summed in rank order, in registers, in the layout
// of the register epilogue (fused/epilogue.cuh, fusedRowEpilogueRegs: thread t of a block of B
// threads holds vectors t + k * B, k < VPT). CUDA sources only.
#pragma once

#include "device/common.cuh"
#include "fused/epilogue.cuh"

namespace anyr {
namespace dev {

// Ranks whose vectors a thread loads at once before it sums them: a load issued only after
// the previous rank's sum would cost a round trip per rank. Eight vectors in flight at one or
// two vectors a thread; at three or four (rows wider than 8192, composed unless forced) one
// rank at a time: two made the one-shot kernel spill registers, one did not (ptxas, sm_90).
template <int VPT>
constexpr int pullRanksAtOnce() {
  return VPT >= 3 ? 1 : 8 / VPT;
}

// acc = the sum over s = 0 .. n-1, in that order, in fp32, of rank s's vectors of a row:
// `mine` for s == rank (this rank's own, from its input), else the vectors at
// rowOf(s) + 16 * (threadIdx.x + k * blockDim.x) (rowOf: the row's first byte in rank s's
// buffer, which s finished writing before the flag round the caller waited for). Vectors at
// or past H (the row's vector count) are neither loaded nor summed (acc stays 0 there). acc
// starts at +0.0, so a -0.0 input sums like +0.0, as in every other algorithm.
template <typename T, int VPT, typename RowOf>
__device__ __forceinline__ void sumRowInRankOrder(float (&acc)[VPT][8], const Vec (&mine)[VPT],
                                                  int rank, int n, int H, RowOf&& rowOf) {
  constexpr int kAtOnce = pullRanksAtOnce<VPT>();
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
#pragma unroll
    for (int q = 0; q < 8; ++q) acc[k][q] = 0.0f;
  }
  for (int s0 = 0; s0 < n; s0 += kAtOnce) {
    Vec x[kAtOnce][VPT];
#pragma unroll
    for (int u = 0; u < kAtOnce; ++u) {
      const int s = s0 + u;
      const char* row = s < n && s != rank ? rowOf(s) : nullptr;
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        const int j = static_cast<int>(threadIdx.x) + k * static_cast<int>(blockDim.x);
        x[u][k] = s == rank ? mine[k] : Vec{};
        if (row != nullptr && j < H) x[u][k].u = loadCg(row + static_cast<uint64_t>(j) * 16);
      }
    }
#pragma unroll
    for (int u = 0; u < kAtOnce; ++u) {
      if (s0 + u >= n) break;
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        const int j = static_cast<int>(threadIdx.x) + k * static_cast<int>(blockDim.x);
        if (j < H) accumulate<T>(acc[k], x[u][k]);
      }
    }
  }
}

// This thread's vectors of row `row` of `in` (rows of H vectors; `count` elements in all),
// zeros past the row; `aligned`: `in` is 16-byte aligned.
template <typename T, int VPT>
__device__ __forceinline__ void loadInputRow(const T* in, int row, int H, uint64_t count,
                                             bool aligned, Vec (&out)[VPT]) {
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int j = static_cast<int>(threadIdx.x) + k * static_cast<int>(blockDim.x);
    out[k] = Vec{};
    if (j < H) out[k] = loadRowVec(in, static_cast<uint64_t>(row) * H + j, count, aligned);
  }
}

// This thread's vectors (from loadInputRow) into `base` + 16 * (row * H + j), the row's place in
// a buffer peers read (relaxed stores: a flag round orders them).
template <int VPT>
__device__ __forceinline__ void storeRowForPeers(char* base, int row, int H, const Vec (&x)[VPT]) {
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int j = static_cast<int>(threadIdx.x) + k * static_cast<int>(blockDim.x);
    if (j < H) storeRelaxed(base + (static_cast<uint64_t>(row) * H + j) * 16, x[k].u);
  }
}

}  // namespace dev
}  // namespace anyr
