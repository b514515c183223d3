// A kernel that holds a stream, for the NCCL watchdog's one-GPU test (test_nccl_watchdog.cc):
// placed between a call's first event and its NCCL enqueue, it makes the call overrun its
// deadline without a second GPU.
#pragma once

#include <cuda_runtime_api.h>
#include <stdint.h>

namespace anyr {
namespace wdtest {

// One thread spins until *release (host-mapped memory) is non-zero or maxNs passed on the GPU's
// global timer, whichever comes first (a test that fails still ends).
cudaError_t launchStall(const volatile int* release, uint64_t maxNs, cudaStream_t s);

}  // namespace wdtest
}  // namespace anyr
