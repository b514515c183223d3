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
// Plain-words verdict with the numbers.
std::string verdictText(const nlohmann::json& m);
// Self-contained HTML (inline SVG, no scripts, no network).
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
