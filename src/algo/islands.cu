// Islands: a two-level all-reduce for GPUs in groups (under one PCIe switch, or one socket;
// topology/islands.h, or ANYR_ISLANDS), by peer writes with the value-sentinel protocol of
// lamport.cuh: no flags, no barriers.
//
// The result must be every other algorithm's bits: the fp32 sum in rank order 0..n-1, rounded
// once. A hierarchical sum (each island's partial, then the partials) rounds in another order,
// so no island reduces anything on its own: the owner of a slice sums all n ranks' own values
// of it in rank order, and what crosses between islands is those values, raw.
//
// The message is cut into S slices, S the least common multiple of the island sizes; in an
// island of m ranks, member k owns slices k, k + m, k + 2m, ... (S / m of them, 1/m of the
// message). Every slice has one owner in every island. Rank r, member k of island c:
//   1. gather: every vector of a slice r does not own goes to that slice's owner in c, raw,
//      into slot [r] of the owner's scatter buffer (m - 1 peers, (m - 1)/m of the message);
//   2. exchange: for every slice r owns, r sends its own vector and, as they arrive, its island
//      peers' vectors, into slot [source rank] of the scatter buffer of the slice's owner in
//      every other island ("member j of A with member j of B" for equal islands); it receives
//      theirs the same way, so it then holds every rank's value of its slices;
//   3. reduce: sums those n values in rank order (fp32), rounds once, writes the output and
//      sends the result into slot [r] of its island peers' gather buffers;
//   4. all-gather: copies the slices it does not own from its gather buffer as their owners
//      send them.
// The owners of one slice in different islands sum the same values in the same order, so
// every rank gets the same bits.
//
// Cost, honestly: the values cross the island boundary unreduced. Per rank, (k - 1) x the
// message leaves for the other k - 1 islands, and inside the island 2 (m - 1)/m of it. With two
// islands that is the message once, as many bytes across as the two-shot's reduce-scatter and
// all-gather together (2 (n - m)/n of the message per rank), but to one partner a slice instead
// of n - m; with k islands k/2 times the two-shot's. The one-shot sends (n - 1) x the message,
// n - m of them across. Three dependent hops (gather, exchange, all-gather) instead of the
// one-shot's one. Summing each island apart and adding the islands' sums would cut what
// crosses to 1/m of that (2/m for 16-bit data, whose partials need fp32), but in another order
// than the rank-order sum's. The order is kept only by a chain: with islands of consecutive
// ranks, the owner in island c continues the fp32 partial of its slice that the owner in island
// c - 1 passed on, and the last island's owner rounds and sends the result back. That form is
// not built: its k - 1 hops across (the islands' partials in turn) and the result's way back
// replace the exchange's one hop, k - 1 more dependent hops; ranks must be numbered island by
// island; and by islandsUs's terms on the switches fixture (8 ranks, 4 + 4) it would be ahead
// of the best of this form, the doubling push and NCCL only at 64-128 KB, by less than a tenth
// (20.3 us at 128 KB against NCCL's 22.2).
// src/algo/cost.cc (islandsUs) charges what this file does. The steps are algo/islands.cuh's
// (the fused kernel, fused/fused_islands.cu, runs them too); the index arithmetic is
// algo/islands_schedule.h's, which tests/cpu/test_islands.cc walks for every layout of 2..6
// ranks.
//
// Buffers: the two-shot push's (twoShotArea: per phase a scatter and a gather buffer of n slots)
// and its launch count (LocalState::tsEpoch, tsVecs): the plain and fused two-shot push and
// this kernel are one family, whose launches rotate one set of three phases. Each launch clears
// in its own buffers the first tsVecs[prev] vectors of every peer slot of the previous phase,
// and records in tsVecs[cur] the most vectors any slot of its phase got (here the owner of the
// most slices, in the smallest island: S / min size x L), so whichever member of the family
// runs next clears what this one wrote. The argument that a peer writes phase (j-1)%3 again
// only after this rank's launch j completed is oneshot_push.cu's: every owner's result needs
// every rank's values, so no rank finishes launch j+1 before every rank started it. A launch
// carries at most islandLaunchBytes of the message (each slot holds the busiest owner's share).
//
// No wait depends on a later one: the gather's writes (1) wait for nothing; the exchange (2)
// waits only for gathered values (1), and runs over all owned vectors before any reduction, so
// no rank's exchange waits on a reduction; the reductions (3) wait for exchanged values; the
// all-gather (4) for reductions. So waits across blocks and ranks (the owner of a vector is
// not the thread that sent it) always end, every block of the grid being resident.
//
// Exactness details are lamport.cuh's: values are sanitized before they are sent (a 16-bit -0.0
// is sent as +0.0, which does not change any rank-order sum, whose accumulator starts at +0.0;
// the fp32 word 0x80008000 as -0.0, on every rank alike), and the rounded result is sanitized
// before it goes to the island (its 16-bit -0.0 cannot occur: the accumulator is never -0.0 and
// a nonzero sum of 16-bit values is at least their smallest subnormal; its fp32 0x80008000
// reads as -0.0, as in the two-shot push).
// In place is safe: every input vector is read only by the thread that writes its output (steps
// 1 and 4 walk the message alike, steps 2 and 3 the owned vectors alike), before it does.
#include "algo/algo.h"
#include "algo/islands.cuh"
#include "algo/twoshot_push.cuh"
#include "device/launch.cuh"

namespace anyr {
namespace {

using dev::sanitize;
using dev::Vec;

template <typename T, bool kAligned>
__global__ void __launch_bounds__(kAlgoThreads, kPeerBlocksPerSm) islandsKernel(AllReduceArgs a) {
  LocalState* st = a.state;
  const dev::PushStart start = dev::startPushKernel(a, &LocalState::tsEpoch);
  const dev::Phases ph = start.epoch;
  const bool stopped = start.stopped;
  const T* in = static_cast<const T*>(a.input);
  T* out = static_cast<T*>(a.output);
  const dev::IslandsGrid g(a, a.numVecs);
  auto load = [&](uint32_t v) {
    Vec x = dev::loadVec<T, kAligned>(in, v, a.count);
    sanitize<T>(x);
    return x;
  };

  // 1. Gather: every vector of a slice another member owns, to that member.
  dev::islandsGather(a, g, ph.cur, stopped, load);

  // Clear, in this rank's own buffers, what peers wrote one launch ago.
  dev::twoShotClear(a, ph);

  // 2. Exchange: the own and the island's values of every owned vector, to the other islands.
  dev::Waiter waiter(a.wait);
  bool ok = dev::islandsExchange<T>(a, g, ph, stopped, waiter, load);

  // 3. Reduce every owned vector in rank order, write it, send it to the island.
  if (ok) {
    ok = dev::islandsReduce<T, false>(a, g, ph, waiter, load, [&](uint32_t v, const Vec& y) {
      dev::storeVec<T, kAligned>(out, v, a.count, y);
    });
  }

  // 4. All-gather: the vectors other members own, as they send them (second hand: an owner sends
  // a result once its own waits of steps 2 and 3 are done).
  for (uint32_t v = g.first; v < g.V && ok; v += g.stride) {
    int owner = 0;
    const char* at = dev::islandsGathered(a, g, ph.cur, v, &owner);
    if (owner == a.rank) continue;
    Vec x;
    ok = dev::pollVec<T>(at, &x, waiter, owner, ph.epoch, kWaitLaterRound);
    if (ok) dev::storeVec<T, kAligned>(out, v, a.count, x);
  }

  // Every slot of this phase got at most the busiest owner's places.
  dev::finishPushKernel(st->tsEpoch, st->tsVecs, ph, islands::slotExtent(a.islands, g.L));
}

// The kernel for a dispatch tag (dev::KernelTag).
const auto islandsKernelOf = [](auto tag) {
  using Tag = decltype(tag);
  return islandsKernel<typename Tag::T, Tag::kAligned>;
};

}  // namespace

cudaError_t launchIslands(anyrDataType_t dtype, const AllReduceArgs& a, const LaunchShape& shape,
                          cudaStream_t stream) {
  if (a.islands.count < 2) return cudaErrorInvalidValue;  // admission refuses it before this
  return launchTagged(dtype, a, shape, stream, islandsKernelOf);
}

cudaError_t islandsResidentPerSm(int* least) {
  return dev::lowerResidentPerSm(kAlgoThreads, islandsKernelOf, least);
}

}  // namespace anyr
