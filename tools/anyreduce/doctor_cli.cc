#include "doctor_cli.h"

#include <cstdio>
#include <memory>
#include <sstream>

#include "cli_common.h"
#include "common/api.h"
#include "common/progress.h"
#include "config_flags.h"
#include "doctor/doctor.h"

namespace anyr {
namespace tool {

namespace {

std::vector<int> parseInts(const std::string& text, const char* what, int lo, int hi) {
  std::vector<int> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    size_t pos = 0;
    int v = 0;
    try {
      v = std::stoi(item, &pos);
    } catch (...) {
      pos = 0;
    }
    if (pos == 0 || pos != item.size() || v < lo || v > hi) {
      throw CLI::ValidationError(what, "'" + item + "' is not an integer in " + std::to_string(lo) +
                                           ".." + std::to_string(hi));
    }
    out.push_back(v);
  }
  if (out.empty()) throw CLI::ValidationError(what, "needs at least one value");
  return out;
}

struct Args {
  std::string preset = "glm", batches = "1,8,32", sweep = "1,2,4,8,16,32,64,128,256";
  std::string sustain = "2s", watch, report, html = "doctor.html";
  int layers = 0, hidden = 0, heads = 0, kvHeads = 0, headDim = 0, intermediate = 0;
  int experts = -1, topk = 0, moeIntermediate = 0, sharedExperts = -1, denseLayers = -1;
  int shardAs = 0, nranks = 0, samples = 15, sampleMs = 0, timeoutMs = 0;
  tool::CommFlags comm;  // -1: the environment's
  bool htmlSet = false;
  JsonFlag jsonFlag;  // --json [FILE]: given with FILE, json is FILE; bare: JSON on stdout
};

int runParsed(const Args& a, const std::string& command) {
  const bool jsonStdout = a.jsonFlag.toStdout();
  requireWritable(a.jsonFlag.path, "--json");
  if (!a.report.empty()) return doctor::reportFromFile(a.report, a.html, jsonStdout);
  if (!a.watch.empty()) {
    doctor::WatchOptions w;
    if (!doctor::parseDuration(a.watch, &w.seconds)) {
      throw CLI::ValidationError("--watch",
                                 "'" + a.watch + "' is not a duration (e.g. 30s, 500ms, 2m)");
    }
    if (a.sampleMs > 0) w.sampleMs = a.sampleMs;
    w.jsonPath = a.jsonFlag.toFile() ? a.jsonFlag.path : "doctor-watch.json";
    w.jsonStdout = jsonStdout;
    w.progress = progressWanted(a.jsonFlag.given());
    w.htmlPath = a.htmlSet ? a.html : "doctor-watch.html";
    w.command = command;
    return doctor::runWatch(w);
  }
  doctor::RunOptions o;
  if (!doctor::presetShape(a.preset, &o.shape)) {
    throw CLI::ValidationError("--preset",
                               "unknown preset '" + a.preset + "' (" + doctor::presetNames() + ")");
  }
  doctor::ModelShape& s = o.shape;
  const bool overridden = a.layers || a.hidden || a.heads || a.kvHeads || a.headDim ||
                          a.intermediate || a.experts >= 0 || a.topk || a.moeIntermediate ||
                          a.sharedExperts >= 0 || a.denseLayers >= 0;
  if (a.layers) s.layers = a.layers;
  if (a.hidden) s.hidden = a.hidden;
  if (a.heads) s.heads = a.heads;
  if (a.kvHeads) s.kvHeads = a.kvHeads;
  if (a.headDim) s.headDim = a.headDim;
  if (a.intermediate) s.intermediate = a.intermediate;
  if (a.experts >= 0) {
    s.experts = a.experts;
    s.moe = a.experts > 0;
  }
  if (a.topk) s.topk = a.topk;
  if (a.moeIntermediate) s.moeIntermediate = a.moeIntermediate;
  if (a.sharedExperts >= 0) s.sharedExperts = a.sharedExperts;
  if (a.denseLayers >= 0) s.denseLayers = a.denseLayers;
  if (overridden) s.source += " Overridden on the command line: see the model table.";
  if (!fusedHiddenValid(static_cast<uint64_t>(s.hidden))) {
    throw CLI::ValidationError(
        "--hidden", "must be a multiple of " + std::to_string(ANYR_FUSED_HIDDEN_MULTIPLE) + " in " +
                        std::to_string(ANYR_FUSED_MIN_HIDDEN) + ".." +
                        std::to_string(ANYR_FUSED_MAX_HIDDEN) +
                        " (the fused operation's rule), got " + std::to_string(s.hidden));
  }
  if (s.moe && (s.topk < 1 || s.topk > s.experts)) {
    throw CLI::ValidationError("--topk",
                               "must be in 1..experts (" + std::to_string(s.experts) + ")");
  }
  o.batches = parseInts(a.batches, "--batch", 1, 256);
  o.sweepTokens = parseInts(a.sweep, "--sweep", 1, 4096);
  double sustainS = 0;
  if (!doctor::parseDuration(a.sustain, &sustainS)) {
    throw CLI::ValidationError("--sustain", "'" + a.sustain + "' is not a duration");
  }
  o.sustainMs = static_cast<int>(sustainS * 1000);
  o.nranks = a.nranks;
  o.shardAs = a.shardAs;
  o.samples = a.samples;
  if (a.sampleMs > 0) o.sampleMs = a.sampleMs;
  o.timeoutMs = a.timeoutMs;
  o.comm = a.comm;
  o.jsonPath = a.jsonFlag.toFile() ? a.jsonFlag.path : "doctor.json";
  o.jsonStdout = jsonStdout;
  o.progress = progressWanted(a.jsonFlag.given());
  o.htmlPath = a.html;
  o.command = command;
  return doctor::runDoctor(o);
}

}  // namespace

std::function<int()> addDoctorCommand(CLI::App& app, int argc, char** argv) {
  auto* d = app.add_subcommand(
      "doctor",
      "Measure a synthetic tensor-parallel decode step with NCCL + separate add+RMSNorm and with "
      "anyreduce's fused path, sample power and clocks, print a verdict and write an HTML "
      "report; or --watch another workload; or --report from a saved measurement");
  auto a = std::make_shared<Args>();
  d->add_option("--preset", a->preset, "Model shape: " + doctor::presetNames() + " (default glm)");
  d->add_option("--batch", a->batches, "Comma-separated batch sizes, 1..256 (default 1,8,32)");
  d->add_option("--layers", a->layers, "Override: number of layers")->check(CLI::Range(1, 1000));
  d->add_option("--hidden", a->hidden, "Override: hidden size (multiple of 8, 128..16384)")
      ->check(CLI::Range(ANYR_FUSED_MIN_HIDDEN, ANYR_FUSED_MAX_HIDDEN));
  d->add_option("--heads", a->heads, "Override: attention heads")->check(CLI::Range(1, 1024));
  d->add_option("--kv-heads", a->kvHeads, "Override: KV heads")->check(CLI::Range(1, 1024));
  d->add_option("--head-dim", a->headDim, "Override: head dimension")->check(CLI::Range(8, 1024));
  d->add_option("--intermediate", a->intermediate, "Override: dense FFN size")
      ->check(CLI::Range(8, 1 << 20));
  d->add_option("--experts", a->experts, "Override: routed experts (0: dense MLP in every layer)")
      ->check(CLI::Range(0, 4096));
  d->add_option("--topk", a->topk, "Override: experts per token")->check(CLI::Range(1, 64));
  d->add_option("--moe-intermediate", a->moeIntermediate, "Override: expert FFN size")
      ->check(CLI::Range(8, 1 << 20));
  d->add_option("--shared-experts", a->sharedExperts, "Override: shared experts")
      ->check(CLI::Range(0, 64));
  d->add_option("--dense-layers", a->denseLayers, "Override: leading dense layers of a MoE")
      ->check(CLI::Range(0, 1000));
  d->add_option("--shard-as", a->shardAs,
                "Per-GPU shapes of a deployment sharded this many ways (default: the number of "
                "ranks); the all-reduced message is batch x hidden either way")
      ->check(CLI::Range(1, 64));
  addRanksFlag(d, &a->nranks, "World size (default: one rank per visible GPU)", 2, 64, true);
  d->add_option("--samples", a->samples, "Timed graph replays per figure; median (default 15)")
      ->check(CLI::Range(1, 10000));
  d->add_option("--sustain", a->sustain,
                "Sustained replays per mode and batch while NVML samples (default 2s)");
  d->add_option("--sample-ms", a->sampleMs, "NVML sampling interval (default 20; watch 100)")
      ->check(CLI::Range(1, 10000));
  d->add_option("--sweep", a->sweep,
                "Token counts of the latency-by-size sweep (default 1,2,...,256)");
  d->add_option("--timeout-ms", a->timeoutMs, "Bound on every wait inside anyreduce")
      ->check(CLI::Range(1, 86400000));
  addConfigFlags(d, &a->comm);
  d->add_option("--watch", a->watch,
                "Sample NVML on every GPU for this long (e.g. 30s, 2m) while another workload "
                "runs, and flag the starvation signature; no run of our own");
  d->add_option("--report", a->report,
                "Print the verdict and write the HTML report from this measurement JSON");
  addJsonFlag(d, &a->jsonFlag,
              "the measurement (default doctor.json; with --watch doctor-watch.json)");
  d->add_option("--html", a->html,
                "Write the HTML report here (default doctor.html; with --watch doctor-watch.html)")
      ->each([a](const std::string&) { a->htmlSet = true; });
  std::string command = "anyreduce";
  for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
  return [a, command]() -> int {
    try {
      return runParsed(*a, command);
    } catch (const CLI::Error&) {
      throw;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "anyreduce doctor: %s\n", e.what());
      return 1;
    }
  };
}

}  // namespace tool
}  // namespace anyr
