// The per-block flag barrier of the pull algorithms (the two-shot's start and end rounds, and
// the fused pull kernels' rounds): block b of this rank raises its flag at every peer, then
// waits for block b of every peer to have raised the same flag. A flag carries the block's use
// count (dev::flagUseOf), so a block only ever pairs with the same-index block of its peers,
// and every rank must launch the same grid (the shape comes from agreed values only).
#pragma once

#include "device/common.cuh"

namespace anyr {
namespace dev {

// Raises flag `isEnd` (false: start, true: end) for this block on every peer (not where the
// communicator stopped: stopRequested), then waits for every peer's. Thread t < nranks handles
// peer t: its release store orders the block's earlier stores (the barrier before it makes them
// the thread's to order) before the flag; its acquire load orders the peer's stores before the
// block's later loads (the barrier after it). Every thread of the block calls it; the answer is
// the block's: false when a wait was abandoned (the communicator is then failed, and the
// waiter recorded which rank it waited for and why).
__device__ __forceinline__ bool blockBarrier(const AllReduceArgs& a, bool isEnd, uint32_t use,
                                             bool stopped) {
  __shared__ int blockFailed;
  const int rank = a.rank;
  const int n = a.nranks;
  const int t = static_cast<int>(threadIdx.x);
  if (t == 0) blockFailed = 0;
  __syncthreads();
  if (t < n && t != rank) {
    FlagArea* peer = reinterpret_cast<FlagArea*>(a.peerWorkspace[t] + a.layout.flagsOffset);
    uint32_t* f = isEnd ? &peer->end[blockIdx.x][rank] : &peer->start[blockIdx.x][rank];
    if (!stopped) storeReleaseSys(f, use);
    const FlagArea* own =
        reinterpret_cast<const FlagArea*>(a.peerWorkspace[rank] + a.layout.flagsOffset);
    const uint32_t* w = isEnd ? &own->end[blockIdx.x][t] : &own->start[blockIdx.x][t];
    Waiter waiter(a.wait);
    while (static_cast<int32_t>(loadAcquireSys(w) - use) < 0) {
      if (!waiter.keepWaiting(t, isEnd ? kWaitEndFlag : kWaitStartFlag, use)) {
        blockFailed = 1;
        break;
      }
    }
  }
  __syncthreads();
  return blockFailed == 0;
}

}  // namespace dev
}  // namespace anyr
