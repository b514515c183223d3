// One-shot pull ("oneshot-pull"): the one-shot pull kernel (oneshot_pull.cuh, where the
// protocol and its safety are described) reading every peer at once, with the configured wire.
#include "algo/oneshot_pull.cuh"
#include "device/launch.cuh"

namespace anyr {

using oneshot::PullKernelOf;
using oneshot::PullOrder;

cudaError_t launchOneShotPull(anyrDataType_t dtype, const AllReduceArgs& a,
                              const LaunchShape& shape, cudaStream_t stream) {
  return dev::launchWireTagged(dtype, a, shape, stream, [](auto tag, auto wire) {
    return PullKernelOf<PullOrder::AllAtOnce, decltype(wire)::value>{}(tag);
  });
}

cudaError_t oneShotPullResidentPerSm(int* least) {
  for (int w : {kWireNative, kWireFp8, kWireInt8}) {
    const cudaError_t e = dev::dispatchWire(w, [&](auto wire) {
      return dev::lowerResidentPerSm(
          kAlgoThreads, PullKernelOf<PullOrder::AllAtOnce, decltype(wire)::value>{}, least);
    });
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace anyr
