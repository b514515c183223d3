// One rank of `anyreduce doctor`: a synthetic tensor-parallel decode step (cuBLAS bf16 GEMMs in
// a real model's shapes and order), timed as CUDA graphs in two modes:
//   baseline:  ncclAllReduce + anyreduce's standalone add+RMSNorm kernel (what servers run);
//   anyreduce: anyrAllReduceAddRmsNorm (the dispatched fused path).
// Each rank writes its figures and NVML samples to a file; the parent merges them (doctor_main).
#include "doctor_run.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <stdexcept>

#include "common/api.h"
#include "common/progress.h"
#include "common/timing.h"
#include "doctor.h"
#include "doctor_kernels.h"
#include "nvml_sampler.h"

namespace anyr {
namespace doctor {

namespace {

using nlohmann::json;
using tool::pathOf;
using tool::readCounters;

#define DOC_CUBLAS(expr)                                                                       \
  do {                                                                                         \
    cublasStatus_t st_ = (expr);                                                               \
    if (st_ != CUBLAS_STATUS_SUCCESS) {                                                        \
      throw std::runtime_error(std::string(#expr) + ": cuBLAS status " + std::to_string(st_)); \
    }                                                                                          \
  } while (0)

void* dalloc(size_t bytes, std::vector<void*>* owned) {
  void* p = nullptr;
  BENCH_CUDA(cudaMalloc(&p, std::max<size_t>(bytes, 256)));
  owned->push_back(p);
  return p;
}

// Expected number of distinct experts hit by `batch` tokens routed uniformly to k of E.
int activeExperts(int experts, int topk, int batch) {
  const double e = experts * (1.0 - std::pow(1.0 - static_cast<double>(topk) / experts, batch));
  return std::max(topk, std::min(experts, static_cast<int>(std::lround(e))));
}

struct Step {
  // Per-rank dimensions.
  int H = 0, qkvN = 0, oK = 0, interD = 0, interE = 0, interS = 0, E = 0, k = 0;
  const ModelShape* shape = nullptr;
  // Weights: [2] sets alternate by layer parity so consecutive layers do not hit in L2.
  void *wqkv[2] = {}, *wo[2] = {}, *wgu[2] = {}, *wd[2] = {}, *wr[2] = {}, *wgus[2] = {},
       *wds[2] = {};
  void *wgue = nullptr, *wde = nullptr, *normW = nullptr;
  // Activations (max batch).
  void *hn = nullptr, *residual = nullptr, *partial = nullptr, *x = nullptr, *qkv = nullptr,
       *gu = nullptr, *act = nullptr, *y = nullptr, *sharedOut = nullptr, *logits = nullptr;
  cublasHandle_t blas = nullptr;
  anyrComm_t comm = nullptr;
  ncclComm_t nccl = nullptr;
  cudaStream_t s = nullptr;
  anyrFusedOptions_t fo = ANYR_FUSED_OPTIONS_INITIALIZER;

  // Y[M,N] = X[M,K] (row stride ldx) * W^T, W row-major [N,K] (a Linear's weight).
  void gemm(const void* X, int ldx, const void* W, void* Y, int M, int N, int K) {
    const float one = 1.0f, zero = 0.0f;
    DOC_CUBLAS(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, W, CUDA_R_16BF, K, X,
                            CUDA_R_16BF, ldx, &zero, Y, CUDA_R_16BF, N, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
  }
  // nAct experts, each on m rows of X (synthetic routing: the first m rows).
  void expertGemm(const void* X, long long strideX, const void* W, void* Y, int m, int N, int K,
                  int nAct) {
    const float one = 1.0f, zero = 0.0f;
    DOC_CUBLAS(cublasGemmStridedBatchedEx(
        blas, CUBLAS_OP_T, CUBLAS_OP_N, N, m, K, &one, W, CUDA_R_16BF, K,
        static_cast<long long>(N) * K, X, CUDA_R_16BF, K, strideX, &zero, Y, CUDA_R_16BF, N,
        static_cast<long long>(m) * N, nAct, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }

  void commBlock(bool baseline, int B) {
    const size_t n = static_cast<size_t>(B) * H;
    if (baseline) {
      ncclResult_t r = ncclAllReduce(partial, x, n, ncclBfloat16, ncclSum, nccl, s);
      auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (r == ncclInProgress && std::chrono::steady_clock::now() < until) {
        if (ncclCommGetAsyncError(nccl, &r) != ncclSuccess) break;
      }
      if (r != ncclSuccess) {
        throw std::runtime_error(std::string("ncclAllReduce: ") + ncclGetErrorString(r));
      }
      BENCH_ANYR(
          anyrAddRmsNorm(x, residual, residual, normW, 1e-5f, hn, B, H, anyrBfloat16, &fo, s),
          comm);
    } else {
      BENCH_ANYR(anyrAllReduceAddRmsNorm(partial, residual, residual, normW, 1e-5f, hn, B, H,
                                         anyrBfloat16, &fo, comm, s),
                 comm);
    }
  }

  // One decode step of all layers: compute and/or communication blocks.
  void enqueue(int B, bool baseline, bool compute, bool communicate) {
    const ModelShape& m = *shape;
    for (int l = 0; l < m.layers; ++l) {
      const int w = l % 2;
      if (compute) {
        gemm(hn, H, wqkv[w], qkv, B, qkvN, H);
        // Attention itself (KV-cache reads, softmax) is not modelled: the Q slice stands in for
        // its output, which the row-parallel output projection consumes.
        gemm(qkv, qkvN, wo[w], partial, B, H, oK);
      }
      if (communicate) commBlock(baseline, B);
      if (compute) {
        if (!m.moe || l < m.denseLayers) {
          gemm(hn, H, wgu[w], gu, B, 2 * interD, H);
          BENCH_CUDA(siluMulBf16(gu, act, B, interD, s));
          gemm(act, interD, wd[w], partial, B, H, interD);
        } else {
          gemm(hn, H, wr[w], logits, B, E, H);  // router (replicated)
          const void* shared = nullptr;
          if (interS > 0) {
            gemm(hn, H, wgus[w], gu, B, 2 * interS, H);
            BENCH_CUDA(siluMulBf16(gu, act, B, interS, s));
            gemm(act, interS, wds[w], sharedOut, B, H, interS);
            shared = sharedOut;
          }
          const int nAct = activeExperts(m.experts, m.topk, B);
          const int rows = (B * m.topk + nAct - 1) / nAct;
          expertGemm(hn, 0, wgue, gu, rows, 2 * interE, H, nAct);
          BENCH_CUDA(siluMulBf16(gu, act, static_cast<size_t>(rows) * nAct, interE, s));
          expertGemm(act, static_cast<long long>(rows) * interE, wde, y, rows, H, interE, nAct);
          BENCH_CUDA(moeCombineBf16(y, static_cast<size_t>(rows) * nAct, shared, partial, B, H,
                                    m.topk, s));
        }
      }
      if (communicate) commBlock(baseline, B);
    }
  }

  cudaGraphExec_t capture(const std::function<void()>& body) {
    cudaGraph_t g;
    BENCH_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    body();
    BENCH_CUDA(cudaStreamEndCapture(s, &g));
    cudaGraphExec_t exec;
    BENCH_CUDA(cudaGraphInstantiate(&exec, g, 0));
    BENCH_CUDA(cudaGraphDestroy(g));
    return exec;
  }

  // Median microseconds per replay.
  double timeGraph(cudaGraphExec_t exec, int samples, int warmup) {
    cudaEvent_t a, b;
    BENCH_CUDA(cudaEventCreate(&a));
    BENCH_CUDA(cudaEventCreate(&b));
    for (int i = 0; i < warmup; ++i) BENCH_CUDA(cudaGraphLaunch(exec, s));
    std::vector<float> ms;
    for (int i = 0; i < samples; ++i) {
      BENCH_CUDA(cudaEventRecord(a, s));
      BENCH_CUDA(cudaGraphLaunch(exec, s));
      BENCH_CUDA(cudaEventRecord(b, s));
      BENCH_CUDA(cudaEventSynchronize(b));
      float t = 0;
      BENCH_CUDA(cudaEventElapsedTime(&t, a, b));
      ms.push_back(t);
    }
    BENCH_CUDA(cudaEventDestroy(a));
    BENCH_CUDA(cudaEventDestroy(b));
    std::sort(ms.begin(), ms.end());
    return 1000.0 * ms[ms.size() / 2];
  }

  // Rank 0's value on every rank (so every rank launches the same number of collectives).
  int agree(int v, int rank, float* dScratch) {
    float f = rank == 0 ? static_cast<float>(v) : 0.0f;
    BENCH_CUDA(cudaMemcpyAsync(dScratch, &f, sizeof(f), cudaMemcpyHostToDevice, s));
    BENCH_ANYR(anyrAllReduce(dScratch, dScratch, 1, anyrFloat32, anyrSum, comm, s), comm);
    BENCH_CUDA(cudaMemcpyAsync(&f, dScratch, sizeof(f), cudaMemcpyDeviceToHost, s));
    BENCH_CUDA(cudaStreamSynchronize(s));
    return static_cast<int>(f);
  }
};

json countersJson(const anyrCounters_t& c) {
  static const char* kBuckets[ANYR_COUNTER_BUCKETS] = {"<4K",     "4K-16K", "16K-64K", "64K-256K",
                                                       "256K-1M", "1M-4M",  "4M-16M",  ">=16M"};
  json calls = json::object(), bytes = json::object();
  for (int a = 1; a < anyrNumAlgos; ++a) {
    for (int b = 0; b < ANYR_COUNTER_BUCKETS; ++b) {
      if (c.calls[a][b] == 0) continue;
      const char* n = anyrAlgoName(static_cast<anyrAlgo_t>(a));
      calls[n][kBuckets[b]] = c.calls[a][b];
      bytes[n][kBuckets[b]] = c.bytes[a][b];
    }
  }
  return {{"calls", calls},
          {"bytes", bytes},
          {"fusedKernelCalls", c.fusedKernelCalls},
          {"fusedComposedCalls", c.fusedComposedCalls},
          {"forcedCalls", c.forcedCalls},
          {"capturedCalls", c.capturedCalls}};
}

}  // namespace

json samplesJson(const json& gpu, const std::vector<Sample>& samples) {
  json s = {{"gpu", gpu},
            {"t", json::array()},
            {"powerW", json::array()},
            {"smMHz", json::array()},
            {"util", json::array()}};
  for (const Sample& x : samples) {
    s["t"].push_back(x.t);
    s["powerW"].push_back(x.powerW);
    s["smMHz"].push_back(x.smMHz);
    s["util"].push_back(x.utilPct);
  }
  return s;
}

int doctorRank(const RunOptions& o, int rank, int nranks, const anyrUniqueId& id, int ngpus,
               double t0, const std::string& rankFile) {
  void* ncclVoid = nullptr;
  Step st;
  st.comm = tool::openRankComm(rank, nranks, id, ngpus, o.timeoutMs, -1, o.comm, &ncclVoid);
  st.nccl = static_cast<ncclComm_t>(ncclVoid);
  if (st.nccl == nullptr) {
    throw std::runtime_error(
        "the baseline needs NCCL, and this communicator has no NCCL "
        "communicator");
  }
  const ModelShape& m = o.shape;
  const int shard = o.shardAs > 0 ? o.shardAs : nranks;
  st.shape = &m;
  st.H = m.hidden;
  const int qh = std::max(1, m.heads / shard), kvh = std::max(1, m.kvHeads / shard);
  st.qkvN = (qh + 2 * kvh) * m.headDim;
  st.oK = qh * m.headDim;
  st.interD = std::max(1, m.intermediate / shard);
  st.interE = m.moe ? std::max(1, m.moeIntermediate / shard) : 0;
  st.interS = m.moe ? st.interE * m.sharedExperts : 0;
  st.E = m.experts;
  st.k = m.topk;
  int maxB = 1;
  for (int b : o.batches) maxB = std::max(maxB, b);
  for (int b : o.sweepTokens) maxB = std::max(maxB, b);
  int maxAct = 0, maxRowsAct = 0;
  if (m.moe) {
    for (int b : o.batches) {  // the sweep runs communication only
      const int a = activeExperts(m.experts, m.topk, b);
      maxAct = std::max(maxAct, a);
      maxRowsAct = std::max(maxRowsAct, a * ((b * m.topk + a - 1) / a));
    }
  }
  const size_t H = m.hidden;
  std::vector<void*> owned;
  BENCH_CUDA(cudaStreamCreateWithFlags(&st.s, cudaStreamNonBlocking));
  DOC_CUBLAS(cublasCreate(&st.blas));
  DOC_CUBLAS(cublasSetStream(st.blas, st.s));
  void* ws = dalloc(64u << 20, &owned);
  DOC_CUBLAS(cublasSetWorkspace(st.blas, ws, 64u << 20));
  uint32_t seed = 1000 + static_cast<uint32_t>(rank) * 100;
  auto weight = [&](size_t elems) {
    void* p = dalloc(elems * 2, &owned);
    BENCH_CUDA(fillUniformBf16(p, elems, seed++, 0.02f, st.s));
    return p;
  };
  const bool anyDense = !m.moe || m.denseLayers > 0;
  for (int w = 0; w < 2; ++w) {
    st.wqkv[w] = weight(static_cast<size_t>(st.qkvN) * H);
    st.wo[w] = weight(H * st.oK);
    if (anyDense) {
      st.wgu[w] = weight(2 * static_cast<size_t>(st.interD) * H);
      st.wd[w] = weight(H * st.interD);
    }
    if (m.moe) {
      st.wr[w] = weight(static_cast<size_t>(m.experts) * H);
      if (st.interS > 0) {
        st.wgus[w] = weight(2 * static_cast<size_t>(st.interS) * H);
        st.wds[w] = weight(H * st.interS);
      }
    }
  }
  if (m.moe) {
    st.wgue = weight(static_cast<size_t>(maxAct) * 2 * st.interE * H);
    st.wde = weight(static_cast<size_t>(maxAct) * H * st.interE);
  }
  st.normW = weight(H);
  const size_t bh = static_cast<size_t>(maxB) * H;
  st.hn = weight(bh);
  st.residual = weight(bh);
  st.partial = weight(bh);
  st.x = dalloc(bh * 2, &owned);
  st.qkv = dalloc(static_cast<size_t>(maxB) * st.qkvN * 2, &owned);
  const size_t guRows = std::max<size_t>(maxB, maxRowsAct);
  const size_t guCols = std::max({st.interD, st.interE, st.interS});
  st.gu = dalloc(guRows * 2 * guCols * 2, &owned);
  st.act = dalloc(guRows * guCols * 2, &owned);
  st.y = dalloc(std::max<size_t>(maxRowsAct, 1) * H * 2, &owned);
  st.sharedOut = dalloc(bh * 2, &owned);
  st.logits = dalloc(static_cast<size_t>(maxB) * std::max(1, m.experts) * 2, &owned);
  float* dScratch = static_cast<float*>(dalloc(64, &owned));
  BENCH_CUDA(cudaStreamSynchronize(st.s));

  // This rank's GPU in NVML, sampled on a background thread for the whole run.
  int dev = 0;
  BENCH_CUDA(cudaGetDevice(&dev));
  char bus[32] = {0};
  BENCH_CUDA(cudaDeviceGetPCIBusId(bus, sizeof(bus), dev));
  cudaDeviceProp prop{};
  BENCH_CUDA(cudaGetDeviceProperties(&prop, dev));
  GpuStatic gs;
  gs.name = prop.name;
  gs.busId = bus;
  NvmlSampler sampler;
  const bool haveNvml = NvmlSampler::describeBusId(bus, &gs);
  if (haveNvml) sampler.start({gs.index}, o.sampleMs, t0);
  BENCH_ANYR(anyrCommResetCounters(st.comm), st.comm);

  json out;
  out["rank"] = rank;
  out["gpu"] = {{"index", haveNvml ? gs.index : dev},
                {"cudaDevice", dev},
                {"name", gs.name},
                {"busId", bus},
                {"powerLimitW", gs.powerLimitW},
                {"maxSmMHz", gs.maxSmMHz},
                {"nvml", haveNvml}};
  json batches = json::array(), phases = json::array();
  const int L = m.layers;
  // Rank 0's progress line. Units: a timed graph is 1; a mode's sustained replays add one per
  // 250 ms of --sustain (they take that long whatever the model).
  const double sustainUnits = o.sustainMs / 250.0;
  const double total = static_cast<double>(o.batches.size()) * (1 + 2 * (2 + sustainUnits)) +
                       2.0 * static_cast<double>(o.sweepTokens.size());
  tool::ProgressLine progress("doctor", total, rank == 0 && o.progress);
  double done = 0;
  for (int B : o.batches) {
    json modes = json::object();
    progress.update(done, "batch " + std::to_string(B) + ": compute only");
    done += 1;
    cudaGraphExec_t computeOnly = st.capture([&] { st.enqueue(B, true, true, false); });
    const double computeUs = st.timeGraph(computeOnly, o.samples, o.warmup);
    BENCH_CUDA(cudaGraphExecDestroy(computeOnly));
    for (bool baseline : {true, false}) {
      const char* name = baseline ? "baseline" : "anyreduce";
      progress.update(done, "batch " + std::to_string(B) + ": " +
                                (baseline ? "NCCL + add+RMSNorm" : "anyreduce fused"));
      done += 2 + sustainUnits;
      const anyrCounters_t c0 = readCounters(st.comm);
      cudaGraphExec_t step = st.capture([&] { st.enqueue(B, baseline, true, true); });
      const anyrCounters_t c1 = readCounters(st.comm);
      cudaGraphExec_t commOnly = st.capture([&] { st.enqueue(B, baseline, false, true); });
      const double stepUs = st.timeGraph(step, o.samples, o.warmup);
      const double commUs = st.timeGraph(commOnly, o.samples, o.warmup);
      BENCH_CUDA(cudaGraphExecDestroy(commOnly));
      // Sustained replays for NVML; every rank replays rank 0's count.
      const int reps =
          st.agree(std::max(1, static_cast<int>(o.sustainMs * 1000.0 / std::max(stepUs, 1.0))),
                   rank, dScratch);
      const double p0 = monotonicSeconds() - t0;
      for (int i = 0; i < reps; ++i) {
        BENCH_CUDA(cudaGraphLaunch(step, st.s));
        if (i % 8 == 7) BENCH_CUDA(cudaStreamSynchronize(st.s));
      }
      BENCH_CUDA(cudaStreamSynchronize(st.s));
      const double p1 = monotonicSeconds() - t0;
      BENCH_CUDA(cudaGraphExecDestroy(step));
      phases.push_back({{"label", "b" + std::to_string(B) + " " + name},
                        {"batch", B},
                        {"mode", name},
                        {"t0", p0},
                        {"t1", p1}});
      modes[name] = {
          {"stepUs", stepUs},
          {"computeUs", computeUs},
          {"commOnlyUs", commUs},
          {"perAllReduceUs", commUs / (2.0 * L)},
          {"path", baseline ? std::string("nccl + add+RMSNorm kernel") : pathOf(c0, c1)}};
    }
    batches.push_back(
        {{"batch", B}, {"messageBytes", static_cast<double>(B) * H * 2}, {"modes", modes}});
  }
  // Latency of one all-reduce + add + RMSNorm by message size, both modes.
  json sweep = json::array();
  const int calls = 20;
  for (int T : o.sweepTokens) {
    json row = {{"tokens", T}, {"bytes", static_cast<double>(T) * H * 2}};
    for (bool baseline : {true, false}) {
      progress.update(done, "latency by size: " + std::to_string(T) + " tokens, " +
                                (baseline ? "NCCL + add+RMSNorm" : "anyreduce"));
      done += 1;
      const anyrCounters_t c0 = readCounters(st.comm);
      cudaGraphExec_t g = st.capture([&] {
        for (int i = 0; i < calls; ++i) st.commBlock(baseline, T);
      });
      const anyrCounters_t c1 = readCounters(st.comm);
      const double us = st.timeGraph(g, o.samples, o.warmup) / calls;
      BENCH_CUDA(cudaGraphExecDestroy(g));
      row[baseline ? "baselineUs" : "anyreduceUs"] = us;
      if (!baseline) row["path"] = pathOf(c0, c1);
    }
    sweep.push_back(row);
  }
  progress.clear();
  sampler.stop();
  const json samples =
      samplesJson(out["gpu"]["index"],
                  sampler.samples().empty() ? std::vector<Sample>() : sampler.samples()[0]);
  out["batches"] = batches;
  out["phases"] = phases;
  out["arSweep"] = sweep;
  out["samples"] = samples;
  out["counters"] = countersJson(readCounters(st.comm));
  // The fabric the communicator measured at init (or took from its cache), and where from.
  {
    const json ex = json::parse(tool::textOf(
        [&](char* b, size_t n, size_t* need) { return anyrCommExplain(st.comm, b, n, need); },
        st.comm, "anyrCommExplain"));
    if (ex.contains("fabric")) out["fabric"] = ex["fabric"];
  }
  out["perRank"] = {{"qkvN", st.qkvN},     {"oK", st.oK},         {"interD", st.interD},
                    {"interE", st.interE}, {"interS", st.interS}, {"maxActiveExperts", maxAct}};
  {
    std::ofstream f(rankFile);
    f << out.dump() << "\n";
    if (!f) throw std::runtime_error("cannot write " + rankFile);
  }
  BENCH_CUDA(cudaStreamSynchronize(st.s));
  DOC_CUBLAS(cublasDestroy(st.blas));
  for (void* p : owned) BENCH_CUDA(cudaFree(p));
  BENCH_CUDA(cudaStreamDestroy(st.s));
  BENCH_ANYR(anyrCommDestroy(st.comm), nullptr);
  return 0;
}

}  // namespace doctor
}  // namespace anyr
