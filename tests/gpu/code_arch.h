// What the test binary's device code was compiled for. The library is built with the same
// CUDA targets, so this is also the library's: a build from PTX of an older target (run by JIT
// compilation on a newer GPU) has none of the newer target's instructions, whatever the GPU has.
#pragma once

#include <cuda_runtime_api.h>

namespace anyr {
namespace codearch {

// __CUDA_ARCH__ of the device code the current device runs (e.g. 750 for compute_75 PTX on any
// GPU, 900 for sm_90 machine code), into *arch. Synchronous.
cudaError_t deviceCodeArch(int* arch);

}  // namespace codearch
}  // namespace anyr
