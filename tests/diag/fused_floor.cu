// anyr_fused_floor: where the fused one-shot kernel's microseconds go (one row by default). One
// process drives one or two GPUs (peer access, no communicator, no bootstrap) and times, under
// CUDA-graph replay (calls per graph, median of samples, the slower GPU), the same device
// launchers the library uses:
//   empty            an empty kernel: the floor of one graph kernel node
//   k                the standalone add + RMSNorm kernel on the rows
//   push(n)          the plain one-shot push all-reduce of the rows, world size n
//   push(n)+k        the two above, one after the other (the unfused composition)
//   fused(n)         the fused one-shot push kernel, world size n
// with n = 1 (no peer: launch + local work only) and n = 2 (the two GPUs). fused(n) - push(n)
// is what fusion adds over the all-reduce; fused(1) - push(1) is the epilogue's own cost.
// Before timing, fused(n)'s outputs are checked against push(n)+k's on the same inputs, byte
// for byte on every rank (the tool exits non-zero on a difference). Every wait is bounded by
// the kernels' own deadline (5 s here). Options: --rows R (1..512),
// --quant none|fp8|nvfp4 (the epilogue's quantized output; NVFP4 scales linear and swizzled), --pdl
// (programmatic dependent launch, as the communicator launches where its probe works),
// --cluster C (the fused kernel's cluster form, C = 2, 4 or 8 blocks per row), --twoshot (the
// fused two-shot push kernel for fused(n) and the plain two-shot push for push(n), as the
// communicator runs from about 64 tokens), --dense (with --twoshot: above one row per SM, the
// register form's two-blocks-per-SM shape, as the communicator admits it), --pairs (with
// --cluster: the cluster forms' grid at two blocks per SM where every variant allows it, as
// the communicator admits it, so that rows beyond one cluster per SM keep their own cluster).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "algo/algo.h"
#include "algo/registry.h"
#include "base/names.h"
#include "common/data.h"
#include "diag_check.h"
#include "fused/fused.h"
#include "fused/fused_algo.h"

namespace {

__global__ void emptyKernel() {}

__global__ void fillWords(uint32_t* p, size_t n, uint32_t v) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    p[i] = v;
  }
}

constexpr uint64_t kSlotBytes = 8u << 20;  // 512 rows of hidden 8192
constexpr int kMaxRows = 512;
// Workspace: the one-shot push area (3 phases x 2 slots), then the two-shot push area (3 phases
// x {scatter, gather} x 2 slots), every slot kSlotBytes.
constexpr uint64_t kTwoShotOffset = 3 * 2 * kSlotBytes;
constexpr uint64_t kWorkspaceBytes = kTwoShotOffset + 3 * 2 * 2 * kSlotBytes;
constexpr int kCalls = 200;
constexpr int kSamples = 15;

struct Rank {
  int dev = 0;
  cudaStream_t s{};
  char* ws = nullptr;  // kWorkspaceBytes: the one-shot and two-shot push areas
  anyr::LocalState* state = nullptr;
  anyr::WaitControl* wait = nullptr;
  anyr::WorkspaceHeader* header = nullptr;
  int32_t* hostAbort = nullptr;
  anyr::ErrorRecord* error = nullptr;
  void *partial = nullptr, *residual = nullptr, *weight = nullptr, *norm = nullptr, *x = nullptr;
  void *quant = nullptr, *scales = nullptr, *swizzled = nullptr;
  float* scale = nullptr;
  int sms = 0;
};

void setup(Rank& r, int dev) {
  r.dev = dev;
  DIAG_CHECK(cudaSetDevice(dev));
  DIAG_CHECK(cudaStreamCreateWithFlags(&r.s, cudaStreamNonBlocking));
  cudaDeviceProp prop{};
  DIAG_CHECK(cudaGetDeviceProperties(&prop, dev));
  r.sms = std::min(prop.multiProcessorCount, anyr::kMaxBlocks);
  const size_t wsBytes = kWorkspaceBytes;
  DIAG_CHECK(cudaMalloc(&r.ws, wsBytes));
  fillWords<<<64, 256, 0, r.s>>>(reinterpret_cast<uint32_t*>(r.ws), wsBytes / 4,
                                 anyr::kPushClearWord);
  DIAG_CHECK(cudaMalloc(&r.state, sizeof(anyr::LocalState)));
  DIAG_CHECK(cudaMemsetAsync(r.state, 0, sizeof(anyr::LocalState), r.s));
  DIAG_CHECK(cudaMalloc(&r.header, sizeof(anyr::WorkspaceHeader)));
  DIAG_CHECK(cudaMemsetAsync(r.header, 0, sizeof(anyr::WorkspaceHeader), r.s));
  DIAG_CHECK(cudaMalloc(&r.wait, sizeof(anyr::WaitControl)));
  DIAG_CHECK(cudaHostAlloc(&r.hostAbort, 64, cudaHostAllocMapped));
  DIAG_CHECK(cudaHostAlloc(&r.error, sizeof(anyr::ErrorRecord), cudaHostAllocMapped));
  std::memset(r.hostAbort, 0, 64);
  std::memset(r.error, 0, sizeof(anyr::ErrorRecord));
  const size_t bytes = static_cast<size_t>(kMaxRows) * 16384 * 2;
  for (void** p :
       {&r.partial, &r.residual, &r.weight, &r.norm, &r.x, &r.quant, &r.scales, &r.swizzled}) {
    DIAG_CHECK(cudaMalloc(p, bytes));
    DIAG_CHECK(
        anyr::data::fillInput(anyrBfloat16, *p, bytes / 2, dev, 7, anyr::data::kSmallInts, r.s));
  }
  const float one = 1.0f;
  DIAG_CHECK(cudaMalloc(&r.scale, sizeof(float)));
  DIAG_CHECK(cudaMemcpy(r.scale, &one, sizeof(float), cudaMemcpyHostToDevice));
  DIAG_CHECK(cudaStreamSynchronize(r.s));
}

void setWait(Rank& r, const std::vector<Rank>& all, int n, int rank) {
  anyr::WaitControl wc{};
  wc.hostAbort = r.hostAbort;
  int32_t* dAbort = nullptr;
  DIAG_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dAbort), r.hostAbort, 0));
  wc.hostAbort = dAbort;
  DIAG_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&wc.error), r.error, 0));
  wc.state = r.state;
  wc.ownHeader = r.header;
  for (int p = 0; p < n; ++p) wc.peerHeaders[p] = p == rank ? nullptr : all[p].header;
  wc.timeoutNs = 5ull * 1000 * 1000 * 1000;
  wc.rank = rank;
  wc.nranks = n;
  DIAG_CHECK(cudaSetDevice(r.dev));
  DIAG_CHECK(cudaMemcpy(r.wait, &wc, sizeof(wc), cudaMemcpyHostToDevice));
}

anyr::AllReduceArgs argsFor(const Rank& r, const std::vector<Rank>& all, int n, int rank,
                            const void* in, void* out, int hidden, int rows) {
  anyr::AllReduceArgs a{};
  a.input = in;
  a.output = out;
  a.count = static_cast<uint64_t>(hidden) * static_cast<uint64_t>(rows);
  a.numVecs = a.count / 8;
  for (int p = 0; p < n; ++p) a.peerWorkspace[p] = all[p].ws;
  a.layout.pushOffset = 0;
  a.layout.pushSlotBytes = kSlotBytes;
  a.layout.tsOffset = kTwoShotOffset;
  a.layout.tsSlotBytes = kSlotBytes;
  a.wait = r.wait;
  a.state = r.state;
  a.rank = rank;
  a.nranks = n;
  return a;
}

anyr::FusedParams paramsFor(const Rank& r, int hidden, int rows, int quant) {
  anyr::FusedParams p{};
  p.residualIn = r.residual;
  p.residualOut = r.residual;
  p.weight = r.weight;
  p.normOut = r.norm;
  p.epsilon = 1e-6f;
  p.tokens = rows;
  p.hidden = hidden;
  p.quant = quant;
  if (quant != anyrQuantNone) {
    p.scale = r.scale;
    p.quantOut = r.quant;
    if (quant == anyrQuantNvfp4) {
      p.blockScales = r.scales;
      p.blockScalesSwizzled = r.swizzled;
    }
  }
  return p;
}

// Median microseconds per call over the ranks' graphs (the slower rank), `fn(rank)` enqueuing
// one call on that rank's stream.
double timeRanks(std::vector<Rank>& ranks, int n, const std::function<void(int)>& fn) {
  std::vector<cudaGraphExec_t> exec(n);
  for (int i = 0; i < n; ++i) {
    DIAG_CHECK(cudaSetDevice(ranks[i].dev));
    cudaGraph_t g;
    DIAG_CHECK(cudaStreamBeginCapture(ranks[i].s, cudaStreamCaptureModeThreadLocal));
    for (int c = 0; c < kCalls; ++c) fn(i);
    DIAG_CHECK(cudaStreamEndCapture(ranks[i].s, &g));
    DIAG_CHECK(cudaGraphInstantiate(&exec[i], g, 0));
    DIAG_CHECK(cudaGraphDestroy(g));
  }
  std::vector<cudaEvent_t> a(n), b(n);
  for (int i = 0; i < n; ++i) {
    DIAG_CHECK(cudaSetDevice(ranks[i].dev));
    DIAG_CHECK(cudaEventCreate(&a[i]));
    DIAG_CHECK(cudaEventCreate(&b[i]));
  }
  std::vector<double> us;
  for (int smp = 0; smp < kSamples + 2; ++smp) {
    for (int i = 0; i < n; ++i) {
      DIAG_CHECK(cudaSetDevice(ranks[i].dev));
      DIAG_CHECK(cudaEventRecord(a[i], ranks[i].s));
      DIAG_CHECK(cudaGraphLaunch(exec[i], ranks[i].s));
      DIAG_CHECK(cudaEventRecord(b[i], ranks[i].s));
    }
    double worst = 0;
    for (int i = 0; i < n; ++i) {
      DIAG_CHECK(cudaEventSynchronize(b[i]));
      float ms = 0;
      DIAG_CHECK(cudaEventElapsedTime(&ms, a[i], b[i]));
      worst = std::max(worst, 1000.0 * ms / kCalls);
    }
    if (smp >= 2) us.push_back(worst);  // two warm-up samples
  }
  for (int i = 0; i < n; ++i) {
    DIAG_CHECK(cudaSetDevice(ranks[i].dev));
    DIAG_CHECK(cudaGraphExecDestroy(exec[i]));
    DIAG_CHECK(cudaEventDestroy(a[i]));
    DIAG_CHECK(cudaEventDestroy(b[i]));
  }
  for (int i = 0; i < n; ++i) {
    if (ranks[i].error->code != 0) {
      std::fprintf(stderr, "rank %d: a wait failed (code %d, waited for rank %d)\n", i,
                   ranks[i].error->code, ranks[i].error->waitedRank);
      std::exit(1);
    }
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

// The fused kernel's outputs (normOut, the residual in place, the quantized output and both
// scale layouts) against the composition's (push, then the standalone kernel) on the same
// inputs, byte for byte, on every rank: outputs poisoned before each run, the residual
// restored between them. Exits non-zero on a difference, or where the composition wrote
// nothing. `n` ranks, each run launched directly (no graph) on every rank, then awaited.
void checkAgainstComposition(std::vector<Rank>& ranks, int n, int hidden, int rows, int quant,
                             const std::function<void(int)>& composed,
                             const std::function<void(int)>& fusedCall, const char* what) {
  const size_t elems = static_cast<size_t>(rows) * static_cast<size_t>(hidden);
  struct Out {
    void* (*buf)(const Rank&);
    size_t bytes;
    const char* name;
  };
  auto normOf = [](const Rank& r) { return r.norm; };
  auto residualOf = [](const Rank& r) { return r.residual; };
  auto quantOf = [](const Rank& r) { return r.quant; };
  auto scalesOf = [](const Rank& r) { return r.scales; };
  auto swizzledOf = [](const Rank& r) { return r.swizzled; };
  std::vector<Out> outs = {{+normOf, elems * 2, "normOut"}, {+residualOf, elems * 2, "residual"}};
  if (quant == anyrQuantFp8) outs.push_back({+quantOf, elems, "quantOut"});
  if (quant == anyrQuantNvfp4) {
    outs.push_back({+quantOf, elems / 2, "quantOut"});
    outs.push_back({+scalesOf, elems / 16, "blockScales"});
    outs.push_back({+swizzledOf, static_cast<size_t>(anyr::swizzledScaleBytes(rows, hidden / 16)),
                    "blockScalesSwizzled"});
  }
  std::vector<std::vector<char>> residual0(n);
  auto run = [&](const std::function<void(int)>& fn,
                 std::vector<std::vector<std::vector<char>>>* got) {
    for (int i = 0; i < n; ++i) {
      Rank& r = ranks[i];
      DIAG_CHECK(cudaSetDevice(r.dev));
      if (residual0[i].empty()) {
        residual0[i].resize(elems * 2);
        DIAG_CHECK(cudaMemcpy(residual0[i].data(), r.residual, elems * 2, cudaMemcpyDeviceToHost));
      } else {
        DIAG_CHECK(cudaMemcpy(r.residual, residual0[i].data(), elems * 2, cudaMemcpyHostToDevice));
      }
      for (const Out& o : outs) {
        if (o.buf != +residualOf) DIAG_CHECK(cudaMemset(o.buf(r), 0xFF, o.bytes));
      }
      DIAG_CHECK(cudaDeviceSynchronize());
    }
    for (int i = 0; i < n; ++i) {
      DIAG_CHECK(cudaSetDevice(ranks[i].dev));
      fn(i);
    }
    got->assign(n, {});
    for (int i = 0; i < n; ++i) {
      Rank& r = ranks[i];
      DIAG_CHECK(cudaSetDevice(r.dev));
      DIAG_CHECK(cudaStreamSynchronize(r.s));
      for (const Out& o : outs) {
        std::vector<char> h(o.bytes);
        DIAG_CHECK(cudaMemcpy(h.data(), o.buf(r), o.bytes, cudaMemcpyDeviceToHost));
        (*got)[i].push_back(std::move(h));
      }
      if (r.error->code != 0) {
        std::fprintf(stderr, "%s: rank %d: a wait failed (code %d)\n", what, i, r.error->code);
        std::exit(1);
      }
    }
  };
  std::vector<std::vector<std::vector<char>>> want, got;
  run(composed, &want);
  run(fusedCall, &got);
  for (int i = 0; i < n; ++i) {
    const std::vector<char>& norm = want[i][0];
    if (std::all_of(norm.begin(), norm.end(),
                    [](char c) { return c == static_cast<char>(0xFF); })) {
      std::fprintf(stderr, "%s: rank %d: the composition wrote no normOut\n", what, i);
      std::exit(1);
    }
    for (size_t k = 0; k < outs.size(); ++k) {
      if (want[i][k] != got[i][k]) {
        size_t at = 0;
        while (want[i][k][at] == got[i][k][at]) ++at;
        std::fprintf(stderr,
                     "%s: rank %d, hidden %d, %d rows: the fused kernel's %s differs from the "
                     "composition's at byte %zu\n",
                     what, i, hidden, rows, outs[k].name, at);
        std::exit(1);
      }
    }
  }
}

}  // namespace

// Usage: anyr_fused_floor [--ranks 1] [--hidden N] [--rows R] [--quant none|fp8|nvfp4] [--pdl]
// [--cluster C] [--twoshot] [--dense] [--pairs]:
// world size 1 only (no peer waits, e.g. under a profiler that replays kernels), one hidden size.
int main(int argc, char** argv) {
  int onlyRanks = 0, onlyHidden = 0, rows = 1, quant = anyrQuantNone, cluster = 1;
  bool pdl = false, twoShot = false, dense = false, pairs = false;
  for (int i = 1; i < argc; i += 2) {
    if (diagSwitch(argv[i], "--pdl", &pdl) || diagSwitch(argv[i], "--twoshot", &twoShot) ||
        diagSwitch(argv[i], "--dense", &dense) || diagSwitch(argv[i], "--pairs", &pairs)) {
      --i;
      continue;
    }
    if (!diagHasValue("anyr_fused_floor", i, argc, argv)) return 2;
    if (std::strcmp(argv[i], "--ranks") == 0) {
      onlyRanks = std::atoi(argv[i + 1]);
    } else if (std::strcmp(argv[i], "--hidden") == 0) {
      onlyHidden = std::atoi(argv[i + 1]);
    } else if (std::strcmp(argv[i], "--rows") == 0) {
      rows = std::atoi(argv[i + 1]);
    } else if (std::strcmp(argv[i], "--cluster") == 0) {
      cluster = std::atoi(argv[i + 1]);
      if (cluster != 2 && cluster != 4 && cluster != 8) {
        std::fprintf(stderr, "anyr_fused_floor: --cluster must be 2, 4 or 8\n");
        return 2;
      }
    } else if (std::strcmp(argv[i], "--quant") == 0) {
      const char* q = argv[i + 1];
      quant = -1;
      for (int m : {anyrQuantNone, anyrQuantFp8, anyrQuantNvfp4}) {
        if (std::strcmp(q, anyr::quantName(m)) == 0) quant = m;
      }
      if (quant < 0) {
        std::fprintf(stderr, "anyr_fused_floor: --quant must be none, fp8 or nvfp4\n");
        return 2;
      }
    } else {
      std::fprintf(stderr, "anyr_fused_floor: unknown argument '%s'\n", argv[i]);
      return 2;
    }
  }
  if (onlyRanks != 0 && onlyRanks != 1 && onlyRanks != 2) {
    std::fprintf(stderr, "anyr_fused_floor: --ranks must be 1 or 2\n");
    return 2;
  }
  if (onlyHidden != 0 && (onlyHidden % 8 != 0 || onlyHidden < 128 || onlyHidden > 16384)) {
    std::fprintf(stderr, "anyr_fused_floor: --hidden must be a multiple of 8 in 128..16384\n");
    return 2;
  }
  if (rows < 1 || rows > kMaxRows) {
    std::fprintf(stderr, "anyr_fused_floor: --rows must be in 1..%d\n", kMaxRows);
    return 2;
  }
  const int ndev = diagGpuCount("anyr_fused_floor");
  if (ndev == 0) return 0;
  int n2 = 0;
  if (ndev >= 2) {
    int ab = 0, ba = 0;
    DIAG_CHECK(cudaDeviceCanAccessPeer(&ab, 0, 1));
    DIAG_CHECK(cudaDeviceCanAccessPeer(&ba, 1, 0));
    if (ab && ba && onlyRanks != 1) n2 = 2;
  }
  std::vector<Rank> ranks(n2 ? 2 : 1);
  for (size_t i = 0; i < ranks.size(); ++i) setup(ranks[i], static_cast<int>(i));
  if (n2) {
    DIAG_CHECK(cudaSetDevice(0));
    DIAG_CHECK(cudaDeviceEnablePeerAccess(1, 0));
    DIAG_CHECK(cudaSetDevice(1));
    DIAG_CHECK(cudaDeviceEnablePeerAccess(0, 0));
  }
  const int maxBlocks = ranks[0].sms;
  // --pairs: beyond one block per SM the cluster form's grid at two blocks per SM where its
  // kernel variant allows it (fusedClusterPairBlocks), as the communicator admits it; otherwise
  // one block per SM at most.
  int pairThreads = 0, pairBlocks = 0;
  if (pairs && cluster > 1) {
    pairThreads = anyr::kFusedClusterMaxThreads;  // bf16, unquantized or `quant`, aligned
    DIAG_CHECK(twoShot ? anyr::fusedTwoShotClusterPairThreads(anyrBfloat16, quant, &pairThreads)
                       : anyr::fusedOneShotClusterPairThreads(anyrBfloat16, quant, &pairThreads));
    pairBlocks = pairThreads > 0 ? std::min(2 * maxBlocks, anyr::kMaxBlocks) : 0;
    std::printf("# cluster pairs: blocks of up to %d threads two per SM, up to %d blocks\n",
                pairThreads, pairBlocks);
  }
  // --dense: the two-shot register form's two-blocks-per-SM shape where it applies (rows above
  // the SM count), as the communicator admits it; otherwise one block per SM at most.
  int denseBlocks = 0;
  if (dense) {
    int perSm = anyr::kFusedDensePerSm;  // lowered to what every variant allows
    DIAG_CHECK(anyr::fusedTwoShotDenseResidentPerSm(&perSm));
    denseBlocks = std::min(perSm * maxBlocks, anyr::kMaxBlocks);
    std::printf("# dense shape: %d blocks of kFusedDenseThreads where rows > %d\n", denseBlocks,
                maxBlocks);
  }
  const std::string form =
      std::string(twoShot ? "two-shot push " : "one-shot push ") +
      (cluster > 1 ? "in clusters of " + std::to_string(cluster) : std::string("block per row"));
  std::printf(
      "# anyr_fused_floor: bf16, %d row(s), quant %s, %s, fused kernel %s, graph replay of %d "
      "calls, median of %d, us/call\n",
      rows, anyr::quantName(quant), pdl ? "programmatic dependent launch" : "plain launches",
      form.c_str(), kCalls, kSamples);
  const double e1 = timeRanks(ranks, 1, [&](int i) { emptyKernel<<<1, 32, 0, ranks[i].s>>>(); });
  std::printf("empty kernel 1x32: %.2f\n", e1);

  std::printf("%7s %6s %6s %7s %8s %8s %10s %9s %8s %10s %9s\n", "hidden", "blocks", "thr", "empty",
              "k", "push(1)", "push(1)+k", "fused(1)", "push(2)", "push(2)+k", "fused(2)");
  std::vector<int> hiddens = {4096, 6144, 7168, 8192};
  if (onlyHidden != 0) hiddens = {onlyHidden};
  for (int hidden : hiddens) {
    // As the communicator: one block per SM where the rows fit it, else the pair cap.
    const int clusterCap =
        cluster > 1 && rows * cluster > maxBlocks
            ? anyr::fusedClusterPairBlocks(hidden, cluster, maxBlocks, pairThreads, pairBlocks)
            : maxBlocks;
    const uint64_t vecs =
        static_cast<uint64_t>(anyr::rowVecs(hidden)) * static_cast<uint64_t>(rows);
    // The one-shot holds the whole message in a slot, the two-shot one segment of ceil(rows / 2).
    const uint64_t slotRows = twoShot ? (static_cast<uint64_t>(rows) + 1) / 2 : rows;
    if (static_cast<uint64_t>(anyr::rowVecs(hidden)) * slotRows * 16 > kSlotBytes) {
      std::printf("%7d: %d rows exceed the %llu-byte slot; skipped\n", hidden, rows,
                  static_cast<unsigned long long>(kSlotBytes));
      continue;
    }
    if (quant == anyrQuantNvfp4 && hidden % 16 != 0) continue;
    const int fBlocks = anyr::fusedOneShotBlocks(rows, vecs, maxBlocks);
    const int fThreads = anyr::fusedThreads(hidden);
    anyr::LaunchShape shape = anyr::spreadShape(vecs, maxBlocks);  // the one-shot's shape
    shape.aligned = true;
    shape.pdl = pdl;
    const double empty =
        timeRanks(ranks, 1, [&](int i) { emptyKernel<<<fBlocks, fThreads, 0, ranks[i].s>>>(); });
    auto k = [&](int i) {
      const anyr::FusedParams p = paramsFor(ranks[i], hidden, rows, quant);
      DIAG_CHECK(anyr::launchAddRmsNorm(anyrBfloat16, ranks[i].x, p, ranks[i].s, 0, pdl));
    };
    auto push = [&](int n) {
      return [&, n](int i) {
        const anyr::AllReduceArgs a =
            argsFor(ranks[i], ranks, n, i, ranks[i].partial, ranks[i].x, hidden, rows);
        if (twoShot) {
          // The two-shot's shape: the segment's vectors spread (Communicator::shapeFor).
          anyr::LaunchShape ts = anyr::spreadShape((vecs + n - 1) / n, maxBlocks);
          ts.aligned = true;
          ts.pdl = pdl;
          DIAG_CHECK(anyr::algoInfo(anyrAlgoTwoShotPush).launch(anyrBfloat16, a, ts, ranks[i].s));
        } else {
          DIAG_CHECK(
              anyr::algoInfo(anyrAlgoOneShotPush).launch(anyrBfloat16, a, shape, ranks[i].s));
        }
      };
    };
    auto fused = [&](int n) {
      return [&, n](int i) {
        const anyr::AllReduceArgs a =
            argsFor(ranks[i], ranks, n, i, ranks[i].partial, nullptr, hidden, rows);
        const anyr::FusedParams p = paramsFor(ranks[i], hidden, rows, quant);
        if (twoShot && cluster > 1) {
          DIAG_CHECK(anyr::launchFusedTwoShotPushCluster(anyrBfloat16, a, p, 0, rows, cluster,
                                                         clusterCap, ranks[i].s, pdl));
        } else if (twoShot) {
          const anyr::FusedLaunchShape fs =
              anyr::fusedTwoShotShape(rows, n, hidden, vecs, maxBlocks, denseBlocks);
          DIAG_CHECK(anyr::launchFusedTwoShotPush(anyrBfloat16, a, p, 0, rows, fs.blocks,
                                                  ranks[i].s, pdl, fs.threads));
        } else if (cluster > 1) {
          DIAG_CHECK(anyr::launchFusedOneShotPushCluster(anyrBfloat16, a, p, 0, rows, cluster,
                                                         clusterCap, ranks[i].s, pdl));
        } else {
          DIAG_CHECK(
              anyr::launchFusedOneShotPush(anyrBfloat16, a, p, 0, rows, fBlocks, ranks[i].s, pdl));
        }
      };
    };
    double r[7] = {-1, -1, -1, -1, -1, -1, -1};
    r[0] = timeRanks(ranks, 1, k);
    setWait(ranks[0], ranks, 1, 0);
    auto composed = [&](int n) {
      return [&, n](int i) {
        push(n)(i);
        k(i);
      };
    };
    checkAgainstComposition(ranks, 1, hidden, rows, quant, composed(1), fused(1), "fused(1)");
    r[1] = timeRanks(ranks, 1, push(1));
    r[2] = timeRanks(ranks, 1, composed(1));
    r[3] = timeRanks(ranks, 1, fused(1));
    if (n2) {
      for (int i = 0; i < 2; ++i) setWait(ranks[i], ranks, 2, i);
      // Both ranks' epochs must agree: start each world-size-2 series from equal states.
      for (auto& rk : ranks) {
        DIAG_CHECK(cudaSetDevice(rk.dev));
        DIAG_CHECK(cudaMemset(rk.state, 0, sizeof(anyr::LocalState)));
        fillWords<<<64, 256>>>(reinterpret_cast<uint32_t*>(rk.ws), kWorkspaceBytes / 4,
                               anyr::kPushClearWord);
        DIAG_CHECK(cudaDeviceSynchronize());
      }
      checkAgainstComposition(ranks, 2, hidden, rows, quant, composed(2), fused(2), "fused(2)");
      r[4] = timeRanks(ranks, 2, push(2));
      r[5] = timeRanks(ranks, 2, composed(2));
      r[6] = timeRanks(ranks, 2, fused(2));
    }
    std::printf("%7d %6d %6d %7.2f %8.2f %8.2f %10.2f %9.2f %8.2f %10.2f %9.2f\n", hidden, fBlocks,
                fThreads, empty, r[0], r[1], r[2], r[3], r[4], r[5], r[6]);
    std::fflush(stdout);
  }
  return 0;
}
