#include "fused/epilogue.cuh"
#include "fused/fused.h"
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

__global__ void e2m1Kernel(unsigned long long* count, uint32_t* firstBad) {
  unsigned long long local = 0;
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < (1ull << 32);
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const uint32_t bits = static_cast<uint32_t>(i);
    const float v = __uint_as_float(bits);
    bool bad = false;
    if (v == v) bad = e2m1MagnitudeF(v) != static_cast<float>(e2m1CodeNotNaN(v) & 7u);
    float q[8];
    uint32_t want = 0;
    for (int k = 0; k < 8; ++k) {
      uint32_t b = bits + static_cast<uint32_t>(k) * 0x00010003u;
      if (k % 4 == 3) b ^= 0x80000000u;
      q[k] = __uint_as_float(b);
      if (q[k] != q[k]) q[k] = -0.0f;
      want |= e2m1CodeNotNaN(q[k]) << (4 * k);
    }
    bad = bad || e2m1Pack8(q) != want;
    if (bad) {
      ++local;
      atomicMin(firstBad, bits);
    }
  }
  if (local) atomicAdd(count, local);
}

template <typename T>
__global__ void packedAddKernel(unsigned long long* count, uint32_t* firstBad) {
  unsigned long long local = 0;
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < (1ull << 32);
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const uint32_t a = static_cast<uint32_t>(i >> 16);
    const uint32_t b = static_cast<uint32_t>(i & 0xFFFFu);
    dev::Vec x{}, y{};
    x.w[0] = a | (b << 16);
    y.w[0] = b | (a << 16);
    const uint32_t got = dev::addPair<T>(x.w[0], y.w[0]);
    // The fp32 path the packed add replaces: widen (vecElem), add, round the pair (packPair).
    const uint32_t want = dev::packPair<T>(dev::vecElem<T>(x, 0) + dev::vecElem<T>(y, 0),
                                           dev::vecElem<T>(x, 1) + dev::vecElem<T>(y, 1));
    if (got != want) {
      ++local;
      atomicMin(firstBad, static_cast<uint32_t>(i));
    }
  }
  if (local) atomicAdd(count, local);
}

struct Out {
  unsigned long long count;
  uint32_t firstBad;
};

// Runs `launch(count, firstBad)` on fresh counters and copies them back.
template <typename Launch>
cudaError_t countMismatches(Launch launch, unsigned long long* mismatches, uint32_t* firstBad) {
  Out* d = nullptr;
  cudaError_t e = cudaMalloc(&d, sizeof(Out));
  if (e != cudaSuccess) return e;
  Out h{0, 0xffffffffu};
  e = cudaMemcpy(d, &h, sizeof(Out), cudaMemcpyHostToDevice);
  if (e == cudaSuccess) {
    launch(&d->count, &d->firstBad);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess) e = cudaMemcpy(&h, d, sizeof(Out), cudaMemcpyDeviceToHost);
  cudaFree(d);
  *mismatches = h.count;
  *firstBad = h.firstBad;
  return e;
}

}  // namespace

cudaError_t e2m1Mismatches(unsigned long long* mismatches, uint32_t* firstBad) {
  return countMismatches(
      [](unsigned long long* c, uint32_t* f) { e2m1Kernel<<<4096, 256>>>(c, f); }, mismatches,
      firstBad);
}

cudaError_t packedAddMismatches(bool bf16, unsigned long long* mismatches, uint32_t* firstBad) {
  return countMismatches(
      [&](unsigned long long* c, uint32_t* f) {
        if (bf16) {
          packedAddKernel<__nv_bfloat16><<<4096, 256>>>(c, f);
        } else {
          packedAddKernel<__half><<<4096, 256>>>(c, f);
        }
      },
      mismatches, firstBad);
}

cudaError_t reciprocalMismatches(uint32_t firstBits, uint32_t lastBits,
                                 unsigned long long* mismatches, uint32_t* firstBad) {
  return countMismatches(
      [&](unsigned long long* c, uint32_t* f) {
        reciprocalKernel<<<1024, 256>>>(firstBits, lastBits, c, f);
      },
      mismatches, firstBad);
}

}  // namespace enctest
}  // namespace anyr
