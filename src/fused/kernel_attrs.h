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

// Lowers *threads (a multiple of 32) to the largest block size at which an SM of the current
// device holds two blocks of each of the `count` kernels (no dynamic shared memory,
// cudaOccupancyMaxActiveBlocksPerMultiprocessor); 0 where not even blocks of 32 threads do.
cudaError_t lowerPairThreads(const void* const* kernels, int count, int* threads);

}  // namespace anyr
