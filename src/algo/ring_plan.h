// The ring's schedule (algo/ring.cu), shared by its kernel, its launcher, the workspace layout
// and the cost model: how a launch is cut into chunks and streams, and who passes results to
// whom. Pure integer functions, the same on host and device, so every rank and the model agree.
//
// The fold runs along the ring 0 -> 1 -> ... -> n-1 (rank k adds its input to the partial sums
// it gets from rank k-1). The result leaves rank n-1 on two arms: the wrap arm n-1 -> 0 -> 1 ->
// ... -> m-1 and the backward arm n-1 -> n-2 -> ... -> m, m = n / 2 (ringSplit), so every rank
// gets it within n - 1 + m hops of the first partial sum leaving rank 0 (ringDepth).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "device/handles.h"

namespace anyr {

// Slots per stream in each inbox: a sender runs at most this many chunks ahead of the rank that
// consumes them.
constexpr uint32_t kRingSlots = 4;
// Elements per chunk. A slot holds one chunk's fp32 partial sums (16 KiB); a result slot holds
// the chunk in the call's type (at most as many bytes).
constexpr uint64_t kRingChunkElems = 4096;
constexpr uint64_t kRingSlotBytes = kRingChunkElems * 4;
constexpr uint64_t kRingInboxBytes = kRingMaxStreams * kRingSlots * kRingSlotBytes;
// A workspace's ring area (WorkspaceLayout::ringOffset): the fold inbox, then the result inbox.
constexpr uint64_t kRingAreaBytes = 2 * kRingInboxBytes;

struct RingPlan {
  uint64_t chunkVecs;  // 16-byte input vectors per chunk
  uint64_t chunks;     // chunks of the launch; chunk c belongs to stream c % streams
  int streams;         // pipelines: the kernel runs one fold and one result block for each
};

// A launch of `numVecs` input vectors of `elemsPerVec` elements (4: fp32, 8: 16-bit) in chunks
// of kRingChunkElems elements, over as many streams as there are chunks, at most
// kRingMaxStreams and half of `blocksCap` (the launch's grid cap; at least one stream).
__host__ __device__ inline RingPlan ringPlan(uint64_t numVecs, int elemsPerVec, int blocksCap) {
  RingPlan p;
  p.chunkVecs = kRingChunkElems / static_cast<uint64_t>(elemsPerVec);
  p.chunks = (numVecs + p.chunkVecs - 1) / p.chunkVecs;
  uint64_t s = p.chunks < static_cast<uint64_t>(kRingMaxStreams)
                   ? p.chunks
                   : static_cast<uint64_t>(kRingMaxStreams);
  const uint64_t half = blocksCap > 1 ? static_cast<uint64_t>(blocksCap / 2) : 1;
  if (s > half) s = half;
  p.streams = s > 0 ? static_cast<int>(s) : 1;
  return p;
}

// ---- ring-copy (algo/ring_copy.cu): the same chain, its bytes pulled by the copy engines ----
// Pipelines of a launch; each has its own fold and result stream. They use the ring's flags and
// chunk counts of the same stream index (RingFlags, LocalState::ringUse), so a ring launch and a
// ring-copy launch continue each other's counts (algo/ring_copy.cu says why that is safe).
constexpr int kRingCopyStreams = 2;
static_assert(kRingCopyStreams <= kRingMaxStreams, "ring-copy streams share the ring's flags");
// Slots per pipeline of the outgoing partial sums and of the results: a rank runs at most this
// many chunks ahead of the neighbour that pulls them.
constexpr uint32_t kRingCopySlots = 2;
// Elements per chunk: one copy of 1 MiB of fp32 partial sums, long next to the launches and
// flags around it (a few microseconds each).
constexpr uint64_t kRingCopyChunkElems = 256 * 1024;
constexpr uint64_t kRingCopySlotBytes = kRingCopyChunkElems * 4;
// A workspace's ring-copy area (WorkspaceLayout::ringCopyOffset): the partial-sum slots
// [stream][slot], the result slots [stream][slot] (a chunk in the call's type, at most fp32) and
// the inbox [stream] the fold pulls into (read only by its own rank).
constexpr uint64_t kRingCopyPartOffset = 0;
constexpr uint64_t kRingCopyResultOffset =
    kRingCopyPartOffset + kRingCopyStreams * kRingCopySlots * kRingCopySlotBytes;
constexpr uint64_t kRingCopyInboxOffset =
    kRingCopyResultOffset + kRingCopyStreams * kRingCopySlots * kRingCopySlotBytes;
constexpr uint64_t kRingCopyAreaBytes =
    kRingCopyInboxOffset + kRingCopyStreams * kRingCopySlotBytes;
// Bytes of a message one launch carries (larger messages are several launches): each launch
// fills the pipeline once (ringDepth hops of a whole chunk), so launches are large.
constexpr uint64_t kRingCopyLaunchBytes = 1ull << 30;

struct RingCopyPlan {
  uint64_t chunkVecs;  // 16-byte input vectors per chunk
  uint64_t chunks;     // chunks of the launch; chunk c belongs to stream c % streams
  int streams;         // pipelines (1 .. kRingCopyStreams)
};

__host__ __device__ inline RingCopyPlan ringCopyPlan(uint64_t numVecs, int elemsPerVec) {
  RingCopyPlan p;
  p.chunkVecs = kRingCopyChunkElems / static_cast<uint64_t>(elemsPerVec);
  p.chunks = (numVecs + p.chunkVecs - 1) / p.chunkVecs;
  p.streams = p.chunks < static_cast<uint64_t>(kRingCopyStreams) ? static_cast<int>(p.chunks)
                                                                 : kRingCopyStreams;
  if (p.streams < 1) p.streams = 1;
  return p;
}

// Chunks of a launch that stream b carries: b, b + streams, ...
__host__ __device__ inline uint64_t ringCopyChunksOf(const RingCopyPlan& p, int b) {
  const uint64_t ub = static_cast<uint64_t>(b);
  return p.chunks > ub ? (p.chunks - 1 - ub) / static_cast<uint64_t>(p.streams) + 1 : 0;
}

// The ranks 0 .. m-1 get the result on the wrap arm, m .. n-2 on the backward arm.
__host__ __device__ constexpr int ringSplit(int n) { return n / 2; }

// The arm a rank gets the result on (0: wrap, 1: backward): the index of the flags it frees in
// its source (RingFlags::resultFree). Rank n-1 computes the result and gets none.
__host__ __device__ constexpr int ringResultSide(int rank, int n) {
  return rank < ringSplit(n) ? 0 : 1;
}

// The rank a rank gets the result from; -1 for rank n-1.
__host__ __device__ constexpr int ringResultSource(int rank, int n) {
  return rank == n - 1 ? -1 : rank == 0 ? n - 1 : rank < ringSplit(n) ? rank - 1 : rank + 1;
}

// The rank a rank passes the result on to on arm `side`; -1: none (rank n-1 starts both arms,
// every other rank passes on along its own arm only, the last one of each arm to none).
__host__ __device__ constexpr int ringResultDest(int rank, int n, int side) {
  return rank == n - 1
             ? (side == 0 ? (ringSplit(n) >= 1 ? 0 : -1) : (n - 2 >= ringSplit(n) ? n - 2 : -1))
         : side == 0 ? (rank < ringSplit(n) - 1 ? rank + 1 : -1)
                     : (rank > ringSplit(n) && rank <= n - 2 ? rank - 1 : -1);
}

// The chain steps each wait of a rank gives up after the timeout (algo/ring.cu,
// kRingChainGraceNs, which says why): rank k's wait for the partials from rank k-1, k-1; for a
// free fold slot at rank k+1, n-2-k; for a free result slot, n-1; for a result, n-1 and its
// place down its arm (0 for an arm's first rank).
__host__ __device__ constexpr uint32_t ringFoldDataSteps(int rank) {
  return static_cast<uint32_t>(rank - 1);
}
__host__ __device__ constexpr uint32_t ringFoldRoomSteps(int rank, int n) {
  return static_cast<uint32_t>(n - 2 - rank);
}
__host__ __device__ constexpr uint32_t ringResultRoomSteps(int n) {
  return static_cast<uint32_t>(n - 1);
}
__host__ __device__ constexpr uint32_t ringResultSteps(int rank, int n) {
  return static_cast<uint32_t>(n - 1 + (ringResultSide(rank, n) == 0 ? rank : n - 2 - rank));
}

// Hops from rank 0's first chunk to the last rank's result: n - 1 along the fold, then the
// longer arm (the wrap arm, m hops).
__host__ __device__ constexpr int ringDepth(int n) { return n - 1 + ringSplit(n); }

}  // namespace anyr
