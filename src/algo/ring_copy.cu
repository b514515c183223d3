// Ring-copy: the ring's exact chain (algo/ring.cu: partial sums in fp32 along 0 -> 1 -> ... ->
// n-1, the result back on two arms), with every byte between GPUs moved by the copy engines and
// pulled by the rank that needs it, instead of stored by the sender's SMs. For large messages on
// PCIe boxes: a copy engine streams a link without taking SMs from the model's kernels, and a
// pull is a PCIe read, which some hosts serve far faster than peer writes (docs/PCIE.md). The
// only stores into a peer's memory are the chunk flags, 4 bytes each.
//
// A launch is cut into chunks of kRingCopyChunkElems elements (algo/ring_plan.h); chunk c
// belongs to pipeline b = c % G and is its i-th (i = c / G). Each pipeline has two side streams
// of the peer workspace (RingCopyStreams), forked from the caller's stream and joined back, so
// the call is capturable in a CUDA graph. Per chunk, in stream order:
//   fold stream, rank k: a wait kernel (the partial sums of rank k-1 are ready, and room: rank
//     k+1 has pulled what this rank's slot held; rank n-1: both arms' first ranks have pulled
//     its result slot); rank k > 0 pulls rank k-1's partial-sum slot into its inbox; a fold
//     kernel adds its input (acc = partial + x_k, the reference's order) into its own
//     partial-sum slot, or, on rank n-1, rounds, stores the output and its result slot; a
//     signal kernel raises the flags (slot pulled, upstream; data ready, downstream).
//   result stream, rank k < n-1: a wait kernel (the result is ready at its source on its arm,
//     and room: the next rank on its arm pulled this rank's result slot); a pull of the source's
//     result slot into the output; where the arm goes on, a copy of that output chunk into the
//     own result slot; a signal kernel (slot pulled, at the source; result ready, at the next).
// The caller's stream then waits for every side stream and advances the counts.
//
// Flags and counts are the ring's (RingFlags; LocalState::ringUse): pipeline b's g-th chunk,
// g = ringUse[role][b] + i, is ready when the flag reaches g + 1, and its slot may be
// overwritten once the consumer's flag reaches g + 1 - kRingCopySlots. The copies' addresses
// are fixed when they are issued (a replayed graph repeats them), so a chunk's slot is i %
// kRingCopySlots, by its place in the launch, not by its count; the first kRingCopySlots chunks
// of a launch therefore wait for room until every earlier chunk of the pipeline was pulled
// (target ringUse rather than g + 1 - kRingCopySlots), whichever launch or algorithm filled the
// slot last. A ring launch and a ring-copy launch so continue each other's counts: a chunk's
// flags mean the same in both (its data ready for the next rank; the slot it came in free), each
// chunk is one algorithm's on every rank, and neither writes the other's slots.
//
// No deadlock however the side streams share the GPU's hardware queues (more streams than queues
// alias, and a queue runs its commands in the order they were issued, so a spinning wait kernel
// holds up whatever follows it there): every rank issues the same operations in the same order,
// chunk by chunk, a chunk's fold before its result, and every wait of a chunk is for operations
// of the same or earlier chunks on other ranks (the partial sums of this chunk from upstream;
// room, freed by the pull of an earlier chunk; the result of this chunk, made by the fold of
// rank n-1, which waits for nothing of a later chunk). Even one queue per rank, running them one
// by one in that order, completes.
//
// Waits are bounded and name the rank they wait for, with the ring's chain grace (a later wait
// of the chain gives up after the earlier ones: algo/ring_flags.cuh), so the first to give up
// names the missing rank. A stopped communicator's signal kernels raise nothing, and its waits
// give up at their first check; the copies only read peers, so nothing of a stopped rank's call
// reaches a peer.
//
// In place is safe: rank k's fold kernel reads its input chunk before the chunk's partial sums
// leave (its signal follows it in the stream), and the result of that chunk, which the result
// stream's pull writes to the output, exists only after they reached rank n-1.
#include "algo/algo.h"
#include "algo/ring_flags.cuh"
#include "algo/ring_plan.h"
#include "device/launch.cuh"

namespace anyr {
namespace {

using dev::Elem;
using dev::Vec;

// Offsets in a rank's ring-copy area (WorkspaceLayout::ringCopyOffset).
__host__ __device__ inline uint64_t partSlot(int b, uint32_t slot) {
  return kRingCopyPartOffset +
         (static_cast<uint64_t>(b) * kRingCopySlots + slot) * kRingCopySlotBytes;
}
__host__ __device__ inline uint64_t resultSlot(int b, uint32_t slot) {
  return kRingCopyResultOffset +
         (static_cast<uint64_t>(b) * kRingCopySlots + slot) * kRingCopySlotBytes;
}
__host__ __device__ inline uint64_t inboxOf(int b) {
  return kRingCopyInboxOffset + static_cast<uint64_t>(b) * kRingCopySlotBytes;
}

__device__ __forceinline__ char* areaOf(const AllReduceArgs& a, int r) {
  return a.peerWorkspace[r] + a.layout.ringCopyOffset;
}

// The count of pipeline b's i-th chunk of this launch in `role` (0: fold, 1: result), and the
// flag value its slot waits for: every earlier chunk pulled for the launch's first
// kRingCopySlots chunks (their slots were filled by whatever ran last), else the chunk
// kRingCopySlots before it.
struct ChunkCount {
  uint32_t g;
  uint32_t room;
};
__device__ __forceinline__ ChunkCount chunkCount(const AllReduceArgs& a, int role, int b,
                                                 uint32_t i) {
  const uint32_t base = a.state->ringUse[role][b];
  const uint32_t g = base + i;
  return ChunkCount{g, i < kRingCopySlots ? base : g + 1 - kRingCopySlots};
}

// One block of 32 threads: the waits before pipeline b's i-th chunk in `role`. A failed wait
// has been recorded (naming the rank) and stopped the communicator: the later kernels' waits
// give up at their first check and its signals raise nothing.
__global__ void ringCopyWaitKernel(AllReduceArgs a, int role, int b, uint32_t i) {
  const ChunkCount c = chunkCount(a, role, b, i);
  FlagWait waits[3];
  const int count = ringStepWaits(a, role, b, c.g + 1, c.room, waits);
  (void)waitFlags(waits, count, a.wait, c.g + 1);
}

// One block of 32 threads: the flags after pipeline b's i-th chunk in `role`, raised to g + 1
// (release, system scope; every copy and kernel before it in the stream has completed).
__global__ void ringCopySignalKernel(AllReduceArgs a, int role, int b, uint32_t i) {
  const bool stopped = dev::stopRequested(a.state);
  const ChunkCount c = chunkCount(a, role, b, i);
  uint32_t* raise[3];
  const int count = ringStepRaises(a, role, b, raise);
  __threadfence_system();
  raiseFlags(raise, count, c.g + 1, stopped);
}

// Pipeline b's i-th chunk, input vectors [v0, v1): the partial sums from the inbox (rank k > 0)
// plus the own input, in fp32, into the own partial-sum slot; on rank n-1 rounded, into the
// output and the own result slot. A vector's partial sums are its kPerVec floats in a row.
template <typename T, bool kAligned>
__global__ void __launch_bounds__(kAlgoThreads)
    ringCopyFoldKernel(AllReduceArgs a, int b, uint32_t i, uint64_t v0, uint64_t v1) {
  constexpr int E = Elem<T>::kPerVec;
  const int k = a.rank;
  const bool last = k == a.nranks - 1;
  char* area = areaOf(a, k);
  const float4* in = reinterpret_cast<const float4*>(area + inboxOf(b));
  float4* part = reinterpret_cast<float4*>(area + partSlot(b, i % kRingCopySlots));
  uint4* result = reinterpret_cast<uint4*>(area + resultSlot(b, i % kRingCopySlots));
  const T* input = static_cast<const T*>(a.input);
  T* output = static_cast<T*>(a.output);
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t v = v0 + static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < v1;
       v += stride) {
    const uint64_t j = v - v0;
    float acc[E] = {};
    if (k > 0) {
#pragma unroll
      for (int p = 0; p < E / 4; ++p) {
        const float4 f = in[j * (E / 4) + p];
        acc[4 * p] = f.x;
        acc[4 * p + 1] = f.y;
        acc[4 * p + 2] = f.z;
        acc[4 * p + 3] = f.w;
      }
    }
    dev::accumulate<T>(acc, dev::loadVec<T, kAligned>(input, v, a.count));
    if (!last) {
#pragma unroll
      for (int p = 0; p < E / 4; ++p) {
        part[j * (E / 4) + p] =
            make_float4(acc[4 * p], acc[4 * p + 1], acc[4 * p + 2], acc[4 * p + 3]);
      }
    } else {
      const Vec y = dev::packVec<T>(acc);
      dev::storeVec<T, kAligned>(output, v, a.count, y);
      result[j] = y.u;
    }
  }
}

// After the side streams joined: every pipeline's counts advance by its chunks, in both roles
// (rank n-1's result count too, so the counts stay equal on every rank).
__global__ void ringCopyAdvanceKernel(LocalState* st, RingCopyPlan plan) {
  const int b = static_cast<int>(threadIdx.x);
  if (b >= plan.streams) return;
  const uint32_t mine = static_cast<uint32_t>(ringCopyChunksOf(plan, b));
  st->ringUse[0][b] += mine;
  st->ringUse[1][b] += mine;
}

}  // namespace

cudaError_t launchRingCopy(anyrDataType_t dtype, const AllReduceArgs& a, const LaunchShape& shape,
                           const RingCopyStreams& s, cudaStream_t stream) {
  const int k = a.rank;
  const int n = a.nranks;
  const uint64_t es = elemBytes(dtype);
  const int E = static_cast<int>(16 / es);
  const RingCopyPlan plan = ringCopyPlan(a.numVecs, E);
  const uint64_t bytes = a.count * es;
  char* own = a.peerWorkspace[k] + a.layout.ringCopyOffset;
  const int src = ringResultSource(k, n);
  const int dest = k < n - 1 ? ringResultDest(k, n, ringResultSide(k, n)) : -1;
  char* upstream = k > 0 ? a.peerWorkspace[k - 1] + a.layout.ringCopyOffset : nullptr;
  char* source = src >= 0 ? a.peerWorkspace[src] + a.layout.ringCopyOffset : nullptr;
  if ((k > 0 && a.peerWorkspace[k - 1] == nullptr) ||
      (src >= 0 && a.peerWorkspace[src] == nullptr)) {
    return cudaErrorInvalidValue;
  }
  char* out = static_cast<char*>(a.output);

  cudaError_t e = cudaSuccess;
  auto ok = [&](cudaError_t r) {
    if (e == cudaSuccess && r != cudaSuccess) e = r;
    return e == cudaSuccess;
  };
  const bool results = k < n - 1;  // rank n-1 computes the result and receives none
  if (!ok(cudaEventRecord(s.fork, stream))) return e;
  for (int b = 0; b < plan.streams; ++b) {
    if (!ok(cudaStreamWaitEvent(s.fold[b], s.fork, 0))) return e;
    if (results && !ok(cudaStreamWaitEvent(s.result[b], s.fork, 0))) return e;
  }
  for (uint64_t c = 0; c < plan.chunks; ++c) {
    const int b = static_cast<int>(c % static_cast<uint64_t>(plan.streams));
    const uint32_t i = static_cast<uint32_t>(c / static_cast<uint64_t>(plan.streams));
    const uint32_t slot = i % kRingCopySlots;
    const uint64_t v0 = c * plan.chunkVecs;
    const uint64_t v1 = v0 + plan.chunkVecs < a.numVecs ? v0 + plan.chunkVecs : a.numVecs;

    cudaStream_t f = s.fold[b];
    ringCopyWaitKernel<<<1, 32, 0, f>>>(a, 0, b, i);
    if (!ok(cudaGetLastError())) return e;
    if (k > 0 && !ok(cudaMemcpyAsync(own + inboxOf(b), upstream + partSlot(b, slot),
                                     (v1 - v0) * static_cast<uint64_t>(E) * 4,
                                     cudaMemcpyDeviceToDevice, f))) {
      return e;
    }
    const LaunchShape fold = spreadShape(v1 - v0, static_cast<uint64_t>(shape.blocks));
    const cudaError_t r = dev::dispatch(dtype, shape.aligned, [&](auto tag) {
      using Tag = decltype(tag);
      ringCopyFoldKernel<typename Tag::T, Tag::kAligned>
          <<<fold.blocks, fold.threads, 0, f>>>(a, b, i, v0, v1);
      return cudaGetLastError();
    });
    if (!ok(r)) return e;
    ringCopySignalKernel<<<1, 32, 0, f>>>(a, 0, b, i);
    if (!ok(cudaGetLastError())) return e;

    if (!results) continue;
    cudaStream_t rs = s.result[b];
    // The chunk's bytes of the output (the last vector of a message may be partial).
    const uint64_t off = v0 * 16;
    const uint64_t len = (v1 - v0) * 16 < bytes - off ? (v1 - v0) * 16 : bytes - off;
    ringCopyWaitKernel<<<1, 32, 0, rs>>>(a, 1, b, i);
    if (!ok(cudaGetLastError()) ||
        !ok(cudaMemcpyAsync(out + off, source + resultSlot(b, slot), len, cudaMemcpyDeviceToDevice,
                            rs)) ||
        (dest >= 0 && !ok(cudaMemcpyAsync(own + resultSlot(b, slot), out + off, len,
                                          cudaMemcpyDeviceToDevice, rs)))) {
      return e;
    }
    ringCopySignalKernel<<<1, 32, 0, rs>>>(a, 1, b, i);
    if (!ok(cudaGetLastError())) return e;
  }
  for (int b = 0; b < plan.streams; ++b) {
    if (!ok(cudaEventRecord(s.joined[b], s.fold[b])) ||
        !ok(cudaStreamWaitEvent(stream, s.joined[b], 0))) {
      return e;
    }
    if (results && (!ok(cudaEventRecord(s.joined[kRingCopyStreams + b], s.result[b])) ||
                    !ok(cudaStreamWaitEvent(stream, s.joined[kRingCopyStreams + b], 0)))) {
      return e;
    }
  }
  ringCopyAdvanceKernel<<<1, 32, 0, stream>>>(a.state, plan);
  return cudaGetLastError();
}

}  // namespace anyr
