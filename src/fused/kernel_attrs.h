// Raising a kernel's dynamic shared-memory limit once per (kernel, device). A function
// attribute, not a stream operation: allowed during graph capture.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace anyr {

cudaError_t allowDynamicSmem(const void* kernel, size_t bytes);

}  // namespace anyr
