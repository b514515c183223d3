#include <cuda_bf16.h>

#include "common/data.h"
#include "doctor_kernels.h"

namespace anyr {
namespace doctor {

namespace {

__global__ void fillKernel(__nv_bfloat16* p, size_t n, uint32_t seed, float scale) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint32_t h = data::mix((static_cast<uint64_t>(seed) << 40) ^ i);
    const float u = static_cast<float>(h & 0xffffffu) / 16777216.0f;  // [0, 1)
    p[i] = __float2bfloat16((2.0f * u - 1.0f) * scale);
  }
}

__global__ void siluMulKernel(const __nv_bfloat16* gu, __nv_bfloat16* out, size_t rows,
                              size_t inter) {
  const size_t n = rows * inter;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t r = i / inter, j = i % inter;
    const float g = __bfloat162float(gu[r * 2 * inter + j]);
    const float u = __bfloat162float(gu[r * 2 * inter + inter + j]);
    out[i] = __float2bfloat16(g / (1.0f + __expf(-g)) * u);
  }
}

__global__ void combineKernel(const __nv_bfloat16* y, size_t yRows, const __nv_bfloat16* shared,
                              __nv_bfloat16* out, size_t batch, size_t hidden, int k) {
  const size_t n = batch * hidden;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t b = i / hidden, h = i % hidden;
    float acc = 0;
    for (int j = 0; j < k; ++j) {
      acc += __bfloat162float(y[((b * k + j) % yRows) * hidden + h]);
    }
    acc /= static_cast<float>(k);
    if (shared != nullptr) acc += __bfloat162float(shared[i]);
    out[i] = __float2bfloat16(acc);
  }
}

int gridFor(size_t n) {
  const size_t blocks = (n + 255) / 256;
  return static_cast<int>(blocks < 4096 ? (blocks == 0 ? 1 : blocks) : 4096);
}

}  // namespace

cudaError_t fillUniformBf16(void* p, size_t n, uint32_t seed, float scale, cudaStream_t s) {
  fillKernel<<<gridFor(n), 256, 0, s>>>(static_cast<__nv_bfloat16*>(p), n, seed, scale);
  return cudaGetLastError();
}

cudaError_t siluMulBf16(const void* gu, void* out, size_t rows, size_t inter, cudaStream_t s) {
  siluMulKernel<<<gridFor(rows * inter), 256, 0, s>>>(
      static_cast<const __nv_bfloat16*>(gu), static_cast<__nv_bfloat16*>(out), rows, inter);
  return cudaGetLastError();
}

cudaError_t moeCombineBf16(const void* y, size_t yRows, const void* shared, void* out, size_t batch,
                           size_t hidden, int k, cudaStream_t s) {
  combineKernel<<<gridFor(batch * hidden), 256, 0, s>>>(
      static_cast<const __nv_bfloat16*>(y), yRows, static_cast<const __nv_bfloat16*>(shared),
      static_cast<__nv_bfloat16*>(out), batch, hidden, k);
  return cudaGetLastError();
}

}  // namespace doctor
}  // namespace anyr
