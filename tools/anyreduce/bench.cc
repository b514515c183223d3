// `anyreduce bench`: an nccl-tests-shaped benchmark. One process per rank; for every dtype,
// algorithm and size it checks the result bit for bit, out of place and in place (fresh
// small-integer inputs, poisoned output, input left untouched) and times both, and times NCCL's
// all-reduce in the same run on the same buffers. Rank 0 prints the table in nccl-tests'
// all_reduce_perf format (common/bench_table.h); --json writes every figure.
#include "bench.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "common/api.h"
#include "common/data.h"
#include "common/exit_codes.h"
#include "common/launcher.h"
#include "common/progress.h"
#include "common/timing.h"

namespace anyr {
namespace tool {

namespace {

// Every rank's `mine` (k values each), in rank order: each rank writes its slot of a zeroed
// array of nranks * k floats and the array is summed over ranks, exactly, since every other
// term is zero. (The library reduces with a sum only; -a's min and max are taken on the host.)
std::vector<std::vector<double>> gatherOverRanks(const std::vector<float>& mine, int rank,
                                                 int nranks, float* dBuf, anyrComm_t comm,
                                                 void* nccl, cudaStream_t s) {
  const size_t k = mine.size();
  std::vector<float> all(k * static_cast<size_t>(nranks), 0.0f);
  std::copy(mine.begin(), mine.end(), all.begin() + static_cast<std::ptrdiff_t>(k * rank));
  BENCH_CUDA(
      cudaMemcpyAsync(dBuf, all.data(), all.size() * sizeof(float), cudaMemcpyHostToDevice, s));
  sumOverRanks(dBuf, all.size(), comm, nccl, s);
  BENCH_CUDA(
      cudaMemcpyAsync(all.data(), dBuf, all.size() * sizeof(float), cudaMemcpyDeviceToHost, s));
  BENCH_CUDA(cudaStreamSynchronize(s));
  std::vector<std::vector<double>> out(k, std::vector<double>(static_cast<size_t>(nranks)));
  for (size_t i = 0; i < k; ++i) {
    for (int r = 0; r < nranks; ++r) out[i][static_cast<size_t>(r)] = all[r * k + i];
  }
  return out;
}

double sumOf(const std::vector<double>& v) {
  double t = 0;
  for (double x : v) t += x;
  return t;
}

// "Rank 0 device 0 [0000:1b:00] NVIDIA H200" for every rank (rank r runs on GPU r % ngpus).
std::vector<std::string> deviceLines(int nranks, int ngpus) {
  std::vector<std::string> lines;
  for (int r = 0; r < nranks; ++r) {
    const int dev = r % ngpus;
    cudaDeviceProp p{};
    BENCH_CUDA(cudaGetDeviceProperties(&p, dev));
    char b[512];
    std::snprintf(b, sizeof(b), "Rank %2d device %2d [%04x:%02x:%02x] %s", r, dev, p.pciDomainID,
                  p.pciBusID, p.pciDeviceID, p.name);
    lines.push_back(b);
  }
  return lines;
}

// The sizes of the sweep: minBytes, then times the factor (at least one byte more), up to
// maxBytes, which is always the last.
std::vector<uint64_t> sweepSizes(const BenchOptions& o) {
  std::vector<uint64_t> sizes;
  for (uint64_t b = o.minBytes; b <= o.maxBytes;
       b = std::max<uint64_t>(b + 1, static_cast<uint64_t>(static_cast<double>(b) * o.factor))) {
    sizes.push_back(b);
    if (b == o.maxBytes) break;
  }
  return sizes;
}

int rankMain(const BenchOptions& o, int rank, int nranks, const anyrUniqueId& id, int ngpus,
             const std::function<void(const std::string&)>& report) {
  void* ncclVoid = nullptr;
  anyrComm_t comm = openBenchComm(o, rank, nranks, id, ngpus, &ncclVoid);
  ncclComm_t nccl = static_cast<ncclComm_t>(ncclVoid);
  const bool lead = rank == 0;
  FILE* const text = lead && !o.jsonStdout ? stdout : nullptr;  // the table, rank 0's

  BenchHeader h;
  h.version = libraryVersion();
  h.nranks = nranks;
  h.ngpus = std::min(nranks, ngpus);
  h.minBytes = o.minBytes;
  h.maxBytes = o.maxBytes;
  h.factor = o.factor;
  h.warmup = o.warmup;
  h.iters = o.calls;
  h.check = o.check;
  h.graphReplays = o.graph ? o.samples : 0;
  h.samples = o.samples;
  h.average = o.average;
  h.nccl = nccl != nullptr;

  // Which algorithms run: the requested ones that this communicator admits.
  std::vector<anyrAlgo_t> algos;
  for (const std::string& a : o.algos) {
    anyrAlgo_t algo = anyrAlgoAuto;
    if (!parseAlgo(a, &algo)) throw std::runtime_error("unknown algorithm '" + a + "'");
    if (anyrCommSetAlgorithm(comm, algo) == anyrSuccess) {
      algos.push_back(algo);
    } else {
      h.notes.push_back("skipped " + a + ": " + anyrGetLastError(comm));
    }
  }
  BENCH_ANYR(anyrCommSetAlgorithm(comm, anyrAlgoAuto), comm);
  if (lead) h.devices = deviceLines(nranks, ngpus);

  const uint64_t maxBytes = o.maxBytes;
  void* in = nullptr;
  void* out = nullptr;
  unsigned long long* dBad = nullptr;
  float* dStats = nullptr;
  BENCH_CUDA(cudaMalloc(&in, maxBytes + 16));
  BENCH_CUDA(cudaMalloc(&out, maxBytes + 16));
  BENCH_CUDA(cudaMalloc(&dBad, 2 * sizeof(unsigned long long)));
  BENCH_CUDA(cudaMalloc(&dStats, 8 * sizeof(float) * static_cast<size_t>(nranks)));
  cudaStream_t s;
  BENCH_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  const std::vector<uint64_t> sizes = sweepSizes(o);
  // The progress line's units: a point weighs 1 + its size in 256 KiB, a rough time model
  // (a fixed cost, then bandwidth) that keeps the estimate from trusting the small sizes.
  auto weight = [](uint64_t bytes) { return 1.0 + static_cast<double>(bytes) / (256 << 10); };
  double total = 0;
  for (uint64_t b : sizes) total += weight(b);
  ProgressLine progress("bench", total * static_cast<double>(o.dtypes.size() * algos.size()),
                        lead && o.progress);
  double done = 0;
  auto say = [&](const std::string& t) {
    if (text == nullptr) return;
    progress.clear();
    std::fputs(t.c_str(), text);
    std::fflush(text);
  };
  say(formatBenchHeader(h));

  std::vector<BenchRow> rows;
  std::map<std::pair<int, uint64_t>, double> ncclUs;  // (dtype, bytes) -> NCCL's time
  uint32_t seed = 12345;
  for (anyrDataType_t dt : o.dtypes) {
    const size_t es = data::dtypeBytes(dt);
    for (const anyrAlgo_t algo : algos) {
      const std::string a = anyrAlgoName(algo);
      for (uint64_t bytes : sizes) {
        const uint64_t count = std::max<uint64_t>(1, bytes / es);
        const uint64_t realBytes = count * es;
        progress.update(done, fmtBytes(realBytes) + " " + ncclTestsTypeName(dt) + " " + a);
        // NCCL, raw, on the same buffers: once per dtype and size (with the first algorithm).
        const auto key = std::make_pair(static_cast<int>(dt), realBytes);
        if (nccl && ncclUs.count(key) == 0) {
          BENCH_CUDA(data::fillInput(dt, in, count, rank, seed, data::kSmallInts, s));
          auto rawNccl = [&] { rawNcclAllReduce(in, out, count, dt, nccl, s); };
          rawNccl();
          BENCH_CUDA(cudaStreamSynchronize(s));
          const double us = timeCalls(rawNccl, s, o.graph, o.calls, o.samples, o.warmup);
          ncclUs[key] = combineRanks(
              gatherOverRanks({static_cast<float>(us)}, rank, nranks, dStats, comm, nccl, s)[0],
              o.average);
        }
        BENCH_ANYR(anyrCommSetAlgorithm(comm, algo), comm);
        anyrAlgo_t chosen = algo;
        BENCH_ANYR(anyrCommQueryAlgorithm(comm, count, dt, &chosen), comm);
        // One group: -c correctness calls (fresh inputs, poisoned output, exact comparison;
        // out of place, the input must be left untouched), then the timing.
        auto group = [&](bool inPlace, double* wrong, double* changed) {
          void* dst = inPlace ? in : out;
          *wrong = 0;
          *changed = 0;
          for (int c = 0; c < o.check && *wrong == 0 && *changed == 0; ++c) {
            ++seed;
            BENCH_CUDA(data::fillInput(dt, in, count, rank, seed, data::kSmallInts, s));
            if (!inPlace) BENCH_CUDA(cudaMemsetAsync(out, 0xff, realBytes, s));
            BENCH_CUDA(cudaMemsetAsync(dBad, 0, 2 * sizeof(unsigned long long), s));
            BENCH_ANYR(anyrAllReduce(in, dst, count, dt, anyrSum, comm, s), comm);
            BENCH_CUDA(
                data::countMismatches(dt, dst, count, nranks, seed, data::kSmallInts, dBad, s));
            if (!inPlace) {
              BENCH_CUDA(data::countInputChanges(dt, in, count, rank, seed, data::kSmallInts,
                                                 dBad + 1, s));
            }
            unsigned long long bad[2] = {0, 0};
            BENCH_CUDA(cudaMemcpyAsync(bad, dBad, sizeof(bad), cudaMemcpyDeviceToHost, s));
            BENCH_CUDA(cudaStreamSynchronize(s));
            *wrong = static_cast<double>(bad[0]);
            *changed = static_cast<double>(bad[1]);
          }
          return timeCalls([&] { anyrAllReduce(in, dst, count, dt, anyrSum, comm, s); }, s, o.graph,
                           o.calls, o.samples, o.warmup);
        };
        double oopWrong = 0, oopChanged = 0, ipWrong = 0, ipChanged = 0;
        const double oopUs = group(false, &oopWrong, &oopChanged);
        const double ipUs = group(true, &ipWrong, &ipChanged);
        anyrResult_t async = anyrSuccess;
        BENCH_ANYR(anyrCommGetAsyncError(comm, &async), comm);
        if (async != anyrSuccess)
          throw std::runtime_error(std::string("async error: ") + anyrGetLastError(comm));
        // Every rank's figures (auto's path: the figures are exact either way).
        BENCH_ANYR(anyrCommSetAlgorithm(comm, anyrAlgoAuto), comm);
        const auto all = gatherOverRanks(
            {static_cast<float>(oopUs), static_cast<float>(ipUs), static_cast<float>(oopWrong),
             static_cast<float>(ipWrong), static_cast<float>(oopChanged)},
            rank, nranks, dStats, comm, nccl, s);
        const bool checked = o.check > 0;
        BenchRow r;
        r.bytes = realBytes;
        r.count = count;
        r.dtype = dt;
        r.algo = a;
        r.chosen = anyrAlgoName(chosen);
        r.outOfPlace =
            makeGroup(realBytes, combineRanks(all[0], o.average), sumOf(all[2]), checked, nranks);
        r.inPlace =
            makeGroup(realBytes, combineRanks(all[1], o.average), sumOf(all[3]), checked, nranks);
        r.inputChanged = sumOf(all[4]);
        r.ncclUs = nccl ? ncclUs[key] : -1;
        rows.push_back(r);
        say(formatBenchRow(r));
        done += weight(bytes);
      }
    }
  }
  progress.update(done, "");
  progress.clear();
  const BenchSummary summary = summarize(rows);
  if (lead && (o.jsonStdout || !o.jsonPath.empty())) {
    const std::string doc = benchJson(h, rows).dump(2) + "\n";
    if (o.jsonStdout) {
      std::fputs(doc.c_str(), stdout);
      std::fflush(stdout);
    } else {
      std::ofstream f(o.jsonPath);
      f << doc;
      if (!f) report("could not write " + o.jsonPath);
    }
  }
  say(formatBenchFooter(summary));
  releaseBenchRank(comm, s, {in, out, dBad, dStats});
  return summary.outOfBounds ? tool::kExitWrongResult : tool::kExitOk;
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
    const std::function<int(int, int, const anyrUniqueId&, int, const RankReport&)>& body,
    FILE* notes, int gpusOpt) {
  std::string why;
  const int ngpus = launch::countGpus(&why);
  if (ngpus == 0) {
    std::fprintf(stderr, "anyreduce %s: no usable GPU, nothing to run: %s\n", what, why.c_str());
    return kExitNoGpu;
  }
  if (gpusOpt > ngpus) {
    std::fprintf(stderr,
                 "anyreduce %s: -g %d but %d GPU(s) visible (--ranks N runs N ranks sharing "
                 "the GPUs: a correctness run).\n",
                 what, gpusOpt, ngpus);
    return 2;
  }
  if (gpusOpt > 0) nranksOpt = gpusOpt;
  const int nranks = nranksOpt > 0 ? nranksOpt : ngpus;
  if (nranks < 2) {
    std::fprintf(stderr,
                 "anyreduce %s: %d GPU visible; it needs 2 ranks or more (use --ranks 2 to run 2 "
                 "ranks sharing the GPU, a correctness run).\n",
                 what, ngpus);
    return kExitNoGpu;
  }
  if (nranks > ngpus && nranksOpt > 0) {
    std::fprintf(
        notes,
        "# %d ranks on %d GPU(s): ranks share GPUs; timings are not meaningful (correctness run)\n",
        nranks, ngpus);
    std::fflush(notes);
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

int printBenchRecord(const std::string& path, const BenchOptions& o) {
  std::ifstream f(path);
  if (!f) {
    std::fprintf(stderr, "anyreduce bench --load: cannot read %s\n", path.c_str());
    return 1;
  }
  BenchHeader h;
  std::vector<BenchRow> rows;
  std::string error;
  try {
    const nlohmann::json j = nlohmann::json::parse(f);
    if (!benchFromJson(j, &h, &rows, &error)) {
      std::fprintf(stderr, "anyreduce bench --load: %s: %s\n", path.c_str(), error.c_str());
      return 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "anyreduce bench --load: %s is not JSON: %s\n", path.c_str(), e.what());
    return 1;
  }
  const std::string doc = benchJson(h, rows).dump(2) + "\n";
  if (o.jsonStdout) {
    std::fputs(doc.c_str(), stdout);
  } else {
    std::string text = formatBenchHeader(h);
    for (const BenchRow& r : rows) text += formatBenchRow(r);
    text += formatBenchFooter(summarize(rows));
    std::fputs(text.c_str(), stdout);
    if (!o.jsonPath.empty()) {
      std::ofstream out(o.jsonPath);
      out << doc;
      if (!out) {
        std::fprintf(stderr, "anyreduce bench: could not write --json %s\n", o.jsonPath.c_str());
        return 1;
      }
    }
  }
  std::fflush(stdout);
  return summarize(rows).outOfBounds ? tool::kExitWrongResult : tool::kExitOk;
}

int runBench(const BenchOptions& o) {
  return runAllRanks(
      o.nranks, o.timeoutSec, "bench",
      [&](int rank, int n, const anyrUniqueId& id, int ngpus, const RankReport& report) {
        if (o.checkDispatch) return checkDispatchRank(o, rank, n, id, ngpus);
        if (o.op == "add-rmsnorm") return fusedBenchRank(o, rank, n, id, ngpus);
        return rankMain(o, rank, n, id, ngpus, report);
      },
      o.jsonStdout ? stderr : stdout, o.gpus);
}

}  // namespace tool
}  // namespace anyr
