// First contact (core/capabilities.h): the messages for a machine without an NVIDIA driver, with
// a driver older than the runtime, without a GPU, and for a GPU this build has no kernels for,
// pinned with injected CUDA answers; and, on a machine without the NVIDIA device nodes, the
// real answer through the public API.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "anyreduce/anyreduce.h"
#include "core/capabilities.h"
#include "cpu/expect_error.h"

namespace anyr {
namespace {

// The injected answers; each test sets what it needs (Answers{} is a healthy H100 machine).
struct Answers {
  cudaError_t count = cudaSuccess;
  int devices = 2;
  int driver = 13000;
  int runtime = 13000;
  cudaError_t image = cudaSuccess;
  int major = 9, minor = 0;
  const char* name = "NVIDIA H100 80GB HBM3";
};
Answers gAnswers;

DeviceProbes injected() {
  DeviceProbes p{};
  p.deviceCount = [](int* n) {
    *n = gAnswers.count == cudaSuccess ? gAnswers.devices : 0;
    return gAnswers.count;
  };
  p.driverVersion = [](int* v) {
    *v = gAnswers.driver;
    return cudaSuccess;
  };
  p.runtimeVersion = [](int* v) {
    *v = gAnswers.runtime;
    return cudaSuccess;
  };
  p.kernelImage = [] { return gAnswers.image; };
  p.identify = [](int, int* major, int* minor, std::string* name) {
    *major = gAnswers.major;
    *minor = gAnswers.minor;
    *name = gAnswers.name;
    return cudaSuccess;
  };
  return p;
}

// Sets or clears CUDA_VISIBLE_DEVICES for one test, restoring it after.
class VisibleDevices {
 public:
  explicit VisibleDevices(const char* value) {
    if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) saved_ = v;
    if (value != nullptr) {
      setenv("CUDA_VISIBLE_DEVICES", value, 1);
    } else {
      unsetenv("CUDA_VISIBLE_DEVICES");
    }
  }
  ~VisibleDevices() {
    if (saved_) {
      setenv("CUDA_VISIBLE_DEVICES", saved_->c_str(), 1);
    } else {
      unsetenv("CUDA_VISIBLE_DEVICES");
    }
  }

 private:
  std::optional<std::string> saved_;
};

TEST(DeviceCheck, HealthyMachineCountsItsGpus) {
  gAnswers = Answers{};
  EXPECT_EQ(requireDriverAndGpu(injected()), 2);
  requireKernelsFor(0, injected());  // does not throw
}

TEST(DeviceCheck, NoDriverSaysSoAndWhatToDo) {
  gAnswers = Answers{};
  gAnswers.count = cudaErrorInsufficientDriver;  // what CUDA answers without libcuda.so.1
  gAnswers.driver = 0;
  expectError(
      [] { requireDriverAndGpu(injected()); }, anyrCudaError,
      {"no NVIDIA driver was found", "no GPU to run on",
       "run on a machine with an NVIDIA GPU and its driver installed", "docker run --gpus all"},
      "a machine without a driver was accepted");
  try {
    requireDriverAndGpu(injected());
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find("insufficient"), std::string::npos) << e.what();
  }
}

TEST(DeviceCheck, DriverOlderThanTheRuntimeSaysBothVersions) {
  gAnswers = Answers{};
  gAnswers.count = cudaErrorInsufficientDriver;
  gAnswers.driver = 12040;
  gAnswers.runtime = 13000;
  expectError([] { requireDriverAndGpu(injected()); }, anyrCudaError,
              {"the NVIDIA driver supports up to CUDA 12.4, older than the CUDA 13.0 runtime",
               "update the NVIDIA driver", "no newer than 12.4"},
              "a driver older than the runtime was accepted");
}

TEST(DeviceCheck, NoGpuNamesCudaVisibleDevices) {
  gAnswers = Answers{};
  gAnswers.count = cudaErrorNoDevice;
  {
    VisibleDevices hidden("");
    expectError([] { requireDriverAndGpu(injected()); }, anyrCudaError,
                {"the NVIDIA driver (CUDA 13.0) found no GPU",
                 "among those CUDA_VISIBLE_DEVICES='' leaves visible",
                 "make one visible (CUDA_VISIBLE_DEVICES)"},
                "a machine without a GPU was accepted");
  }
  {
    VisibleDevices unset(nullptr);
    expectError([] { requireDriverAndGpu(injected()); }, anyrCudaError,
                "the NVIDIA driver (CUDA 13.0) found no GPU: run on a machine with an NVIDIA GPU",
                "a machine without a GPU was accepted");
  }
  // No error but no device either reads the same.
  gAnswers.count = cudaSuccess;
  gAnswers.devices = 0;
  expectError([] { requireDriverAndGpu(injected()); }, anyrCudaError, "found no GPU",
              "zero GPUs were accepted");
}

TEST(DeviceCheck, GpuWithoutKernelsInThisBuildIsRefusedWithTheRebuild) {
  gAnswers = Answers{};
  gAnswers.image = cudaErrorNoKernelImageForDevice;  // a V100 under the default build
  gAnswers.major = 7;
  gAnswers.minor = 0;
  gAnswers.name = "Tesla V100-SXM2-16GB";
  expectError([] { requireKernelsFor(0, injected()); }, anyrUnsupported,
              {"this build of anyreduce has no kernels for compute capability 7.0 (sm_70) of GPU "
               "0 (Tesla V100-SXM2-16GB)",
               std::string("it was compiled for ") + builtCudaTargets(),
               "rebuild with -DCMAKE_CUDA_ARCHITECTURES=70 (or add 70 to that list)",
               "anyreduce is written for compute capability 7.5 and newer"},
              "a GPU without kernels in this build was admitted");
  // The older error code of the same situation; a GPU above the floor gets no caveat.
  gAnswers.image = cudaErrorInvalidDeviceFunction;
  gAnswers.major = 10;
  gAnswers.minor = 3;
  gAnswers.name = "NVIDIA B300";
  try {
    requireKernelsFor(1, injected());
    ADD_FAILURE() << "a GPU without kernels in this build was admitted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(e.code(), anyrUnsupported);
    EXPECT_NE(m.find("compute capability 10.3 (sm_103) of GPU 1 (NVIDIA B300)"), std::string::npos)
        << m;
    EXPECT_NE(m.find("-DCMAKE_CUDA_ARCHITECTURES=103"), std::string::npos) << m;
    EXPECT_EQ(m.find("7.5 and newer"), std::string::npos) << m;
  }
}

TEST(DeviceCheck, PtxTheDriverCannotCompileAsksForANewerDriver) {
  gAnswers = Answers{};
  gAnswers.image = cudaErrorUnsupportedPtxVersion;
  gAnswers.driver = 12080;
  gAnswers.major = 12;
  gAnswers.minor = 1;
  expectError([] { requireKernelsFor(0, injected()); }, anyrCudaError,
              {"the NVIDIA driver (CUDA 12.8) cannot compile this build's PTX for compute "
               "capability 12.1 (sm_121)",
               "update the NVIDIA driver", "-DCMAKE_CUDA_ARCHITECTURES=121"},
              "PTX the driver cannot compile was accepted");
}

TEST(DeviceCheck, BuildRecordsItsTargets) {
  const std::string t = builtCudaTargets();
  EXPECT_EQ(t.rfind("CMAKE_CUDA_ARCHITECTURES=", 0), 0u) << t;
  EXPECT_EQ(t.find(';'), std::string::npos) << t;
}

// The real path, where the machine has no NVIDIA device nodes (CI, a laptop): the public check
// and communicator init both say there is no driver or no GPU, in words, through the same
// message. Skipped on GPU machines (it would initialize CUDA in this process).
TEST(DeviceCheck, DriverlessMachineIsToldSoByInitAndTheCheck) {
  if (::access("/dev/nvidiactl", F_OK) == 0) GTEST_SKIP() << "NVIDIA device nodes present";
  auto saysNoGpu = [](const std::string& m) {
    return m.find("no NVIDIA driver was found") != std::string::npos ||
           m.find("found no GPU") != std::string::npos;
  };
  int count = -1;
  EXPECT_EQ(anyrCheckDevices(&count), anyrCudaError);
  EXPECT_EQ(count, 0);
  std::string m = anyrGetLastError(nullptr);
  EXPECT_EQ(m.rfind("anyrCheckDevices: ", 0), 0u) << m;
  EXPECT_TRUE(saysNoGpu(m)) << m;
  EXPECT_EQ(anyrCheckDevices(nullptr), anyrCudaError);

  anyrUniqueId id;
  ASSERT_EQ(anyrGetUniqueId(&id), anyrSuccess) << anyrGetLastError(nullptr);
  anyrComm_t comm = nullptr;
  EXPECT_EQ(anyrCommInitRank(&comm, 1, id, 0), anyrCudaError);
  EXPECT_EQ(comm, nullptr);
  m = anyrGetLastError(nullptr);
  EXPECT_TRUE(saysNoGpu(m)) << m;
  EXPECT_EQ(m.find("insufficient"), std::string::npos) << m;
}

}  // namespace
}  // namespace anyr
