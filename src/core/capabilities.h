// What the communicator's kernels may use, what was probed and why: the grid caps every rank
// agreed (every block of a launch must be resident at once on every rank), programmatic
// dependent launch, thread-block clusters, and the NVFP4 encoder. Timing only: a launch shape
// or feature that differs between ranks would be harmless to the protocols, but every choice
// here is agreed or probed alike, so that explain and tuning tables say the same on every rank.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <functional>
#include <string>

#include "anyreduce/anyreduce.h"
#include "core/comm_part.h"

namespace anyr {

struct CommContext;

// ---- First contact: the driver, the GPUs, and this build's kernels ---------------------------
// The first CUDA calls of communicator init and of anyrCheckDevices, so that a machine without
// a driver or a GPU, or a GPU this build has no code for, is told so in words with what to do,
// rather than by the CUDA error of whichever call came first.

// The CUDA queries behind requireDriverAndGpu and requireKernelsFor. Tests replace them to pin
// the messages without a GPU (tests/cpu/test_device_check.cc); realDeviceProbes() are CUDA's.
struct DeviceProbes {
  cudaError_t (*deviceCount)(int* count);       // cudaGetDeviceCount
  cudaError_t (*driverVersion)(int* version);   // cudaDriverGetVersion: 0 without a driver
  cudaError_t (*runtimeVersion)(int* version);  // cudaRuntimeGetVersion
  // Loads one of the library's kernels on the current device
  // (probekernels::kernelImageStatus).
  cudaError_t (*kernelImage)();
  // The device's compute capability and name (cudaGetDeviceProperties), for the message.
  cudaError_t (*identify)(int device, int* major, int* minor, std::string* name);
};
const DeviceProbes& realDeviceProbes();

// Returns the number of visible GPUs (at least 1). Throws anyrCudaError saying in words that no
// NVIDIA driver was found, or that it is older than the CUDA runtime this library was built
// with, or that it found no GPU (naming CUDA_VISIBLE_DEVICES where it is set), and what to do.
int requireDriverAndGpu(const DeviceProbes& probes = realDeviceProbes());

// Whether `device`, the current device, can run this build's kernels, decided by loading one
// of them (probes.kernelImage), never from a list of architectures. Throws anyrUnsupported
// naming the device's compute capability, the targets this build carries and the CMake setting
// to rebuild with where it has no code for it; anyrCudaError where the driver cannot compile
// the build's PTX (update the driver, or rebuild with machine code for the GPU).
void requireKernelsFor(int device, const DeviceProbes& probes = realDeviceProbes());

// The CUDA targets this library was compiled for, as CMake was given them (for messages only:
// the decision is requireKernelsFor's probe).
const char* builtCudaTargets();

class Capabilities : private CommPart {
 public:
  using CommPart::CommPart;

  // Collective: the grid caps (maxBlocks, peerBlocks, fusedDenseBlocks, the cluster pair forms)
  // from every rank's SM count and kernel occupancy, capped by config.maxBlocks.
  void agreeGridCaps();
  // Programmatic dependent launch: unless ANYR_PDL=0, probed once (topology/probe_kernels.h)
  // and, where the probe works, used for every kernel the communicator launches on the caller's
  // stream (algorithms, fused kernels, the epilogue). Timing only: ranks need not agree on it.
  void probeProgrammaticLaunch();
  // Thread-block clusters for the fused kernels (fused_algo.h): admitted where every rank's
  // probe launch worked and the agreed config does not turn them off.
  void probeClusters();
  void probeNvfp4Encoder();

  int maxBlocks() const { return maxBlocks_; }
  int peerBlocks() const { return peerBlocks_; }
  int peerPerSm() const { return peerPerSm_; }
  int fusedDenseBlocks() const { return fusedDenseBlocks_; }
  int clusterPairBlocks() const { return clusterPairBlocks_; }
  bool pdlOn() const { return pdlOn_; }
  const std::string& pdlReason() const { return pdlReason_; }
  // Each peer, host and fused kernel releases the next launch right after its own wait
  // (ANYR_PDL_EARLY, where programmatic launch is on): the argument templates' releaseEarly.
  int32_t releaseEarly() const { return releaseEarly_; }
  bool clusterOn() const { return clusterOn_; }
  const std::string& clusterReason() const { return clusterReason_; }
  bool nvfp4Instruction() const { return nvfp4Instruction_; }
  const std::string& nvfp4Reason() const { return nvfp4Reason_; }

  // The index of the (algo: one-shot push, else two-shot push; dtype; quant) variant in
  // clusterPairThreads_, -1 for a dtype or mode without a cluster kernel.
  static int clusterPairVariant(anyrAlgo_t algo, anyrDataType_t dtype, int quant);
  int clusterPairThreads(anyrAlgo_t algo, anyrDataType_t dtype, int quant) const;
  std::string clusterPairThreadsJson() const;  // JSON text, by form, dtype and quantization

 private:
  // A probe's round trip on the internal stream (capabilities.cc).
  cudaError_t probeOnStream(const char* what, size_t bytes, void* hostOut,
                            const std::function<cudaError_t(void*, cudaStream_t)>& launch);

  int maxBlocks_ = 1;   // fused and host kernels: one block per SM of the smallest GPU
  int peerBlocks_ = 1;  // peer all-reduce kernels: up to kPeerBlocksPerSm per SM (occupancy)
  int peerPerSm_ = 1;   // the agreed blocks per SM of the peer kernels
  // The fused two-shot register form's grid cap at kFusedDenseThreads threads a block
  // (fusedTwoShotShape): above maxBlocks_ where every rank holds two such blocks per SM.
  int fusedDenseBlocks_ = 1;
  // The fused cluster forms at two blocks per SM (fused/fused_algo.h, fusedClusterPairBlocks):
  // per kernel variant (one-shot / two-shot x fp16 / bf16 x none / FP8 / NVFP4, aligned
  // buffers) the largest block size at which every rank holds two of its blocks per SM (0:
  // none), and the grid cap there (two per SM of the smallest GPU, within config.maxBlocks and
  // kMaxBlocks; 0 where not admitted).
  static constexpr int kClusterPairVariants = 12;
  std::array<int, kClusterPairVariants> clusterPairThreads_{};
  int clusterPairBlocks_ = 0;
  bool pdlOn_ = false;  // asked for (ANYR_PDL) and the probe launch worked
  std::string pdlReason_;
  int32_t releaseEarly_ = 0;
  bool clusterOn_ = false;  // every rank's cluster probe passed and config.fusedCluster != 1
  std::string clusterReason_;
  bool nvfp4Instruction_ = false;  // the NVFP4 encoder uses the e2m1 conversion instruction
  std::string nvfp4Reason_;
};

}  // namespace anyr
