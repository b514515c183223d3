// Multi-process GPU tests of the host-memory transport's compressed wire formats (fp8, int8),
// of the host one-shot's low-latency protocol in both polling modes, and of its bounded waits. The
// plain correctness suite (every dtype, count, in/out of place, graph replay, bit-identical ranks)
// runs the host algorithms with the native wire in test_allreduce.cc and test_fused_allreduce.cc.
//
// Wire tests, per wire x algorithm (host-oneshot, host-twoshot, host-copy, oneshot-pull) x dtype x
// count:
//  - crafted data: small integers times a power of two that changes every 64 elements, so each
//    wire group holds values that its power-of-two scale represents exactly: the output must be
//    the exact sum, bit for bit;
//  - random data with magnitudes varying by group: every element within the bound of
//    docs/WIRE.md, and at least one element not exact (the wire really was compressed);
//  - every rank reports a hash of every output; the parent checks all ranks agree.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>
#include <thread>
#include <vector>

#include "anyreduce/anyreduce.h"
#include "base/env.h"
#include "common/data.h"
#include "common/launcher.h"
#include "gpu/gpu_test_util.h"

namespace anyr {
namespace {

// ---- host-side dtype helpers ----------------------------------------------------------------
float roundTo(anyrDataType_t t, float x) {
  switch (t) {
    case anyrBfloat16:
      return __bfloat162float(__float2bfloat16_rn(x));
    case anyrFloat16:
      return __half2float(__float2half_rn(x));
    default:
      return x;
  }
}
void store(anyrDataType_t t, unsigned char* p, uint64_t i, float x) {
  if (t == anyrBfloat16) {
    __nv_bfloat16 v = __float2bfloat16_rn(x);
    std::memcpy(p + i * 2, &v, 2);
  } else if (t == anyrFloat16) {
    __half v = __float2half_rn(x);
    std::memcpy(p + i * 2, &v, 2);
  } else {
    std::memcpy(p + i * 4, &x, 4);
  }
}
float load(anyrDataType_t t, const unsigned char* p, uint64_t i) {
  if (t == anyrBfloat16) {
    __nv_bfloat16 v;
    std::memcpy(&v, p + i * 2, 2);
    return __bfloat162float(v);
  }
  if (t == anyrFloat16) {
    __half v;
    std::memcpy(&v, p + i * 2, 2);
    return __half2float(v);
  }
  float v;
  std::memcpy(&v, p + i * 4, 4);
  return v;
}
// Half an ulp of the dtype at |v| (relative), plus its smallest subnormal step.
double halfUlp(anyrDataType_t t, double v) {
  switch (t) {
    case anyrBfloat16:
      return std::ldexp(std::fabs(v), -8) + 1e-38;
    case anyrFloat16:
      return std::ldexp(std::fabs(v), -11) + std::ldexp(1.0, -25);
    default:
      return std::ldexp(std::fabs(v), -24) + 1e-44;
  }
}

enum Pattern { kCrafted = 0, kRandomScaled = 1, kEdges = 2 };

const char* wireNameOf(anyrWire_t w) { return w == anyrWireFp8 ? "fp8" : "int8"; }

// Rank r's input element i (already representable in the dtype). kEdges, by wire group
// (groupElems elements) g: g % 4 == 0, small integers times the dtype's largest power of two
// used here (2^120; fp16 2^10); 1, times its smallest (2^-120; fp16 2^-14); 2, small integers
// and an infinity on rank 0 at the group's first element; 3, a NaN on rank 1 at its second.
float inputValue(anyrDataType_t t, int pattern, int rank, uint64_t i, uint32_t seed,
                 uint64_t groupElems) {
  if (pattern == kCrafted) {
    const int e = static_cast<int>((i / 64) % 16) - 8;
    return std::ldexp(data::genValue(data::kSmallInts, rank, i, seed), e);
  }
  if (pattern == kEdges) {
    const float v = data::genValue(data::kSmallInts, rank, i, seed);
    const uint64_t g = i / groupElems, at = i % groupElems;
    const bool half = t == anyrFloat16;
    switch (g % 4) {
      case 0:
        return std::ldexp(v, half ? 10 : 120);
      case 1:
        return std::ldexp(v, half ? -14 : -120);
      case 2:
        return rank == 0 && at == 0 ? INFINITY : v;
      default:
        return rank == 1 && at == 1 ? NAN : v;
    }
  }
  const int e = static_cast<int>((i / 256) % 8) - 4;
  return roundTo(t, std::ldexp(data::genValue(data::kRandom, rank, i, seed), e));
}

// The group's scale s of docs/WIRE.md: the smallest power of two with a <= Q s, 2^-126..2^126.
double wireScale(anyrWire_t w, double a) {
  const double q = w == anyrWireFp8 ? 448.0 : 127.0;
  if (!(a > 0) || !std::isfinite(a)) return 1.0;
  int k = static_cast<int>(std::ceil(std::log2(a / q)));
  while (std::ldexp(q, k - 1) >= a) --k;
  while (std::ldexp(q, k) < a) ++k;
  return std::ldexp(1.0, std::max(-126, std::min(126, k)));
}

// Per-element bound of docs/WIRE.md for one quantization of x in a group of max |.| = a.
double quantErr(anyrWire_t w, double x, double a) {
  const double s = wireScale(w, a);
  if (w == anyrWireFp8) return std::ldexp(std::fabs(x), -4) + std::ldexp(s, -10);
  return s / 2;
}

// One call's element type and count.
struct DtypeCount {
  anyrDataType_t dt;
  uint64_t count;
};

int wireRank(int rank, int n, const anyrUniqueId& id, const Report& report, anyrWire_t wire) {
  anyrComm_t comm = initRankComm(rank, n, id, 20000, [&](anyrConfig_t& c) { c.wire = wire; });
  cudaStream_t s = nonBlockingStream();
  const std::vector<uint64_t> counts = {1, 9, 1023, 65536 + 5, (1u << 20) + 3};
  const uint64_t maxCount = (1u << 20) + 3;
  char* in = deviceAlloc<char>(maxCount * 4 + 64);
  char* out = deviceAlloc<char>(maxCount * 4 + 64);
  std::vector<unsigned char> hostIn(maxCount * 4), hostOut(maxCount * 4);
  int failures = 0;
  uint32_t seed = 4242;
  // The host algorithms and one peer algorithm (one-shot pull) honour the wire.
  for (anyrAlgo_t algo :
       {anyrAlgoHostOneShot, anyrAlgoHostTwoShot, anyrAlgoHostCopy, anyrAlgoOneShotPull}) {
    if (anyrCommSetAlgorithm(comm, algo) != anyrSuccess) {
      // The host algorithms are admitted wherever the host transport is; one-shot pull only
      // with peer access, and without it the test is reported skipped (SKIP_UNLESS_EVERY_...).
      report(std::string(algo != anyrAlgoOneShotPull ? "FAIL " : "SKIP ") + anyrAlgoName(algo) +
             ": " + anyrGetLastError(comm) + "\n");
      if (algo != anyrAlgoOneShotPull) ++failures;
      continue;
    }
    for (anyrDataType_t dt : {anyrBfloat16, anyrFloat16, anyrFloat32}) {
      const size_t es = data::dtypeBytes(dt);
      const uint64_t groupElems = 16 * (16 / es);  // elements per wire group
      for (uint64_t count : counts) {
        for (int pattern : {kCrafted, kRandomScaled, kEdges}) {
          for (int rep = 0; rep < 2; ++rep) {  // twice: both parity buffers
            ++seed;
            std::ostringstream key;
            key << wireNameOf(wire) << "/" << anyrAlgoName(algo) << "/" << data::dtypeName(dt)
                << "/n=" << count
                << (pattern == kCrafted ? "/crafted"
                    : pattern == kEdges ? "/edges"
                                        : "/random")
                << "/" << rep;
            // Inputs of every rank (each rank needs all of them for the reference).
            std::vector<std::vector<float>> x(static_cast<size_t>(n), std::vector<float>(count));
            for (int r = 0; r < n; ++r) {
              for (uint64_t i = 0; i < count; ++i) {
                x[static_cast<size_t>(r)][i] = inputValue(dt, pattern, r, i, seed, groupElems);
              }
            }
            for (uint64_t i = 0; i < count; ++i) {
              store(dt, hostIn.data(), i, x[static_cast<size_t>(rank)][i]);
            }
            R_CUDA(cudaMemcpyAsync(in, hostIn.data(), count * es, cudaMemcpyHostToDevice, s));
            R_CUDA(cudaMemsetAsync(out, 0xff, count * es, s));
            R_ANYR(anyrAllReduce(in, out, count, dt, anyrSum, comm, s), comm);
            R_CUDA(cudaMemcpyAsync(hostOut.data(), out, count * es, cudaMemcpyDeviceToHost, s));
            R_CUDA(cudaStreamSynchronize(s));
            // Reference and bound.
            uint64_t bad = 0, firstBad = count, inexact = 0;
            double worstRatio = 0;
            for (uint64_t g0 = 0; g0 < count; g0 += groupElems) {
              const uint64_t g1 = std::min(count, g0 + groupElems);
              std::vector<double> amax(static_cast<size_t>(n), 0.0);
              for (int r = 0; r < n; ++r) {
                for (uint64_t i = g0; i < g1; ++i) {  // over finite elements, as the wire
                  const double v = x[static_cast<size_t>(r)][i];
                  if (std::isfinite(v)) {
                    amax[static_cast<size_t>(r)] =
                        std::max(amax[static_cast<size_t>(r)], std::fabs(v));
                  }
                }
              }
              double amaxSum = 0;
              for (double a : amax) amaxSum += a;
              for (uint64_t i = g0; i < g1; ++i) {
                double exact = 0, absSum = 0, qe = 0;
                for (int r = 0; r < n; ++r) {
                  const double v = x[static_cast<size_t>(r)][i];
                  exact += v;
                  absSum += std::fabs(v);
                  qe += quantErr(wire, v, amax[static_cast<size_t>(r)]);
                }
                const float got = load(dt, hostOut.data(), i);
                if (pattern == kEdges && !std::isfinite(exact)) {
                  if (!std::isnan(got)) {  // a non-finite input travels as NaN
                    if (bad++ == 0) firstBad = i;
                  }
                  continue;
                }
                if (pattern == kCrafted || pattern == kEdges) {
                  const float want = roundTo(dt, static_cast<float>(exact));
                  if (std::memcmp(&got, &want, 4) != 0) {
                    if (bad++ == 0) firstBad = i;
                  }
                  continue;
                }
                double tol = qe + n * std::ldexp(absSum, -23) + halfUlp(dt, std::fabs(exact) + qe);
                if (algo == anyrAlgoHostTwoShot) {
                  // The reduced segment is quantized again (group max <= sum of the ranks'
                  // maxima, grown by the first quantization), then rounded to the dtype.
                  tol += quantErr(wire, std::fabs(exact) + tol, amaxSum * (1.0 + 1.0 / 16)) +
                         halfUlp(dt, std::fabs(exact) + 2 * tol);
                }
                const double err = std::fabs(static_cast<double>(got) - exact);
                if (!(err <= tol)) {
                  if (bad++ == 0) firstBad = i;
                }
                if (err != 0) ++inexact;
                worstRatio = std::max(worstRatio, err / tol);
              }
            }
            if (bad) {
              ++failures;
              report("FAIL " + key.str() + ": " + std::to_string(bad) +
                     " elements outside the bound, first at " + std::to_string(firstBad) + "\n");
            }
            if (pattern == kRandomScaled && count >= 1023 && inexact == 0) {
              ++failures;
              report("FAIL " + key.str() + ": every element exact; was the wire compressed?\n");
            }
            if (pattern == kRandomScaled && count == maxCount && rep == 0) {
              report("INFO " + key.str() + ": worst error / bound = " + std::to_string(worstRatio) +
                     "\n");
            }
            report("HASH " + key.str() + " " +
                   std::to_string(data::fnv1a(hostOut.data(), count * es)) + "\n");
          }
        }
      }
    }
  }
  return finishRank(comm, s, {in, out}, failures, report);
}

TEST(HostWireGpu, Fp8WithinBoundExactOnCraftedBitIdentical) {
  REQUIRE_GPU();
  auto results = runRanksWith(2, 900, wireRank, anyrWireFp8);
  expectRanksPassedWithEqualHashes(results, 2);
  SKIP_UNLESS_EVERY_SUBJECT_RAN(results, {anyrAlgoOneShotPull});
}

TEST(HostWireGpu, Int8WithinBoundExactOnCraftedBitIdentical) {
  REQUIRE_GPU();
  auto results = runRanksWith(2, 900, wireRank, anyrWireInt8);
  expectRanksPassedWithEqualHashes(results, 2);
  SKIP_UNLESS_EVERY_SUBJECT_RAN(results, {anyrAlgoOneShotPull});
}

// Small launch capacity (ANYR_HOST_LAUNCH_BYTES 64 KiB: every large message takes many launches;
// ANYR_CHUNK_BYTES too, though no host algorithm reads it), the three host
// algorithms taking turns call by call (they share the epoch, the one-shots the buffers' parity,
// host-copy its launch barrier), eager and graph-captured calls mixed, native and fp8 wire: exact
// small-integer sums on every rank, every call.
int chunkedMixedRank(int rank, int n, const anyrUniqueId& id, const Report& report,
                     anyrWire_t wire) {
  setenv("ANYR_HOST_LAUNCH_BYTES", "64K", 1);
  anyrComm_t comm = initRankComm(rank, n, id, 20000, [&](anyrConfig_t& c) {
    c.chunkBytes = 64u << 10;
    c.wire = wire;
  });
  cudaStream_t s = nonBlockingStream();
  const uint64_t maxCount = (1u << 19) + 11;
  char* buf = deviceAlloc<char>(maxCount * 4 + 64);
  unsigned long long* bad = deviceAlloc<unsigned long long>();
  int failures = 0;
  // The launch size in force must be the one asked for (rank 0's, agreed), or the test tests less.
  const nlohmann::json j = explainJson(comm);
  if (!j.contains("hostTransport") || j["hostTransport"].value("launchBytes", 0u) != 64u << 10) {
    ++failures;
    report("FAIL explain's hostTransport.launchBytes is not 65536: " + j.dump() + "\n");
  }
  uint32_t seed = 900;
  int call = 0;
  for (anyrDataType_t dt : {anyrBfloat16, anyrFloat32}) {
    for (uint64_t count : {uint64_t{100}, uint64_t{40000} + 3, maxCount}) {
      for (int rep = 0; rep < 6; ++rep, ++call) {
        const anyrAlgo_t turns[3] = {anyrAlgoHostOneShot, anyrAlgoHostTwoShot, anyrAlgoHostCopy};
        const anyrAlgo_t algo = turns[rep % 3];
        const bool graph = rep >= 4;
        R_ANYR(anyrCommSetAlgorithm(comm, algo), comm);
        ++seed;
        R_CUDA(data::fillInput(dt, buf, count, rank, seed, data::kSmallInts, s));
        if (graph) {
          cudaGraphExec_t exec = captureAllReduce(buf, buf, count, dt, comm, s);
          R_CUDA(cudaGraphLaunch(exec, s));
          R_CUDA(cudaStreamSynchronize(s));
          R_CUDA(cudaGraphExecDestroy(exec));
        } else {
          R_ANYR(anyrAllReduce(buf, buf, count, dt, anyrSum, comm, s), comm);
        }
        unsigned long long hbad = 0;
        R_CUDA(data::mismatchesNow(dt, buf, count, n, seed, data::kSmallInts, bad, s, &hbad));
        if (hbad != 0) {
          ++failures;
          report("FAIL call " + std::to_string(call) + " " + anyrAlgoName(algo) + " " +
                 data::dtypeName(dt) + " n=" + std::to_string(count) + (graph ? " graph" : "") +
                 ": " + std::to_string(hbad) + " wrong\n");
        }
        std::vector<unsigned char> got(count * data::dtypeBytes(dt));
        R_CUDA(cudaMemcpyAsync(got.data(), buf, got.size(), cudaMemcpyDeviceToHost, s));
        R_CUDA(cudaStreamSynchronize(s));
        report("HASH call" + std::to_string(call) + " " +
               std::to_string(data::fnv1a(got.data(), got.size())) + "\n");
      }
    }
  }
  return finishRank(comm, s, {buf, bad}, failures, report);
}

TEST(HostWireGpu, ChunkedAlternatingAlgorithmsExact) {
  REQUIRE_GPU();
  for (anyrWire_t wire : {anyrWireNative, anyrWireFp8}) {
    auto results = runRanksWith(2, 600, chunkedMixedRank, wire);
    expectRanksPassedWithEqualHashes(results, 2);
  }
}

// The host one-shot's low-latency protocol in both of its polling modes (every thread polling
// its own lines, ANYR_HOST_LL_EAGER_BYTES at its default; one lane a warp first, 0), at every
// size it carries (up to ANYR_HOST_LL_BYTES, 64 KiB) and one above (the flag protocol): fresh
// small-integer and random inputs, poisoned outputs, in place and out of place, graph replays
// (both buffer parities), every rank's output checked bit for bit against the expected sum.
int lowLatencyRank(int rank, int n, const anyrUniqueId& id, const Report& report,
                   const char* eagerBytes) {
  setenv("ANYR_HOST_LL_EAGER_BYTES", eagerBytes, 1);
  unsetenv("ANYR_HOST_LL_BYTES");
  anyrComm_t comm = initRankComm(rank, n, id, 20000);
  int failures = 0;
  // The settings in force must be the ones asked for, or the test tests less.
  const nlohmann::json j = explainJson(comm);
  const uint64_t eager = std::strtoull(eagerBytes, nullptr, 10);
  if (!j.contains("hostTransport") ||
      j["hostTransport"].value("lowLatencyMaxBytes", 0ull) != 65536ull ||
      j["hostTransport"].value("lowLatencyEagerMaxBytes", ~0ull) != eager) {
    ++failures;
    report("FAIL explain's hostTransport low-latency settings: " + j.dump() + "\n");
  }
  R_ANYR(anyrCommSetAlgorithm(comm, anyrAlgoHostOneShot), comm);
  cudaStream_t s = nonBlockingStream();
  const uint64_t maxCount = 40000;
  char* in = deviceAlloc<char>(maxCount * 4 + 64);
  char* out = deviceAlloc<char>(maxCount * 4 + 64);
  unsigned long long* bad = deviceAlloc<unsigned long long>();
  uint32_t seed = 7000;
  const DtypeCount cases[] = {{anyrBfloat16, 1},     {anyrBfloat16, 7},     {anyrBfloat16, 257},
                              {anyrBfloat16, 1023},  {anyrBfloat16, 4099},  {anyrBfloat16, 16384},
                              {anyrBfloat16, 32768}, {anyrBfloat16, 32769}, {anyrFloat32, 3},
                              {anyrFloat32, 16384},  {anyrFloat16, 12345}};
  for (const auto& c : cases) {
    const size_t es = data::dtypeBytes(c.dt);
    for (int inPlace = 0; inPlace < 2; ++inPlace) {
      for (int mode : {data::kSmallInts, data::kRandom}) {
        char* dst = inPlace ? in : out;
        cudaGraphExec_t exec = captureAllReduce(in, dst, c.count, c.dt, comm, s);
        // An eager call, then three replays: both buffer parities, twice.
        for (int call = 0; call < 4; ++call) {
          ++seed;
          R_CUDA(data::fillInput(c.dt, in, c.count, rank, seed, mode, s));
          if (!inPlace) R_CUDA(cudaMemsetAsync(out, 0xff, c.count * es, s));
          if (call == 0) {
            R_ANYR(anyrAllReduce(in, dst, c.count, c.dt, anyrSum, comm, s), comm);
          } else {
            R_CUDA(cudaGraphLaunch(exec, s));
          }
          unsigned long long hbad = 0;
          R_CUDA(data::mismatchesNow(c.dt, dst, c.count, n, seed, mode, bad, s, &hbad));
          if (hbad != 0) {
            ++failures;
            report(std::string("FAIL eager<=") + eagerBytes + " " + data::dtypeName(c.dt) +
                   " n=" + std::to_string(c.count) + (inPlace ? " in place" : "") +
                   (mode == data::kRandom ? " random" : " ints") + " call " + std::to_string(call) +
                   ": " + std::to_string(hbad) + " wrong\n");
          }
        }
        R_CUDA(cudaGraphExecDestroy(exec));
      }
    }
  }
  return finishRank(comm, s, {in, out, bad}, failures, report);
}

TEST(HostWireGpu, LowLatencyProtocolBothPollingModesExact) {
  REQUIRE_GPU();
  for (const char* eager : {"65536", "0"}) {
    auto results = runRanksWith(2, 300, lowLatencyRank, eager);
    expectRanksExitedZero(results, std::string("ANYR_HOST_LL_EAGER_BYTES=") + eager + ": ");
  }
}

// The low-latency protocol never takes a stale line: rank 1 enters every call 100 ms after
// rank 0, so rank 0's kernel reads rank 1's lines long before they are written, and takes any
// line that carries the launch's tag without having been written by it (the sum is then wrong
// on rank 0). Host one-shot forced, 64 KiB launches (every line of a buffer) between smaller
// ones (a line left by a large launch stays while small ones run), every output checked exactly
// on both ranks.
int lateLowLatencyRank(int rank, int n, const anyrUniqueId& id, const Report& report,
                       bool hostCopyFailedSelfTest) {
  unsetenv("ANYR_HOST_LL_BYTES");
  unsetenv("ANYR_HOST_LL_EAGER_BYTES");
  anyrComm_t comm = initRankComm(rank, n, id, 20000);
  int failures = 0;
  const nlohmann::json j = explainJson(comm);
  if (!j.contains("hostTransport") ||
      j["hostTransport"].value("lowLatencyMaxBytes", 0ull) != 65536ull) {
    ++failures;
    report("FAIL explain's hostTransport.lowLatencyMaxBytes is not 65536: " + j.dump() + "\n");
  }
  if (hostCopyFailedSelfTest) {
    // The injected fault must have made host-copy fail the self-test (and so reset the protocol
    // state after the host one-shot's runs), or the test tests less.
    std::string got;
    if (j.contains("selfTest") && j["selfTest"].contains("results")) {
      got = j["selfTest"]["results"].value("host-copy", std::string());
    }
    if (got.find("self-test failed") == std::string::npos) {
      ++failures;
      report("FAIL host-copy did not fail the self-test: " + j.dump() + "\n");
    }
  }
  R_ANYR(anyrCommSetAlgorithm(comm, anyrAlgoHostOneShot), comm);
  cudaStream_t s = nonBlockingStream();
  char* in = deviceAlloc<char>(65536);
  char* out = deviceAlloc<char>(65536);
  unsigned long long* bad = deviceAlloc<unsigned long long>();
  const DtypeCount calls[] = {{anyrFloat32, 16384}, {anyrFloat32, 1},      {anyrFloat32, 16384},
                              {anyrBfloat16, 999},  {anyrBfloat16, 32768}, {anyrFloat32, 3001},
                              {anyrFloat32, 16384}, {anyrBfloat16, 5},     {anyrBfloat16, 32768},
                              {anyrFloat32, 16384}, {anyrFloat32, 8},      {anyrFloat32, 16384}};
  uint32_t seed = 5100;
  int call = 0;
  for (const auto& c : calls) {
    ++seed;
    R_CUDA(data::fillInput(c.dt, in, c.count, rank, seed, data::kSmallInts, s));
    R_CUDA(cudaMemsetAsync(out, 0xff, c.count * data::dtypeBytes(c.dt), s));
    R_CUDA(cudaStreamSynchronize(s));
    if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    R_ANYR(anyrAllReduce(in, out, c.count, c.dt, anyrSum, comm, s), comm);
    unsigned long long hbad = 0;
    R_CUDA(data::mismatchesNow(c.dt, out, c.count, n, seed, data::kSmallInts, bad, s, &hbad));
    if (hbad != 0) {
      ++failures;
      report("FAIL call " + std::to_string(call) + " " + data::dtypeName(c.dt) +
             " n=" + std::to_string(c.count) + ": " + std::to_string(hbad) + " wrong\n");
    }
    ++call;
  }
  return finishRank(comm, s, {in, out, bad}, failures, report);
}

// Runs lateLowLatencyRank on two ranks with the tests-only variable `name` = `value`.
void expectLateLowLatencyExact(const char* name, const char* value, bool hostCopyFailedSelfTest) {
  setenv(name, value, 1);
  auto results = runRanksWith(2, 300, lateLowLatencyRank, hostCopyFailedSelfTest);
  unsetenv(name);
  expectRanksPassed(results);
}

// The host launch epoch starts at 2^32 - 1 (ANYR_TEST_SYNC_EPOCH), as after 2^32 host
// launches: the first call's epoch is 0, which every line the self-test's small launches left
// unwritten carried when the epoch tagged the lines.
TEST(HostWireGpu, LowLatencyTakesNoStaleLineWhereTheHostEpochWraps) {
  REQUIRE_GPU();
  expectLateLowLatencyExact("ANYR_TEST_SYNC_EPOCH", "4294967295", false);
}

// The protocol's own launch count starts 6 launches before its wrap (ANYR_TEST_HOST_LL_COUNT,
// every line tagged with it): the self-test's and the calls' launches cross the wrap and both
// buffers' sweeps (counts 0 and 1), late peer every time.
TEST(HostWireGpu, LowLatencyCountWrapIsSeamless) {
  REQUIRE_GPU();
  expectLateLowLatencyExact("ANYR_TEST_HOST_LL_COUNT", "4294967290", false);
}

// Host-copy fails the self-test (ANYR_FAULT_INJECT=host-copy-selftest:1) after the host
// one-shot ran its low-latency launches, and the protocol state is reset: the lines the
// self-test left must not be taken by the calls that reuse their tags.
TEST(HostWireGpu, LowLatencyTakesNoStaleLineAfterASelfTestReset) {
  REQUIRE_GPU();
  expectLateLowLatencyExact("ANYR_FAULT_INJECT", "host-copy-selftest:1", true);
}

TEST(HostWireGpu, WithoutPeerMemoryTheDefaultIsTheHostPath) {
  REQUIRE_GPU();
  // ANYR_PEER_MEMORY=0 makes a communicator behave as on GPUs without peer access: the
  // automatic choice must take the host path for small messages and NCCL (when there is one)
  // above the host limit, and the host path must compute exact sums.
  auto results =
      runRanksCatching(2, 120, [&](int rank, int n, const anyrUniqueId& id, const Report& report) {
        setenv("ANYR_PEER_MEMORY", "0", 1);
        useRankGpu(rank);
        anyrComm_t comm = nullptr;
        R_ANYR(anyrCommInitRank(&comm, n, id, rank), nullptr);
        int failures = 0;
        // The seed (select/dispatch.cc, calibrated on this kind of machine: two ranks, PCIe
        // gen5 x16): the host one-shot's low-latency protocol up to 64 KiB (its default limit),
        // the host two-shot in the middle, host-copy (the copy engines) for large messages;
        // NCCL through host memory measured slower at every size.
        failures += expectChoice(comm, 256, "512 B", {anyrAlgoHostOneShot}, report);
        failures += expectChoice(comm, 8192, "16 KiB", {anyrAlgoHostOneShot}, report);
        failures += expectChoice(comm, 32u << 10, "64 KiB", {anyrAlgoHostOneShot}, report);
        failures += expectChoice(comm, 128u << 10, "256 KiB", {anyrAlgoHostTwoShot}, report);
        failures += expectChoice(comm, 32u << 20, "64 MiB", {anyrAlgoHostCopy}, report);
        if (anyrCommSetAlgorithm(comm, anyrAlgoOneShotPush) != anyrUnsupported ||
            std::string(anyrGetLastError(comm)).find("ANYR_PEER_MEMORY") == std::string::npos) {
          ++failures;
          report(std::string("FAIL forcing oneshot-push: ") + anyrGetLastError(comm) + "\n");
        }
        cudaStream_t s;
        R_CUDA(cudaStreamCreate(&s));
        char* buf = deviceAlloc<char>(1 << 22);
        unsigned long long* bad = deviceAlloc<unsigned long long>();
        for (uint64_t count : {uint64_t{1}, uint64_t{5000}, uint64_t{1} << 20}) {
          R_CUDA(data::fillInput(anyrBfloat16, buf, count, rank, 31, data::kSmallInts, s));
          R_ANYR(anyrAllReduce(buf, buf, count, anyrBfloat16, anyrSum, comm, s), comm);
          unsigned long long hbad = 0;
          R_CUDA(data::mismatchesNow(anyrBfloat16, buf, count, n, 31, data::kSmallInts, bad, s,
                                     &hbad));
          if (hbad) {
            ++failures;
            report("FAIL auto all-reduce of " + std::to_string(count) + ": " +
                   std::to_string(hbad) + " wrong\n");
          }
        }
        return releaseRank(comm, nullptr, {buf, bad}, failures);
      });
  expectRanksExitedZero(results);
}

TEST(HostWireGpu, HostPathIsAdmittedAndExplained) {
  REQUIRE_GPU();
  auto results =
      runRanksCatching(2, 120, [&](int rank, int n, const anyrUniqueId& id, const Report& report) {
        useRankGpu(rank);
        anyrComm_t comm = nullptr;
        R_ANYR(anyrCommInitRank(&comm, n, id, rank), nullptr);
        int failures = 0;
        for (anyrAlgo_t a : {anyrAlgoHostOneShot, anyrAlgoHostTwoShot, anyrAlgoHostCopy}) {
          if (anyrCommSetAlgorithm(comm, a) != anyrSuccess) {
            ++failures;
            report(std::string("FAIL ") + anyrAlgoName(a) +
                   " not admitted: " + anyrGetLastError(comm) + "\n");
          }
        }
        const std::string text = explainText(comm);
        // The low-latency limit in force: ANYR_HOST_LL_BYTES, or its registered default.
        const std::string llLimit =
            "\"lowLatencyMaxBytes\": " + std::to_string(env::getInt("ANYR_HOST_LL_BYTES"));
        for (const std::string& must :
             {std::string("host-oneshot"), std::string("host-twoshot"), std::string("host-copy"),
              std::string("\"hostTransport\""), std::string("segmentBytes"),
              std::string("\"copyChunkBytes\""), llLimit}) {
          if (text.find(must) == std::string::npos) {
            ++failures;
            report(std::string("FAIL explain lacks ") + must + "\n");
          }
        }
        return releaseRank(comm, nullptr, {}, failures);
      });
  expectRanksExitedZero(results);
}

TEST(HostWireGpu, MissingPeerOnHostPathTimesOutNamingIt) {
  REQUIRE_GPU();
  // host-oneshot at 8 KB takes the low-latency protocol (flag in every line), at 128 KB the
  // flag protocol; each has its own wait. host-copy: one chunk (its first chunk wait), and 1 MiB
  // in four chunks (the later chunk waits must give up at once after the first failed).
  struct Case {
    anyrAlgo_t algo;
    uint64_t count;
  };
  for (const Case& c : {Case{anyrAlgoHostOneShot, 4096}, Case{anyrAlgoHostOneShot, 65536},
                        Case{anyrAlgoHostTwoShot, 4096}, Case{anyrAlgoHostCopy, 4096},
                        Case{anyrAlgoHostCopy, 1u << 19}}) {
    const anyrAlgo_t algo = c.algo;
    const uint64_t count = c.count;
    auto results =
        runRanksWith(2, 120, missingPeerRank, algo, count, std::string(anyrAlgoName(algo)),
                     std::string("host-memory"), 0.0, OnComm());
    expectRanksExitedZero(
        results, std::string(anyrAlgoName(algo)) + " count " + std::to_string(count) + ": ");
  }
}

}  // namespace
}  // namespace anyr
