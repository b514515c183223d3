#include "device/common.cuh"
#include "gpu/stream_order_kernels.h"

namespace anyr {
namespace ordertest {
namespace {

constexpr int kMaxCopies = 4;
struct Copies {
  Copy c[kMaxCopies];
};

__global__ void copyLateKernel(Copies copies, int n, size_t n16, uint64_t delayNs) {
  dev::releaseDependents();
  const uint64_t t0 = dev::globalTimerNs();
  while (dev::globalTimerNs() - t0 < delayNs) {
  }
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (int k = 0; k < n; ++k) {
    uint4* dst = static_cast<uint4*>(copies.c[k].dst);
    const uint4* src = static_cast<const uint4*>(copies.c[k].src);
    for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n16;
         i += stride) {
      dst[i] = src[i];
    }
  }
}

}  // namespace

cudaError_t copyLate(const Copy* copies, int n, size_t bytes, uint64_t delayNs, cudaStream_t s) {
  if (n < 0 || n > kMaxCopies || bytes % 16 != 0) return cudaErrorInvalidValue;
  Copies all{};
  for (int k = 0; k < n; ++k) all.c[k] = copies[k];
  copyLateKernel<<<8, 256, 0, s>>>(all, n, bytes / 16, delayNs);
  return cudaGetLastError();
}

}  // namespace ordertest
}  // namespace anyr
