// NVML power / clock / utilization sampling for the doctor, loaded with dlopen at run time
// (no link-time NVML dependency; without NVML every reading is reported as unavailable).
#pragma once

#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace anyr {
namespace doctor {

struct GpuStatic {
  int index = -1;
  std::string name;
  std::string busId;
  double powerLimitW = -1;
  double maxSmMHz = -1;
};

struct Sample {
  double t = 0;  // seconds since the run's t0 (CLOCK_MONOTONIC)
  double powerW = -1;
  double smMHz = -1;
  double utilPct = -1;
};

// Seconds on CLOCK_MONOTONIC (the same clock in every process of the machine).
double monotonicSeconds();

class NvmlSampler {
 public:
  // True when NVML is loaded and initialized (tried once per process).
  static bool available(std::string* why);
  static int deviceCount();
  // GPUs by NVML index, or by PCI bus id ("0000:1b:00.0"; CUDA's spelling is accepted).
  static bool describe(int index, GpuStatic* out);
  static bool describeBusId(const std::string& busId, GpuStatic* out);

  // Samples the given GPUs (NVML indices) every intervalMs on a background thread.
  void start(const std::vector<int>& indices, int intervalMs, double t0);
  void stop();
  // samples()[i] belongs to indices[i]. Call after stop().
  const std::vector<std::vector<Sample>>& samples() const { return samples_; }
  ~NvmlSampler() { stop(); }

 private:
  std::vector<int> indices_;
  std::vector<std::vector<Sample>> samples_;
  std::thread thread_;
  std::atomic<bool> running_{false};
};

}  // namespace doctor
}  // namespace anyr
