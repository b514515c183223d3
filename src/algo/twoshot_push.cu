// Two-shot push: reduce-scatter and all-gather by peer writes, with the value-sentinel
// protocol of lamport.cuh instead of flags, so no barrier and no staging copy.
//
// The vectors are cut into n segments of L vectors; rank s owns segment s. Thread i handles
// vector i of every segment:
//   1. scatter: for every peer s, write vector i of segment s into slot [rank] of s's scatter
//      buffer;
//   2. reduce: as the peers' vectors arrive in this rank's scatter buffer, sum vector i of the
//      own segment in rank order (fp32), write it to the output and into slot [rank] of every
//      peer's gather buffer;
//   3. gather: as the owners' reduced vectors arrive in this rank's gather buffer, copy them
//      to the output.
// Each rank reduces exactly one segment, so all ranks hold identical bits, and they are the
// bits of the other algorithms (same order, same fp32 accumulation), except that a reduced
// 16-bit -0.0 is sent and kept as +0.0 (it would read as "not arrived").
// Buffers rotate through three phases and the previous phase is cleared, exactly as in
// oneshot_push.cu (same argument: a peer writes phase (j-1)%3 again only at launch j+2, after
// this rank's launch j completed).
// In place is safe: thread i reads every input vector it owns before it writes the output
// vector of the same index, and no other thread touches them.
#include "algo/algo.h"
#include "device/lamport.cuh"
#include "device/launch.cuh"

namespace anyr {
namespace {

using dev::Elem;
using dev::Vec;

template <typename T, bool kAligned>
__global__ void __launch_bounds__(kAlgoThreads, kPeerBlocksPerSm)
    twoShotPushKernel(AllReduceArgs a) {
  dev::waitForPrevious(a.releaseEarly);
  const T* in = static_cast<const T*>(a.input);
  T* out = static_cast<T*>(a.output);
  const int rank = a.rank;
  const int n = a.nranks;
  LocalState* st = a.state;
  const dev::Phases ph = dev::phasesOf(st->tsEpoch);
  const bool stopped = dev::stopRequested(st);
  const uint32_t epoch = ph.epoch;
  const uint32_t phase = ph.cur;
  const uint64_t slot = a.layout.tsSlotBytes;
  const uint64_t V = a.numVecs;
  const uint64_t L = (V + n - 1) / n;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  const uint64_t first = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;

  // 1. Scatter every peer's segment to it.
  for (uint64_t i = first; i < L; i += stride) {
    for (int k = 1; k < n; ++k) {
      const int s = (rank + k) % n;
      const uint64_t v = static_cast<uint64_t>(s) * L + i;
      if (v >= V) continue;
      Vec x = dev::loadVec<T, kAligned>(in, v, a.count);
      dev::sanitize<T>(x);
      if (dev::opaque(stopped)) continue;
      dev::storeSys(dev::twoShotArea(a, s, phase, 0) + static_cast<uint64_t>(rank) * slot + i * 16,
                    x.u);
    }
  }

  if (a.pushFence) __threadfence_system();

  // 2. Clear, in this rank's own buffers, what peers wrote one launch ago.
  for (int g = 0; g < 2; ++g) {
    dev::clearPeerSlots(dev::twoShotArea(a, rank, ph.prev, g), slot, n, rank, st->tsVecs[ph.prev]);
  }

  // 3. Reduce the own segment and send it to every peer.
  dev::Waiter waiter(a.wait);
  bool ok = true;
  const char* scatter = dev::twoShotArea(a, rank, phase, 0);
  for (uint64_t i = first; i < L && ok; i += stride) {
    const uint64_t v = static_cast<uint64_t>(rank) * L + i;
    if (v >= V) break;
    float acc[Elem<T>::kPerVec] = {};
    for (int s = 0; s < n && ok; ++s) {
      Vec x;
      if (s == rank) {
        x = dev::loadVec<T, kAligned>(in, v, a.count);
        dev::sanitize<T>(x);
      } else {
        ok = dev::pollVec<T>(scatter + static_cast<uint64_t>(s) * slot + i * 16, &x, waiter, s,
                             epoch);
      }
      dev::accumulate<T>(acc, x);
    }
    if (!ok) break;
    Vec y = dev::packVec<T>(acc);
    dev::sanitize<T>(y);
    for (int k = 1; k < n; ++k) {
      const int s = (rank + k) % n;
      dev::storeSys(dev::twoShotArea(a, s, phase, 1) + static_cast<uint64_t>(rank) * slot + i * 16,
                    y.u);
    }
    dev::storeVec<T, kAligned>(out, v, a.count, y);
  }

  // 4. Gather the other segments as their owners send them.
  const char* gather = dev::twoShotArea(a, rank, phase, 1);
  for (uint64_t i = first; i < L && ok; i += stride) {
    for (int k = 1; k < n && ok; ++k) {
      const int s = (rank + k) % n;
      const uint64_t v = static_cast<uint64_t>(s) * L + i;
      if (v >= V) continue;
      Vec x;
      ok = dev::pollVec<T>(gather + static_cast<uint64_t>(s) * slot + i * 16, &x, waiter, s, epoch);
      if (ok) dev::storeVec<T, kAligned>(out, v, a.count, x);
    }
  }

  if (blockIdx.x == 0 && threadIdx.x == 0) st->tsVecs[phase] = static_cast<uint32_t>(L);
  dev::finishEpoch(st->tsEpoch, dev::nextPushEpoch(epoch));
}

}  // namespace

cudaError_t launchTwoShotPush(anyrDataType_t dtype, const AllReduceArgs& a,
                              const LaunchShape& shape, cudaStream_t stream) {
  return dev::dispatch(dtype, shape.aligned, [&](auto tag) {
    using Tag = decltype(tag);
    return launchKernel(twoShotPushKernel<typename Tag::T, Tag::kAligned>, dim3(shape.blocks),
                        dim3(shape.threads), 0, stream, shape.pdl, a);
  });
}

cudaError_t twoShotPushResidentPerSm(int* least) {
  return dev::lowerResidentPerSm(
      kAlgoThreads,
      [](auto tag) {
        using Tag = decltype(tag);
        return twoShotPushKernel<typename Tag::T, Tag::kAligned>;
      },
      least);
}

}  // namespace anyr
