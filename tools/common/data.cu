#include <cstring>

#include "common/data.h"

namespace anyr {
namespace data {

namespace {

// x as the element type, rounded to nearest even (the constructors of cuda_fp16.h and
// cuda_bf16.h: __float2half, __float2bfloat16), and an element back to float; plain for fp32.
template <typename T>
__host__ __device__ inline T fromFloat(float x) {
  return static_cast<T>(x);
}
template <typename T>
__host__ __device__ inline float toFloat(T x) {
  return static_cast<float>(x);
}

// Calls f(T{}) for the element type of t (anything not fp32 or fp16 is bf16, as everywhere in
// the tools).
template <typename F>
void forDtype(anyrDataType_t t, F&& f) {
  switch (t) {
    case anyrFloat32:
      f(float{});
      break;
    case anyrFloat16:
      f(__half{});
      break;
    default:
      f(__nv_bfloat16{});
      break;
  }
}

template <typename T>
__host__ __device__ inline T expectedAt(uint64_t i, int nranks, uint32_t seed, int mode) {
  float acc = 0.0f;
  for (int r = 0; r < nranks; ++r) acc += toFloat<T>(fromFloat<T>(genValue(mode, r, i, seed)));
  return fromFloat<T>(acc);
}

template <typename T>
__global__ void fillKernel(T* p, uint64_t count, int rank, uint32_t seed, int mode) {
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    p[i] = fromFloat<T>(genValue(mode, rank, i, seed));
  }
}

template <typename T>
__device__ inline bool sameBits(T a, T b) {
  if constexpr (sizeof(T) == 2) {
    return *reinterpret_cast<const uint16_t*>(&a) == *reinterpret_cast<const uint16_t*>(&b);
  } else {
    return *reinterpret_cast<const uint32_t*>(&a) == *reinterpret_cast<const uint32_t*>(&b);
  }
}

// Counts into *bad the elements of p[0, count) whose bits differ from what they should hold:
// with `reduced`, the sum over `ranks` ranks (expectedAt); else rank `ranks`'s own input.
template <typename T>
__global__ void mismatchKernel(const T* p, uint64_t count, bool reduced, int ranks, uint32_t seed,
                               int mode, unsigned long long* bad) {
  unsigned long long local = 0;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const T want = reduced ? expectedAt<T>(i, ranks, seed, mode)
                           : fromFloat<T>(genValue(mode, ranks, i, seed));
    local += sameBits<T>(p[i], want) ? 0 : 1;
  }
  if (local) atomicAdd(bad, local);
}

cudaError_t countMismatchesOf(anyrDataType_t t, const void* p, uint64_t count, bool reduced,
                              int ranks, uint32_t seed, int mode, unsigned long long* bad,
                              cudaStream_t s) {
  forDtype(t, [&](auto z) {
    using T = decltype(z);
    mismatchKernel<<<256, 256, 0, s>>>(static_cast<const T*>(p), count, reduced, ranks, seed, mode,
                                       bad);
  });
  return cudaGetLastError();
}

template <typename T>
void hostExpectedT(std::vector<unsigned char>& out, uint64_t count, int nranks, uint32_t seed,
                   int mode) {
  out.resize(count * sizeof(T));
  for (uint64_t i = 0; i < count; ++i) {
    T v = expectedAt<T>(i, nranks, seed, mode);
    std::memcpy(out.data() + i * sizeof(T), &v, sizeof(T));
  }
}

}  // namespace

size_t dtypeBytes(anyrDataType_t t) { return t == anyrFloat32 ? 4 : 2; }

const char* dtypeName(anyrDataType_t t) {
  return t == anyrFloat32 ? "fp32" : t == anyrFloat16 ? "fp16" : t == anyrBfloat16 ? "bf16" : "?";
}

bool parseDtype(const std::string& s, anyrDataType_t* out) {
  if (s == "fp32" || s == "float32" || s == "float")
    *out = anyrFloat32;
  else if (s == "fp16" || s == "float16" || s == "half")
    *out = anyrFloat16;
  else if (s == "bf16" || s == "bfloat16")
    *out = anyrBfloat16;
  else
    return false;
  return true;
}

cudaError_t fillInput(anyrDataType_t t, void* p, uint64_t count, int rank, uint32_t seed, int mode,
                      cudaStream_t s) {
  forDtype(t, [&](auto z) {
    using T = decltype(z);
    fillKernel<<<256, 256, 0, s>>>(static_cast<T*>(p), count, rank, seed, mode);
  });
  return cudaGetLastError();
}

cudaError_t countMismatches(anyrDataType_t t, const void* out, uint64_t count, int nranks,
                            uint32_t seed, int mode, unsigned long long* bad, cudaStream_t s) {
  return countMismatchesOf(t, out, count, true, nranks, seed, mode, bad, s);
}

cudaError_t mismatchesNow(anyrDataType_t t, const void* out, uint64_t count, int nranks,
                          uint32_t seed, int mode, unsigned long long* dScratch, cudaStream_t s,
                          unsigned long long* wrong) {
  cudaError_t e = cudaMemsetAsync(dScratch, 0, sizeof(*dScratch), s);
  if (e == cudaSuccess) e = countMismatches(t, out, count, nranks, seed, mode, dScratch, s);
  if (e == cudaSuccess) {
    e = cudaMemcpyAsync(wrong, dScratch, sizeof(*wrong), cudaMemcpyDeviceToHost, s);
  }
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  return e;
}

cudaError_t countInputChanges(anyrDataType_t t, const void* in, uint64_t count, int rank,
                              uint32_t seed, int mode, unsigned long long* bad, cudaStream_t s) {
  return countMismatchesOf(t, in, count, false, rank, seed, mode, bad, s);
}

std::vector<unsigned char> hostExpected(anyrDataType_t t, uint64_t count, int nranks, uint32_t seed,
                                        int mode) {
  std::vector<unsigned char> out;
  forDtype(t, [&](auto z) { hostExpectedT<decltype(z)>(out, count, nranks, seed, mode); });
  return out;
}

namespace {
__global__ void diffKernel(const unsigned char* a, const unsigned char* b, uint64_t n,
                           unsigned long long* count) {
  unsigned long long local = 0;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    local += a[i] != b[i] ? 1 : 0;
  }
  if (local) atomicAdd(count, local);
}
__global__ void hashKernel(const unsigned char* p, uint64_t n, unsigned long long* hash) {
  unsigned long long local = 0;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    local += mix((i << 8) ^ p[i]);  // a sum of position-keyed hashes: order-insensitive sum,
  }                                 // position-sensitive terms
  if (local) atomicAdd(hash, local);
}
}  // namespace

cudaError_t countDiffBytes(const void* a, const void* b, uint64_t bytes, unsigned long long* dCount,
                           cudaStream_t s) {
  diffKernel<<<512, 256, 0, s>>>(static_cast<const unsigned char*>(a),
                                 static_cast<const unsigned char*>(b), bytes, dCount);
  return cudaGetLastError();
}

cudaError_t hashBytes(const void* p, uint64_t bytes, unsigned long long* dHash, cudaStream_t s) {
  hashKernel<<<512, 256, 0, s>>>(static_cast<const unsigned char*>(p), bytes, dHash);
  return cudaGetLastError();
}

uint64_t fnv1a(const void* p, size_t n) {
  const unsigned char* c = static_cast<const unsigned char*>(p);
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= c[i];
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace data
}  // namespace anyr
