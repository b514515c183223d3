// One-shot push ("Lamport" protocol).
//
// Each rank writes its input straight into slot [rank] of every peer's push buffer; a reader
// knows a vector has arrived when none of its elements carries the clear pattern, so no flag
// and no barrier is needed. Three phases rotate, advanced by a device-side epoch (so CUDA
// graph replays rotate too):
//   call j writes phase j%3 of the peers' buffers, reads phase j%3 of its own, and clears
//   phase (j-1)%3 of its own, exactly the vectors written there one call ago.
// Why that is safe: a peer can write phase (j-1)%3 again only at call j+2, which it can reach
// only after this rank started call j+1 (the peer needs this rank's call-j+1 data to finish
// call j+1), i.e. after this rank's call-j kernel, clearing included, completed. All reads of
// phase (j-1)%3 finished during call j-1. Two phases would not do: the peer's call j+1 data
// may land while this rank is still in call j.
//
// The clear pattern and sanitizing are described in lamport.cuh.
//
// Sums run in fp32 in rank order 0..n-1 on every rank: outputs are bit-identical.
#include "algo/algo.h"
#include "device/lamport.cuh"
#include "device/launch.cuh"

namespace anyr {
namespace {

using dev::Elem;
using dev::sanitize;
using dev::Vec;

template <typename T, bool kAligned>
__global__ void __launch_bounds__(kAlgoThreads, kPeerBlocksPerSm)
    oneShotPushKernel(AllReduceArgs a) {
  LocalState* st = a.state;
  const dev::PushStart start = dev::startPushKernel(a, &LocalState::pushEpoch);
  const dev::Phases ph = start.epoch;
  const bool stopped = start.stopped;
  const T* in = static_cast<const T*>(a.input);
  T* out = static_cast<T*>(a.output);
  const int rank = a.rank;
  const int n = a.nranks;
  const uint32_t epoch = ph.epoch;
  const uint32_t phase = ph.cur;
  const uint64_t slot = a.layout.pushSlotBytes;
  const uint64_t phaseBytes = slot * static_cast<uint64_t>(n);
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  const uint64_t first = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;

  // 1. Push this rank's vectors into slot [rank] of every peer, nearest peer first.
  for (uint64_t v = first; v < a.numVecs; v += stride) {
    Vec x = dev::loadVec<T, kAligned>(in, v, a.count);
    sanitize<T>(x);
    if (dev::opaque(stopped)) continue;
    for (int k = 1; k < n; ++k) {
      int p = (rank + k) % n;
      char* dst = a.peerWorkspace[p] + a.layout.pushOffset + phase * phaseBytes +
                  static_cast<uint64_t>(rank) * slot + v * 16;
      dev::storeSys(dst, x.u);
    }
  }

  if (a.pushFence) __threadfence_system();

  // 2. Clear, in this rank's own buffer, what peers wrote one call ago.
  char* own = a.peerWorkspace[rank] + a.layout.pushOffset;
  dev::clearPeerSlots(own + ph.prev * phaseBytes, slot, n, rank, st->pushVecs[ph.prev]);

  // 3. Reduce in rank order as peers' vectors arrive.
  dev::Waiter waiter(a.wait);
  bool ok = true;
  const char* cur = own + phase * phaseBytes;
  for (uint64_t v = first; v < a.numVecs && ok; v += stride) {
    float acc[Elem<T>::kPerVec] = {};
    for (int s = 0; s < n; ++s) {
      Vec x;
      if (s == rank) {
        x = dev::loadVec<T, kAligned>(in, v, a.count);
        sanitize<T>(x);
      } else if (!dev::pollVec<T>(cur + static_cast<uint64_t>(s) * slot + v * 16, &x, waiter, s,
                                  epoch)) {
        ok = false;
        break;
      }
      dev::accumulate<T>(acc, x);
    }
    if (ok) dev::storeVec<T, kAligned>(out, v, a.count, dev::packVec<T>(acc));
  }

  dev::finishPushKernel(st->pushEpoch, st->pushVecs, ph, a.numVecs);
}

// The kernel for a dispatch tag (dev::KernelTag).
const auto oneShotPushKernelOf = [](auto tag) {
  using Tag = decltype(tag);
  return oneShotPushKernel<typename Tag::T, Tag::kAligned>;
};

}  // namespace

cudaError_t launchOneShotPush(anyrDataType_t dtype, const AllReduceArgs& a,
                              const LaunchShape& shape, cudaStream_t stream) {
  return launchTagged(dtype, a, shape, stream, oneShotPushKernelOf);
}

cudaError_t oneShotPushResidentPerSm(int* least) {
  return dev::lowerResidentPerSm(kAlgoThreads, oneShotPushKernelOf, least);
}

}  // namespace anyr
