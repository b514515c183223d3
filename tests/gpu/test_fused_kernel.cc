// Single-process GPU tests (device 0, each test body in one forked child so that the test
// process stays CUDA-free) of the standalone add + RMSNorm (+ FP8 / NVFP4) kernel,
// anyrAddRmsNorm, against the host reference (tests/common/fused_reference.h).
//
// Matrix: dtype {bf16, fp16} x hidden {128, 6144, 7168, 16384} x tokens {1, 3, 64, 129, 2048}
// x weightPlusOne {0, 1} x residual {none, separate out, in place} x quant {none, FP8, NVFP4}.
// Every output is poisoned (0xFF) before every call, with a guard region after it.
//   residualOut: bit-exact (the fp32 add of two dtype values, rounded once, is exact math).
//   normOut: within half an ulp of the dtype of the fp64 value, plus fp32 error (2^-14 rel.),
//            and per row within the dtype's relative precision (L2).
//   FP8 / NVFP4: bit-exact against the host quantizer run on the kernel's own normOut (the
//            contract quantizes the rounded y), and dequantized values within half a grid
//            step of y; the run without normOut gives the same bits; 128x4 scales equal the
//            linear ones at the documented offsets, and padding rows stay unwritten.
//   x aliasing normOut gives the same bits; inputs stay untouched.
// Rows checked against the reference: all for tokens <= 129; for 2048, 96 rows (first, last,
// spread); every row is scanned for poison left behind.
// Crafted rows (y landing exactly on e2m1 ties, FP8 saturation, zero, -0.0, tiny and huge
// blocks) are compared bit for bit with the fp64 reference, scales included.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "anyreduce/anyreduce.h"
#include "common/fused_reference.h"
#include "fused/fused.h"
#include "gpu/code_arch.h"
#include "gpu/encoding_kernels.h"
#include "gpu/gpu_test_util.h"
#include "gpu/stream_order_kernels.h"
#include "topology/probe.h"

namespace anyr {
namespace {

constexpr size_t kGuard = 4096;
constexpr uint8_t kPoison = 0xff;
constexpr int kMaxTokens = 2048;

// Runs `body` in one forked child on device 0: this process stays CUDA-free (the multi-process
// tests of this binary fork their ranks from it). gtest works as usual inside the child, which
// prints its failures and exits non-zero if it had any.
void inChild(const std::function<void()>& body, double timeoutSec = 540) {
  auto results = launch::runRanks(
      1,
      [&](int, int, const anyrUniqueId&, const std::function<void(const std::string&)>& report) {
        try {
          if (cudaSetDevice(0) != cudaSuccess) {
            report("cudaSetDevice(0) failed");
            return 3;
          }
          body();
        } catch (const std::exception& e) {
          report(std::string("exception: ") + e.what());
          return 3;
        }
        return testing::Test::HasFailure() ? 1 : 0;
      },
      timeoutSec);
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].exitCode, 0) << launch::describeFailures(results);
}

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr << ": " << cudaGetLastError()

uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}
// Uniform in [lo, hi), a pure function of (seed, i).
double uniform(uint64_t seed, uint64_t i, double lo, double hi) {
  return lo + (hi - lo) * static_cast<double>(mix(seed * 0x9e3779b97f4a7c15ull ^ i) >> 11) /
                  9007199254740992.0;
}

const char* dtypeName(anyrDataType_t t) { return t == anyrBfloat16 ? "bf16" : "fp16"; }
const char* quantName(int q) {
  return q == anyrQuantNone ? "none" : (q == anyrQuantFp8 ? "fp8" : "nvfp4");
}

enum Residual { kNoResidual = 0, kSeparate = 1, kInPlace = 2 };
const char* residualName(int r) {
  return r == kNoResidual ? "none" : (r == kSeparate ? "separate" : "in-place");
}

// ---- device buffers, allocated once for the largest case ----------------------------------
struct Pool {
  uint8_t* x = nullptr;       // pristine x
  uint8_t* res = nullptr;     // pristine residualIn
  uint8_t* resOut = nullptr;  // residualOut (and residualIn in place)
  uint8_t* norm = nullptr;    // normOut (and x when aliased)
  uint8_t* quant = nullptr;
  uint8_t* scales = nullptr;
  uint8_t* swz = nullptr;
  uint8_t* weight = nullptr;
  float* scale = nullptr;
  bool ok = false;
};

Pool& pool() {
  static Pool p = [] {
    Pool q;
    const size_t rowBytes = size_t{kMaxTokens} * kFusedMaxHidden * 2;
    auto get = [&](size_t bytes) {
      void* ptr = nullptr;
      if (cudaMalloc(&ptr, bytes + kGuard + 64) != cudaSuccess)
        return static_cast<uint8_t*>(nullptr);
      return static_cast<uint8_t*>(ptr);
    };
    q.x = get(rowBytes);
    q.res = get(rowBytes);
    q.resOut = get(rowBytes);
    q.norm = get(rowBytes);
    q.quant = get(rowBytes / 2);
    q.scales = get(rowBytes / 32);
    q.swz = get(static_cast<size_t>(swizzledScaleBytes(kMaxTokens, kFusedMaxHidden / 16)));
    q.weight = get(kFusedMaxHidden * 2);
    q.scale = reinterpret_cast<float*>(get(sizeof(float)));
    q.ok =
        q.x && q.res && q.resOut && q.norm && q.quant && q.scales && q.swz && q.weight && q.scale;
    return q;
  }();
  return p;
}

// ---- host-side problem and results --------------------------------------------------------
struct Inputs {
  anyrDataType_t dtype = anyrBfloat16;
  int tokens = 0, hidden = 0;
  std::vector<uint16_t> x, res, weight;  // dtype bits
  bool weightPlusOne = false;
};

// x in [-4, 4), residual in [-2, 2), weight in [-1.5, 1.5) or, with weightPlusOne, [-0.5, 0.5).
Inputs makeInputs(anyrDataType_t t, int tokens, int hidden, uint64_t seed) {
  Inputs in;
  in.dtype = t;
  in.tokens = tokens;
  in.hidden = hidden;
  const size_t n = static_cast<size_t>(tokens) * hidden;
  in.x.resize(n);
  in.res.resize(n);
  for (size_t i = 0; i < n; ++i) {
    in.x[i] = ref::dtypeBits(uniform(seed, 2 * i, -4, 4), t);
    in.res[i] = ref::dtypeBits(uniform(seed, 2 * i + 1, -2, 2), t);
  }
  return in;
}

void setWeights(Inputs* in, bool weightPlusOne, uint64_t seed) {
  in->weightPlusOne = weightPlusOne;
  in->weight.resize(in->hidden);
  for (int i = 0; i < in->hidden; ++i) {
    const double w = weightPlusOne ? uniform(seed, i, -0.5, 0.5) : uniform(seed, i, -1.5, 1.5);
    in->weight[i] = ref::dtypeBits(w, in->dtype);
  }
}

struct RunSpec {
  int residual = kNoResidual;
  int quant = anyrQuantNone;
  bool normOut = true;
  bool linearScales = true;
  bool swizzledScales = true;
  bool xAliasesNorm = false;
  float scale = 1.0f;  // FP8 scale or NVFP4 global scale
  float epsilon = 1e-6f;
  // Non-zero: pointer offsets in bytes, to take the unaligned paths.
  size_t elemOffset = 0;  // x, residual buffers, weight, normOut (multiple of 2)
  size_t byteOffset = 0;  // quantOut, block scales
  int threads = 0;        // 0: anyrAddRmsNorm; else launchAddRmsNorm with this block size
  // A forced form of the standalone kernel (launchAddRmsNormWith), -1: as `threads` says.
  int form = -1;
  int maxVpt = 3;
  int clusterBlocks = 0;
  bool clusterExitBarrier = true;
  AddRmsNormGrid grid = AddRmsNormGrid::Auto;     // AddRmsNormLaunch::grid
  AddRmsNormHints hints = AddRmsNormHints::Auto;  // AddRmsNormLaunch::hints
  cudaStream_t stream = nullptr;
  bool captureGraph = false;
  // Non-zero (a separate residual only): x and residualIn are fresh poisoned buffers that a
  // kernel launched just before the call, on the same stream, fills only after this many ns
  // (ordertest::copyLate, which lets the call's launch start at once); that kernel also copies
  // normOut and residualOut as it finds them then, which must still be the poison.
  uint64_t lateInputsNs = 0;
};

struct Outputs {
  std::vector<uint16_t> resOut, norm;  // tokens x hidden, then the guard (as bytes)
  std::vector<uint8_t> resOutGuard, normGuard;
  std::vector<uint8_t> quant, scales, swz;  // guard included
  size_t quantBytes = 0, scaleBytes = 0, swzBytes = 0;
};

size_t quantBytesOf(const Inputs& in, int quant) {
  const size_t n = static_cast<size_t>(in.tokens) * in.hidden;
  return quant == anyrQuantFp8 ? n : (quant == anyrQuantNvfp4 ? n / 2 : 0);
}

// Uploads x, residualIn and the weights into the pool's pristine buffers.
void upload(const Inputs& in, const RunSpec& spec) {
  Pool& p = pool();
  const size_t bytes = in.x.size() * 2;
  ASSERT_EQ(cudaMemcpy(p.x + spec.elemOffset, in.x.data(), bytes, cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(p.res + spec.elemOffset, in.res.data(), bytes, cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(p.weight + spec.elemOffset, in.weight.data(), in.weight.size() * 2,
                       cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(p.scale, &spec.scale, sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
}

bool allBytesAre(const uint8_t* p, size_t n, uint8_t v) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != v) return false;
  }
  return true;
}

// A device allocation freed with its scope.
struct DeviceBuffer {
  uint8_t* ptr = nullptr;
  bool allocate(size_t bytes) { return cudaMalloc(&ptr, bytes) == cudaSuccess; }
  ~DeviceBuffer() {
    if (ptr != nullptr) (void)cudaFree(ptr);
  }
};

// Poisons the outputs, runs the kernel, copies every output (with its guard) back.
void run(const Inputs& in, const RunSpec& spec, Outputs* out) {
  Pool& p = pool();
  ASSERT_TRUE(p.ok) << "device allocation failed";
  const size_t n = static_cast<size_t>(in.tokens) * in.hidden;
  const size_t bytes = n * 2;
  const size_t eo = spec.elemOffset, bo = spec.byteOffset;
  out->quantBytes = quantBytesOf(in, spec.quant);
  out->scaleBytes = spec.quant == anyrQuantNvfp4 ? n / 16 : 0;
  out->swzBytes = spec.quant == anyrQuantNvfp4
                      ? static_cast<size_t>(swizzledScaleBytes(in.tokens, in.hidden / 16))
                      : 0;
  CUDA_OK(cudaMemset(p.resOut, kPoison, bytes + eo + kGuard));
  CUDA_OK(cudaMemset(p.norm, kPoison, bytes + eo + kGuard));
  CUDA_OK(cudaMemset(p.quant, kPoison, out->quantBytes + bo + kGuard));
  CUDA_OK(cudaMemset(p.scales, kPoison, out->scaleBytes + bo + kGuard));
  CUDA_OK(cudaMemset(p.swz, kPoison, out->swzBytes + bo + kGuard));

  const void* x = p.x + eo;
  const void* residualIn = nullptr;
  void* residualOut = nullptr;
  if (spec.residual == kSeparate) {
    residualIn = p.res + eo;
    residualOut = p.resOut + eo;
  } else if (spec.residual == kInPlace) {
    CUDA_OK(cudaMemcpy(p.resOut + eo, p.res + eo, bytes, cudaMemcpyDeviceToDevice));
    residualIn = residualOut = p.resOut + eo;
  }
  void* normOut = spec.normOut ? p.norm + eo : nullptr;
  if (spec.xAliasesNorm) {
    CUDA_OK(cudaMemcpy(p.norm + eo, p.x + eo, bytes, cudaMemcpyDeviceToDevice));
    x = p.norm + eo;
  }
  anyrFusedOptions_t o = ANYR_FUSED_OPTIONS_INITIALIZER;
  o.weightPlusOne = in.weightPlusOne ? 1 : 0;
  o.quant = spec.quant;
  if (spec.quant != anyrQuantNone) {
    o.scale = p.scale;
    o.quantOut = p.quant + bo;
  }
  if (spec.quant == anyrQuantNvfp4) {
    o.blockScales = spec.linearScales ? p.scales + bo : nullptr;
    o.blockScalesSwizzled = spec.swizzledScales ? p.swz + bo : nullptr;
  }
  // The late inputs: the poisoned buffers x and residualIn point to, and the witnesses of what
  // normOut and residualOut held when the kernel before the call copied them.
  DeviceBuffer lateX, lateRes, witnessNorm, witnessRes;
  if (spec.lateInputsNs != 0) {
    ASSERT_EQ(spec.residual, kSeparate) << "late inputs take a separate residual";
    ASSERT_FALSE(spec.xAliasesNorm);
    for (DeviceBuffer* b : {&lateX, &lateRes, &witnessNorm, &witnessRes}) {
      ASSERT_TRUE(b->allocate(bytes));
      CUDA_OK(cudaMemset(b->ptr, kPoison, bytes));
    }
    x = lateX.ptr;
    residualIn = lateRes.ptr;
  }
  CUDA_OK(cudaDeviceSynchronize());

  auto launch = [&](cudaStream_t s) {
    if (spec.lateInputsNs != 0) {
      const ordertest::Copy copies[4] = {{witnessNorm.ptr, normOut},
                                         {witnessRes.ptr, residualOut},
                                         {lateX.ptr, p.x + eo},
                                         {lateRes.ptr, p.res + eo}};
      const cudaError_t e =
          ordertest::copyLate(copies, normOut != nullptr ? 4 : 3, bytes, spec.lateInputsNs, s);
      if (e != cudaSuccess) return e;
    }
    if (spec.form >= 0) {
      const FusedParams fp =
          makeFusedParams(x, "x", residualIn, residualOut, p.weight + eo, spec.epsilon, normOut,
                          in.tokens, in.hidden, in.dtype, &o);
      AddRmsNormLaunch l;
      l.form = static_cast<AddRmsNormForm>(spec.form);
      l.threads = spec.threads;
      l.maxVpt = spec.maxVpt;
      l.clusterBlocks = spec.clusterBlocks;
      l.clusterExitBarrier = spec.clusterExitBarrier;
      l.grid = spec.grid;
      l.hints = spec.hints;
      return launchAddRmsNormWith(in.dtype, x, fp, s, l);
    }
    if (spec.threads == 0) {
      if (anyrAddRmsNorm(x, residualIn, residualOut, p.weight + eo, spec.epsilon, normOut,
                         in.tokens, in.hidden, in.dtype, &o, s) == anyrSuccess) {
        return cudaSuccess;
      }
      ADD_FAILURE() << "anyrAddRmsNorm: " << anyrGetLastError(nullptr);
      return cudaErrorUnknown;
    }
    const FusedParams fp =
        makeFusedParams(x, "x", residualIn, residualOut, p.weight + eo, spec.epsilon, normOut,
                        in.tokens, in.hidden, in.dtype, &o);
    return launchAddRmsNorm(in.dtype, x, fp, s, spec.threads);
  };
  if (spec.captureGraph) {
    cudaStream_t s = nullptr;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    const cudaError_t launched = launch(s);
    CUDA_OK(cudaStreamEndCapture(s, &graph));
    CUDA_OK(launched);
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_OK(cudaGraphLaunch(exec, s));  // replayed twice: the second must give the same bits
    // (once with late inputs: its witnesses must find the poison, not the first replay's bits)
    if (spec.lateInputsNs == 0) {
      CUDA_OK(cudaGraphLaunch(exec, s));
    }
    CUDA_OK(cudaStreamSynchronize(s));
    CUDA_OK(cudaGraphExecDestroy(exec));
    CUDA_OK(cudaGraphDestroy(graph));
    CUDA_OK(cudaStreamDestroy(s));
  } else if (spec.lateInputsNs != 0 && spec.stream == nullptr) {
    cudaStream_t s = nullptr;  // a stream of its own, as a serving framework's
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const cudaError_t launched = launch(s);
    CUDA_OK(cudaStreamSynchronize(s));
    CUDA_OK(cudaStreamDestroy(s));
    CUDA_OK(launched);
  } else {
    CUDA_OK(launch(spec.stream));
  }
  CUDA_OK(cudaDeviceSynchronize());

  auto fetch16 = [&](const uint8_t* dev, std::vector<uint16_t>* v, std::vector<uint8_t>* guard) {
    v->resize(n);
    guard->resize(kGuard);
    ASSERT_EQ(cudaMemcpy(v->data(), dev + eo, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(guard->data(), dev + eo + bytes, kGuard, cudaMemcpyDeviceToHost),
              cudaSuccess);
  };
  auto fetch8 = [&](const uint8_t* dev, size_t count, std::vector<uint8_t>* v) {
    v->resize(count + kGuard);
    ASSERT_EQ(cudaMemcpy(v->data(), dev + bo, count + kGuard, cudaMemcpyDeviceToHost), cudaSuccess);
  };
  if (spec.lateInputsNs != 0) {
    std::vector<uint8_t> seen(bytes);
    for (DeviceBuffer* b : {&witnessNorm, &witnessRes}) {
      if (b == &witnessNorm && normOut == nullptr) continue;
      ASSERT_EQ(cudaMemcpy(seen.data(), b->ptr, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_TRUE(allBytesAre(seen.data(), bytes, kPoison))
          << (b == &witnessNorm ? "normOut" : "residualOut")
          << " was written before the kernel ahead of the call on its stream had finished";
    }
  }
  fetch16(p.resOut, &out->resOut, &out->resOutGuard);
  fetch16(p.norm, &out->norm, &out->normGuard);
  fetch8(p.quant, out->quantBytes, &out->quant);
  fetch8(p.scales, out->scaleBytes, &out->scales);
  fetch8(p.swz, out->swzBytes, &out->swz);
}

// ---- checking -----------------------------------------------------------------------------
// Collects failures and reports the first few (a mismatch in every element would otherwise
// print millions of lines).
class Checker {
 public:
  explicit Checker(std::string where) : where_(std::move(where)) {}
  ~Checker() { EXPECT_EQ(count_, 0u) << where_ << first_.str(); }
  template <typename F>
  void expect(bool ok, F&& describe) {
    if (ok) return;
    if (count_++ < 6) first_ << "\n  " << describe();
  }
  size_t failures() const { return count_; }

 private:
  std::string where_;
  size_t count_ = 0;
  std::ostringstream first_;
};

std::vector<int> rowsToCheck(int tokens) {
  std::vector<int> rows;
  if (tokens <= 129) {
    for (int r = 0; r < tokens; ++r) rows.push_back(r);
    return rows;
  }
  for (int r = 0; r < 32; ++r) rows.push_back(r);
  for (int r = 0; r < 32; ++r) rows.push_back(32 + r * (tokens - 64) / 32);
  for (int r = tokens - 32; r < tokens; ++r) rows.push_back(r);
  return rows;
}

double halfE2m1Step(double u) { return u < 2.0 ? 0.25 : (u < 4.0 ? 0.5 : 1.0); }

// Everything that can be checked about one run.
void checkRun(const Inputs& in, const RunSpec& spec, const Outputs& out, const std::string& where) {
  Checker ck(where);
  const anyrDataType_t t = in.dtype;
  const int H = in.hidden;
  const size_t n = static_cast<size_t>(in.tokens) * H;
  const bool hasResOut = spec.residual != kNoResidual;

  // Poison and guards, over every row.
  ck.expect(allBytesAre(out.resOutGuard.data(), kGuard, kPoison),
            [] { return std::string("residualOut guard overwritten"); });
  ck.expect(allBytesAre(out.normGuard.data(), kGuard, kPoison),
            [] { return std::string("normOut guard overwritten"); });
  ck.expect(allBytesAre(out.quant.data() + out.quantBytes, kGuard, kPoison),
            [] { return std::string("quantOut guard overwritten"); });
  ck.expect(allBytesAre(out.scales.data() + out.scaleBytes, kGuard, kPoison),
            [] { return std::string("blockScales guard overwritten"); });
  ck.expect(allBytesAre(out.swz.data() + out.swzBytes, kGuard, kPoison),
            [] { return std::string("blockScalesSwizzled guard overwritten"); });
  if (!hasResOut) {
    ck.expect(allBytesAre(reinterpret_cast<const uint8_t*>(out.resOut.data()), n * 2, kPoison),
              [] { return std::string("residualOut written without a residual"); });
  }
  if (!spec.normOut && !spec.xAliasesNorm) {
    ck.expect(allBytesAre(reinterpret_cast<const uint8_t*>(out.norm.data()), n * 2, kPoison),
              [] { return std::string("normOut written although NULL"); });
  }
  for (size_t i = 0; i < n; ++i) {
    if (hasResOut) {
      ck.expect(out.resOut[i] != 0xffff,
                [&] { return "residualOut poison at " + std::to_string(i); });
    }
    if (spec.normOut) {
      ck.expect(out.norm[i] != 0xffff, [&] { return "normOut poison at " + std::to_string(i); });
    }
  }
  if (spec.quant == anyrQuantFp8) {
    for (size_t i = 0; i < n; ++i) {
      ck.expect(out.quant[i] != 0xff, [&] { return "quantOut poison at " + std::to_string(i); });
    }
  }
  const int K = H / 16;
  if (spec.quant == anyrQuantNvfp4) {
    if (spec.linearScales) {
      for (size_t i = 0; i < out.scaleBytes; ++i) {
        ck.expect(out.scales[i] != 0xff,
                  [&] { return "blockScales poison at " + std::to_string(i); });
      }
    }
    if (spec.swizzledScales) {
      for (int64_t m = 0; m < swizzledPaddedRows(in.tokens); ++m) {
        for (int64_t k = 0; k < swizzledPaddedCols(K); ++k) {
          const uint8_t s = out.swz[swizzledScaleOffset(m, k, K)];
          if (m >= in.tokens || k >= K) {
            ck.expect(s == kPoison, [&] {
              return "swizzled padding (" + std::to_string(m) + "," + std::to_string(k) +
                     ") written";
            });
          } else if (spec.linearScales) {
            ck.expect(s == out.scales[m * K + k], [&] {
              return "swizzled scale (" + std::to_string(m) + "," + std::to_string(k) +
                     ") != linear";
            });
          } else {
            ck.expect(s != kPoison,
                      [&] { return "swizzled scale missing at row " + std::to_string(m); });
          }
        }
      }
    }
  }

  // Against the reference, on the sampled rows.
  ref::RowSpec rs;
  rs.dtype = t;
  rs.hidden = static_cast<size_t>(H);
  rs.epsilon = spec.epsilon;
  rs.weightPlusOne = in.weightPlusOne;
  std::vector<double> xr(H), rr(H), w(H);
  for (int i = 0; i < H; ++i) w[i] = ref::dtypeValue(in.weight[i], t);
  ref::RowResult res;
  std::vector<float> yk(H);
  std::vector<uint8_t> q(H), sc(K);
  size_t roundingDiffs = 0, checked = 0;
  const double rowTol = t == anyrBfloat16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
  for (int row : rowsToCheck(in.tokens)) {
    const size_t base = static_cast<size_t>(row) * H;
    for (int i = 0; i < H; ++i) {
      xr[i] = ref::dtypeValue(in.x[base + i], t);
      rr[i] = ref::dtypeValue(in.res[base + i], t);
    }
    ref::referenceRow(rs, xr.data(), hasResOut ? rr.data() : nullptr, w.data(), &res);
    if (hasResOut) {
      for (int i = 0; i < H; ++i) {
        ck.expect(out.resOut[base + i] == ref::dtypeBits(res.r[i], t), [&] {
          return "residualOut[" + std::to_string(row) + "][" + std::to_string(i) +
                 "] = " + std::to_string(ref::dtypeValue(out.resOut[base + i], t)) + ", expected " +
                 std::to_string(res.r[i]);
        });
      }
    }
    if (!spec.normOut) continue;
    double err2 = 0, ref2 = 0;
    for (int i = 0; i < H; ++i) {
      const double got = ref::dtypeValue(out.norm[base + i], t);
      const double ye = res.yExact[i];
      const double tol = 0.5 * ref::dtypeUlp(ye, t) + std::ldexp(std::fabs(ye), -14) + 1e-30;
      ck.expect(std::fabs(got - ye) <= tol, [&] {
        std::ostringstream os;
        os << "normOut[" << row << "][" << i << "] = " << got << ", fp64 " << ye << " (tolerance "
           << tol << ")";
        return os.str();
      });
      roundingDiffs += got != res.y[i];
      ++checked;
      err2 += (got - ye) * (got - ye);
      ref2 += ye * ye;
      yk[i] = static_cast<float>(got);
    }
    ck.expect(ref2 == 0 || std::sqrt(err2 / ref2) <= rowTol, [&] {
      return "normOut row " + std::to_string(row) + " relative error " +
             std::to_string(std::sqrt(err2 / ref2));
    });

    if (spec.quant == anyrQuantFp8) {
      ref::quantizeFp8(yk.data(), H, spec.scale, q.data());
      for (int i = 0; i < H; ++i) {
        const uint8_t code = out.quant[base + i];
        ck.expect(code == q[i], [&] {
          std::ostringstream os;
          os << "fp8[" << row << "][" << i << "] = 0x" << std::hex << int(code) << ", expected 0x"
             << int(q[i]) << std::dec << " (y " << yk[i] << ")";
          return os.str();
        });
        const double v = static_cast<double>(yk[i]) / spec.scale;
        const double d = ref::e4m3Decode(code);
        const bool ok =
            std::fabs(v) >= 448.0
                ? d == std::copysign(448.0, v)
                : std::fabs(d - v) <= 0.5 * ref::e4m3Ulp(v) + std::ldexp(std::fabs(v), -20);
        ck.expect(ok, [&] {
          return "fp8 dequantized " + std::to_string(d) + " vs " + std::to_string(v);
        });
      }
    }
    if (spec.quant == anyrQuantNvfp4) {
      ref::quantizeNvfp4(yk.data(), H, spec.scale, q.data(), sc.data());
      const uint8_t* qk = out.quant.data() + base / 2;
      const uint8_t* sk =
          spec.linearScales ? out.scales.data() + static_cast<size_t>(row) * K : nullptr;
      for (int b = 0; b < K; ++b) {
        const uint8_t s = sk ? sk[b] : out.swz[swizzledScaleOffset(row, b, K)];
        ck.expect(s == sc[b], [&] {
          std::ostringstream os;
          os << "nvfp4 scale[" << row << "][" << b << "] = 0x" << std::hex << int(s)
             << ", expected 0x" << int(sc[b]);
          return os.str();
        });
        const double g = spec.scale, d = ref::e4m3Decode(s) * g;
        double amax = 0;
        for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(double(yk[16 * b + i])));
        if (d == 0) {
          ck.expect(amax <= 6 * g * std::ldexp(1.0, -10) * (1 + 1e-6),
                    [&] { return "nvfp4 scale 0 for amax " + std::to_string(amax); });
        } else if (amax / (6 * g) >= std::ldexp(1.0, -6) && amax / (6 * g) <= 448) {
          ck.expect(std::fabs(ref::e4m3Decode(s) / (amax / (6 * g)) - 1) <= 1.0 / 16 + 1e-6,
                    [&] { return "nvfp4 scale far from amax / (6 g)"; });
        }
        for (int i = 0; i < 16; ++i) {
          const int e = 16 * b + i;
          const uint8_t code = (qk[e / 2] >> (4 * (e % 2))) & 15;
          const uint8_t want = (q[e / 2] >> (4 * (e % 2))) & 15;
          ck.expect(code == want, [&] {
            std::ostringstream os;
            os << "nvfp4[" << row << "][" << e << "] = " << int(code) << ", expected " << int(want)
               << " (y " << yk[e] << ", d " << d << ")";
            return os.str();
          });
          if (d > 0) {
            const double y = yk[e], u = std::fabs(y) / d, deq = ref::e2m1Decode(code) * d;
            const bool ok = u > 6 ? deq == std::copysign(6 * d, y)
                                  : std::fabs(deq - y) <= halfE2m1Step(u) * d * (1 + 1e-6);
            ck.expect(ok, [&] {
              return "nvfp4 dequantized " + std::to_string(deq) + " vs " + std::to_string(y);
            });
          }
        }
      }
    }
  }
  // Rounding of y differs from the fp64 value's rounding only next to ties.
  ck.expect(roundingDiffs * 100 <= checked + 100, [&] {
    return std::to_string(roundingDiffs) + " of " + std::to_string(checked) +
           " normOut values differ from the rounded fp64 value";
  });
}

std::string describe(const Inputs& in, const RunSpec& s) {
  std::ostringstream os;
  os << dtypeName(in.dtype) << " hidden=" << in.hidden << " tokens=" << in.tokens
     << " weightPlusOne=" << in.weightPlusOne << " residual=" << residualName(s.residual)
     << " quant=" << quantName(s.quant) << " normOut=" << s.normOut
     << " xAliasesNorm=" << s.xAliasesNorm << " threads=" << s.threads << " form="
     << (s.form >= 0 ? addRmsNormFormName(static_cast<AddRmsNormForm>(s.form)) : "default")
     << " maxVpt=" << s.maxVpt << " cluster=" << s.clusterBlocks
     << (s.clusterExitBarrier ? "" : " (no exit barrier)")
     << (s.grid == AddRmsNormGrid::PerRow     ? " (block per row)"
         : s.grid == AddRmsNormGrid::Resident ? " (resident blocks)"
                                              : "")
     << (s.hints == AddRmsNormHints::On ? " (cache hints)" : "") << " offsets=" << s.elemOffset
     << "/" << s.byteOffset << " graph=" << s.captureGraph;
  return os.str();
}

void expectSameQuant(const Outputs& a, const Outputs& b, bool swizzledOnly,
                     const std::string& where) {
  EXPECT_TRUE(a.quant == b.quant) << where << ": quantOut differs";
  if (swizzledOnly) {
    EXPECT_TRUE(a.swz == b.swz) << where << ": swizzled scales differ";
  } else {
    EXPECT_TRUE(a.scales == b.scales) << where << ": block scales differ";
    EXPECT_TRUE(a.swz == b.swz) << where << ": swizzled scales differ";
  }
}

void expectSameOutputs(const Outputs& a, const Outputs& b, const std::string& where) {
  EXPECT_TRUE(a.resOut == b.resOut) << where << ": residualOut differs";
  EXPECT_TRUE(a.norm == b.norm) << where << ": normOut differs";
  expectSameQuant(a, b, false, where);
}

// Inputs must come back untouched.
void expectInputsUntouched(const Inputs& in, const RunSpec& spec) {
  Pool& p = pool();
  std::vector<uint16_t> x(in.x.size()), res(in.res.size()), w(in.weight.size());
  ASSERT_EQ(cudaMemcpy(x.data(), p.x + spec.elemOffset, x.size() * 2, cudaMemcpyDeviceToHost),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(res.data(), p.res + spec.elemOffset, res.size() * 2, cudaMemcpyDeviceToHost),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(w.data(), p.weight + spec.elemOffset, w.size() * 2, cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_TRUE(x == in.x) << "x changed";
  EXPECT_TRUE(res == in.res) << "residualIn (separate) changed";
  EXPECT_TRUE(w == in.weight) << "weight changed";
}

float scaleFor(int quant) { return quant == anyrQuantFp8 ? 0.006f : 0.0017f; }

// run(), and whether it went without a fatal failure (where not, the caller returns).
bool ran(const Inputs& in, const RunSpec& spec, Outputs* out) {
  run(in, spec, out);
  return !testing::Test::HasFatalFailure();
}

// A spec with a separate residual and `quant` at its test scale, its inputs uploaded.
RunSpec separateResidualSpec(const Inputs& in, int quant) {
  RunSpec spec;
  spec.residual = kSeparate;
  spec.quant = quant;
  spec.scale = scaleFor(quant);
  upload(in, spec);
  return spec;
}

// ---- the matrix ---------------------------------------------------------------------------
class FusedKernelMatrix : public testing::TestWithParam<std::tuple<anyrDataType_t, int, int>> {};

TEST_P(FusedKernelMatrix, MatchesReference) {
  REQUIRE_GPU();
  inChild([&] {
    const anyrDataType_t t = std::get<0>(GetParam());
    const int hidden = std::get<1>(GetParam());
    const int quant = std::get<2>(GetParam());
    for (int tokens : {1, 3, 64, 129, 2048}) {
      Inputs in = makeInputs(t, tokens, hidden, 1000 + tokens);
      for (int wpo = 0; wpo < 2; ++wpo) {
        setWeights(&in, wpo != 0, 77 + wpo);
        RunSpec spec;
        spec.quant = quant;
        spec.scale = scaleFor(quant);
        upload(in, spec);
        if (HasFatalFailure()) return;
        for (int residual : {kNoResidual, kSeparate, kInPlace}) {
          spec.residual = residual;
          spec.normOut = true;
          spec.linearScales = spec.swizzledScales = true;
          spec.xAliasesNorm = false;
          const std::string where = describe(in, spec);
          SCOPED_TRACE(where);
          Outputs full;
          if (!ran(in, spec, &full)) return;
          checkRun(in, spec, full, where);

          // x aliasing normOut: the same bits.
          RunSpec alias = spec;
          alias.xAliasesNorm = true;
          Outputs aliased;
          if (!ran(in, alias, &aliased)) return;
          expectSameOutputs(full, aliased, describe(in, alias));

          // Quantized output only: the same quantized bits (NVFP4: swizzled scales only).
          if (quant != anyrQuantNone) {
            RunSpec qonly = spec;
            qonly.normOut = false;
            qonly.linearScales = false;
            Outputs quantOnly;
            if (!ran(in, qonly, &quantOnly)) return;
            checkRun(in, qonly, quantOnly, describe(in, qonly));
            expectSameQuant(full, quantOnly, true, describe(in, qonly));
            EXPECT_TRUE(full.resOut == quantOnly.resOut) << describe(in, qonly);
          }
        }
        expectInputsUntouched(in, spec);
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(
    Fused, FusedKernelMatrix,
    testing::Combine(testing::Values(anyrBfloat16, anyrFloat16),
                     testing::Values(128, 6144, 7168, 16384),
                     testing::Values(int(anyrQuantNone), int(anyrQuantFp8), int(anyrQuantNvfp4))),
    [](const testing::TestParamInfo<std::tuple<anyrDataType_t, int, int>>& param) {
      return std::string(dtypeName(std::get<0>(param.param))) + "_h" +
             std::to_string(std::get<1>(param.param)) + "_" + quantName(std::get<2>(param.param));
    });

// ---- block size, alignment, graphs --------------------------------------------------------
// The epilogue's summation order does not depend on the block size: every block size of the
// staged kernel gives the bits of the default, the register kernel (the fused all-reduce
// kernels use other block sizes). Its widths: one vector a thread (128), two (7168), three
// (12288, and 8208, whose third vector only two threads hold: one NVFP4 block), four (16384).
TEST(FusedKernel, BlockSizeDoesNotChangeTheBits) {
  REQUIRE_GPU();
  inChild([&] {
    for (anyrDataType_t t : {anyrBfloat16, anyrFloat16}) {
      for (int hidden : {128, 7168, 8208, 12288, 16384}) {
        Inputs in = makeInputs(t, 5, hidden, 4242);
        setWeights(&in, false, 5);
        RunSpec spec = separateResidualSpec(in, anyrQuantNvfp4);
        Outputs base;
        if (!ran(in, spec, &base)) return;
        checkRun(in, spec, base, describe(in, spec));
        for (int threads : {32, 96, 256, 512, 1024}) {
          RunSpec other = spec;
          other.threads = threads;
          Outputs o;
          if (!ran(in, other, &o)) return;
          expectSameOutputs(base, o, describe(in, other));
        }
      }
    }
  });
}

// Every form of the standalone kernel (fused.h, AddRmsNormForm) gives the bits of the staged
// kernel: Regs, Rows at one to four vectors a thread and at the chosen count (its grid chosen,
// forced to one block per row and forced to the resident blocks), Cluster at 2, 4 and 8 blocks (one
// cluster per row and rows looping over the clusters; with and without the final cluster barrier),
// with aligned and unaligned buffers (the general kernels), residual separate and in place, x
// aliasing normOut, unquantized and quantized.
TEST(FusedKernel, EveryFormGivesTheSameBits) {
  REQUIRE_GPU();
  inChild([&] {
    struct Form {
      AddRmsNormForm form;
      int maxVpt, cluster;
      bool exitBarrier;
      AddRmsNormGrid grid = AddRmsNormGrid::Auto;
      AddRmsNormHints hints = AddRmsNormHints::Off;
    };
    const Form forms[] = {
        {AddRmsNormForm::Regs, 3, 0, true},
        {AddRmsNormForm::Rows, 1, 0, true},
        {AddRmsNormForm::Rows, 2, 0, true},
        {AddRmsNormForm::Rows, 3, 0, true},
        {AddRmsNormForm::Rows, 4, 0, true},
        {AddRmsNormForm::Rows, 0, 0, true},
        {AddRmsNormForm::Rows, 1, 0, true, AddRmsNormGrid::PerRow},
        {AddRmsNormForm::Rows, 3, 0, true, AddRmsNormGrid::PerRow},
        {AddRmsNormForm::Rows, 3, 0, true, AddRmsNormGrid::Resident},
        {AddRmsNormForm::Rows, 1, 0, true, AddRmsNormGrid::Auto, AddRmsNormHints::On},
        {AddRmsNormForm::Rows, 3, 0, true, AddRmsNormGrid::Auto, AddRmsNormHints::On},
        {AddRmsNormForm::Cluster, 3, 2, true},
        {AddRmsNormForm::Cluster, 3, 4, true},
        {AddRmsNormForm::Cluster, 3, 8, true},
        {AddRmsNormForm::Cluster, 3, 2, false},
        {AddRmsNormForm::Cluster, 3, 8, false},
        {AddRmsNormForm::Auto, 3, 0, true, AddRmsNormGrid::Auto, AddRmsNormHints::Auto}};
    int compared = 0;
    for (anyrDataType_t t : {anyrBfloat16, anyrFloat16}) {
      for (int hidden : {128, 2880, 6144, 7168, 8192, 12288, 16384}) {
        for (int tokens : {1, 5, 300, 1100}) {
          for (int quant : {int(anyrQuantNone), int(anyrQuantFp8), int(anyrQuantNvfp4)}) {
            if (tokens == 1100 && quant == anyrQuantFp8) continue;  // time: the others cover it
            Inputs in = makeInputs(t, tokens, hidden, 31 * hidden + tokens);
            setWeights(&in, quant == anyrQuantFp8, 9);
            for (int residual : {kSeparate, kInPlace}) {
              for (size_t offset : {size_t{0}, size_t{2}}) {
                if (offset != 0 && (residual == kInPlace || tokens > 5)) continue;
                RunSpec spec = separateResidualSpec(in, quant);
                spec.residual = residual;
                spec.elemOffset = offset;
                spec.byteOffset = offset != 0 ? offset - 1 : 0;
                spec.form = static_cast<int>(AddRmsNormForm::Staged);
                spec.threads = 256;
                upload(in, spec);
                Outputs staged;
                if (!ran(in, spec, &staged)) return;
                checkRun(in, spec, staged, describe(in, spec));
                for (const Form& f : forms) {
                  for (bool alias : {false, true}) {
                    if (alias && (offset != 0 || f.form == AddRmsNormForm::Regs)) continue;
                    RunSpec other = spec;
                    other.form = static_cast<int>(f.form);
                    other.threads = 0;
                    other.maxVpt = f.maxVpt;
                    other.clusterBlocks = f.cluster;
                    other.clusterExitBarrier = f.exitBarrier;
                    other.grid = f.grid;
                    other.hints = f.hints;
                    other.xAliasesNorm = alias;
                    Outputs o;
                    if (!ran(in, other, &o)) return;
                    expectSameOutputs(staged, o, describe(in, other));
                    ++compared;
                  }
                }
              }
            }
          }
        }
      }
    }
    std::printf("[   INFO   ] %d runs of the forms compared with the staged kernel\n", compared);
  });
}

// Buffers aligned only to their element size take the scalar paths; the bits stay the same.
TEST(FusedKernel, UnalignedBuffers) {
  REQUIRE_GPU();
  inChild([&] {
    for (anyrDataType_t t : {anyrBfloat16, anyrFloat16}) {
      for (int quant : {int(anyrQuantFp8), int(anyrQuantNvfp4)}) {
        Inputs in = makeInputs(t, 9, 6144, 99);
        setWeights(&in, true, 6);
        RunSpec spec = separateResidualSpec(in, quant);
        Outputs aligned;
        if (!ran(in, spec, &aligned)) return;
        for (size_t offsets : {2, 6}) {
          RunSpec odd = spec;
          odd.elemOffset = offsets;
          odd.byteOffset = offsets - 1;
          upload(in, odd);
          Outputs o;
          if (!ran(in, odd, &o)) return;
          checkRun(in, odd, o, describe(in, odd));
          expectSameOutputs(aligned, o, describe(in, odd));
        }
      }
    }
  });
}

TEST(FusedKernel, GraphCaptureAndReplay) {
  REQUIRE_GPU();
  inChild([&] {
    Inputs in = makeInputs(anyrBfloat16, 64, 16384, 7);
    setWeights(&in, false, 8);
    // A separate residual: replayed twice, in place would add the residual twice.
    RunSpec spec = separateResidualSpec(in, anyrQuantNvfp4);
    Outputs eager;
    if (!ran(in, spec, &eager)) return;
    RunSpec graph = spec;
    graph.captureGraph = true;
    Outputs replayed;
    if (!ran(in, graph, &replayed)) return;
    expectSameOutputs(eager, replayed, describe(in, graph));
  });
}

// anyrAddRmsNorm launches with programmatic dependent launch where the device's probe passed
// (which it must where this build's device code has the wait instruction): it must still wait
// for the kernel before it on the stream before it reads its inputs or writes its outputs. That
// kernel (ordertest::copyLate) lets the call's launch start at once and fills x and residualIn
// only 200 us later, so a call that read early would take the poison, and one that wrote early
// would show in that kernel's copies of normOut and residualOut. Shapes of each form of the
// kernel (Rows one block a row, Rows resident, Cluster) and each output, eager and replayed from
// a graph, against the same call without the late kernel bit for bit, and the reference.
TEST(FusedKernel, WaitsForTheKernelBeforeIt) {
  REQUIRE_GPU();
  inChild([&] {
    int arch = -1;
    CUDA_OK(codearch::deviceCodeArch(&arch));
    const DependentLaunch d = dependentLaunchOn(0, true);
    std::printf("device code %d, programmatic launch for anyrAddRmsNorm: %s (%s)\n", arch,
                d.works ? "on" : "off", d.reason.c_str());
    if (arch >= 900) {
      EXPECT_TRUE(d.works) << d.reason;
    }
    struct Case {
      anyrDataType_t dtype;
      int hidden, tokens, quant;
    };
    const Case cases[] = {
        {anyrBfloat16, 2880, 1, anyrQuantNone},    {anyrBfloat16, 6144, 1, anyrQuantNvfp4},
        {anyrFloat16, 8192, 32, anyrQuantFp8},     {anyrBfloat16, 4096, 512, anyrQuantNone},
        {anyrFloat16, 7168, 2048, anyrQuantNvfp4}, {anyrBfloat16, 16384, 3, anyrQuantNone}};
    uint64_t seed = 300;
    for (const Case& c : cases) {
      Inputs in = makeInputs(c.dtype, c.tokens, c.hidden, seed++);
      setWeights(&in, false, seed++);
      RunSpec spec = separateResidualSpec(in, c.quant);
      Outputs plain;
      if (!ran(in, spec, &plain)) return;
      for (bool graph : {false, true}) {
        RunSpec late = spec;
        late.lateInputsNs = 200000;
        late.captureGraph = graph;
        Outputs out;
        if (!ran(in, late, &out)) return;
        const std::string where = describe(in, late) + (graph ? " (graph)" : " (eager)");
        checkRun(in, late, out, where);
        expectSameOutputs(plain, out, where);
      }
    }
  });
}

// ---- crafted rows, bit-exact against the fp64 reference -----------------------------------
// Rows are c * sign_i with c a power of two, so mean(r^2) = c^2 and y = sign_i * w_i exactly
// (rsqrtf's error and epsilon are far below half an ulp of the dtype); the weights are the
// crafted y values. With g and the FP8 scale powers of two every later step is exact too, so
// scales and codes must equal the fp64 reference bit for bit.
std::vector<double> craftedWeights(int hidden, double g) {
  std::vector<double> w(hidden, 0.0);
  auto block = [&](int b, const std::vector<double>& units, double unit) {
    for (int i = 0; i < 16; ++i) w[16 * b + i] = units[i % units.size()] * unit;
  };
  // e2m1 grid points and ties (block scale 1: amax = 6 g).
  block(0, {6, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -0.25, -0.75, -5, 0, -0.0, 0.5, 4, -6}, g);
  block(1, {4000, -4000, 1, 0}, g);                       // s saturates at 448, codes at 6
  block(2, {6, 1, 3, -2}, std::ldexp(g, -8));             // s = 2^-8 (e4m3 subnormal)
  block(3, {1, -1, 0.5}, std::ldexp(g, -12));             // amax / (6 g) < 2^-10: s = 0
  block(4, {7, 7.25, 7.5, 6.75, -7, 1000, 6.625, 0}, 1);  // FP8 saturation at 448 (scale 1/64)
  block(5, {0, 0, 0, 0}, 1);                              // all zero
  for (int i = 96; i < hidden; ++i) w[i] = std::ldexp(1.0 + (i % 37) / 64.0, (i % 9) - 6);
  return w;
}

// Row `row` of an NVFP4 run against the reference's codes `q` (hidden / 2 bytes) and block
// scales `sc` (hidden / 16): every linear scale, swizzled scale and code byte, exactly.
void expectNvfp4RowExact(Checker& ck, const Outputs& out, int row, int hidden, const uint8_t* q,
                         const uint8_t* sc) {
  const int K = hidden / 16;
  for (int b = 0; b < K; ++b) {
    ck.expect(out.scales[row * K + b] == sc[b], [&] {
      std::ostringstream os;
      os << "scale[" << row << "][" << b << "] = 0x" << std::hex << int(out.scales[row * K + b])
         << ", expected 0x" << int(sc[b]);
      return os.str();
    });
    ck.expect(out.swz[swizzledScaleOffset(row, b, K)] == sc[b], [&] {
      return "swizzled scale [" + std::to_string(row) + "][" + std::to_string(b) + "]";
    });
  }
  for (int i = 0; i < hidden / 2; ++i) {
    ck.expect(out.quant[row * hidden / 2 + i] == q[i], [&] {
      std::ostringstream os;
      os << "nvfp4 byte [" << row << "][" << i << "] = 0x" << std::hex
         << int(out.quant[row * hidden / 2 + i]) << ", expected 0x" << int(q[i]);
      return os.str();
    });
  }
}

TEST(FusedKernel, CraftedRowsAreExact) {
  REQUIRE_GPU();
  inChild([&] {
    const int hidden = 256, K = hidden / 16;
    const double g = 1.0 / 16, fp8Scale = 1.0 / 64;
    const double cs[] = {1.0, 2.0, 0.5, 1024.0};
    for (anyrDataType_t t : {anyrBfloat16, anyrFloat16}) {
      const std::vector<double> wd = craftedWeights(hidden, g);
      // Rows: c * (+1), c * (alternating), then a zero row and a -0.0 row.
      std::vector<std::vector<double>> rows;
      for (double c : cs) {
        rows.push_back(std::vector<double>(hidden, c));
        std::vector<double> alt(hidden);
        for (int i = 0; i < hidden; ++i) alt[i] = (i % 3 == 1) ? -c : c;
        rows.push_back(alt);
      }
      rows.push_back(std::vector<double>(hidden, 0.0));
      rows.push_back(std::vector<double>(hidden, -0.0));
      Inputs in;
      in.dtype = t;
      in.hidden = hidden;
      in.tokens = static_cast<int>(rows.size());
      for (const auto& r : rows) {
        for (double v : r) in.x.push_back(ref::dtypeBits(v, t));
      }
      in.res.assign(in.x.size(), ref::dtypeBits(0.0, t));
      for (double v : wd) in.weight.push_back(ref::dtypeBits(v, t));
      for (int residual : {kNoResidual, kSeparate}) {
        for (int quant : {int(anyrQuantFp8), int(anyrQuantNvfp4)}) {
          RunSpec spec;
          spec.residual = residual;
          spec.quant = quant;
          spec.scale = static_cast<float>(quant == anyrQuantFp8 ? fp8Scale : g);
          upload(in, spec);
          Outputs out;
          if (!ran(in, spec, &out)) return;
          const std::string where = describe(in, spec);
          checkRun(in, spec, out, where);
          Checker ck(where + " (crafted, exact)");
          ref::RowSpec rs;
          rs.dtype = t;
          rs.hidden = hidden;
          rs.epsilon = spec.epsilon;
          ref::RowResult res;
          std::vector<double> w(hidden), zeros(hidden, 0.0);
          for (int i = 0; i < hidden; ++i) w[i] = ref::dtypeValue(in.weight[i], t);
          std::vector<uint8_t> q(hidden), sc(K);
          for (int row = 0; row < in.tokens; ++row) {
            std::vector<double> x(hidden);
            for (int i = 0; i < hidden; ++i) x[i] = ref::dtypeValue(in.x[row * hidden + i], t);
            ref::referenceRow(rs, x.data(), residual == kSeparate ? zeros.data() : nullptr,
                              w.data(), &res);
            for (int i = 0; i < hidden; ++i) {
              ck.expect(out.norm[row * hidden + i] == ref::dtypeBits(res.y[i], t), [&] {
                std::ostringstream os;
                os << "normOut[" << row << "][" << i << "] bits 0x" << std::hex
                   << out.norm[row * hidden + i] << ", expected 0x" << ref::dtypeBits(res.y[i], t);
                return os.str();
              });
            }
            if (quant == anyrQuantFp8) {
              ref::quantizeFp8Exact(res.y.data(), hidden, fp8Scale, q.data());
              for (int i = 0; i < hidden; ++i) {
                ck.expect(out.quant[row * hidden + i] == q[i], [&] {
                  return "fp8[" + std::to_string(row) + "][" + std::to_string(i) + "]";
                });
              }
            } else {
              ref::quantizeNvfp4Exact(res.y.data(), hidden, g, q.data(), sc.data());
              expectNvfp4RowExact(ck, out, row, hidden, q.data(), sc.data());
            }
          }
          // Spot checks of what the crafted blocks are for (row 0: c = 1, all positive).
          if (quant == anyrQuantNvfp4) {
            EXPECT_EQ(out.scales[0], 0x38) << where;  // block 0: s = 1.0
            EXPECT_EQ(out.scales[1], 0x7e) << where;  // block 1: saturated
            EXPECT_EQ(out.scales[2], 0x02) << where;  // block 2: 2^-8
            EXPECT_EQ(out.scales[3], 0x00) << where;  // block 3: underflow to 0
            EXPECT_EQ(out.scales[5], 0x00) << where;  // block 5: zeros
            EXPECT_EQ(out.quant[0], 0x07) << where;   // 6 -> 7, 0.25 -> 0 (tie to even)
            EXPECT_EQ(out.quant[1], 0x22) << where;   // 0.75 -> 1.0, 1.25 -> 1.0
            EXPECT_EQ(out.quant[2], 0x44) << where;   // 1.75 -> 2, 2.5 -> 2
            EXPECT_EQ(out.quant[3], 0x66) << where;   // 3.5 -> 4, 5 -> 4
            EXPECT_EQ(out.quant[5], 0x0e) << where;   // -5 -> -4 (tie to even), 0 -> +0
            EXPECT_EQ(out.quant[6], 0x18) << where;   // -0.0 -> -0 (sign kept), 0.5
            EXPECT_EQ(out.quant[8], 0xf7) << where;   // saturated +-6
            EXPECT_EQ(out.quant[24], 0x00) << where;  // block 3: s = 0 -> all +0
          } else {
            EXPECT_EQ(out.quant[64], 0x7e) << where;  // 7 / (1/64) = 448
            EXPECT_EQ(out.quant[65], 0x7e) << where;  // 464: tie -> 448
            EXPECT_EQ(out.quant[66], 0x7e) << where;  // 480 saturates
            EXPECT_EQ(out.quant[67], 0x7e) << where;  // 432: tie -> 448 (even)
            EXPECT_EQ(out.quant[68], 0xfe) << where;  // -448
            EXPECT_EQ(out.quant[69], 0x7e) << where;  // 64000 saturates
            EXPECT_EQ(out.quant[70], 0x7d) << where;  // 424 -> 416
          }
          const int zeroRow = in.tokens - 2, negZeroRow = in.tokens - 1;
          for (int i = 0; i < hidden; ++i) {
            EXPECT_EQ(out.norm[zeroRow * hidden + i] & 0x7fff, 0) << where;
            EXPECT_EQ(out.norm[negZeroRow * hidden + i] & 0x7fff, 0) << where;
          }
        }
      }
    }
  });
}

// A NaN weight makes one element of y NaN while its NVFP4 block has a finite maximum: the
// warp holding it takes the encoder that tests every element (NaN -> code 0x7, the maximum
// ignoring NaN), the other warps the one without the test. Every code and scale of every row
// is compared with the reference exactly, NaN block or not; normOut too (NaN where y is).
TEST(FusedKernel, NanInOneNvfp4BlockIsEncodedExactly) {
  REQUIRE_GPU();
  inChild([&] {
    const int hidden = 1024, K = hidden / 16;
    const int nanAt = 16 * 32 + 9;  // block 32, odd element: the odd lane of a pair, warp 2
    const double g = 1.0 / 16;
    for (anyrDataType_t t : {anyrBfloat16, anyrFloat16}) {
      Inputs in;
      in.dtype = t;
      in.hidden = hidden;
      const double cs[] = {1.0, -2.0, 0.5};
      for (double c : cs) {
        for (int i = 0; i < hidden; ++i) in.x.push_back(ref::dtypeBits(c, t));
        for (int i = 0; i < hidden; ++i) in.x.push_back(ref::dtypeBits(i % 3 == 1 ? -c : c, t));
      }
      in.tokens = static_cast<int>(in.x.size()) / hidden;
      in.res.assign(in.x.size(), ref::dtypeBits(0.0, t));
      for (int i = 0; i < hidden; ++i) {
        in.weight.push_back(ref::dtypeBits(std::ldexp(1.0 + (i % 37) / 64.0, (i % 9) - 6), t));
      }
      in.weight[nanAt] = ref::dtypeBits(std::nan(""), t);
      RunSpec spec;
      spec.residual = kSeparate;
      spec.quant = anyrQuantNvfp4;
      spec.scale = static_cast<float>(g);
      upload(in, spec);
      Outputs out;
      if (!ran(in, spec, &out)) return;
      Checker ck(describe(in, spec) + " (NaN weight)");
      ref::RowSpec rs;
      rs.dtype = t;
      rs.hidden = hidden;
      rs.epsilon = spec.epsilon;
      ref::RowResult res;
      std::vector<double> w(hidden), zeros(hidden, 0.0), x(hidden);
      for (int i = 0; i < hidden; ++i) w[i] = ref::dtypeValue(in.weight[i], t);
      std::vector<uint8_t> q(hidden / 2), sc(K);
      for (int row = 0; row < in.tokens; ++row) {
        for (int i = 0; i < hidden; ++i) x[i] = ref::dtypeValue(in.x[row * hidden + i], t);
        ref::referenceRow(rs, x.data(), zeros.data(), w.data(), &res);
        ASSERT_TRUE(std::isnan(res.y[nanAt]));
        for (int i = 0; i < hidden; ++i) {
          const uint16_t got = out.norm[row * hidden + i];
          const bool ok =
              i == nanAt ? std::isnan(ref::dtypeValue(got, t)) : got == ref::dtypeBits(res.y[i], t);
          ck.expect(ok, [&] {
            std::ostringstream os;
            os << "normOut[" << row << "][" << i << "] bits 0x" << std::hex << got;
            return os.str();
          });
        }
        ref::quantizeNvfp4Exact(res.y.data(), hidden, g, q.data(), sc.data());
        expectNvfp4RowExact(ck, out, row, hidden, q.data(), sc.data());
        // The NaN element's code: +6 whatever the row's sign; its partner keeps its own.
        EXPECT_EQ(out.quant[row * hidden / 2 + nanAt / 2] >> 4, 0x7) << "row " << row;
        EXPECT_NE(out.scales[row * K + nanAt / 16], 0) << "row " << row;
      }
    }
  });
}

// NVFP4 block scales d = s * g take the branch-free reciprocal for g within [2^-100, 2^100]
// (RowOutputs::fastReciprocal) and __frcp_rn outside: both edges of that range, g = 1, and g
// outside it (2^101, 2^-110), with weights near 2^e (e = log2 g + 4, so amax / (6 g) stays in
// e4m3's normal range and the codes and scales are not all 0 or saturated). bf16 (fp16 cannot
// hold those weights). Exact against the reference, and the scales must vary.
TEST(FusedKernel, Nvfp4AtAndOutsideTheFastReciprocalRangeIsExact) {
  REQUIRE_GPU();
  inChild([&] {
    const anyrDataType_t t = anyrBfloat16;
    const int hidden = 1024, K = hidden / 16;
    for (const int ge : {-110, -100, 0, 100, 101}) {
      const int e = ge + 4;
      const double g = std::ldexp(1.0, ge);
      Inputs in = makeInputs(t, 3, hidden, 515 + e);
      in.weight.resize(hidden);
      for (int i = 0; i < hidden; ++i) {
        in.weight[i] = ref::dtypeBits(std::ldexp(1.0 + (i % 37) / 64.0, e + (i % 5) - 2), t);
      }
      RunSpec spec;
      spec.residual = kSeparate;
      spec.quant = anyrQuantNvfp4;
      spec.scale = static_cast<float>(g);
      spec.linearScales = spec.swizzledScales = true;
      upload(in, spec);
      Outputs out;
      if (!ran(in, spec, &out)) return;
      const std::string where = describe(in, spec) + " g=2^" + std::to_string(std::ilogb(g));
      checkRun(in, spec, out, where);
      int distinct = 0;
      for (int b = 0; b < K; ++b) distinct += out.scales[b] != out.scales[0];
      EXPECT_GT(distinct, 0) << where << ": every block scale is 0x" << std::hex
                             << int(out.scales[0]);
      EXPECT_NE(out.scales[0], 0) << where;
      EXPECT_NE(out.scales[0], 0x7E) << where;
    }
  });
}

// dev::reciprocalNormal equals __frcp_rn on every float from 2^-120 to 2^120, the range the
// NVFP4 encoder uses it on; the comparison does find the denormals it flushes.
TEST(FusedKernel, BranchFreeReciprocalIsIeeeOverItsRange) {
  REQUIRE_GPU();
  inChild([&] {
    unsigned long long bad = 0;
    uint32_t first = 0;
    ASSERT_EQ(enctest::reciprocalMismatches(0x03800000u, 0x7B800000u, &bad, &first), cudaSuccess);
    EXPECT_EQ(bad, 0u) << "first mismatch at bits 0x" << std::hex << first;
    ASSERT_EQ(enctest::reciprocalMismatches(0x00000001u, 0x00000100u, &bad, &first), cudaSuccess);
    EXPECT_EQ(bad, 256u) << "denormals are flushed, so every one should differ";
    EXPECT_EQ(first, 1u);
  });
}

// The NVFP4 epilogue's floating-point encoder (e2m1MagnitudeF, e2m1Pack8) equals the integer
// one (e2m1CodeNotNaN, itself checked against cuda_fp4.h by the CPU tests) on every float that
// is not NaN, on the GPU's own fma.rn.sat.
TEST(FusedKernel, FloatingPointE2m1EncoderMatchesOnEveryFloat) {
  REQUIRE_GPU();
  inChild([&] {
    unsigned long long bad = 0;
    uint32_t first = 0;
    ASSERT_EQ(enctest::e2m1Mismatches(&bad, &first), cudaSuccess);
    EXPECT_EQ(bad, 0u) << "first mismatch at bits 0x" << std::hex << first;
  });
}

// The residual add's packed form (dev::addPair: one add per pair of 16-bit values, the sum
// rounded once) gives the bits of the sum taken in fp32 and rounded to the type, for every pair
// of bf16 and of fp16 patterns, subnormals, signed zeros, infinities and NaNs included, on this
// GPU's own add instruction.
TEST(FusedKernel, PackedResidualAddMatchesTheFp32SumOnEveryPair) {
  REQUIRE_GPU();
  inChild([&] {
    for (const bool bf16 : {true, false}) {
      unsigned long long bad = 0;
      uint32_t first = 0;
      ASSERT_EQ(enctest::packedAddMismatches(bf16, &bad, &first), cudaSuccess);
      EXPECT_EQ(bad, 0u) << (bf16 ? "bf16" : "fp16") << ": first mismatch at a << 16 | b = 0x"
                         << std::hex << first;
    }
  });
}

// Invalid arguments come back as anyrInvalidArgument without a launch.
TEST(FusedKernel, RejectsInvalidArguments) {
  REQUIRE_GPU();
  inChild([&] {
    Pool& p = pool();
    ASSERT_TRUE(p.ok);
    anyrFusedOptions_t o = ANYR_FUSED_OPTIONS_INITIALIZER;
    o.quant = anyrQuantNvfp4;
    o.scale = p.scale;
    o.quantOut = p.quant;
    EXPECT_EQ(anyrAddRmsNorm(p.x, nullptr, nullptr, p.weight, 1e-6f, p.norm, 4, 4096, anyrBfloat16,
                             &o, nullptr),
              anyrInvalidArgument);  // NVFP4 without block scales
    EXPECT_EQ(anyrAddRmsNorm(p.x, nullptr, nullptr, p.weight, 1e-6f, p.norm, 4, 4104, anyrFloat16,
                             nullptr, nullptr),
              anyrSuccess);  // multiple of 8 is enough without NVFP4
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  });
}

}  // namespace
}  // namespace anyr
