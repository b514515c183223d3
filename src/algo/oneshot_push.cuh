// One-shot push ("Lamport" protocol): the kernel of three algorithms that differ only in the
// order of their peer traffic (PushOrder): "oneshot-push" sends to every peer at once
// (oneshot_push.cu), "staged-push" one peer per round (staged_push.cu, which says why),
// "doubling-push" one partner per round with relays, ceil(log2 n) rounds (doubling_push.cu).
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
// may land while this rank is still in call j. Where in call j the clearing runs does not
// matter to that argument (the staged orders clear after their first round). Nor who writes a
// slot: in the doubling order slot [s] is written by the partner that relays rank s's vectors,
// once a call, and that partner too needs this rank's call-j+1 vectors (relayed or not) to
// finish call j+1.
//
// The clear pattern and sanitizing are described in lamport.cuh.
//
// Sums run in fp32 in rank order 0..n-1 on every rank, whatever order the vectors arrived in:
// outputs are bit-identical, and the same for both orders.
#pragma once

#include "algo/algo.h"
#include "algo/doubling_schedule.h"
#include "device/lamport.cuh"

namespace anyr {
namespace oneshot {

// Which peers a rank's stores go to, and when.
enum class PushOrder {
  AllAtOnce,  // every vector to every peer, nearest peer first (one round)
  Staged,     // round k = 1..n-1: every vector to peer rank + k only, paced by what arrives
  Doubling,   // round j < ceil(log2 n): every vector held (own and relayed) to one partner
              // (algo/doubling_schedule.h), paced by what arrives
};

template <typename T, bool kAligned, PushOrder kOrder>
__global__ void __launch_bounds__(kAlgoThreads, kPeerBlocksPerSm)
    oneShotPushKernel(AllReduceArgs a) {
  using dev::Vec;
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
  // Which rank stores each source's vectors into this rank's slots: what a wait names. The
  // doubling order's relay, from this rank's schedule (packed on the host,
  // AllReduceArgs::doubling); the other orders: the source itself.
  auto writerOf = [&](int s) {
    if constexpr (kOrder == PushOrder::Doubling) {
      return doubling::planWriter(a.doubling, s);
    } else {
      return s;
    }
  };
  // A wait's kind: data that its writer stores before waiting for anything (every order's first
  // round) is first hand; a later round's comes behind the writer's own waits, so a wait for it
  // is second hand (kWaitLaterRound: it gives up after the first-hand waits, and the rank that
  // waits for a missing rank first hand names it, not a healthy writer held up by it).
  auto waitKind = [&](int s) -> int32_t {
    if constexpr (kOrder == PushOrder::Doubling) {
      return doubling::planWaitWhat(a.doubling, s);
    } else if constexpr (kOrder == PushOrder::Staged) {
      return s == (rank - 1 + n) % n ? kWaitPushData : kWaitLaterRound;
    } else {
      return kWaitPushData;
    }
  };
  // This thread's own vectors into slot [rank] of peer p only (nothing once stopped): a round
  // of the staged order, the first of the doubling order.
  [[maybe_unused]] auto pushOwnTo = [&](int p) {
    char* dst = a.peerWorkspace[p] + a.layout.pushOffset + phase * phaseBytes +
                static_cast<uint64_t>(rank) * slot;
    for (uint64_t v = first; v < a.numVecs; v += stride) {
      Vec x = dev::loadVec<T, kAligned>(in, v, a.count);
      dev::sanitize<T>(x);
      if (dev::opaque(stopped)) continue;
      dev::storeSys(dst + v * 16, x.u);
    }
    if (a.pushFence) __threadfence_system();
  };

  // 1. Push this rank's vectors into slot [rank] of every peer: all at once, nearest peer first;
  //    or (staged) round 1 only, the clearing of 2. running while it is in flight.
  if constexpr (kOrder == PushOrder::AllAtOnce) {
    for (uint64_t v = first; v < a.numVecs; v += stride) {
      Vec x = dev::loadVec<T, kAligned>(in, v, a.count);
      dev::sanitize<T>(x);
      if (dev::opaque(stopped)) continue;
      for (int k = 1; k < n; ++k) {
        int p = (rank + k) % n;
        char* dst = a.peerWorkspace[p] + a.layout.pushOffset + phase * phaseBytes +
                    static_cast<uint64_t>(rank) * slot + v * 16;
        dev::storeSys(dst, x.u);
      }
    }

    if (a.pushFence) __threadfence_system();
  } else if constexpr (kOrder == PushOrder::Staged) {
    pushOwnTo((rank + 1) % n);
  } else {
    pushOwnTo(doubling::planTo(a.doubling, 0));
  }

  // 2. Clear, in this rank's own buffer, what peers wrote one call ago.
  char* own = a.peerWorkspace[rank] + a.layout.pushOffset;
  dev::clearPeerSlots(own + ph.prev * phaseBytes, slot, n, rank, st->pushVecs[ph.prev]);

  dev::Waiter waiter(a.wait);
  bool ok = true;
  const char* cur = own + phase * phaseBytes;
  // Vector v of source s: this rank's own from the input, a peer's from its slot once it has
  // arrived (false: the wait was abandoned).
  auto fetch = [&](uint64_t v, int s, Vec* x) {
    if (s == rank) {
      *x = dev::loadVec<T, kAligned>(in, v, a.count);
      dev::sanitize<T>(*x);
      return true;
    }
    return dev::pollVec<T>(cur + static_cast<uint64_t>(s) * slot + v * 16, x, waiter, writerOf(s),
                           epoch, waitKind(s));
  };
  if constexpr (kOrder == PushOrder::Staged) {
    // Rounds 2..n-1, each once this thread's last vector of the round before has come from
    // rank - (k - 1) (the Lamport data is the handshake: staged_push.cu). Only pacing: the
    // reduction below waits for every vector itself.
    if (first < a.numVecs) {
      const uint64_t last = first + (a.numVecs - 1 - first) / stride * stride;
      for (int k = 2; k < n && ok; ++k) {
        const int from = (rank - (k - 1) + n) % n;
        Vec x;
        ok = dev::pollVec<T>(cur + static_cast<uint64_t>(from) * slot + last * 16, &x, waiter, from,
                             epoch, waitKind(from));
        if (ok) pushOwnTo((rank + k) % n);
      }
    }
  } else if constexpr (kOrder == PushOrder::Doubling) {
    // Rounds 1.., each relaying what earlier rounds brought: every vector of the round's send set
    // but the own, polled from this rank's slots as it arrives (the only wait: relayed data
    // that has not come cannot be sent), stored into the partner's slot of the same source.
    const int R = static_cast<int>(a.doubling.count);
    for (int j = 1; j < R && ok; ++j) {
      const uint32_t send = doubling::planSend(a.doubling, j);
      char* dst = a.peerWorkspace[doubling::planTo(a.doubling, j)] + a.layout.pushOffset +
                  phase * phaseBytes;
      for (uint64_t v = first; v < a.numVecs && ok; v += stride) {
        for (int s = 0; s < n; ++s) {
          if (!(send & (1u << s))) continue;
          Vec x;
          if (!fetch(v, s, &x)) {
            ok = false;
            break;
          }
          if (dev::opaque(stopped)) continue;
          dev::storeSys(dst + static_cast<uint64_t>(s) * slot + v * 16, x.u);
        }
      }
      if (a.pushFence) __threadfence_system();
    }
  }

  // 3. Reduce in rank order as peers' vectors arrive.
  for (uint64_t v = first; v < a.numVecs && ok; v += stride) {
    float acc[dev::Elem<T>::kPerVec] = {};
    for (int s = 0; s < n; ++s) {
      Vec x;
      if (!fetch(v, s, &x)) {
        ok = false;
        break;
      }
      dev::accumulate<T>(acc, x);
    }
    if (ok) dev::storeVec<T, kAligned>(out, v, a.count, dev::packVec<T>(acc));
  }

  dev::finishPushKernel(st->pushEpoch, st->pushVecs, ph, a.numVecs);
}

// The kernel of `order` for a dispatch tag (dev::KernelTag).
template <PushOrder kOrder>
struct PushKernelOf {
  template <typename Tag>
  auto operator()(Tag) const {
    return oneShotPushKernel<typename Tag::T, Tag::kAligned, kOrder>;
  }
};

}  // namespace oneshot
}  // namespace anyr
