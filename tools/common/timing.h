// Timing and error helpers shared by the benchmarks of the command-line tool and the doctor.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
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

// The communicator's counters.
inline anyrCounters_t readCounters(anyrComm_t comm) {
  anyrCounters_t c;
  std::memset(&c, 0, sizeof(c));
  c.size = sizeof(c);
  c.magic = ANYR_COUNTERS_MAGIC;
  BENCH_ANYR(anyrCommGetCounters(comm, &c), comm);
  return c;
}

// The cluster sizes (1: a block per row; 2, 4, 8) of the fused-kernel launches between two
// counter readings, smallest first and "/"-separated ("2", "1/8"); "" if none ran.
inline std::string clusterSizesRan(const anyrCounters_t& before, const anyrCounters_t& after) {
  std::string sizes;
  for (int i = 0; i < 4; ++i) {
    if (after.fusedLaunchesByCluster[i] != before.fusedLaunchesByCluster[i])
      sizes += (sizes.empty() ? "" : "/") + std::to_string(1 << i);
  }
  return sizes;
}

// Which path the anyreduce calls between two counter readings took, from the library's
// counters: the algorithms that ran, and whether fused calls ran as one fused kernel or
// composed (all-reduce + the separate add + RMSNorm kernel).
inline std::string pathOf(const anyrCounters_t& before, const anyrCounters_t& after) {
  std::string p;
  for (int a = 1; a < anyrNumAlgos; ++a) {
    unsigned long long n = 0;
    for (int b = 0; b < ANYR_COUNTER_BUCKETS; ++b) n += after.calls[a][b] - before.calls[a][b];
    if (n > 0)
      p += (p.empty() ? "" : " + ") + std::string(anyrAlgoName(static_cast<anyrAlgo_t>(a)));
  }
  const auto fk = after.fusedKernelCalls - before.fusedKernelCalls;
  const auto fc = after.fusedComposedCalls - before.fusedComposedCalls;
  if (fk > 0 && fc == 0) {
    // The kernel's cluster sizes, where clusters ran ("clusters of 8"; several: "2/8").
    const std::string sizes = clusterSizesRan(before, after);
    p += sizes.empty() || sizes == "1" ? " (fused kernel)"
                                       : " (fused kernel, clusters of " + sizes + ")";
  }
  if (fc > 0 && fk == 0) p += " + add+RMSNorm kernel (composed)";
  if (fc > 0 && fk > 0) p += " (fused kernel and composed)";
  return p.empty() ? "none" : p;
}

}  // namespace tool
}  // namespace anyr
