// Ring: the partial sums pass along the ring 0 -> 1 -> ... -> n-1 in pipelined chunks, in fp32;
// rank n-1 rounds them and the result goes back around the ring on two arms. Every store goes
// to a ring neighbour (and, from rank n-1, to rank 0 across the wrap), for large messages on
// PCIe boxes where all-to-all traffic collapses (docs/PCIE.md).
//
// Why this schedule. Every anyreduce algorithm returns, on every rank, the fp32 sum in rank
// order 0, 1, ..., n-1 rounded once to the call's type. fp32 addition is not associative, so
// the partial sum of a chunk must visit the ranks in that order: a textbook ring reduce-scatter
// starts each slice at a different rank (slice s is summed s+1, s+2, ..., s), which is a
// rotation of rank order and gives other bits; rounding the partial to bf16 at each step (as
// NCCL does) gives others again. With the ring laid out in rank order, the only exact
// neighbour-only reduce is the chain 0 -> 1 -> ... -> n-1 for every chunk, partials in fp32:
// each forward link carries the whole message once, and rank n-1 ends with every result, which
// it sends out on the link back to rank 0 (idle during the reduce) and on the backward links.
// Per GPU that is the honest cost: a rank between the ends receives the fp32 partials (2 B per
// byte of a 16-bit message) and the result (1 B), and sends as much, 3 B against NCCL's ring's
// 2 (n-1)/n B, which rounds partials in the call's type; for fp32 messages 2 B against
// 2 (n-1)/n B. Other exact forms move more: gathering raw inputs to an owner along the ring
// costs (n-1)/2 B per link, and a rank-order fold can only shorten the partial's path by
// carrying raw values beside it, which costs more than it saves. Every switch uplink of a ring
// in rank order is crossed once each way (the partials one way, the result the other), which
// is what all-to-all traffic cannot do (docs/PCIE.md: predicted against NCCL and two-shot).
//
// Pipelines. A launch is cut into chunks of kRingChunkElems elements (algo/ring_plan.h); chunk
// c belongs to stream c % G. Each stream has two blocks: its fold block and its result block.
//   fold block, rank k: wait for the partial sums of its next chunk from rank k-1 (rank 0 has
//     none) and for a free slot at rank k+1; add its own input in fp32 (acc = partial + x_k,
//     exactly the reference's acc += x_k); store the partials into rank k+1's fold inbox, or, on
//     rank n-1, round, store the output and the result into the result inboxes of both arms'
//     first ranks; then raise the chunk's flags (data ready downstream, slot freed upstream).
//   result block, rank k < n-1: wait for the result of its next chunk from its source and for a
//     free slot at its destination on its arm; copy it to the output and pass it on.
// The two blocks of a stream run at once, so the reduce and the result overlap in a rank's
// link; they wait on each other only through other ranks, so all 2G blocks of a rank must be
// resident together (G <= kRingMaxStreams: 16 blocks).
//
// Flags (device/handles.h, RingFlags) are per stream and count chunks modulo 2^32: a stream's
// g-th chunk (g counts over all launches, LocalState::ringUse, equal on every rank and in both
// roles) sits in slot g % kRingSlots, is ready when the inbox owner's ready flag reaches g + 1,
// and its slot is free again for chunk g + kRingSlots when the consumer's free flag reaches
// g + 1. The counts only grow, so nothing is cleared between launches and any launch (graph
// replay, another size, another stream count) picks up where the last left off; a flag is
// written in every launch that advances its count, so it is never far behind it. Data are
// stored before a block barrier and the flag by one thread with release semantics after it, and
// read after an acquire of the flag and a block barrier (as twoshot.cu), bypassing L1 (a slot is
// reused). No sentinel values: every bit pattern of a partial sum travels as it is.
//
// In place is safe: rank k reads its input chunk in its fold block before its partials leave,
// and the result of that chunk, which its result block writes to the output, is computed from
// them. A stopped communicator's kernel makes no store visible to a peer (dev::stopRequested).
#include "algo/algo.h"
#include "algo/ring_flags.cuh"
#include "algo/ring_plan.h"
#include "device/launch.cuh"

namespace anyr {
namespace {

using dev::Elem;
using dev::Vec;

// A rank's ring area: its inboxes (WorkspaceLayout::ringOffset); its flags: ringFlagsOf.
struct RingArea {
  char* fold;
  char* result;
};

__device__ __forceinline__ RingArea ringArea(const AllReduceArgs& a, int r) {
  char* area = a.peerWorkspace[r] + a.layout.ringOffset;
  return RingArea{area, area + kRingInboxBytes};
}

// Slot g % kRingSlots of stream b in an inbox.
__device__ __forceinline__ char* ringSlot(char* inbox, int b, uint32_t g) {
  return inbox + (static_cast<uint64_t>(b) * kRingSlots + g % kRingSlots) * kRingSlotBytes;
}

// The partial sums of input vector j of a chunk of `cv` vectors: planes of 16-byte vectors
// (elements 0-3 of every vector, then elements 4-7), so that a warp's loads and stores of a
// plane are contiguous.
template <typename T>
__device__ __forceinline__ void loadPartial(const char* slot, uint64_t cv, uint64_t j,
                                            float (&acc)[Elem<T>::kPerVec]) {
#pragma unroll
  for (int p = 0; p < Elem<T>::kPerVec / 4; ++p) {
    Vec w;
    w.u = dev::loadCg(slot + (p * cv + j) * 16);
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[4 * p + e] = __uint_as_float(w.w[e]);
  }
}

template <typename T>
__device__ __forceinline__ void storePartial(char* slot, uint64_t cv, uint64_t j,
                                             const float (&acc)[Elem<T>::kPerVec]) {
#pragma unroll
  for (int p = 0; p < Elem<T>::kPerVec / 4; ++p) {
    dev::storeSys(slot + (p * cv + j) * 16,
                  make_uint4(__float_as_uint(acc[4 * p]), __float_as_uint(acc[4 * p + 1]),
                             __float_as_uint(acc[4 * p + 2]), __float_as_uint(acc[4 * p + 3])));
  }
}

// The fold block's step for chunk vectors [v0, v1), the stream's g-th chunk.
template <typename T, bool kAligned>
__device__ __forceinline__ bool foldChunk(const AllReduceArgs& a, const RingArea& own, int b,
                                          uint32_t g, uint64_t cv, uint64_t v0, uint64_t v1,
                                          bool stopped) {
  const int k = a.rank;
  const int n = a.nranks;
  const bool last = k == n - 1;
  FlagWait waits[3];
  const int count = ringStepWaits(a, 0, b, g + 1, g + 1 - kRingSlots, waits);
  if (!waitFlags(waits, count, a.wait, g + 1)) return false;

  const char* in = ringSlot(own.fold, b, g);
  char* next = nullptr;
  char* dests[2] = {nullptr, nullptr};
  if (!last) {
    next = ringSlot(ringArea(a, k + 1).fold, b, g);
  } else {
    for (int side = 0; side < 2; ++side) {
      const int d = ringResultDest(k, n, side);
      if (d >= 0) dests[side] = ringSlot(ringArea(a, d).result, b, g);
    }
  }
  const T* input = static_cast<const T*>(a.input);
  T* output = static_cast<T*>(a.output);
  for (uint64_t v = v0 + threadIdx.x; v < v1; v += blockDim.x) {
    const uint64_t j = v - v0;
    float acc[Elem<T>::kPerVec] = {};
    if (k > 0) loadPartial<T>(in, cv, j, acc);
    dev::accumulate<T>(acc, dev::loadVec<T, kAligned>(input, v, a.count));
    if (dev::opaque(stopped)) continue;  // nothing to peers once stopped
    if (!last) {
      storePartial<T>(next, cv, j, acc);
    } else {
      const Vec y = dev::packVec<T>(acc);
      dev::storeVec<T, kAligned>(output, v, a.count, y);
      for (int side = 0; side < 2; ++side) {
        if (dests[side] != nullptr) dev::storeSys(dests[side] + j * 16, y.u);
      }
    }
  }
  __syncthreads();
  uint32_t* raise[3];
  const int raised = ringStepRaises(a, 0, b, raise);
  raiseFlags(raise, raised, g + 1, stopped);
  return true;
}

// The result block's step (ranks below n-1) for chunk vectors [v0, v1), the stream's g-th
// chunk: from the own result inbox to the output and on along the rank's arm.
template <typename T, bool kAligned>
__device__ __forceinline__ bool resultChunk(const AllReduceArgs& a, const RingArea& own, int b,
                                            uint32_t g, uint64_t v0, uint64_t v1, bool stopped) {
  const int k = a.rank;
  const int n = a.nranks;
  const int dest = ringResultDest(k, n, ringResultSide(k, n));
  FlagWait waits[3];
  const int count = ringStepWaits(a, 1, b, g + 1, g + 1 - kRingSlots, waits);
  if (!waitFlags(waits, count, a.wait, g + 1)) return false;

  const char* in = ringSlot(own.result, b, g);
  char* out = dest >= 0 ? ringSlot(ringArea(a, dest).result, b, g) : nullptr;
  T* output = static_cast<T*>(a.output);
  for (uint64_t v = v0 + threadIdx.x; v < v1; v += blockDim.x) {
    const uint64_t j = v - v0;
    Vec y;
    y.u = dev::loadCg(in + j * 16);
    dev::storeVec<T, kAligned>(output, v, a.count, y);
    if (out != nullptr && !dev::opaque(stopped)) dev::storeSys(out + j * 16, y.u);
  }
  __syncthreads();
  uint32_t* raise[3];
  const int raised = ringStepRaises(a, 1, b, raise);
  raiseFlags(raise, raised, g + 1, stopped);
  return true;
}

// Blocks 0 .. G-1: the streams' fold blocks; G .. 2G-1: their result blocks (G = gridDim.x / 2).
template <typename T, bool kAligned>
__global__ void __launch_bounds__(kAlgoThreads, kPeerBlocksPerSm) ringKernel(AllReduceArgs a) {
  dev::waitForPrevious(a.releaseEarly);
  const bool stopped = dev::stopRequested(a.state);
  const int G = static_cast<int>(gridDim.x / 2);
  const int role = static_cast<int>(blockIdx.x) < G ? 0 : 1;
  const int b = static_cast<int>(blockIdx.x) - role * G;
  const RingPlan plan = ringPlan(a.numVecs, Elem<T>::kPerVec, 2 * G);
  uint32_t* use = &a.state->ringUse[role][b];
  const uint32_t base = *use;
  const uint64_t mine = plan.chunks > static_cast<uint64_t>(b)
                            ? (plan.chunks - 1 - static_cast<uint64_t>(b)) / G + 1
                            : 0;
  const RingArea own = ringArea(a, a.rank);
  const bool fold = role == 0;
  const bool passes = fold || a.rank != a.nranks - 1;  // rank n-1 has no result to receive
  bool ok = true;
  for (uint64_t i = 0; i < mine && ok && passes; ++i) {
    const uint32_t g = base + static_cast<uint32_t>(i);
    const uint64_t v0 = (static_cast<uint64_t>(b) + i * G) * plan.chunkVecs;
    const uint64_t v1 = min(a.numVecs, v0 + plan.chunkVecs);
    ok = fold ? foldChunk<T, kAligned>(a, own, b, g, plan.chunkVecs, v0, v1, stopped)
              : resultChunk<T, kAligned>(a, own, b, g, v0, v1, stopped);
  }
  // Every thread has read `base` (the barriers of the steps, or this one).
  __syncthreads();
  if (threadIdx.x == 0 && ok) *use = base + static_cast<uint32_t>(mine);
}

// The kernel for a dispatch tag (dev::KernelTag).
const auto ringKernelOf = [](auto tag) {
  using Tag = decltype(tag);
  return ringKernel<typename Tag::T, Tag::kAligned>;
};

}  // namespace

// The grid is the plan's: two blocks of kAlgoThreads threads per stream, streams within half
// of the shape's blocks (the peer grid cap for large messages).
cudaError_t launchRing(anyrDataType_t dtype, const AllReduceArgs& a, const LaunchShape& shape,
                       cudaStream_t stream) {
  return dev::dispatch(dtype, shape.aligned, [&](auto tag) {
    using T = typename decltype(tag)::T;
    const RingPlan plan = ringPlan(a.numVecs, Elem<T>::kPerVec, shape.blocks);
    return launchKernel(ringKernelOf(tag), dim3(2 * plan.streams), dim3(kAlgoThreads), 0, stream,
                        shape.pdl, a);
  });
}

cudaError_t ringResidentPerSm(int* least) {
  return dev::lowerResidentPerSm(kAlgoThreads, ringKernelOf, least);
}

}  // namespace anyr
