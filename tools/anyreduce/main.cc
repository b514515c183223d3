// The `anyreduce` command: probe, bench, tune, explain, doctor, env, version. A bare `anyreduce`
// prints the help; `anyreduce --version` the version; every command takes --json.
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <array>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "bench.h"
#include "bench_cli.h"
#include "cli_common.h"
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

int cmdProbe(bool measure, const tool::JsonFlag& json, const std::string& load) {
  std::string report;
  if (!load.empty()) {
    report = textOf([&](char* b, size_t n,
                        size_t* need) { return anyrDescribeTopology(load.c_str(), b, n, need); },
                    nullptr, "anyrDescribeTopology");
    if (json.toStdout()) {  // the file is the topology's JSON already
      std::ifstream f(load);
      std::stringstream text;
      text << f.rdbuf();
      tool::emitJson(json, text.str());
      return 0;
    }
  } else {
    std::string why;
    if (launch::countGpus(&why) == 0) {
      std::fprintf(stderr, "anyreduce probe: no usable GPU, nothing to probe: %s\n", why.c_str());
      return tool::kExitNoGpu;
    }
    // A bare --json: the topology goes through a file of our own, then to stdout.
    std::string savePath = json.path;
    if (json.toStdout()) {
      char tmpl[] = "/tmp/anyreduce-probe-XXXXXX";
      const int fd = mkstemp(tmpl);
      if (fd < 0) throw std::runtime_error("cannot create a temporary file for --json");
      close(fd);
      savePath = tmpl;
    }
    // A description longer than the first buffer probes again (textOf): never seen in practice.
    report = textOf(
        [&](char* b, size_t n, size_t* need) {
          return anyrProbeTopology(measure ? 1 : 0, savePath.empty() ? nullptr : savePath.c_str(),
                                   b, n, need);
        },
        nullptr, "anyrProbeTopology", 1 << 20);
    if (json.toStdout()) {
      std::ifstream f(savePath);
      std::stringstream text;
      text << f.rdbuf();
      std::remove(savePath.c_str());
      tool::emitJson(json, text.str());
      return 0;
    }
  }
  std::cout << nlohmann::json::parse(report)["text"].get<std::string>();
  if (json.toFile()) std::printf("topology written to %s\n", json.path.c_str());
  return 0;
}

// Admission and default choices for a topology file, as every rank of a communicator over
// those GPUs would compute them (NCCL assumed available unless --no-nccl): anyrExplainTopology.
int cmdExplainTopology(const std::string& path, bool nccl, int nranks,
                       const std::string& tuningFile, const std::string& algo,
                       const tool::JsonFlag& json) {
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
  if (json.given()) {
    tool::emitJson(json, j.dump(2));
    if (json.toStdout()) return j["forcedError"].get<std::string>().empty() ? 0 : 1;
  }
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

int cmdExplainLive(int nranks, const tool::JsonFlag& json) {
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
          if (json.given()) {
            try {
              tool::emitJson(json, buf.data());
            } catch (const std::exception& e) {
              report(e.what());
              anyrCommDestroy(comm);
              return 3;
            }
          }
          if (!json.toStdout()) {
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

int cmdEnv(const tool::JsonFlag& json) {
  const auto params = nlohmann::json::parse(
      textOf([](char* b, size_t n, size_t* need) { return anyrGetEnvParams(b, n, need); }, nullptr,
             "anyrGetEnvParams"));
  if (json.given()) tool::emitJson(json, params.dump(2));
  if (json.toStdout()) return 0;
  for (const auto& p : params) {
    const std::string dflt = p["default"].get<std::string>();
    std::printf("%-24s default %-8s %s\n", p["name"].get<std::string>().c_str(),
                dflt.empty() ? "-" : dflt.c_str(), p["meaning"].get<std::string>().c_str());
    if (p.contains("value"))
      std::printf("%-24s   (set: %s)\n", "", p["value"].get<std::string>().c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"anyreduce: all-reduce for tensor-parallel inference on any NVIDIA GPU and link"};
  app.require_subcommand(0, 1);  // none: the help (below)
  app.set_version_flag("--version", "anyreduce " + tool::libraryVersion(),
                       "Print the library version and exit");

  auto* probe =
      app.add_subcommand("probe",
                         "Probe the GPUs and every pair: capabilities, confirmed transfers, "
                         "bandwidth and latency; print tables");
  bool noMeasure = false;
  std::string probeLoad;
  tool::JsonFlag probeJson;
  probe->add_flag("--no-measure", noMeasure, "Confirm transfers only; skip bandwidth and latency");
  tool::addJsonFlag(probe, &probeJson,
                    "the topology (`probe --load` and `explain --topology` "
                    "read it)");
  probe->add_option("--load", probeLoad, "Print a topology JSON file instead of probing")
      ->type_name("FILE");

  auto runBench = tool::addBenchCommand(app, argc, argv);
  auto runTune = tool::addTuneCommand(app);

  auto* explain =
      app.add_subcommand("explain", "Show admission and the algorithm chosen per message size");
  std::string explainTopo;
  bool explainNoNccl = false;
  int explainRanks = 0;
  explain->add_option("--topology", explainTopo, "Explain for a topology JSON file (any machine)")
      ->type_name("FILE");
  explain->add_flag("--no-nccl", explainNoNccl, "With --topology: assume NCCL is unavailable");
  tool::addRanksFlag(explain, &explainRanks,
                     "World size (live: default one per GPU; --topology: the first N GPUs)", 1,
                     1024, true);
  std::string explainTuning;
  tool::JsonFlag explainJson;
  explain
      ->add_option("--tuning-file", explainTuning,
                   "With --topology: apply this tuning table if its fingerprint matches "
                   "(live: ANYR_TUNING_FILE)")
      ->type_name("FILE");
  tool::addJsonFlag(explain, &explainJson, "the whole explanation");
  std::string explainAlgo;
  explain
      ->add_option("--algo", explainAlgo,
                   "With --topology: force this algorithm (as ANYR_ALGO would); fails naming "
                   "why when the topology does not admit it")
      ->type_name("ALGO");

  auto runDoctor = tool::addDoctorCommand(app, argc, argv);
  auto* env =
      app.add_subcommand("env", "List every environment variable anyreduce reads, with defaults");
  tool::JsonFlag envJson;
  tool::addJsonFlag(env, &envJson, "the variables (name, default, meaning, value when set)");
  auto* version = app.add_subcommand("version", "Print the library version");
  tool::JsonFlag versionJson;
  tool::addJsonFlag(version, &versionJson, "the version");
  // One exit-status convention for every subcommand (common/exit_codes.h), in every --help.
  // Set last: a subcommand added after it would not carry it.
  app.footer(
      std::string("Run `anyreduce COMMAND --help` for a command's options. Every command takes "
                  "--json [FILE]: its record as JSON in FILE, or bare on stdout in place of the "
                  "text.\n") +
      tool::exitCodesHelp());
  for (CLI::App* sub : app.get_subcommands({})) sub->footer(tool::exitCodesHelp());

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? tool::kExitOk : tool::kExitUsage;  // --help is not an error
  }
  try {
    for (const tool::JsonFlag* j : {&probeJson, &explainJson, &envJson, &versionJson}) {
      tool::requireWritable(j->path, "--json");
    }
    if (app.got_subcommand("probe")) return cmdProbe(!noMeasure, probeJson, probeLoad);
    if (app.got_subcommand("bench")) return runBench();
    if (app.got_subcommand("tune")) return runTune();
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
                                                      explainTuning, explainAlgo, explainJson);
    }
    if (app.got_subcommand("doctor")) return runDoctor();
    if (app.got_subcommand("env")) return cmdEnv(envJson);
    if (app.got_subcommand("version")) {
      int v = 0;
      anyrGetVersion(&v);
      if (versionJson.given()) {
        tool::emitJson(versionJson,
                       nlohmann::json({{"version", tool::libraryVersion()}, {"code", v}}).dump(2));
        if (versionJson.toStdout()) return 0;
      }
      std::printf("anyreduce %s\n", tool::libraryVersion().c_str());
      return 0;
    }
    // No command: what there is, and how to ask for more.
    std::printf("%s", app.help().c_str());
    return 0;
  } catch (const CLI::Error& e) {
    return app.exit(e) == 0 ? tool::kExitOk : tool::kExitUsage;
  } catch (const tool::ApiError& e) {
    std::fprintf(stderr, "anyreduce: %s\n", e.what());
    return tool::kExitFailed;
  } catch (const std::runtime_error& e) {
    std::fprintf(stderr, "anyreduce: %s\n", e.what());
    return tool::kExitFailed;
  }
}
