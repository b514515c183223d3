// The tools' helpers over the public C API (include/anyreduce/anyreduce.h): errors as
// exceptions, the text and JSON results, and the library's names and rules as the command
// line needs them. Nothing here reaches the library's internals.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>

#include "anyreduce/anyreduce.h"
#include "common/comm_flags.h"

namespace anyr {
namespace tool {

// A failed library call: what() is the library's message without the "<function>: " prefix
// anyrGetLastError puts before it, as the tools print it ("anyreduce: <message>").
struct ApiError : std::runtime_error {
  ApiError(anyrResult_t code, const std::string& message)
      : std::runtime_error(message), result(code) {}
  anyrResult_t result;
};

// The last error of `comm` (or of this thread when NULL) without the "<fn>: " prefix.
std::string lastErrorOf(anyrComm_t comm, const char* fn);

// Throws ApiError for r != anyrSuccess (the message of `comm`, or of this thread).
void check(anyrResult_t r, anyrComm_t comm, const char* fn);

// The text a call of the anyrCommExplain kind returns: call(buf, len, needed) is made with a
// buffer of `firstLen` bytes, and again with one of *needed bytes when that was too short.
using TextCall = std::function<anyrResult_t(char* buf, size_t len, size_t* needed)>;
std::string textOf(const TextCall& call, anyrComm_t comm, const char* fn,
                   size_t firstLen = 1 << 16);

// "auto", "oneshot-push", ... (anyrAlgoName) -> anyrAlgo_t; false for an unknown name.
bool parseAlgo(const std::string& name, anyrAlgo_t* out);
// Every algorithm's name, comma-separated, in enum order: "auto, oneshot-push, ...".
std::string algoNames();
// "none", "auto", "cuda-ipc", "vmm" (anyrPeerMemoryName) -> anyrPeerMemory_t.
bool parsePeerMemory(const std::string& name, anyrPeerMemory_t* out);
// The library's version, "0.1.0" (anyrGetVersion).
std::string libraryVersion();
// A size as the library's environment variables take it ("4096", "64K", "8M"; anyrParseSize).
bool parseSize(const std::string& text, uint64_t* out);

// The fused operation's row-width rule (anyreduce.h): the multiple `hidden` must be of with
// quantization `quant`, and whether `hidden` keeps the rule.
constexpr int fusedHiddenMultiple(int quant) {
  return quant == anyrQuantNvfp4 ? ANYR_FUSED_NVFP4_HIDDEN_MULTIPLE : ANYR_FUSED_HIDDEN_MULTIPLE;
}
constexpr bool fusedHiddenValid(uint64_t hidden, int quant = anyrQuantNone) {
  return hidden >= ANYR_FUSED_MIN_HIDDEN && hidden <= ANYR_FUSED_MAX_HIDDEN &&
         hidden % static_cast<uint64_t>(fusedHiddenMultiple(quant)) == 0;
}

// Selects the rank's GPU (rank % ngpus) and creates its communicator with `timeoutMs` (0: the
// library's), `wire` (anyrWire_t; -1: the environment's) and the CommFlags set (the rest from
// the environment); *nccl receives the communicator's NCCL communicator (ncclComm_t), or NULL.
// Throws std::runtime_error naming the failed call.
anyrComm_t openRankComm(int rank, int nranks, const anyrUniqueId& id, int ngpus, int timeoutMs,
                        int wire, const CommFlags& flags, void** nccl);

}  // namespace tool
}  // namespace anyr
