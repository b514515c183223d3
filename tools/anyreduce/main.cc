// The `anyreduce` command: probe, bench, explain, env, version.
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <vector>

#include "bench.h"
#include "common/data.h"
#include "common/launcher.h"
#include "core/config.h"
#include "core/env.h"
#include "core/error.h"
#include "select/admission.h"
#include "topology/probe.h"
#include "topology/topology.h"

namespace {

using namespace anyr;

int cmdProbe(bool measure, const std::string& jsonOut, const std::string& load) {
  Topology t;
  if (!load.empty()) {
    t = loadTopologyFile(load);
  } else {
    std::string why;
    if (launch::countGpus(&why) == 0) {
      std::fprintf(stderr, "anyreduce probe: no CUDA GPU is visible (%s); nothing to probe.\n",
                   why.c_str());
      return 2;
    }
    ProbeOptions po;
    po.measure = measure;
    t = probeLocal(po);
  }
  printTopology(t, std::cout);
  if (!jsonOut.empty()) {
    saveTopologyFile(t, jsonOut);
    std::printf("topology written to %s\n", jsonOut.c_str());
  }
  return 0;
}

// Admission and default choices for a topology file, as every rank of a communicator over
// those GPUs would compute them (NCCL assumed available unless --no-nccl).
int cmdExplainTopology(const std::string& path, bool nccl) {
  Topology t = loadTopologyFile(path);
  CommFacts f;
  f.nranks = t.size();
  f.sameHost = true;
  for (const GpuInfo& g : t.gpus) f.sameHost = f.sameHost && g.hostHash == t.gpus[0].hostHash;
  f.ncclAvailable = nccl;
  f.ncclReason = nccl ? "" : "disabled (--no-nccl)";
  f.peerMemory = true;
  f.hostMemory = f.sameHost && f.nranks <= 8;
  f.hostMemoryReason = f.hostMemory ? "" : "ranks on several hosts or more than 8 ranks";
  Config cfg = resolveConfig(nullptr);
  Admission adm = admit(t, f);
  Thresholds th = defaultThresholds(t, adm, cfg, t.size());
  std::printf("topology %s: %d GPUs (%s)\n\nadmission:\n", path.c_str(), t.size(),
              t.source.c_str());
  for (int a = 1; a < anyrNumAlgos; ++a) {
    const AlgoAdmission& x = adm.algo[static_cast<size_t>(a)];
    std::printf("  %-13s %-9s %s\n", anyrAlgoName(static_cast<anyrAlgo_t>(a)),
                x.admitted ? "admitted" : "REJECTED", x.reason.c_str());
  }
  std::printf("\nchoice by message size:\n");
  for (uint64_t b = 1024; b <= (256ull << 20); b *= 4) {
    std::printf("  %10llu B  %s\n", static_cast<unsigned long long>(b),
                explainChoice(adm, th, b, cfg.algorithm).c_str());
  }
  return 0;
}

int cmdExplainLive(int nranks) {
  std::string why;
  int ngpus = launch::countGpus(&why);
  if (ngpus == 0) {
    std::fprintf(stderr, "anyreduce explain: no CUDA GPU is visible (%s); use --topology FILE.\n",
                 why.c_str());
    return 2;
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
          std::printf("%s\n", buf.data());
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
  for (const env::Param& p : env::params()) {
    std::printf("%-24s default %-8s %s\n", p.name, *p.defaultValue ? p.defaultValue : "-",
                p.meaning);
    if (env::isSet(p.name)) std::printf("%-24s   (set: %s)\n", "", env::getString(p.name).c_str());
  }
  return 0;
}

// CLI11 validator + transform for sizes such as 64K / 8M.
uint64_t parseSizeOrThrow(const std::string& s, const char* what) {
  uint64_t v = 0;
  if (!env::parseSize(s, &v))
    throw CLI::ValidationError(what, "'" + s + "' is not a size (e.g. 1024, 64K, 8M, 1G)");
  return v;
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
  std::string
      minS = "1K",
      maxS = "256M", dtypesS = "bf16",
      algosS = "auto,oneshot-push,oneshot-pull,twoshot,twoshot-push,nccl,host-oneshot,host-twoshot";
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
  bench->add_option("--calls", bo.calls, "Calls per timed sample (default 20)")
      ->check(CLI::Range(1, 10000));
  bench->add_option("--samples", bo.samples, "Timed samples; median reported (default 25)")
      ->check(CLI::Range(1, 10000));
  bench->add_option("--timeout-ms", bo.timeoutMs, "Bound on every wait inside anyreduce")
      ->check(CLI::Range(1, 86400000));
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
  bench->add_option(
      "--hidden", hiddenS,
      "With --op add-rmsnorm: comma-separated hidden sizes (default 4096,6144,7168,8192)");
  bench->add_option("--tokens", tokensS,
                    "With --op add-rmsnorm: comma-separated token counts (default 1..2048)");

  auto* explain =
      app.add_subcommand("explain", "Show admission and the algorithm chosen per message size");
  std::string explainTopo;
  bool explainNoNccl = false;
  int explainRanks = 0;
  explain->add_option("--topology", explainTopo, "Explain for a topology JSON file (any machine)");
  explain->add_flag("--no-nccl", explainNoNccl, "With --topology: assume NCCL is unavailable");
  explain->add_option("-n,--nranks", explainRanks, "Live: world size (default: one per GPU)");

  app.add_subcommand("env", "List every environment variable anyreduce reads, with defaults");
  app.add_subcommand("version", "Print the library version");

  CLI11_PARSE(app, argc, argv);
  try {
    if (app.got_subcommand("probe")) return cmdProbe(!noMeasure, probeJson, probeLoad);
    if (app.got_subcommand("bench")) {
      bo.minBytes = parseSizeOrThrow(minS, "--minbytes");
      bo.maxBytes = parseSizeOrThrow(maxS, "--maxbytes");
      if (bo.minBytes == 0 || bo.minBytes > bo.maxBytes) {
        throw CLI::ValidationError("--minbytes", "must be > 0 and <= --maxbytes");
      }
      bo.graph = !noGraph;
      if (!wireS.empty()) {
        anyrWire_t w = anyrWireNative;
        parseWire(wireS, &w);
        bo.wire = static_cast<int>(w);
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
      bo.quant = quantS == "fp8"     ? anyrQuantFp8
                 : quantS == "nvfp4" ? anyrQuantNvfp4
                                     : anyrQuantNone;
      auto parseList = [](const std::string& text, const char* what, std::vector<size_t>* out) {
        if (text.empty()) return;
        out->clear();
        std::stringstream ss(text);
        for (std::string item; std::getline(ss, item, ',');) {
          uint64_t v = 0;
          if (!env::parseSize(item, &v) || v == 0) {
            throw CLI::ValidationError(what, "'" + item + "' is not a positive integer");
          }
          out->push_back(static_cast<size_t>(v));
        }
      };
      parseList(hiddenS, "--hidden", &bo.hiddens);
      parseList(tokensS, "--tokens", &bo.tokens);
      return tool::runBench(bo);
    }
    if (app.got_subcommand("explain")) {
      return explainTopo.empty() ? cmdExplainLive(explainRanks)
                                 : cmdExplainTopology(explainTopo, !explainNoNccl);
    }
    if (app.got_subcommand("env")) return cmdEnv();
    if (app.got_subcommand("version")) {
      int v = 0;
      anyrGetVersion(&v);
      std::printf("anyreduce %d.%d.%d\n", v / 10000, (v / 100) % 100, v % 100);
      return 0;
    }
  } catch (const CLI::Error& e) {
    return app.exit(e);
  } catch (const Error& e) {
    std::fprintf(stderr, "anyreduce: %s\n", e.what());
    return 1;
  }
  return 0;
}
