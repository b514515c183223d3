// `anyreduce tune` and `anyreduce bench --check-dispatch`.
//
// tune: every rank measures every admitted path of every operation per size bucket; the
// slowest rank's time counts; rank 0 chooses and broadcasts (anyrCommTuneWithOptions); rank 0
// writes the table (JSON, keyed by the machine's fingerprint) for ANYR_TUNING_FILE.
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

#include "bench.h"
#include "common/api.h"
#include "common/exit_codes.h"
#include "common/launcher.h"
#include "common/progress.h"
#include "common/timing.h"

namespace anyr {
namespace tool {

namespace {

using nlohmann::json;

// The communicator's operations and their candidate paths (anyrCommDescribePaths).
json describePaths(anyrComm_t comm) {
  return json::parse(textOf(
      [&](char* b, size_t n, size_t* need) { return anyrCommDescribePaths(comm, b, n, need); },
      comm, "anyrCommDescribePaths"));
}

// The NCCL path of an operation (the candidate that runs NCCL without a fused kernel), or "".
std::string ncclPathOf(const json& op) {
  for (const auto& c : op["candidates"]) {
    if (c["algo"] == anyrAlgoName(anyrAlgoNccl) && !c["fusedKernel"].get<bool>())
      return c["path"].get<std::string>();
  }
  return "";
}

// The library's tuning progress (rank 0, after every measured point) on the progress line.
void printProgress(int done, int total, const char* what, void* arg) {
  ProgressLine& line = *static_cast<ProgressLine*>(arg);
  line.setTotal(total);
  line.update(done, what);
}

}  // namespace

int runTune(const TuneCliOptions& t) {
  return runAllRanks(
      t.nranks, t.timeoutSec, "tune",
      [&](int rank, int n, const anyrUniqueId& id, int ngpus, const RankReport& report) {
        BenchOptions bo;
        bo.timeoutMs = t.timeoutMs;
        bo.comm = t.comm;
        void* nccl = nullptr;
        anyrComm_t comm = openBenchComm(bo, rank, n, id, ngpus, &nccl);
        anyrTuneOptions_t o = ANYR_TUNE_OPTIONS_INITIALIZER;
        o.minBytes = t.minBytes;
        o.maxBytes = t.maxBytes;
        o.hidden = t.hidden;
        o.maxTokens = t.maxTokens;
        o.budgetMs = t.budgetMs;
        o.calls = t.calls;
        o.samples = t.samples;
        // The total is the library's, known at its first report.
        ProgressLine progress("tune", 1, rank == 0 && t.progress);
        o.progress = printProgress;
        o.progressArg = &progress;
        // Rank 0 writes the table; it prints it from the file it wrote.
        BENCH_ANYR(anyrCommTuneWithOptions(comm, &o, t.output.c_str()), comm);
        progress.clear();
        if (rank == 0) {
          const bool text = !t.jsonStdout;
          if (text) {
            std::printf("tuning table written to %s (use ANYR_TUNING_FILE=%s)\n\n",
                        t.output.c_str(), t.output.c_str());
          }
          std::ifstream file(t.output);
          const json table = json::parse(file);
          json summary = {{"output", t.output}, {"nranks", n}, {"ops", json::object()}};
          for (const auto& op : describePaths(comm)["ops"]) {
            const std::string name = op["op"].get<std::string>();
            const std::string ncclPath = ncclPathOf(op);
            if (text) std::printf("%s:\n", name.c_str());
            json points = json::array();
            for (const auto& p : table.at("ops").at(name)) {
              const std::string choice = p["choice"].get<std::string>();
              double ncclUs = -1, best = -1;
              for (const auto& [path, us] : p["timesUs"].items()) {
                if (path == ncclPath) ncclUs = us.get<double>();
                if (path == choice) best = us.get<double>();
              }
              const uint64_t bytes = p["bytes"].get<uint64_t>();
              points.push_back(
                  {{"bytes", bytes}, {"choice", choice}, {"us", best}, {"ncclUs", ncclUs}});
              if (!text) continue;
              std::printf("  %8s  %-22s %9.2f us", fmtBytes(bytes).c_str(), choice.c_str(), best);
              if (ncclUs > 0) std::printf("   NCCL %9.2f us (%.2fx)", ncclUs, ncclUs / best);
              std::printf("\n");
            }
            summary["ops"][name] = points;
          }
          if (t.jsonStdout) {
            std::printf("%s\n", summary.dump(2).c_str());
          } else if (!t.jsonPath.empty()) {
            std::ofstream f(t.jsonPath);
            f << summary.dump(2) << "\n";
            if (!f) {
              report("could not write " + t.jsonPath);
              return 1;
            }
          }
          std::fflush(stdout);
        }
        if (anyrCommDestroy(comm) != anyrSuccess) return 3;
        return 0;
      },
      t.jsonStdout ? stderr : stdout);
}

int checkDispatchRank(const BenchOptions& o, int rank, int nranks, const anyrUniqueId& id,
                      int ngpus) {
  void* nccl = nullptr;
  anyrComm_t comm = openBenchComm(o, rank, nranks, id, ngpus, &nccl);
  const json described = describePaths(comm);
  const bool tuned = described["tuned"].get<bool>();
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
  // The operations by name (anyrCommDescribePaths; FP8 output is an operation of its own).
  const std::string allReduceOp = "allreduce";
  const std::string fusedOp = o.quant == anyrQuantFp8 ? "add-rmsnorm-quant" : "add-rmsnorm";
  if (o.quant == anyrQuantNvfp4) throw std::runtime_error("--check-dispatch: --quant none or fp8");
  anyrFusedOptions_t fo = ANYR_FUSED_OPTIONS_INITIALIZER;
  if (o.quant == anyrQuantFp8) {
    fo.quant = anyrQuantFp8;
    fo.scale = scale;
    fo.quantOut = quant;
  }

  struct Item {
    std::string op;
    uint64_t bytes;
    size_t tokens;
  };
  std::vector<Item> items;
  for (uint64_t b = o.minBytes; b <= o.maxBytes;
       b = std::max<uint64_t>(b + 1, static_cast<uint64_t>(b * o.factor))) {
    items.push_back({allReduceOp, b / 2 * 2, 0});
  }
  for (size_t t : tokens) items.push_back({fusedOp, t * hidden * 2, t});

  // The table is rank 0's, on stdout unless the JSON goes there (a bare --json).
  const bool text = rank == 0 && !o.jsonStdout;
  ProgressLine progress("check-dispatch", static_cast<double>(items.size()),
                        rank == 0 && o.progress);
  double done = 0;
  if (text) {
    std::printf("# anyreduce bench --check-dispatch: %d ranks, %s table, limit %.2fx %s\n", nranks,
                tuned ? "TUNED" : "SEED-ONLY", limit, tuned ? "the fastest candidate" : "NCCL");
    std::printf("#%-17s %8s %6s  %-22s %9s  %-22s %9s %9s %7s  %s\n", "op", "size", "tokens",
                "fastest", "us", "dispatched", "us", "nccl(us)", "ratio", "verdict");
  }
  int failures = 0;
  json rows = json::array();
  for (const Item& it : items) {
    progress.update(done, it.op + " " + fmtBytes(it.bytes));
    done += 1;
    auto call = [&] {
      if (it.op == allReduceOp) {
        BENCH_ANYR(anyrAllReduce(in, out, it.bytes / 2, anyrBfloat16, anyrSum, comm, s), comm);
      } else {
        BENCH_ANYR(anyrAllReduceAddRmsNorm(partial, residual, residual, weight, 1e-6f, norm,
                                           it.tokens, hidden, anyrBfloat16, &fo, comm, s),
                   comm);
      }
    };
    std::vector<std::string> paths;  // the admitted candidates' names
    std::vector<bool> isNccl;
    std::vector<double> times;
    const char* op = it.op.c_str();
    for (const auto& d : described["ops"]) {
      if (d["op"] != it.op) continue;
      for (const auto& cand : d["candidates"]) {
        if (!cand["admitted"].get<bool>()) continue;
        const std::string path = cand["path"].get<std::string>();
        BENCH_ANYR(anyrCommForcePath(comm, op, path.c_str()), comm);
        call();  // eager first call: surfaces errors outside capture
        BENCH_CUDA(cudaStreamSynchronize(s));
        paths.push_back(path);
        isNccl.push_back(cand["algo"] == anyrAlgoName(anyrAlgoNccl));
        times.push_back(timeCalls(call, s, o.graph, o.calls, o.samples, o.warmup));
        BENCH_ANYR(anyrCommForcePath(comm, op, nullptr), comm);
      }
    }
    const std::string dispatched =
        textOf([&](char* b, size_t n,
                   size_t* need) { return anyrCommQueryPath(comm, op, it.bytes, b, n, need); },
               comm, "anyrCommQueryPath");
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
      if (isNccl[i]) ncclUs = times[i];
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
      if (text) {
        progress.clear();
        std::printf("%-18s %8s %6s  %-22s %9.2f  %-22s %9.2f %9.2f %6.3fx  %s\n", op,
                    fmtBytes(it.bytes).c_str(), it.tokens ? std::to_string(it.tokens).c_str() : "-",
                    paths[best].c_str(), times[best], dispatched.c_str(), dUs, ncclUs, ratio,
                    ok ? "ok" : "FAIL");
        std::fflush(stdout);
      }
      const double algbw = algBandwidthGBs(it.bytes, dUs);
      json cand = json::object();
      for (size_t i = 0; i + 1 < k; ++i) cand[paths[i]] = times[i];
      rows.push_back({{"op", it.op},
                      {"bytes", it.bytes},
                      {"tokens", it.tokens},
                      {"candidatesUs", cand},
                      {"dispatched", dispatched},
                      {"dispatchedUs", dUs},
                      {"algbw", algbw},
                      {"busbw", busBandwidthGBs(algbw, nranks)},
                      {"ncclUs", ncclUs},
                      {"ok", ok}});
    }
  }
  progress.clear();
  if (text) {
    std::printf("# %s: %d of %zu points over the limit (%.2fx %s)\n",
                failures ? "FAILED" : "PASSED", failures, items.size(), limit,
                tuned ? "the fastest candidate" : "NCCL");
  }
  if (rank == 0) {
    const json record = {{"nranks", nranks}, {"tuned", tuned}, {"limit", limit}, {"points", rows}};
    if (o.jsonStdout) {
      std::printf("%s\n", record.dump(2).c_str());
      std::fflush(stdout);
    } else if (!o.jsonPath.empty()) {
      std::ofstream f(o.jsonPath);
      f << record.dump(2) << "\n";
      if (!f) {
        std::fprintf(stderr, "anyreduce bench: could not write --json %s\n", o.jsonPath.c_str());
        ++failures;
      }
    }
  }
  releaseBenchRank(comm, s, {in, out, partial, residual, weight, norm, quant, scale, dStats});
  return failures ? kExitDispatchSlow : kExitOk;
}

}  // namespace tool
}  // namespace anyr
