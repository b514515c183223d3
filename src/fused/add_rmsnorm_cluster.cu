// The standalone kernel's Cluster form (fused/fused.h, AddRmsNormForm): a row spread over the C
// blocks of a thread-block cluster, one 16-byte vector a thread, the sum of squares combined
// through distributed shared memory by the cluster epilogue (fusedRowEpilogueCluster), so the
// bits are every form's. A launch of few rows is bound by the latency of its instructions on
// the SMs it runs on (one row of 6144 in one block of 512 threads: 16 warps of about 580
// instructions on one SM, half its 4.3 us on an H200 spent issuing them), so C SMs take a C-th of
// it each. Cluster k takes rows k, k + K, ... (K clusters); a launch of more rows than clusters
// loops.
#include <type_traits>

#include "device/common.cuh"
#include "device/launch.cuh"
#include "fused/add_rmsnorm.h"
#include "fused/epilogue.cuh"
#include "fused/fused_algo.h"

namespace anyr {
namespace {

constexpr int kEpiFlags = dev::kEpiInputIsT | dev::kEpiNoFailure;

// The wait for the other blocks of the own cluster. They run at the same time (a cluster is
// scheduled whole) and wait for nothing outside the cluster, so the wait ends as soon as they
// got there; bounded anyway (every device wait is): after kLocalWaitNs it gives up, and the row
// and those after it are not written.
constexpr uint64_t kLocalWaitNs = 10ull * 1000 * 1000 * 1000;
struct LocalWait {
  uint32_t spins = 0;
  uint64_t deadline = 0;
  __device__ __forceinline__ bool keepWaiting(int32_t, int32_t, uint32_t) {
    if (++spins % dev::kCheckEvery != 0) return true;
    const uint64_t now = dev::globalTimerNs();
    if (deadline == 0) deadline = now + kLocalWaitNs;
    return now < deadline;
  }
};

// Blocks of fusedClusterThreads(hidden, C) threads, one vector each (at most 512).
// kExitBarrier false: a block that finished its rows leaves without the final cluster barrier.
// Every peer sends into its shared memory only the rows it also takes, and its mbarrier counted
// every byte of its last row before that row finished, so nothing can still arrive; its own
// sends reach peers that wait for them. (A block that gave up a row, a fault, leaves too: its
// peers may have left already, and a barrier with them would not end.)
template <typename T, int Q, bool kAligned, bool kExitBarrier>
__global__ void __launch_bounds__(kFusedClusterMaxThreads, 1)
    addRmsNormClusterKernel(const T* x, FusedParams p, int32_t releaseEarly) {
  __shared__ dev::ClusterExchange xch;
  dev::clusterExchangeBegin(xch);  // shared memory only: before the wait, overlapping it
  dev::waitForPrevious(releaseEarly);
  dev::ClusterRowThread<T, Q, kAligned> me(p);
  me.loadConstants(p);
  const bool xAligned = kAligned || dev::isAligned(x, 16);
  LocalWait waiter;
  uint32_t rowsDone = 0;
  for (int row = me.cluster; row < p.tokens; row += me.clusters) {
    me.loadResidual(p, row);
    dev::Vec xv = {};
    if (me.active) {
      xv = dev::loadWholeVec<T, kAligned>(x + static_cast<int64_t>(row) * p.hidden, me.v, p.hidden,
                                          xAligned);
    }
    dev::RowOutputs<T, Q, kAligned> o(p, row, dev::afterIssuedLoads(me.qscale));
    o.pinScale();
    float acc[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] = dev::vecElem<T>(xv, i);
    if (!dev::fusedRowEpilogueCluster<T, Q, kAligned, LocalWait, kEpiFlags>(
            p, o, me.v, acc, me.res, me.w, xch, rowsDone, true, waiter, 0, 0)) {
      break;
    }
  }
  if (kExitBarrier || rowsDone == 0) dev::clusterExchangeEnd(rowsDone);
}

}  // namespace

cudaError_t launchAddRmsNormCluster(anyrDataType_t dtype, const void* x, const FusedParams& p,
                                    cudaStream_t stream, const AddRmsNormTarget& target,
                                    AddRmsNormShape* shape) {
  const int c = shape->clusterBlocks;
  if ((c != 2 && c != 4 && c != 8) || !fusedClusterFits(p.hidden)) return cudaErrorInvalidValue;
  const int threads = fusedClusterThreads(p.hidden, c);
  // Every row its own cluster, within two blocks per SM (more rows loop over the clusters).
  const int most = (2 * target.sms) / c > 0 ? (2 * target.sms) / c : 1;
  const int clusters = p.tokens < most ? p.tokens : most;
  shape->threads = threads;
  shape->vpt = 1;
  shape->blocks = clusters * c;
  shape->smem = 0;
  const bool aligned = fusedBuffersAligned(x, p);
  return dev::dispatchDtype<true>(dtype, [&](auto tag) {
    using T = typename decltype(tag)::T;
    const T* xt = static_cast<const T*>(x);
    auto go = [&](auto kernel) {
      return launchClusterKernel(kernel, dim3(static_cast<unsigned>(shape->blocks)),
                                 dim3(static_cast<unsigned>(threads)), static_cast<unsigned>(c), 0,
                                 stream, target.pdl, xt, p,
                                 addRmsNormReleaseArg(target, shape->blocks));
    };
    auto pick = [&](auto exitBarrier) {
      constexpr bool kExit = decltype(exitBarrier)::value;
      if (!aligned) return go(addRmsNormClusterKernel<T, dev::kQuantAtRunTime, false, kExit>);
      return dev::dispatchQuant(p.quant, [&](auto q) {
        return go(addRmsNormClusterKernel<T, decltype(q)::value, true, kExit>);
      });
    };
    return target.clusterExitBarrier ? pick(std::true_type{}) : pick(std::false_type{});
  });
}

}  // namespace anyr
