#include "fused/epilogue.cuh"
#include "gpu/encoding_kernels.h"

namespace anyr {
namespace enctest {
namespace {

__global__ void reciprocalKernel(uint32_t first, uint32_t last, unsigned long long* count,
                                 uint32_t* firstBad) {
  unsigned long long local = 0;
  const uint64_t n = static_cast<uint64_t>(last) - first + 1;
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const uint32_t bits = first + static_cast<uint32_t>(i);
    const float d = __uint_as_float(bits);
    if (__float_as_uint(dev::reciprocalNormal(d)) != __float_as_uint(__frcp_rn(d))) {
      ++local;
      atomicMin(firstBad, bits);
    }
  }
  if (local) atomicAdd(count, local);
}

}  // namespace

cudaError_t reciprocalMismatches(uint32_t firstBits, uint32_t lastBits,
                                 unsigned long long* mismatches, uint32_t* firstBad) {
  struct Out {
    unsigned long long count;
    uint32_t firstBad;
  };
  Out* d = nullptr;
  cudaError_t e = cudaMalloc(&d, sizeof(Out));
  if (e != cudaSuccess) return e;
  Out h{0, 0xffffffffu};
  e = cudaMemcpy(d, &h, sizeof(Out), cudaMemcpyHostToDevice);
  if (e == cudaSuccess) {
    reciprocalKernel<<<1024, 256>>>(firstBits, lastBits, &d->count, &d->firstBad);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess) e = cudaMemcpy(&h, d, sizeof(Out), cudaMemcpyDeviceToHost);
  cudaFree(d);
  *mismatches = h.count;
  *firstBad = h.firstBad;
  return e;
}

}  // namespace enctest
}  // namespace anyr
