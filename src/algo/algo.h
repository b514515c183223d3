// Host-side entry points of the device algorithms. One .cu file per algorithm; each takes
// the plain AllReduceArgs struct and a launch shape, and returns the launch's cudaError_t.
#pragma once

#include <cuda_runtime_api.h>

#include "anyreduce/anyreduce.h"
#include "transport/device_handles.h"
#include "transport/host_handles.h"

namespace anyr {

constexpr int kAlgoThreads = 512;

struct LaunchShape {
  int blocks = 1;
  int threads = kAlgoThreads;  // <= kAlgoThreads, a multiple of 32
  bool aligned = false;        // input and output are 16-byte aligned
  bool pdl = false;            // programmatic dependent launch (algo/launch.cuh); one-shot push
};

cudaError_t launchOneShotPush(anyrDataType_t dtype, const AllReduceArgs& a,
                              const LaunchShape& shape, cudaStream_t stream);
cudaError_t launchOneShotPull(anyrDataType_t dtype, const AllReduceArgs& a,
                              const LaunchShape& shape, cudaStream_t stream);
cudaError_t launchTwoShotPush(anyrDataType_t dtype, const AllReduceArgs& a,
                              const LaunchShape& shape, cudaStream_t stream);
cudaError_t launchTwoShot(anyrDataType_t dtype, const AllReduceArgs& a, const LaunchShape& shape,
                          cudaStream_t stream);
// Host-memory transport (host_oneshot.cu, host_twoshot.cu); a.wire selects the wire format.
// host_oneshot_ll.cu: the one-shot's low-latency protocol (native wire, small launches).
cudaError_t launchHostOneShot(anyrDataType_t dtype, const HostArgs& a, const LaunchShape& shape,
                              cudaStream_t stream);
cudaError_t launchHostOneShotLL(anyrDataType_t dtype, const HostArgs& a, const LaunchShape& shape,
                                cudaStream_t stream);
cudaError_t launchHostTwoShot(anyrDataType_t dtype, const HostArgs& a, const LaunchShape& shape,
                              cudaStream_t stream);

}  // namespace anyr
