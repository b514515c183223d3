#include "gpu/nccl_watchdog_kernels.h"

namespace anyr {
namespace wdtest {
namespace {

__device__ uint64_t globalNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void stallKernel(const volatile int* release, uint64_t maxNs) {
  const uint64_t start = globalNs();
  while (*release == 0 && globalNs() - start < maxNs) __nanosleep(1000);
}

}  // namespace

cudaError_t launchStall(const volatile int* release, uint64_t maxNs, cudaStream_t s) {
  stallKernel<<<1, 1, 0, s>>>(release, maxNs);
  return cudaGetLastError();
}

}  // namespace wdtest
}  // namespace anyr
