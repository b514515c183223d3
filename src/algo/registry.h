// The algorithm registry: one row per all-reduce algorithm (every anyrAlgo_t value but
// anyrAlgoAuto), in algo/registry.cc. Admission (select/admission.cc), the candidates and the
// seed cost model (select/dispatch.cc), explain, the startup self-test (core/selftest.cc), the
// communicator's launches (launchPeerAlgo, launchHostAlgo, shapeFor) and the short names that
// the configuration, ANYR_ALGO and the command line accept (anyrAlgoName) read the table; none
// of them names an algorithm where a row can say what it needs.
//
// Adding an algorithm takes three files:
//   1. its value in include/anyreduce/anyreduce.h (before anyrNumAlgos, its short name quoted in
//      the value's comment) and in python/anyreduce/_types.py, which python/tests/test_header.py
//      checks against the header;
//   2. src/algo/<name>.cu: its kernel, its launcher and (peer memory) its resident-blocks
//      function;
//   3. one row in src/algo/registry.cc: the launcher's declaration and the row. Its place in
//      the table is its place in the candidate order, which breaks ties between equal times.
// registry.cc checks at compile time that every enum value has exactly one row.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "algo/algo.h"
#include "algo/cost.h"
#include "anyreduce/anyreduce.h"
#include "device/handles.h"
#include "device/host_handles.h"
#include "topology/topology.h"

namespace anyr {

// Which memory an algorithm moves its data through: what admits it and which launch path the
// communicator takes.
enum class AlgoKind : uint8_t {
  PeerMemory,  // kernels over the peer-mapped workspace (Communicator::launchPeerAlgo)
  HostMemory,  // kernels or copies through the shared pinned host segment (launchHostAlgo)
  Nccl,        // ncclAllReduce on the communicator's NCCL communicator (no kernel of ours)
};
const char* algoKindName(AlgoKind k);  // "peer-memory", "host-memory", "nccl"

// What bounds the bytes one launch carries; larger messages run as several launches.
enum class LaunchCapacity : uint8_t {
  None,         // one call whatever the size (NCCL)
  PushSlot,     // a push receive slot of the peer workspace (WorkspaceLayout::pushSlotBytes)
  Chunk,        // a staging chunk of the peer workspace (WorkspaceLayout::chunkBytes)
  HostLaunch,   // a launch buffer of the host segment (HostLayout::launchBytes)
  IslandSlots,  // islands: the busiest owner's share in a two-shot push slot (islandLaunchBytes)
  RingCopy,     // ring-copy: kRingCopyLaunchBytes (algo/ring_plan.h), each launch filling its
                // pipeline once
};

// Facts about the communicator that are not per-pair topology: the admission rules' inputs
// besides the topology.
struct CommFacts {
  int nranks = 0;
  bool sameHost = true;         // every rank on one host
  bool distinctDevices = true;  // no two ranks on one GPU
  bool ncclAvailable = false;
  std::string ncclReason;  // why NCCL is unavailable ("" if available)
  bool peerMemory = true;  // a peer-mapped workspace exists
  std::string peerMemoryReason;
  bool hostMemory = false;  // a shared pinned host segment is mapped by every rank
  std::string hostMemoryReason;
  // The host segment's NUMA placement (transport/host_memory.h, HostPlacement), where the segment
  // exists: per rank the node its region prefers (-1: left to rank 0's own policy), and the
  // explain line (the nodes, or why a region or all of them were not placed).
  std::vector<int> hostRegionNodes;
  std::string hostPlacement;
  // The islands ANYR_ISLANDS forces (Config::islands, packed; rank 0's); 0: the topology's
  // (topology/islands.h).
  uint32_t islands = 0;
};

struct AlgoAdmission {
  bool admitted = false;
  std::string reason;  // why admitted ("every pair passed its peer-write check") or rejected
};

// The launchers' forms (algo/<name>.cu); each returns the launch's cudaError_t.
using PeerLaunchFn = cudaError_t (*)(anyrDataType_t, const AllReduceArgs&, const LaunchShape&,
                                     cudaStream_t);
using HostLaunchFn = cudaError_t (*)(anyrDataType_t, const HostArgs&, const LaunchShape&,
                                     cudaStream_t);
// host-copy forks side streams off the caller's and joins them back (HostCopyStreams).
using HostCopyLaunchFn = cudaError_t (*)(anyrDataType_t, const HostCopyArgs&, const LaunchShape&,
                                         const HostCopyStreams&, cudaStream_t);
// ring-copy forks side streams off the caller's and joins them back (RingCopyStreams).
using PeerCopyLaunchFn = cudaError_t (*)(anyrDataType_t, const AllReduceArgs&, const LaunchShape&,
                                         const RingCopyStreams&, cudaStream_t);
// Lowers *least to the fewest blocks of kAlgoThreads threads of the algorithm's kernel (every
// dtype, alignment and wire variant) that one SM of the current device holds.
using ResidentPerSmFn = cudaError_t (*)(int* least);
// Admission: a pure function of agreed inputs, so every rank gets the same answer and reason.
using AdmitFn = AlgoAdmission (*)(const Topology&, const CommFacts&);
// Seed cost of one all-reduce of `bytes` (algo/cost.h); < 0: no number.
using SeedUsFn = double (*)(double bytes, const CostInputs&);

// A fused kernel built on an algorithm: its all-reduce and the add+RMSNorm epilogue in one
// kernel (fused/fused_algo.h). The communicator launches it (launchFusedRows).
struct FusedVariant {
  const char* kernel;  // "fused one-shot push" (its file: fused/fused_oneshot_push.cu)
  size_t smemBytes;    // shared memory one block needs (above 48 KB a block opts in)
  bool denseForm;      // it has the dense register form for more rows than SMs, which the
                       // startup self-test runs too
  // Modelled time from its all-reduce's, the epilogue's local traffic time and the bytes.
  double (*seedUs)(double allReduceUs, double localUs, double bytes);
  // It has a thread-block cluster form (fused/fused_algo.h, fusedClusterSize); without one
  // every launch runs a block per row, and a path may not force a cluster size on it.
  bool clusterForm = false;
};

// One row. Build rows with the constexpr setters below (registry.cc).
struct AlgoInfo {
  anyrAlgo_t algo = anyrAlgoAuto;
  // The short name: what anyrAlgoName returns and the configuration, ANYR_ALGO, --algo and
  // tuning tables accept.
  const char* name = nullptr;
  AlgoKind kind = AlgoKind::PeerMemory;
  // Launchers, those of its kind: a peer-memory row has `launch` and `residentPerSm` (its
  // kernels' blocks must be resident together), or `launchPeerCopy` (copies and kernels on side
  // streams, none waiting for another block); a host-memory row `launchHost` (optionally
  // `launchHostLowLatency`, for native-wire messages up to the host layout's llMaxBytes) or
  // `launchHostCopy` instead; an NCCL row none.
  PeerLaunchFn launch = nullptr;
  ResidentPerSmFn residentPerSm = nullptr;
  HostLaunchFn launchHost = nullptr;
  HostLaunchFn launchHostLowLatency = nullptr;
  HostCopyLaunchFn launchHostCopy = nullptr;
  PeerCopyLaunchFn launchPeerCopy = nullptr;
  LaunchCapacity capacity = LaunchCapacity::None;
  // A launch's grid covers 1/nranks of the message's vectors (the reduce-scatter forms);
  // otherwise all of them (Launcher::shapeFor, core/launch.cc).
  bool perRankShare = false;
  const FusedVariant* fused = nullptr;  // none: the fused operations compose it with the epilogue
  AdmitFn admit = nullptr;
  SeedUsFn seedUs = nullptr;

  constexpr AlgoInfo(anyrAlgo_t a, const char* n, AlgoKind k) : algo(a), name(n), kind(k) {}
  constexpr AlgoInfo peer(PeerLaunchFn l, ResidentPerSmFn r, LaunchCapacity c) const {
    AlgoInfo x = *this;
    x.launch = l;
    x.residentPerSm = r;
    x.capacity = c;
    return x;
  }
  constexpr AlgoInfo peerCopy(PeerCopyLaunchFn l) const {
    AlgoInfo x = *this;
    x.launchPeerCopy = l;
    x.capacity = LaunchCapacity::RingCopy;
    return x;
  }
  constexpr AlgoInfo host(HostLaunchFn l, HostLaunchFn lowLatency = nullptr) const {
    AlgoInfo x = *this;
    x.launchHost = l;
    x.launchHostLowLatency = lowLatency;
    x.capacity = LaunchCapacity::HostLaunch;
    return x;
  }
  constexpr AlgoInfo hostCopy(HostCopyLaunchFn l) const {
    AlgoInfo x = *this;
    x.launchHostCopy = l;
    x.capacity = LaunchCapacity::HostLaunch;
    return x;
  }
  constexpr AlgoInfo splitPerRank() const {
    AlgoInfo x = *this;
    x.perRankShare = true;
    return x;
  }
  constexpr AlgoInfo fusedKernel(const FusedVariant* f) const {
    AlgoInfo x = *this;
    x.fused = f;
    return x;
  }
  constexpr AlgoInfo admission(AdmitFn f) const {
    AlgoInfo x = *this;
    x.admit = f;
    return x;
  }
  constexpr AlgoInfo cost(SeedUsFn f) const {
    AlgoInfo x = *this;
    x.seedUs = f;
    return x;
  }
};

// The rows, in candidate order (the order breaks ties, so every rank must use the same one).
struct AlgoRows {
  const AlgoInfo* first;
  size_t count;
  const AlgoInfo* begin() const { return first; }
  const AlgoInfo* end() const { return first + count; }
};
AlgoRows algoRegistry();

// The row of `a`; nullptr for anyrAlgoAuto and values outside the enum. O(1).
const AlgoInfo* findAlgo(anyrAlgo_t a);
// The row of `a`; anyrInternalError for a value without one.
const AlgoInfo& algoInfo(anyrAlgo_t a);
// "auto", a row's short name; NULL outside the enum: what anyrAlgoName returns.
const char* algoName(anyrAlgo_t a);

}  // namespace anyr
