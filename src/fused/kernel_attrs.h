// Per-(kernel, device) facts asked of the runtime once and kept: raising a kernel's dynamic
// shared-memory limit, how many clusters of a shape or blocks are resident at once, a device's
// SM count, cluster support and L2 size. Function
// attributes and occupancy queries, not stream operations: allowed during graph capture.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace anyr {

// Raises `kernel`'s dynamic shared-memory limit on the current device to `bytes`, or to what the
// device gives a block of it (its opt-in limit less the kernel's static shared memory) where
// that is less; launches that need more then fail. Once per (kernel, device).
cudaError_t allowDynamicSmem(const void* kernel, size_t bytes);

// How many one-dimensional clusters of `clusterBlocks` blocks of `threads` threads (no dynamic
// shared memory) of `kernel` the current device holds at once (cudaOccupancyMaxActiveClusters),
// into *clusters.
cudaError_t residentClusters(const void* kernel, int clusterBlocks, int threads, int* clusters);

// How many blocks of `threads` threads and `smem` dynamic shared-memory bytes of `kernel` one SM
// of the current device holds at once (cudaOccupancyMaxActiveBlocksPerMultiprocessor), at least
// 1, into *blocks.
cudaError_t residentBlocksPerSm(const void* kernel, int threads, size_t smem, int* blocks);

// The current device, its SM count, whether it launches thread-block clusters
// (cudaDevAttrClusterLaunch) and its L2 cache size in bytes (cudaDevAttrL2CacheSize).
struct DeviceFacts {
  int device = 0;
  int sms = 1;
  bool clusters = false;
  int64_t l2Bytes = 0;
};
cudaError_t currentDeviceFacts(DeviceFacts* facts);

}  // namespace anyr
