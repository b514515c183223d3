#include "common/api.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <vector>

#include "common/comm_flags.h"
#include "common/timing.h"

namespace anyr {
namespace tool {

std::string lastErrorOf(anyrComm_t comm, const char* fn) {
  std::string msg = anyrGetLastError(comm);
  const std::string prefix = std::string(fn) + ": ";
  if (msg.compare(0, prefix.size(), prefix) == 0) msg.erase(0, prefix.size());
  return msg;
}

void check(anyrResult_t r, anyrComm_t comm, const char* fn) {
  if (r != anyrSuccess) throw ApiError(r, lastErrorOf(comm, fn));
}

std::string textOf(const TextCall& call, anyrComm_t comm, const char* fn, size_t firstLen) {
  std::vector<char> buf(firstLen);
  size_t needed = 0;
  check(call(buf.data(), buf.size(), &needed), comm, fn);
  if (needed > buf.size()) {
    buf.resize(needed);
    check(call(buf.data(), buf.size(), &needed), comm, fn);
  }
  return buf.data();
}

namespace {

// The value among the first `count` of E whose public name (nameOf) is `name`.
template <typename E>
bool parseNamed(const std::string& name, int count, const char* (*nameOf)(E), E* out) {
  for (int i = 0; i < count; ++i) {
    if (name == nameOf(static_cast<E>(i))) {
      *out = static_cast<E>(i);
      return true;
    }
  }
  return false;
}

}  // namespace

bool parseAlgo(const std::string& name, anyrAlgo_t* out) {
  return parseNamed(name, anyrNumAlgos, anyrAlgoName, out);
}

std::string algoNames() {
  std::string s;
  for (int i = 0; i < anyrNumAlgos; ++i)
    s += std::string(i ? ", " : "") + anyrAlgoName(static_cast<anyrAlgo_t>(i));
  return s;
}

bool parsePeerMemory(const std::string& name, anyrPeerMemory_t* out) {
  return parseNamed(name, anyrNumPeerMemories, anyrPeerMemoryName, out);
}

std::string libraryVersion() {
  int v = 0;
  if (anyrGetVersion(&v) != anyrSuccess) return "unknown";
  return std::to_string(v / 10000) + "." + std::to_string((v / 100) % 100) + "." +
         std::to_string(v % 100);
}

bool parseSize(const std::string& text, uint64_t* out) {
  size_t v = 0;
  if (anyrParseSize(text.c_str(), &v) != anyrSuccess) return false;
  *out = v;
  return true;
}

anyrComm_t openRankComm(int rank, int nranks, const anyrUniqueId& id, int ngpus, int timeoutMs,
                        int wire, const CommFlags& flags, void** nccl) {
  BENCH_CUDA(cudaSetDevice(rank % ngpus));
  anyrConfig_t cfg = ANYR_CONFIG_INITIALIZER;
  if (timeoutMs > 0) cfg.timeoutMs = timeoutMs;
  if (wire >= 0) cfg.wire = wire;
  if (flags.maxBlocks >= 0) cfg.maxBlocks = flags.maxBlocks;
  if (flags.fusedCluster >= 0) cfg.fusedCluster = flags.fusedCluster;
  if (flags.peerMemory >= 0) cfg.peerMemory = flags.peerMemory;
  anyrComm_t comm = nullptr;
  BENCH_ANYR(anyrCommInitRankConfig(&comm, nranks, id, rank, &cfg), nullptr);
  BENCH_ANYR(anyrCommGetNcclComm(comm, nccl), comm);
  return comm;
}

}  // namespace tool
}  // namespace anyr
