#include "algo/selftest_kernels.h"
#include "device/common.cuh"

namespace anyr {
namespace {

template <typename T>
__global__ void selfTestFillKernel(T* p, uint64_t count, int rank) {
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    p[i] = dev::Elem<T>::fromFloat(rank < 0 ? 1.0f : selfTestValue(rank, i));
  }
}

template <typename T>
__global__ void selfTestCheckKernel(const T* out, uint64_t count, int nranks,
                                    SelfCheckResult* res) {
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const float got = dev::Elem<T>::toFloat(out[i]);
    const float want = selfTestExpected(nranks, i);
    // Exact comparison; NaN (the poison) compares unequal.
    if (!(got == want)) {
      atomicAdd(&res->wrong, 1ull);
      atomicMin(&res->firstBad, static_cast<unsigned long long>(i));
    }
  }
}

// One thread: records the value at the first wrong index (after the check kernel).
template <typename T>
__global__ void selfTestFirstKernel(const T* out, int nranks, SelfCheckResult* res) {
  if (res->wrong != 0) {
    res->got = dev::Elem<T>::toFloat(out[res->firstBad]);
    res->want = selfTestExpected(nranks, res->firstBad);
  }
}

template <typename T>
cudaError_t fillT(void* p, uint64_t count, int rank, cudaStream_t s) {
  const int blocks = static_cast<int>(count / 256 + 1 < 1024 ? count / 256 + 1 : 1024);
  selfTestFillKernel<T><<<blocks, 256, 0, s>>>(static_cast<T*>(p), count, rank);
  return cudaGetLastError();
}

template <typename T>
cudaError_t checkT(const void* out, uint64_t count, int nranks, SelfCheckResult* res,
                   cudaStream_t s) {
  const int blocks = static_cast<int>(count / 256 + 1 < 1024 ? count / 256 + 1 : 1024);
  selfTestCheckKernel<T><<<blocks, 256, 0, s>>>(static_cast<const T*>(out), count, nranks, res);
  selfTestFirstKernel<T><<<1, 1, 0, s>>>(static_cast<const T*>(out), nranks, res);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launchSelfTestFill(anyrDataType_t dtype, void* p, uint64_t count, int rank,
                               cudaStream_t s) {
  return dev::dispatchDtype(
      dtype, [&](auto tag) { return fillT<typename decltype(tag)::T>(p, count, rank, s); });
}

cudaError_t launchSelfTestCheck(anyrDataType_t dtype, const void* out, uint64_t count, int nranks,
                                SelfCheckResult* res, cudaStream_t s) {
  return dev::dispatchDtype(dtype, [&](auto tag) {
    return checkT<typename decltype(tag)::T>(out, count, nranks, res, s);
  });
}

}  // namespace anyr
