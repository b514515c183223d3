// The C++ layer (include/anyreduce/anyreduce.hpp) on two ranks: a Communicator made from a
// UniqueId's bytes, typed all-reduces (bf16 in place, fp32 out of place) exact on small
// integers, the fused op bit-identical to the same call through the C API and its residual
// exact, the queries, explain, counters and the asynchronous error, a move, then destroy().
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "anyreduce/anyreduce.hpp"
#include "common/launcher.h"
#include "gpu/gpu_test_util.h"

namespace anyr {
namespace {

float smallInt(int rank, size_t i) {
  return static_cast<float>(static_cast<int>((i + 3 * rank) % 17) - 8);
}

template <typename T>
T* toDevice(const std::vector<T>& h) {
  T* d = nullptr;
  R_CUDA(cudaMalloc(&d, h.size() * sizeof(T)));
  R_CUDA(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

template <typename T>
std::vector<T> toHost(const T* d, size_t n) {
  std::vector<T> h(n);
  R_CUDA(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

int cppLayerRank(int rank, int n, const anyrUniqueId& rawId, const Report& report) {
  int failures = 0;
  auto expect = [&](bool ok, const std::string& what) {
    if (!ok) {
      ++failures;
      report("FAIL " + what + "\n");
    }
  };
  useRankGpu(rank);
  int gpus = 0;
  R_CUDA(cudaGetDeviceCount(&gpus));
  anyreduce::Communicator made(n, anyreduce::UniqueId::fromBytes(&rawId, sizeof rawId), rank,
                               anyreduce::Config().timeoutMs(20000));
  anyreduce::Communicator comm = std::move(made);  // the owner moves; the handle stays
  expect(!made && comm, "move left the handle where it was");
  expect(comm.count() == n && comm.rank() == rank && comm.device() == rank % gpus,
         "count / rank / device");
  cudaStream_t s{};
  R_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  // bf16 in place and fp32 out of place, 4099 elements of small integers: exact sums.
  const size_t count = 4099;
  std::vector<__nv_bfloat16> hb(count);
  std::vector<float> hf(count), want(count, 0.0f);
  for (size_t i = 0; i < count; ++i) {
    hb[i] = __float2bfloat16(smallInt(rank, i));
    hf[i] = smallInt(rank, i);
    for (int r = 0; r < n; ++r) want[i] += smallInt(r, i);
  }
  __nv_bfloat16* db = toDevice(hb);
  float* df = toDevice(hf);
  float* dfOut = deviceAlloc<float>(count * sizeof(float));
  comm.allReduce(db, db, count, s);
  comm.allReduce(df, dfOut, count, s);
  R_CUDA(cudaStreamSynchronize(s));
  const std::vector<__nv_bfloat16> gb = toHost(db, count);
  const std::vector<float> gf = toHost(dfOut, count);
  size_t wrongB = 0, wrongF = 0;
  for (size_t i = 0; i < count; ++i) {
    wrongB += __bfloat162float(gb[i]) != want[i];
    wrongF += gf[i] != want[i];
  }
  expect(wrongB == 0, "bf16 in place: " + std::to_string(wrongB) + " wrong");
  expect(wrongF == 0, "fp32 out of place: " + std::to_string(wrongF) + " wrong");

  // The fused op through the C++ layer and through the C API: the same bits; residual exact.
  const size_t tokens = 3, hidden = 256, m = tokens * hidden;
  std::vector<__nv_bfloat16> hp(m), hr(m), hw(hidden, __float2bfloat16(1.0f));
  std::vector<float> wantR(m, 0.0f);
  for (size_t i = 0; i < m; ++i) {
    hp[i] = __float2bfloat16(smallInt(rank, i));
    hr[i] = __float2bfloat16(smallInt(7, i));
    wantR[i] = smallInt(7, i);
    for (int r = 0; r < n; ++r) wantR[i] += smallInt(r, i);
  }
  __nv_bfloat16* dp = toDevice(hp);
  __nv_bfloat16* dr = toDevice(hr);
  __nv_bfloat16* dw = toDevice(hw);
  __nv_bfloat16 *rOut1 = nullptr, *rOut2 = nullptr, *y1 = nullptr, *y2 = nullptr;
  for (auto** p : {&rOut1, &rOut2, &y1, &y2}) R_CUDA(cudaMalloc(p, m * sizeof(__nv_bfloat16)));
  comm.allReduceAddRmsNorm(dp, dr, rOut1, dw, 1e-6f, y1, tokens, hidden, anyreduce::FusedOptions(),
                           s);
  const anyrFusedOptions_t plain = ANYR_FUSED_OPTIONS_INITIALIZER;
  R_ANYR(anyrAllReduceAddRmsNorm(dp, dr, rOut2, dw, 1e-6f, y2, tokens, hidden, anyrBfloat16, &plain,
                                 comm.get(), s),
         comm.get());
  R_CUDA(cudaStreamSynchronize(s));
  const std::vector<__nv_bfloat16> a = toHost(y1, m), b = toHost(y2, m), r1 = toHost(rOut1, m);
  expect(std::memcmp(a.data(), b.data(), m * sizeof(__nv_bfloat16)) == 0,
         "fused normOut differs from the C API's");
  size_t wrongR = 0;
  for (size_t i = 0; i < m; ++i) wrongR += __bfloat162float(r1[i]) != wantR[i];
  expect(wrongR == 0, "fused residualOut: " + std::to_string(wrongR) + " wrong");

  // Queries, explain, counters, the asynchronous error.
  expect(comm.queryAlgorithm<__nv_bfloat16>(count) != anyrAlgoAuto, "queryAlgorithm: auto");
  comm.setAlgorithm(anyrAlgoAuto);
  expect(comm.explain().find("\"nranks\"") != std::string::npos, "explain has no nranks");
  const anyrCounters_t k = comm.counters();
  unsigned long long calls = 0;
  for (const auto& perAlgo : k.calls) {
    for (unsigned long long c : perAlgo) calls += c;
  }
  expect(calls == 4 && k.fusedKernelCalls + k.fusedComposedCalls == 2,
         "counters: " + std::to_string(calls) + " calls, " +
             std::to_string(k.fusedKernelCalls + k.fusedComposedCalls) + " fused");
  comm.resetCounters();
  expect(comm.asyncError() == anyrSuccess, "asynchronous error");
  comm.throwIfAsyncError();

  for (void* p : {static_cast<void*>(db), static_cast<void*>(df), static_cast<void*>(dfOut),
                  static_cast<void*>(dp), static_cast<void*>(dr), static_cast<void*>(dw),
                  static_cast<void*>(rOut1), static_cast<void*>(rOut2), static_cast<void*>(y1),
                  static_cast<void*>(y2)}) {
    R_CUDA(cudaFree(p));
  }
  R_CUDA(cudaStreamDestroy(s));
  comm.destroy();
  expect(!comm, "destroy() left a handle");
  return failures == 0 ? 0 : 1;
}

TEST(CppLayerGpu, TwoRanksThroughTheCppLayer) {
  REQUIRE_GPU();
  const auto results =
      runRanksCatching(2, 300, [](int rank, int n, const anyrUniqueId& id, const Report& report) {
        try {
          return cppLayerRank(rank, n, id, report);
        } catch (const anyreduce::Error& e) {
          report(std::string("FAIL anyreduce::Error ") + std::to_string(e.code()) + ": " +
                 e.what() + "\n");
          return 3;
        }
      });
  expectRanksPassed(results);
}

}  // namespace
}  // namespace anyr
