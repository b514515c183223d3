// Launching a register-resident fused kernel (CUDA sources only): the fused one-shot push and
// the fused two-shot push's register form share this dispatch. A kernel family is a struct
// with `kMaxVpt` and `template <typename T, int VPT, int Q, bool kAligned> static auto kernel()`
// returning the kernel's address; every kernel takes (AllReduceArgs, FusedParams, rowBase,
// rows) and runs fusedThreads(hidden) threads a block (or the launch's own count: a power of
// two that divides kFusedSlots, fusedRowEpilogueRegs's rule), each holding VPT vectors of a row.
// Aligned buffers (fusedBuffersAligned) get one kernel per quantization mode, others one
// general kernel that reads the mode at run time and checks each buffer's alignment.
#pragma once

#include "device/launch.cuh"
#include "fused/epilogue.cuh"
#include "fused/fused_algo.h"

namespace anyr {
namespace rowsdetail {

template <typename Family, typename T, int Q, bool kAligned>
cudaError_t launchVpt(int vpt, const AllReduceArgs& a, const FusedParams& p, int rowBase, int rows,
                      int blocks, int threads, cudaStream_t stream, bool pdl) {
  return dev::dispatchCount<Family::kMaxVpt>(vpt, [&](auto v) {
    return launchKernel(Family::template kernel<T, decltype(v)::value, Q, kAligned>(), dim3(blocks),
                        dim3(threads), 0, stream, pdl, a, p, rowBase, rows);
  });
}

template <typename Family, typename T>
cudaError_t launchTyped(const AllReduceArgs& a, const FusedParams& p, int rowBase, int rows,
                        int blocks, int threadsWanted, cudaStream_t stream, bool pdl) {
  const int threads = threadsWanted > 0 ? threadsWanted : fusedThreads(p.hidden);
  const int vpt = rowVecsPerThread(p.hidden, threads);
  if (!fusedBuffersAligned(a.input, p)) {
    return launchVpt<Family, T, dev::kQuantAtRunTime, false>(vpt, a, p, rowBase, rows, blocks,
                                                             threads, stream, pdl);
  }
  return dev::dispatchQuant(p.quant, [&](auto q) {
    return launchVpt<Family, T, decltype(q)::value, true>(vpt, a, p, rowBase, rows, blocks, threads,
                                                          stream, pdl);
  });
}

}  // namespace rowsdetail

// Launches Family's kernel for `dtype` (fp16 or bf16), `threads` a block (0: fusedThreads).
template <typename Family>
cudaError_t launchRowsInRegisters(anyrDataType_t dtype, const AllReduceArgs& a,
                                  const FusedParams& p, int rowBase, int rows, int blocks,
                                  cudaStream_t stream, bool pdl, int threads = 0) {
  return dev::dispatchDtype<true>(dtype, [&](auto tag) {
    return rowsdetail::launchTyped<Family, typename decltype(tag)::T>(a, p, rowBase, rows, blocks,
                                                                      threads, stream, pdl);
  });
}

}  // namespace anyr
