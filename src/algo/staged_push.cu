// Staged push ("staged-push"): the one-shot push (oneshot_push.cuh: protocol, buffers, clearing,
// rank-order reduction, hence the same bits) with its stores scheduled in rounds. In round k
// (k = 1..n-1) every rank stores its whole launch into peer rank + k only: r -> r + k is a
// permutation, so each GPU has one outbound and one inbound stream at a time instead of n - 1
// of each. On 8-GPU PCIe boxes every GPU moving data to every peer at once reaches 0.38-0.44 of
// the links' sum, 0.11 where the flows cross two sockets' fabric (p2pmark figures,
// voipmonitor/rtx6kpro); flashinfer#4393 stages its pushes for that reason. The bytes are the
// same, only their order changes. With two ranks there is one round: the one-shot push.
//
// How the rounds are kept, and why:
// - Loop order alone is no schedule. Stores are posted: a thread does not wait for them. At the
//   sizes this is for a thread holds one vector of a launch, so a loop over rounds issues its
//   n - 1 stores back to back, exactly as the one-shot push does; with several vectors a thread
//   the rounds still overlap as soon as the first one's stores are queued. A round has to wait
//   for something.
// - Rounds over the whole grid (every block done with round k before any starts k + 1) need a
//   barrier per round among the blocks, and one among the ranks for the rounds to line up across
//   GPUs: a flag exchange per round (flashinfer's staged kernels raise a flag at every peer
//   between passes; at 8 ranks its seed takes them only from 32 KB, for that cost).
// - Chosen: rounds per thread, paced by the data. A thread starts round k once its own last
//   vector of round k - 1 has arrived from rank - (k - 1). Lamport data are their own flag, so
//   the handshake costs no store, flag, fence or barrier: only the wait, one one-way hop. The
//   grid is the same on every rank, so thread t waits only for thread t of a peer (the
//   co-residency rule of the one-shot's own reduction). Rank r enters round k right after rank
//   r - k + 1 was in round k - 1, so the ranks move through the rounds together, and a GPU
//   receives the tail of one round and the head of the next at most. It cannot deadlock: round
//   1 waits for nothing, and the data round k waits for is what its sender stores in round
//   k - 1, which the sender reaches by the same argument. The pacing only shapes the traffic:
//   the reduction still waits for every vector itself.
// The price is n - 1 hops in a chain instead of one (loaded) all-to-all round; the cost model
// (algo/cost.cc, stagedPushUs) charges each round as a ring hop and says where that pays. A
// stopped rank stores nothing in any round; every wait is the bounded waiter's, naming the rank
// (kWaitPushData). ANYR_PUSH_FENCE puts its fence after each round's stores.
#include "algo/oneshot_push.cuh"
#include "device/launch.cuh"

namespace anyr {

using oneshot::PushKernelOf;
using oneshot::PushOrder;

cudaError_t launchStagedPush(anyrDataType_t dtype, const AllReduceArgs& a, const LaunchShape& shape,
                             cudaStream_t stream) {
  return launchTagged(dtype, a, shape, stream, PushKernelOf<PushOrder::Staged>{});
}

cudaError_t stagedPushResidentPerSm(int* least) {
  return dev::lowerResidentPerSm(kAlgoThreads, PushKernelOf<PushOrder::Staged>{}, least);
}

}  // namespace anyr
