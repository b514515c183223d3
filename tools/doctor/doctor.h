// `anyreduce doctor`: measures how much of a tensor-parallel decode step is communication, what
// anyreduce's fused all-reduce + residual + RMSNorm removes, and what the GPUs draw meanwhile;
// `--watch` samples NVML on every GPU while another workload runs. Measurement goes to JSON;
// the verdict and the self-contained HTML report are made from the JSON alone (doctor_report.cc),
// so they can be regenerated, and tested, without a GPU.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/comm_flags.h"

namespace anyr {
namespace doctor {

// Model shape. Per-rank compute shapes are those of a deployment sharded `shardAs` ways
// (default: the number of ranks); the all-reduced message is always batch x hidden.
struct ModelShape {
  std::string preset;
  int layers = 0;
  int denseLayers = 0;  // first layers with a dense MLP (MoE models); all layers when !moe
  int hidden = 0;
  int heads = 0;
  int kvHeads = 0;
  int headDim = 0;
  int intermediate = 0;  // dense MLP
  bool moe = false;
  int experts = 0;
  int topk = 0;
  int moeIntermediate = 0;
  int sharedExperts = 0;  // each of moeIntermediate
  std::string source;     // where the dimensions come from, and what is approximated
};

// Presets: "glm", "llama70b", "tiny" (for tests). False when `name` is unknown.
bool presetShape(const std::string& name, ModelShape* out);
std::string presetNames();

struct RunOptions {
  ModelShape shape;
  std::vector<int> batches = {1, 8, 32};
  int nranks = 0;   // 0: one per visible GPU
  int shardAs = 0;  // 0: nranks
  int samples = 15;
  int warmup = 3;
  int sustainMs = 2000;  // replays per mode and batch while NVML samples
  int sampleMs = 20;     // NVML sampling interval
  int timeoutMs = 0;
  tool::CommFlags comm;  // config fields; -1: the environment's
  double timeoutSec = 900;
  std::vector<int> sweepTokens = {1, 2, 4, 8, 16, 32, 64, 128, 256};
  std::string jsonPath = "doctor.json";
  bool jsonStdout = false;  // the measurement on stdout; the verdict then goes to stderr
  bool progress = false;    // the progress line on stderr (a terminal, no --json)
  std::string htmlPath = "doctor.html";
  std::string command;  // as typed, for the report
};

struct WatchOptions {
  double seconds = 30;
  int sampleMs = 100;
  std::string jsonPath = "doctor-watch.json";
  bool jsonStdout = false;  // as RunOptions'
  bool progress = false;    // as RunOptions'
  std::string htmlPath = "doctor-watch.html";
  std::string command;
};

// GPU run: measures, writes JSON, prints the verdict, writes the report. Process exit code.
int runDoctor(const RunOptions& o);
// NVML watch of every GPU; same outputs. Process exit code.
int runWatch(const WatchOptions& o);
// Report from an existing measurement file (no GPU needed); with jsonStdout the measurement is
// printed on stdout and the verdict on stderr. Process exit code.
int reportFromFile(const std::string& jsonPath, const std::string& htmlPath,
                   bool jsonStdout = false);

// ---- From JSON (doctor_report.cc) ----
// Merges the ranks' figures (doctor_run.cc writes one object per rank): times are means over
// ranks; exposed communication = step - compute; power, SM clock and utilization of every
// rank's GPU over each mode's window of sustained replays (rank 0's phases), without its first
// quarter; counters and paths are rank 0's. Returns gpus, samples, phases, batches, arSweep and
// counters of the measurement.
nlohmann::json mergeRanks(const std::vector<nlohmann::json>& ranks);
// Power figures of every rank's GPU over [t0 + (t1 - t0) / 4, t1): meanW (mean over GPUs of
// each GPU's mean), peakW, limitW, smMHzMean, utilMean; meanW -1 when there is no sample.
nlohmann::json powerOver(const std::vector<nlohmann::json>& ranks, double t0, double t1);

// The doctor's target for the fused path: a decode step at least this many times faster than
// the baseline (NCCL's all-reduce, then a separate add + RMSNorm kernel) at every batch
// measured. The report states it in words next to the bound the measurement allows (step /
// compute: the speed-up if communication took no time).
constexpr double kTargetSpeedup = 1.3;

// One thing to do, derived from the measurement: what, why (the numbers behind it), and the
// commands or settings to type (shell lines; "# ..." lines are comments).
struct Action {
  std::string what;
  std::string why;
  std::vector<std::string> commands;
};

// What a person reads first. `headline`: one sentence with the numbers (communication's share
// of a decode step where it is largest, and what the fused path saves). `findings`: one
// sentence each (other batches, per-call times, power). `target`: the target in words and
// whether this run met it, or why it cannot ("" for a watch). `actions`: in order of payoff.
struct Summary {
  std::string headline;
  std::vector<std::string> findings;
  std::string target;
  std::vector<Action> actions;
};
// Throws std::runtime_error naming a missing or malformed field.
Summary summarize(const nlohmann::json& m);

// `s` with every file path replaced by its last component: the report is shared, and the
// folders of the machine that measured mean nothing to its reader. A path is a
// whitespace-separated word (or the value after '=' in one) that starts with '/', "~/", "./" or
// "../", or that contains '/' and names a file with an extension; URLs are left alone.
std::string withoutLocalPaths(const std::string& s);

// Plain-words verdict: the summary (headline first, what to do), then the figures per batch.
std::string verdictText(const nlohmann::json& m);
// Self-contained HTML: the verdict and what to do first, then the plots (inline SVG), then the
// details. No network: nothing is loaded from anywhere. One inline script, which changes
// nothing a reader sees: it checks the page as rendered (plot labels that overlap or are cut
// off, whether the verdict and the first thing to do are in the first screen) and records the
// outcome as attributes of <body> (data-check="ok" once it ran to the end), so a headless
// browser test can read them from the DOM.
std::string renderHtml(const nlohmann::json& m);

// Starvation signature of one GPU's samples: busy (utilization >= kBusyUtilPct) while power is
// at most kStarvedPowerFraction of the limit. `fraction` is starved samples / busy samples. The
// verdict applies the same thresholds to a mode's mean power and utilization.
constexpr double kBusyUtilPct = 80;
constexpr double kStarvedPowerFraction = 0.45;
struct Starvation {
  int samples = 0;
  int busy = 0;
  int starved = 0;
  double fraction = 0;
  bool flagged = false;  // fraction >= 0.3 and at least 5 busy samples
};
Starvation starvation(const nlohmann::json& gpuSamples, double limitW);

// Parses "30s", "2m", "500ms", "45" (seconds). False on anything else.
bool parseDuration(const std::string& s, double* seconds);

}  // namespace doctor
}  // namespace anyr
