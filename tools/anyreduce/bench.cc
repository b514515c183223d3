// `anyreduce bench`: an nccl-tests-shaped benchmark. One process per rank; for every size,
// dtype and algorithm it checks the result bit for bit (fresh small-integer inputs, poisoned
// output, input left untouched) and times it, and times NCCL's all-reduce in the same run on
// the same buffers. Rank 0 prints the table; --json writes every figure.
#include "bench.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "common/api.h"
#include "common/data.h"
#include "common/exit_codes.h"
#include "common/launcher.h"
#include "common/timing.h"

namespace anyr {
namespace tool {

namespace {

struct Point {
  uint64_t bytes = 0;
  anyrDataType_t dtype = anyrBfloat16;
  std::string algo;    // requested ("auto", a name, or "nccl-raw")
  std::string chosen;  // what auto picked
  double us = 0;       // median per call, mean over ranks
  double wrong = 0;    // elements wrong, summed over ranks
  double inputChanged = 0;
  double ncclUs = -1;  // NCCL's time for the same size and dtype, same run
};

int rankMain(const BenchOptions& o, int rank, int nranks, const anyrUniqueId& id, int ngpus,
             const std::function<void(const std::string&)>& report) {
  void* ncclVoid = nullptr;
  anyrComm_t comm = openBenchComm(o, rank, nranks, id, ngpus, &ncclVoid);
  ncclComm_t nccl = static_cast<ncclComm_t>(ncclVoid);

  // Which algorithms run: the requested ones that this communicator admits.
  std::vector<anyrAlgo_t> algos;
  std::string skipped;
  for (const std::string& a : o.algos) {
    anyrAlgo_t algo = anyrAlgoAuto;
    if (!parseAlgo(a, &algo)) throw std::runtime_error("unknown algorithm '" + a + "'");
    if (anyrCommSetAlgorithm(comm, algo) == anyrSuccess) {
      algos.push_back(algo);
    } else {
      skipped += "  skipped " + a + ": " + anyrGetLastError(comm) + "\n";
    }
  }
  BENCH_ANYR(anyrCommSetAlgorithm(comm, anyrAlgoAuto), comm);
  if (rank == 0 && !skipped.empty()) std::printf("%s", skipped.c_str());

  uint64_t maxBytes = o.maxBytes;
  void* in = nullptr;
  void* out = nullptr;
  unsigned long long* dBad = nullptr;
  float* dStats = nullptr;
  BENCH_CUDA(cudaMalloc(&in, maxBytes + 16));
  BENCH_CUDA(cudaMalloc(&out, maxBytes + 16));
  BENCH_CUDA(cudaMalloc(&dBad, 2 * sizeof(unsigned long long)));
  BENCH_CUDA(cudaMalloc(&dStats, 64 * sizeof(float)));
  cudaStream_t s;
  BENCH_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  if (rank == 0) {
    std::printf(
        "# anyreduce bench: %d ranks, %s, %s, %d calls x %d samples (median, mean over ranks)\n",
        nranks, o.graph ? "CUDA graph replay" : "eager launches",
        o.inPlace ? "in place" : "out of place", o.calls, o.samples);
    std::printf("# NCCL: %s\n",
                nccl ? "measured in the same run on the same buffers" : "not available");
    std::printf("%10s %11s %5s %13s %10s %9s %9s %8s %10s %8s\n", "size", "count", "type", "algo",
                "time(us)", "algbw", "busbw", "#wrong", "nccl(us)", "speedup");
  }
  std::vector<Point> points;
  uint32_t seed = 12345;
  for (anyrDataType_t dt : o.dtypes) {
    const size_t es = data::dtypeBytes(dt);
    for (uint64_t bytes = o.minBytes; bytes <= maxBytes;
         bytes = std::max<uint64_t>(bytes + 1, static_cast<uint64_t>(bytes * o.factor))) {
      const uint64_t count = std::max<uint64_t>(1, bytes / es);
      const uint64_t realBytes = count * es;
      // NCCL baseline, raw, on the same buffers.
      double ncclUs = -1;
      if (nccl) {
        BENCH_CUDA(data::fillInput(dt, in, count, rank, seed, data::kSmallInts, s));
        auto rawNccl = [&] { rawNcclAllReduce(in, out, count, dt, nccl, s); };
        rawNccl();
        BENCH_CUDA(cudaStreamSynchronize(s));
        ncclUs = timeCalls(rawNccl, s, o.graph, o.calls, o.samples, o.warmup);
      }
      for (const anyrAlgo_t algo : algos) {
        const std::string a = anyrAlgoName(algo);
        BENCH_ANYR(anyrCommSetAlgorithm(comm, algo), comm);
        anyrAlgo_t chosen = algo;
        BENCH_ANYR(anyrCommQueryAlgorithm(comm, count, dt, &chosen), comm);
        void* dst = o.inPlace ? in : out;
        // Correctness: fresh inputs, poisoned output, one eager call, exact comparison.
        ++seed;
        BENCH_CUDA(data::fillInput(dt, in, count, rank, seed, data::kSmallInts, s));
        if (!o.inPlace) BENCH_CUDA(cudaMemsetAsync(out, 0xff, realBytes, s));
        BENCH_CUDA(cudaMemsetAsync(dBad, 0, 2 * sizeof(unsigned long long), s));
        BENCH_ANYR(anyrAllReduce(in, dst, count, dt, anyrSum, comm, s), comm);
        BENCH_CUDA(data::countMismatches(dt, dst, count, nranks, seed, data::kSmallInts, dBad, s));
        if (!o.inPlace)
          BENCH_CUDA(
              data::countInputChanges(dt, in, count, rank, seed, data::kSmallInts, dBad + 1, s));
        unsigned long long bad[2] = {0, 0};
        BENCH_CUDA(cudaMemcpyAsync(bad, dBad, sizeof(bad), cudaMemcpyDeviceToHost, s));
        BENCH_CUDA(cudaStreamSynchronize(s));
        // Timing.
        double us = timeCalls([&] { anyrAllReduce(in, dst, count, dt, anyrSum, comm, s); }, s,
                              o.graph, o.calls, o.samples, o.warmup);
        anyrResult_t async = anyrSuccess;
        BENCH_ANYR(anyrCommGetAsyncError(comm, &async), comm);
        if (async != anyrSuccess)
          throw std::runtime_error(std::string("async error: ") + anyrGetLastError(comm));
        // Mean time and summed errors over ranks, through anyreduce itself (exact small sums).
        float stats[4] = {static_cast<float>(us), static_cast<float>(bad[0]),
                          static_cast<float>(bad[1]), static_cast<float>(ncclUs)};
        BENCH_ANYR(anyrCommSetAlgorithm(comm, anyrAlgoAuto), comm);
        BENCH_CUDA(cudaMemcpyAsync(dStats, stats, sizeof(stats), cudaMemcpyHostToDevice, s));
        sumOverRanks(dStats, 4, comm, nccl, s);
        BENCH_CUDA(cudaMemcpyAsync(stats, dStats, sizeof(stats), cudaMemcpyDeviceToHost, s));
        BENCH_CUDA(cudaStreamSynchronize(s));
        Point p;
        p.bytes = realBytes;
        p.dtype = dt;
        p.algo = a;
        p.chosen = anyrAlgoName(chosen);
        p.us = stats[0] / nranks;
        p.wrong = stats[1];
        p.inputChanged = stats[2];
        double ncclMean = nccl ? stats[3] / nranks : -1;
        p.ncclUs = ncclMean;
        points.push_back(p);
        if (rank == 0) {
          double algbw = realBytes / (p.us * 1e3);
          double busbw = algbw * 2.0 * (nranks - 1) / nranks;
          std::string name = a == "auto" ? "auto:" + p.chosen : a;
          char ncclCol[32] = "-", speed[32] = "-";
          if (ncclMean > 0) {
            std::snprintf(ncclCol, sizeof(ncclCol), "%.2f", ncclMean);
            std::snprintf(speed, sizeof(speed), "%.2fx", ncclMean / p.us);
          }
          std::printf("%10s %11llu %5s %13s %10.2f %9.2f %9.2f %8.0f %10s %8s%s\n",
                      fmtBytes(realBytes).c_str(), static_cast<unsigned long long>(count),
                      data::dtypeName(dt), name.c_str(), p.us, algbw, busbw, p.wrong, ncclCol,
                      speed, p.inputChanged > 0 ? "  INPUT MODIFIED" : "");
          std::fflush(stdout);
        }
      }
      if (bytes == maxBytes) break;
    }
  }
  int totalWrong = 0;
  for (const Point& p : points) totalWrong += (p.wrong > 0 || p.inputChanged > 0) ? 1 : 0;
  if (rank == 0 && !o.jsonPath.empty()) {
    nlohmann::json j;
    j["nranks"] = nranks;
    j["graph"] = o.graph;
    j["inPlace"] = o.inPlace;
    j["calls"] = o.calls;
    j["samples"] = o.samples;
    nlohmann::json rows = nlohmann::json::array();
    for (const Point& p : points) {
      rows.push_back({{"bytes", p.bytes},
                      {"dtype", data::dtypeName(p.dtype)},
                      {"algo", p.algo},
                      {"chosen", p.chosen},
                      {"us", p.us},
                      {"wrong", p.wrong},
                      {"inputChanged", p.inputChanged},
                      {"ncclUs", p.ncclUs}});
    }
    j["points"] = rows;
    std::ofstream f(o.jsonPath);
    f << j.dump(2) << "\n";
    if (!f) report("could not write " + o.jsonPath);
  }
  if (rank == 0) {
    std::printf("# %s\n", totalWrong ? "FAILED: some results were wrong (see #wrong)"
                                     : "all results exact on every rank");
  }
  releaseBenchRank(comm, s, {in, out, dBad, dStats});
  return totalWrong ? 4 : 0;
}

}  // namespace

std::string fmtBytes(uint64_t b) {
  char buf[32];
  if (b >= (1ull << 30) && b % (1ull << 30) == 0) {
    std::snprintf(buf, sizeof(buf), "%lluG", static_cast<unsigned long long>(b >> 30));
  } else if (b >= (1ull << 20) && b % (1ull << 20) == 0) {
    std::snprintf(buf, sizeof(buf), "%lluM", static_cast<unsigned long long>(b >> 20));
  } else if (b >= 1024 && b % 1024 == 0) {
    std::snprintf(buf, sizeof(buf), "%lluK", static_cast<unsigned long long>(b >> 10));
  } else {
    std::snprintf(buf, sizeof(buf), "%llu", static_cast<unsigned long long>(b));
  }
  return buf;
}

anyrComm_t openBenchComm(const BenchOptions& o, int rank, int nranks, const anyrUniqueId& id,
                         int ngpus, void** nccl) {
  return openRankComm(rank, nranks, id, ngpus, o.timeoutMs, o.wire, o.comm, nccl);
}

void sumOverRanks(float* dStats, size_t n, anyrComm_t comm, void* ncclVoid, cudaStream_t s) {
  ncclComm_t nccl = static_cast<ncclComm_t>(ncclVoid);
  if (nccl == nullptr) {
    BENCH_ANYR(anyrAllReduce(dStats, dStats, n, anyrFloat32, anyrSum, comm, s), comm);
    return;
  }
  rawNcclAllReduce(dStats, dStats, n, anyrFloat32, nccl, s);
}

void releaseBenchRank(anyrComm_t comm, cudaStream_t s, std::initializer_list<void*> buffers) {
  BENCH_CUDA(cudaStreamSynchronize(s));
  for (void* p : buffers) BENCH_CUDA(cudaFree(p));
  BENCH_CUDA(cudaStreamDestroy(s));
  BENCH_ANYR(anyrCommDestroy(comm), nullptr);
}

void rawNcclAllReduce(const void* in, void* out, size_t count, anyrDataType_t dt, void* ncclVoid,
                      cudaStream_t s) {
  ncclComm_t nccl = static_cast<ncclComm_t>(ncclVoid);
  const ncclDataType_t nt = dt == anyrFloat32   ? ncclFloat32
                            : dt == anyrFloat16 ? ncclFloat16
                                                : ncclBfloat16;
  ncclResult_t r = ncclAllReduce(in, out, count, nt, ncclSum, nccl, s);
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (r == ncclInProgress && std::chrono::steady_clock::now() < until) {
    if (ncclCommGetAsyncError(nccl, &r) != ncclSuccess) break;
  }
  if (r != ncclSuccess)
    throw std::runtime_error(std::string("ncclAllReduce: ") + ncclGetErrorString(r));
}

int runAllRanks(
    int nranksOpt, double timeoutSec, const char* what,
    const std::function<int(int, int, const anyrUniqueId&, int, const RankReport&)>& body) {
  std::string why;
  const int ngpus = launch::countGpus(&why);
  if (ngpus == 0) {
    std::fprintf(stderr, "anyreduce %s: no usable GPU, nothing to run: %s\n", what, why.c_str());
    return kExitNoGpu;
  }
  const int nranks = nranksOpt > 0 ? nranksOpt : ngpus;
  if (nranks < 2) {
    std::fprintf(stderr,
                 "anyreduce %s: %d GPU visible; it needs 2 ranks or more (use -n 2 to run 2 "
                 "ranks sharing the GPU, a correctness run).\n",
                 what, ngpus);
    return kExitNoGpu;
  }
  if (nranks > ngpus && nranksOpt > 0) {
    std::printf(
        "# %d ranks on %d GPU(s): ranks share GPUs; timings are not meaningful (correctness run)\n",
        nranks, ngpus);
  }
  auto results = launch::runRanks(
      nranks,
      [&](int rank, int n, const anyrUniqueId& id, const RankReport& report) {
        try {
          return body(rank, n, id, ngpus, report);
        } catch (const std::exception& e) {
          report(e.what());
          std::fprintf(stderr, "anyreduce %s rank %d: %s\n", what, rank, e.what());
          return 3;
        }
      },
      timeoutSec);
  const std::string failures = launch::describeFailures(results);
  if (failures.empty()) return 0;
  int worst = 0;
  for (const auto& r : results) worst = std::max(worst, r.exitCode);
  std::fprintf(stderr, "anyreduce %s failed:\n%s", what, failures.c_str());
  // A dispatch check that failed: every rank returns it.
  return worst == kExitDispatchSlow ? kExitDispatchSlow : kExitFailed;
}

int runBench(const BenchOptions& o) {
  return runAllRanks(
      o.nranks, o.timeoutSec, "bench",
      [&](int rank, int n, const anyrUniqueId& id, int ngpus, const RankReport& report) {
        if (o.checkDispatch) return checkDispatchRank(o, rank, n, id, ngpus);
        if (o.op == "add-rmsnorm") return fusedBenchRank(o, rank, n, id, ngpus);
        return rankMain(o, rank, n, id, ngpus, report);
      });
}

}  // namespace tool
}  // namespace anyr
