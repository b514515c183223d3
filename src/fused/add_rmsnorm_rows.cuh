// The standalone kernel's Rows forms (fused/fused.h, AddRmsNormForm): persistent blocks of B
// threads (a power of two, 32..512), thread t holding vectors t + k * B (k < VPT) of a row in
// registers, and the register epilogue (fusedRowEpilogueRegs), so the bits are every form's.
// Instantiated by fused/add_rmsnorm_rows.cu.
//
// Where the time goes, and why this shape (docs/FUSED.md, "The standalone kernel"): a row's
// epilogue is a chain of dependent steps (load, add, square-sum, two butterflies around a
// barrier, normalize, store), and the first register kernel ran it with the general code (the
// quantization mode and every buffer's alignment tested at run time, a tail test per vector):
// about 250 instructions a vector against 80 here, so at many rows the SMs' issue slots, not
// memory, bound it. Here:
//  - the quantization mode and the alignment are template parameters (aligned buffers: whole
//    16-byte vectors with no tail test);
//  - x is read as T (round_T(x) = x: kEpiInputIsT), for bf16 with the unquantized output the
//    residual added to it on the packed vectors, one instruction per pair (packedAdd: the fp32
//    add's bits), and residualOut leaves with the packed r as soon as it is known (kEpiNoFailure);
//  - the weight and the quantization scale are loaded once per block, which then takes rows
//    blockIdx.x, blockIdx.x + gridDim.x, ... (as many blocks as the GPU holds at once: a launch
//    of 8192 rows pays neither 8192 block launches nor 8192 weight reads);
//  - the block is as small as keeps a thread at `maxVpt` vectors, so an SM holds several rows at
//    once and their loads overlap each other's reductions;
//  - two arrays of group sums alternate between rows: one barrier per row.
#pragma once

#include "device/common.cuh"
#include "device/launch.cuh"
#include "fused/add_rmsnorm.h"
#include "fused/epilogue.cuh"
#include "fused/fused_algo.h"
#include "fused/kernel_attrs.h"

namespace anyr {
namespace rowsform {

constexpr int kMaxThreads = kAddRmsNormRowThreads;
constexpr int kMaxVpt = dev::kFusedRegsMaxVpt;
constexpr int kEpiFlags = dev::kEpiInputIsT | dev::kEpiNoFailure;

// Where the residual is added on the packed vectors (dev::addVec, kEpiXIsR) instead of in fp32:
// bf16 with the unquantized output, where it measured no slower at any shape and up to 6% faster
// at 128 and 512 tokens (docs/PERFORMANCE.md, "Fused shapes"). For fp16 and the quantized
// outputs the same bits measured slower at some shapes, so those keep the fp32 add.
template <typename T, int Q>
__host__ __device__ constexpr bool packedAdd() {
  return Q == anyrQuantNone && std::is_same_v<T, __nv_bfloat16>;
}

// Registers: VPT <= 3 within 64 a thread (two blocks of 512, four of 256 or eight of 128 per
// SM); four vectors (hidden above 12288, blocks of 512) within 128.
template <typename T, int VPT, int Q, bool kAligned, bool kHints = false>
__global__ void __launch_bounds__(kMaxThreads, VPT <= 3 ? 2 : 1)
    addRmsNormRowsKernel(const T* x, FusedParams p, int32_t releaseEarly) {
  __shared__ float red[2][dev::kFusedGroups];  // alternating by row
  dev::waitForPrevious(releaseEarly);
  const int hidden = p.hidden;
  const int tokens = p.tokens;
  const int grid = static_cast<int>(gridDim.x);
  const T* resIn = static_cast<const T*>(p.residualIn);
  const bool haveRes = resIn != nullptr;
  const bool xAligned = kAligned || dev::isAligned(x, 16);
  const bool resAligned = kAligned || dev::isAligned(resIn, 16);

  // kHints (AddRmsNormLaunch::hints, aligned buffers only): x and the residual are read
  // once (evict first), the weight by every row (evict last).
  static_assert(!kHints || kAligned, "cache hints only for aligned buffers");
  constexpr dev::LoadHint kStream = kHints ? dev::LoadHint::Stream : dev::LoadHint::Plain;
  constexpr dev::LoadHint kKeep = kHints ? dev::LoadHint::Keep : dev::LoadHint::Plain;
  dev::Vec w[VPT];
  dev::loadRowRegs<T, VPT, kAligned, kKeep>(static_cast<const T*>(p.weight), 0, hidden,
                                            kAligned || dev::isAligned(p.weight, 16), w);
  const float qscale = dev::quantScale<Q>(p);

  int par = 0;
  const int first = static_cast<int>(blockIdx.x);
  for (int row = first; row < tokens; row += grid, par ^= 1) {
    dev::Vec xv[VPT];
    dev::Vec res[VPT];
    dev::loadRowRegs<T, VPT, kAligned, kStream>(x, row, hidden, xAligned, xv);
    if (haveRes) {
      dev::loadRowRegs<T, VPT, kAligned, kStream>(resIn, row, hidden, resAligned, res);
    } else {
#pragma unroll
      for (int k = 0; k < VPT; ++k) res[k] = dev::Vec{};
    }
    const dev::RowOutputs<T, Q, kAligned> o(p, row, qscale);
    // packedAdd: r = round_T(x + residual) on the packed vectors (kEpiXIsR), and res becomes r.
    constexpr bool kPacked = packedAdd<T, Q>();
    float acc[VPT][8];
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      if constexpr (kPacked) res[k] = haveRes ? dev::addVec<T>(xv[k], res[k]) : xv[k];
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[k][i] = dev::vecElem<T>(kPacked ? res[k] : xv[k], i);
    }
    constexpr int kFlags = kEpiFlags | (kPacked ? dev::kEpiXIsR : 0);
    dev::fusedRowEpilogueRegs<T, VPT, Q, kAligned, kFlags>(p, o, acc, res, w, red[par], true);
  }
}

// Launches the Rows form with shape->threads threads of shape->vpt vectors; sets shape->blocks
// (every row a block, within what the GPU holds at once, or within kAddRmsNormMaxGrid for the
// per-row grid: target.grid, addRmsNormRowsPerRow) and shape->smem (none).
inline cudaError_t launch(anyrDataType_t dtype, const void* x, const FusedParams& p,
                          cudaStream_t stream, const AddRmsNormTarget& target,
                          AddRmsNormShape* shape) {
  const int threads = shape->threads;
  const bool aligned = fusedBuffersAligned(x, p);
  return dev::dispatchDtype<true>(dtype, [&](auto tag) {
    using T = typename decltype(tag)::T;
    const T* xt = static_cast<const T*>(x);
    return dev::dispatchCount<kMaxVpt>(shape->vpt, [&](auto v) {
      constexpr int VPT = decltype(v)::value;
      auto go = [&](auto kernel) -> cudaError_t {
        int perSm = 1;
        cudaError_t e =
            residentBlocksPerSm(reinterpret_cast<const void*>(kernel), threads, 0, &perSm);
        if (e != cudaSuccess) return e;
        const int64_t resident = static_cast<int64_t>(target.sms) * perSm;
        const bool perRow =
            target.grid == AddRmsNormGrid::PerRow ||
            (target.grid == AddRmsNormGrid::Auto && addRmsNormRowsPerRow(p.tokens, resident));
        const int64_t most = perRow ? kAddRmsNormMaxGrid : resident;
        shape->blocks = static_cast<int>(p.tokens < most ? p.tokens : most);
        shape->smem = 0;
        return launchKernel(kernel, dim3(static_cast<unsigned>(shape->blocks)),
                            dim3(static_cast<unsigned>(threads)), 0, stream, target.pdl, xt, p,
                            addRmsNormReleaseArg(target, shape->blocks));
      };
      if (!aligned) return go(addRmsNormRowsKernel<T, VPT, dev::kQuantAtRunTime, false>);
      // The cache-hint variant is compiled for the unquantized output only (a measurement).
      if (target.cacheHints && p.quant == anyrQuantNone) {
        shape->cacheHints = true;
        return go(addRmsNormRowsKernel<T, VPT, anyrQuantNone, true, true>);
      }
      return dev::dispatchQuant(p.quant, [&](auto q) {
        return go(addRmsNormRowsKernel<T, VPT, decltype(q)::value, true>);
      });
    });
  });
}

}  // namespace rowsform
}  // namespace anyr
