// libanyreduce and the CUDA runtime it brings, loaded at the first twin setup (never at load
// time: a preloaded library must not pull CUDA, NCCL or anyreduce into every process it is
// preloaded into, and by the first setup the application's own NCCL is already loaded, which
// libanyreduce's dependency on libnccl.so.2 then shares).
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "anyreduce/anyreduce.h"

namespace anyrn {

// The C functions of the runtime that cuda_runtime.h overloads with templates.
using CudaMallocFn = cudaError_t (*)(void**, size_t);
using CudaHostAllocFn = cudaError_t (*)(void**, size_t, unsigned int);

// The functions taken from libanyreduce (public API) and from its CUDA runtime: X(name, type).
#define ANYRN_ANYREDUCE_FUNCTIONS(X)                             \
  X(anyrCommInitFromNccl, decltype(&::anyrCommInitFromNccl))     \
  X(anyrCommDestroy, decltype(&::anyrCommDestroy))               \
  X(anyrCommAbort, decltype(&::anyrCommAbort))                   \
  X(anyrCommGetAsyncError, decltype(&::anyrCommGetAsyncError))   \
  X(anyrCommQueryAlgorithm, decltype(&::anyrCommQueryAlgorithm)) \
  X(anyrAllReduce, decltype(&::anyrAllReduce))                   \
  X(anyrGetErrorString, decltype(&::anyrGetErrorString))         \
  X(anyrGetLastError, decltype(&::anyrGetLastError))
#define ANYRN_CUDA_FUNCTIONS(X)                                        \
  X(cudaGetDevice, decltype(&::cudaGetDevice))                         \
  X(cudaSetDevice, decltype(&::cudaSetDevice))                         \
  X(cudaGetErrorString, decltype(&::cudaGetErrorString))               \
  X(cudaGetLastError, decltype(&::cudaGetLastError))                   \
  X(cudaStreamIsCapturing, decltype(&::cudaStreamIsCapturing))         \
  X(cudaStreamCreateWithFlags, decltype(&::cudaStreamCreateWithFlags)) \
  X(cudaStreamDestroy, decltype(&::cudaStreamDestroy))                 \
  X(cudaStreamQuery, decltype(&::cudaStreamQuery))                     \
  X(cudaMalloc, CudaMallocFn)                                          \
  X(cudaHostAlloc, CudaHostAllocFn)                                    \
  X(cudaMemsetAsync, decltype(&::cudaMemsetAsync))                     \
  X(cudaMemcpyAsync, decltype(&::cudaMemcpyAsync))

struct Anyreduce {
  std::string error;  // why it could not be used ("" when it can)
  std::string path;   // the file loaded
#define ANYRN_MEMBER(name, type) type name = nullptr;
  ANYRN_ANYREDUCE_FUNCTIONS(ANYRN_MEMBER)
  ANYRN_CUDA_FUNCTIONS(ANYRN_MEMBER)
#undef ANYRN_MEMBER
};

// Loaded once: ANYREDUCE_LIBRARY (a path; when set, the only one tried), else
// "libanyreduce.so.<major>" through this library's run path (its own folder, or the build
// folder) and the loader. error is also set when libanyreduce's own NCCL calls would not reach
// the real NCCL this library forwards to (directly or through this library): a twin then
// could be handed a communicator of another NCCL.
const Anyreduce& anyreduce();

// Makes `device` current for the scope when it is not; restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  // cudaSuccess, or why `device` could not be made current.
  cudaError_t status() const { return status_; }

 private:
  int prev_ = -1;
  cudaError_t status_ = cudaSuccess;
};

// "cudaX failed: <error string>", and the CUDA runtime's sticky last error cleared.
std::string cudaFailure(const char* what, cudaError_t e);

}  // namespace anyrn
