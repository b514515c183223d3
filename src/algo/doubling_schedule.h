// The doubling push's schedule (algo/doubling_push.cu): in round j every rank stores every
// vector it holds (its own and those relayed to it in earlier rounds) into one partner's push
// slots, so the set it holds doubles each round and after ceil(log2 n) rounds it holds all n.
// Host and device alike, so that the CPU tests walk the kernel's schedule with the kernel's own
// arithmetic (tests/cpu/test_doubling.cc) and the cost model charges the rounds the kernel runs
// (algo/cost.cc, doublingPushUs).
//
// - n a power of two: recursive doubling. Round j's partner is rank ^ b_j for the bits b_j in
//   `order`; a rank holds {rank ^ x : x in the span of the bits of the rounds before}, sends all
//   of it and receives as much. The bits that separate the most ranks from their island go
//   first (doublingOrder): a round's flows carry 2^j vectors each, so the rounds that cross
//   islands (a switch's uplink, the link between sockets) carry the fewest. With islands of
//   consecutive ranks, 0-3 | 4-7, the partners are rank ^ 4, ^ 1, ^ 2: one vector a flow crosses.
// - Any other n: the same doubling with shifts (Bruck's all-gather). In round j (d = 2^j) rank
//   r holds sources r .. r + d - 1 (mod n), sends the first min(d, n - d) of them to rank r - d
//   and receives as many from rank r + d, which are sources r + d .. r + d + min(d, n - d) - 1.
//
// Every source reaches every rank exactly once, and a rank relays only what it received in an
// earlier round: the kernel's progress argument (each round waits only on the rounds before)
// and its three-phase clearing (each slot is written once a call, by one writer) rest on both.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "device/handles.h"

namespace anyr {
namespace doubling {

// Rounds for n ranks: ceil(log2 n) (0 for one rank, and for more ranks than one communicator
// maps peer to peer, kMaxLocalRanks: there is no schedule).
__host__ __device__ inline int rounds(int n) {
  if (n > kMaxLocalRanks) return 0;
  int r = 0;
  while ((1 << r) < n) ++r;
  return r;
}

__host__ __device__ inline bool powerOfTwo(int n) { return n > 0 && (n & (n - 1)) == 0; }

// Round j of rank `rank`: the partner it stores into, the one it receives from, and the source
// ranks (bit s: rank s's vectors) it sends and receives.
struct Round {
  int to;
  int from;
  uint32_t send;
  uint32_t recv;
};

// The partner bit of round j in a packed order (4 bits a round).
__host__ __device__ inline int orderBit(uint32_t order, int j) {
  return 1 << ((order >> (4 * j)) & 0xF);
}

// The recursive-doubling order for a power-of-two n: the partner bits by how many ranks they
// take out of their island (most first, then the lower bit), packed 4 bits a round (log2 of
// the bit). Islands of one, or none given (map.count < 2): 1, 2, 4.
__host__ __device__ inline uint32_t doublingOrder(const IslandMap& map, int n) {
  const int R = powerOfTwo(n) ? rounds(n) : 0;
  int bits[4] = {0, 1, 2, 3};
  int crossing[4] = {0, 0, 0, 0};
  for (int j = 0; j < R; ++j) {
    for (int r = 0; r < n && map.count >= 2; ++r) {
      if (map.islandOf[r] != map.islandOf[r ^ (1 << j)]) ++crossing[j];
    }
  }
  // Insertion sort of at most three bits: most crossing first, ties by the lower bit.
  for (int i = 1; i < R; ++i) {
    for (int k = i; k > 0 && crossing[bits[k]] > crossing[bits[k - 1]]; --k) {
      const int t = bits[k];
      bits[k] = bits[k - 1];
      bits[k - 1] = t;
    }
  }
  uint32_t order = 0;
  for (int j = 0; j < R; ++j) order |= static_cast<uint32_t>(bits[j]) << (4 * j);
  return order;
}

// Round j of `rank` among n ranks (order: doublingOrder's, used where n is a power of two).
__host__ __device__ inline Round round(int n, uint32_t order, int rank, int j) {
  Round x{rank, rank, 0u, 0u};
  if (j < 0 || j >= rounds(n)) return x;
  if (powerOfTwo(n)) {
    uint32_t span = 0;  // the bits of the rounds before j, or'ed
    for (int i = 0; i < j; ++i) span |= static_cast<uint32_t>(orderBit(order, i));
    const int b = orderBit(order, j);
    x.to = x.from = rank ^ b;
    // Every x in the span: the subsets of its bits.
    for (uint32_t sub = span;; sub = (sub - 1) & span) {
      x.send |= 1u << (rank ^ static_cast<int>(sub));
      x.recv |= 1u << (rank ^ b ^ static_cast<int>(sub));
      if (sub == 0) break;
    }
    return x;
  }
  const int d = 1 << j;
  const int count = d < n - d ? d : n - d;
  x.to = (rank - d % n + n) % n;
  x.from = (rank + d) % n;
  for (int i = 0; i < count; ++i) {
    x.send |= 1u << ((rank + i) % n);
    x.recv |= 1u << ((x.from + i) % n);
  }
  return x;
}

// The rank that stores source s's vectors into `rank`'s slot [s]: the partner of the round in
// which s arrives (-1 for s == rank, which no one stores).
__host__ __device__ inline int writerOf(int n, uint32_t order, int rank, int s) {
  const int R = rounds(n);
  for (int j = 0; j < R; ++j) {
    const Round x = round(n, order, rank, j);
    if (x.recv & (1u << s)) return x.from;
  }
  return -1;
}

// `rank`'s schedule packed for its kernels (device/handles.h, DoublingPlan); an empty plan
// (count 0) for a world with no schedule.
__host__ __device__ inline DoublingPlan planOf(int n, uint32_t order, int rank) {
  DoublingPlan p{0, 0, static_cast<uint32_t>(rounds(n))};
  for (int j = 0; j < static_cast<int>(p.count); ++j) {
    const Round x = round(n, order, rank, j);
    p.rounds |= static_cast<uint64_t>(x.to | (x.send << 4) | (x.from << 12)) << (16 * j);
  }
  for (int s = 0; s < n && s < kMaxLocalRanks; ++s) {
    const int w = writerOf(n, order, rank, s);
    p.writers |= static_cast<uint32_t>(w < 0 ? rank : w) << (4 * s);
  }
  return p;
}

// A packed plan's round j: its partner, the sources it sends and the rank it receives from;
// the writer of source s.
__host__ __device__ inline int planTo(const DoublingPlan& p, int j) {
  return static_cast<int>((p.rounds >> (16 * j)) & 0xF);
}
__host__ __device__ inline int planFrom(const DoublingPlan& p, int j) {
  return static_cast<int>((p.rounds >> (16 * j + 12)) & 0xF);
}
// Whether this rank's wait for source s is first hand: s arrives in round 0, which its writer
// stores before it waits for anything. Any later round's data, the writer's own included, comes
// behind the writer's own waits for what it relays (a thread sends a vector's sources in turn),
// so a wait for it is second hand (kWaitLaterRound) and a missing rank is named by the rank
// that takes its data in round 0, not by a healthy relay waiting on it.
__host__ __device__ inline bool planFirstHand(const DoublingPlan& p, int s) {
  return p.count > 0 && s == planFrom(p, 0);
}
// The kind a failed wait for source s records (device/handles.h, WaitWhat): first hand or not.
__host__ __device__ inline int32_t planWaitWhat(const DoublingPlan& p, int s) {
  return planFirstHand(p, s) ? kWaitPushData : kWaitLaterRound;
}
__host__ __device__ inline uint32_t planSend(const DoublingPlan& p, int j) {
  return static_cast<uint32_t>((p.rounds >> (16 * j + 4)) & 0xFF);
}
__host__ __device__ inline int planWriter(const DoublingPlan& p, int s) {
  return static_cast<int>((p.writers >> (4 * s)) & 0xF);
}

}  // namespace doubling
}  // namespace anyr
