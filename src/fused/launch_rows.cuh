// Launching a register-resident fused kernel (CUDA sources only): the fused one-shot push and
// the fused two-shot push's register form share this dispatch. A kernel family is a struct
// with `kMaxVpt` and `template <typename T, int VPT, int Q, bool kAligned> static auto kernel()`
// returning the kernel's address; every kernel takes (AllReduceArgs, FusedParams, rowBase,
// rows) and runs fusedThreads(hidden) threads a block (or the launch's own count: a power of
// two that divides kFusedSlots, fusedRowEpilogueRegs's rule), each holding VPT vectors of a row.
// Aligned buffers (fusedBuffersAligned) get one kernel per quantization mode, others one
// general kernel that reads the mode at run time and checks each buffer's alignment.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "device/launch.cuh"
#include "fused/epilogue.cuh"
#include "fused/fused_algo.h"

namespace anyr {
namespace rowsdetail {

template <typename Family, typename T, int Q, bool kAligned, int VPT = 1>
cudaError_t launchVpt(int vpt, const AllReduceArgs& a, const FusedParams& p, int rowBase, int rows,
                      int blocks, int threads, cudaStream_t stream, bool pdl) {
  if constexpr (VPT > Family::kMaxVpt) {
    return cudaErrorInvalidValue;
  } else {
    if (vpt == VPT) {
      return launchKernel(Family::template kernel<T, VPT, Q, kAligned>(), dim3(blocks),
                          dim3(threads), 0, stream, pdl, a, p, rowBase, rows);
    }
    return launchVpt<Family, T, Q, kAligned, VPT + 1>(vpt, a, p, rowBase, rows, blocks, threads,
                                                      stream, pdl);
  }
}

template <typename Family, typename T>
cudaError_t launchTyped(const AllReduceArgs& a, const FusedParams& p, int rowBase, int rows,
                        int blocks, int threadsWanted, cudaStream_t stream, bool pdl) {
  const int threads = threadsWanted > 0 ? threadsWanted : fusedThreads(p.hidden);
  const int vpt = (p.hidden / 8 + threads - 1) / threads;
  auto go = [&](auto q, auto aligned) {
    return launchVpt<Family, T, decltype(q)::value, decltype(aligned)::value>(
        vpt, a, p, rowBase, rows, blocks, threads, stream, pdl);
  };
  using Yes = std::true_type;
  if (!fusedBuffersAligned(a.input, p)) {
    return go(std::integral_constant<int, dev::kQuantAtRunTime>{}, std::false_type{});
  }
  switch (p.quant) {
    case anyrQuantNone:
      return go(std::integral_constant<int, anyrQuantNone>{}, Yes{});
    case anyrQuantFp8:
      return go(std::integral_constant<int, anyrQuantFp8>{}, Yes{});
    case anyrQuantNvfp4:
      return go(std::integral_constant<int, anyrQuantNvfp4>{}, Yes{});
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace rowsdetail

// Launches Family's kernel for `dtype` (fp16 or bf16), `threads` a block (0: fusedThreads).
template <typename Family>
cudaError_t launchRowsInRegisters(anyrDataType_t dtype, const AllReduceArgs& a,
                                  const FusedParams& p, int rowBase, int rows, int blocks,
                                  cudaStream_t stream, bool pdl, int threads = 0) {
  switch (dtype) {
    case anyrFloat16:
      return rowsdetail::launchTyped<Family, __half>(a, p, rowBase, rows, blocks, threads, stream,
                                                     pdl);
    case anyrBfloat16:
      return rowsdetail::launchTyped<Family, __nv_bfloat16>(a, p, rowBase, rows, blocks, threads,
                                                            stream, pdl);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace anyr
