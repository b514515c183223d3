// Per-(kernel, device) facts asked of the runtime once and kept: raising a kernel's dynamic
// shared-memory limit, and how many clusters of a shape are resident at once. Function
// attributes and occupancy queries, not stream operations: allowed during graph capture.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace anyr {

cudaError_t allowDynamicSmem(const void* kernel, size_t bytes);

// How many one-dimensional clusters of `clusterBlocks` blocks of `threads` threads (no dynamic
// shared memory) of `kernel` the current device holds at once (cudaOccupancyMaxActiveClusters),
// into *clusters.
cudaError_t residentClusters(const void* kernel, int clusterBlocks, int threads, int* clusters);

}  // namespace anyr
