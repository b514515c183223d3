// The steps of the islands protocol (algo/islands.cu: the schedule, the buffers, the order of
// the waits and why no wait depends on a later one), shared by the plain kernel and the fused
// one (fused/fused_islands.cu). Thread `first` of the grid takes vectors first, first + stride,
// ... of the launch (steps 1 and 4) and places first, first + stride, ... of this rank's slots
// (steps 2 and 3). load(v) is this rank's input vector v, sanitized.
#pragma once

#include "algo/islands_schedule.h"
#include "device/lamport.cuh"

namespace anyr {
namespace dev {

struct IslandsGrid {
  uint32_t V;       // vectors of the launch
  uint32_t L;       // vectors a slice
  uint32_t owned;   // places of this rank's slots (the slices it owns)
  uint32_t stride;  // threads of the grid
  uint32_t first;   // this thread's index in the grid
  int c;            // this rank's island
  uint32_t m;       // its size
  uint32_t k;       // this rank's index in it
  // Launches carry at most islandLaunchBytes: vector counts fit 32 bits.
  __device__ __forceinline__ IslandsGrid(const AllReduceArgs& a, uint64_t numVecs)
      : V(static_cast<uint32_t>(numVecs)),
        L(islands::sliceVecs(a.islands, V)),
        owned(islands::ownedVecs(a.islands, a.rank, L)),
        stride(gridDim.x * blockDim.x),
        first(blockIdx.x * blockDim.x + threadIdx.x),
        c(a.islands.islandOf[a.rank]),
        m(a.islands.size[c]),
        k(a.islands.indexOf[a.rank]) {}
};

// Place `place` of slot [src] of rank r's scatter (gather = 0) or gather (gather = 1) buffer of
// `phase`: where src's value (or result) of the vector at that place of r's slots lands.
__device__ __forceinline__ char* islandsSlot(const AllReduceArgs& a, int r, uint32_t phase,
                                             int gather, int src, uint32_t place) {
  return twoShotArea(a, r, phase, gather) + static_cast<uint64_t>(src) * a.layout.tsSlotBytes +
         static_cast<uint64_t>(place) * 16;
}

// Sends vector i of slice j (source rank `src`'s value x) into slot [src] of the scatter buffer
// of the slice's owner in every island but `own`.
__device__ __forceinline__ void islandsSendAcross(const AllReduceArgs& a, uint32_t phase, int own,
                                                  uint32_t j, uint32_t i, uint32_t L, int src,
                                                  const Vec& x) {
  const IslandMap& im = a.islands;
  for (int d = 0; d < im.count; ++d) {
    if (d == own) continue;
    const islands::Owner o = islands::ownerOf(im, d, j, i, L);
    storeSys(islandsSlot(a, o.rank, phase, 0, src, o.at), x.u);
  }
}

// 1. Gather: every vector of a slice another member of the island owns, to that member (slot
// [rank] of its scatter buffer); nothing once the communicator stopped. Then the push fence
// where the launch asks for it.
template <typename Load>
__device__ __forceinline__ void islandsGather(const AllReduceArgs& a, const IslandsGrid& g,
                                              uint32_t phase, bool stopped, Load&& load) {
  for (uint32_t v = g.first; v < g.V; v += g.stride) {
    const uint32_t j = v / g.L;
    const islands::Owner o = islands::ownerOf(a.islands, g.c, j, v - j * g.L, g.L);
    if (o.rank == a.rank) continue;
    const Vec x = load(v);
    if (opaque(stopped)) continue;  // nothing to peers once stopped
    storeSys(islandsSlot(a, o.rank, phase, 0, a.rank, o.at), x.u);
  }
  if (a.pushFence) __threadfence_system();
}

// 2. Exchange: the own and the island peers' values of every owned vector, to the slice's
// owners in the other islands, the peers' as they arrive. False when a wait failed.
template <typename T, typename Load>
__device__ __forceinline__ bool islandsExchange(const AllReduceArgs& a, const IslandsGrid& g,
                                                const Phases& ph, bool stopped, Waiter& waiter,
                                                Load&& load) {
  const IslandMap& im = a.islands;
  bool ok = true;
  for (uint32_t t = g.first; t < g.owned && ok; t += g.stride) {
    uint32_t j = 0;
    const uint32_t v = islands::ownedVector(im, a.rank, t, g.L, &j);
    if (v >= g.V) break;  // the places after it lie further past the end
    const uint32_t i = v - j * g.L;
    if (!opaque(stopped)) islandsSendAcross(a, ph.cur, g.c, j, i, g.L, a.rank, load(v));
    for (uint32_t p = 1; p < g.m && ok; ++p) {
      const int s = im.member[g.c][(g.k + p) % g.m];
      Vec x;
      ok = pollVec<T>(islandsSlot(a, a.rank, ph.cur, 0, s, t), &x, waiter, s, ph.epoch);
      if (ok) islandsSendAcross(a, ph.cur, g.c, j, i, g.L, s, x);
    }
  }
  return ok;
}

// 3. Reduce every owned vector in rank order (fp32), round and sanitize it, send it into slot
// [rank] of the gather buffers of the island's other members (kOwnToo: this rank's own too),
// and hand it to put(v, y). False when a wait failed (nothing more is sent then).
template <typename T, bool kOwnToo, typename Load, typename Put>
__device__ __forceinline__ bool islandsReduce(const AllReduceArgs& a, const IslandsGrid& g,
                                              const Phases& ph, Waiter& waiter, Load&& load,
                                              Put&& put) {
  const IslandMap& im = a.islands;
  const int rank = a.rank;
  bool ok = true;
  for (uint32_t t = g.first; t < g.owned && ok; t += g.stride) {
    uint32_t j = 0;
    const uint32_t v = islands::ownedVector(im, rank, t, g.L, &j);
    if (v >= g.V) break;
    float acc[Elem<T>::kPerVec] = {};
    for (int s = 0; s < a.nranks && ok; ++s) {
      Vec x;
      if (s == rank) {
        x = load(v);
      } else {
        // Rank s's value comes from s itself (same island: sent in step 1, before any wait) or
        // from the slice's owner in s's island, the rank a failed wait names. The owner sends
        // it once it came, and its own values of later vectors after its waits for earlier
        // ones, so that wait is second hand (kWaitLaterRound: an island peer's wait in step 2
        // names a missing s first), but where s is alone in its island (it waits for nothing
        // before its step 2 sends).
        const int sc = im.islandOf[s];
        const int from = sc == g.c ? s : islands::ownerOf(im, sc, j, v - j * g.L, g.L).rank;
        const bool firstHand = sc == g.c || im.size[sc] == 1;
        ok = pollVec<T>(islandsSlot(a, rank, ph.cur, 0, s, t), &x, waiter, from, ph.epoch,
                        firstHand ? kWaitPushData : kWaitLaterRound);
      }
      accumulate<T>(acc, x);
    }
    if (!ok) break;
    Vec y = packVec<T>(acc);
    sanitize<T>(y);
    for (uint32_t p = kOwnToo ? 0 : 1; p < g.m; ++p) {
      const int s = im.member[g.c][(g.k + p) % g.m];
      storeSys(islandsSlot(a, s, ph.cur, 1, rank, t), y.u);
    }
    put(v, y);
  }
  return ok;
}

// Where vector v of the launch arrives in this rank's gather buffer in step 4: the slot of its
// slice's owner in this rank's island (this rank's own where it owns it) and the place in it.
__device__ __forceinline__ char* islandsGathered(const AllReduceArgs& a, const IslandsGrid& g,
                                                 uint32_t phase, uint32_t v, int* owner) {
  const uint32_t j = v / g.L;
  const islands::Owner o = islands::ownerOf(a.islands, g.c, j, v - j * g.L, g.L);
  *owner = o.rank;
  return islandsSlot(a, a.rank, phase, 1, o.rank, o.at);
}

}  // namespace dev
}  // namespace anyr
