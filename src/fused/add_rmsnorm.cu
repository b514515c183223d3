// The standalone residual add + RMSNorm (+ FP8 / NVFP4) kernel: what an unfused pipeline runs
// after its all-reduce, and the epilogue of anyreduce's NCCL path. One block per row: the row
// of x is staged in shared memory as fp32 (so x may be normOut: the whole row is read before
// anything is written), then fusedRowEpilogue (fused/epilogue.cuh) does the rest, so the bits
// equal those of the fused all-reduce kernels.
//
// Block size: about two 8-element vectors per thread (hidden / 16 threads, rounded up to a
// warp, 32..1024), so an NVFP4 block of 16 elements is one thread's work and every thread has
// loads in flight. Shared memory: fusedSharedBytes(hidden), at most 69,648 bytes (hidden
// 16384); above 48 KB the kernel's dynamic shared memory limit is raised once per device.
#include <atomic>

#include "fused/epilogue.cuh"
#include "fused/fused.h"

namespace anyr {
namespace {

constexpr int kMaxThreads = 1024;
constexpr int kMaxGrid = 1 << 16;  // blocks; more rows are taken in turn by the same blocks

template <typename T>
__global__ void __launch_bounds__(kMaxThreads) addRmsNormKernel(const T* x, FusedParams p) {
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

// Raises the kernel's dynamic shared memory limit to what hidden = kFusedMaxHidden needs, once
// per device (a function attribute, not a stream operation: allowed during graph capture).
template <typename T>
cudaError_t allowLargeSmem() {
  static std::atomic<uint64_t> doneDevices{0};
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const uint64_t bit = device < 64 ? (uint64_t{1} << device) : 0;
  if (bit != 0 && (doneDevices.load(std::memory_order_acquire) & bit) != 0) return cudaSuccess;
  err = cudaFuncSetAttribute(addRmsNormKernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(fusedSharedBytes(kFusedMaxHidden)));
  if (err == cudaSuccess) doneDevices.fetch_or(bit, std::memory_order_release);
  return err;
}

template <typename T>
cudaError_t launchTyped(const void* x, const FusedParams& p, cudaStream_t stream) {
  const size_t smem = fusedSharedBytes(p.hidden);
  if (smem > 48 * 1024) {
    cudaError_t err = allowLargeSmem<T>();
    if (err != cudaSuccess) return err;
  }
  const int blocks = p.tokens < kMaxGrid ? p.tokens : kMaxGrid;
  addRmsNormKernel<T><<<blocks, addRmsNormThreads(p.hidden), smem, stream>>>(
      static_cast<const T*>(x), p);
  return cudaGetLastError();
}

}  // namespace

int addRmsNormThreads(int hidden) {
  const int threads = (hidden / kNvfp4BlockElems + 31) / 32 * 32;
  return threads < 32 ? 32 : (threads > kMaxThreads ? kMaxThreads : threads);
}

cudaError_t launchAddRmsNorm(anyrDataType_t datatype, const void* x, const FusedParams& p,
                             cudaStream_t stream) {
  if (p.tokens == 0) return cudaSuccess;
  switch (datatype) {
    case anyrBfloat16:
      return launchTyped<__nv_bfloat16>(x, p, stream);
    case anyrFloat16:
      return launchTyped<__half>(x, p, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace anyr
