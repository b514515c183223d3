// Multi-process GPU tests of anyrAllReduceAddRmsNorm on every path (forced algorithm) x dtype
// x hidden x tokens x residual pattern x quantization. For every case:
//  - every output is compared bit for bit with the unfused composition on the same rank
//    (anyrAllReduce into a buffer, then anyrAddRmsNorm on it), which the standalone-kernel
//    tests check against the fp64 reference;
//  - for small cases, normOut and residualOut are also checked against the fp64 reference
//    (tests/common/fused_reference) within the dtype's rounding;
//  - every rank reports a hash of all its outputs and the parent checks they agree;
//  - without quantization, the call is repeated with normOut over (a copy of) partial.
// Outputs are poisoned before every call; inputs are fresh small integers per case.
// One test shifts rank 0's row buffers by one element, so ranks hold differently aligned
// pointers: every rank must still take the same path (fused kernel or composition), or their
// launches would not match. A forced algorithm with a fused kernel must run it (the counters
// say so), and partial must come back untouched.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "anyreduce/anyreduce.h"
#include "common/data.h"
#include "common/fused_reference.h"
#include "common/launcher.h"
#include "gpu/code_arch.h"
#include "gpu/gpu_test_util.h"

namespace anyr {
namespace {

// Host copies of a device buffer.
std::vector<unsigned char> toHost(const void* d, size_t bytes, cudaStream_t s) {
  std::vector<unsigned char> h(bytes);
  if (bytes) {
    R_CUDA(cudaMemcpyAsync(h.data(), d, bytes, cudaMemcpyDeviceToHost, s));
    R_CUDA(cudaStreamSynchronize(s));
  }
  return h;
}

double toDouble(const unsigned char* p, anyrDataType_t t) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return ref::dtypeValue(bits, t);
}

struct Buffers {
  void* partial = nullptr;
  void* residual = nullptr;  // residualIn (and in-place residualOut)
  void* residualOut = nullptr;
  void* weight = nullptr;
  void* norm = nullptr;
  void* quant = nullptr;
  void* scales = nullptr;
  void* swizzled = nullptr;
  float* scale = nullptr;
  unsigned long long* counters = nullptr;
  // unfused reference outputs
  void* x = nullptr;
  void* rNorm = nullptr;
  void* rResidual = nullptr;
  void* rQuant = nullptr;
  void* rScales = nullptr;
  void* rSwizzled = nullptr;
  void* inPlace = nullptr;  // partial copied, then normOut written over it
};

// The algorithms a run forces, in order (anyrAlgoAuto: the communicator's own choice).
using Algos = std::vector<anyrAlgo_t>;
// The push algorithms' fused kernels, NCCL's composition, the automatic choice and the
// islands' composition (where islands are admitted: in the topology or forced by ANYR_ISLANDS;
// a SKIP note elsewhere).
const Algos kPushAndAuto = {anyrAlgoOneShotPush, anyrAlgoTwoShotPush, anyrAlgoNccl, anyrAlgoAuto,
                            anyrAlgoIslands};
// Those, the pull algorithms' fused kernels and the host algorithms' compositions.
const Algos kEveryAlgo = {anyrAlgoOneShotPush, anyrAlgoTwoShotPush, anyrAlgoNccl,
                          anyrAlgoAuto,        anyrAlgoIslands,     anyrAlgoOneShotPull,
                          anyrAlgoTwoShot,     anyrAlgoHostOneShot, anyrAlgoHostTwoShot,
                          anyrAlgoHostCopy};
// The fused kernels of the one-shot pull and the two-shot (pull).
const Algos kPullKernels = {anyrAlgoOneShotPull, anyrAlgoTwoShot};
// The fused kernel of the doubling push.
const Algos kDoublingKernel = {anyrAlgoDoublingPush};

// Whether anyrCommSetAlgorithm(algo) makes the fused operations run a fused kernel.
bool hasFusedKernel(anyrAlgo_t algo) {
  return algo == anyrAlgoOneShotPush || algo == anyrAlgoTwoShotPush ||
         algo == anyrAlgoOneShotPull || algo == anyrAlgoTwoShot || algo == anyrAlgoDoublingPush ||
         algo == anyrAlgoIslands;
}

unsigned long long fusedKernelCalls(anyrComm_t comm) {
  anyrCounters_t c;
  std::memset(&c, 0, sizeof(c));
  c.size = sizeof(c);
  c.magic = ANYR_COUNTERS_MAGIC;
  R_ANYR(anyrCommGetCounters(comm, &c), comm);
  return c.fusedKernelCalls;
}

// partialMode: data::kSmallInts (sums exact in every dtype) or data::kRandom (fractions: the
// sums round, once, in rank order).
int fusedRank(int rank, int n, const anyrUniqueId& id, const Report& report,
              const std::vector<size_t>& hiddens, const std::vector<size_t>& tokensList,
              const Algos& algos, size_t rank0Shift = 0, int pdlEnv = -1, int clusterEnv = -1,
              int earlyEnv = -1, int partialMode = data::kSmallInts) {
  // ANYR_PDL, ANYR_PDL_EARLY and ANYR_FUSED_CLUSTER for this rank's process only (ranks are
  // forked); -1 leaves the default (programmatic launch on with the early release, automatic
  // cluster size).
  if (pdlEnv >= 0) setenv("ANYR_PDL", std::to_string(pdlEnv).c_str(), 1);
  if (earlyEnv >= 0) setenv("ANYR_PDL_EARLY", std::to_string(earlyEnv).c_str(), 1);
  if (clusterEnv >= 0) setenv("ANYR_FUSED_CLUSTER", std::to_string(clusterEnv).c_str(), 1);
  anyrComm_t comm = initRankComm(rank, n, id, 20000);
  {
    // ANYR_PDL=0 skips the probe; otherwise the communicator probes programmatic launch (and
    // uses it where it works).
    const nlohmann::json pl = explainJson(comm).at("programmaticLaunch");
    report("INFO programmatic launch: " + pl.dump() + "\n");
    const bool probed = pl.at("reason").get<std::string>().find("not probed") == std::string::npos;
    if (probed != (pdlEnv != 0) || (!probed && pl.at("enabled").get<bool>())) {
      report("FAIL ANYR_PDL=" + std::to_string(pdlEnv) + " (-1: unset) gave " + pl.dump() + "\n");
      return 4;
    }
    // The early release follows its variable, and only with programmatic launch.
    const bool early = pl.at("enabled").get<bool>() && earlyEnv != 0;
    if (pl.at("earlyRelease").get<bool>() != early) {
      report("FAIL ANYR_PDL_EARLY=" + std::to_string(earlyEnv) + " (-1: unset) gave " + pl.dump() +
             "\n");
      return 4;
    }
    // The fused kernels passed the startup self-test (a failed one would leave every fused
    // call below to the composition, and the comparisons would prove nothing about them).
    // (Not run: the algorithm is not admitted here, and the calls below skip it.)
    const nlohmann::json st = explainJson(comm).at("selfTest").at("results");
    for (const char* k :
         {"fused-oneshot-push", "fused-twoshot-push", "fused-oneshot-pull", "fused-twoshot"}) {
      const std::string got = st.value(k, std::string());
      if (got != "passed" && got.rfind("not run", 0) != 0) {
        report(std::string("FAIL self-test ") + k + ": " + st.dump() + "\n");
        return 4;
      }
    }
    // Clusters: not probed when turned off; where the GPU has them, the probe must pass (the
    // forced sizes below then really run the cluster kernel).
    const nlohmann::json cl = explainJson(comm).at("fusedClusters");
    report("INFO fused clusters: " + cl.dump() + "\n");
    int device = 0, hasClusters = 0, codeArch = 0;
    R_CUDA(cudaGetDevice(&device));
    R_CUDA(cudaDeviceGetAttribute(&hasClusters, cudaDevAttrClusterLaunch, device));
    // Device code built for a target without cluster instructions (PTX of compute capability
    // 7.5 or 8.0 run on this GPU by JIT compilation) cannot pass the probe: its cluster
    // operations compile to nothing (device/common.cuh).
    R_CUDA(codearch::deviceCodeArch(&codeArch));
    if (codeArch < 900) hasClusters = 0;
    const bool enabled = cl.at("enabled").get<bool>();
    if (cl.at("setting").get<int>() != std::max(clusterEnv, 0) ||
        (clusterEnv == 1 ? enabled : enabled != (hasClusters != 0))) {
      report("FAIL ANYR_FUSED_CLUSTER=" + std::to_string(clusterEnv) + " (-1: unset) gave " +
             cl.dump() + " on a GPU with cluster launch " + std::to_string(hasClusters) + "\n");
      return 4;
    }
    // The NVFP4 encoder: the conversion instruction only where the GPU can have it (compute
    // capability 10.0 to 12.x); explain says which, in both forms.
    const nlohmann::json enc = explainJson(comm).at("nvfp4Encoding");
    report("INFO NVFP4 encoding: " + enc.dump() + "\n");
    int major = 0;
    R_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    if (enc.at("instruction").get<bool>() && (major < 10 || major > 12 || codeArch < 1000)) {
      report("FAIL NVFP4 encoding by instruction on compute capability " + std::to_string(major) +
             ".x, device code " + std::to_string(codeArch) + ": " + enc.dump() + "\n");
      return 4;
    }
    const std::string encSaid =
        std::string("NVFP4 output encoded ") +
        (enc.at("instruction").get<bool>() ? "by instruction" : "in software");
    if (explainText(comm).find(encSaid) == std::string::npos) {
      report("FAIL anyrCommExplain's text lacks '" + encSaid + "'\n");
      return 4;
    }
    // The text form says it too.
    const std::string said =
        std::string("fused kernels in thread-block clusters: ") + (enabled ? "on" : "off");
    if (explainText(comm).find(said) == std::string::npos) {
      report("FAIL anyrCommExplain's text lacks '" + said + "'\n");
      return 4;
    }
    // The automatic rule at 96 rows of 6144 (explain's sample: the one-shot, bf16, unquantized):
    // the largest cluster size whose blocks fit one per SM; on fewer than 192 SMs clusters of two
    // (blocks of 384 threads) where explain admits two such blocks of that variant per SM for
    // 192 blocks or more, else a block per row.
    if (enabled && clusterEnv <= 0) {
      const nlohmann::json b = explainJson(comm).at("blocks");
      const long sm = b.at("fusedAndHost").get<long>();
      const bool pairs =
          b.at("fusedClusterPairThreads").at("oneshot-push").at("bf16").at("none").get<long>() >=
              384 &&
          b.at("fusedClusterPairs").get<long>() >= 192;
      int want = pairs ? 2 : 1;
      for (int c : {2, 4, 8}) {
        if (96 * c <= sm) want = c;  // the largest size at one block per SM comes first
      }
      if (cl.at("sizeByRows").at("96").get<int>() != want) {
        report("FAIL cluster size at 96 rows " + cl.dump() + ", expected " + std::to_string(want) +
               " with blocks " + b.dump() + "\n");
        return 4;
      }
    }
  }
  cudaStream_t s = nonBlockingStream();
  size_t maxElems = 0, maxHidden = 0, maxTokens = 0;
  for (size_t h : hiddens) maxHidden = std::max(maxHidden, h);
  for (size_t t : tokensList) maxTokens = std::max(maxTokens, t);
  maxElems = maxHidden * maxTokens;
  const size_t maxBytes = maxElems * 2;
  const size_t swzBytes = static_cast<size_t>(
      ref::swizzleBytes(static_cast<int64_t>(maxTokens), static_cast<int64_t>(maxHidden / 16)));
  Buffers b;
  for (void** p : {&b.partial, &b.residual, &b.residualOut, &b.norm, &b.quant, &b.x, &b.rNorm,
                   &b.rResidual, &b.rQuant, &b.inPlace}) {
    R_CUDA(cudaMalloc(p, maxBytes + 16));
  }
  R_CUDA(cudaMalloc(&b.weight, maxHidden * 2 + 16));
  if (rank == 0 && rank0Shift != 0) {
    for (void** p : {&b.partial, &b.residual, &b.residualOut, &b.norm, &b.quant, &b.weight}) {
      *p = static_cast<char*>(*p) + rank0Shift;
    }
  }
  R_CUDA(cudaMalloc(&b.scales, maxElems / 16 + 16));
  R_CUDA(cudaMalloc(&b.rScales, maxElems / 16 + 16));
  R_CUDA(cudaMalloc(&b.swizzled, swzBytes));
  R_CUDA(cudaMalloc(&b.rSwizzled, swzBytes));
  R_CUDA(cudaMalloc(&b.scale, sizeof(float)));
  R_CUDA(cudaMalloc(&b.counters, 2 * sizeof(unsigned long long)));

  int failures = 0;
  size_t checked = 0;
  uint32_t seed = 77;
  for (anyrAlgo_t algo : algos) {
    if (!forceOrSkip(comm, algo, report)) continue;
    for (anyrDataType_t dt : {anyrBfloat16, anyrFloat16}) {
      for (size_t hidden : hiddens) {
        for (size_t tokens : tokensList) {
          for (int resMode = 0; resMode < 3; ++resMode) {  // 0 none, 1 separate, 2 in place
            for (int quant = 0; quant < 3; ++quant) {
              ++seed;
              const size_t elems = tokens * hidden;
              const size_t bytes = elems * 2;
              const int wp1 = (seed % 2) ? 1 : 0;
              // Inputs: partial differs per rank; residual and weight are the same on every
              // rank (a TP layer's replicated tensors).
              R_CUDA(data::fillInput(dt, b.partial, elems, rank, seed, partialMode, s));
              R_CUDA(data::fillInput(dt, b.residual, elems, 100, seed, data::kSmallInts, s));
              R_CUDA(data::fillInput(dt, b.weight, hidden, 101, seed, data::kRandom, s));
              const float scaleValue = quant == 1 ? 0.25f : 0.02f;
              R_CUDA(
                  cudaMemcpyAsync(b.scale, &scaleValue, sizeof(float), cudaMemcpyHostToDevice, s));
              // Reference (unfused) first, on its own buffers; in-place mode works on a copy.
              void* resIn = resMode ? b.residual : nullptr;
              void* rResOut = resMode ? b.rResidual : nullptr;
              if (resMode == 2)
                R_CUDA(
                    cudaMemcpyAsync(b.rResidual, b.residual, bytes, cudaMemcpyDeviceToDevice, s));
              anyrFusedOptions_t ro = ANYR_FUSED_OPTIONS_INITIALIZER;
              ro.weightPlusOne = wp1;
              ro.quant = quant;
              ro.scale = quant ? b.scale : nullptr;
              ro.quantOut = quant ? b.rQuant : nullptr;
              ro.blockScales = quant == 2 ? b.rScales : nullptr;
              ro.blockScalesSwizzled = quant == 2 ? b.rSwizzled : nullptr;
              const size_t qBytes = quant == 2 ? elems / 2 : elems;
              const size_t sBytes = elems / 16;
              const size_t swz = static_cast<size_t>(ref::swizzleBytes(
                  static_cast<int64_t>(tokens), static_cast<int64_t>(hidden / 16)));
              for (auto [p, nb] : {std::pair<void*, size_t>{b.rNorm, bytes},
                                   {b.norm, bytes},
                                   {b.rQuant, qBytes},
                                   {b.quant, qBytes},
                                   {b.rScales, sBytes},
                                   {b.scales, sBytes},
                                   {b.rSwizzled, swz},
                                   {b.swizzled, swz}}) {
                R_CUDA(cudaMemsetAsync(p, 0x7b, nb, s));
              }
              R_CUDA(cudaMemsetAsync(b.residualOut, 0x7b, bytes, s));
              R_ANYR(anyrAllReduce(b.partial, b.x, elems, dt, anyrSum, comm, s), comm);
              R_ANYR(anyrAddRmsNorm(b.x, resMode == 2 ? b.rResidual : resIn, rResOut, b.weight,
                                    1e-5f, b.rNorm, tokens, hidden, dt, &ro, s),
                     comm);
              // Fused.
              void* fResIn = resMode == 2 ? b.residualOut : resIn;
              if (resMode == 2)
                R_CUDA(
                    cudaMemcpyAsync(b.residualOut, b.residual, bytes, cudaMemcpyDeviceToDevice, s));
              anyrFusedOptions_t fo = ro;
              fo.quantOut = quant ? b.quant : nullptr;
              fo.blockScales = quant == 2 ? b.scales : nullptr;
              fo.blockScalesSwizzled = quant == 2 ? b.swizzled : nullptr;
              const unsigned long long kernelCalls = fusedKernelCalls(comm);
              R_ANYR(anyrAllReduceAddRmsNorm(b.partial, fResIn, resMode ? b.residualOut : nullptr,
                                             b.weight, 1e-5f, b.norm, tokens, hidden, dt, &fo, comm,
                                             s),
                     comm);
              std::ostringstream key;
              key << anyrAlgoName(algo) << "/" << data::dtypeName(dt) << "/h" << hidden << "/t"
                  << tokens << "/res" << resMode << "/q" << quant << "/m" << partialMode;
              // A forced algorithm with a fused kernel ran it (not the composition), and the
              // call left partial as it was.
              if (hasFusedKernel(algo) && fusedKernelCalls(comm) != kernelCalls + 1) {
                ++failures;
                report("FAIL " + key.str() + ": the fused kernel did not run\n");
              }
              {
                R_CUDA(cudaMemsetAsync(b.counters, 0, sizeof(unsigned long long), s));
                R_CUDA(data::countInputChanges(dt, b.partial, elems, rank, seed, partialMode,
                                               b.counters, s));
                unsigned long long changed = 0;
                R_CUDA(cudaMemcpyAsync(&changed, b.counters, sizeof(changed),
                                       cudaMemcpyDeviceToHost, s));
                R_CUDA(cudaStreamSynchronize(s));
                if (changed != 0) {
                  ++failures;
                  report("FAIL " + key.str() + ": partial changed in " + std::to_string(changed) +
                         " elements\n");
                }
              }
              // Compared on the device: bytes that differ, and a hash for the cross-rank check.
              auto compare = [&](const void* fused, const void* unfused, size_t nbytes,
                                 const char* what) {
                R_CUDA(cudaMemsetAsync(b.counters, 0, 2 * sizeof(unsigned long long), s));
                R_CUDA(data::countDiffBytes(fused, unfused, nbytes, b.counters, s));
                R_CUDA(data::hashBytes(fused, nbytes, b.counters + 1, s));
                unsigned long long c[2] = {0, 0};
                R_CUDA(cudaMemcpyAsync(c, b.counters, sizeof(c), cudaMemcpyDeviceToHost, s));
                R_CUDA(cudaStreamSynchronize(s));
                if (c[0] != 0) {
                  ++failures;
                  report("FAIL " + key.str() + ": " + what +
                         " differs from the unfused result in " + std::to_string(c[0]) +
                         " bytes\n");
                }
                report("HASH " + key.str() + "/" + what + " 0 " + std::to_string(c[1]) + "\n");
                ++checked;
              };
              compare(b.norm, b.rNorm, bytes, "norm");
              if (resMode) compare(b.residualOut, b.rResidual, bytes, "residual");
              if (quant) compare(b.quant, b.rQuant, qBytes, "quant");
              if (quant == 2) {
                compare(b.scales, b.rScales, sBytes, "scales");
                compare(b.swizzled, b.rSwizzled, swz, "swizzled");
              }
              // The quantized output alone (normOut NULL, as a layer whose next GEMM reads FP8
              // or NVFP4 runs it): the same quantized bytes and scales. On rank 0 only: the
              // others still pass normOut, and every rank must cut the call into the same
              // launches (wide rows take several of the composition's chunks).
              if (quant && resMode == 1) {
                R_CUDA(cudaMemsetAsync(b.quant, 0x7b, qBytes, s));
                if (quant == 2) {
                  R_CUDA(cudaMemsetAsync(b.scales, 0x7b, sBytes, s));
                  R_CUDA(cudaMemsetAsync(b.swizzled, 0x7b, swz, s));
                }
                R_ANYR(anyrAllReduceAddRmsNorm(b.partial, fResIn, b.residualOut, b.weight, 1e-5f,
                                               rank == 0 ? nullptr : b.norm, tokens, hidden, dt,
                                               &fo, comm, s),
                       comm);
                compare(b.quant, b.rQuant, qBytes, "quant-only");
                if (quant == 2) {
                  compare(b.scales, b.rScales, sBytes, "quant-only-scales");
                  compare(b.swizzled, b.rSwizzled, swz, "quant-only-swizzled");
                }
              }
              // One call with b.inPlace first loaded from `from`, and `poisoned` (when set)
              // filled with 0x7b first, so that an output the call leaves unwritten shows.
              auto aliasedCall = [&](const void* from, void* poisoned, const void* partial,
                                     const void* residualIn, void* residualOut, void* normOut) {
                R_CUDA(cudaMemcpyAsync(b.inPlace, from, bytes, cudaMemcpyDeviceToDevice, s));
                if (poisoned) R_CUDA(cudaMemsetAsync(poisoned, 0x7b, bytes, s));
                R_ANYR(anyrAllReduceAddRmsNorm(partial, residualIn, residualOut, b.weight, 1e-5f,
                                               normOut, tokens, hidden, dt, &fo, comm, s),
                       comm);
              };
              // normOut over partial (allowed: they may be the same buffer), when the residual
              // is not updated in place (a second call would start from the updated one).
              if (quant == 0 && resMode != 2) {
                aliasedCall(b.partial, nullptr, b.inPlace, fResIn,
                            resMode ? b.residualOut : nullptr, b.inPlace);
                compare(b.inPlace, b.rNorm, bytes, "norm-over-partial");
              }
              // residualOut over partial, and normOut over residualIn (both allowed: the same
              // buffer or disjoint), with a separate residual.
              if (quant == 0 && resMode == 1) {
                aliasedCall(b.partial, b.norm, b.inPlace, b.residual, b.inPlace, b.norm);
                compare(b.inPlace, b.rResidual, bytes, "residual-over-partial");
                compare(b.norm, b.rNorm, bytes, "norm-beside-residual-over-partial");
                aliasedCall(b.residual, b.residualOut, b.partial, b.inPlace, b.residualOut,
                            b.inPlace);
                compare(b.inPlace, b.rNorm, bytes, "norm-over-residual");
                compare(b.residualOut, b.rResidual, bytes, "residual-beside-norm-over-residual");
              }
              // fp64 reference on a few rows of small cases, on every algorithm (the checks
              // above compare with the library's own composition; this one is independent):
              // normOut within 2 ulp of the exact value, residualOut exact.
              if (tokens <= 64) {
                auto norm = toHost(b.norm, bytes, s);
                auto residOut = toHost(b.residualOut, bytes, s);
                auto weightH = toHost(b.weight, hidden * 2, s);
                auto residH = toHost(b.residual, bytes, s);
                std::vector<unsigned char> expectX =
                    data::hostExpected(dt, elems, n, seed, partialMode);
                ref::RowSpec spec;
                spec.dtype = dt;
                spec.hidden = hidden;
                spec.epsilon = 1e-5;
                spec.weightPlusOne = wp1 != 0;
                for (size_t row = 0; row < tokens; row += std::max<size_t>(1, tokens / 3)) {
                  std::vector<double> x(hidden), res(hidden), w(hidden);
                  for (size_t i = 0; i < hidden; ++i) {
                    x[i] = toDouble(&expectX[(row * hidden + i) * 2], dt);
                    res[i] = toDouble(&residH[(row * hidden + i) * 2], dt);
                    w[i] = toDouble(&weightH[i * 2], dt);
                  }
                  ref::RowResult rr;
                  ref::referenceRow(spec, x.data(), resMode ? res.data() : nullptr, w.data(), &rr);
                  for (size_t i = 0; i < hidden; ++i) {
                    double got = toDouble(&norm[(row * hidden + i) * 2], dt);
                    double tol = 2 * ref::dtypeUlp(rr.yExact[i], dt);
                    if (!(std::fabs(got - rr.yExact[i]) <= tol)) {
                      ++failures;
                      report("FAIL " + key.str() + ": normOut[" + std::to_string(row) + "][" +
                             std::to_string(i) + "] = " + std::to_string(got) +
                             ", fp64 reference " + std::to_string(rr.yExact[i]) + "\n");
                      break;
                    }
                  }
                  for (size_t i = 0; resMode && i < hidden; ++i) {
                    const double got = toDouble(&residOut[(row * hidden + i) * 2], dt);
                    if (got != rr.r[i]) {
                      ++failures;
                      report("FAIL " + key.str() + ": residualOut[" + std::to_string(row) + "][" +
                             std::to_string(i) + "] = " + std::to_string(got) + ", expected " +
                             std::to_string(rr.r[i]) + "\n");
                      break;
                    }
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  failures += asyncErrorFailures(comm, report);
  report("CHECKED " + std::to_string(checked) + "\n");
  return releaseRank(comm, nullptr, {}, failures);
}

// Runs fusedRank on `n` ranks and requires every rank to pass with bit-identical outputs;
// returns the results (for a subject check).
std::vector<launch::RankResult> runFused(int n, const std::vector<size_t>& hiddens,
                                         const std::vector<size_t>& tokens, const Algos& algos,
                                         size_t rank0Shift, int pdlEnv, double timeoutSec,
                                         int clusterEnv = -1, int earlyEnv = -1,
                                         int partialMode = data::kSmallInts) {
  auto results = launch::runRanks(
      n,
      [&](int rank, int nr, const anyrUniqueId& id, const Report& report) {
        try {
          return fusedRank(rank, nr, id, report, hiddens, tokens, algos, rank0Shift, pdlEnv,
                           clusterEnv, earlyEnv, partialMode);
        } catch (const std::exception& e) {
          report(std::string("FAIL ") + e.what() + "\n");
          return 3;
        }
      },
      timeoutSec);
  expectRanksPassedWithEqualHashes(results, n);
  return results;
}

TEST(FusedAllReduceGpu, EveryPathDtypeHiddenTokensPatternQuant) {
  REQUIRE_GPU();
  if (gpuCount() < 2) GTEST_SKIP() << "needs 2 GPUs";
  runFused(gpuCount(), {128, 6144, 7168, 16384}, {1, 3, 64, 129, 2048}, kEveryAlgo, 0, -1, 900);
}

TEST(FusedAllReduceGpu, RanksWithDifferentlyAlignedBuffersTakeTheSamePath) {
  REQUIRE_GPU();
  if (gpuCount() < 2) GTEST_SKIP() << "needs 2 GPUs";
  // Rank 0's buffers one element off. 64 tokens of 6144 take several one-shot launches; 129
  // split unevenly in two-shot.
  runFused(gpuCount(), {6144}, {1, 3, 64, 129}, kPushAndAuto, 2, -1, 600);
}

// Every other test runs with the default, programmatic dependent launch where the probe
// works (and checks that the probe ran); this one with plain launches (ANYR_PDL=0, no probe).
TEST(FusedAllReduceGpu, PlainLaunchesWithoutProgrammaticLaunchAreCorrectToo) {
  REQUIRE_GPU();
  if (gpuCount() < 2) GTEST_SKIP() << "needs 2 GPUs";
  runFused(gpuCount(), {128, 6144}, {1, 3, 64}, kPushAndAuto, 0, 0, 600);
}

// Programmatic launch without the early release (ANYR_PDL_EARLY=0: a kernel's successor is
// scheduled only once its blocks exited), every path, against the composition on every rank.
TEST(FusedAllReduceGpu, ProgrammaticLaunchWithoutTheEarlyReleaseIsCorrectToo) {
  REQUIRE_GPU();
  if (gpuCount() < 2) GTEST_SKIP() << "needs 2 GPUs";
  runFused(gpuCount(), {128, 6144}, {1, 3, 64, 300}, kEveryAlgo, 0, -1, 600, -1, 0);
}

// The fused one-shot's cluster form at each forced size (the default test above takes the
// automatic one), against the composition bit for bit on every rank: hidden 128 at size 8
// leaves whole blocks without a vector, 8192 at size 2 runs the widest blocks (512 threads),
// 64 tokens at size 8 loop rows over clusters.
TEST(FusedAllReduceGpu, ClusterFormAtEveryForcedSizeMatchesTheComposition) {
  REQUIRE_GPU();
  if (gpuCount() < 2) GTEST_SKIP() << "needs 2 GPUs";
  for (int size : {2, 4, 8}) {
    SCOPED_TRACE("ANYR_FUSED_CLUSTER=" + std::to_string(size));
    runFused(gpuCount(), {128, 6144, 8192}, {1, 3, 64}, kPushAndAuto, 0, -1, 600, size);
  }
}

// Launches of more rows than clusters of two hold at one block per SM (67 to 128 rows with 132
// SMs): each row keeps its own cluster of two where an SM holds two of its blocks (hidden 6144:
// 384 threads, 7168: 448; explain's blocks.fusedClusterPairs), in the one-shot and the
// two-shot cluster forms (the ordinary kernel where it holds two blocks per SM, else the pair
// kernel for the block size, fused/launch.cuh), every dtype and quantization, against the
// composition bit for bit on every rank.
TEST(FusedAllReduceGpu, ClustersOfTwoBeyondOneBlockPerSmMatchTheComposition) {
  REQUIRE_GPU();
  if (gpuCount() < 2) GTEST_SKIP() << "needs 2 GPUs";
  runFused(gpuCount(), {6144, 7168}, {80, 96, 128}, kEveryAlgo, 0, -1, 600);
}

// More rows than SMs in one two-shot launch: the register form's dense shape (two blocks of
// 256 threads per SM where every rank holds them, fusedTwoShotShape), two to four vectors a
// thread at hidden 4096 to 8192, against the composition bit for bit on every rank (the
// automatic path takes the fused two-shot at these sizes, 1 to 5 MB).
TEST(FusedAllReduceGpu, DenseTwoShotFormMatchesTheComposition) {
  REQUIRE_GPU();
  if (gpuCount() < 2) GTEST_SKIP() << "needs 2 GPUs";
  runFused(gpuCount(), {4096, 6144, 7168, 8192}, {133, 300}, kPushAndAuto, 0, -1, 600);
}

// Clusters off: the block-per-row kernel for every row count.
TEST(FusedAllReduceGpu, WithoutClustersTheBlockPerRowKernelIsCorrectToo) {
  REQUIRE_GPU();
  if (gpuCount() < 2) GTEST_SKIP() << "needs 2 GPUs";
  runFused(gpuCount(), {128, 6144, 7168}, {1, 3, 64}, kPushAndAuto, 0, -1, 600, 1);
}

// A rank that skips a fused call: the other rank's kernel gives up after the timeout and names
// it, on each fused form (the cluster forms included: their blocks still exchange the row's sums
// and the failure, so none waits on another block), and the wait is bounded.
struct FusedForm {
  anyrAlgo_t algo;
  int cluster;  // config.fusedCluster: 1 off, 2/4/8 forced
  size_t tokens;
};

// One form of that test, on two ranks (sharing a GPU where there is one).
void expectMissingPeerNamed(const FusedForm& f) {
  constexpr size_t kHidden = 6144;
  const std::string name = std::string(anyrAlgoName(f.algo)) + ", fusedCluster " +
                           std::to_string(f.cluster) + ", " + std::to_string(f.tokens) + " tokens";
  SCOPED_TRACE(name);
  auto results =
      runRanksCatching(2, 120, [&](int rank, int n, const anyrUniqueId& id, const Report& report) {
        anyrComm_t comm =
            initRankComm(rank, n, id, 1500, [&](anyrConfig_t& c) { c.fusedCluster = f.cluster; });
        R_ANYR(anyrCommSetAlgorithm(comm, f.algo), comm);
        const size_t bytes = f.tokens * kHidden * 2;
        void *partial = nullptr, *residual = nullptr, *weight = nullptr, *norm = nullptr;
        for (void** q : {&partial, &residual, &norm}) R_CUDA(cudaMalloc(q, bytes));
        R_CUDA(cudaMalloc(&weight, kHidden * 2));
        for (void* q : {partial, residual, norm}) R_CUDA(cudaMemset(q, 0, bytes));
        R_CUDA(cudaMemset(weight, 0, kHidden * 2));
        cudaStream_t s;
        R_CUDA(cudaStreamCreate(&s));
        auto call = [&] {
          return anyrAllReduceAddRmsNorm(partial, residual, residual, weight, 1e-6f, norm, f.tokens,
                                         kHidden, anyrBfloat16, nullptr, comm, s);
        };
        int failures = 0;
        R_ANYR(call(), comm);
        R_CUDA(cudaStreamSynchronize(s));
        if (rank == 0) {
          failures += expectTimeoutNamingRank1(comm, s, call, name, "", 1.5 + 5.0, report);
        } else {
          // Wait until rank 0 has given up, then leave.
          std::this_thread::sleep_for(std::chrono::milliseconds(3000));
        }
        anyrCommDestroy(comm);
        return failures ? 4 : 0;
      });
  const std::string failures = launch::describeFailures(results);
  EXPECT_TRUE(failures.empty()) << failures;
  std::printf("[ info ] %s", results[0].message.c_str());
}

TEST(FusedAllReduceGpu, MissingPeerInEachFusedFormTimesOutNamingIt) {
  REQUIRE_GPU();
  if (gpuCount() < 2) GTEST_SKIP() << "needs 2 GPUs";
  for (const FusedForm& f :
       {FusedForm{anyrAlgoOneShotPush, 8, 1}, FusedForm{anyrAlgoOneShotPush, 1, 1},
        FusedForm{anyrAlgoTwoShotPush, 2, 64}, FusedForm{anyrAlgoTwoShotPush, 1, 64}}) {
    expectMissingPeerNamed(f);
  }
}

TEST(FusedAllReduceGpu, OddWorldSizeSharingGpus) {
  REQUIRE_GPU();
  if (gpuCount() < 1) GTEST_SKIP() << "no GPU";
  runFused(3, {128, 6144}, {1, 3, 129}, kPushAndAuto, 0, -1, 600);
}

// Rows of 16384 elements, 300 of them: the composition cuts them into launches of the scratch
// buffer's rows (256), the same on every rank whether or not it passed normOut. Every
// algorithm, the aliasing forms, two ranks (sharing a GPU where there is one).
TEST(FusedAllReduceGpu, WideRowsInSeveralChunks) {
  REQUIRE_GPU();
  if (gpuCount() < 1) GTEST_SKIP() << "no GPU";
  runFused(2, {16384}, {300}, kEveryAlgo, 0, -1, 600);
}

// The fused push kernels across the push launch count's wrap (see
// AllReduceGpu.PushEpochWrapIsSeamless): two ranks start 4 launches before it.
TEST(FusedAllReduceGpu, PushEpochWrapIsSeamless) {
  REQUIRE_GPU();
  if (gpuCount() < 1) GTEST_SKIP() << "no GPU";
  setenv("ANYR_TEST_PUSH_EPOCH", "3221225468", 1);
  const auto results = runFused(2, {128, 6144}, {1, 3, 129}, kPushAndAuto, 0, -1, 600);
  unsetenv("ANYR_TEST_PUSH_EPOCH");
  SKIP_UNLESS_EVERY_SUBJECT_RAN(results, {anyrAlgoOneShotPush, anyrAlgoTwoShotPush});
}

// World sizes 4, 5 and 8 on the visible GPUs, ranks sharing them where there are fewer: the fused
// kernels' pushes to 3 to 7 peers and the two-shot's row shares among 5 and 8 ranks (129 tokens
// split unevenly), against the composition on every rank.
TEST(FusedAllReduceGpu, WiderWorldSizesSharingGpus) {
  REQUIRE_GPU();
  if (gpuCount() < 1) GTEST_SKIP() << "no GPU";
  for (int n : {4, 5, 8}) {
    SCOPED_TRACE("world size " + std::to_string(n));
    runFused(n, {128, 6144}, {1, 3, 129}, kPushAndAuto, 0, -1, 600);
  }
}

// ---- the fused doubling push ------------------------------------------------------------------
// Its fused kernel (the fused one-shot push's block-per-row kernel in the doubling order:
// fused_oneshot_push.cu), forced, against the composition bit for bit on every rank, every
// rank's outputs bit-identical, the aliasing forms, every dtype, residual form and quantization
// mode: at world sizes 2 to 8 with the ranks sharing the GPU where there is one (the relays'
// rounds: one at 2 ranks, two at 3 and 4, three from 5), with small integers (rows of 128 and
// 6144; 300 rows: the blocks loop over rows) and random fractions (rows of 7168).
class FusedDoublingWorldSizeGpu : public testing::TestWithParam<int> {};

TEST_P(FusedDoublingWorldSizeGpu, ExactWithSmallIntegers) {
  REQUIRE_GPU();
  if (gpuCount() < 1) GTEST_SKIP() << "no GPU";
  const auto results = runFused(GetParam(), {128, 6144}, {1, 3, 300}, kDoublingKernel, 0, -1, 580);
  SKIP_UNLESS_EVERY_SUBJECT_RAN(results, kDoublingKernel);
}

TEST_P(FusedDoublingWorldSizeGpu, ExactWithRandomFractions) {
  REQUIRE_GPU();
  if (gpuCount() < 1) GTEST_SKIP() << "no GPU";
  const auto results =
      runFused(GetParam(), {7168}, {2, 37}, kDoublingKernel, 0, -1, 580, -1, -1, data::kRandom);
  SKIP_UNLESS_EVERY_SUBJECT_RAN(results, kDoublingKernel);
}

INSTANTIATE_TEST_SUITE_P(SharingGpus, FusedDoublingWorldSizeGpu, testing::Range(2, 9),
                         [](const testing::TestParamInfo<int>& p) {
                           return std::to_string(p.param) + "ranks";
                         });

// The partner orders islands give (algo/doubling_schedule.h): 0-3 | 4-7 (rank ^ 4 first) at 8
// ranks and 0-1 | 2-3 at 4, ranks sharing GPUs.
TEST(FusedAllReduceGpu, DoublingKernelOrdersFromIslandsSharingGpus) {
  REQUIRE_GPU();
  if (gpuCount() < 1) GTEST_SKIP() << "no GPU";
  for (const auto& [n, layout] :
       {std::pair<int, const char*>{8, "0-3,4-7"}, std::pair<int, const char*>{4, "0-1,2-3"}}) {
    SCOPED_TRACE(std::string("ANYR_ISLANDS=") + layout);
    setenv("ANYR_ISLANDS", layout, 1);
    const auto results = runFused(n, {128, 6144}, {1, 3, 129}, kDoublingKernel, 0, -1, 600);
    EXPECT_EQ(subjectsNotRun(results, kDoublingKernel), "");
  }
  unsetenv("ANYR_ISLANDS");
}

// ---- the fused pull kernels -------------------------------------------------------------------
// The fused kernels of the one-shot pull and of the two-shot (pull), forced with
// anyrCommSetAlgorithm (the fused operations then run them, which each case checks in the
// counters), against the composition bit for bit on every rank (the same pull all-reduce, then
// the standalone kernel), every rank's outputs bit-identical, the fp64 reference on small
// cases, the aliasing forms, partial untouched: at world sizes 2 to 8 with the ranks sharing the
// GPU where there is one (the device machine's case), every dtype, residual form and
// quantization mode (FP8, NVFP4 with linear and 128x4 scales).
class FusedPullWorldSizeGpu : public testing::TestWithParam<int> {};

// Small integers (exact sums): rows of 128 (one vector a thread) and 6144 (two), 1, 3 and 300
// tokens (300 rows: more than one block per SM takes at once on GPUs of fewer than 300 SMs, so
// the one-shot's blocks loop over rows; the two-shot cuts them into uneven segments).
TEST_P(FusedPullWorldSizeGpu, ExactWithSmallIntegers) {
  REQUIRE_GPU();
  if (gpuCount() < 1) GTEST_SKIP() << "no GPU";
  const auto results = runFused(GetParam(), {128, 6144}, {1, 3, 300}, kPullKernels, 0, -1, 580);
  SKIP_UNLESS_EVERY_SUBJECT_RAN(results, kPullKernels);
}

// Random fractions (the sums round, once, in rank order): rows of 7168 (two vectors a thread)
// and 16384 (four: wider than the registers hold, run because the algorithm is forced), 2 and
// 37 tokens.
TEST_P(FusedPullWorldSizeGpu, ExactWithRandomFractions) {
  REQUIRE_GPU();
  if (gpuCount() < 1) GTEST_SKIP() << "no GPU";
  const auto results =
      runFused(GetParam(), {7168, 16384}, {2, 37}, kPullKernels, 0, -1, 580, -1, -1, data::kRandom);
  SKIP_UNLESS_EVERY_SUBJECT_RAN(results, kPullKernels);
}

INSTANTIATE_TEST_SUITE_P(SharingGpus, FusedPullWorldSizeGpu, testing::Range(2, 9),
                         [](const testing::TestParamInfo<int>& p) {
                           return std::to_string(p.param) + "ranks";
                         });

// Few blocks and small launches (ANYR_MAX_BLOCKS=8, ANYR_CHUNK_BYTES=256K): each block of a
// launch loops over several rows (or row indices of the segments), and a call of 133 or 300
// rows of 4096 to 8192 takes 5 to 19 launches, whose staging buffers alternate by epoch parity
// within the call. At two ranks rank 0's row buffers are one element off 16-byte alignment, so
// it runs the general kernel where its peer runs the aligned one. Two and three ranks.
TEST(FusedPullGpu, RowsLoopOverFewBlocksInManyLaunches) {
  REQUIRE_GPU();
  if (gpuCount() < 1) GTEST_SKIP() << "no GPU";
  setenv("ANYR_MAX_BLOCKS", "8", 1);
  setenv("ANYR_CHUNK_BYTES", "262144", 1);
  std::vector<launch::RankResult> all;
  for (int n : {2, 3}) {
    SCOPED_TRACE("world size " + std::to_string(n));
    const auto results =
        runFused(n, {4096, 6144, 8192}, {133, 300}, kPullKernels, n == 2 ? 2 : 0, -1, 280);
    all.insert(all.end(), results.begin(), results.end());
  }
  unsetenv("ANYR_MAX_BLOCKS");
  unsetenv("ANYR_CHUNK_BYTES");
  SKIP_UNLESS_EVERY_SUBJECT_RAN(all, kPullKernels);
}

// The fused pull kernels captured in a CUDA graph: two fused calls (NVFP4 output with both
// scale layouts, a separate residual) captured once and replayed five times with fresh partial
// data before each replay, each replay's outputs against the eager composition bit for bit on
// every rank; the replays advance the device-side launch count, so the staging buffers
// alternate between them as in eager calls.
int fusedGraphRank(int rank, int n, const anyrUniqueId& id, const Report& report) {
  anyrComm_t comm = initRankComm(rank, n, id, 20000);
  cudaStream_t s = nonBlockingStream();
  constexpr int kCalls = 2, kReplays = 5;
  int failures = 0;
  uint32_t seed = 500;
  for (anyrAlgo_t algo : kPullKernels) {
    if (!forceOrSkip(comm, algo, report)) continue;
    for (auto [tokens, hidden] : {std::pair<size_t, size_t>{37, 6144}, {300, 128}}) {
      const size_t elems = tokens * hidden, bytes = elems * 2;
      const size_t qBytes = elems / 2, sBytes = elems / 16;
      const size_t swz = static_cast<size_t>(
          ref::swizzleBytes(static_cast<int64_t>(tokens), static_cast<int64_t>(hidden / 16)));
      struct Set {
        void *partial, *resOut, *norm, *quant, *scales, *swizzled;
      };
      auto alloc = [&](Set* t) {
        for (auto [q, nb] : {std::pair<void**, size_t>{&t->partial, bytes},
                             {&t->resOut, bytes},
                             {&t->norm, bytes},
                             {&t->quant, qBytes},
                             {&t->scales, sBytes},
                             {&t->swizzled, swz}}) {
          R_CUDA(cudaMalloc(q, nb));
        }
      };
      Set fused[kCalls], ref;
      for (Set& t : fused) alloc(&t);
      alloc(&ref);
      void *residual = nullptr, *weight = nullptr, *x = nullptr;
      float* scale = nullptr;
      unsigned long long* counters = nullptr;
      R_CUDA(cudaMalloc(&residual, bytes));
      R_CUDA(cudaMalloc(&x, bytes));
      R_CUDA(cudaMalloc(&weight, hidden * 2));
      R_CUDA(cudaMalloc(&scale, sizeof(float)));
      R_CUDA(cudaMalloc(&counters, 2 * sizeof(unsigned long long)));
      const float scaleValue = 0.02f;
      R_CUDA(cudaMemcpyAsync(scale, &scaleValue, sizeof(float), cudaMemcpyHostToDevice, s));
      R_CUDA(data::fillInput(anyrBfloat16, residual, elems, 100, seed, data::kSmallInts, s));
      R_CUDA(data::fillInput(anyrBfloat16, weight, hidden, 101, seed, data::kRandom, s));
      auto options = [&](const Set& t) {
        anyrFusedOptions_t o = ANYR_FUSED_OPTIONS_INITIALIZER;
        o.quant = anyrQuantNvfp4;
        o.scale = scale;
        o.quantOut = t.quant;
        o.blockScales = t.scales;
        o.blockScalesSwizzled = t.swizzled;
        return o;
      };
      anyrFusedOptions_t fo[kCalls];
      for (int k = 0; k < kCalls; ++k) fo[k] = options(fused[k]);
      const unsigned long long before = fusedKernelCalls(comm);
      cudaGraph_t g;
      cudaGraphExec_t exec;
      R_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      for (int k = 0; k < kCalls; ++k) {
        R_ANYR(
            anyrAllReduceAddRmsNorm(fused[k].partial, residual, fused[k].resOut, weight, 1e-5f,
                                    fused[k].norm, tokens, hidden, anyrBfloat16, &fo[k], comm, s),
            comm);
      }
      R_CUDA(cudaStreamEndCapture(s, &g));
      R_CUDA(cudaGraphInstantiate(&exec, g, 0));
      R_CUDA(cudaGraphDestroy(g));
      if (fusedKernelCalls(comm) != before + kCalls) {
        ++failures;
        report(std::string("FAIL graph ") + anyrAlgoName(algo) +
               ": the captured calls did not take the fused kernel\n");
      }
      const anyrFusedOptions_t ro = options(ref);
      for (int replay = 0; replay < kReplays; ++replay) {
        const uint32_t first = ++seed;
        for (int k = 0; k < kCalls; ++k) {
          R_CUDA(data::fillInput(anyrBfloat16, fused[k].partial, elems, rank, first + 1000 * k,
                                 data::kRandom, s));
          for (auto [q, nb] : {std::pair<void*, size_t>{fused[k].resOut, bytes},
                               {fused[k].norm, bytes},
                               {fused[k].quant, qBytes},
                               {fused[k].scales, sBytes},
                               {fused[k].swizzled, swz}}) {
            R_CUDA(cudaMemsetAsync(q, 0x7b, nb, s));
          }
        }
        R_CUDA(cudaGraphLaunch(exec, s));
        for (int k = 0; k < kCalls; ++k) {
          // The eager composition of the same call, on the same algorithm, into outputs poisoned
          // as the graph's were (the swizzled scales' padding rows are written by neither).
          for (auto [q, nb] : {std::pair<void*, size_t>{ref.resOut, bytes},
                               {ref.norm, bytes},
                               {ref.quant, qBytes},
                               {ref.scales, sBytes},
                               {ref.swizzled, swz}}) {
            R_CUDA(cudaMemsetAsync(q, 0x7b, nb, s));
          }
          R_ANYR(anyrAllReduce(fused[k].partial, x, elems, anyrBfloat16, anyrSum, comm, s), comm);
          R_ANYR(anyrAddRmsNorm(x, residual, ref.resOut, weight, 1e-5f, ref.norm, tokens, hidden,
                                anyrBfloat16, &ro, s),
                 comm);
          for (auto [what, got, want, nb] : {std::tuple<const char*, void*, void*, size_t>{
                                                 "residual", fused[k].resOut, ref.resOut, bytes},
                                             {"norm", fused[k].norm, ref.norm, bytes},
                                             {"quant", fused[k].quant, ref.quant, qBytes},
                                             {"scales", fused[k].scales, ref.scales, sBytes},
                                             {"swizzled", fused[k].swizzled, ref.swizzled, swz}}) {
            R_CUDA(cudaMemsetAsync(counters, 0, 2 * sizeof(unsigned long long), s));
            R_CUDA(data::countDiffBytes(got, want, nb, counters, s));
            R_CUDA(data::hashBytes(got, nb, counters + 1, s));
            unsigned long long c[2] = {0, 0};
            R_CUDA(cudaMemcpyAsync(c, counters, sizeof(c), cudaMemcpyDeviceToHost, s));
            R_CUDA(cudaStreamSynchronize(s));
            std::ostringstream key;
            key << "graph/" << anyrAlgoName(algo) << "/h" << hidden << "/t" << tokens << "/replay"
                << replay << "/call" << k << "/" << what;
            if (c[0] != 0) {
              ++failures;
              report("FAIL " + key.str() + ": differs from the eager composition in " +
                     std::to_string(c[0]) + " bytes\n");
            }
            report("HASH " + key.str() + " " + std::to_string(c[1]) + "\n");
          }
        }
      }
      R_CUDA(cudaGraphExecDestroy(exec));
      for (Set* t : {&fused[0], &fused[1], &ref}) {
        for (void* q : {t->partial, t->resOut, t->norm, t->quant, t->scales, t->swizzled}) {
          R_CUDA(cudaFree(q));
        }
      }
      for (void* q :
           {residual, x, weight, static_cast<void*>(scale), static_cast<void*>(counters)}) {
        R_CUDA(cudaFree(q));
      }
    }
  }
  return finishRank(comm, s, {}, failures, report);
}

TEST(FusedPullGpu, GraphReplaysMatchTheEagerComposition) {
  REQUIRE_GPU();
  if (gpuCount() < 1) GTEST_SKIP() << "no GPU";
  std::vector<launch::RankResult> all;
  for (int n : {2, 3}) {
    SCOPED_TRACE("world size " + std::to_string(n));
    const auto results = runRanksCatching(n, 280, fusedGraphRank);
    expectRanksPassedWithEqualHashes(results, n);
    all.insert(all.end(), results.begin(), results.end());
  }
  SKIP_UNLESS_EVERY_SUBJECT_RAN(all, kPullKernels);
}

// A rank that skips a fused pull call: the other rank's kernel gives up at its start round
// after the timeout and names it (two ranks, sharing the GPU where there is one).
TEST(FusedPullGpu, MissingPeerTimesOutNamingIt) {
  REQUIRE_GPU();
  if (gpuCount() < 1) GTEST_SKIP() << "no GPU";
  for (const FusedForm& f :
       {FusedForm{anyrAlgoOneShotPull, 1, 1}, FusedForm{anyrAlgoOneShotPull, 0, 300},
        FusedForm{anyrAlgoTwoShot, 0, 1}, FusedForm{anyrAlgoTwoShot, 0, 64}}) {
    expectMissingPeerNamed(f);
  }
}

// ---- the fused islands kernel -----------------------------------------------------------------
// Its fused kernel (the islands kernel's steps, then a block per row: fused_islands.cu), forced,
// against the composition (islands, then the standalone kernel) bit for bit on every rank, every
// rank's outputs bit-identical, the aliasing forms, every dtype, residual form and quantization
// mode, partial untouched: at world sizes 2 to 8 with the ranks sharing the GPU where there is
// one, in islands forced by ANYR_ISLANDS (every rank alone at 2; uneven islands at 3, 5, 6 and
// 7; three islands at 6 and 8), with small integers (rows of 128 and 6144; 300 rows: the blocks
// loop over rows) and random fractions (rows of 7168).
const char* islandsLayoutFor(int n) {
  switch (n) {
    case 2:
      return "0,1";
    case 3:
      return "0-1,2";
    case 4:
      return "0-1,2-3";
    case 5:
      return "0-2,3-4";
    case 6:
      return "0-1,2-3,4-5";
    case 7:
      return "0-3,4-6";
    default:
      return "0-2,3-5,6-7";
  }
}

class FusedIslandsWorldSizeGpu : public testing::TestWithParam<int> {};

TEST_P(FusedIslandsWorldSizeGpu, ExactWithSmallIntegers) {
  REQUIRE_GPU();
  if (gpuCount() < 1) GTEST_SKIP() << "no GPU";
  setenv("ANYR_ISLANDS", islandsLayoutFor(GetParam()), 1);
  const auto results =
      runFused(GetParam(), {128, 6144}, {1, 3, 300}, Algos{anyrAlgoIslands}, 0, -1, 580);
  unsetenv("ANYR_ISLANDS");
  EXPECT_EQ(subjectsNotRun(results, {anyrAlgoIslands}), "");
}

TEST_P(FusedIslandsWorldSizeGpu, ExactWithRandomFractions) {
  REQUIRE_GPU();
  if (gpuCount() < 1) GTEST_SKIP() << "no GPU";
  setenv("ANYR_ISLANDS", islandsLayoutFor(GetParam()), 1);
  const auto results = runFused(GetParam(), {7168}, {2, 37}, Algos{anyrAlgoIslands}, 0, -1, 580, -1,
                                -1, data::kRandom);
  unsetenv("ANYR_ISLANDS");
  EXPECT_EQ(subjectsNotRun(results, {anyrAlgoIslands}), "");
}

INSTANTIATE_TEST_SUITE_P(SharingGpus, FusedIslandsWorldSizeGpu, testing::Range(2, 9),
                         [](const testing::TestParamInfo<int>& p) {
                           return std::to_string(p.param) + "ranks";
                         });

// Islands of 4 + 4 at 8 ranks (the test above takes 3 + 3 + 2 there), and wide rows (16384,
// forced: four vectors a thread) at 4 ranks in two islands: the fused kernel against the
// composition.
TEST(FusedAllReduceGpu, IslandsKernelWideRowsAndLayoutsSharingGpus) {
  REQUIRE_GPU();
  if (gpuCount() < 1) GTEST_SKIP() << "no GPU";
  for (const auto& [n, layout] : {std::pair<int, const char*>{8, "0-3,4-7"}, {4, "0-1,2-3"}}) {
    SCOPED_TRACE(std::string("ANYR_ISLANDS=") + layout);
    setenv("ANYR_ISLANDS", layout, 1);
    const auto results =
        runFused(n, n == 8 ? std::vector<size_t>{128, 6144} : std::vector<size_t>{16384},
                 {1, 3, 129}, Algos{anyrAlgoIslands}, 0, -1, 600);
    EXPECT_EQ(subjectsNotRun(results, {anyrAlgoIslands}), "");
  }
  unsetenv("ANYR_ISLANDS");
}

}  // namespace
}  // namespace anyr
