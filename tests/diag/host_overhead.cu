// anyr_host_overhead: the host time of one eager call, and of the CUDA runtime calls it is
// made of. Each rank (forked; rank r on GPU r % GPUs, so one GPU is enough: what is measured is
// the host's time, not the GPU's) times, with steady_clock around rounds of 50 calls and a
// stream synchronization between rounds (so a full launch queue never stalls the host), the
// median per call of 15 rounds, for:
//   an empty kernel launch (<<<>>>), the same through cudaLaunchKernelEx with the programmatic
//   stream serialization attribute (as the library launches where its probe admits it),
//   cudaEventRecord, cudaPointerGetAttributes, cudaStreamIsCapturing, cudaStreamGetDevice,
//   cudaGetDevice, and anyrAllReduce (--elements bf16 elements, in place) and
//   anyrAllReduceAddRmsNorm (1 x 6144 bf16, residual in place), the automatic choice.
// Every rank prints its table; the anyreduce calls run in the same order on every rank.
//
//   anyr_host_overhead [--ranks N] [--elements E]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "anyreduce/anyreduce.h"
#include "common/launcher.h"
#include "diag_check.h"

namespace {

__global__ void emptyKernel() {}

constexpr int kCalls = 50;
constexpr int kRounds = 15;

// Median over rounds of the host microseconds per call of `call`.
double hostMicros(cudaStream_t s, const std::function<void()>& call) {
  for (int i = 0; i < 20; ++i) call();
  (void)cudaStreamSynchronize(s);
  std::vector<double> us;
  for (int r = 0; r < kRounds; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kCalls; ++i) call();
    const auto t1 = std::chrono::steady_clock::now();
    us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / kCalls);
    (void)cudaStreamSynchronize(s);
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

int rankMain(int rank, int nranks, const anyrUniqueId& id, size_t elements,
             const std::function<void(const std::string&)>& report) {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
    report("no GPU");
    return 1;
  }
  const int dev = rank % gpus;
  if (cudaSetDevice(dev) != cudaSuccess) return 1;
  cudaStream_t s{};
  if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) return 1;
  anyrComm_t comm = nullptr;
  if (anyrCommInitRank(&comm, nranks, id, rank) != anyrSuccess) {
    report(std::string("init: ") + anyrGetLastError(nullptr));
    return 1;
  }
  const size_t hidden = 6144;
  void *x = nullptr, *partial = nullptr, *residual = nullptr, *weight = nullptr, *norm = nullptr;
  cudaEvent_t ev{};
  const auto bad = [](cudaError_t e) { return e != cudaSuccess; };
  if (bad(cudaMalloc(&x, elements * 2)) || bad(cudaMalloc(&partial, hidden * 2)) ||
      bad(cudaMalloc(&residual, hidden * 2)) || bad(cudaMalloc(&weight, hidden * 2)) ||
      bad(cudaMalloc(&norm, hidden * 2)) ||
      bad(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming))) {
    report("allocation failed");
    return 1;
  }
  (void)cudaMemset(x, 0, elements * 2);
  (void)cudaMemset(partial, 0, hidden * 2);
  (void)cudaMemset(residual, 0, hidden * 2);
  (void)cudaMemset(weight, 0, hidden * 2);
  (void)cudaDeviceSynchronize();

  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(1);
  cfg.blockDim = dim3(32);
  cfg.stream = s;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  anyrResult_t failed = anyrSuccess;
  std::vector<std::pair<const char*, std::function<void()>>> rows = {
      {"empty kernel <<<1, 32>>>", [&] { emptyKernel<<<1, 32, 0, s>>>(); }},
      {"cudaLaunchKernelEx, programmatic serialization",
       [&] { (void)cudaLaunchKernelEx(&cfg, emptyKernel); }},
      {"cudaEventRecord", [&] { (void)cudaEventRecord(ev, s); }},
      {"cudaPointerGetAttributes",
       [&] {
         cudaPointerAttributes a{};
         (void)cudaPointerGetAttributes(&a, x);
       }},
      {"cudaStreamIsCapturing",
       [&] {
         cudaStreamCaptureStatus c{};
         (void)cudaStreamIsCapturing(s, &c);
       }},
      {"cudaStreamGetDevice",
       [&] {
         int d = 0;
         (void)cudaStreamGetDevice(s, &d);
       }},
      {"cudaGetDevice",
       [&] {
         int d = 0;
         (void)cudaGetDevice(&d);
       }},
      {"anyrAllReduce",
       [&] {
         const anyrResult_t r = anyrAllReduce(x, x, elements, anyrBfloat16, anyrSum, comm, s);
         if (r != anyrSuccess) failed = r;
       }},
      {"anyrAllReduceAddRmsNorm (1 x 6144)",
       [&] {
         const anyrResult_t r =
             anyrAllReduceAddRmsNorm(partial, residual, residual, weight, 1e-6f, norm, 1, hidden,
                                     anyrBfloat16, nullptr, comm, s);
         if (r != anyrSuccess) failed = r;
       }},
  };
  std::string table = "rank " + std::to_string(rank) + " (GPU " + std::to_string(dev) +
                      "): host us per call, median of " + std::to_string(kRounds) + " rounds of " +
                      std::to_string(kCalls) + "\n";
  for (const auto& [name, call] : rows) {
    const double us = hostMicros(s, call);
    char line[160];
    std::snprintf(line, sizeof line, "  %-50s %8.2f\n", name, us);
    table += line;
  }
  (void)cudaStreamSynchronize(s);
  if (failed != anyrSuccess) {
    report(std::string("an anyreduce call failed: ") + anyrGetLastError(comm));
    return 1;
  }
  const anyrResult_t d = anyrCommDestroy(comm);
  std::fputs(table.c_str(), stdout);
  std::fflush(stdout);
  return d == anyrSuccess ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  int nranks = 2;
  size_t elements = 4096;
  for (int i = 1; i < argc; i += 2) {
    if (!diagHasValue("anyr_host_overhead", i, argc, argv)) return 2;
    if (std::strcmp(argv[i], "--ranks") == 0) {
      nranks = std::atoi(argv[i + 1]);
    } else if (std::strcmp(argv[i], "--elements") == 0) {
      elements = std::strtoull(argv[i + 1], nullptr, 10);
    } else {
      std::fprintf(stderr, "anyr_host_overhead: unknown argument '%s'\n", argv[i]);
      return 2;
    }
  }
  if (nranks < 2 || nranks > 8 || elements == 0) {
    std::fprintf(stderr, "anyr_host_overhead: --ranks must be 2..8, --elements > 0\n");
    return 2;
  }
  const auto results = anyr::launch::runRanks(
      nranks,
      [&](int rank, int n, const anyrUniqueId& id,
          const std::function<void(const std::string&)>& report) {
        return rankMain(rank, n, id, elements, report);
      },
      120.0);
  const std::string failures = anyr::launch::describeFailures(results);
  if (!failures.empty()) {
    std::fprintf(stderr, "anyr_host_overhead: %s\n", failures.c_str());
    return 1;
  }
  return 0;
}
