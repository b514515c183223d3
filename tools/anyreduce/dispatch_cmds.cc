// `anyreduce tune` and `anyreduce bench --check-dispatch`.
//
// tune: every rank measures every admitted path of every operation per size bucket; the
// slowest rank's time counts; rank 0 chooses and broadcasts (Communicator::tune); rank 0 writes
// the table (JSON, keyed by the machine's fingerprint) for ANYR_TUNING_FILE.
//
// check-dispatch: in one run, every admitted candidate and the dispatched choice, for
// all-reduce (1 KB..256 MB) and the fused operation (1..2048 tokens, hidden 6144). Fails (exit
// 5) where the dispatched time exceeds 1.03 x the fastest candidate with a tuned table, or
// 1.10 x NCCL with only the seed.
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "api/boundary.h"
#include "bench.h"
#include "common/launcher.h"
#include "core/comm.h"
#include "select/dispatch.h"
#include "select/tuning.h"
#include "timing.h"

namespace anyr {
namespace tool {

namespace {

Communicator& impl(anyrComm_t comm) { return *comm->impl; }

}  // namespace

int runTune(const TuneCliOptions& t) {
  return runAllRanks(t.nranks, t.timeoutSec, "tune",
                     [&](int rank, int n, const anyrUniqueId& id, int ngpus, const RankReport&) {
                       BenchOptions bo;
                       bo.timeoutMs = t.timeoutMs;
                       bo.comm = t.comm;
                       void* nccl = nullptr;
                       anyrComm_t comm = openBenchComm(bo, rank, n, id, ngpus, &nccl);
                       Communicator::TuneOptions o;
                       o.minBytes = t.minBytes;
                       o.maxBytes = t.maxBytes;
                       o.hidden = t.hidden;
                       o.maxTokens = t.maxTokens;
                       o.budgetMs = t.budgetMs;
                       o.calls = t.calls;
                       o.samples = t.samples;
                       const bool tty = isatty(fileno(stderr)) != 0;
                       auto progress = [&](int done, int total, const std::string& what) {
                         if (tty) {
                           std::fprintf(stderr, "\r[%4d/%4d] %3d%%  %-60s", done, total,
                                        100 * done / total, what.c_str());
                           if (done == total) std::fprintf(stderr, "\n");
                         } else {
                           std::fprintf(stderr, "[%4d/%4d] %s\n", done, total, what.c_str());
                         }
                         std::fflush(stderr);
                       };
                       TuningTable table = impl(comm).tune(o, progress);
                       if (rank == 0) {
                         if (tty) std::fprintf(stderr, "\n");
                         saveTuningFile(table, t.output);
                         std::printf("tuning table written to %s (use ANYR_TUNING_FILE=%s)\n\n",
                                     t.output.c_str(), t.output.c_str());
                         for (int op = 0; op < kNumOps; ++op) {
                           std::printf("%s:\n", opName(static_cast<Op>(op)));
                           for (const TunedPoint& p : table.points[static_cast<size_t>(op)]) {
                             double ncclUs = -1, best = -1;
                             for (const auto& [name, us] : p.times) {
                               if (name == pathName(static_cast<Op>(op), Path{anyrAlgoNccl, false}))
                                 ncclUs = us;
                               if (name == p.choice) best = us;
                             }
                             std::printf("  %8s  %-22s %9.2f us",
                                         fmtBytes(bucketBytes(p.bucket)).c_str(), p.choice.c_str(),
                                         best);
                             if (ncclUs > 0)
                               std::printf("   NCCL %9.2f us (%.2fx)", ncclUs, ncclUs / best);
                             std::printf("\n");
                           }
                         }
                       }
                       if (anyrCommDestroy(comm) != anyrSuccess) return 3;
                       return 0;
                     });
}

int checkDispatchRank(const BenchOptions& o, int rank, int nranks, const anyrUniqueId& id,
                      int ngpus) {
  void* nccl = nullptr;
  anyrComm_t comm = openBenchComm(o, rank, nranks, id, ngpus, &nccl);
  Communicator& c = impl(comm);
  const bool tuned = c.selector().tuned() != nullptr;
  const double limit = tuned ? 1.03 : 1.10;
  const size_t hidden = o.hiddens.at(0);  // one (the command line checks)
  const std::vector<size_t>& tokens = o.tokens;
  const size_t maxTokens = *std::max_element(tokens.begin(), tokens.end());
  const uint64_t fusedBytes = maxTokens * hidden * 2;
  void *in, *out, *partial, *residual, *weight, *norm, *quant;
  float* scale;
  float* dStats;
  BENCH_CUDA(cudaMalloc(&in, o.maxBytes));
  BENCH_CUDA(cudaMalloc(&out, o.maxBytes));
  for (void** p : {&partial, &residual, &norm, &quant}) BENCH_CUDA(cudaMalloc(p, fusedBytes));
  BENCH_CUDA(cudaMalloc(&weight, hidden * 2));
  BENCH_CUDA(cudaMalloc(reinterpret_cast<void**>(&scale), sizeof(float)));
  BENCH_CUDA(cudaMalloc(reinterpret_cast<void**>(&dStats), 64 * sizeof(float)));
  for (void* p : {in, out}) BENCH_CUDA(cudaMemset(p, 0x3c, o.maxBytes));
  for (void* p : {partial, residual, norm, quant}) BENCH_CUDA(cudaMemset(p, 0x3c, fusedBytes));
  BENCH_CUDA(cudaMemset(weight, 0x3c, hidden * 2));
  const float one = 1.0f;
  BENCH_CUDA(cudaMemcpy(scale, &one, sizeof(one), cudaMemcpyHostToDevice));
  cudaStream_t s;
  BENCH_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const Op fusedOp = o.quant == anyrQuantFp8 ? Op::AddRmsNormQuant : Op::AddRmsNorm;
  if (o.quant == anyrQuantNvfp4) throw std::runtime_error("--check-dispatch: --quant none or fp8");
  anyrFusedOptions_t fo = ANYR_FUSED_OPTIONS_INITIALIZER;
  if (fusedOp == Op::AddRmsNormQuant) {
    fo.quant = anyrQuantFp8;
    fo.scale = scale;
    fo.quantOut = quant;
  }

  struct Item {
    Op op;
    uint64_t bytes;
    size_t tokens;
  };
  std::vector<Item> items;
  for (uint64_t b = o.minBytes; b <= o.maxBytes;
       b = std::max<uint64_t>(b + 1, static_cast<uint64_t>(b * o.factor))) {
    items.push_back({Op::AllReduce, b / 2 * 2, 0});
  }
  for (size_t t : tokens) items.push_back({fusedOp, t * hidden * 2, t});

  if (rank == 0) {
    std::printf("# anyreduce bench --check-dispatch: %d ranks, %s table, limit %.2fx %s\n", nranks,
                tuned ? "TUNED" : "SEED-ONLY", limit, tuned ? "the fastest candidate" : "NCCL");
    std::printf("%-18s %8s %6s  %-22s %9s  %-22s %9s %9s %7s  %s\n", "op", "size", "tokens",
                "fastest", "us", "dispatched", "us", "nccl(us)", "ratio", "verdict");
  }
  int failures = 0;
  nlohmann::json rows = nlohmann::json::array();
  for (const Item& it : items) {
    auto call = [&] {
      if (it.op == Op::AllReduce) {
        BENCH_ANYR(anyrAllReduce(in, out, it.bytes / 2, anyrBfloat16, anyrSum, comm, s), comm);
      } else {
        BENCH_ANYR(anyrAllReduceAddRmsNorm(partial, residual, residual, weight, 1e-6f, norm,
                                           it.tokens, hidden, anyrBfloat16, &fo, comm, s),
                   comm);
      }
    };
    std::vector<Path> paths;
    std::vector<double> times;
    for (const Candidate& cand : c.selector().candidatesOf(it.op)) {
      if (!cand.admitted) continue;
      c.selector().forcePath(it.op, cand.path);
      call();  // eager first call: surfaces errors outside capture
      BENCH_CUDA(cudaStreamSynchronize(s));
      paths.push_back(cand.path);
      times.push_back(timeCalls(call, s, o.graph, o.calls, o.samples, o.warmup));
      c.selector().clearForcedPath(it.op);
    }
    const Path dispatched = c.selector().pathFor(it.op, it.bytes);
    call();
    BENCH_CUDA(cudaStreamSynchronize(s));
    times.push_back(timeCalls(call, s, o.graph, o.calls, o.samples, o.warmup));
    // Mean over ranks (the same reduction `bench` uses).
    const size_t k = times.size();
    std::vector<float> st(k);
    for (size_t i = 0; i < k; ++i) st[i] = static_cast<float>(times[i]);
    BENCH_CUDA(cudaMemcpyAsync(dStats, st.data(), k * sizeof(float), cudaMemcpyHostToDevice, s));
    sumOverRanks(dStats, k, comm, nccl, s);
    BENCH_CUDA(cudaMemcpyAsync(st.data(), dStats, k * sizeof(float), cudaMemcpyDeviceToHost, s));
    BENCH_CUDA(cudaStreamSynchronize(s));
    for (size_t i = 0; i < k; ++i) times[i] = st[i] / nranks;
    size_t best = 0;
    double ncclUs = -1;
    for (size_t i = 0; i + 1 < k; ++i) {
      if (times[i] < times[best]) best = i;
      if (paths[i].algo == anyrAlgoNccl) ncclUs = times[i];
    }
    const double dUs = times[k - 1];
    const double ratio = dUs / times[best];
    bool ok = true;
    if (tuned) {
      ok = dUs <= limit * times[best];
    } else if (ncclUs > 0) {
      ok = dUs <= limit * ncclUs;
    }
    if (!ok) ++failures;
    if (rank == 0) {
      std::printf("%-18s %8s %6s  %-22s %9.2f  %-22s %9.2f %9.2f %6.3fx  %s\n", opName(it.op),
                  fmtBytes(it.bytes).c_str(), it.tokens ? std::to_string(it.tokens).c_str() : "-",
                  pathName(it.op, paths[best]).c_str(), times[best],
                  pathName(it.op, dispatched).c_str(), dUs, ncclUs, ratio, ok ? "ok" : "FAIL");
      std::fflush(stdout);
      nlohmann::json cand = nlohmann::json::object();
      for (size_t i = 0; i + 1 < k; ++i) cand[pathName(it.op, paths[i])] = times[i];
      rows.push_back({{"op", opName(it.op)},
                      {"bytes", it.bytes},
                      {"tokens", it.tokens},
                      {"candidatesUs", cand},
                      {"dispatched", pathName(it.op, dispatched)},
                      {"dispatchedUs", dUs},
                      {"ncclUs", ncclUs},
                      {"ok", ok}});
    }
  }
  if (rank == 0) {
    std::printf("# %s: %d of %zu points over the limit (%.2fx %s)\n",
                failures ? "FAILED" : "PASSED", failures, items.size(), limit,
                tuned ? "the fastest candidate" : "NCCL");
    if (!o.jsonPath.empty()) {
      std::ofstream f(o.jsonPath);
      f << nlohmann::json(
               {{"nranks", nranks}, {"tuned", tuned}, {"limit", limit}, {"points", rows}})
               .dump(2)
        << "\n";
      if (!f) {
        std::fprintf(stderr, "anyreduce bench: could not write --json %s\n", o.jsonPath.c_str());
        ++failures;
      }
    }
  }
  BENCH_CUDA(cudaStreamSynchronize(s));
  for (void* p : {in, out, partial, residual, weight, norm, quant}) BENCH_CUDA(cudaFree(p));
  BENCH_CUDA(cudaFree(scale));
  BENCH_CUDA(cudaFree(dStats));
  BENCH_CUDA(cudaStreamDestroy(s));
  BENCH_ANYR(anyrCommDestroy(comm), nullptr);
  return failures ? 5 : 0;
}

}  // namespace tool
}  // namespace anyr
