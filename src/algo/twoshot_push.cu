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
#include "algo/twoshot_push.cuh"
#include "device/launch.cuh"

namespace anyr {
namespace {

using dev::Vec;

template <typename T, bool kAligned>
__global__ void __launch_bounds__(kAlgoThreads, kPeerBlocksPerSm)
    twoShotPushKernel(AllReduceArgs a) {
  LocalState* st = a.state;
  const dev::PushStart start = dev::startPushKernel(a, &LocalState::tsEpoch);
  const dev::Phases ph = start.epoch;
  const T* in = static_cast<const T*>(a.input);
  T* out = static_cast<T*>(a.output);
  const int rank = a.rank;
  const int n = a.nranks;
  const uint64_t slot = a.layout.tsSlotBytes;
  const uint64_t V = a.numVecs;
  const dev::SegmentGrid g((V + n - 1) / n, V);
  auto load = [&](uint64_t v) { return dev::loadVec<T, kAligned>(in, v, a.count); };

  // 1. Scatter every peer's segment to it.
  dev::twoShotScatter<T>(a, g, ph.cur, start.stopped, load);

  // 2. Clear, in this rank's own buffers, what peers wrote one launch ago.
  dev::twoShotClear(a, ph);

  // 3. Reduce the own segment and send it to every peer.
  dev::Waiter waiter(a.wait);
  bool ok = dev::twoShotReduce<T, 1>(a, g, ph, waiter, load, [&](uint64_t v, const Vec& y) {
    dev::storeVec<T, kAligned>(out, v, a.count, y);
  });

  // 4. Gather the other segments as their owners send them.
  const char* gather = dev::twoShotArea(a, rank, ph.cur, 1);
  for (uint64_t i = g.first; i < g.L && ok; i += g.stride) {
    for (int k = 1; k < n && ok; ++k) {
      const int s = (rank + k) % n;
      const uint64_t v = static_cast<uint64_t>(s) * g.L + i;
      if (v >= V) continue;
      Vec x;
      // Second hand: owner s sends its segment once its own reduce-scatter waits are done.
      ok = dev::pollVec<T>(gather + static_cast<uint64_t>(s) * slot + i * 16, &x, waiter, s,
                           ph.epoch, kWaitLaterRound);
      if (ok) dev::storeVec<T, kAligned>(out, v, a.count, x);
    }
  }

  dev::finishPushKernel(st->tsEpoch, st->tsVecs, ph, g.L);
}

// The kernel for a dispatch tag (dev::KernelTag).
const auto twoShotPushKernelOf = [](auto tag) {
  using Tag = decltype(tag);
  return twoShotPushKernel<typename Tag::T, Tag::kAligned>;
};

}  // namespace

cudaError_t launchTwoShotPush(anyrDataType_t dtype, const AllReduceArgs& a,
                              const LaunchShape& shape, cudaStream_t stream) {
  return launchTagged(dtype, a, shape, stream, twoShotPushKernelOf);
}

cudaError_t twoShotPushResidentPerSm(int* least) {
  return dev::lowerResidentPerSm(kAlgoThreads, twoShotPushKernelOf, least);
}

}  // namespace anyr
