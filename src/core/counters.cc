#include "core/counters.h"

#include <initializer_list>

namespace anyr {

int counterBucket(uint64_t bytes) {
  int b = 0;
  for (uint64_t limit = 4096; b < ANYR_COUNTER_BUCKETS - 1 && bytes >= limit; limit *= 4) ++b;
  return b;
}

void CommCounters::note(anyrAlgo_t algo, uint64_t bytes, CallKind kind, bool forced,
                        bool capturing) {
  if (algo <= anyrAlgoAuto || algo >= anyrNumAlgos) return;  // nothing ran (no algorithm)
  const int b = counterBucket(bytes);
  calls_[algo][b].fetch_add(1, std::memory_order_relaxed);
  bytes_[algo][b].fetch_add(bytes, std::memory_order_relaxed);
  if (kind == CallKind::FusedKernel) fusedKernel_.fetch_add(1, std::memory_order_relaxed);
  if (kind == CallKind::FusedComposed) fusedComposed_.fetch_add(1, std::memory_order_relaxed);
  if (forced) forced_.fetch_add(1, std::memory_order_relaxed);
  if (capturing) captured_.fetch_add(1, std::memory_order_relaxed);
}

void CommCounters::noteFusedLaunch(int clusterBlocks) {
  const int i = clusterBlocks >= 8 ? 3 : clusterBlocks >= 4 ? 2 : clusterBlocks >= 2 ? 1 : 0;
  byCluster_[i].fetch_add(1, std::memory_order_relaxed);
}

void CommCounters::snapshot(anyrCounters_t* out) const {
  for (int a = 0; a < anyrNumAlgos; ++a) {
    for (int b = 0; b < ANYR_COUNTER_BUCKETS; ++b) {
      out->calls[a][b] = calls_[a][b].load(std::memory_order_relaxed);
      out->bytes[a][b] = bytes_[a][b].load(std::memory_order_relaxed);
    }
  }
  out->fusedKernelCalls = fusedKernel_.load(std::memory_order_relaxed);
  out->fusedComposedCalls = fusedComposed_.load(std::memory_order_relaxed);
  out->forcedCalls = forced_.load(std::memory_order_relaxed);
  out->capturedCalls = captured_.load(std::memory_order_relaxed);
  for (int i = 0; i < 4; ++i) {
    out->fusedLaunchesByCluster[i] = byCluster_[i].load(std::memory_order_relaxed);
  }
}

void CommCounters::reset() {
  for (int a = 0; a < anyrNumAlgos; ++a) {
    for (int b = 0; b < ANYR_COUNTER_BUCKETS; ++b) {
      calls_[a][b].store(0, std::memory_order_relaxed);
      bytes_[a][b].store(0, std::memory_order_relaxed);
    }
  }
  for (auto* c : {&fusedKernel_, &fusedComposed_, &forced_, &captured_}) {
    c->store(0, std::memory_order_relaxed);
  }
  for (auto& c : byCluster_) c.store(0, std::memory_order_relaxed);
}

}  // namespace anyr
