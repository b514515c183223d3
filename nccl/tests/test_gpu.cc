// libanyreduce_nccl.so over the real NCCL: two processes, one GPU each (NCCL refuses two ranks
// on one GPU: "Duplicate GPU detected"), so this needs two GPUs and is skipped with fewer. The
// application's side is plain NCCL calls through the library (dlopen, as a server's NCCL
// wrapper loads it): eager all-reduces served by the twin and exact, one captured into a CUDA
// graph and replayed with new inputs, a large one (served or forwarded, exact), an all-gather
// (forwarded), the asynchronous error query and destroy.
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <nccl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "anyreduce/anyreduce.h"
#include "anyreduce_nccl.h"

namespace {

struct Shared {
  std::atomic<int> ready;
  ncclUniqueId id;
};

// The GPU count, asked in a child process (CUDA must not be initialized before the ranks fork).
int gpuCount() {
  const pid_t pid = fork();
  if (pid == 0) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    _exit(n > 100 ? 100 : n);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 0;
}

#define FAIL_IF(cond, ...)                     \
  do {                                         \
    if (cond) {                                \
      std::fprintf(stderr, "rank %d: ", rank); \
      std::fprintf(stderr, __VA_ARGS__);       \
      std::fprintf(stderr, "\n");              \
      return 1;                                \
    }                                          \
  } while (0)
#define CUDA_OK(expr) FAIL_IF((expr) != cudaSuccess, "%s failed", #expr)
#define NCCL_OK(expr) FAIL_IF((expr) != ncclSuccess, "%s failed", #expr)

template <typename T>
T lookup(void* handle, const char* name) {
  return reinterpret_cast<T>(dlsym(handle, name));
}

int rankMain(int rank, Shared* shared) {
  void* lib = dlopen(ANYRN_TEST_SHIM, RTLD_NOW | RTLD_LOCAL);
  FAIL_IF(lib == nullptr, "dlopen: %s", dlerror());
  auto getUniqueId = lookup<decltype(&ncclGetUniqueId)>(lib, "ncclGetUniqueId");
  auto initRank = lookup<decltype(&ncclCommInitRank)>(lib, "ncclCommInitRank");
  auto allReduce = lookup<decltype(&ncclAllReduce)>(lib, "ncclAllReduce");
  auto allGather = lookup<decltype(&ncclAllGather)>(lib, "ncclAllGather");
  auto asyncError = lookup<decltype(&ncclCommGetAsyncError)>(lib, "ncclCommGetAsyncError");
  auto destroy = lookup<decltype(&ncclCommDestroy)>(lib, "ncclCommDestroy");
  auto getTwin = lookup<decltype(&anyrNcclCommGetTwin)>(lib, "anyrNcclCommGetTwin");
  FAIL_IF(
      !getUniqueId || !initRank || !allReduce || !allGather || !asyncError || !destroy || !getTwin,
      "a function is missing");
  CUDA_OK(cudaSetDevice(rank));
  if (rank == 0) {
    NCCL_OK(getUniqueId(&shared->id));
    shared->ready.store(1);
  } else {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (shared->ready.load() == 0 && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    FAIL_IF(shared->ready.load() == 0, "no unique id from rank 0");
  }
  ncclComm_t comm = nullptr;
  NCCL_OK(initRank(&comm, 2, shared->id, rank));
  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  // Small integers: every sum is exact, in any order.
  const size_t count = 4096;
  std::vector<float> in(count), out(count);
  float* dIn = nullptr;
  float* dOut = nullptr;
  CUDA_OK(cudaMalloc(&dIn, count * sizeof(float)));
  CUDA_OK(cudaMalloc(&dOut, count * sizeof(float)));
  for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>(i % 13 + rank);
  CUDA_OK(cudaMemcpy(dIn, in.data(), count * sizeof(float), cudaMemcpyHostToDevice));
  NCCL_OK(allReduce(dIn, dOut, count, ncclFloat, ncclSum, comm, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  CUDA_OK(cudaMemcpy(out.data(), dOut, count * sizeof(float), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < count; ++i) {
    FAIL_IF(out[i] != static_cast<float>(2 * (i % 13) + 1), "fp32 element %zu: %f", i, out[i]);
  }
  anyrComm_t twin = nullptr;
  FAIL_IF(getTwin(comm, &twin) != anyrSuccess || twin == nullptr,
          "the all-reduce was not served by a twin");
  void* anyreduce = dlopen("libanyreduce.so.0", RTLD_LAZY | RTLD_NOLOAD);
  FAIL_IF(anyreduce == nullptr, "libanyreduce is not loaded");
  auto counters = lookup<decltype(&anyrCommGetCounters)>(anyreduce, "anyrCommGetCounters");
  FAIL_IF(counters == nullptr, "no anyrCommGetCounters");

  // fp16, in place.
  std::vector<__half> hin(count), hout(count);
  __half* dHalf = nullptr;
  CUDA_OK(cudaMalloc(&dHalf, count * sizeof(__half)));
  for (size_t i = 0; i < count; ++i) hin[i] = __float2half(static_cast<float>(i % 7 + rank));
  CUDA_OK(cudaMemcpy(dHalf, hin.data(), count * sizeof(__half), cudaMemcpyHostToDevice));
  NCCL_OK(allReduce(dHalf, dHalf, count, ncclHalf, ncclSum, comm, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  CUDA_OK(cudaMemcpy(hout.data(), dHalf, count * sizeof(__half), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < count; ++i) {
    FAIL_IF(__half2float(hout[i]) != static_cast<float>(2 * (i % 7) + 1), "fp16 element %zu", i);
  }

  // Captured into a CUDA graph, replayed with new inputs.
  const size_t small = 1024;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  NCCL_OK(allReduce(dIn, dOut, small, ncclFloat, ncclSum, comm, stream));
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int k = 0; k < 3; ++k) {
    for (size_t i = 0; i < small; ++i) in[i] = static_cast<float>(i % 5 + rank + k);
    CUDA_OK(cudaMemcpy(dIn, in.data(), small * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_OK(cudaGraphLaunch(exec, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    CUDA_OK(cudaMemcpy(out.data(), dOut, small * sizeof(float), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < small; ++i) {
      FAIL_IF(out[i] != static_cast<float>(2 * (i % 5 + k) + 1), "graph replay %d element %zu", k,
              i);
    }
  }
  anyrCounters_t c{};
  c.size = sizeof(c);
  c.magic = ANYR_COUNTERS_MAGIC;
  FAIL_IF(counters(twin, &c) != anyrSuccess, "anyrCommGetCounters failed");
  auto query = lookup<decltype(&anyrCommQueryAlgorithm)>(anyreduce, "anyrCommQueryAlgorithm");
  anyrAlgo_t algo = anyrAlgoNccl;
  FAIL_IF(query == nullptr || query(twin, small, anyrFloat32, &algo) != anyrSuccess,
          "anyrCommQueryAlgorithm failed");
  // Served unless anyreduce's own choice at that size is NCCL (then forwarded, NCCL captures it).
  FAIL_IF(algo != anyrAlgoNccl && c.capturedCalls == 0,
          "the captured all-reduce was not served by the twin");

  // Large: anyreduce's choice (its own algorithm, or NCCL through the application's
  // communicator), exact either way.
  const size_t large = size_t(16) << 20;
  float* dLarge = nullptr;
  CUDA_OK(cudaMalloc(&dLarge, large * sizeof(float)));
  std::vector<float> big(large);
  for (size_t i = 0; i < large; ++i) big[i] = static_cast<float>(i % 3 + rank);
  CUDA_OK(cudaMemcpy(dLarge, big.data(), large * sizeof(float), cudaMemcpyHostToDevice));
  NCCL_OK(allReduce(dLarge, dLarge, large, ncclFloat, ncclSum, comm, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  CUDA_OK(cudaMemcpy(big.data(), dLarge, large * sizeof(float), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < large; ++i) {
    FAIL_IF(big[i] != static_cast<float>(2 * (i % 3) + 1), "large element %zu", i);
  }

  // An all-gather: NCCL's.
  for (size_t i = 0; i < small; ++i) in[i] = static_cast<float>(rank * 1000 + i);
  CUDA_OK(cudaMemcpy(dIn, in.data(), small * sizeof(float), cudaMemcpyHostToDevice));
  NCCL_OK(allGather(dIn, dOut, small, ncclFloat, comm, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  CUDA_OK(cudaMemcpy(out.data(), dOut, 2 * small * sizeof(float), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < 2 * small; ++i) {
    FAIL_IF(out[i] != static_cast<float>((i / small) * 1000 + i % small), "all-gather %zu", i);
  }

  ncclResult_t err = ncclInternalError;
  NCCL_OK(asyncError(comm, &err));
  FAIL_IF(err != ncclSuccess, "asynchronous error %d", static_cast<int>(err));
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  NCCL_OK(destroy(comm));
  return 0;
}

TEST(NcclCompatGpu, TwoRanksServedExactInAGraphAndForwardedElsewhere) {
  if (gpuCount() < 2) GTEST_SKIP() << "needs two GPUs (NCCL refuses two ranks on one GPU)";
  auto* shared = static_cast<Shared*>(
      mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(shared, MAP_FAILED);
  shared->ready.store(0);
  std::vector<pid_t> pids;
  for (int rank = 0; rank < 2; ++rank) {
    const pid_t pid = fork();
    if (pid == 0) _exit(rankMain(rank, shared));
    pids.push_back(pid);
  }
  for (int rank = 0; rank < 2; ++rank) {
    int status = 0;
    waitpid(pids[static_cast<size_t>(rank)], &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "rank " << rank << " failed";
  }
  munmap(shared, sizeof(Shared));
}

}  // namespace
