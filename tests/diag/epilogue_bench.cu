// anyr_epilogue_bench: the standalone add + RMSNorm (+ FP8 / NVFP4) kernel against the memory
// roofline on one GPU. For each dtype, hidden size and token count it times, under CUDA-graph
// replay (--calls calls per graph, the median of --samples replays, us per call):
//   empty        an empty kernel (1 block of 32 threads): the floor of one graph kernel node
//   empty-pdl    the same with programmatic dependent launch (it waits for the kernel before it
//                and releases the next at once): the floor of the +pdl variants
//   copy         cudaMemcpyAsync, device to device, of the same bytes: x and the residual (one
//                buffer, 2 x tokens x hidden elements) into normOut and residualOut (one buffer):
//                it reads what the kernel reads (less the weight, hidden elements read once)
//                and writes what the unquantized kernel writes
//   copy-kernel  the same bytes by a plain 16-byte copy kernel (grid of 4 x 256-thread blocks
//                per SM, each thread copying vectors i, i + grid, ...)
//   VARIANT      the kernel in each form asked for (--variants; anyreduce's launchers, the
//                library's internals), once per quantization mode (--quant): none (normOut and
//                residualOut), fp8 and nvfp4 (residualOut and the quantized output only, as a
//                layer feeding an FP8 / NVFP4 GEMM runs it; NVFP4 with the 128x4 swizzled block
//                scales)
// with fresh random inputs per shape (x and the residual in [-4, 4), the weight in [-1.5, 1.5)).
//
// Before anything is timed, every variant's outputs are checked: the first variant's against
// the fp64 reference (tests/common/fused_reference.h) on every row (residualOut bit-exact,
// normOut within one ulp of the dtype of the exact value; the quantized outputs bit-exact
// against the host quantizer run on the kernel's own normOut, with the linear and the swizzled
// scales, and the quantized-only run giving the same bits), every other variant's bit for bit
// against the first's. A wrong result is printed (WRONG ...), that variant is not timed, and the
// tool exits with status 4 at the end.
//
// Variants: FORM[-vN][-cN][-e0][-gN][-hN][+pdl|+pdlx|+pdla], FORM one of regs (the kernel before
// the forms), staged (with -tN: N threads), rows, cluster, auto (what anyrAddRmsNorm launches); -vN
// the Rows forms' vectors a thread at most (default: addRmsNormRowsVpt); -cN the cluster size
// (default: the automatic one, at least 2); -e0 the Cluster form without its final cluster barrier;
// -g0 / -g1 the Rows form's grid forced to as many blocks as the GPU holds at once / one block per
// row (default: addRmsNormRowsPerRow); -h1 / -h0 the Rows form's loads (rows, or auto where it
// takes Rows) with / without cache eviction hints (x and the residual evict-first, the weight
// evict-last: AddRmsNormLaunch::hints; unquantized output and aligned buffers only, plain loads
// otherwise; default: addRmsNormHintsAt); +pdl launched with programmatic
// dependent launch, releasing the next launch early, +pdlx the same releasing it only at exit,
// +pdla as AddRmsNormRelease::Auto decides. "api" is the public anyrAddRmsNorm itself.
//
// Usage: anyr_epilogue_bench [--dtypes bf16,fp16] [--hidden 2880,4096,5120,6144,7168,8192]
//   [--tokens 1,8,32,128,512,2048,8192] [--variants auto,...] [--quant none,fp8,nvfp4]
//   [--calls 50] [--samples 15] [--json FILE] [--threads N (host threads for the check)];
// anyr_epilogue_bench --self-test: the checkers on host-made outputs (no GPU; a CPU test).
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "anyreduce/anyreduce.h"
#include "base/names.h"
#include "common/data.h"
#include "common/fused_reference.h"
#include "device/launch.cuh"
#include "diag_check.h"
#include "fused/fused.h"
#include "fused/fused_algo.h"

namespace {

using anyr::AddRmsNormForm;
using anyr::AddRmsNormGrid;
using anyr::AddRmsNormHints;
using anyr::AddRmsNormLaunch;
using anyr::AddRmsNormRelease;
using anyr::AddRmsNormShape;
using anyr::FusedParams;

constexpr float kFp8Scale = 0.006f;  // the GPU tests' scales: some values saturate
constexpr float kNvfp4Scale = 0.0017f;
constexpr uint32_t kSeedBase = 0x5eed0000u;

__global__ void emptyKernel() {}

__global__ void emptyPdlKernel() { anyr::dev::waitForPrevious(1); }

__global__ void copyKernel(const uint4* in, uint4* out, uint64_t n) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    out[i] = in[i];
  }
}

// Counts the bytes where a and b differ (n bytes), and the first such byte.
__global__ void diffKernel(const uint8_t* a, const uint8_t* b, uint64_t n,
                           unsigned long long* count, unsigned long long* first) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    if (a[i] != b[i]) {
      atomicAdd(count, 1ull);
      atomicMin(first, static_cast<unsigned long long>(i));
    }
  }
}

// ---- command line ----------------------------------------------------------------------------
std::vector<std::string> splitList(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

bool parseInts(const std::string& s, std::vector<int>* out) {
  out->clear();
  for (const std::string& item : splitList(s)) {
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (end == item.c_str() || *end != '\0' || v <= 0 || v > (1 << 30)) return false;
    out->push_back(static_cast<int>(v));
  }
  return !out->empty();
}

struct Variant {
  std::string name;
  bool api = false;
  AddRmsNormLaunch launch;
};

// FORM[-vN][-cN][-tN][-e0][-gN][-hN][+pdl|+pdlx|+pdla] or "api"; false for anything else.
bool parseVariant(const std::string& name, Variant* v) {
  v->name = name;
  if (name == "api") {
    v->api = true;
    return true;
  }
  std::string rest = name;
  const size_t plus = rest.find('+');
  if (plus != std::string::npos) {
    const std::string suffix = rest.substr(plus);
    if (suffix != "+pdl" && suffix != "+pdlx" && suffix != "+pdla") return false;
    v->launch.pdl = true;
    v->launch.release = suffix == "+pdl"    ? AddRmsNormRelease::Early
                        : suffix == "+pdlx" ? AddRmsNormRelease::AtExit
                                            : AddRmsNormRelease::Auto;
    rest = rest.substr(0, plus);
  }
  struct Form {
    const char* name;
    AddRmsNormForm form;
  };
  const Form forms[] = {{"rows", AddRmsNormForm::Rows},
                        {"regs", AddRmsNormForm::Regs},
                        {"staged", AddRmsNormForm::Staged},
                        {"cluster", AddRmsNormForm::Cluster},
                        {"auto", AddRmsNormForm::Auto}};
  bool found = false;
  for (const Form& f : forms) {
    const size_t n = std::strlen(f.name);
    if (rest.compare(0, n, f.name) == 0 && (rest.size() == n || rest[n] == '-')) {
      v->launch.form = f.form;
      rest = rest.substr(n);
      found = true;
      break;
    }
  }
  if (!found) return false;
  if (v->launch.form == AddRmsNormForm::Staged) v->launch.threads = 256;
  while (!rest.empty()) {
    if (rest.size() < 3 || rest[0] != '-') return false;
    const char key = rest[1];
    size_t end = 2;
    while (end < rest.size() && rest[end] >= '0' && rest[end] <= '9') ++end;
    if (end == 2) return false;
    const int value = std::atoi(rest.substr(2, end - 2).c_str());
    if (key == 'v') {
      v->launch.maxVpt = value;
    } else if (key == 'c') {
      v->launch.clusterBlocks = value;
    } else if (key == 't') {
      v->launch.threads = value;
    } else if (key == 'e' && (value == 0 || value == 1)) {
      v->launch.clusterExitBarrier = value != 0;
    } else if (key == 'g' && (value == 0 || value == 1)) {
      v->launch.grid = value == 1 ? AddRmsNormGrid::PerRow : AddRmsNormGrid::Resident;
    } else if (key == 'h' && (value == 0 || value == 1) &&
               (v->launch.form == AddRmsNormForm::Rows || v->launch.form == AddRmsNormForm::Auto)) {
      v->launch.hints = value != 0 ? AddRmsNormHints::On : AddRmsNormHints::Off;
    } else {
      return false;
    }
    rest = rest.substr(end);
  }
  // Values the launcher takes (it refuses others at launch, which would end the run).
  const AddRmsNormLaunch& l = v->launch;
  const bool staged = l.form == AddRmsNormForm::Staged;
  return l.maxVpt >= 0 && l.maxVpt <= 4 &&
         (l.clusterBlocks == 0 || l.clusterBlocks == 2 || l.clusterBlocks == 4 ||
          l.clusterBlocks == 8) &&
         (staged ? l.threads >= 32 && l.threads <= 1024 && l.threads % 32 == 0 : l.threads == 0);
}

std::string shapeText(const AddRmsNormShape& s) {
  std::ostringstream os;
  os << anyr::addRmsNormFormName(s.form) << " " << s.blocks << "x" << s.threads;
  if (s.vpt > 0) os << " vpt" << s.vpt;
  if (s.clusterBlocks > 1) os << " c" << s.clusterBlocks;
  if (s.smem > 0) os << " smem" << s.smem;
  if (s.cacheHints) os << " hints";
  return os.str();
}

// ---- device buffers ------------------------------------------------------------------------
struct Buffers {
  void* in = nullptr;      // x then the residual: 2 x maxElems elements
  void* out = nullptr;     // normOut then residualOut: 2 x maxElems elements
  void* weight = nullptr;  // maxHidden elements
  uint8_t* quant = nullptr;
  uint8_t* scales = nullptr;
  uint8_t* swizzled = nullptr;
  float* scale = nullptr;  // [0]: FP8 scale, [1]: NVFP4 global scale
  // The check variant's outputs, for the bitwise comparison of the others.
  void* refOut = nullptr;  // 2 x maxElems elements
  uint8_t* refQuant[3] = {};
  uint8_t* refSwizzled = nullptr;
  unsigned long long* diff = nullptr;  // [0] count, [1] first word
  size_t maxElems = 0, quantBytes = 0, swizzledBytes = 0;
};

size_t roundUp16(size_t n) { return (n + 15) / 16 * 16; }

void allocate(Buffers* b, size_t maxTokens, size_t maxHidden) {
  b->maxElems = maxTokens * maxHidden;
  const size_t e2 = 2 * b->maxElems * 2;
  b->quantBytes = roundUp16(b->maxElems);
  b->swizzledBytes = roundUp16(static_cast<size_t>(anyr::swizzledScaleBytes(
      static_cast<int64_t>(maxTokens), static_cast<int64_t>(maxHidden / anyr::kNvfp4BlockElems))));
  DIAG_CHECK(cudaMalloc(&b->in, e2));
  DIAG_CHECK(cudaMalloc(&b->out, e2));
  DIAG_CHECK(cudaMalloc(&b->refOut, e2));
  DIAG_CHECK(cudaMalloc(&b->weight, roundUp16(maxHidden * 2)));
  DIAG_CHECK(cudaMalloc(&b->quant, b->quantBytes));
  DIAG_CHECK(cudaMalloc(&b->scales, roundUp16(b->maxElems / 16 + 16)));
  DIAG_CHECK(cudaMalloc(&b->swizzled, b->swizzledBytes));
  for (int q = 1; q < 3; ++q) DIAG_CHECK(cudaMalloc(&b->refQuant[q], b->quantBytes));
  DIAG_CHECK(cudaMalloc(&b->refSwizzled, b->swizzledBytes));
  DIAG_CHECK(cudaMalloc(&b->scale, 2 * sizeof(float)));
  const float scales[2] = {kFp8Scale, kNvfp4Scale};
  DIAG_CHECK(cudaMemcpy(b->scale, scales, sizeof(scales), cudaMemcpyHostToDevice));
  DIAG_CHECK(cudaMalloc(&b->diff, 2 * sizeof(unsigned long long)));
}

// One shape: its sizes and the pointers of its buffers.
struct Shape {
  anyrDataType_t dtype = anyrBfloat16;
  int hidden = 0, tokens = 0;
  size_t elems = 0;  // tokens x hidden
  char* x = nullptr;
  char* res = nullptr;
  char* norm = nullptr;
  char* resOut = nullptr;
  size_t quantBytes(int quant) const {
    return quant == anyrQuantFp8 ? elems : (quant == anyrQuantNvfp4 ? elems / 2 : 0);
  }
  size_t swizzledBytes() const {
    return static_cast<size_t>(anyr::swizzledScaleBytes(tokens, hidden / anyr::kNvfp4BlockElems));
  }
};

// The parameters of a call: unquantized (normOut, residualOut), or quantized with normOut
// (`withNorm`, the check: normOut, linear and swizzled scales) or without (the timed form:
// residualOut, the quantized output, the swizzled scales).
FusedParams paramsFor(const Shape& s, const Buffers& b, int quant, bool withNorm) {
  FusedParams p{};
  p.residualIn = s.res;
  p.residualOut = s.resOut;
  p.weight = b.weight;
  p.normOut = quant == anyrQuantNone || withNorm ? s.norm : nullptr;
  p.epsilon = 1e-6f;
  p.tokens = s.tokens;
  p.hidden = s.hidden;
  p.weightPlusOne = 0;
  p.quant = quant;
  if (quant != anyrQuantNone) {
    p.scale = b.scale + (quant == anyrQuantFp8 ? 0 : 1);
    p.quantOut = b.quant;
  }
  if (quant == anyrQuantNvfp4) {
    p.blockScales = withNorm ? b.scales : nullptr;
    p.blockScalesSwizzled = b.swizzled;
  }
  return p;
}

cudaError_t launchVariant(const Variant& v, const Shape& s, const FusedParams& p, cudaStream_t st,
                          AddRmsNormShape* shape) {
  if (v.api) {
    anyrFusedOptions_t o = ANYR_FUSED_OPTIONS_INITIALIZER;
    o.quant = p.quant;
    o.scale = p.scale;
    o.quantOut = p.quantOut;
    o.blockScales = p.blockScales;
    o.blockScalesSwizzled = p.blockScalesSwizzled;
    const anyrResult_t r = anyrAddRmsNorm(s.x, p.residualIn, p.residualOut, p.weight, p.epsilon,
                                          p.normOut, static_cast<size_t>(s.tokens),
                                          static_cast<size_t>(s.hidden), s.dtype, &o, st);
    if (r != anyrSuccess) {
      std::fprintf(stderr, "anyrAddRmsNorm: %s\n", anyrGetLastError(nullptr));
      return cudaErrorUnknown;
    }
    if (shape != nullptr) *shape = AddRmsNormShape{};
    return cudaSuccess;
  }
  return anyr::launchAddRmsNormWith(s.dtype, s.x, p, st, v.launch, shape);
}

// ---- timing --------------------------------------------------------------------------------
struct Timer {
  cudaStream_t stream{};
  cudaEvent_t a{}, b{};
  int calls = 50, samples = 15;

  // Median us per call of `calls` enqueue() calls captured in one graph; -1 where the capture
  // or the launches failed.
  double time(const std::function<cudaError_t()>& enqueue) {
    cudaGraph_t g = nullptr;
    DIAG_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    cudaError_t e = cudaSuccess;
    for (int c = 0; c < calls && e == cudaSuccess; ++c) e = enqueue();
    const cudaError_t ended = cudaStreamEndCapture(stream, &g);
    if (e != cudaSuccess || ended != cudaSuccess) {
      std::fprintf(stderr, "capture failed: %s / %s\n", cudaGetErrorString(e),
                   cudaGetErrorString(ended));
      if (g != nullptr) cudaGraphDestroy(g);
      (void)cudaGetLastError();
      return -1.0;
    }
    cudaGraphExec_t exec = nullptr;
    DIAG_CHECK(cudaGraphInstantiate(&exec, g, 0));
    DIAG_CHECK(cudaGraphDestroy(g));
    std::vector<double> us;
    for (int smp = 0; smp < samples + 2; ++smp) {
      DIAG_CHECK(cudaEventRecord(a, stream));
      DIAG_CHECK(cudaGraphLaunch(exec, stream));
      DIAG_CHECK(cudaEventRecord(b, stream));
      DIAG_CHECK(cudaEventSynchronize(b));
      float ms = 0;
      DIAG_CHECK(cudaEventElapsedTime(&ms, a, b));
      if (smp >= 2) us.push_back(1000.0 * ms / calls);  // two warm-up replays
    }
    DIAG_CHECK(cudaGraphExecDestroy(exec));
    std::sort(us.begin(), us.end());
    return us[us.size() / 2];
  }
};

// ---- the check -----------------------------------------------------------------------------
// Runs fn(lo, hi) over [0, n) split among `threads` host threads.
void parallelFor(int n, int threads, const std::function<void(int, int)>& fn) {
  const int t = std::max(1, std::min(threads, n));
  std::vector<std::thread> pool;
  for (int i = 0; i < t; ++i) {
    const int lo = static_cast<int>(static_cast<int64_t>(n) * i / t);
    const int hi = static_cast<int>(static_cast<int64_t>(n) * (i + 1) / t);
    pool.emplace_back([&fn, lo, hi] { fn(lo, hi); });
  }
  for (std::thread& th : pool) th.join();
}

struct Failures {
  std::atomic<uint64_t> count{0};
  std::string first;
  std::atomic<bool> taken{false};
  void add(const std::string& what) {
    if (count.fetch_add(1) == 0 && !taken.exchange(true)) first = what;
  }
};

template <typename V>
void download(std::vector<V>* v, const void* dev, size_t count) {
  v->resize(count);
  DIAG_CHECK(cudaMemcpy(v->data(), dev, count * sizeof(V), cudaMemcpyDeviceToHost));
}

// The first variant's unquantized outputs against the fp64 reference, every row.
std::string checkUnquantized(const Shape& s, const std::vector<uint16_t>& x,
                             const std::vector<uint16_t>& res, const std::vector<uint16_t>& w,
                             const std::vector<uint16_t>& norm, const std::vector<uint16_t>& resOut,
                             int threads) {
  Failures f;
  std::vector<double> wd(static_cast<size_t>(s.hidden));
  for (int i = 0; i < s.hidden; ++i) wd[i] = anyr::ref::dtypeValue(w[i], s.dtype);
  parallelFor(s.tokens, threads, [&](int lo, int hi) {
    const size_t H = static_cast<size_t>(s.hidden);
    std::vector<double> xd(H), rd(H);
    anyr::ref::RowSpec spec;
    spec.dtype = s.dtype;
    spec.hidden = H;
    spec.epsilon = 1e-6;
    anyr::ref::RowResult r;
    for (int row = lo; row < hi && f.count.load() == 0; ++row) {
      const size_t base = static_cast<size_t>(row) * H;
      for (size_t i = 0; i < H; ++i) {
        xd[i] = anyr::ref::dtypeValue(x[base + i], s.dtype);
        rd[i] = anyr::ref::dtypeValue(res[base + i], s.dtype);
      }
      anyr::ref::referenceRow(spec, xd.data(), rd.data(), wd.data(), &r);
      for (size_t i = 0; i < H; ++i) {
        const uint16_t want = anyr::ref::dtypeBits(r.r[i], s.dtype);
        if (resOut[base + i] != want) {
          char m[200];
          std::snprintf(m, sizeof(m), "residualOut row %d element %zu: 0x%04x, want 0x%04x", row, i,
                        resOut[base + i], want);
          f.add(m);
          break;
        }
        const double got = anyr::ref::dtypeValue(norm[base + i], s.dtype);
        const double exact = r.yExact[i];
        if (!(std::fabs(got - exact) <= anyr::ref::dtypeUlp(exact, s.dtype))) {
          char m[200];
          std::snprintf(m, sizeof(m), "normOut row %d element %zu: %.9g, exact %.9g (over 1 ulp)",
                        row, i, got, exact);
          f.add(m);
          break;
        }
      }
    }
  });
  return f.count.load() == 0 ? std::string() : f.first;
}

// The quantized outputs of the first variant's run with normOut (`norm`) against the host
// quantizer run on that normOut, the linear and the swizzled scales included.
std::string checkQuantized(const Shape& s, int quant, const std::vector<uint16_t>& norm,
                           const std::vector<uint8_t>& q, const std::vector<uint8_t>& linear,
                           const std::vector<uint8_t>& swz, int threads) {
  Failures f;
  const float scale = quant == anyrQuantFp8 ? kFp8Scale : kNvfp4Scale;
  const size_t H = static_cast<size_t>(s.hidden);
  const int64_t cols = s.hidden / anyr::kNvfp4BlockElems;
  parallelFor(s.tokens, threads, [&](int lo, int hi) {
    std::vector<float> y(H);
    std::vector<uint8_t> want(H), wantScales(static_cast<size_t>(cols));
    for (int row = lo; row < hi && f.count.load() == 0; ++row) {
      const size_t base = static_cast<size_t>(row) * H;
      for (size_t i = 0; i < H; ++i) {
        y[i] = static_cast<float>(anyr::ref::dtypeValue(norm[base + i], s.dtype));
      }
      char m[200];
      if (quant == anyrQuantFp8) {
        anyr::ref::quantizeFp8(y.data(), H, scale, want.data());
        for (size_t i = 0; i < H; ++i) {
          if (q[base + i] != want[i]) {
            std::snprintf(m, sizeof(m), "FP8 row %d element %zu: 0x%02x, want 0x%02x", row, i,
                          q[base + i], want[i]);
            f.add(m);
            break;
          }
        }
        continue;
      }
      anyr::ref::quantizeNvfp4(y.data(), H, scale, want.data(), wantScales.data());
      for (size_t i = 0; i < H / 2; ++i) {
        if (q[base / 2 + i] != want[i]) {
          std::snprintf(m, sizeof(m), "NVFP4 row %d byte %zu: 0x%02x, want 0x%02x", row, i,
                        q[base / 2 + i], want[i]);
          f.add(m);
          break;
        }
      }
      for (int64_t k = 0; k < cols; ++k) {
        const uint8_t l = linear[static_cast<size_t>(row) * cols + k];
        const uint8_t z = swz[static_cast<size_t>(anyr::ref::swizzleOffset(row, k, cols))];
        if (l != wantScales[k] || z != wantScales[k]) {
          std::snprintf(m, sizeof(m),
                        "NVFP4 row %d scale %lld: linear 0x%02x, swizzled 0x%02x, want 0x%02x", row,
                        static_cast<long long>(k), l, z, wantScales[k]);
          f.add(m);
          break;
        }
      }
    }
  });
  return f.count.load() == 0 ? std::string() : f.first;
}

// Bytes of `x` and `y` (`bytes` each) that differ, counted on the GPU; "" where none do, else
// the count and the first differing byte, named `what`.
std::string deviceDiff(const Buffers& b, const void* x, const void* y, size_t bytes,
                       cudaStream_t st, const char* what) {
  const unsigned long long init[2] = {0ull, ~0ull};
  DIAG_CHECK(cudaMemcpyAsync(b.diff, init, sizeof(init), cudaMemcpyHostToDevice, st));
  if (bytes > 0) {
    diffKernel<<<1024, 256, 0, st>>>(static_cast<const uint8_t*>(x), static_cast<const uint8_t*>(y),
                                     bytes, b.diff, b.diff + 1);
    DIAG_CHECK(cudaGetLastError());
  }
  unsigned long long got[2] = {0, 0};
  DIAG_CHECK(cudaMemcpyAsync(got, b.diff, sizeof(got), cudaMemcpyDeviceToHost, st));
  DIAG_CHECK(cudaStreamSynchronize(st));
  if (got[0] == 0) return std::string();
  char m[200];
  std::snprintf(m, sizeof(m), "%s differs from the first variant's in %llu bytes, first at %llu",
                what, got[0], got[1]);
  return m;
}

// Poisons every output of the shape (0xFF), on `st`.
void poison(const Shape& s, const Buffers& b, cudaStream_t st) {
  DIAG_CHECK(cudaMemsetAsync(s.norm, 0xFF, 2 * s.elems * 2, st));
  DIAG_CHECK(cudaMemsetAsync(b.quant, 0xFF, roundUp16(s.elems), st));
  DIAG_CHECK(cudaMemsetAsync(b.scales, 0xFF, roundUp16(s.elems / 16 + 16), st));
  DIAG_CHECK(cudaMemsetAsync(b.swizzled, 0xFF, roundUp16(s.swizzledBytes()), st));
}

// --self-test (no GPU): the checkers and the variant names on outputs made on the host from the
// reference itself: right outputs must pass, one wrong byte in each output must fail. Returns
// the number of failed expectations.
int selfTest(int threads) {
  int bad = 0;
  auto expect = [&](bool ok, const std::string& what) {
    if (!ok) {
      std::fprintf(stderr, "self-test: %s\n", what.c_str());
      ++bad;
    }
  };
  for (anyrDataType_t dt : {anyrBfloat16, anyrFloat16}) {
    for (int hidden : {256, 2880}) {
      Shape s;
      s.dtype = dt;
      s.hidden = hidden;
      s.tokens = 5;
      s.elems = static_cast<size_t>(s.tokens) * hidden;
      const size_t H = static_cast<size_t>(hidden);
      std::vector<uint16_t> x(s.elems), res(s.elems), w(H), norm(s.elems), resOut(s.elems);
      for (size_t i = 0; i < s.elems; ++i) {
        x[i] = anyr::ref::dtypeBits(anyr::data::genValue(anyr::data::kRandom, 0, i, 9), dt);
        res[i] = anyr::ref::dtypeBits(anyr::data::genValue(anyr::data::kRandom, 1, i, 9), dt);
      }
      for (size_t i = 0; i < H; ++i) w[i] = anyr::ref::dtypeBits(0.5 + (i % 7) * 0.125, dt);
      anyr::ref::RowSpec spec;
      spec.dtype = dt;
      spec.hidden = H;
      anyr::ref::RowResult r;
      std::vector<double> xd(H), rd(H), wd(H);
      for (size_t i = 0; i < H; ++i) wd[i] = anyr::ref::dtypeValue(w[i], dt);
      for (int row = 0; row < s.tokens; ++row) {
        for (size_t i = 0; i < H; ++i) {
          xd[i] = anyr::ref::dtypeValue(x[row * H + i], dt);
          rd[i] = anyr::ref::dtypeValue(res[row * H + i], dt);
        }
        anyr::ref::referenceRow(spec, xd.data(), rd.data(), wd.data(), &r);
        for (size_t i = 0; i < H; ++i) {
          norm[row * H + i] = anyr::ref::dtypeBits(r.y[i], dt);
          resOut[row * H + i] = anyr::ref::dtypeBits(r.r[i], dt);
        }
      }
      const std::string where =
          std::string(anyr::dtypeShortName(dt)) + " " + std::to_string(hidden);
      expect(checkUnquantized(s, x, res, w, norm, resOut, threads).empty(), where + ": right");
      std::vector<uint16_t> bent = resOut;
      bent[3 * H + 7] ^= 1;
      expect(!checkUnquantized(s, x, res, w, norm, bent, threads).empty(), where + ": residual");
      bent = norm;
      bent[4 * H + H - 1] ^= 0x10;  // 16 ulps
      expect(!checkUnquantized(s, x, res, w, bent, resOut, threads).empty(), where + ": normOut");

      // FP8 and NVFP4 of that normOut, as the kernel lays them out.
      std::vector<float> y(H);
      std::vector<uint8_t> fp8(s.elems), fp4(s.elems / 2), lin(s.elems / 16),
          swz(s.swizzledBytes(), 0xFF);
      const int64_t cols = hidden / 16;
      for (int row = 0; row < s.tokens; ++row) {
        for (size_t i = 0; i < H; ++i) {
          y[i] = static_cast<float>(anyr::ref::dtypeValue(norm[row * H + i], dt));
        }
        anyr::ref::quantizeFp8(y.data(), H, kFp8Scale, fp8.data() + row * H);
        anyr::ref::quantizeNvfp4(y.data(), H, kNvfp4Scale, fp4.data() + row * H / 2,
                                 lin.data() + row * cols);
        for (int64_t k = 0; k < cols; ++k) {
          swz[static_cast<size_t>(anyr::ref::swizzleOffset(row, k, cols))] = lin[row * cols + k];
        }
      }
      const std::vector<uint8_t> none;
      expect(checkQuantized(s, anyrQuantFp8, norm, fp8, none, none, threads).empty(),
             where + ": FP8 right");
      std::vector<uint8_t> q = fp8;
      q[2 * H + 5] ^= 1;
      expect(!checkQuantized(s, anyrQuantFp8, norm, q, none, none, threads).empty(),
             where + ": FP8");
      expect(checkQuantized(s, anyrQuantNvfp4, norm, fp4, lin, swz, threads).empty(),
             where + ": NVFP4 right");
      q = fp4;
      q[s.elems / 2 - 1] ^= 0x80;
      expect(!checkQuantized(s, anyrQuantNvfp4, norm, q, lin, swz, threads).empty(),
             where + ": NVFP4 codes");
      q = lin;
      q[cols + 1] ^= 1;
      expect(!checkQuantized(s, anyrQuantNvfp4, norm, fp4, q, swz, threads).empty(),
             where + ": NVFP4 linear scales");
      q = swz;
      q[static_cast<size_t>(anyr::ref::swizzleOffset(4, cols - 1, cols))] ^= 1;
      expect(!checkQuantized(s, anyrQuantNvfp4, norm, fp4, lin, q, threads).empty(),
             where + ": NVFP4 swizzled scales");
    }
  }
  struct Name {
    const char* name;
    bool ok;
    AddRmsNormForm form;
    int maxVpt, cluster;
    bool pdl;
  } names[] = {{"auto", true, AddRmsNormForm::Auto, 0, 0, false},
               {"rows-v2", true, AddRmsNormForm::Rows, 2, 0, false},
               {"rows-v1+pdl", true, AddRmsNormForm::Rows, 1, 0, true},
               {"cluster-c4", true, AddRmsNormForm::Cluster, 0, 4, false},
               {"cluster-e0", true, AddRmsNormForm::Cluster, 0, 0, false},
               {"cluster-e2", false, AddRmsNormForm::Auto, 0, 0, false},
               {"regs", true, AddRmsNormForm::Regs, 0, 0, false},
               {"rows-x2", false, AddRmsNormForm::Auto, 0, 0, false},
               {"rowsy", false, AddRmsNormForm::Auto, 0, 0, false},
               {"auto+fast", false, AddRmsNormForm::Auto, 0, 0, false},
               {"cluster-c", false, AddRmsNormForm::Auto, 0, 0, false},
               {"rows-v5", false, AddRmsNormForm::Auto, 0, 0, false},
               {"cluster-c3", false, AddRmsNormForm::Auto, 0, 0, false},
               {"rows-t64", false, AddRmsNormForm::Auto, 0, 0, false},
               {"rows-v2-g1", true, AddRmsNormForm::Rows, 2, 0, false},
               {"rows-g2", false, AddRmsNormForm::Auto, 0, 0, false},
               {"rows-v3-g0", true, AddRmsNormForm::Rows, 3, 0, false},
               {"rows-v1-d1", false, AddRmsNormForm::Auto, 0, 0, false},
               {"staged-t100", false, AddRmsNormForm::Auto, 0, 0, false}};
  for (const Name& n : names) {
    Variant v;
    const bool ok = parseVariant(n.name, &v);
    expect(ok == n.ok, std::string("variant ") + n.name);
    if (ok && n.ok) {
      expect(v.launch.form == n.form && v.launch.maxVpt == n.maxVpt &&
                 v.launch.clusterBlocks == n.cluster && v.launch.pdl == n.pdl,
             std::string("variant ") + n.name + " parsed");
    }
  }
  const struct {
    const char* name;
    AddRmsNormGrid grid;
  } grids[] = {{"rows", AddRmsNormGrid::Auto},
               {"rows-v2-g1", AddRmsNormGrid::PerRow},
               {"rows-v3-g0", AddRmsNormGrid::Resident}};
  for (const auto& g : grids) {
    Variant v;
    expect(parseVariant(g.name, &v) && v.launch.grid == g.grid,
           std::string("variant ") + g.name + " grid");
  }
  const struct {
    const char* name;
    bool ok;
    AddRmsNormHints hints;
  } hints[] = {
      {"rows", true, AddRmsNormHints::Auto},        {"rows-h1", true, AddRmsNormHints::On},
      {"rows-v2-h1-g1", true, AddRmsNormHints::On}, {"rows-h0", true, AddRmsNormHints::Off},
      {"rows-h2", false, AddRmsNormHints::Auto},    {"auto-h1+pdla", true, AddRmsNormHints::On},
      {"auto-h0", true, AddRmsNormHints::Off},      {"cluster-h1", false, AddRmsNormHints::Auto}};
  for (const auto& h : hints) {
    Variant v;
    const bool ok = parseVariant(h.name, &v);
    expect(ok == h.ok && (!ok || v.launch.hints == h.hints),
           std::string("variant ") + h.name + " cache hints");
  }
  std::printf("anyr_epilogue_bench --self-test: %s\n", bad == 0 ? "passed" : "FAILED");
  return bad;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> dtypes = {"bf16", "fp16"};
  std::vector<int> hiddens = {2880, 4096, 5120, 6144, 7168, 8192};
  std::vector<int> tokenList = {1, 8, 32, 128, 512, 2048, 8192};
  std::vector<std::string> variantNames = {"regs", "rows", "cluster", "auto", "auto+pdl", "api"};
  std::vector<std::string> quantNames = {"none", "fp8", "nvfp4"};
  std::string jsonPath;
  int calls = 50, samples = 15;
  int hostThreads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < argc; i += 2) {
    if (std::strcmp(argv[i], "--self-test") == 0) return selfTest(2) == 0 ? 0 : 1;
    if (!diagHasValue("anyr_epilogue_bench", i, argc, argv)) return 2;
    const std::string opt = argv[i], val = argv[i + 1];
    bool ok = true;
    if (opt == "--dtypes") {
      dtypes = splitList(val);
    } else if (opt == "--hidden") {
      ok = parseInts(val, &hiddens);
    } else if (opt == "--tokens") {
      ok = parseInts(val, &tokenList);
    } else if (opt == "--variants") {
      variantNames = splitList(val);
    } else if (opt == "--quant") {
      quantNames = splitList(val);
    } else if (opt == "--calls") {
      calls = std::atoi(val.c_str());
      ok = calls >= 1;
    } else if (opt == "--samples") {
      samples = std::atoi(val.c_str());
      ok = samples >= 1;
    } else if (opt == "--threads") {
      hostThreads = std::atoi(val.c_str());
      ok = hostThreads >= 1;
    } else if (opt == "--json") {
      jsonPath = val;
    } else {
      std::fprintf(stderr, "anyr_epilogue_bench: unknown argument '%s'\n", opt.c_str());
      return 2;
    }
    if (!ok) {
      std::fprintf(stderr, "anyr_epilogue_bench: bad value '%s' for %s\n", val.c_str(),
                   opt.c_str());
      return 2;
    }
  }
  std::vector<anyrDataType_t> dts;
  for (const std::string& d : dtypes) {
    if (d == "bf16") {
      dts.push_back(anyrBfloat16);
    } else if (d == "fp16") {
      dts.push_back(anyrFloat16);
    } else {
      std::fprintf(stderr, "anyr_epilogue_bench: --dtypes takes bf16 and fp16, not '%s'\n",
                   d.c_str());
      return 2;
    }
  }
  for (int h : hiddens) {
    if (!anyr::fusedHiddenValid(static_cast<uint64_t>(h))) {
      std::fprintf(stderr, "anyr_epilogue_bench: hidden %d: a multiple of 8 in 128..16384\n", h);
      return 2;
    }
  }
  std::vector<Variant> variants;
  for (const std::string& n : variantNames) {
    Variant v;
    if (!parseVariant(n, &v)) {
      std::fprintf(stderr, "anyr_epilogue_bench: unknown variant '%s'\n", n.c_str());
      return 2;
    }
    variants.push_back(v);
  }
  if (variants.empty()) {
    std::fprintf(stderr, "anyr_epilogue_bench: no variant\n");
    return 2;
  }
  std::vector<int> quants;
  for (const std::string& q : quantNames) {
    int m = -1;
    for (int c : {anyrQuantNone, anyrQuantFp8, anyrQuantNvfp4}) {
      if (q == anyr::quantName(c)) m = c;
    }
    if (m < 0) {
      std::fprintf(stderr, "anyr_epilogue_bench: --quant takes none, fp8, nvfp4\n");
      return 2;
    }
    quants.push_back(m);
  }

  // The check always starts with the unquantized call (the quantized ones compare with it).
  std::vector<int> checkQuants = {anyrQuantNone};
  for (int q : quants) {
    if (q != anyrQuantNone) checkQuants.push_back(q);
  }

  if (diagGpuCount("anyr_epilogue_bench") == 0) return 0;
  DIAG_CHECK(cudaSetDevice(0));
  cudaDeviceProp prop{};
  DIAG_CHECK(cudaGetDeviceProperties(&prop, 0));
  int driver = 0;
  DIAG_CHECK(cudaDriverGetVersion(&driver));
  const int maxHidden = *std::max_element(hiddens.begin(), hiddens.end());
  const int maxTokens = *std::max_element(tokenList.begin(), tokenList.end());
  Buffers b;
  allocate(&b, static_cast<size_t>(maxTokens), static_cast<size_t>(maxHidden));
  Timer timer;
  timer.calls = calls;
  timer.samples = samples;
  DIAG_CHECK(cudaStreamCreateWithFlags(&timer.stream, cudaStreamNonBlocking));
  DIAG_CHECK(cudaEventCreate(&timer.a));
  DIAG_CHECK(cudaEventCreate(&timer.b));
  cudaStream_t st = timer.stream;

  std::printf(
      "# anyr_epilogue_bench: %s (%d SMs), driver %d; graph replay of %d calls, median of %d; "
      "us per call; 'copy' moves the unquantized kernel's bytes (reads x and the residual, "
      "writes normOut and residualOut)\n",
      prop.name, prop.multiProcessorCount, driver, calls, samples);
  nlohmann::json results = nlohmann::json::array();
  nlohmann::json wrongs = nlohmann::json::array();
  int wrongCount = 0;
  // The JSON file, written again after every shape (a run cut short keeps what it measured).
  auto writeJson = [&]() {
    if (jsonPath.empty()) return true;
    nlohmann::json doc = {
        {"tool", "anyr_epilogue_bench"},
        {"gpu", prop.name},
        {"sms", prop.multiProcessorCount},
        {"driver", driver},
        {"calls", calls},
        {"samples", samples},
        {"method",
         "CUDA-graph replay of `calls` calls, the median of `samples` replays after two warm-up "
         "replays, us per call; fresh random inputs per shape (x and the residual in [-4, 4), "
         "the weight in [-1.5, 1.5)), residualOut separate from the residual; every variant "
         "checked before it is timed (see wrong)"},
        {"copy",
         "copy: cudaMemcpyAsync of 2 x tokens x hidden elements (x and the residual, one buffer) "
         "into normOut and residualOut (one buffer): the unquantized kernel's bytes less the "
         "weight's hidden elements; copy-kernel: the same bytes by a 16-byte copy kernel"},
        {"quant",
         "none: normOut and residualOut; fp8 / nvfp4: residualOut and the quantized output "
         "(NVFP4: 128x4 swizzled block scales), no normOut; FP8 scale 0.006, NVFP4 global scale "
         "0.0017"},
        {"variants", variantNames},
        {"results", results},
        // Every failed check; a result with "checked": false was not compared with the reference.
        {"wrong", wrongs}};
    std::ofstream f(jsonPath);
    f << doc.dump(1) << "\n";
    if (!f) {
      std::fprintf(stderr, "anyr_epilogue_bench: cannot write %s\n", jsonPath.c_str());
      return false;
    }
    return true;
  };
  uint32_t seed = kSeedBase;
  for (anyrDataType_t dt : dts) {
    for (int hidden : hiddens) {
      for (int tokens : tokenList) {
        Shape s;
        s.dtype = dt;
        s.hidden = hidden;
        s.tokens = tokens;
        s.elems = static_cast<size_t>(tokens) * static_cast<size_t>(hidden);
        s.x = static_cast<char*>(b.in);
        s.res = s.x + s.elems * 2;
        s.norm = static_cast<char*>(b.out);
        s.resOut = s.norm + s.elems * 2;
        const char* dn = anyr::dtypeShortName(dt);
        // Fresh random inputs: x and the residual in [-4, 4) on the GPU, the weight on the host.
        ++seed;
        DIAG_CHECK(anyr::data::fillInput(dt, s.x, s.elems, 0, seed, anyr::data::kRandom, st));
        DIAG_CHECK(anyr::data::fillInput(dt, s.res, s.elems, 1, seed, anyr::data::kRandom, st));
        std::vector<uint16_t> w(static_cast<size_t>(hidden));
        for (int i = 0; i < hidden; ++i) {
          const double u = static_cast<double>(
                               anyr::data::mix((uint64_t{seed} << 32) ^ static_cast<uint64_t>(i))) /
                           4294967296.0;
          w[i] = anyr::ref::dtypeBits(-1.5 + 3.0 * u, dt);
        }
        DIAG_CHECK(cudaMemcpyAsync(b.weight, w.data(), w.size() * 2, cudaMemcpyHostToDevice, st));
        DIAG_CHECK(cudaStreamSynchronize(st));
        std::vector<uint16_t> hx, hres;
        download(&hx, s.x, s.elems);
        download(&hres, s.res, s.elems);

        auto record = [&](const std::string& name, const char* quant, double us,
                          const std::string& shape, bool checked) {
          nlohmann::json r = {{"dtype", dn},     {"hidden", hidden},  {"tokens", tokens},
                              {"case", name},    {"quant", quant},    {"us", us},
                              {"launch", shape}, {"checked", checked}};
          results.push_back(r);
        };
        auto fail = [&](const std::string& variant, const char* quant, const std::string& what) {
          std::fprintf(stderr, "WRONG %s hidden %d tokens %d %s quant %s: %s\n", dn, hidden, tokens,
                       variant.c_str(), quant, what.c_str());
          wrongs.push_back({{"dtype", dn},
                            {"hidden", hidden},
                            {"tokens", tokens},
                            {"case", variant},
                            {"quant", quant},
                            {"what", what}});
          ++wrongCount;
        };

        // 1. The check. The first variant: unquantized against the reference; quantized
        // with normOut (the quantizer's input) against the host quantizer, then quantized only
        // against that. Every other variant, in the timed configuration, bit for bit against
        // the first. A variant whose bits differ from the first's is not timed; where the first
        // variant fails the reference, the others are still compared with it and timed, and
        // every row of that mode says "checked": false (a wrong reference or a wrong kernel: the
        // run fails either way).
        const size_t rowBytes = s.elems * 2;
        std::array<bool, 3> refOk = {false, false, false};
        std::vector<std::array<bool, 3>> same(variants.size());
        std::vector<std::array<std::string, 3>> launched(variants.size());
        std::vector<uint16_t> refNorm;
        for (int q : checkQuants) {
          const char* qn = anyr::quantName(q);
          if (q == anyrQuantNvfp4 && hidden % anyr::kNvfp4BlockElems != 0) continue;
          for (size_t vi = 0; vi < variants.size(); ++vi) {
            const Variant& v = variants[vi];
            same[vi][q] = false;
            if (vi > 0 && !same[0][q]) continue;
            AddRmsNormShape shape;
            std::string why;
            if (vi == 0 && q != anyrQuantNone) {
              poison(s, b, st);
              const cudaError_t le = launchVariant(v, s, paramsFor(s, b, q, true), st, &shape);
              if (le != cudaSuccess) {  // refused before anything ran: the others go on
                (void)cudaGetLastError();
                fail(v.name, qn, std::string("launch: ") + cudaGetErrorString(le));
                continue;
              }
              DIAG_CHECK(cudaStreamSynchronize(st));
              std::vector<uint16_t> norm;
              std::vector<uint8_t> qb, lin, swz;
              download(&norm, s.norm, s.elems);
              download(&qb, b.quant, s.quantBytes(q));
              if (q == anyrQuantNvfp4) {
                download(&lin, b.scales, s.elems / anyr::kNvfp4BlockElems);
                download(&swz, b.swizzled, s.swizzledBytes());
              }
              if (norm != refNorm) why = "normOut with quantization differs from normOut without";
              if (why.empty()) {
                why = deviceDiff(b, s.resOut, static_cast<char*>(b.refOut) + rowBytes, rowBytes, st,
                                 "residualOut with quantization");
              }
              if (why.empty()) why = checkQuantized(s, q, norm, qb, lin, swz, hostThreads);
              refOk[q] = why.empty();
              if (!why.empty()) fail(v.name + " (with normOut)", qn, why);
              why.clear();
              DIAG_CHECK(
                  cudaMemcpy(b.refQuant[q], b.quant, s.quantBytes(q), cudaMemcpyDeviceToDevice));
              if (q == anyrQuantNvfp4) {
                DIAG_CHECK(cudaMemcpy(b.refSwizzled, b.swizzled, s.swizzledBytes(),
                                      cudaMemcpyDeviceToDevice));
              }
            }
            // The timed configuration.
            poison(s, b, st);
            const cudaError_t le = launchVariant(v, s, paramsFor(s, b, q, false), st, &shape);
            if (le != cudaSuccess) {
              (void)cudaGetLastError();
              fail(v.name, qn, std::string("launch: ") + cudaGetErrorString(le));
              continue;
            }
            DIAG_CHECK(cudaStreamSynchronize(st));
            launched[vi][q] = v.api ? "anyrAddRmsNorm" : shapeText(shape);
            if (vi == 0 && q == anyrQuantNone) {
              std::vector<uint16_t> resOut;
              download(&refNorm, s.norm, s.elems);
              download(&resOut, s.resOut, s.elems);
              why = checkUnquantized(s, hx, hres, w, refNorm, resOut, hostThreads);
              refOk[q] = why.empty();
              if (!why.empty()) fail(v.name, qn, why);
              why.clear();
              DIAG_CHECK(cudaMemcpy(b.refOut, s.norm, 2 * rowBytes, cudaMemcpyDeviceToDevice));
            } else if (q == anyrQuantNone) {
              why = deviceDiff(b, s.norm, b.refOut, 2 * rowBytes, st, "normOut | residualOut");
            } else {
              why = deviceDiff(b, s.resOut, static_cast<char*>(b.refOut) + rowBytes, rowBytes, st,
                               "residualOut");
              if (why.empty()) {
                why = deviceDiff(b, b.quant, b.refQuant[q], s.quantBytes(q), st, "quantOut");
              }
              if (why.empty() && q == anyrQuantNvfp4) {
                why = deviceDiff(b, b.swizzled, b.refSwizzled, s.swizzledBytes(), st,
                                 "blockScalesSwizzled");
              }
            }
            if (!why.empty()) {
              fail(v.name, qn, why);
              continue;
            }
            same[vi][q] = true;
          }
        }

        // 2. The timings.
        const double empty = timer.time([&] {
          emptyKernel<<<1, 32, 0, st>>>();
          return cudaGetLastError();
        });
        const double emptyPdl = timer.time(
            [&] { return anyr::launchKernel(emptyPdlKernel, dim3(1), dim3(32), 0, st, true); });
        const double copy = timer.time([&] {
          return cudaMemcpyAsync(s.norm, s.x, 2 * rowBytes, cudaMemcpyDeviceToDevice, st);
        });
        const uint64_t words = 2 * rowBytes / 16;
        const int copyBlocks = static_cast<int>(std::min<uint64_t>(
            static_cast<uint64_t>(4 * prop.multiProcessorCount), (words + 255) / 256));
        const double copyKernelUs = timer.time([&] {
          copyKernel<<<copyBlocks, 256, 0, st>>>(reinterpret_cast<const uint4*>(s.x),
                                                 reinterpret_cast<uint4*>(s.norm), words);
          return cudaGetLastError();
        });
        record("empty", "none", empty, "1x32", true);
        record("empty-pdl", "none", emptyPdl, "1x32 pdl", true);
        record("copy", "none", copy, "cudaMemcpyAsync", true);
        record("copy-kernel", "none", copyKernelUs, std::to_string(copyBlocks) + "x256", true);
        for (int q : quants) {
          if (q == anyrQuantNvfp4 && hidden % anyr::kNvfp4BlockElems != 0) continue;
          const char* qn = anyr::quantName(q);
          std::printf("%4s %6d %5d %5s  empty %6.2f  pdl %6.2f  copy %8.2f  ck %8.2f |", dn, hidden,
                      tokens, qn, empty, emptyPdl, copy, copyKernelUs);
          for (size_t vi = 0; vi < variants.size(); ++vi) {
            const Variant& v = variants[vi];
            double us = -1.0;
            if (same[vi][q]) {
              const FusedParams p = paramsFor(s, b, q, false);
              us = timer.time([&] { return launchVariant(v, s, p, st, nullptr); });
              if (us < 0) fail(v.name, qn, "the graph capture or a launch failed");
            }
            record(v.name, qn, us, launched[vi][q], refOk[q] && same[vi][q]);
            if (us >= 0) {
              std::printf("  %s %.2f%s", v.name.c_str(), us, refOk[q] ? "" : "(unchecked)");
            } else {
              std::printf("  %s %s", v.name.c_str(), same[vi][q] ? "FAILED" : "WRONG");
            }
          }
          std::printf("\n");
          std::fflush(stdout);
        }
        if (!writeJson()) return 1;
      }
    }
  }

  if (!writeJson()) return 1;
  if (wrongCount != 0) {
    std::fprintf(stderr, "anyr_epilogue_bench: %d WRONG results (not timed; see above)\n",
                 wrongCount);
    return 4;
  }
  return 0;
}
