// Doubling push ("doubling-push"): the one-shot push (oneshot_push.cuh: protocol, buffers,
// clearing, rank-order reduction, hence the same bits) with its vectors relayed in
// ceil(log2 n) rounds (algo/doubling_schedule.h). In round j every rank stores everything it
// holds, its own vectors and those relayed to it in the rounds before, into one partner's slots
// of the same sources; the set it holds doubles each round. Each GPU sends the one-shot's
// n - 1 vectors a thread in all, to ceil(log2 n) peers instead of n - 1: one outbound and one
// inbound flow a round, like the staged push, but 3 rounds at 8 ranks instead of 7. Where a
// loaded synchronisation round costs a per-peer term (PCIe: 0.36-0.45 us idle against 6-7 us
// with every GPU talking to all 7 peers on 8 x RTX PRO 6000, tests/fixtures), three one-peer
// hops cost less than one all-to-all round, and less than the staged push's seven. With islands
// (topology/islands.h) the rounds that cross them go first, where a flow carries one vector.
//
// A relayed vector is stored once it has arrived (the Lamport data is its own flag), so a round
// waits only for what the rounds before brought, on thread t of the partner that stored it:
// the same co-residency rule as the one-shot's reduction, and no deadlock (round 0 waits for
// nothing; what round j waits for is stored in a round before j by a rank that reaches it by
// the same argument). A wait names the rank that stores into the slot waited on (the relay,
// which may itself be waiting for the source). A stopped rank stores nothing, relays included.
// With two ranks there is one round: the one-shot push.
#include "algo/oneshot_push.cuh"
#include "device/launch.cuh"

namespace anyr {

using oneshot::PushKernelOf;
using oneshot::PushOrder;

cudaError_t launchDoublingPush(anyrDataType_t dtype, const AllReduceArgs& a,
                               const LaunchShape& shape, cudaStream_t stream) {
  return launchTagged(dtype, a, shape, stream, PushKernelOf<PushOrder::Doubling>{});
}

cudaError_t doublingPushResidentPerSm(int* least) {
  return dev::lowerResidentPerSm(kAlgoThreads, PushKernelOf<PushOrder::Doubling>{}, least);
}

}  // namespace anyr
