// The waits and raises of the ring's chunk flags (RingFlags, algo/ring_plan.h), shared by the
// ring (algo/ring.cu), whose blocks wait inside the kernel, and ring-copy (algo/ring_copy.cu),
// whose one-block wait and signal kernels order its copies. Device code only.
#pragma once

#include <cstdint>

#include "algo/ring_plan.h"
#include "device/common.cuh"
#include "device/handles.h"

namespace anyr {

// One wait of a block: until *flag reaches target (wrapping), for rank `from`, given up `steps`
// chain steps (kRingChainGraceNs each) after the timeout.
struct FlagWait {
  const uint32_t* flag;
  uint32_t target;
  int32_t from;
  int32_t what;
  uint32_t steps;
};

// Whom a timeout names. Every wait but the first chunk's at rank 1 waits on a rank that may
// itself be waiting: rank k's partials come once rank k-1's came, a free slot at rank k+1 once
// rank k+1 found room downstream, a result once the fold reached rank n-1. When one rank is
// missing, every rank waits, and the first to give up stops the rest and is the one named; so
// each wait gives up after those it depends on: a partial from rank k-1 after k-1 steps, a free
// fold slot at rank k+1 after n-2-k (the ranks downstream of it), a free result slot after n-1,
// a result after n-1 and its place down its arm (algo/ring_plan.h; tests/cpu/test_ring_plan.cc
// checks that the first to give up waits for the missing rank, for every world and rank). The first
// to give up is then rank m+1 waiting for the missing rank m's partials (m steps), or rank m-1
// waiting for room at m (n-1-m), or, for m = n-1, a rank next to it: the root cause, not a healthy
// rank held up by it.
constexpr uint64_t kRingChainGraceNs = 200ull * 1000u * 1000u;

// Thread t < count waits for waits[t]; the block's barrier then makes what the peers wrote
// before raising those flags visible to every thread. Returns false, for the whole block, when
// a wait was abandoned (the communicator is then failed). Every thread must call it.
__device__ __forceinline__ bool waitFlags(const FlagWait (&waits)[3], int count,
                                          const WaitControl* wc, uint32_t epoch) {
  int failed = 0;
  const int t = static_cast<int>(threadIdx.x);
  if (t < count) {
    const FlagWait w = waits[t];
    dev::Waiter waiter(wc);
    waiter.graceNs = w.steps * kRingChainGraceNs;
    while (static_cast<int32_t>(dev::loadAcquireSys(w.flag) - w.target) < 0) {
      if (!waiter.keepWaiting(w.from, w.what, epoch)) {
        failed = 1;
        break;
      }
    }
  }
  return __syncthreads_or(failed) == 0;
}

// After the block's barrier: thread t < count raises flags[t] to `value` (release, system
// scope, so the block's stores before the barrier are visible first). Nothing once the
// communicator stopped.
__device__ __forceinline__ void raiseFlags(uint32_t* const (&flags)[3], int count, uint32_t value,
                                           bool stopped) {
  const int t = static_cast<int>(threadIdx.x);
  if (t < count && !stopped) dev::storeReleaseSys(flags[t], value);
}

// Rank r's ring flags (FlagArea::ring in its workspace).
__device__ __forceinline__ RingFlags* ringFlagsOf(const AllReduceArgs& a, int r) {
  return &reinterpret_cast<FlagArea*>(a.peerWorkspace[r] + a.layout.flagsOffset)->ring;
}

// This rank's step of stream b's chunk in `role` (0: its fold, 1: its result; rank n-1 has no
// result step), the ring's and ring-copy's alike. Its waits, in `waits` (returns how many): the
// data it takes (the flag reaching `data`: from rank k-1, or from its result source) and room
// where it sends (the flag reaching `room`: freed by rank k+1, by both arms' first ranks from
// rank n-1, or by the next rank on its arm), each naming the rank waited for with its chain
// steps.
__device__ __forceinline__ int ringStepWaits(const AllReduceArgs& a, int role, int b, uint32_t data,
                                             uint32_t room, FlagWait (&waits)[3]) {
  const int k = a.rank;
  const int n = a.nranks;
  const RingFlags* own = ringFlagsOf(a, k);
  int count = 0;
  if (role == 0) {
    if (k > 0) {
      waits[count++] =
          FlagWait{&own->foldReady[b], data, k - 1, kWaitRingData, ringFoldDataSteps(k)};
    }
    if (k < n - 1) {
      waits[count++] =
          FlagWait{&own->foldFree[b], room, k + 1, kWaitRingRoom, ringFoldRoomSteps(k, n)};
    } else {
      for (int side = 0; side < 2; ++side) {
        const int d = ringResultDest(k, n, side);
        if (d >= 0) {
          waits[count++] =
              FlagWait{&own->resultFree[side][b], room, d, kWaitRingRoom, ringResultRoomSteps(n)};
        }
      }
    }
  } else {
    const int side = ringResultSide(k, n);
    const int dest = ringResultDest(k, n, side);
    waits[count++] = FlagWait{&own->resultReady[b], data, ringResultSource(k, n), kWaitRingData,
                              ringResultSteps(k, n)};
    if (dest >= 0) {
      waits[count++] =
          FlagWait{&own->resultFree[side][b], room, dest, kWaitRingRoom, ringResultRoomSteps(n)};
    }
  }
  return count;
}

// The flags that step raises, in `raise` (returns how many): freed where its data came from,
// ready where it sent.
__device__ __forceinline__ int ringStepRaises(const AllReduceArgs& a, int role, int b,
                                              uint32_t* (&raise)[3]) {
  const int k = a.rank;
  const int n = a.nranks;
  int count = 0;
  if (role == 0) {
    if (k > 0) raise[count++] = &ringFlagsOf(a, k - 1)->foldFree[b];
    if (k < n - 1) {
      raise[count++] = &ringFlagsOf(a, k + 1)->foldReady[b];
    } else {
      for (int side = 0; side < 2; ++side) {
        const int d = ringResultDest(k, n, side);
        if (d >= 0) raise[count++] = &ringFlagsOf(a, d)->resultReady[b];
      }
    }
  } else {
    const int side = ringResultSide(k, n);
    const int dest = ringResultDest(k, n, side);
    raise[count++] = &ringFlagsOf(a, ringResultSource(k, n))->resultFree[side][b];
    if (dest >= 0) raise[count++] = &ringFlagsOf(a, dest)->resultReady[b];
  }
  return count;
}

}  // namespace anyr
