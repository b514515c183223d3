// Host side of the fused add + RMSNorm (+ quantization): the argument rules shared by
// anyrAllReduceAddRmsNorm and anyrAddRmsNorm, and the C boundary of anyrAddRmsNorm.
#include "fused/fused.h"

#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <utility>

#include "anyreduce/anyreduce.h"
#include "api/boundary.h"
#include "base/env.h"
#include "base/error.h"
#include "base/log.h"
#include "base/validate.h"
#include "topology/probe.h"

namespace anyr {
namespace {

const anyrFusedOptions_t kDefaultOptions = ANYR_FUSED_OPTIONS_INITIALIZER;

std::string formatFloat(float v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// Two buffers of `bytes` each must be the same buffer or disjoint.
void requireSameOrDisjoint(const void* a, const char* aName, const void* b, const char* bName,
                           size_t bytes) {
  if (a == nullptr || b == nullptr || a == b) return;
  const uintptr_t pa = reinterpret_cast<uintptr_t>(a);
  const uintptr_t pb = reinterpret_cast<uintptr_t>(b);
  const bool disjoint = pa + bytes <= pb || pb + bytes <= pa;
  ANYR_REQUIRE_ARG(disjoint, aName,
                   std::string("partly overlaps ") + bName +
                       " (it must be the same buffer, in place, or not overlap at all)");
}

// Buffer a (aBytes) and buffer b (bBytes) share no byte; otherwise the error names a, b and
// `rule`.
void requireDisjoint(const void* a, size_t aBytes, const char* aName, const void* b, size_t bBytes,
                     const char* bName, const char* rule) {
  if (a == nullptr || b == nullptr) return;
  const uintptr_t pa = reinterpret_cast<uintptr_t>(a);
  const uintptr_t pb = reinterpret_cast<uintptr_t>(b);
  ANYR_REQUIRE_ARG(pa + aBytes <= pb || pb + bBytes <= pa, aName,
                   std::string("overlaps ") + bName + " (" + rule + ")");
}

// A byte output (quantOut and the block scales) overlaps no other buffer of the call.
constexpr const char* kQuantRule =
    "a quantized output must not overlap any other buffer of the call";
// weight and the quantization scale are read for every row while rows of the outputs are
// written (by other blocks, in any order): overlapping an output, wholly or partly, they would
// be read half-overwritten. Read-only buffers may overlap each other.
constexpr const char* kReadForEveryRowRule =
    "it is read for every row while the outputs are written, so it must not overlap any output "
    "buffer";

}  // namespace

void validateFused(const void* input, const char* inputName, const void* residualIn,
                   const void* residualOut, const void* weight, float epsilon, const void* normOut,
                   size_t tokens, size_t hidden, anyrDataType_t datatype,
                   const anyrFusedOptions_t* options) {
  // Values.
  ANYR_REQUIRE_ARG(datatype == anyrBfloat16 || datatype == anyrFloat16, "datatype",
                   datatype == anyrFloat32 ? std::string("fused op supports bf16 and fp16")
                                           : "fused op supports bf16 and fp16 (got " +
                                                 std::to_string(static_cast<int>(datatype)) + ")");
  ANYR_REQUIRE_ARG(fusedHiddenValid(hidden), "hidden",
                   std::to_string(hidden) + " is not a multiple of 8 in " +
                       std::to_string(kFusedMinHidden) + ".." + std::to_string(kFusedMaxHidden));
  ANYR_REQUIRE_ARG(tokens <= static_cast<size_t>(INT32_MAX), "tokens",
                   std::to_string(tokens) + " exceeds 2147483647");
  ANYR_REQUIRE_ARG(epsilon > 0.0f && std::isfinite(epsilon), "epsilon",
                   "must be positive and finite (got " + formatFloat(epsilon) + ")");
  if (options != nullptr) {
    checkVersionedStruct("options", options->magic, ANYR_FUSED_MAGIC, options->size,
                         sizeof(anyrFusedOptions_t), "ANYR_FUSED_OPTIONS_INITIALIZER");
  }
  const anyrFusedOptions_t& o = options != nullptr ? *options : kDefaultOptions;
  ANYR_REQUIRE_ARG(o.quant >= anyrQuantNone && o.quant < anyrNumQuants, "options.quant",
                   "unknown quantization " + std::to_string(o.quant) +
                       " (anyrQuantNone, anyrQuantFp8 or anyrQuantNvfp4)");
  ANYR_REQUIRE_ARG(o.quant != anyrQuantNvfp4 || hidden % kNvfp4BlockElems == 0, "hidden",
                   std::to_string(hidden) + " is not a multiple of 16, as NVFP4 needs");
  if (tokens == 0) return;

  // Buffers.
  const size_t esize = 2;  // bf16 / fp16
  const size_t rowBytes = tokens * hidden * esize;
  ANYR_REQUIRE_ARG(input != nullptr, inputName, "must not be NULL");
  ANYR_REQUIRE_ARG(weight != nullptr, "weight", "must not be NULL");
  ANYR_REQUIRE_ARG(residualIn == nullptr || residualOut != nullptr, "residualOut",
                   "must not be NULL when residualIn is given");
  ANYR_REQUIRE_ARG(normOut != nullptr || o.quant != anyrQuantNone, "normOut",
                   "must not be NULL unless a quantized output is requested");
  if (o.quant != anyrQuantNone) {
    ANYR_REQUIRE_ARG(o.scale != nullptr, "options.scale",
                     o.quant == anyrQuantFp8 ? "FP8 needs the per-tensor scale (device pointer)"
                                             : "NVFP4 needs the global scale (device pointer)");
    ANYR_REQUIRE_ARG(o.quantOut != nullptr, "options.quantOut",
                     "must not be NULL when quant is FP8 or NVFP4");
    checkAligned(o.scale, sizeof(float), "options.scale");
  }
  if (o.quant == anyrQuantNvfp4) {
    ANYR_REQUIRE_ARG(o.blockScales != nullptr || o.blockScalesSwizzled != nullptr,
                     "options.blockScales",
                     "NVFP4 needs blockScales or blockScalesSwizzled (both NULL)");
  }
  checkAligned(input, esize, inputName);
  checkAligned(weight, esize, "weight");
  checkAligned(residualIn, esize, "residualIn");
  checkAligned(residualOut, esize, "residualOut");
  checkAligned(normOut, esize, "normOut");
  requireSameOrDisjoint(residualOut, "residualOut", residualIn, "residualIn", rowBytes);
  requireSameOrDisjoint(residualOut, "residualOut", input, inputName, rowBytes);
  requireSameOrDisjoint(normOut, "normOut", input, inputName, rowBytes);
  requireSameOrDisjoint(normOut, "normOut", residualIn, "residualIn", rowBytes);
  if (o.quant != anyrQuantNone) {
    const size_t cols = hidden / kNvfp4BlockElems;
    const bool nvfp4 = o.quant == anyrQuantNvfp4;
    struct Buf {
      const void* p;
      size_t bytes;
      const char* name;
    };
    const Buf outs[3] = {
        {o.quantOut, nvfp4 ? tokens * hidden / 2 : tokens * hidden, "options.quantOut"},
        {nvfp4 ? o.blockScales : nullptr, tokens * cols, "options.blockScales"},
        {nvfp4 ? o.blockScalesSwizzled : nullptr,
         static_cast<size_t>(
             swizzledScaleBytes(static_cast<int64_t>(tokens), static_cast<int64_t>(cols))),
         "options.blockScalesSwizzled"}};
    const Buf rows[6] = {
        {input, rowBytes, inputName},           {residualIn, rowBytes, "residualIn"},
        {residualOut, rowBytes, "residualOut"}, {normOut, rowBytes, "normOut"},
        {weight, hidden * esize, "weight"},     {o.scale, sizeof(float), "options.scale"}};
    for (int i = 0; i < 3; ++i) {
      for (const Buf& b : rows)
        requireDisjoint(outs[i].p, outs[i].bytes, outs[i].name, b.p, b.bytes, b.name, kQuantRule);
      for (int j = 0; j < i; ++j) {
        requireDisjoint(outs[i].p, outs[i].bytes, outs[i].name, outs[j].p, outs[j].bytes,
                        outs[j].name, kQuantRule);
      }
    }
  }
  if (normOut != nullptr && residualOut != nullptr) {
    const uintptr_t pn = reinterpret_cast<uintptr_t>(normOut);
    const uintptr_t pr = reinterpret_cast<uintptr_t>(residualOut);
    ANYR_REQUIRE_ARG(pn + rowBytes <= pr || pr + rowBytes <= pn, "normOut",
                     "overlaps residualOut (they must be different buffers)");
  }
  // The row-sized outputs; the quantized ones were checked against weight and scale above.
  const void* scale = o.quant != anyrQuantNone ? o.scale : nullptr;
  for (const auto& out :
       {std::make_pair(residualOut, "residualOut"), std::make_pair(normOut, "normOut")}) {
    requireDisjoint(weight, hidden * esize, "weight", out.first, rowBytes, out.second,
                    kReadForEveryRowRule);
    requireDisjoint(scale, sizeof(float), "options.scale", out.first, rowBytes, out.second,
                    kReadForEveryRowRule);
  }
}

FusedParams makeFusedParams(const void* input, const char* inputName, const void* residualIn,
                            void* residualOut, const void* weight, float epsilon, void* normOut,
                            size_t tokens, size_t hidden, anyrDataType_t datatype,
                            const anyrFusedOptions_t* options) {
  validateFused(input, inputName, residualIn, residualOut, weight, epsilon, normOut, tokens, hidden,
                datatype, options);
  const anyrFusedOptions_t& o = options != nullptr ? *options : kDefaultOptions;
  FusedParams p{};
  p.residualIn = residualIn;
  p.residualOut = residualOut;
  p.weight = weight;
  p.normOut = normOut;
  p.epsilon = epsilon;
  p.tokens = static_cast<int>(tokens);
  p.hidden = static_cast<int>(hidden);
  p.weightPlusOne = o.weightPlusOne != 0 ? 1 : 0;
  p.quant = o.quant;
  if (o.quant != anyrQuantNone) {
    p.scale = o.scale;
    p.quantOut = o.quantOut;
  }
  if (o.quant == anyrQuantNvfp4) {
    p.blockScales = o.blockScales;
    p.blockScalesSwizzled = o.blockScalesSwizzled;
  }
  return p;
}

std::array<FusedBuffer, 9> fusedBuffers(const void* input, const char* inputName,
                                        const FusedParams& p) {
  return {{{input, inputName},
           {p.residualIn, "residualIn"},
           {p.residualOut, "residualOut"},
           {p.weight, "weight"},
           {p.normOut, "normOut"},
           {p.quantOut, "options.quantOut"},
           {p.blockScales, "options.blockScales"},
           {p.blockScalesSwizzled, "options.blockScalesSwizzled"},
           {p.scale, "options.scale"}}};
}

bool fusedBuffersAligned(const void* input, const FusedParams& p) {
  auto aligned = [](const void* ptr, uintptr_t bytes) {
    return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
  };
  const uintptr_t quantBytes = p.quant == anyrQuantFp8 ? 8 : 4;
  return aligned(input, 16) && aligned(p.residualIn, 16) && aligned(p.residualOut, 16) &&
         aligned(p.weight, 16) && aligned(p.normOut, 16) && aligned(p.quantOut, quantBytes);
}

namespace {

// How anyrAddRmsNorm launches: the automatic form, and programmatic dependent launch where the
// device's probe passed (topology/probe.h, dependentLaunchOn) and ANYR_PDL allows it, both read
// once per process. The probe runs on the first call whose stream is not capturing a graph;
// calls before it launch plainly. The kernel waits for the work before it ahead of any memory
// access, so only the launch's timing changes: a chain of calls overlaps each launch with the
// tail of the kernel before it (docs/DESIGN.md, "Programmatic dependent launch").
AddRmsNormLaunch standaloneLaunch(int device, bool capturing) {
  static const bool allowed = env::getInt("ANYR_PDL") != 0;
  static const bool early = env::getInt("ANYR_PDL_EARLY") != 0;
  AddRmsNormLaunch l;
  // Read once (a value that throws is read again by the next call, which throws too).
  static const HintsMode hints = epilogueHintsFromEnv();
  l.hints = hints;
  if (allowed && dependentLaunchOn(device, !capturing).works) {
    l.pdl = true;
    l.release = early ? AddRmsNormRelease::Auto : AddRmsNormRelease::AtExit;
  }
  return l;
}

}  // namespace
}  // namespace anyr

// ---- C boundary -----------------------------------------------------------------------------
// The one boundary idiom of src/api/boundary.h: the message is recorded for anyrGetLastError.
extern "C" {

anyrResult_t anyrAddRmsNorm(const void* x, const void* residualIn, void* residualOut,
                            const void* weight, float epsilon, void* normOut, size_t tokens,
                            size_t hidden, anyrDataType_t datatype,
                            const anyrFusedOptions_t* options, cudaStream_t stream) {
  return anyr::guarded(nullptr, "anyrAddRmsNorm", [&] {
    const anyr::FusedParams p =
        anyr::makeFusedParams(x, "x", residualIn, residualOut, weight, epsilon, normOut, tokens,
                              hidden, datatype, options);
    if (tokens == 0) return;  // a no-op: nothing is read, written or launched
    // The stream decides the device (the current one during capture, when CUDA cannot say);
    // every buffer must live there.
    int device = -1;
    const bool capturing = anyr::streamCapturing(stream);
    if (!capturing) {
      device = anyr::streamDevice(stream);
    } else {
      ANYR_CUDA_CHECK(cudaGetDevice(&device));
    }
    anyr::DeviceScope onDevice(device);
    for (const anyr::FusedBuffer& b : anyr::fusedBuffers(x, "x", p)) {
      anyr::requireDevicePointer(b.ptr, b.name, device, "the stream's device");
    }
    ANYR_CUDA_CHECK(anyr::launchAddRmsNormWith(datatype, x, p, stream,
                                               anyr::standaloneLaunch(device, capturing)));
  });
}

}  // extern "C"
