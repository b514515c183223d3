// The standalone residual add + RMSNorm (+ FP8 / NVFP4) kernel: what an unfused pipeline runs
// after its all-reduce, and the epilogue of anyreduce's NCCL path. One block per row: the row
// of x is staged in shared memory as fp32 (so x may be normOut: the whole row is read before
// anything is written), then fusedRowEpilogue (fused/epilogue.cuh) does the rest, so the bits
// equal those of the fused all-reduce kernels.
//
// Block size: hidden / 16 threads, rounded up to a warp, 32..1024: two 8-element vectors per
// thread in each phase, so every thread has loads in flight. Shared memory:
// fusedSharedBytes(hidden), at most 69,648 bytes (hidden 16384); the kernel's dynamic shared
// memory limit is raised once per device (launchWithSmem).
#include "fused/epilogue.cuh"
#include "fused/fused.h"
#include "fused/launch.cuh"

namespace anyr {

// Dynamic shared memory of this file's kernels, at most (scripts/check-smem.py reads the line):
// anyr-dynamic-smem-max: 69648
static_assert(fusedSharedBytes(kFusedMaxHidden) == 69648, "update anyr-dynamic-smem-max");
namespace {

constexpr int kMaxThreads = 1024;
constexpr int kMaxGrid = 1 << 16;  // blocks; more rows are taken in turn by the same blocks

// (kMaxThreads, 1): one block of 1024 may use 64 registers a thread; without the 1, ptxas for
// sm_80 aimed at two such blocks (32 registers) and spilled.
template <typename T>
__global__ void __launch_bounds__(kMaxThreads, 1) addRmsNormKernel(const T* x, FusedParams p) {
  extern __shared__ float4 fusedSmem[];
  float* xs = reinterpret_cast<float*>(fusedSmem);
  float* red = xs + p.hidden;
  const int hidden = p.hidden;
  const int nvec = hidden / 8;
  const bool aligned = dev::isAligned(x, 16);
  for (int row = blockIdx.x; row < p.tokens; row += gridDim.x) {
    const T* xr = x + static_cast<int64_t>(row) * hidden;
    for (int v = threadIdx.x; v < nvec; v += blockDim.x) {
      const dev::Vec xv = dev::loadRowVec(xr, v, hidden, aligned);
      const T* e = reinterpret_cast<const T*>(&xv);
      float f[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) f[i] = dev::Elem<T>::toFloat(e[i]);
      dev::storeXs8(xs, v, f);
    }
    __syncthreads();
    dev::fusedRowEpilogue<T>(p, row, xs, red);
  }
}

template <typename T>
cudaError_t launchTyped(const void* x, const FusedParams& p, cudaStream_t stream, int threads) {
  const int blocks = p.tokens < kMaxGrid ? p.tokens : kMaxGrid;
  return launchWithSmem(addRmsNormKernel<T>, blocks, threads, fusedSharedBytes(p.hidden),
                        fusedSharedBytes(kFusedMaxHidden), stream, static_cast<const T*>(x), p);
}

}  // namespace

int addRmsNormThreads(int hidden) {
  const int threads = (hidden / kNvfp4BlockElems + 31) / 32 * 32;
  return threads < 32 ? 32 : (threads > kMaxThreads ? kMaxThreads : threads);
}

cudaError_t launchAddRmsNorm(anyrDataType_t datatype, const void* x, const FusedParams& p,
                             cudaStream_t stream, int threads) {
  if (p.tokens == 0) return cudaSuccess;
  if (threads == 0) threads = addRmsNormThreads(p.hidden);
  if (threads % 32 != 0 || threads < 32 || threads > kMaxThreads) return cudaErrorInvalidValue;
  switch (datatype) {
    case anyrBfloat16:
      return launchTyped<__nv_bfloat16>(x, p, stream, threads);
    case anyrFloat16:
      return launchTyped<__half>(x, p, stream, threads);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace anyr
