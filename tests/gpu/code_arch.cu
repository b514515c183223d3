#include "gpu/code_arch.h"

namespace anyr {
namespace codearch {
namespace {

__global__ void codeArchKernel(int* out) {
#ifdef __CUDA_ARCH__
  *out = __CUDA_ARCH__;
#endif
}

}  // namespace

cudaError_t deviceCodeArch(int* arch) {
  int* d = nullptr;
  cudaError_t e = cudaMalloc(&d, sizeof(int));
  if (e != cudaSuccess) return e;
  *arch = -1;
  e = cudaMemset(d, 0xff, sizeof(int));
  if (e == cudaSuccess) {
    codeArchKernel<<<1, 1>>>(d);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess) e = cudaMemcpy(arch, d, sizeof(int), cudaMemcpyDeviceToHost);
  const cudaError_t f = cudaFree(d);
  return e != cudaSuccess ? e : f;
}

}  // namespace codearch
}  // namespace anyr
