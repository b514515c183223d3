// The `anyreduce` command: probe, bench, explain, env, version.
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <array>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "bench.h"
#include "common/api.h"
#include "common/data.h"
#include "common/exit_codes.h"
#include "common/launcher.h"
#include "config_flags.h"
#include "doctor_cli.h"

namespace {

using namespace anyr;
using tool::algoNames;
using tool::check;
using tool::parseAlgo;
using tool::textOf;

int cmdProbe(bool measure, const std::string& jsonOut, const std::string& load) {
  std::string report;
  if (!load.empty()) {
    report = textOf([&](char* b, size_t n,
                        size_t* need) { return anyrDescribeTopology(load.c_str(), b, n, need); },
                    nullptr, "anyrDescribeTopology");
  } else {
    std::string why;
    if (launch::countGpus(&why) == 0) {
      std::fprintf(stderr, "anyreduce probe: no usable GPU, nothing to probe: %s\n", why.c_str());
      return tool::kExitNoGpu;
    }
    // A description longer than the first buffer probes again (textOf): never seen in practice.
    report = textOf(
        [&](char* b, size_t n, size_t* need) {
          return anyrProbeTopology(measure ? 1 : 0, jsonOut.empty() ? nullptr : jsonOut.c_str(), b,
                                   n, need);
        },
        nullptr, "anyrProbeTopology", 1 << 20);
  }
  std::cout << nlohmann::json::parse(report)["text"].get<std::string>();
  if (!jsonOut.empty()) std::printf("topology written to %s\n", jsonOut.c_str());
  return 0;
}

// Admission and default choices for a topology file, as every rank of a communicator over
// those GPUs would compute them (NCCL assumed available unless --no-nccl): anyrExplainTopology.
int cmdExplainTopology(const std::string& path, bool nccl, int nranks,
                       const std::string& tuningFile, const std::string& algo) {
  const auto described = nlohmann::json::parse(
      textOf([&](char* b, size_t n,
                 size_t* need) { return anyrDescribeTopology(path.c_str(), b, n, need); },
             nullptr, "anyrDescribeTopology"));
  const int gpus = described["gpus"].get<int>();
  if (nranks > gpus) {
    std::fprintf(stderr, "anyreduce explain: --nranks %d but the topology has %d GPUs\n", nranks,
                 gpus);
    return tool::kExitUsage;
  }
  anyrConfig_t cfg = ANYR_CONFIG_INITIALIZER;  // the environment's, --algo over ANYR_ALGO
  if (!algo.empty()) {
    anyrAlgo_t a = anyrAlgoAuto;
    if (!parseAlgo(algo, &a)) {
      std::fprintf(stderr, "anyreduce explain: --algo '%s': must be one of %s\n", algo.c_str(),
                   algoNames().c_str());
      return tool::kExitUsage;
    }
    cfg.algorithm = a;
  }
  const auto j = nlohmann::json::parse(textOf(
      [&](char* b, size_t n, size_t* need) {
        return anyrExplainTopology(path.c_str(), nranks, nccl ? 1 : 0,
                                   tuningFile.empty() ? nullptr : tuningFile.c_str(), &cfg, b, n,
                                   need);
      },
      nullptr, "anyrExplainTopology"));
  std::printf("topology %s: %d GPUs (%s)\n\nadmission:\n", path.c_str(), j["gpus"].get<int>(),
              j["source"].get<std::string>().c_str());
  for (const auto& a : j["admission"]) {
    std::printf("  %-13s %-9s %s\n", a["algo"].get<std::string>().c_str(),
                a["admitted"].get<bool>() ? "admitted" : "REJECTED",
                a["reason"].get<std::string>().c_str());
  }
  for (const auto& w : j["warnings"]) std::printf("warning: %s\n", w.get<std::string>().c_str());
  const std::string forcedError = j["forcedError"].get<std::string>();
  if (!forcedError.empty()) {
    std::fprintf(stderr, "anyreduce explain: forced algorithm (--algo / ANYR_ALGO): %s\n",
                 forcedError.c_str());
    return 1;
  }
  std::printf("\n%s", j["dispatchText"].get<std::string>().c_str());
  return 0;
}

int cmdExplainLive(int nranks, bool json) {
  std::string why;
  int ngpus = launch::countGpus(&why);
  if (ngpus == 0) {
    std::fprintf(stderr,
                 "anyreduce explain: no usable GPU (explain --topology FILE needs none): %s\n",
                 why.c_str());
    return tool::kExitNoGpu;
  }
  if (nranks <= 0) nranks = ngpus;
  auto results = launch::runRanks(
      nranks,
      [&](int rank, int n, const anyrUniqueId& id,
          const std::function<void(const std::string&)>& report) {
        if (cudaSetDevice(rank % ngpus) != cudaSuccess) return 3;
        anyrComm_t comm = nullptr;
        if (anyrCommInitRank(&comm, n, id, rank) != anyrSuccess) {
          report(anyrGetLastError(nullptr));
          return 3;
        }
        if (rank == 0) {
          size_t need = 0;
          anyrCommExplain(comm, nullptr, 0, &need);
          std::vector<char> buf(need);
          anyrCommExplain(comm, buf.data(), buf.size(), &need);
          if (json) {
            std::printf("%s\n", buf.data());
          } else {
            // Admission, then the dispatch per operation and size bucket.
            auto j = nlohmann::json::parse(buf.data());
            std::printf("live communicator: %d ranks\n\nadmission:\n", n);
            for (auto& [name, a] : j["admission"].items()) {
              std::printf("  %-13s %-9s %s\n", name.c_str(),
                          a["admitted"].get<bool>() ? "admitted" : "REJECTED",
                          a["reason"].get<std::string>().c_str());
            }
            std::printf("\n%s", j["dispatchText"].get<std::string>().c_str());
          }
        }
        return anyrCommDestroy(comm) == anyrSuccess ? 0 : 3;
      },
      300);
  std::string failures = launch::describeFailures(results);
  if (!failures.empty()) {
    std::fprintf(stderr, "anyreduce explain failed:\n%s", failures.c_str());
    return 1;
  }
  return 0;
}

int cmdEnv() {
  const auto params = nlohmann::json::parse(
      textOf([](char* b, size_t n, size_t* need) { return anyrGetEnvParams(b, n, need); }, nullptr,
             "anyrGetEnvParams"));
  for (const auto& p : params) {
    const std::string dflt = p["default"].get<std::string>();
    std::printf("%-24s default %-8s %s\n", p["name"].get<std::string>().c_str(),
                dflt.empty() ? "-" : dflt.c_str(), p["meaning"].get<std::string>().c_str());
    if (p.contains("value"))
      std::printf("%-24s   (set: %s)\n", "", p["value"].get<std::string>().c_str());
  }
  return 0;
}

// CLI11 validator + transform for sizes such as 64K / 8M.
uint64_t parseSizeOrThrow(const std::string& s, const char* what) {
  uint64_t v = 0;
  if (!tool::parseSize(s, &v))
    throw CLI::ValidationError(what, "'" + s + "' is not a size (e.g. 1024, 64K, 8M, 1G)");
  return v;
}

// --calls and --samples (each 1..maxCount) and --timeout-ms: the timing flags of bench and tune.
void addTimingFlags(CLI::App* sub, int* calls, int* samples, int* timeoutMs, int maxCount,
                    const std::string& callsHelp, const std::string& samplesHelp) {
  sub->add_option("--calls", *calls, callsHelp)->check(CLI::Range(1, maxCount));
  sub->add_option("--samples", *samples, samplesHelp)->check(CLI::Range(1, maxCount));
  sub->add_option("--timeout-ms", *timeoutMs, "Bound on every wait inside anyreduce")
      ->check(CLI::Range(1, 86400000));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"anyreduce: all-reduce for tensor-parallel inference on any NVIDIA GPU and link"};
  app.require_subcommand(1);

  auto* probe =
      app.add_subcommand("probe",
                         "Probe the GPUs and every pair: capabilities, confirmed transfers, "
                         "bandwidth and latency; print tables");
  bool noMeasure = false;
  std::string probeJson, probeLoad;
  probe->add_flag("--no-measure", noMeasure, "Confirm transfers only; skip bandwidth and latency");
  probe->add_option("--json", probeJson, "Write the topology as JSON to this file");
  probe->add_option("--load", probeLoad, "Print a topology JSON file instead of probing");

  auto* bench =
      app.add_subcommand("bench", "Benchmark all-reduce against NCCL, one process per GPU");
  tool::BenchOptions bo;
  std::string minS = "1K", maxS = "256M", dtypesS = "bf16", algosS;
  for (int a = 0; a < anyrNumAlgos; ++a) {  // every algorithm, in enum order
    algosS += std::string(a ? "," : "") + anyrAlgoName(static_cast<anyrAlgo_t>(a));
  }
  bool noGraph = false;
  bench->add_option("-b,--minbytes", minS, "Smallest message (default 1K)");
  bench->add_option("-e,--maxbytes", maxS, "Largest message (default 256M)");
  bench->add_option("-f,--stepfactor", bo.factor, "Size multiplier between steps (default 2)")
      ->check(CLI::Range(1.01, 1024.0));
  bench->add_option("-d,--dtypes", dtypesS,
                    "Comma-separated dtypes: bf16, fp16, fp32 (default bf16)");
  bench->add_option("-a,--algos", algosS,
                    "Comma-separated algorithms (default: all) among " + algoNames());
  bench->add_option("-n,--nranks", bo.nranks, "World size (default: one rank per visible GPU)")
      ->check(CLI::Range(2, 64));
  bench->add_flag("--no-graph", noGraph, "Time eager launches instead of CUDA-graph replays");
  bench->add_flag("--inplace", bo.inPlace, "In-place all-reduce");
  addTimingFlags(bench, &bo.calls, &bo.samples, &bo.timeoutMs, 10000,
                 "Calls per timed sample (default 20)",
                 "Timed samples; median reported (default 25)");
  bench->add_option("--json", bo.jsonPath, "Write every figure to this JSON file");
  std::string wireS;
  bench
      ->add_option("--wire", wireS,
                   "Wire format of the host-memory algorithms: native, fp8 or int8 (default: "
                   "ANYR_WIRE or native)")
      ->check(CLI::IsMember({"native", "fp8", "int8"}));
  std::string quantS = "none", hiddenS, tokensS;
  bench
      ->add_option("--op", bo.op,
                   "allreduce (default) or add-rmsnorm (fused all-reduce + residual + RMSNorm)")
      ->check(CLI::IsMember({"allreduce", "add-rmsnorm"}));
  bench->add_option("--quant", quantS, "With --op add-rmsnorm: none, fp8 or nvfp4")
      ->check(CLI::IsMember({"none", "fp8", "nvfp4"}));
  bench->add_flag("--quant-only", bo.quantOnly,
                  "With --quant fp8|nvfp4: the quantized output only (normOut NULL), as a layer "
                  "whose next GEMM reads FP8 or NVFP4 runs it");
  bench->add_option(
      "--hidden", hiddenS,
      "With --op add-rmsnorm: comma-separated hidden sizes (default 4096,6144,7168,8192)");
  bench->add_option("--tokens", tokensS,
                    "With --op add-rmsnorm: comma-separated token counts (default 1..2048)");
  bench->add_flag("--check-dispatch", bo.checkDispatch,
                  "Time every admitted candidate and the dispatched choice (all-reduce over the "
                  "size range, fused op 1..2048 tokens at hidden 6144); fail if dispatch is over "
                  "1.03x the fastest (tuned table) or 1.10x NCCL (seed only)");
  tool::addConfigFlags(bench, &bo.comm);

  auto* tune = app.add_subcommand(
      "tune", "Measure every admitted path per operation and size; write a tuning table");
  tool::TuneCliOptions to;
  std::string tuneMinS = "1K", tuneMaxS = "256M";
  double tuneBudgetS = 0;
  tune->add_option("-n,--nranks", to.nranks, "World size (default: one rank per visible GPU)")
      ->check(CLI::Range(2, 64));
  tune->add_option("-o,--output", to.output,
                   "Tuning table to write (default anyreduce-tuning.json)");
  tune->add_option("-b,--minbytes", tuneMinS, "Smallest all-reduce size (default 1K)");
  tune->add_option("-e,--maxbytes", tuneMaxS, "Largest all-reduce size (default 256M)");
  tune->add_option("--hidden", to.hidden, "Fused op: hidden size measured (default 6144)")
      ->check(CLI::Range(ANYR_FUSED_MIN_HIDDEN, ANYR_FUSED_MAX_HIDDEN));
  tune->add_option("--max-tokens", to.maxTokens, "Fused op: 1, 2, 4 .. this many tokens (2048)")
      ->check(CLI::Range(1, 65536));
  tune->add_option("--budget-s", tuneBudgetS, "Stop measuring after this many seconds (0: none)")
      ->check(CLI::Range(0.0, 3600.0));
  addTimingFlags(tune, &to.calls, &to.samples, &to.timeoutMs, 1000,
                 "Calls per timed sample (default 10)", "Timed samples; median used (default 7)");
  tool::addConfigFlags(tune, &to.comm);  // the table is measured under them

  auto* explain =
      app.add_subcommand("explain", "Show admission and the algorithm chosen per message size");
  std::string explainTopo;
  bool explainNoNccl = false;
  int explainRanks = 0;
  explain->add_option("--topology", explainTopo, "Explain for a topology JSON file (any machine)");
  explain->add_flag("--no-nccl", explainNoNccl, "With --topology: assume NCCL is unavailable");
  explain
      ->add_option("-n,--nranks,--ranks", explainRanks,
                   "World size (live: default one per GPU; --topology: the first N GPUs)")
      ->check(CLI::Range(1, 1024));
  std::string explainTuning;
  bool explainJson = false;
  explain->add_option("--tuning-file", explainTuning,
                      "With --topology: apply this tuning table if its fingerprint matches "
                      "(live: ANYR_TUNING_FILE)");
  explain->add_flag("--json", explainJson, "Live: print the communicator's whole JSON explain");
  std::string explainAlgo;
  explain->add_option("--algo", explainAlgo,
                      "With --topology: force this algorithm (as ANYR_ALGO would); fails naming "
                      "why when the topology does not admit it");

  auto runDoctor = tool::addDoctorCommand(app, argc, argv);
  app.add_subcommand("env", "List every environment variable anyreduce reads, with defaults");
  app.add_subcommand("version", "Print the library version");
  // One exit-status convention for every subcommand (common/exit_codes.h), in every --help.
  app.footer(tool::exitCodesHelp());
  for (CLI::App* sub : app.get_subcommands({})) sub->footer(tool::exitCodesHelp());

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? tool::kExitOk : tool::kExitUsage;  // --help is not an error
  }
  // An output file is checked before a run, which may take minutes, rather than after it: its
  // directory must exist and take the file (a file made only for the check is removed).
  auto requireWritable = [](const std::string& path, const char* flag) {
    if (path.empty()) return;
    const bool existed = std::ifstream(path).good();
    const bool ok = std::ofstream(path, std::ios::app).good();
    if (!existed) std::remove(path.c_str());
    if (!ok) throw CLI::ValidationError(flag, "cannot write '" + path + "'");
  };
  try {
    if (app.got_subcommand("probe")) return cmdProbe(!noMeasure, probeJson, probeLoad);
    if (app.got_subcommand("bench")) {
      requireWritable(bo.jsonPath, "--json");
      bo.minBytes = parseSizeOrThrow(minS, "--minbytes");
      bo.maxBytes = parseSizeOrThrow(maxS, "--maxbytes");
      if (bo.minBytes == 0 || bo.minBytes > bo.maxBytes) {
        throw CLI::ValidationError("--minbytes", "must be > 0 and <= --maxbytes");
      }
      bo.graph = !noGraph;
      if (!wireS.empty()) {
        // The names of anyrWire_t in enum order (the flag's check admits only these).
        bo.wire = wireS == "int8" ? anyrWireInt8 : wireS == "fp8" ? anyrWireFp8 : anyrWireNative;
      }
      bo.dtypes.clear();
      std::stringstream ds(dtypesS);
      for (std::string d; std::getline(ds, d, ',');) {
        anyrDataType_t t;
        if (!data::parseDtype(d, &t))
          throw CLI::ValidationError("--dtypes", "unknown dtype '" + d + "' (bf16, fp16, fp32)");
        bo.dtypes.push_back(t);
      }
      bo.algos.clear();
      std::stringstream as(algosS);
      for (std::string a; std::getline(as, a, ',');) {
        anyrAlgo_t x;
        if (!parseAlgo(a, &x))
          throw CLI::ValidationError("--algos",
                                     "unknown algorithm '" + a + "' (" + algoNames() + ")");
        bo.algos.push_back(a);
      }
      if (bo.dtypes.empty()) throw CLI::ValidationError("--dtypes", "names no dtype");
      if (bo.algos.empty()) throw CLI::ValidationError("--algos", "names no algorithm");
      bo.quant = quantS == "fp8"     ? anyrQuantFp8
                 : quantS == "nvfp4" ? anyrQuantNvfp4
                                     : anyrQuantNone;
      if (bo.quantOnly && bo.quant == anyrQuantNone) {
        throw CLI::ValidationError("--quant-only",
                                   "needs --quant fp8 or nvfp4 (normOut may be "
                                   "NULL only with a quantized output)");
      }
      auto parseList = [](const std::string& text, const char* what, std::vector<size_t>* out) {
        if (text.empty()) return;
        out->clear();
        std::stringstream ss(text);
        for (std::string item; std::getline(ss, item, ',');) {
          uint64_t v = 0;
          if (!tool::parseSize(item, &v) || v == 0) {
            throw CLI::ValidationError(what, "'" + item + "' is not a positive integer");
          }
          out->push_back(static_cast<size_t>(v));
        }
      };
      parseList(hiddenS, "--hidden", &bo.hiddens);
      parseList(tokensS, "--tokens", &bo.tokens);
      for (size_t h : bo.hiddens) {  // before any buffer is sized or filled for it
        const int multiple = tool::fusedHiddenMultiple(bo.quant);
        if (!tool::fusedHiddenValid(h, bo.quant)) {
          throw CLI::ValidationError("--hidden", std::to_string(h) + " is not a multiple of " +
                                                     std::to_string(multiple) + " in " +
                                                     std::to_string(ANYR_FUSED_MIN_HIDDEN) + ".." +
                                                     std::to_string(ANYR_FUSED_MAX_HIDDEN));
        }
      }
      if (bo.checkDispatch) {
        // One hidden size (default 6144) and, by default, tokens 1, 2, 4, ..., 2048.
        if (hiddenS.empty()) bo.hiddens = {6144};
        if (bo.hiddens.size() != 1) {
          throw CLI::ValidationError("--hidden", "--check-dispatch takes one hidden size");
        }
        if (tokensS.empty()) {
          bo.tokens.clear();
          for (size_t t = 1; t <= 2048; t *= 2) bo.tokens.push_back(t);
        }
      }
      return tool::runBench(bo);
    }
    if (app.got_subcommand("tune")) {
      requireWritable(to.output, "--output");
      to.minBytes = parseSizeOrThrow(tuneMinS, "--minbytes");
      to.maxBytes = parseSizeOrThrow(tuneMaxS, "--maxbytes");
      if (to.minBytes < 2 || to.minBytes > to.maxBytes) {
        throw CLI::ValidationError("--minbytes", "must be >= 2 and <= --maxbytes");
      }
      if (to.hidden % ANYR_FUSED_HIDDEN_MULTIPLE != 0) {
        throw CLI::ValidationError("--hidden", std::to_string(to.hidden) +
                                                   " is not a multiple of " +
                                                   std::to_string(ANYR_FUSED_HIDDEN_MULTIPLE));
      }
      to.budgetMs = static_cast<int>(tuneBudgetS * 1000);
      return tool::runTune(to);
    }
    if (app.got_subcommand("explain")) {
      if (explainTopo.empty()) {  // a live communicator reads its environment instead
        const char* flag = explainNoNccl            ? "--no-nccl"
                           : !explainTuning.empty() ? "--tuning-file"
                           : !explainAlgo.empty()   ? "--algo"
                                                    : nullptr;
        if (flag != nullptr) {
          throw CLI::ValidationError(flag,
                                     "only with --topology (live: ANYR_USE_NCCL, "
                                     "ANYR_TUNING_FILE and ANYR_ALGO)");
        }
      }
      return explainTopo.empty() ? cmdExplainLive(explainRanks, explainJson)
                                 : cmdExplainTopology(explainTopo, !explainNoNccl, explainRanks,
                                                      explainTuning, explainAlgo);
    }
    if (app.got_subcommand("doctor")) return runDoctor();
    if (app.got_subcommand("env")) return cmdEnv();
    if (app.got_subcommand("version")) {
      int v = 0;
      anyrGetVersion(&v);
      std::printf("anyreduce %d.%d.%d\n", v / 10000, (v / 100) % 100, v % 100);
      return 0;
    }
  } catch (const CLI::Error& e) {
    return app.exit(e) == 0 ? tool::kExitOk : tool::kExitUsage;
  } catch (const tool::ApiError& e) {
    std::fprintf(stderr, "anyreduce: %s\n", e.what());
    return tool::kExitFailed;
  }
  return 0;
}
