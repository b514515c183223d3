// Per-communicator call counters (anyrCommGetCounters): host-side, one note() per dispatch,
// relaxed atomics (a counter read races benignly with a call in flight on another thread).
#pragma once

#include <atomic>
#include <cstdint>

#include "anyreduce/anyreduce.h"

namespace anyr {

enum class CallKind { AllReduce, FusedKernel, FusedComposed };

// Size bucket of a message: <4K, <16K, <64K, <256K, <1M, <4M, <16M, >=16M.
int counterBucket(uint64_t bytes);

class CommCounters {
 public:
  void note(anyrAlgo_t algo, uint64_t bytes, CallKind kind, bool forced, bool capturing);
  // One fused-kernel launch in clusters of `clusterBlocks` (1: a block per row; 2, 4, 8).
  void noteFusedLaunch(int clusterBlocks);
  // Fills every counter field of *out (size and magic are the caller's).
  void snapshot(anyrCounters_t* out) const;
  void reset();

 private:
  std::atomic<uint64_t> calls_[anyrNumAlgos][ANYR_COUNTER_BUCKETS] = {};
  std::atomic<uint64_t> bytes_[anyrNumAlgos][ANYR_COUNTER_BUCKETS] = {};
  std::atomic<uint64_t> fusedKernel_{0};
  std::atomic<uint64_t> fusedComposed_{0};
  std::atomic<uint64_t> forced_{0};
  std::atomic<uint64_t> captured_{0};
  std::atomic<uint64_t> byCluster_[4] = {};
};

}  // namespace anyr
