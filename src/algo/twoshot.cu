// Two-shot: reduce-scatter, then all-gather, both by peer reads.
//
// The vectors are cut into n segments; rank s owns segment s. Within every segment, block b
// of every rank covers the same sub-range, so block b only ever waits for block b of peers:
//   1. stage this block's sub-range of every segment except the own one; signal "start";
//   2. wait for every peer's start flag; reduce the own segment's sub-range by reading every
//      peer's staging (rank order, fp32), write it to the output and to the result buffer;
//      signal "end";
//   3. wait for every peer's end flag; copy every other segment's sub-range from its owner's
//      result buffer into the output.
// Every element is reduced by exactly one rank, so all ranks get identical bits, and they are
// the same bits the one-shot algorithms produce (same order, same fp32 accumulation).
// Buffer reuse follows oneshot_pull.cu: staging and result alternate by epoch parity; buffer
// (j % 2) is rewritten at call j+2, after every peer's call-j+1 start flag, which the peer
// raised after its whole call-j kernel finished.
// In place is safe: a block reads its own input sub-ranges (staging in step 1, own segment in
// step 2) before it writes the output there (steps 2 and 3), and no other block touches them.
#include "algo/algo.h"
#include "device/common.cuh"
#include "device/flag_barrier.cuh"
#include "device/launch.cuh"

namespace anyr {
namespace {

using dev::Elem;
using dev::Vec;

struct Range {
  uint64_t lo, hi;
};

__device__ __forceinline__ Range subRange(uint64_t numVecs, int n, int seg) {
  const uint64_t segLen = (numVecs + n - 1) / n;
  const uint64_t segLo = min(numVecs, segLen * seg);
  const uint64_t segHi = min(numVecs, segLo + segLen);
  const uint64_t per = (segLen + gridDim.x - 1) / gridDim.x;
  const uint64_t lo = min(segHi, segLo + per * blockIdx.x);
  return Range{lo, min(segHi, lo + per)};
}

template <typename T, bool kAligned>
__global__ void __launch_bounds__(kAlgoThreads, kPeerBlocksPerSm) twoShotKernel(AllReduceArgs a) {
  const auto start = dev::startKernel(a, &LocalState::syncEpoch, dev::flagEpochOf);
  const T* in = static_cast<const T*>(a.input);
  T* out = static_cast<T*>(a.output);
  const int rank = a.rank;
  const int n = a.nranks;
  LocalState* st = a.state;
  const uint32_t epoch = start.epoch;
  const bool stopped = start.stopped;
  const uint32_t use = dev::flagUseOf(st);  // what this block's flags carry
  const uint64_t parity = epoch & 1u;
  const uint64_t stagingOffset = a.layout.stagingOffset + parity * a.layout.chunkBytes;
  const uint64_t resultOffset = a.layout.resultOffset + parity * a.layout.chunkBytes;
  char* own = a.peerWorkspace[rank];

  // 1. Stage the sub-ranges peers will reduce.
  for (int s = 0; s < n; ++s) {
    if (s == rank) continue;
    Range r = subRange(a.numVecs, n, s);
    for (uint64_t v = r.lo + threadIdx.x; v < r.hi; v += blockDim.x) {
      Vec x = dev::loadVec<T, kAligned>(in, v, a.count);
      dev::storeRelaxed(own + stagingOffset + v * 16, x.u);
    }
  }
  bool ok = dev::blockBarrier(a, false, use, stopped);

  // 2. Reduce the own segment's sub-range.
  if (ok) {
    Range r = subRange(a.numVecs, n, rank);
    for (uint64_t v = r.lo + threadIdx.x; v < r.hi; v += blockDim.x) {
      float acc[Elem<T>::kPerVec] = {};
      for (int s = 0; s < n; ++s) {
        Vec x;
        if (s == rank) {
          x = dev::loadVec<T, kAligned>(in, v, a.count);
        } else {
          x.u = dev::loadCg(a.peerWorkspace[s] + stagingOffset + v * 16);
        }
        dev::accumulate<T>(acc, x);
      }
      Vec y = dev::packVec<T>(acc);
      dev::storeRelaxed(own + resultOffset + v * 16, y.u);
      dev::storeVec<T, kAligned>(out, v, a.count, y);
    }
    ok = dev::blockBarrier(a, true, use, stopped);
  }

  // 3. Gather the other segments from their owners.
  if (ok) {
    for (int k = 1; k < n; ++k) {
      int s = (rank + k) % n;
      Range r = subRange(a.numVecs, n, s);
      for (uint64_t v = r.lo + threadIdx.x; v < r.hi; v += blockDim.x) {
        Vec x;
        x.u = dev::loadCg(a.peerWorkspace[s] + resultOffset + v * 16);
        dev::storeVec<T, kAligned>(out, v, a.count, x);
      }
    }
  }

  dev::finishEpoch(st->syncEpoch, epoch);
  dev::finishFlagUse(st, use);
}

// The kernel for a dispatch tag (dev::KernelTag).
const auto twoShotKernelOf = [](auto tag) {
  using Tag = decltype(tag);
  return twoShotKernel<typename Tag::T, Tag::kAligned>;
};

}  // namespace

cudaError_t launchTwoShot(anyrDataType_t dtype, const AllReduceArgs& a, const LaunchShape& shape,
                          cudaStream_t stream) {
  return launchTagged(dtype, a, shape, stream, twoShotKernelOf);
}

cudaError_t twoShotResidentPerSm(int* least) {
  return dev::lowerResidentPerSm(kAlgoThreads, twoShotKernelOf, least);
}

}  // namespace anyr
