// Timing and error helpers shared by the benchmarks of the command-line tool.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "anyreduce/anyreduce.h"

#define BENCH_CUDA(expr)                                                            \
  do {                                                                              \
    cudaError_t e_ = (expr);                                                        \
    if (e_ != cudaSuccess) {                                                        \
      throw std::runtime_error(std::string(#expr) + ": " + cudaGetErrorString(e_)); \
    }                                                                               \
  } while (0)
#define BENCH_ANYR(expr, comm)                                                             \
  do {                                                                                     \
    anyrResult_t r_ = (expr);                                                              \
    if (r_ != anyrSuccess) {                                                               \
      throw std::runtime_error(std::string(#expr) + ": " + anyrGetErrorString(r_) + ": " + \
                               anyrGetLastError(comm));                                    \
    }                                                                                      \
  } while (0)

namespace anyr {
namespace tool {

// Times `calls` invocations of `fn` per sample; median of `samples` samples, microseconds/call.
template <typename F>
double timeCalls(F fn, cudaStream_t s, bool graph, int calls, int samples, int warmup) {
  cudaEvent_t a, b;
  BENCH_CUDA(cudaEventCreate(&a));
  BENCH_CUDA(cudaEventCreate(&b));
  std::vector<float> ms;
  cudaGraphExec_t exec = nullptr;
  if (graph) {
    cudaGraph_t g;
    BENCH_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < calls; ++i) fn();
    BENCH_CUDA(cudaStreamEndCapture(s, &g));
    BENCH_CUDA(cudaGraphInstantiate(&exec, g, 0));
    BENCH_CUDA(cudaGraphDestroy(g));
  }
  auto once = [&] {
    if (graph) {
      BENCH_CUDA(cudaGraphLaunch(exec, s));
    } else {
      for (int i = 0; i < calls; ++i) fn();
    }
  };
  for (int i = 0; i < warmup; ++i) once();
  for (int i = 0; i < samples; ++i) {
    BENCH_CUDA(cudaEventRecord(a, s));
    once();
    BENCH_CUDA(cudaEventRecord(b, s));
    BENCH_CUDA(cudaEventSynchronize(b));
    float t = 0;
    BENCH_CUDA(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  if (exec) BENCH_CUDA(cudaGraphExecDestroy(exec));
  BENCH_CUDA(cudaEventDestroy(a));
  BENCH_CUDA(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return 1000.0 * ms[ms.size() / 2] / calls;
}

}  // namespace tool
}  // namespace anyr
