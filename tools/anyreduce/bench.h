#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "anyreduce/anyreduce.h"
#include "common/bench_table.h"
#include "common/comm_flags.h"

namespace anyr {
namespace tool {

struct BenchOptions {
  uint64_t minBytes = 1024;
  uint64_t maxBytes = 256ull << 20;
  double factor = 2.0;
  std::vector<anyrDataType_t> dtypes = {anyrBfloat16};
  std::vector<std::string> algos;  // names (anyrAlgoName); --algos, with its default
  int nranks = 0;                  // --ranks; 0: one per visible GPU
  int gpus = 0;                    // -g: this many GPUs, one rank each; 0: not given
  bool graph = true;               // -G N > 0 (N timed replays); -G 0 / --no-graph: eager
  int calls = 20;                  // -n: calls per timed sample (per graph)
  int samples = 25;                // timed samples (-G or --samples); the median is reported
  int warmup = 5;                  // -w: untimed samples before the timed ones
  int check = 1;                   // -c: correctness checks per size and group (0: none)
  RankAverage average = RankAverage::kMean;  // -a: how the ranks' times combine
  int timeoutMs = 0;                         // 0: the library default / ANYR_TIMEOUT_MS
  int wire = -1;   // anyrWire_t of the host-memory algorithms; -1: ANYR_WIRE / native
  CommFlags comm;  // --max-blocks, --fused-cluster, --peer-memory
  double timeoutSec = 1800;
  // --json FILE: jsonPath; a bare --json: jsonStdout (the JSON on stdout, no text table).
  std::string jsonPath;
  bool jsonStdout = false;
  bool progress = false;  // the progress line on stderr (a terminal, no --json)
  // --op add-rmsnorm
  std::string op = "allreduce";
  anyrQuant_t quant = anyrQuantNone;
  bool quantOnly = false;  // --quant-only: normOut NULL, the quantized output only
  std::vector<size_t> hiddens = {4096, 6144, 7168, 8192};
  std::vector<size_t> tokens = {1, 2, 3, 4, 8, 16, 32, 64, 128, 129, 256, 512, 1024, 2048};
  // --check-dispatch (dispatch_cmds.cc)
  bool checkDispatch = false;
};

// `anyreduce tune` (dispatch_cmds.cc).
struct TuneCliOptions {
  int nranks = 0;
  std::string output = "anyreduce-tuning.json";
  uint64_t minBytes = 1024, maxBytes = 256ull << 20;
  int hidden = 6144, maxTokens = 2048;
  int budgetMs = 0;
  int calls = 10, samples = 7;
  double timeoutSec = 1800;
  int timeoutMs = 0;  // as BenchOptions': 0 the library default
  CommFlags comm;     // as BenchOptions': the communicator's config
  // --json FILE: the summary as JSON there; a bare --json: on stdout instead of the text.
  std::string jsonPath;
  bool jsonStdout = false;
  bool progress = false;  // as BenchOptions'
};
int runTune(const TuneCliOptions& t);

// `bench --load FILE`: prints a record `bench --json` wrote as the run printed it (no GPU);
// with a bare --json, the record (bandwidths recomputed) on stdout. Exit code
// (common/exit_codes.h): 1 when the file cannot be read or is not such a record, 4 when it holds
// a wrong result (as the run did), else 0.
int printBenchRecord(const std::string& path, const BenchOptions& o);

// Runs the benchmark; returns the process exit code (common/exit_codes.h: 0 ok, 3 no usable
// GPU, 4 a wrong result, 5 a dispatch check over its limit, 1 other failures).
int runBench(const BenchOptions& o);

// Runs body(rank, nranks, id, ngpus, report) in one process per rank (nranksOpt, or one per
// visible GPU), exceptions reported as rank failures. Exit code (common/exit_codes.h): 3
// without a usable GPU or with fewer than 2 ranks (with a message), 5 when a rank returned 5 (a
// dispatch check failed), 1 for any other failure, 0 when every rank returned 0.
using RankReport = std::function<void(const std::string&)>;
// Notes for the reader (ranks sharing GPUs) go to `notes`: stdout, or stderr when stdout
// carries JSON. gpusOpt > 0 (bench -g): that many GPUs, one rank each; more than are visible
// is refused (exit 2).
int runAllRanks(
    int nranksOpt, double timeoutSec, const char* what,
    const std::function<int(int, int, const anyrUniqueId&, int, const RankReport&)>& body,
    FILE* notes = stdout, int gpusOpt = 0);

// "4K", "16M", "1G" for whole KiB / MiB / GiB, else the byte count.
std::string fmtBytes(uint64_t b);

// Sums `n` floats over every rank, in place in device memory (the figures a benchmark reports:
// times, error counts): through NCCL when the communicator has one (`nccl`, a ncclComm_t), else
// through anyreduce. Not through anyreduce when NCCL exists: a host path with a compressed wire
// (--wire) would round the figures.
void sumOverRanks(float* dStats, size_t n, anyrComm_t comm, void* nccl, cudaStream_t s);

// The end of a benchmark rank: waits for `s`, frees `buffers` (device memory), destroys `s` and
// the communicator; throws std::runtime_error on a failure (BENCH_CUDA, BENCH_ANYR).
void releaseBenchRank(anyrComm_t comm, cudaStream_t s, std::initializer_list<void*> buffers);

// ncclAllReduce (sum) of `count` elements of dt on the NCCL communicator `nccl` (a ncclComm_t).
// The communicator is non-blocking: a call may report "in progress" while NCCL sets up
// connections; this waits for it to settle (bounded, 60 s), as the library's own NCCL path does.
// Throws std::runtime_error when NCCL fails.
void rawNcclAllReduce(const void* in, void* out, size_t count, anyrDataType_t dt, void* nccl,
                      cudaStream_t s);

// The rank's communicator with the bench's timeout, wire and CommFlags (openRankComm).
anyrComm_t openBenchComm(const BenchOptions& o, int rank, int nranks, const anyrUniqueId& id,
                         int ngpus, void** nccl);

// One rank of `--check-dispatch` (dispatch_cmds.cc); 5 when a point is over its limit.
int checkDispatchRank(const BenchOptions& o, int rank, int nranks, const anyrUniqueId& id,
                      int ngpus);

// One rank of `--op add-rmsnorm` (bench_fused.cc); returns the rank's exit code.
int fusedBenchRank(const BenchOptions& o, int rank, int nranks, const anyrUniqueId& id, int ngpus);

}  // namespace tool
}  // namespace anyr
