// One-shot push ("oneshot-push"): the one-shot push kernel (oneshot_push.cuh, where the
// protocol and its safety are described) with every rank storing into every peer at once.
#include "algo/oneshot_push.cuh"
#include "device/launch.cuh"

namespace anyr {

using oneshot::PushKernelOf;
using oneshot::PushOrder;

cudaError_t launchOneShotPush(anyrDataType_t dtype, const AllReduceArgs& a,
                              const LaunchShape& shape, cudaStream_t stream) {
  return launchTagged(dtype, a, shape, stream, PushKernelOf<PushOrder::AllAtOnce>{});
}

cudaError_t oneShotPushResidentPerSm(int* least) {
  return dev::lowerResidentPerSm(kAlgoThreads, PushKernelOf<PushOrder::AllAtOnce>{}, least);
}

}  // namespace anyr
