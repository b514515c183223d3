// `anyreduce bench`'s all-reduce table in the format of nccl-tests' all_reduce_perf, so that the
// scripts people already parse nccl-tests output with read it: `#` comment lines, a `#`-prefixed
// column header, one row per size with an out-of-place and an in-place group
// (size count type redop root | time algbw busbw #wrong | time algbw busbw #wrong), then the
// "Out of bounds values" and "Avg bus bandwidth" lines last. anyreduce's own figures (the
// algorithm, NCCL's time in the same run) follow as extra trailing columns, which such parsers
// ignore. Pure functions over given figures: no CUDA, no communicator (the CPU tests pin them).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "anyreduce/anyreduce.h"

namespace anyr {
namespace tool {

// How the ranks' times become the one reported (nccl-tests' -a): rank 0's, the mean, the
// minimum or the maximum over ranks.
enum class RankAverage { kRank0 = 0, kMean = 1, kMin = 2, kMax = 3 };
const char* rankAverageName(RankAverage a);  // "rank0", "mean", "min", "max"
// The figure `perRank` (one value per rank, rank order, not empty) reduces to.
double combineRanks(const std::vector<double>& perRank, RankAverage how);

// Bandwidths as nccl-tests defines them for all-reduce (its doc/PERFORMANCE.md), in GB/s (1e9
// bytes per second) from a time in microseconds: algbw = bytes / time; busbw = algbw * 2 (n - 1)
// / n, the figure comparable with a link's peak whatever the number of ranks n.
double algBandwidthGBs(uint64_t bytes, double us);
double busBandwidthGBs(double algbw, int nranks);

// nccl-tests' names of the element types ("bfloat16", "half", "float").
const char* ncclTestsTypeName(anyrDataType_t t);
// A comma-separated list of dtypes: anyreduce's names (bf16, fp16, fp32), nccl-tests' (bfloat16,
// half, float) or "all" (every dtype anyreduce reduces). False with *error set on an unknown or
// empty entry.
bool parseDtypeList(const std::string& text, std::vector<anyrDataType_t>* out, std::string* error);

// `value` right-aligned in exactly `width` characters, with as many of 2 decimals as fit (then
// 1, 0, then an exponent): the fixed columns stay aligned whatever the magnitude.
std::string fitNumber(double value, int width);

// One group of a row: out-of-place or in-place.
struct BenchGroup {
  double us = 0;        // time per call, microseconds, after the rank averaging
  double wrong = 0;     // elements wrong, summed over ranks
  bool checked = true;  // false with -c 0: #wrong is "N/A"
  double algbw = 0;     // GB/s (filled by makeGroup)
  double busbw = 0;
};
BenchGroup makeGroup(uint64_t bytes, double us, double wrong, bool checked, int nranks);

struct BenchRow {
  uint64_t bytes = 0;  // the message (count x element size)
  uint64_t count = 0;  // elements
  anyrDataType_t dtype = anyrBfloat16;
  BenchGroup outOfPlace, inPlace;
  // anyreduce's own, after nccl-tests' columns.
  std::string algo;         // requested: "auto", an algorithm's name
  std::string chosen;       // what ran (auto's choice; the forced algorithm otherwise)
  double ncclUs = -1;       // NCCL's out-of-place time in the same run, same buffers; -1: none
  double inputChanged = 0;  // out-of-place input elements modified, summed over ranks
};

// The run's settings, as the comment block above the table states them.
struct BenchHeader {
  std::string version;  // the library's, "0.3.0"
  int nranks = 0;
  int ngpus = 0;  // GPUs the ranks run on (ranks share them when fewer)
  uint64_t minBytes = 0, maxBytes = 0;
  double factor = 2;
  int warmup = 0, iters = 0, check = 1;
  int graphReplays = 0;  // 0: eager launches
  int samples = 0;       // timed samples (graph replays or eager batches); the median is used
  RankAverage average = RankAverage::kMean;
  bool nccl = false;                 // NCCL measured in the same run
  std::vector<std::string> devices;  // one line per rank ("Rank 0 device 0 [...] name")
  std::vector<std::string> notes;    // more comment lines (skipped algorithms, ...)
};

// The comment block and the two column-header lines (each line "#"-prefixed, "\n"-ended).
std::string formatBenchHeader(const BenchHeader& h);
// One data row (no "#"; "\n"-ended): nccl-tests' 13 columns, then algo, nccl time, speedup.
std::string formatBenchRow(const BenchRow& r);

struct BenchSummary {
  int outOfBounds = 0;  // groups (out-of-place, in-place) with a wrong element or a changed input
  double avgBusbw = 0;  // mean busbw over every group of every row, as nccl-tests averages it
  int rows = 0;
};
BenchSummary summarize(const std::vector<BenchRow>& rows);
// The last lines: "# Out of bounds values : N OK|FAILED" and "# Avg bus bandwidth    : X".
std::string formatBenchFooter(const BenchSummary& s);

// The JSON record of a row: the fields the tools already read (bytes, dtype, algo, chosen, us,
// wrong, inputChanged, ncclUs: out-of-place), algbw and busbw, nccl-tests' names (count, type,
// redop, root), and "inPlace": {us, algbw, busbw, wrong}. A wrong count of an unchecked group
// is null.
nlohmann::json benchRowJson(const BenchRow& r);
// The whole record: the header's settings, "points" (benchRowJson), outOfBounds and avgBusbw.
nlohmann::json benchJson(const BenchHeader& h, const std::vector<BenchRow>& rows);
// The header and rows of a record benchJson wrote (`bench --load` prints it again): false with
// *error naming the first field missing or of the wrong type. algbw and busbw are recomputed
// from the size and time; a record of `bench -o add-rmsnorm` or `--check-dispatch` is refused.
bool benchFromJson(const nlohmann::json& j, BenchHeader* h, std::vector<BenchRow>* rows,
                   std::string* error);

}  // namespace tool
}  // namespace anyr
