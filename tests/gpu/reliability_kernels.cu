#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/data.h"
#include "gpu/reliability_kernels.h"

namespace anyr {
namespace reltest {
namespace {

__global__ void bytesNotKernel(const unsigned char* p, uint64_t bytes, unsigned char value,
                               unsigned long long* dCount) {
  unsigned long long local = 0;
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < bytes;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    if (p[i] != value) ++local;
  }
  if (local) atomicAdd(dCount, local);
}

template <typename T>
__device__ float toF(T x);
template <>
__device__ float toF<__half>(__half x) {
  return __half2float(x);
}
template <>
__device__ float toF<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

template <typename T>
__global__ void residualKernel(const T* out, uint64_t count, int nranks, uint32_t seed,
                               int residRank, uint32_t residSeed, unsigned long long* dCount) {
  unsigned long long local = 0;
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    float sum = 0.0f;
    for (int r = 0; r < nranks; ++r) sum += data::genValue(data::kSmallInts, r, i, seed);
    const float want = sum + data::genValue(data::kSmallInts, residRank, i, residSeed);
    if (!(toF<T>(out[i]) == want)) ++local;
  }
  if (local) atomicAdd(dCount, local);
}

}  // namespace

cudaError_t countBytesNot(const void* p, uint64_t bytes, unsigned char value,
                          unsigned long long* dCount, cudaStream_t s) {
  bytesNotKernel<<<64, 256, 0, s>>>(static_cast<const unsigned char*>(p), bytes, value, dCount);
  return cudaGetLastError();
}

cudaError_t countResidualMismatches(anyrDataType_t t, const void* residualOut, uint64_t count,
                                    int nranks, uint32_t seed, int residRank, uint32_t residSeed,
                                    unsigned long long* dCount, cudaStream_t s) {
  switch (t) {
    case anyrFloat16:
      residualKernel<<<256, 256, 0, s>>>(static_cast<const __half*>(residualOut), count, nranks,
                                         seed, residRank, residSeed, dCount);
      break;
    case anyrBfloat16:
      residualKernel<<<256, 256, 0, s>>>(static_cast<const __nv_bfloat16*>(residualOut), count,
                                         nranks, seed, residRank, residSeed, dCount);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace reltest
}  // namespace anyr
