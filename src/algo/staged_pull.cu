// Staged pull ("staged-pull"): the one-shot pull (oneshot_pull.cuh: staging, flags, buffers,
// rank-order reduction, hence the same bits) with its reads scheduled in rounds. In round k
// (k = 1..n-1) every rank reads peer rank + k only: each GPU reads from one peer and serves one
// reader at a time, instead of n - 1 of each (all-to-all peer traffic collapses on PCIe boxes:
// staged_push.cu). With two ranks there is one round: the one-shot pull.
//
// How the rounds are kept, and why: a read's address depends on the data of the read before it
// (oneshot::afterData), so each thread has one read in flight, round after round, and its next
// vector's first read waits for its last one. Without that dependence the SM issues a thread's
// n - 1 independent loads back to back: the one-shot pull. Loads are non-posted, so the wait is
// the round itself (one round trip); there is no flag per round, since every peer's data was
// staged before its flag, and the flags (one 4-byte store per peer and block, raised once) are
// the one-shot pull's. Rounds over the whole grid or block would add barriers without changing
// what the fabric sees: every thread starts its rounds together after the same flag wait.
//
// Exactness: rank r's rounds read ranks r + 1..n - 1, then 0..r - 1 in ascending order. The
// first group waits in registers, indexed by round (so no dynamic indexing: the unrolled loop's
// index is a constant); the second is added to the fp32 sum as it comes, then r's own vector,
// then the waiting ones: the rank-order sum 0..n - 1 of every other algorithm.
//
// The compressed wire (docs/WIRE.md) is not staged: this launcher runs the native wire whatever
// the setting (as the two-shot pull does). The cost model (algo/cost.cc, stagedPullUs) charges
// each round a ring hop's round trip.
#include "algo/oneshot_pull.cuh"
#include "device/launch.cuh"

namespace anyr {

using oneshot::PullKernelOf;
using oneshot::PullOrder;

cudaError_t launchStagedPull(anyrDataType_t dtype, const AllReduceArgs& a, const LaunchShape& shape,
                             cudaStream_t stream) {
  return launchTagged(dtype, a, shape, stream, PullKernelOf<PullOrder::Staged, kWireNative>{});
}

cudaError_t stagedPullResidentPerSm(int* least) {
  return dev::lowerResidentPerSm(kAlgoThreads, PullKernelOf<PullOrder::Staged, kWireNative>{},
                                 least);
}

}  // namespace anyr
