// Communicator configuration after resolution: explicit anyrConfig_t fields first, then the
// environment (src/base/env.cc), then defaults. Validated; errors name the field and rule.
#pragma once

#include <cstdint>
#include <string>

#include "anyreduce/anyreduce.h"

namespace anyr {

// ANYR_FABRIC: measure the fabric at init unless a matching record is cached with the tuning
// table (Measure), use a cached record only (Cached), or neither (Off).
enum class FabricMode : int32_t { Measure = 0, Cached = 1, Off = 2 };

// ANYR_EPILOGUE_HINTS: whether the standalone add + RMSNorm kernel's loads carry cache eviction
// hints: by its rule (Auto), never (Off) or always (On; where the kernel has them); fused.h's
// AddRmsNormHints. A per-process timing choice: the bits are the same either way.
enum class HintsMode : int32_t { Auto = 0, Off = 1, On = 2 };

struct Config {
  anyrAlgo_t algorithm = anyrAlgoAuto;
  int timeoutMs = 30000;
  uint64_t oneShotMaxBytes = 0;  // 0: derived from the world size
  uint64_t twoShotMaxBytes = 0;  // 0: default
  uint64_t chunkBytes = 8ull << 20;
  bool useNccl = true;
  int maxBlocks = 0;  // 0: automatic
  // Thread-block cluster size of the fused all-reduce + RMSNorm kernels (one-shot and the
  // two-shot's register form): 0 = automatic, 1 = off, 2, 4 or 8 (where the probe admits them).
  int fusedCluster = 0;
  // Dispatch tuning (select/tuning.h). Not part of Wire: rank 0's values are broadcast by the
  // communicator's tuning step, and only rank 0 reads or writes the file.
  std::string tuningFile;            // "" : none
  int tuneBudgetMs = 0;              // > 0: tune at init (when no matching table was loaded)
  anyrWire_t wire = anyrWireNative;  // host-memory algorithms' wire format
  anyrPeerMemory_t peerMemory = anyrPeerMemoryAuto;  // how peers map each other's workspace
  // The fabric measurement at init (ANYR_FABRIC; core/fabric.h): measured, a cached record
  // only, or neither. Rank 0's value, through Wire.
  FabricMode fabric = FabricMode::Measure;
  // Largest message the host one-shot sends with its low-latency protocol (native wire only):
  // set by the host transport from rank 0's ANYR_HOST_LL_BYTES, so agreed; 0 until then. Not
  // part of Wire; read by the dispatch cost model.
  uint64_t hostLowLatencyBytes = 0;
  // Low-latency launches of at most this many bytes poll every line from every thread (rank 0's
  // ANYR_HOST_LL_EAGER_BYTES, set by the host transport). Not part of Wire.
  uint64_t hostLowLatencyEagerBytes = 0;
  // host-copy's chunk (the layout's copyChunkBytes, from rank 0's ANYR_HOST_COPY_CHUNK_BYTES):
  // set by the host transport, so agreed; 0 until then (or without one). Not part of Wire.
  uint64_t hostCopyChunkBytes = 0;
  // The host algorithms' launch size (the layout's launchBytes, from rank 0's
  // ANYR_HOST_LAUNCH_BYTES): set by the host transport, so agreed; 0 until then. Not part of Wire.
  uint64_t hostLaunchBytes = 0;
  // The islands of the two-level all-reduce ("islands") forced by ANYR_ISLANDS, packed
  // (parseIslands); 0: derived from the topology (topology/islands.h). Rank 0's, so agreed.
  uint32_t islands = 0;
  // The standalone epilogue's cache hints (ANYR_EPILOGUE_HINTS; each rank its own: the bits do
  // not depend on them). Not part of Wire.
  HintsMode epilogueHints = HintsMode::Auto;

  // Crosses process boundaries (rank 0's resolved config is broadcast): fixed layout.
  struct Wire {
    int32_t algorithm, timeoutMs, useNccl, maxBlocks;
    uint64_t oneShotMaxBytes, twoShotMaxBytes, chunkBytes;
    int32_t wire, fusedCluster, peerMemory, fabric;
    uint32_t islands;
  };
  Wire toWire() const;
  static Config fromWire(const Wire& w);
  bool operator==(const Config& o) const;
  std::string describe() const;
};
static_assert(sizeof(Config::Wire) == 64, "Config::Wire layout");

Config resolveConfig(const anyrConfig_t* user);

// The rules resolveConfig applies to config.maxBlocks / ANYR_MAX_BLOCKS and to
// config.fusedCluster / ANYR_FUSED_CLUSTER, and their text: the one place the valid values are
// listed (the command line's --max-blocks and --fused-cluster check with them too).
bool maxBlocksValid(int64_t v);
bool fusedClusterValid(int64_t v);
extern const char* const kMaxBlocksRule;     // "must be in 0..256 (0 = automatic)"
extern const char* const kFusedClusterRule;  // "must be 0 (automatic), 1 (off), 2, 4 or 8"

// ANYR_ISLANDS, the islands the two-level all-reduce uses instead of the topology's: islands
// separated by ',', each one rank, a range "a-b", or several of those joined by '+', every rank
// in 0..7 (the peer-mapped ranks) at most once: "0-3,4-7", "0+2+4+6,1+3+5+7", "0-2,3-5,6-7".
// "" or "auto": from the topology. Packed as 4 bits a rank (bits 4r..4r+3: rank r's island + 1,
// islands numbered by their lowest rank; 0: rank r in none), so that it crosses in Config::Wire;
// 0 for "auto". parseIslands returns false with the rule broken in *why.
bool parseIslands(const std::string& text, uint32_t* packed, std::string* why);
// The packed form as text, islands by their lowest rank, ranges collapsed: "0-3,4-7"; "auto"
// for 0.
std::string islandsText(uint32_t packed);
// "" when `packed` puts every rank 0..nranks-1 in exactly one island and names no other rank;
// else the rule broken ("rank 5 is in no island"). 0 (auto) always passes.
std::string islandsCoverError(uint32_t packed, int nranks);
// The island of `rank` (0-based), or -1 when it is in none.
inline int islandOfRank(uint32_t packed, int rank) {
  if (rank < 0 || rank >= 8) return -1;
  return static_cast<int>((packed >> (4 * rank)) & 0xfu) - 1;
}
extern const char* const kIslandsRule;

// "auto", "oneshot-push", ... <-> anyrAlgo_t, through the public anyrAlgoName (the C API
// answers it from the algorithm registry, algo/registry.h, which this floor may not include).
// parseAlgo returns false for an unknown name.
bool parseAlgo(const std::string& name, anyrAlgo_t* out);
std::string algoNames();  // "auto, oneshot-push, ...": every name, in enum order

// "native", "fp8", "int8" <-> anyrWire_t. parseWire returns false for an unknown name.
bool parseWire(const std::string& name, anyrWire_t* out);
const char* wireName(anyrWire_t w);
// "none", "auto", "cuda-ipc", "vmm" <-> anyrPeerMemory_t; parsePeerMemory also takes "0"
// (none) and "1" (auto), the variable's former values. False for anything else.
bool parsePeerMemory(const std::string& name, anyrPeerMemory_t* out);
const char* peerMemoryName(anyrPeerMemory_t k);
// "measure", "cached", "off" <-> FabricMode; parseFabricMode also takes "1" (measure) and "0"
// (off). False for anything else.
bool parseFabricMode(const std::string& name, FabricMode* out);
const char* fabricModeName(FabricMode m);
// "auto", "off", "on" <-> HintsMode; parseHintsMode also takes "0" (off) and "1" (on).
bool parseHintsMode(const std::string& name, HintsMode* out);
const char* hintsModeName(HintsMode m);
// ANYR_EPILOGUE_HINTS, parsed; throws anyrInvalidArgument naming the variable and its values.
HintsMode epilogueHintsFromEnv();

}  // namespace anyr
