// The value-sentinel ("Lamport") protocol shared by the push algorithms: a receive buffer is
// cleared to a pattern no sent value can carry, so a reader knows a vector arrived when none
// of its elements carries it. No flags, no barriers.
//
// The clear pattern is the 32-bit word 0x80008000: in fp16/bf16 every lane of it is -0.0, in
// fp32 it is one negative subnormal. It does not depend on the dtype, so a buffer cleared
// after a bf16 call is ready for an fp32 one. Values are sanitized before they are sent:
// 16-bit -0.0 becomes +0.0, and the fp32 word 0x80008000 becomes -0.0; every rank applies the
// same rewrite to its own contribution, so all ranks still sum the same values. Readers
// compare bit patterns, never floats (a float compare with flush-to-zero would take negative
// subnormals for -0.0 and could spin forever).
#pragma once

#include "device/common.cuh"

namespace anyr {
namespace dev {

template <typename T>
__device__ __forceinline__ void sanitize(Vec& x) {
  if constexpr (sizeof(T) == 2) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      uint32_t w = x.w[i];
      if ((w & 0xffffu) == 0x8000u) w &= 0xffff0000u;
      if ((w >> 16) == 0x8000u) w &= 0x0000ffffu;
      x.w[i] = w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if (x.w[i] == kPushClearWord) x.w[i] = 0x80000000u;
    }
  }
}

template <typename T>
__device__ __forceinline__ bool arrived(const Vec& x) {
  if constexpr (sizeof(T) == 2) {
    bool ok = true;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      ok &= (x.w[i] & 0xffffu) != 0x8000u;
      ok &= (x.w[i] >> 16) != 0x8000u;
    }
    return ok;
  } else {
    return x.w[0] != kPushClearWord && x.w[1] != kPushClearWord && x.w[2] != kPushClearWord &&
           x.w[3] != kPushClearWord;
  }
}

// A second read of a polled vector, issued this long after the first and kept in flight
// beside it (pollVecTwoReads). A read that leaves just before the peer's vector lands comes
// back stale, and reading again costs a whole round trip: on 2 x H200 the fused one-shot lost
// about 0.8 us a call once its rows' data landed during the first reads (from 18-20 rows at
// hidden 6144, from 16 at 7168). With two reads in flight, 300 ns apart, that step went away
// (6144 x 20: 5.13-5.16 -> 4.55-4.57 us; 7168 x 16: 5.03-5.05 -> 4.54-4.55;
// docs/PERFORMANCE.md, "Polling").
constexpr unsigned kPollSecondReadNs = 300;

// Polls the vector at `at` (this rank's own memory, written by rank `from`) with two reads in
// flight, the second kPollSecondReadNs after the first, each reissued as soon as it comes back
// stale. The area only goes from cleared to written during a launch (the next launch clears
// it), so either read that sees the vector sees all of it. Returns false when the wait was
// abandoned (deadline, abort, a peer's failure).
template <typename T, typename W>
__device__ __forceinline__ bool pollVecTwoReads(const char* at, Vec* x, W& waiter, int from,
                                                uint32_t epoch, int32_t what = kWaitPushData) {
  Vec a, b;
  a.u = loadVolatile(at);
  __nanosleep(kPollSecondReadNs);
  b.u = loadVolatile(at);
  for (;;) {
    if (arrived<T>(a)) {
      *x = a;
      return true;
    }
    if (!waiter.keepWaiting(from, what, epoch)) return false;
    a.u = loadVolatile(at);
    if (arrived<T>(b)) {
      *x = b;
      return true;
    }
    if (!waiter.keepWaiting(from, what, epoch)) return false;
    b.u = loadVolatile(at);
  }
}

// Polls `src` (this rank's own memory, written by rank `from`) until the vector arrived.
// Returns false when the wait was abandoned (deadline, abort, a peer's failure). Here and in the
// polls above and below, `what` is the wait's kind as a failure names it (kWaitLaterRound
// where `from` sends it only after waits of its own: common.cuh, kSecondHandGraceNs).
template <typename T, typename W>
__device__ __forceinline__ bool pollVec(const char* src, Vec* x, W& waiter, int from,
                                        uint32_t epoch, int32_t what = kWaitPushData) {
  x->u = loadVolatile(src);
  while (!arrived<T>(*x)) {
    if (!waiter.keepWaiting(from, what, epoch)) return false;
    x->u = loadVolatile(src);
  }
  return true;
}

// The vectors of a row all read at once and re-read together (pollRowRegs, several vectors a
// thread).
template <typename T, int VPT, typename W>
__device__ __forceinline__ bool pollRowRegsTogether(const char* src, int H, Vec (&x)[VPT],
                                                    W& waiter, int from, uint32_t epoch,
                                                    int32_t what = kWaitPushData) {
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const int j = threadIdx.x + k * blockDim.x;
    x[k] = Vec{};
    if (j < H) x[k].u = loadVolatile(src + static_cast<uint64_t>(j) * 16);
  }
  for (;;) {
    bool all = true;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int j = threadIdx.x + k * blockDim.x;
      if (j < H && !arrived<T>(x[k])) all = false;
    }
    if (all) return true;
    if (!waiter.keepWaiting(from, what, epoch)) return false;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int j = threadIdx.x + k * blockDim.x;
      if (j < H && !arrived<T>(x[k])) x[k].u = loadVolatile(src + static_cast<uint64_t>(j) * 16);
    }
  }
}

// Polls the vectors of one row a thread holds in registers, vectors t + k * blockDim.x (k < VPT,
// those below H) of the row at `src` (this rank's own memory, written by rank `from`), all at
// once: a vector that was stale when first read is refreshed in the same round trip as the
// others. One vector a thread (the cluster forms, and rows of at most one vector a thread)
// keeps two reads in flight (pollVecTwoReads). Returns false when the wait was abandoned.
template <typename T, int VPT, typename W>
__device__ __forceinline__ bool pollRowRegs(const char* src, int H, Vec (&x)[VPT], W& waiter,
                                            int from, uint32_t epoch,
                                            int32_t what = kWaitPushData) {
  if constexpr (VPT == 1) {
    x[0] = Vec{};
    if (static_cast<int>(threadIdx.x) >= H) return true;
    return pollVecTwoReads<T>(src + static_cast<uint64_t>(threadIdx.x) * 16, &x[0], waiter, from,
                              epoch, what);
  } else {
    return pollRowRegsTogether<T, VPT>(src, H, x, waiter, from, epoch, what);
  }
}

__device__ __forceinline__ uint4 clearVec() {
  return make_uint4(kPushClearWord, kPushClearWord, kPushClearWord, kPushClearWord);
}

// The three-phase rotation of a push launch: it writes and reads phase `cur` and clears what
// peers wrote one launch ago, in phase `prev` (the safety argument is in oneshot_push.cu).
// The push epochs count launches modulo kPushEpochPeriod (device/handles.h), a
// multiple of 3, so the rotation goes on unbroken where the count wraps (2^32 is not a
// multiple of 3: at its wrap two consecutive launches would take the same phase, one clearing
// what a peer was writing).
struct Phases {
  uint32_t epoch, cur, prev;
};
__device__ __forceinline__ Phases phasesOfEpoch(uint32_t e) {
  return Phases{e, e % 3, (e + 2) % 3};
}
// The phases of the launch from the block's slot of `epochSlots` (readEpoch).
__device__ __forceinline__ Phases phasesOf(const uint32_t* epochSlots) {
  const uint32_t e = readEpoch(epochSlots);
  return Phases{e, e % 3, (e + 2) % 3};
}
// The epoch after a push launch of epoch e (e < kPushEpochPeriod).
__host__ __device__ constexpr uint32_t nextPushEpoch(uint32_t e) {
  return e + 1 == kPushEpochPeriod ? 0u : e + 1;
}
static_assert(kPushEpochPeriod % 3 == 0, "the phase rotation needs a multiple of 3");
static_assert(nextPushEpoch(kPushEpochPeriod - 1) % 3 == (kPushEpochPeriod - 1 + 1) % 3,
              "the phase after the wrap follows the one before it");

// The preamble of a push kernel (startKernel on its launch counter, `slots`: pushEpoch or
// tsEpoch): this launch's phases, and whether the communicator had stopped.
using PushStart = KernelStart<Phases>;
__device__ __forceinline__ PushStart startPushKernel(const AllReduceArgs& a, EpochSlots slots) {
  return startKernel(a, slots, [](uint32_t e) { return phasesOfEpoch(e); });
}

// The end of a push launch: block 0 records the vectors per slot this launch wrote in phase
// ph.cur (`vecs`: pushVecs or tsVecs; the launch after it clears that many), then every block
// advances its epoch slot (finishEpoch).
__device__ __forceinline__ void finishPushKernel(uint32_t* epochSlots, uint32_t* vecs,
                                                 const Phases& ph, uint64_t written) {
  if (blockIdx.x == 0 && threadIdx.x == 0) vecs[ph.cur] = static_cast<uint32_t>(written);
  finishEpoch(epochSlots, nextPushEpoch(ph.epoch));
}

// Clears, in one receive area of this rank's own memory (n slots of slotBytes), the first
// `vecs` vectors of every peer's slot: what peers wrote there one launch ago. The own slot is
// never written, so it is left alone. Every thread of the grid takes part (grid-stride).
__device__ __forceinline__ void clearPeerSlots(char* area, uint64_t slotBytes, int n, int rank,
                                               uint64_t vecs) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  const uint64_t first = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int s = 0; s < n; ++s) {
    if (s == rank) continue;
    char* base = area + static_cast<uint64_t>(s) * slotBytes;
    for (uint64_t v = first; v < vecs; v += stride) storeRelaxed(base + v * 16, clearVec());
  }
}

// Rank r's two-shot push area of `phase` (0..2): its scatter slots (gather = 0), where the
// peers' parts of its own segment land, or its gather slots (gather = 1), where every owner's
// reduced segment lands; nranks slots of layout.tsSlotBytes each, from layout.tsOffset of its
// workspace (device_handles.h). The plain and the fused two-shot push use the same areas.
__device__ __forceinline__ char* twoShotArea(const AllReduceArgs& a, int r, uint32_t phase,
                                             int gather) {
  return a.peerWorkspace[r] + a.layout.tsOffset +
         (2ull * phase + gather) * a.layout.tsSlotBytes * static_cast<uint64_t>(a.nranks);
}

}  // namespace dev
}  // namespace anyr
