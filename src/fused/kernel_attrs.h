// Per-(kernel, device) facts asked of the runtime once and kept: raising a kernel's dynamic
// shared-memory limit, and how many clusters of a shape are resident at once. Function
// attributes and occupancy queries, not stream operations: allowed during graph capture.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace anyr {

// Raises `kernel`'s dynamic shared-memory limit on the current device to `bytes`, or to what the
// device gives a block of it (its opt-in limit less the kernel's static shared memory) where
// that is less; launches that need more then fail. Once per (kernel, device).
cudaError_t allowDynamicSmem(const void* kernel, size_t bytes);

// How many one-dimensional clusters of `clusterBlocks` blocks of `threads` threads (no dynamic
// shared memory) of `kernel` the current device holds at once (cudaOccupancyMaxActiveClusters),
// into *clusters.
cudaError_t residentClusters(const void* kernel, int clusterBlocks, int threads, int* clusters);

}  // namespace anyr
