// A kernel that fills buffers late, for the tests of launches that may start before the work
// ahead of them on the stream has finished (programmatic dependent launch, test_fused_kernel.cc).
#pragma once

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

namespace anyr {
namespace ordertest {

struct Copy {
  void* dst;
  const void* src;
};

// One kernel on `s` that first lets the launch after it be scheduled at once (on GPUs with
// programmatic dependent launch: that launch then runs during this kernel unless it waits),
// then spins `delayNs` on the global timer, then copies each of copies[0..n) (`bytes` each, a
// multiple of 16, 16-byte aligned buffers). A launch after it that reads a destination before
// waiting sees the old bytes; one that writes a source before waiting has its bytes copied.
cudaError_t copyLate(const Copy* copies, int n, size_t bytes, uint64_t delayNs, cudaStream_t s);

}  // namespace ordertest
}  // namespace anyr
