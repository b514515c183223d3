// The communicator's capabilities (core/capabilities.h): the agreed grid caps and the probes.
#include "core/capabilities.h"

#include <algorithm>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "algo/algo.h"
#include "base/env.h"
#include "base/error.h"
#include "base/json_text.h"
#include "base/names.h"
#include "core/context.h"
#include "fused/fused.h"
#include "fused/fused_algo.h"
#include "topology/probe.h"
#include "topology/probe_kernels.h"

namespace anyr {

// ---- First contact -------------------------------------------------------------------------

namespace {

// "12.4" from CUDA's 12040.
std::string cudaVersionText(int v) {
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

cudaError_t identifyDevice(int device, int* major, int* minor, std::string* name) {
  cudaDeviceProp prop{};
  const cudaError_t e = cudaGetDeviceProperties(&prop, device);
  if (e != cudaSuccess) return e;
  *major = prop.major;
  *minor = prop.minor;
  *name = prop.name;
  return cudaSuccess;
}

}  // namespace

const DeviceProbes& realDeviceProbes() {
  static const DeviceProbes probes{&cudaGetDeviceCount, &cudaDriverGetVersion,
                                   &cudaRuntimeGetVersion, &probekernels::kernelImageStatus,
                                   &identifyDevice};
  return probes;
}

const char* builtCudaTargets() {
#if defined(ANYR_CUDA_ARCHITECTURES) && defined(ANYR_CUDA_FAMILY_TARGETS)
  // Both lists as CMake was given them, ';' written as ','.
  static const std::string text =
      std::string("CMAKE_CUDA_ARCHITECTURES=") + ANYR_CUDA_ARCHITECTURES +
      (std::string(ANYR_CUDA_FAMILY_TARGETS).empty()
           ? std::string()
           : std::string(" and ANYR_CUDA_FAMILY_TARGETS=") + ANYR_CUDA_FAMILY_TARGETS);
  return text.c_str();
#else
  return "targets not recorded in this build";
#endif
}

int requireDriverAndGpu(const DeviceProbes& probes) {
  int count = 0;
  const cudaError_t e = probes.deviceCount(&count);
  int driver = 0;
  int runtime = 0;
  if (probes.driverVersion(&driver) != cudaSuccess) driver = 0;
  if (probes.runtimeVersion(&runtime) != cudaSuccess) runtime = 0;
  const std::string runtimeText = runtime > 0 ? "CUDA " + cudaVersionText(runtime) : "CUDA";
  if (e == cudaErrorInsufficientDriver && driver == 0) {
    throwError(anyrCudaError,
               "no NVIDIA driver was found (the CUDA driver library, libcuda.so.1, is not "
               "installed or not visible to this process), so there is no GPU to run on: run on "
               "a machine with an NVIDIA GPU and its driver installed (nvidia-smi lists the "
               "GPUs); in a container, start it with the GPUs exposed (docker run --gpus all, "
               "the NVIDIA Container Toolkit)");
  }
  if (e == cudaErrorInsufficientDriver) {
    throwError(anyrCudaError,
               "the NVIDIA driver supports up to CUDA " + cudaVersionText(driver) +
                   ", older than the " + runtimeText +
                   " runtime this build of anyreduce uses: update the NVIDIA driver (nvidia-smi "
                   "shows the CUDA version it supports), or rebuild anyreduce with a CUDA "
                   "toolkit no newer than " +
                   cudaVersionText(driver));
  }
  if (e == cudaErrorSystemDriverMismatch) {
    throwError(anyrCudaError,
               "the NVIDIA kernel module and the driver library differ in version (a driver "
               "update without a reboot?): reboot, or reinstall the NVIDIA driver "
               "(cudaErrorSystemDriverMismatch)");
  }
  if (e == cudaErrorNoDevice || (e == cudaSuccess && count <= 0)) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    std::string why = "the NVIDIA driver (CUDA " + cudaVersionText(driver) + ") found no GPU";
    if (visible != nullptr) {
      why += std::string(" among those CUDA_VISIBLE_DEVICES='") + visible + "' leaves visible";
    }
    throwError(anyrCudaError,
               why +
                   ": run on a machine with an NVIDIA GPU (nvidia-smi lists them), or make one "
                   "visible (CUDA_VISIBLE_DEVICES)");
  }
  if (e != cudaSuccess) {
    throwError(anyrCudaError, std::string("CUDA could not list the GPUs: ") + cudaGetErrorName(e) +
                                  " (" + cudaGetErrorString(e) + ")");
  }
  return count;
}

void requireKernelsFor(int device, const DeviceProbes& probes) {
  const cudaError_t e = probes.kernelImage();
  if (e == cudaSuccess) return;
  int major = 0;
  int minor = 0;
  std::string name = "unknown";
  if (probes.identify(device, &major, &minor, &name) != cudaSuccess) name = "unknown";
  const std::string cc = std::to_string(major) + "." + std::to_string(minor);
  const std::string sm = std::to_string(major * 10 + minor);
  const std::string gpu = "GPU " + std::to_string(device) + " (" + name + ")";
  const std::string rebuild = "-DCMAKE_CUDA_ARCHITECTURES=" + sm;
  if (e == cudaErrorNoKernelImageForDevice || e == cudaErrorInvalidDeviceFunction) {
    std::string msg = "this build of anyreduce has no kernels for compute capability " + cc +
                      " (sm_" + sm + ") of " + gpu + ": it was compiled for " + builtCudaTargets() +
                      "; rebuild with " + rebuild + " (or add " + sm +
                      " to that list), e.g. cmake -S . -B build " + rebuild +
                      " -DANYR_CUDA_FAMILY_TARGETS= && cmake --build build";
    if (major * 10 + minor < 75) {
      // Below the README's floor: the rebuild is the only way, but nobody has run it there.
      msg += "; anyreduce is written for compute capability 7.5 and newer: on " + cc +
             " that rebuild is untested, and needs a CUDA toolkit that still compiles for sm_" +
             sm + " (12.x or older)";
    }
    throwError(anyrUnsupported, msg);
  }
  if (e == cudaErrorUnsupportedPtxVersion) {
    int driver = 0;
    if (probes.driverVersion(&driver) != cudaSuccess) driver = 0;
    throwError(anyrCudaError, "the NVIDIA driver (CUDA " + cudaVersionText(driver) +
                                  ") cannot compile this build's PTX for compute capability " + cc +
                                  " (sm_" + sm + ") of " + gpu +
                                  ": update the NVIDIA driver, or rebuild with machine " +
                                  "code for this GPU: " + rebuild);
  }
  throwError(anyrCudaError, "loading anyreduce's kernels on " + gpu + " failed: " +
                                cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

// ---- The communicator's capabilities -------------------------------------------------------

void Capabilities::agreeGridCaps() {
  // Every block of a launch must be resident at once on every rank (blocks wait on the
  // same-index block of peers). Fused and host kernels: at most one block per SM of the
  // smallest GPU. The peer all-reduce kernels (small blocks, few registers): as many per SM as
  // the occupancy of every variant allows on every rank, at most kPeerBlocksPerSm.
  int minSm = 1 << 30;
  for (const GpuInfo& g : ctx_.topo.gpus) minSm = std::min(minSm, g.smCount > 0 ? g.smCount : 1);
  maxBlocks_ = std::min(minSm, kMaxBlocks);
  // The fused two-shot's register form likewise (at most kFusedDensePerSm) in blocks of
  // kFusedDenseThreads threads, for launches of more rows than SMs (fusedTwoShotShape); and
  // the cluster forms at two blocks per SM, per kernel variant (form x dtype x quantization;
  // fusedClusterPairBlocks). One gather agrees on all of them.
  struct PerSm {
    int32_t peer, fused;
    int32_t pairThreads[kClusterPairVariants];
  };
  PerSm perSm{kPeerBlocksPerSm, kFusedDensePerSm, {}};
  for (const AlgoInfo& r : algoRegistry()) {
    if (r.residentPerSm != nullptr) ANYR_CUDA_CHECK(r.residentPerSm(&perSm.peer));
  }
  ANYR_CUDA_CHECK(fusedTwoShotDenseResidentPerSm(&perSm.fused));
  for (anyrAlgo_t algo : {anyrAlgoOneShotPush, anyrAlgoTwoShotPush}) {
    for (anyrDataType_t dt : {anyrFloat16, anyrBfloat16}) {
      for (int q : {anyrQuantNone, anyrQuantFp8, anyrQuantNvfp4}) {
        int threads = kFusedClusterMaxThreads;
        ANYR_CUDA_CHECK(algo == anyrAlgoOneShotPush
                            ? fusedOneShotClusterPairThreads(dt, q, &threads)
                            : fusedTwoShotClusterPairThreads(dt, q, &threads));
        perSm.pairThreads[clusterPairVariant(algo, dt, q)] = threads;
      }
    }
  }
  for (const PerSm& o : ctx_.bs->allGatherValue(perSm)) {
    perSm.peer = std::min(perSm.peer, o.peer);
    perSm.fused = std::min(perSm.fused, o.fused);
    for (int v = 0; v < kClusterPairVariants; ++v) {
      perSm.pairThreads[v] = std::min(perSm.pairThreads[v], o.pairThreads[v]);
    }
  }
  for (int v = 0; v < kClusterPairVariants; ++v) {
    clusterPairThreads_[static_cast<size_t>(v)] = perSm.pairThreads[v];
  }
  // Not where ranks share a GPU: their grids would need four blocks per SM at once.
  clusterPairBlocks_ = ctx_.facts.distinctDevices ? std::min(minSm * 2, kMaxBlocks) : 0;
  peerPerSm_ = std::max(1, static_cast<int>(perSm.peer));
  peerBlocks_ = std::min(minSm * peerPerSm_, kMaxBlocks);
  fusedDenseBlocks_ = std::min(minSm * std::max(1, static_cast<int>(perSm.fused)), kMaxBlocks);
  if (ctx_.cfg.maxBlocks > 0) {
    maxBlocks_ = std::min(maxBlocks_, ctx_.cfg.maxBlocks);
    peerBlocks_ = std::min(peerBlocks_, ctx_.cfg.maxBlocks);
    fusedDenseBlocks_ = std::min(fusedDenseBlocks_, ctx_.cfg.maxBlocks);
    clusterPairBlocks_ = std::min(clusterPairBlocks_, ctx_.cfg.maxBlocks);
  }
  if (clusterPairBlocks_ <= maxBlocks_) clusterPairBlocks_ = 0;
}

// A probe's round trip on the internal stream: `bytes` of zeroed device memory (stream-ordered,
// so no device-wide synchronization), `launch` on them, read back into `hostOut`; every wait
// bounded (waitStreamIdle), none behind other work on the GPU. Returns the launch's own error
// (a refused launch leaves no sticky error, and hostOut then holds what the memset left); throws on
// any other failure.
cudaError_t Capabilities::probeOnStream(
    const char* what, size_t bytes, void* hostOut,
    const std::function<cudaError_t(void*, cudaStream_t)>& launch) {
  void* d = nullptr;
  ANYR_CUDA_CHECK(cudaMallocAsync(&d, bytes, ctx_.internalStream));
  cudaError_t e = cudaMemsetAsync(d, 0, bytes, ctx_.internalStream);
  if (e == cudaSuccess) {
    e = launch(d, ctx_.internalStream);
    if (e != cudaSuccess) (void)cudaGetLastError();
  } else {
    (void)cudaFreeAsync(d, ctx_.internalStream);
    ANYR_CUDA_CHECK(e);
  }
  ctx_.waitStreamIdle(ctx_.internalStream, what);
  // The stream is idle: this copy (to pageable memory, so it returns when done) waits for
  // nothing else.
  const cudaError_t c =
      cudaMemcpyAsync(hostOut, d, bytes, cudaMemcpyDeviceToHost, ctx_.internalStream);
  (void)cudaFreeAsync(d, ctx_.internalStream);
  ANYR_CUDA_CHECK(c);
  ctx_.waitStreamIdle(ctx_.internalStream, what);
  return e;
}

void Capabilities::probeProgrammaticLaunch() {
  if (env::getInt("ANYR_PDL") == 0) {
    pdlReason_ = "off (ANYR_PDL=0); not probed";
    return;
  }
  int got = 0;
  const cudaError_t e = probeOnStream(
      "the programmatic-launch probe", sizeof(int), &got, [](void* word, cudaStream_t s) {
        return probekernels::launchDependentPair(static_cast<int*>(word), s);
      });
  pdlOn_ = dependentLaunchWorks(e, got, &pdlReason_);
  // Each peer, host and fused kernel then releases the next launch right after its own wait
  // (the fused two-shot's dense shape excepted: launchFusedRows).
  releaseEarly_ = pdlOn_ && env::getInt("ANYR_PDL_EARLY") != 0 ? 1 : 0;
}

void Capabilities::probeNvfp4Encoder() {
  int got = -1;
  ANYR_CUDA_CHECK(
      probeOnStream("the NVFP4 encoder probe", sizeof(int), &got, [](void* word, cudaStream_t s) {
        return launchE2m1InstructionProbe(static_cast<int*>(word), s);
      }));
  if (got != 0 && got != 1) {
    throwError(anyrCudaError,
               "the NVFP4 encoder probe's kernel wrote " + std::to_string(got) + ", not 0 or 1");
  }
  nvfp4Instruction_ = got == 1;
  nvfp4Reason_ =
      nvfp4Instruction_
          ? "the machine code this GPU runs has the e2m1 conversion instruction (a family-specific "
            "build target: ANYR_CUDA_FAMILY_TARGETS)"
          : "fp32 arithmetic: the machine code this GPU runs has no e2m1 conversion instruction "
            "(compute capability 10.0 to 12.x and a family-specific build target have it: "
            "ANYR_CUDA_FAMILY_TARGETS)";
}

void Capabilities::probeClusters() {
  // Every rank probes (its GPU may differ), then all agree: a launch shape that differs
  // between ranks is harmless to the protocol, but every choice is the communicator's.
  struct Vote {
    int32_t ok;
  };
  Vote mine{0};
  std::string why;
  if (ctx_.cfg.fusedCluster == 1) {
    why = "off (config.fusedCluster / ANYR_FUSED_CLUSTER = 1); not probed";
  } else if (!ctx_.topo.gpus.empty() &&
             !ctx_.topo.gpus[static_cast<size_t>(ctx_.rank)].clusterLaunch) {
    why = "the GPU has no thread-block clusters (cudaDevAttrClusterLaunch = 0)";
  } else {
    unsigned int got[4] = {0, 0, 0, 0};
    const cudaError_t e =
        probeOnStream("the cluster probe", sizeof(got), got, [](void* out, cudaStream_t s) {
          return probekernels::launchClusterExchange(static_cast<unsigned int*>(out), s);
        });
    if (e != cudaSuccess) {
      why = std::string("the probe's cluster launch was refused: ") + cudaGetErrorString(e);
    } else if (got[0] != 0x5101u || got[1] != 0x5100u) {
      std::ostringstream os;
      os << "the probe's blocks read 0x" << std::hex << got[0] << " and 0x" << got[1]
         << " through distributed shared memory, not 0x5101 and 0x5100";
      why = os.str();
    } else if (got[2] != 0x5201u || got[3] != 0x5200u) {
      std::ostringstream os;
      os << "the probe's blocks received 0x" << std::hex << got[2] << " and 0x" << got[3]
         << " by asynchronous stores into each other's shared memory (st.async with an "
            "mbarrier), not 0x5201 and 0x5200";
      why = os.str();
    } else {
      mine.ok = 1;
      why =
          "the probe's cluster launch, distributed shared memory and asynchronous stores "
          "into a peer block's shared memory worked";
    }
  }
  const std::vector<Vote> votes = ctx_.bs->allGatherValue(mine);
  clusterOn_ = true;
  for (size_t r = 0; r < votes.size(); ++r) {
    if (votes[r].ok == 0) {
      clusterOn_ = false;
      if (static_cast<int>(r) != ctx_.rank && mine.ok != 0) {
        why = "rank " + std::to_string(r) + "'s probe did not pass";
      }
    }
  }
  clusterReason_ = why;
}

std::string Capabilities::clusterPairThreadsJson() const {
  nlohmann::json j = nlohmann::json::object();
  for (anyrAlgo_t algo : {anyrAlgoOneShotPush, anyrAlgoTwoShotPush}) {
    nlohmann::json byType = nlohmann::json::object();
    for (anyrDataType_t dt : {anyrFloat16, anyrBfloat16}) {
      nlohmann::json byQuant = nlohmann::json::object();
      for (int q : {0, 1, 2}) {
        byQuant[quantName(q)] = clusterPairThreads(algo, dt, q);
      }
      byType[dtypeShortName(dt)] = byQuant;
    }
    j[anyrAlgoName(algo)] = byType;
  }
  return jsonText(j);
}

int Capabilities::clusterPairVariant(anyrAlgo_t algo, anyrDataType_t dtype, int quant) {
  if ((dtype != anyrFloat16 && dtype != anyrBfloat16) || quant < 0 || quant > 2) return -1;
  return (algo == anyrAlgoOneShotPush ? 0 : 6) + (dtype == anyrFloat16 ? 0 : 3) + quant;
}

int Capabilities::clusterPairThreads(anyrAlgo_t algo, anyrDataType_t dtype, int quant) const {
  const int v = clusterPairVariant(algo, dtype, quant);
  return v < 0 ? 0 : clusterPairThreads_[static_cast<size_t>(v)];
}

}  // namespace anyr
