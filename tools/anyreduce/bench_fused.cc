// `anyreduce bench --op add-rmsnorm [--quant fp8|nvfp4]`: the fused all-reduce + residual add +
// RMSNorm (+ quantization) against, in the same run on the same buffers,
//   - NCCL all-reduce followed by anyreduce's standalone add+RMSNorm(+quant) kernel, and
//   - anyreduce's own (unfused) all-reduce followed by the same kernel.
// Residual updated in place (as a decoder layer does). The fused outputs are compared bit for
// bit with the unfused ones (#wrong counts differing normOut elements and quantized-output
// and scale bytes, summed over ranks). --quant-only leaves normOut NULL in every call: the
// quantized output alone, as a layer whose next GEMM reads FP8 or NVFP4 runs it.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <tuple>
#include <vector>

#include "bench.h"
#include "common/data.h"
#include "common/nvfp4_layout.h"
#include "common/progress.h"
#include "common/timing.h"

namespace anyr {
namespace tool {

int fusedBenchRank(const BenchOptions& o, int rank, int nranks, const anyrUniqueId& id, int ngpus) {
  void* ncclVoid = nullptr;
  anyrComm_t comm = openBenchComm(o, rank, nranks, id, ngpus, &ncclVoid);
  ncclComm_t nccl = static_cast<ncclComm_t>(ncclVoid);
  const anyrDataType_t dt = o.dtypes.empty() ? anyrBfloat16 : o.dtypes[0];
  if (dt == anyrFloat32) throw std::runtime_error("--op add-rmsnorm supports bf16 and fp16");
  size_t maxElems = 0;
  for (size_t h : o.hiddens)
    for (size_t t : o.tokens) maxElems = std::max(maxElems, h * t);
  const size_t maxBytes = maxElems * 2;
  void *partial, *residual, *weight, *norm, *x, *refNorm, *quant, *scales, *swz, *quantScratch;
  void *refQuant, *refScales, *refSwz;
  float* scale;
  // quantScratch: residualOut of the correctness check (not in place, so both runs see the
  // same residual).
  for (void** p : {&partial, &residual, &norm, &x, &refNorm, &quant, &quantScratch, &refQuant}) {
    BENCH_CUDA(cudaMalloc(p, maxBytes));
  }
  BENCH_CUDA(cudaMalloc(&weight, 16384 * 2));
  const size_t scaleBytes = maxElems / 16 + 64, swzBytes = maxElems / 16 + 128 * 4 * 1024;
  BENCH_CUDA(cudaMalloc(&scales, scaleBytes));
  BENCH_CUDA(cudaMalloc(&refScales, scaleBytes));
  BENCH_CUDA(cudaMalloc(&swz, swzBytes));
  BENCH_CUDA(cudaMalloc(&refSwz, swzBytes));
  BENCH_CUDA(cudaMalloc(reinterpret_cast<void**>(&scale), sizeof(float)));
  float* dStats;
  BENCH_CUDA(cudaMalloc(reinterpret_cast<void**>(&dStats), 8 * sizeof(float)));
  cudaStream_t s;
  BENCH_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const float scaleValue = o.quant == anyrQuantFp8 ? 0.05f : 0.01f;
  BENCH_CUDA(cudaMemcpy(scale, &scaleValue, sizeof(float), cudaMemcpyHostToDevice));

  anyrFusedOptions_t fo = ANYR_FUSED_OPTIONS_INITIALIZER;
  fo.quant = o.quant;
  if (o.quant != anyrQuantNone) {
    fo.scale = scale;
    fo.quantOut = quant;
  }
  if (o.quant == anyrQuantNvfp4) {
    fo.blockScales = scales;
    fo.blockScalesSwizzled = swz;
  }
  const char* quantName = o.quant == anyrQuantFp8     ? "fp8"
                          : o.quant == anyrQuantNvfp4 ? "nvfp4"
                                                      : "none";
  // normOut of every call: NULL with --quant-only.
  const bool quantOnly = o.quantOnly && o.quant != anyrQuantNone;
  void* const normOut = quantOnly ? nullptr : norm;
  // The table is rank 0's, on stdout unless the JSON goes there (a bare --json).
  const bool text = rank == 0 && !o.jsonStdout;
  ProgressLine progress("bench", static_cast<double>(o.hiddens.size() * o.tokens.size()),
                        rank == 0 && o.progress);
  double done = 0;
  if (text) {
    std::printf(
        "# anyreduce bench --op add-rmsnorm: %d ranks, %s, quant %s%s, residual in place, %s, "
        "%d calls x %d samples (median, mean over ranks)\n",
        nranks, data::dtypeName(dt), quantName,
        quantOnly ? " (quantized output only, normOut NULL)" : "",
        o.graph ? "CUDA graph replay" : "eager", o.calls, o.samples);
    std::printf(
        "# fused: anyrAllReduceAddRmsNorm (auto). nccl+k: ncclAllReduce + anyrAddRmsNorm. "
        "own+k: anyrAllReduce + anyrAddRmsNorm.\n");
    std::printf("#%6s %7s %10s %10s %10s %9s %9s %7s  %s\n", "hidden", "tokens", "fused(us)",
                "nccl+k", "own+k", "vs nccl", "vs own", "#wrong", "path (rank 0)");
  }
  nlohmann::json rows = nlohmann::json::array();
  uint32_t seed = 999;
  int wrongTotal = 0;
  for (size_t hidden : o.hiddens) {
    for (size_t tokens : o.tokens) {
      const size_t elems = hidden * tokens;
      progress.update(done, "add-rmsnorm hidden " + std::to_string(hidden) + " tokens " +
                                std::to_string(tokens));
      ++seed;
      BENCH_CUDA(data::fillInput(dt, partial, elems, rank, seed, data::kSmallInts, s));
      BENCH_CUDA(data::fillInput(dt, residual, elems, 100, seed, data::kSmallInts, s));
      BENCH_CUDA(data::fillInput(dt, weight, hidden, 101, seed, data::kRandom, s));
      // Correctness: fused vs own unfused, residual not in place for this check, every output
      // in its own buffer, the fused ones poisoned first.
      anyrFusedOptions_t refo = fo;
      if (o.quant != anyrQuantNone) refo.quantOut = refQuant;
      if (o.quant == anyrQuantNvfp4) {
        refo.blockScales = refScales;
        refo.blockScalesSwizzled = refSwz;
      }
      const size_t qBytes = o.quant == anyrQuantNvfp4 ? elems / 2 : elems;
      const size_t sBytes = elems / 16;
      const size_t zBytes =
          o.quant == anyrQuantNvfp4
              ? static_cast<size_t>(swizzledScaleBytes(
                    static_cast<int64_t>(tokens), nvfp4ScaleCols(static_cast<int64_t>(hidden))))
              : 0;
      // The outputs compared: {fused, reference, bytes}; the swizzled scales below, on their
      // written places only (padding is not written, docs/FUSED.md).
      std::vector<std::tuple<void*, void*, size_t>> outs;
      if (!quantOnly) outs.emplace_back(norm, refNorm, elems * 2);
      if (o.quant != anyrQuantNone) outs.emplace_back(quant, refQuant, qBytes);
      if (o.quant == anyrQuantNvfp4) outs.emplace_back(scales, refScales, sBytes);
      auto poison = [&](void* f, void* r, size_t nb) {
        BENCH_CUDA(cudaMemsetAsync(f, 0xff, nb, s));
        BENCH_CUDA(cudaMemsetAsync(r, 0x7b, nb, s));
      };
      auto toHost = [&](const void* p, size_t nb) {
        std::vector<uint8_t> h(nb);
        BENCH_CUDA(cudaMemcpyAsync(h.data(), p, nb, cudaMemcpyDeviceToHost, s));
        BENCH_CUDA(cudaStreamSynchronize(s));
        return h;
      };
      for (auto& [f, r, nb] : outs) poison(f, r, nb);
      if (zBytes) poison(swz, refSwz, zBytes);
      BENCH_ANYR(anyrAllReduce(partial, x, elems, dt, anyrSum, comm, s), comm);
      BENCH_ANYR(anyrAddRmsNorm(x, residual, quantScratch, weight, 1e-6f,
                                quantOnly ? nullptr : refNorm, tokens, hidden, dt, &refo, s),
                 comm);
      const anyrCounters_t c0 = readCounters(comm);
      BENCH_ANYR(anyrAllReduceAddRmsNorm(partial, residual, quantScratch, weight, 1e-6f, normOut,
                                         tokens, hidden, dt, &fo, comm, s),
                 comm);
      const std::string path = pathOf(c0, readCounters(comm));  // what the fused call ran
      size_t wrong = 0;
      for (auto& [f, r, nb] : outs) {
        const std::vector<uint8_t> a = toHost(f, nb), b = toHost(r, nb);
        for (size_t i = 0; i < nb; ++i) wrong += a[i] != b[i];
      }
      if (zBytes) {
        const std::vector<uint8_t> a = toHost(swz, zBytes), b = toHost(refSwz, zBytes);
        const int64_t cols = nvfp4ScaleCols(static_cast<int64_t>(hidden));
        for (int64_t m = 0; m < static_cast<int64_t>(tokens); ++m) {
          for (int64_t k = 0; k < cols; ++k) {
            const int64_t at = swizzledScaleOffset(m, k, cols);
            wrong += a[static_cast<size_t>(at)] != b[static_cast<size_t>(at)];
          }
        }
      }
      // Timing (residual in place).
      double fused = timeCalls(
          [&] {
            BENCH_ANYR(anyrAllReduceAddRmsNorm(partial, residual, residual, weight, 1e-6f, normOut,
                                               tokens, hidden, dt, &fo, comm, s),
                       comm);
          },
          s, o.graph, o.calls, o.samples, o.warmup);
      double own = timeCalls(
          [&] {
            BENCH_ANYR(anyrAllReduce(partial, x, elems, dt, anyrSum, comm, s), comm);
            BENCH_ANYR(anyrAddRmsNorm(x, residual, residual, weight, 1e-6f, normOut, tokens, hidden,
                                      dt, &fo, s),
                       comm);
          },
          s, o.graph, o.calls, o.samples, o.warmup);
      double viaNccl = -1;
      if (nccl) {
        viaNccl = timeCalls(
            [&] {
              rawNcclAllReduce(partial, x, elems, dt, nccl, s);
              BENCH_ANYR(anyrAddRmsNorm(x, residual, residual, weight, 1e-6f, normOut, tokens,
                                        hidden, dt, &fo, s),
                         comm);
            },
            s, o.graph, o.calls, o.samples, o.warmup);
      }
      float stats[4] = {static_cast<float>(fused), static_cast<float>(own),
                        static_cast<float>(viaNccl), static_cast<float>(wrong)};
      BENCH_CUDA(cudaMemcpyAsync(dStats, stats, sizeof(stats), cudaMemcpyHostToDevice, s));
      sumOverRanks(dStats, 4, comm, nccl, s);
      BENCH_CUDA(cudaMemcpyAsync(stats, dStats, sizeof(stats), cudaMemcpyDeviceToHost, s));
      BENCH_CUDA(cudaStreamSynchronize(s));
      const double f = stats[0] / nranks, ow = stats[1] / nranks,
                   nc = nccl ? stats[2] / nranks : -1;
      wrongTotal += stats[3] > 0 ? 1 : 0;
      done += 1;
      if (rank == 0) {
        char ncCol[32] = "-", vsNc[32] = "-";
        if (nc > 0) {
          std::snprintf(ncCol, sizeof(ncCol), "%.2f", nc);
          std::snprintf(vsNc, sizeof(vsNc), "%.2fx", nc / f);
        }
        if (text) {
          progress.clear();
          std::printf("%7zu %7zu %10.2f %10s %10.2f %9s %8.2fx %7.0f  %s\n", hidden, tokens, f,
                      ncCol, ow, vsNc, ow / f, stats[3], path.c_str());
          std::fflush(stdout);
        }
        // algbw and busbw of the fused call: its all-reduced message over its time.
        const uint64_t bytes = elems * 2;
        const double algbw = algBandwidthGBs(bytes, f);
        rows.push_back({{"hidden", hidden},
                        {"bytes", bytes},
                        {"algbw", algbw},
                        {"busbw", busBandwidthGBs(algbw, nranks)},
                        {"tokens", tokens},
                        {"fusedUs", f},
                        {"path", path},
                        {"ncclPlusKernelUs", nc},
                        {"ownPlusKernelUs", ow},
                        {"wrong", stats[3]}});
      }
    }
  }
  progress.clear();
  if (text) {
    std::printf("# %s\n", wrongTotal
                              ? "FAILED: fused and unfused outputs differ (#wrong)"
                              : "fused outputs bit-identical to the unfused ones on every rank");
  }
  if (rank == 0 && (o.jsonStdout || !o.jsonPath.empty())) {
    const nlohmann::json j = {{"op", "add-rmsnorm"},
                              {"quant", quantName},
                              {"normOut", !quantOnly},
                              {"nranks", nranks},
                              {"points", rows}};
    if (o.jsonStdout) {
      std::printf("%s\n", j.dump(2).c_str());
      std::fflush(stdout);
    } else {
      std::ofstream f(o.jsonPath);
      f << j.dump(2) << "\n";
      if (!f) {
        std::fprintf(stderr, "anyreduce bench: could not write --json %s\n", o.jsonPath.c_str());
        wrongTotal += 1;  // the run fails: its record is lost
      }
    }
  }
  releaseBenchRank(comm, s,
                   {partial, residual, weight, norm, x, refNorm, quant, scales, swz, quantScratch,
                    refQuant, refScales, refSwz, scale, dStats});
  return wrongTotal ? 4 : 0;
}

}  // namespace tool
}  // namespace anyr
