#include "fused/kernel_attrs.h"

#include <map>
#include <mutex>
#include <set>
#include <tuple>
#include <utility>

namespace anyr {

namespace {

// The most dynamic shared memory a block of `kernel` may have on `device`: the device's opt-in
// limit per block less the kernel's static shared memory.
cudaError_t dynamicSmemLimit(const void* kernel, int device, size_t* bytes) {
  int optin = 0;
  cudaError_t err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (err != cudaSuccess) return err;
  cudaFuncAttributes fa = {};
  err = cudaFuncGetAttributes(&fa, kernel);
  if (err != cudaSuccess) return err;
  const size_t limit = static_cast<size_t>(optin);
  *bytes = limit > fa.sharedSizeBytes ? limit - fa.sharedSizeBytes : 0;
  return cudaSuccess;
}

}  // namespace

cudaError_t allowDynamicSmem(const void* kernel, size_t bytes) {
  static std::mutex mu;
  static std::set<std::pair<const void*, int>> done;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  std::lock_guard<std::mutex> lock(mu);
  if (done.count({kernel, device}) != 0) return cudaSuccess;
  size_t limit = 0;
  err = dynamicSmemLimit(kernel, device, &limit);
  if (err != cudaSuccess) return err;
  if (bytes > limit) bytes = limit;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(bytes));
  if (err == cudaSuccess) done.insert({kernel, device});
  return err;
}

cudaError_t residentClusters(const void* kernel, int clusterBlocks, int threads, int* clusters) {
  static std::mutex mu;
  static std::map<std::tuple<const void*, int, int, int>, int> known;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const auto key = std::make_tuple(kernel, device, clusterBlocks, threads);
  std::lock_guard<std::mutex> lock(mu);
  const auto it = known.find(key);
  if (it != known.end()) {
    *clusters = it->second;
    return cudaSuccess;
  }
  cudaLaunchAttribute attr[1] = {};
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(clusterBlocks);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(clusterBlocks));
  cfg.blockDim = dim3(static_cast<unsigned>(threads));
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int n = 0;
  err = cudaOccupancyMaxActiveClusters(&n, kernel, &cfg);
  if (err != cudaSuccess) return err;
  known.emplace(key, n);
  *clusters = n;
  return cudaSuccess;
}

cudaError_t residentBlocksPerSm(const void* kernel, int threads, size_t smem, int* blocks) {
  static std::mutex mu;
  static std::map<std::tuple<const void*, int, int, size_t>, int> known;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const auto key = std::make_tuple(kernel, device, threads, smem);
  std::lock_guard<std::mutex> lock(mu);
  const auto it = known.find(key);
  if (it != known.end()) {
    *blocks = it->second;
    return cudaSuccess;
  }
  int n = 0;
  err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem);
  if (err != cudaSuccess) return err;
  if (n < 1) n = 1;
  known.emplace(key, n);
  *blocks = n;
  return cudaSuccess;
}

cudaError_t currentDeviceFacts(DeviceFacts* facts) {
  static std::mutex mu;
  static std::map<int, DeviceFacts> known;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  std::lock_guard<std::mutex> lock(mu);
  auto it = known.find(device);
  if (it == known.end()) {
    int n = 0, c = 0, l2 = 0;
    err = cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device);
    if (err != cudaSuccess) return err;
    err = cudaDeviceGetAttribute(&c, cudaDevAttrClusterLaunch, device);
    if (err != cudaSuccess) return err;
    err = cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device);
    if (err != cudaSuccess) return err;
    DeviceFacts f;
    f.device = device;
    f.sms = n > 0 ? n : 1;
    f.clusters = c != 0;
    f.l2Bytes = l2 > 0 ? l2 : 0;
    it = known.emplace(device, f).first;
  }
  *facts = it->second;
  return cudaSuccess;
}

}  // namespace anyr
