// The steps of the two-shot push protocol (twoshot_push.cu): scatter, clear, reduce, over the
// buffers of twoShotArea. The launch's vectors are cut into n segments of L vectors (V in all);
// thread `first` of the grid handles vectors first, first + stride, ... of every segment. The
// fused two-shot push (fused/fused_twoshot_push.cu, scatterRows and clearAndReduce) runs the
// same steps on the same buffers; it keeps its own copy until sharing these is shown not to
// change its register use (its 128-register forms spilled more when it called them).
#pragma once

#include "device/lamport.cuh"

namespace anyr {
namespace dev {

struct SegmentGrid {
  uint64_t L, V, stride, first;
  __device__ __forceinline__ SegmentGrid(uint64_t segmentVecs, uint64_t vecs)
      : L(segmentVecs),
        V(vecs),
        stride(static_cast<uint64_t>(gridDim.x) * blockDim.x),
        first(static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x) {}
};

// 1. Scatter: vector i of every peer's segment s into slot [rank] of s's scatter buffer (phase
// `phase`), nothing once the communicator stopped (stopRequested); then the push fence where
// the launch asks for it. load(v): this rank's input vector v.
template <typename T, typename Load>
__device__ __forceinline__ void twoShotScatter(const AllReduceArgs& a, const SegmentGrid& g,
                                               uint32_t phase, bool stopped, Load&& load) {
  const int rank = a.rank;
  const int n = a.nranks;
  const uint64_t slot = a.layout.tsSlotBytes;
  for (uint64_t i = g.first; i < g.L; i += g.stride) {
    for (int k = 1; k < n; ++k) {
      const int s = (rank + k) % n;
      const uint64_t v = static_cast<uint64_t>(s) * g.L + i;
      if (v >= g.V) continue;
      Vec x = load(v);
      sanitize<T>(x);
      if (opaque(stopped)) continue;  // nothing to peers once stopped
      storeSys(twoShotArea(a, s, phase, 0) + static_cast<uint64_t>(rank) * slot + i * 16, x.u);
    }
  }

  if (a.pushFence) __threadfence_system();
}

// 2. Clear, in this rank's own scatter and gather slots, what peers wrote one launch ago.
__device__ __forceinline__ void twoShotClear(const AllReduceArgs& a, const Phases& ph) {
  for (int g = 0; g < 2; ++g) {
    clearPeerSlots(twoShotArea(a, a.rank, ph.prev, g), a.layout.tsSlotBytes, a.nranks, a.rank,
                   a.state->tsVecs[ph.prev]);
  }
}

// 3. Reduce vector i of the own segment in rank order (fp32) as the peers' parts arrive in the
// own scatter slots, round and sanitize it, send it into slot [rank] of the gather buffers of
// ranks rank + kFirstDest, ..., rank + n - 1 (kFirstDest 1: the peers; 0: the own one too),
// and hand it to put(v, y). Returns false when a wait failed (nothing more is sent then).
template <typename T, int kFirstDest, typename Load, typename Put>
__device__ __forceinline__ bool twoShotReduce(const AllReduceArgs& a, const SegmentGrid& g,
                                              const Phases& ph, Waiter& waiter, Load&& load,
                                              Put&& put) {
  const int rank = a.rank;
  const int n = a.nranks;
  const uint64_t slot = a.layout.tsSlotBytes;
  bool ok = true;
  const char* scatter = twoShotArea(a, rank, ph.cur, 0);
  for (uint64_t i = g.first; i < g.L && ok; i += g.stride) {
    const uint64_t v = static_cast<uint64_t>(rank) * g.L + i;
    if (v >= g.V) break;
    float acc[Elem<T>::kPerVec] = {};
    for (int s = 0; s < n && ok; ++s) {
      Vec x;
      if (s == rank) {
        x = load(v);
        sanitize<T>(x);
      } else {
        ok =
            pollVec<T>(scatter + static_cast<uint64_t>(s) * slot + i * 16, &x, waiter, s, ph.epoch);
      }
      accumulate<T>(acc, x);
    }
    if (!ok) break;
    Vec y = packVec<T>(acc);
    sanitize<T>(y);
    for (int k = kFirstDest; k < n; ++k) {
      const int s = (rank + k) % n;
      storeSys(twoShotArea(a, s, ph.cur, 1) + static_cast<uint64_t>(rank) * slot + i * 16, y.u);
    }
    put(v, y);
  }
  return ok;
}

}  // namespace dev
}  // namespace anyr
