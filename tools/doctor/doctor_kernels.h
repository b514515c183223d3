// Elementwise kernels of the synthetic decode step (bf16). Launchers return the launch error.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace anyr {
namespace doctor {

// p[i] = uniform in [-scale, scale), a function of (seed, i).
cudaError_t fillUniformBf16(void* p, size_t n, uint32_t seed, float scale, cudaStream_t s);
// out[r, j] = silu(gu[r, j]) * gu[r, inter + j] for rows x inter (gu rows are 2*inter wide).
cudaError_t siluMulBf16(const void* gu, void* out, size_t rows, size_t inter, cudaStream_t s);
// MoE combine (synthetic routing): out[b, :] = shared[b, :] (if any) + 1/k * sum over the k
// slots j of y[(b*k + j) % yRows, :]. y: yRows x hidden expert outputs.
cudaError_t moeCombineBf16(const void* y, size_t yRows, const void* shared, void* out, size_t batch,
                           size_t hidden, int k, cudaStream_t s);

}  // namespace doctor
}  // namespace anyr
