#include "bench_cli.h"

#include <cstdio>
#include <cstring>
#include <memory>
#include <sstream>

#include "bench.h"
#include "cli_common.h"
#include "common/api.h"
#include "common/progress.h"
#include "config_flags.h"

namespace anyr {
namespace tool {

namespace {

// --calls / -n and --samples (each 1..maxCount) and --timeout-ms: the timing flags of bench and
// tune.
void addTimingFlags(CLI::App* sub, int* calls, int* samples, int* timeoutMs, int maxCount,
                    const std::string& callsNames, const std::string& callsHelp,
                    const std::string& samplesHelp) {
  sub->add_option(callsNames, *calls, callsHelp)->check(CLI::Range(1, maxCount));
  sub->add_option("--samples", *samples, samplesHelp)->check(CLI::Range(1, maxCount));
  sub->add_option("--timeout-ms", *timeoutMs, "Bound on every wait inside anyreduce")
      ->check(CLI::Range(1, 86400000));
}

// True when `text` is a comma-separated list of algorithm names: what -a took before it meant
// the rank averaging.
bool isAlgoList(const std::string& text) {
  std::stringstream ss(text);
  bool any = false;
  for (std::string item; std::getline(ss, item, ',');) {
    anyrAlgo_t a = anyrAlgoAuto;
    if (!parseAlgo(item, &a)) return false;
    any = true;
  }
  return any;
}

// -a: 0..3 as nccl-tests; algorithm names (its old meaning) are refused, saying where they go.
CLI::Validator averageRule() {
  return CLI::Validator(
      [](std::string& t) {
        if (t == "0" || t == "1" || t == "2" || t == "3") return std::string();
        if (isAlgoList(t)) {
          return "-a is the rank averaging now, as in nccl-tests (0 rank 0, 1 mean, 2 min, 3 "
                 "max); algorithms are chosen with --algos (use --algos " +
                 t + ")";
        }
        return "must be 0 (rank 0), 1 (mean over ranks), 2 (min) or 3 (max) (got '" + t + "')";
      },
      "");
}

// -o: the reduction (sum: nccl-tests' name for the all-reduce's; "allreduce" as before), or
// the fused operation. nccl-tests' other reductions are refused by name.
CLI::Validator opRule() {
  return CLI::Validator(
      [](std::string& t) {
        if (t == "sum" || t == "allreduce" || t == "add-rmsnorm") return std::string();
        for (const char* other : {"prod", "min", "max", "avg", "mulsum", "all"}) {
          if (t == other) {
            return "anyreduce's all-reduce sums (anyrSum is its only reduction): -o sum, or -o "
                   "add-rmsnorm for the fused all-reduce + residual add + RMSNorm (got '" +
                   t + "')";
          }
        }
        return "must be sum (the all-reduce; also 'allreduce') or add-rmsnorm (got '" + t + "')";
      },
      "");
}

// Whether argv, after the `bench` word, has -n (short, with its value apart or attached), and
// whether it sets the ranks another way (--ranks, --nranks, -g).
void scanDashN(int argc, char** argv, bool* dashN, bool* ranksSet) {
  bool inBench = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (!inBench) {
      inBench = a == "bench";
      continue;
    }
    if (a == "-n" || (a.size() > 2 && a.compare(0, 2, "-n") == 0 && a[2] != '-')) *dashN = true;
    if (a.compare(0, 7, "--ranks") == 0 || a.compare(0, 8, "--nranks") == 0 ||
        a.compare(0, 2, "-g") == 0 || a.compare(0, 7, "--ngpus") == 0) {
      *ranksSet = true;
    }
  }
}

struct BenchArgs {
  BenchOptions bo;
  std::string minS = "1K", maxS = "256M", dtypesS = "bf16", algosS, wireS, op = "sum";
  std::string quantS = "none", hiddenS, tokensS;
  int average = 1, graphReplays = -1;
  std::string load;
  bool noGraph = false, inPlaceOld = false, dashN = false, ranksSet = false;
  JsonFlag json;
  CLI::Option* samplesOpt = nullptr;
};

std::vector<size_t> parseList(const std::string& text, const char* what) {
  std::vector<size_t> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    uint64_t v = 0;
    if (!parseSize(item, &v) || v == 0) {
      throw CLI::ValidationError(what, "'" + item + "' is not a positive integer");
    }
    out.push_back(static_cast<size_t>(v));
  }
  return out;
}

int runBenchParsed(BenchArgs& a) {
  BenchOptions& bo = a.bo;
  requireWritable(a.json.path, "--json");
  bo.jsonPath = a.json.toFile() ? a.json.path : "";
  bo.jsonStdout = a.json.toStdout();
  bo.progress = progressWanted(a.json.given());
  if (!a.load.empty()) return printBenchRecord(a.load, bo);
  if (a.dashN && !a.ranksSet) {
    std::fprintf(stderr,
                 "anyreduce bench: note: -n %d is the number of calls per timed sample "
                 "(iterations, as in nccl-tests); the number of ranks is --ranks N (-n meant "
                 "ranks before)\n",
                 bo.calls);
  }
  if (a.inPlaceOld) {
    std::fprintf(stderr,
                 "anyreduce bench: note: --inplace is no longer needed: every row has an "
                 "out-of-place and an in-place group, as in nccl-tests\n");
  }
  bo.minBytes = parseSizeOrThrow(a.minS, "--minbytes");
  bo.maxBytes = parseSizeOrThrow(a.maxS, "--maxbytes");
  if (bo.minBytes == 0 || bo.minBytes > bo.maxBytes) {
    throw CLI::ValidationError("--minbytes", "must be > 0 and <= --maxbytes");
  }
  // -G N: N timed graph replays; -G 0 or --no-graph: eager launches (--samples batches).
  if (a.graphReplays == 0 || a.noGraph) {
    if (a.noGraph && a.graphReplays > 0) {
      throw CLI::ValidationError("--no-graph", "contradicts -G " + std::to_string(a.graphReplays));
    }
    bo.graph = false;
  } else if (a.graphReplays > 0) {
    if (a.samplesOpt->count() > 0 && bo.samples != a.graphReplays) {
      throw CLI::ValidationError("--samples", "contradicts -G " + std::to_string(a.graphReplays) +
                                                  " (-G N times N replays)");
    }
    bo.samples = a.graphReplays;
  }
  bo.average = static_cast<RankAverage>(a.average);
  if (!a.wireS.empty()) {
    // The names of anyrWire_t in enum order (the flag's check admits only these).
    bo.wire = a.wireS == "int8" ? anyrWireInt8 : a.wireS == "fp8" ? anyrWireFp8 : anyrWireNative;
  }
  std::string error;
  if (!parseDtypeList(a.dtypesS, &bo.dtypes, &error)) {
    throw CLI::ValidationError("--datatype", error);
  }
  bo.algos.clear();
  std::stringstream as(a.algosS);
  for (std::string name; std::getline(as, name, ',');) {
    anyrAlgo_t x;
    if (!parseAlgo(name, &x))
      throw CLI::ValidationError("--algos",
                                 "unknown algorithm '" + name + "' (" + algoNames() + ")");
    bo.algos.push_back(name);
  }
  if (bo.algos.empty()) throw CLI::ValidationError("--algos", "names no algorithm");
  bo.op = a.op == "add-rmsnorm" ? "add-rmsnorm" : "allreduce";
  bo.quant = a.quantS == "fp8"     ? anyrQuantFp8
             : a.quantS == "nvfp4" ? anyrQuantNvfp4
                                   : anyrQuantNone;
  if (bo.quantOnly && bo.quant == anyrQuantNone) {
    throw CLI::ValidationError("--quant-only",
                               "needs --quant fp8 or nvfp4 (normOut may be "
                               "NULL only with a quantized output)");
  }
  if (!a.hiddenS.empty()) bo.hiddens = parseList(a.hiddenS, "--hidden");
  if (!a.tokensS.empty()) bo.tokens = parseList(a.tokensS, "--tokens");
  for (size_t h : bo.hiddens) {  // before any buffer is sized or filled for it
    const int multiple = fusedHiddenMultiple(bo.quant);
    if (!fusedHiddenValid(h, bo.quant)) {
      throw CLI::ValidationError("--hidden", std::to_string(h) + " is not a multiple of " +
                                                 std::to_string(multiple) + " in " +
                                                 std::to_string(ANYR_FUSED_MIN_HIDDEN) + ".." +
                                                 std::to_string(ANYR_FUSED_MAX_HIDDEN));
    }
  }
  if (bo.checkDispatch) {
    // One hidden size (default 6144) and, by default, tokens 1, 2, 4, ..., 2048.
    if (a.hiddenS.empty()) bo.hiddens = {6144};
    if (bo.hiddens.size() != 1) {
      throw CLI::ValidationError("--hidden", "--check-dispatch takes one hidden size");
    }
    if (a.tokensS.empty()) {
      bo.tokens.clear();
      for (size_t t = 1; t <= 2048; t *= 2) bo.tokens.push_back(t);
    }
  }
  return runBench(bo);
}

}  // namespace

std::function<int()> addBenchCommand(CLI::App& app, int argc, char** argv) {
  auto* bench = app.add_subcommand(
      "bench",
      "Benchmark all-reduce against NCCL, one process per GPU; the table is nccl-tests' "
      "all_reduce_perf format (out-of-place and in-place time, algbw, busbw, #wrong per size), "
      "with the algorithm and NCCL's time as extra columns");
  auto a = std::make_shared<BenchArgs>();
  scanDashN(argc, argv, &a->dashN, &a->ranksSet);
  BenchOptions& bo = a->bo;
  for (int i = 0; i < anyrNumAlgos; ++i) {  // every algorithm, in enum order
    a->algosS += std::string(i ? "," : "") + anyrAlgoName(static_cast<anyrAlgo_t>(i));
  }
  bench->add_option("-b,--minbytes", a->minS, "Smallest message (default 1K)")->type_name("SIZE");
  bench->add_option("-e,--maxbytes", a->maxS, "Largest message (default 256M)")->type_name("SIZE");
  bench->add_option("-f,--stepfactor", bo.factor, "Size multiplier between steps (default 2)")
      ->check(CLI::Range(1.01, 1024.0));
  bench
      ->add_option("-g,--ngpus", bo.gpus,
                   "Use this many GPUs, one rank each (default: every visible GPU)")
      ->check(CLI::Range(1, 64));
  addRanksFlag(bench, &bo.nranks,
               "World size; more ranks than GPUs share them (a correctness run; default: one "
               "rank per GPU)",
               2, 64, false);
  addTimingFlags(bench, &bo.calls, &bo.samples, &bo.timeoutMs, 10000, "-n,--iters,--calls",
                 "Iterations: all-reduce calls per timed sample, as nccl-tests' -n (default 20)",
                 "Timed samples; the median is reported (default 25; with -G, -G's count)");
  a->samplesOpt = bench->get_option("--samples");
  bench->add_option("-w,--warmup_iters,--warmup", bo.warmup, "Untimed samples first (default 5)")
      ->check(CLI::Range(0, 10000));
  bench
      ->add_option("-c,--check", bo.check,
                   "Correctness checks per size and group, fresh inputs each, exact comparison "
                   "(default 1; 0: none, #wrong N/A)")
      ->check(CLI::Range(0, 100));
  bench
      ->add_option("-d,--datatype,--dtypes", a->dtypesS,
                   "Comma-separated dtypes: bf16|bfloat16, fp16|half, fp32|float, or all "
                   "(default bf16)")
      ->type_name("LIST");
  bench
      ->add_option("-o,--op", a->op,
                   "sum (default: the all-reduce) or add-rmsnorm (fused all-reduce + residual + "
                   "RMSNorm)")
      ->type_name("sum|add-rmsnorm")
      ->check(opRule());
  bench
      ->add_option("-G,--cudagraph", a->graphReplays,
                   "Time N CUDA-graph replays of -n calls each (default 25); 0: eager launches")
      ->check(CLI::Range(0, 10000));
  bench->add_flag("--no-graph", a->noGraph, "Time eager launches instead of graph replays (-G 0)");
  bench
      ->add_option("-a,--average", a->average,
                   "How the ranks' times combine, as nccl-tests: 0 rank 0, 1 mean (default), 2 "
                   "min, 3 max")
      ->type_name("0|1|2|3")
      ->check(averageRule());
  bench
      ->add_option("--algos", a->algosS,
                   "Comma-separated algorithms (default: all) among " + algoNames())
      ->type_name("LIST");
  bench
      ->add_option("--load", a->load,
                   "Print a record `bench --json FILE` wrote, as the run printed it (no GPU)")
      ->type_name("FILE");
  bench->add_flag("--inplace", a->inPlaceOld, "Ignored: every row has both groups")->group("");
  addJsonFlag(bench, &a->json, "every row (with algbw and busbw)");
  bench
      ->add_option("--wire", a->wireS,
                   "Wire format of the host-memory algorithms: native, fp8 or int8 (default: "
                   "ANYR_WIRE or native)")
      ->type_name("native|fp8|int8")
      ->check(CLI::IsMember({"native", "fp8", "int8"}).description(""));
  bench->add_option("--quant", a->quantS, "With -o add-rmsnorm: none, fp8 or nvfp4")
      ->type_name("none|fp8|nvfp4")
      ->check(CLI::IsMember({"none", "fp8", "nvfp4"}).description(""));
  bench->add_flag("--quant-only", bo.quantOnly,
                  "With --quant fp8|nvfp4: the quantized output only (normOut NULL), as a layer "
                  "whose next GEMM reads FP8 or NVFP4 runs it");
  bench
      ->add_option("--hidden", a->hiddenS,
                   "With -o add-rmsnorm: comma-separated hidden sizes (default "
                   "4096,6144,7168,8192)")
      ->type_name("LIST");
  bench
      ->add_option("--tokens", a->tokensS,
                   "With -o add-rmsnorm: comma-separated token counts (default 1..2048)")
      ->type_name("LIST");
  bench->add_flag("--check-dispatch", bo.checkDispatch,
                  "Time every admitted candidate and the dispatched choice (all-reduce over the "
                  "size range, fused op 1..2048 tokens at hidden 6144); fail if dispatch is over "
                  "1.03x the fastest (tuned table) or 1.10x NCCL (seed only)");
  addConfigFlags(bench, &bo.comm);
  return [a]() { return runBenchParsed(*a); };
}

std::function<int()> addTuneCommand(CLI::App& app) {
  auto* tune = app.add_subcommand(
      "tune", "Measure every admitted path per operation and size; write a tuning table");
  struct TuneArgs {
    TuneCliOptions to;
    std::string minS = "1K", maxS = "256M";
    double budgetS = 0;
    JsonFlag json;
  };
  auto a = std::make_shared<TuneArgs>();
  TuneCliOptions& to = a->to;
  addRanksFlag(tune, &to.nranks, "World size (default: one rank per visible GPU)", 2, 64, true);
  tune->add_option("-o,--output", to.output,
                   "Tuning table to write (default anyreduce-tuning.json)");
  tune->add_option("-b,--minbytes", a->minS, "Smallest all-reduce size (default 1K)")
      ->type_name("SIZE");
  tune->add_option("-e,--maxbytes", a->maxS, "Largest all-reduce size (default 256M)")
      ->type_name("SIZE");
  tune->add_option("--hidden", to.hidden, "Fused op: hidden size measured (default 6144)")
      ->check(CLI::Range(ANYR_FUSED_MIN_HIDDEN, ANYR_FUSED_MAX_HIDDEN));
  tune->add_option("--max-tokens", to.maxTokens, "Fused op: 1, 2, 4 .. this many tokens (2048)")
      ->check(CLI::Range(1, 65536));
  tune->add_option("--budget-s", a->budgetS, "Stop measuring after this many seconds (0: none)")
      ->check(CLI::Range(0.0, 3600.0));
  addTimingFlags(tune, &to.calls, &to.samples, &to.timeoutMs, 1000, "--calls",
                 "Calls per timed sample (default 10)", "Timed samples; median used (default 7)");
  addJsonFlag(tune, &a->json, "the chosen path and its time per point (beside the table -o)");
  addConfigFlags(tune, &to.comm);  // the table is measured under them
  return [a]() {
    TuneCliOptions& t = a->to;
    requireWritable(t.output, "--output");
    requireWritable(a->json.path, "--json");
    t.jsonPath = a->json.toFile() ? a->json.path : "";
    t.jsonStdout = a->json.toStdout();
    t.progress = progressWanted(a->json.given());
    t.minBytes = parseSizeOrThrow(a->minS, "--minbytes");
    t.maxBytes = parseSizeOrThrow(a->maxS, "--maxbytes");
    if (t.minBytes < 2 || t.minBytes > t.maxBytes) {
      throw CLI::ValidationError("--minbytes", "must be >= 2 and <= --maxbytes");
    }
    if (t.hidden % ANYR_FUSED_HIDDEN_MULTIPLE != 0) {
      throw CLI::ValidationError("--hidden", std::to_string(t.hidden) + " is not a multiple of " +
                                                 std::to_string(ANYR_FUSED_HIDDEN_MULTIPLE));
    }
    t.budgetMs = static_cast<int>(a->budgetS * 1000);
    return runTune(t);
  };
}

}  // namespace tool
}  // namespace anyr
