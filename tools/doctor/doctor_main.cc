// `anyreduce doctor`: presets, the multi-process run and the merge of the ranks' figures, the
// NVML watch, and the report from a file.
#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <fstream>
#include <sstream>

#include "common/exit_codes.h"
#include "common/launcher.h"
#include "common/progress.h"
#include "doctor.h"
#include "doctor_run.h"
#include "nvml_sampler.h"

namespace anyr {
namespace doctor {

using nlohmann::json;
using tool::kExitNoGpu;

namespace {

// The presets, as ModelShape's fields in order: name, layers, dense layers, hidden, heads, KV
// heads, head dim, dense FFN, MoE, routed experts, top-k, expert FFN, shared experts, source.
const ModelShape kPresets[] = {
    // GLM-5-like MoE: hidden 6144, 78 layers (3 dense + 75 MoE), 256 routed experts, top-8,
    // expert FFN 2048, 1 shared expert, dense FFN 12288, 64 heads (the slime GLM-5 model
    // script). GLM-5's MLA attention is approximated by GQA (64 heads x 128, 8 KV heads).
    {"glm", 78, 3, 6144, 64, 8, 128, 12288, true, 256, 8, 2048, 1,
     "GLM-5-like MoE: hidden 6144, 78 layers (3 dense, 75 MoE), 256 routed experts top-8 of "
     "FFN 2048 + 1 shared expert, dense FFN 12288, 64 attention heads (dimensions of the "
     "public slime GLM-5 model script). Attention is modelled as GQA (64 heads x 128, 8 KV "
     "heads) instead of GLM-5's MLA; experts are tensor-parallel (each expert's FFN split "
     "across ranks), uniformly routed."},
    // GLM-4.5-Air (106B total, 12B active): fits 2 x H200 in bf16, so TP2 is a real deployment.
    {"glm-air", 46, 1, 4096, 96, 8, 128, 10944, true, 128, 8, 1408, 1,
     "GLM-4.5-Air: hidden 4096, 46 layers (1 dense, 45 MoE), 128 routed experts top-8 of FFN "
     "1408 + 1 shared expert, dense FFN 10944, 96 heads x 128, 8 KV heads (public model "
     "scripts); fits two H200 in bf16. Experts tensor-parallel, uniformly routed."},
    {"llama70b", 80, 0, 8192, 64, 8, 128, 28672, false, 0, 0, 0, 0,
     "Llama-3-70B: hidden 8192, 80 layers, 64 heads x 128, 8 KV heads, FFN 28672."},
    {"tiny", 4, 1, 1024, 16, 4, 64, 2816, true, 16, 2, 512, 1,
     "tiny: a small MoE for tests (hidden 1024, 4 layers, 16 experts top-2)."},
};

}  // namespace

bool presetShape(const std::string& name, ModelShape* s) {
  *s = ModelShape{};
  s->preset = name;
  for (const ModelShape& p : kPresets) {
    if (p.preset == name) {
      *s = p;
      return true;
    }
  }
  return false;
}

std::string presetNames() {
  std::string names;
  for (const ModelShape& p : kPresets) names += (names.empty() ? "" : ", ") + p.preset;
  return names;
}

namespace {

std::string utcNow() {
  std::time_t t = std::time(nullptr);
  char b[64];
  std::strftime(b, sizeof(b), "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&t));
  return b;
}

// The ANYR_* environment variables of this run (a tuning table, forced algorithms, ...): the
// report's advice depends on them, e.g. on whether a measured tuning table was in use.
json anyrEnvironment() {
  json out = json::object();
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string kv = *e;
    const size_t eq = kv.find('=');
    if (kv.rfind("ANYR_", 0) == 0 && eq != std::string::npos) {
      out[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
  }
  return out;
}

std::string hostName() {
  char b[256] = {0};
  if (gethostname(b, sizeof(b) - 1) != 0) return "";
  return b;
}

// The measurement to jsonPath (or, with jsonStdout, on stdout), the verdict, the HTML report.
// The verdict and the report's name go to stdout, or to stderr when stdout carries the JSON.
void writeOutputs(const json& m, const std::string& jsonPath, const std::string& htmlPath,
                  bool jsonStdout) {
  FILE* const text = jsonStdout ? stderr : stdout;
  if (jsonStdout) {
    std::printf("%s\n", m.dump(1).c_str());
    std::fflush(stdout);
  } else if (!jsonPath.empty()) {
    std::ofstream f(jsonPath);
    f << m.dump(1) << "\n";
    if (!f) throw std::runtime_error("cannot write " + jsonPath);
  }
  std::fprintf(text, "%s", verdictText(m).c_str());
  if (m.contains("fabric") && m["fabric"].contains("summary")) {
    std::fprintf(text, "\nfabric: %s\n", m["fabric"]["summary"].get<std::string>().c_str());
  }
  if (!htmlPath.empty()) {
    std::ofstream f(htmlPath);
    f << renderHtml(m);
    if (!f) throw std::runtime_error("cannot write " + htmlPath);
    const bool named = !jsonStdout && !jsonPath.empty();
    std::fprintf(text, "\nreport: %s%s%s\n", htmlPath.c_str(), named ? ", measurement: " : "",
                 named ? jsonPath.c_str() : "");
  }
}

}  // namespace

int runDoctor(const RunOptions& o) {
  std::string why;
  const int ngpus = launch::countGpus(&why);
  if (ngpus == 0) {
    std::fprintf(stderr,
                 "anyreduce doctor: no usable GPU, nothing to measure (--report FILE needs "
                 "none): %s\n",
                 why.c_str());
    return kExitNoGpu;
  }
  const int nranks = o.nranks > 0 ? o.nranks : ngpus;
  if (nranks < 2) {
    std::fprintf(stderr, "anyreduce doctor: needs at least 2 ranks (GPUs visible: %d)\n", ngpus);
    return kExitNoGpu;
  }
  const double t0 = monotonicSeconds();
  const std::string base = (o.jsonPath.empty() ? std::string("doctor.json") : o.jsonPath);
  auto rankFile = [&](int r) { return base + ".rank" + std::to_string(r) + ".tmp"; };
  FILE* const text = o.jsonStdout ? stderr : stdout;
  std::fprintf(text, "anyreduce doctor: preset %s, %d layers, batches", o.shape.preset.c_str(),
               o.shape.layers);
  for (int b : o.batches) std::fprintf(text, " %d", b);
  std::fprintf(text, ", %d ranks; measuring (this takes about %d s)...\n", nranks,
               static_cast<int>(o.batches.size() * 2 * (o.sustainMs / 1000.0 + 1) + 10));
  std::fflush(text);
  auto results = launch::runRanks(
      nranks,
      [&](int rank, int n, const anyrUniqueId& id,
          const std::function<void(const std::string&)>& report) {
        try {
          return doctorRank(o, rank, n, id, ngpus, t0, rankFile(rank));
        } catch (const std::exception& e) {
          report(e.what());
          return 3;
        }
      },
      o.timeoutSec);
  const std::string failures = launch::describeFailures(results);
  if (!failures.empty()) {
    std::fprintf(stderr, "anyreduce doctor failed:\n%s", failures.c_str());
    return 1;
  }
  std::vector<json> ranks;
  for (int r = 0; r < nranks; ++r) {
    std::ifstream f(rankFile(r));
    ranks.push_back(json::parse(f));
    std::remove(rankFile(r).c_str());
  }
  const json& r0 = ranks[0];
  json m;
  m["kind"] = "run";
  m["date"] = utcNow();
  m["host"] = hostName();
  m["command"] = o.command;
  m["nranks"] = nranks;
  m["settings"] = anyrEnvironment();
  json model = {{"preset", o.shape.preset},
                {"layers", o.shape.layers},
                {"denseLayers", o.shape.denseLayers},
                {"hidden", o.shape.hidden},
                {"heads", o.shape.heads},
                {"kvHeads", o.shape.kvHeads},
                {"headDim", o.shape.headDim},
                {"intermediate", o.shape.intermediate},
                {"moe", o.shape.moe},
                {"experts", o.shape.experts},
                {"topk", o.shape.topk},
                {"moeIntermediate", o.shape.moeIntermediate},
                {"sharedExperts", o.shape.sharedExperts},
                {"shardAs", o.shardAs > 0 ? o.shardAs : nranks},
                {"perRank", r0.at("perRank")},
                {"source", o.shape.source}};
  m["model"] = model;
  if (r0.contains("fabric")) m["fabric"] = r0.at("fabric");
  char method[1536];
  std::snprintf(
      method, sizeof(method),
      "Step: median of %d CUDA-graph replays of all %d layers (bf16 cuBLAS GEMMs; attention's "
      "KV-cache reads, the embedding and the LM head are not modelled). Compute: the same graph "
      "without the communication blocks (identical for both modes). Exposed communication = "
      "step - compute. Per all-reduce: a graph of only the %d communication blocks, back to "
      "back, divided by their number. Communication block: all-reduce + residual add + RMSNorm "
      "(baseline: ncclAllReduce + anyreduce's standalone add+RMSNorm kernel; anyreduce: "
      "anyrAllReduceAddRmsNorm). NVML sampled every %d ms by a thread of each rank during %d ms "
      "of sustained replays per mode and batch (instantaneous power where the driver reports it, "
      "else the averaged reading); the first quarter of each window is dropped. "
      "Times are means over ranks.",
      o.samples, o.shape.layers, 2 * o.shape.layers, o.sampleMs, o.sustainMs);
  m["method"] = method;
  const json merged = mergeRanks(ranks);
  for (auto& [key, value] : merged.items()) m[key] = value;
  writeOutputs(m, o.jsonPath, o.htmlPath, o.jsonStdout);
  return 0;
}

int runWatch(const WatchOptions& o) {
  std::string why;
  if (!NvmlSampler::available(&why)) {
    std::fprintf(stderr,
                 "anyreduce doctor --watch: no usable GPU: NVML, the NVIDIA driver's management "
                 "library, is not available (%s); --watch needs the NVIDIA driver and a GPU\n",
                 why.c_str());
    return kExitNoGpu;
  }
  const int n = NvmlSampler::deviceCount();
  if (n == 0) {
    std::fprintf(stderr, "anyreduce doctor --watch: no usable GPU: NVML sees none\n");
    return kExitNoGpu;
  }
  json gpus = json::array();
  std::vector<int> idx;
  for (int i = 0; i < n; ++i) {
    GpuStatic g;
    NvmlSampler::describe(i, &g);
    gpus.push_back(
        {{"index", i}, {"name", g.name}, {"powerLimitW", g.powerLimitW}, {"maxSmMHz", g.maxSmMHz}});
    idx.push_back(i);
  }
  FILE* const text = o.jsonStdout ? stderr : stdout;
  std::fprintf(text, "anyreduce doctor --watch: sampling %d GPU(s) every %d ms for %.0f s...\n", n,
               o.sampleMs, o.seconds);
  std::fflush(text);
  const double t0 = monotonicSeconds();
  NvmlSampler sampler;
  sampler.start(idx, o.sampleMs, t0);
  {
    tool::ProgressLine progress("doctor --watch", o.seconds, o.progress);
    const std::string what = "sampling " + std::to_string(n) + " GPU(s)";
    for (double t = 0; t < o.seconds; t = monotonicSeconds() - t0) {
      progress.update(t, what);
      usleep(50000);
    }
  }
  sampler.stop();
  json samples = json::array();
  for (size_t i = 0; i < idx.size(); ++i)
    samples.push_back(samplesJson(idx[i], sampler.samples()[i]));
  json m = {{"kind", "watch"},      {"date", utcNow()},       {"host", hostName()},
            {"command", o.command}, {"durationS", o.seconds}, {"intervalMs", o.sampleMs},
            {"gpus", gpus},         {"samples", samples}};
  writeOutputs(m, o.jsonPath, o.htmlPath, o.jsonStdout);
  return 0;
}

int reportFromFile(const std::string& jsonPath, const std::string& htmlPath, bool jsonStdout) {
  std::ifstream f(jsonPath);
  if (!f) {
    std::fprintf(stderr, "anyreduce doctor --report: cannot read %s\n", jsonPath.c_str());
    return 1;
  }
  json m;
  try {
    m = json::parse(f);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "anyreduce doctor --report: %s is not JSON: %s\n", jsonPath.c_str(),
                 e.what());
    return 1;
  }
  writeOutputs(m, "", htmlPath, jsonStdout);
  return 0;
}

}  // namespace doctor
}  // namespace anyr
