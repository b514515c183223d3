// Kernels of the fabric measurement (core/fabric.h) over the mapped peer workspace: timed copies
// into or out of peers' measurement regions (their staging), a one-sided flag round trip to a
// peer's memory, and, every rank at once, a flag barrier, synchronisation rounds (every peer) and
// one-partner rounds (the next rank).
// Every wait is bounded by the given timeout; a wait that runs out records what it waited for
// in this rank's status and writes the abort value into every flag this rank owns at its peers,
// so that their waits for it end at once instead of running out too. A kernel launched after a
// failure recorded in the status does nothing. Launchers return the launch error and never
// synchronize.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "device/handles.h"
#include "transport/check.h"

namespace anyr {

// Flag words of each source rank's line in a workspace's CheckArea::fabric.
constexpr int kFabricBarrierWord = 0;
constexpr int kFabricSyncWord = 1;
constexpr int kFabricLatencyWord = 2;
constexpr int kFabricHopWord = 3;
// Written into a rank's flags at its peers when it gives up: any wait on them ends.
constexpr uint32_t kFabricAbort = 0xffffffffu;

// Status of one rank's measurement (its own device memory). code: kFabricOk, or what ended it.
constexpr int32_t kFabricOk = 0;
constexpr int32_t kFabricTimedOut = 1;    // this rank's wait for `peer` ran out
constexpr int32_t kFabricPeerGaveUp = 2;  // `peer` gave up and said so
// What was waited for (FabricStatus::what).
constexpr int32_t kFabricWhatBarrier = 1;
constexpr int32_t kFabricWhatSync = 2;
constexpr int32_t kFabricWhatRoundTrip = 3;
constexpr int32_t kFabricWhatHop = 4;
struct FabricStatus {
  int32_t code;
  int32_t peer;   // the rank waited for
  int32_t what;   // kFabricWhat*
  uint32_t step;  // the barrier's sequence number, or the round
};

// One timing, %globaltimer ns: the host sets start to ~0 and end to 0 before the kernel; a copy
// kernel's blocks take the earliest start and the latest end (after a system-scope fence, so the
// stores have left), a single-thread kernel writes both.
struct FabricTimes {
  unsigned long long startNs;
  unsigned long long endNs;
};

// Up to kMaxLocalRanks copies of n16 16-byte units each, all in one launch (blocks split evenly
// between them; `blocks` is rounded down to a multiple of segs). Loads bypass L1 (a peer's
// memory read once), stores are system-scope volatile (they leave at once), as the peer
// algorithms do.
struct FabricCopy {
  void* dst[kMaxLocalRanks];
  const void* src[kMaxLocalRanks];
  int segs;
  uint64_t n16;
};

// Every rank's flags and measurement region, as this rank maps them (own included).
struct FabricPeers {
  uint32_t* flags[kMaxLocalRanks];  // each rank's CheckArea::fabric, [source rank][word]
  char* region[kMaxLocalRanks];     // each rank's measurement region
  uint64_t slotBytes;               // rank s writes only into slot s of a peer's region
  int rank;
  int nranks;
  unsigned long long timeoutNs;  // bound of every wait
};

// Loads every kernel of the measurement on the current device (cudaFuncGetAttributes), so that
// no launch in the middle of it waits for lazy loading (which may wait for this context's
// kernels, themselves waiting for peers).
cudaError_t preloadFabricKernels();

cudaError_t launchFabricCopy(const FabricCopy& c, int blocks, FabricTimes* times,
                             const FabricStatus* status, cudaStream_t stream);
// `word` is in a peer's memory: `warm` then `rounds` times, store the next value and load it
// back until it reads so (one round trip each); times covers the timed rounds.
cudaError_t launchFabricRoundTrip(uint32_t* word, int peer, int warm, int rounds,
                                  unsigned long long timeoutNs, FabricTimes* times,
                                  FabricStatus* status, cudaStream_t stream);
// Raises this rank's barrier word at every peer to `seq` and waits for every peer's to reach it.
cudaError_t launchFabricBarrier(const FabricPeers& p, uint32_t seq, FabricStatus* status,
                                cudaStream_t stream);
// `warm` then `rounds` rounds r = 1, 2, ...: 1 KB into every peer's slot, then this rank's sync
// word at every peer raised to r; wait for every peer's to reach r. times covers the timed
// rounds.
cudaError_t launchFabricSyncRounds(const FabricPeers& p, int warm, int rounds, FabricTimes* times,
                                   FabricStatus* status, cudaStream_t stream);
// The same rounds with one partner: 1 KB into the next rank's slot ((rank + 1) % n), this
// rank's hop word there raised to r; wait for the previous rank's to reach r. Every rank has
// one flow out and one in at a time, as in a round of the staged and doubling pushes; with
// every rank at once a round's time is the ring's mean hop.
cudaError_t launchFabricHopRounds(const FabricPeers& p, int warm, int rounds, FabricTimes* times,
                                  FabricStatus* status, cudaStream_t stream);

}  // namespace anyr
