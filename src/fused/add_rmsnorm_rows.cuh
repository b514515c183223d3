// The standalone kernel's Rows forms (fused/fused.h, AddRmsNormForm): persistent blocks of B
// threads (a power of two, 32..512), thread t holding vectors t + k * B (k < VPT) of a row in
// registers, and the register epilogue (fusedRowEpilogueRegs), so the bits are every form's.
// Included by the two files that instantiate it: fused/add_rmsnorm_rows.cu (Rows) and
// fused/add_rmsnorm_rows_async.cu (RowsAsync), so their kernels compile in parallel.
//
// Where the time goes, and why this shape (docs/FUSED.md, "The standalone kernel"): a row's
// epilogue is a chain of dependent steps (load, add, square-sum, two butterflies around a
// barrier, normalize, store), and the first register kernel ran it with the general code (the
// quantization mode and every buffer's alignment tested at run time, a tail test per vector):
// about 250 instructions a vector against 80 here, so at many rows the SMs' issue slots, not
// memory, bound it. Here:
//  - the quantization mode and the alignment are template parameters (aligned buffers: whole
//    16-byte vectors with no tail test);
//  - x is read as T (round_T(x) = x: kEpiInputIsT) and residualOut leaves with the packed r as
//    soon as it is known (kEpiNoFailure);
//  - the weight and the quantization scale are loaded once per block, which then takes rows
//    blockIdx.x, blockIdx.x + gridDim.x, ... (as many blocks as the GPU holds at once: a launch
//    of 8192 rows pays neither 8192 block launches nor 8192 weight reads);
//  - the block is as small as keeps a thread at `maxVpt` vectors, so an SM holds several rows at
//    once and their loads overlap each other's reductions;
//  - two arrays of group sums alternate between rows: one barrier per row.
// RowsAsync also copies the block's next two rows' x and residual into shared memory (cp.async,
// no registers) while the current row is computed, so a block always has rows' loads in flight
// (up to three vectors a thread: 96 KB of stages).
#pragma once

#include "device/common.cuh"
#include "device/launch.cuh"
#include "fused/add_rmsnorm.h"
#include "fused/epilogue.cuh"
#include "fused/fused_algo.h"
#include "fused/kernel_attrs.h"

namespace anyr {
namespace rowsform {

constexpr int kMaxThreads = 512;
constexpr int kMaxVpt = dev::kFusedRegsMaxVpt;
constexpr int kMaxAsyncVpt = kAddRmsNormAsyncMaxVpt;  // 96 KB of stages at most (asyncSmemBytes)
constexpr int kEpiFlags = dev::kEpiInputIsT | dev::kEpiNoFailure;

// 16 bytes from global to shared memory, asynchronously (cp.async, not through L1, compute
// capability 8.0 on; before it, a load and a store). The caller commits, then waits.
__device__ __forceinline__ void copyAsync16(void* smem, const void* gmem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dev::sharedAddr(smem)), "l"(gmem)
               : "memory");
#else
  *static_cast<uint4*>(smem) = *static_cast<const uint4*>(gmem);
#endif
}
__device__ __forceinline__ void copyAsyncCommit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
// Every group this thread committed but the most recent one has landed and is visible to it.
__device__ __forceinline__ void copyAsyncWaitAllButLast() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group 1;" ::: "memory");
#endif
}

// Dynamic shared memory of a RowsAsync block: two stages (row parity) of x and the residual,
// VPT vectors of B threads each.
constexpr size_t asyncSmemBytes(int threads, int vpt) {
  return 2u * 2u * static_cast<size_t>(vpt) * static_cast<size_t>(threads) * 16u;
}

// RowsAsync: row `row`'s x and residual vectors of thread t (of B, VPT each) into stage `par`,
// committed as one group (an empty group where row >= tokens, so that every row of the loop
// finds the same number of groups behind its own). stage[par][0][k][t] holds x's vector
// t + k * B, stage[par][1][k][t] the residual's: consecutive threads, consecutive 16 bytes (no
// bank conflict when read back).
template <typename T, int VPT>
__device__ __forceinline__ void issueRow(uint4* stage, const T* x, const T* resIn, int row,
                                         int tokens, int par, int hidden, int nvec, int t, int B) {
  uint4* s = stage + par * 2 * VPT * B;
  const int64_t base = static_cast<int64_t>(row) * hidden;
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int v = t + k * B;
    if (v >= nvec || row >= tokens) continue;
    copyAsync16(&s[k * B + t], x + base + 8 * static_cast<int64_t>(v));
    if (resIn != nullptr) {
      copyAsync16(&s[(VPT + k) * B + t], resIn + base + 8 * static_cast<int64_t>(v));
    }
  }
  copyAsyncCommit();
}

// Registers: VPT <= 3 within 64 a thread (two blocks of 512, four of 256 or eight of 128 per
// SM); four vectors (hidden above 12288, blocks of 512) within 128.
template <typename T, int VPT, int Q, bool kAligned, bool kPrefetch>
__global__ void __launch_bounds__(kMaxThreads, VPT <= 3 ? 2 : 1)
    addRmsNormRowsKernel(const T* x, FusedParams p, int32_t releaseEarly) {
  static_assert(!kPrefetch || kAligned, "cp.async needs 16-byte aligned rows");
  __shared__ float red[2][dev::kFusedGroups];  // alternating by row
  extern __shared__ uint4 stage[];             // kPrefetch: [parity][x, residual][VPT][B]
  dev::waitForPrevious(releaseEarly);
  const int hidden = p.hidden;
  const int nvec = rowVecs(hidden);
  const int t = static_cast<int>(threadIdx.x);
  const int B = static_cast<int>(blockDim.x);
  const int tokens = p.tokens;
  const int grid = static_cast<int>(gridDim.x);
  const T* resIn = static_cast<const T*>(p.residualIn);
  const bool haveRes = resIn != nullptr;
  const bool xAligned = kAligned || dev::isAligned(x, 16);
  const bool resAligned = kAligned || dev::isAligned(resIn, 16);

  dev::Vec w[VPT];
  dev::loadRowRegs<T, VPT, kAligned>(static_cast<const T*>(p.weight), 0, hidden,
                                     kAligned || dev::isAligned(p.weight, 16), w);
  const float qscale = dev::quantScale<Q>(p);

  // RowsAsync: the block's first two rows are requested at once; each row, once it landed and
  // was read into registers, hands its stage to the row two ahead, so two rows are in flight
  // while one is computed.
  int par = 0;
  const int first = static_cast<int>(blockIdx.x);
  // Row `first + n * grid`, or `tokens` (none) past the end (no int overflow near INT_MAX).
  auto ahead = [&](int row, int n) {
    const int64_t r = static_cast<int64_t>(row) + static_cast<int64_t>(n) * grid;
    return r < tokens ? static_cast<int>(r) : tokens;
  };
  if constexpr (kPrefetch) {
    issueRow<T, VPT>(stage, x, resIn, first, tokens, 0, hidden, nvec, t, B);
    issueRow<T, VPT>(stage, x, resIn, ahead(first, 1), tokens, 1, hidden, nvec, t, B);
  }
  for (int row = first; row < tokens; row += grid, par ^= 1) {
    dev::Vec xv[VPT];
    dev::Vec res[VPT];
    if constexpr (kPrefetch) {
      copyAsyncWaitAllButLast();  // this row's group; the next row's may still be in flight
      const uint4* s = stage + par * 2 * VPT * B;
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        xv[k] = dev::Vec{};
        res[k] = dev::Vec{};
        if (t + k * B >= nvec) continue;
        xv[k].u = s[k * B + t];
        if (haveRes) res[k].u = s[(VPT + k) * B + t];
      }
      // The stage this thread just read (its own vectors only) takes the row two ahead.
      issueRow<T, VPT>(stage, x, resIn, ahead(row, 2), tokens, par, hidden, nvec, t, B);
    } else {
      dev::loadRowRegs<T, VPT, kAligned>(x, row, hidden, xAligned, xv);
      if (haveRes) {
        dev::loadRowRegs<T, VPT, kAligned>(resIn, row, hidden, resAligned, res);
      } else {
#pragma unroll
        for (int k = 0; k < VPT; ++k) res[k] = dev::Vec{};
      }
    }
    const dev::RowOutputs<T, Q, kAligned> o(p, row, qscale);
    float acc[VPT][8];
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[k][i] = dev::vecElem<T>(xv[k], i);
    }
    dev::fusedRowEpilogueRegs<T, VPT, Q, kAligned, kEpiFlags>(p, o, acc, res, w, red[par], true);
  }
}

// Launches the form (kPrefetch: RowsAsync, aligned buffers and at most kMaxAsyncVpt vectors a
// thread) with shape->threads threads of shape->vpt vectors; sets shape->blocks (every row a
// block, within what the GPU holds at once) and shape->smem. asyncWhenLooping (Rows only, the
// Auto form): where the GPU holds fewer blocks at once than there are rows, so a block takes
// several, RowsAsync runs instead where it can (shape->form says which ran).
template <bool kPrefetch>
cudaError_t launch(anyrDataType_t dtype, const void* x, const FusedParams& p, cudaStream_t stream,
                   const AddRmsNormTarget& target, AddRmsNormShape* shape,
                   bool asyncWhenLooping = false) {
  const int threads = shape->threads;
  const bool aligned = fusedBuffersAligned(x, p);
  if (kPrefetch && (!aligned || shape->vpt > kMaxAsyncVpt)) return cudaErrorInvalidValue;
  constexpr int kVpts = kPrefetch ? kMaxAsyncVpt : kMaxVpt;
  return dev::dispatchDtype<true>(dtype, [&](auto tag) {
    using T = typename decltype(tag)::T;
    const T* xt = static_cast<const T*>(x);
    return dev::dispatchCount<kVpts>(shape->vpt, [&](auto v) {
      constexpr int VPT = decltype(v)::value;
      auto go = [&](auto kernel) -> cudaError_t {
        const size_t smem = kPrefetch ? asyncSmemBytes(threads, VPT) : 0;
        cudaError_t e = cudaSuccess;
        if (smem > 48u * 1024u) {
          e = allowDynamicSmem(reinterpret_cast<const void*>(kernel), smem);
          if (e != cudaSuccess) return e;
        }
        int perSm = 1;
        e = residentBlocksPerSm(reinterpret_cast<const void*>(kernel), threads, smem, &perSm);
        if (e != cudaSuccess) return e;
        const int64_t most = static_cast<int64_t>(target.sms) * perSm;
        if constexpr (!kPrefetch) {
          if (asyncWhenLooping && aligned && VPT <= kMaxAsyncVpt && p.tokens > most) {
            shape->form = AddRmsNormForm::RowsAsync;
            return launchAddRmsNormRowsAsync(dtype, x, p, stream, target, shape);
          }
        }
        shape->blocks = static_cast<int>(p.tokens < most ? p.tokens : most);
        shape->smem = smem;
        return launchKernel(kernel, dim3(static_cast<unsigned>(shape->blocks)),
                            dim3(static_cast<unsigned>(threads)), smem, stream, target.pdl, xt, p,
                            static_cast<int32_t>(target.releaseEarly ? 1 : 0));
      };
      if constexpr (!kPrefetch) {
        if (!aligned) return go(addRmsNormRowsKernel<T, VPT, dev::kQuantAtRunTime, false, false>);
      }
      return dev::dispatchQuant(p.quant, [&](auto q) {
        return go(addRmsNormRowsKernel<T, VPT, decltype(q)::value, true, kPrefetch>);
      });
    });
  });
}

}  // namespace rowsform
}  // namespace anyr
