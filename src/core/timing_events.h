// CUDA events with timing, owned together: the measurements of the fabric (core/fabric.cc) and
// of tuning (core/tune.cc) record them around their transfers and read the times between them.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

#include "base/error.h"

namespace anyr {

// `count` events, made on construction and destroyed with the owner; where one cannot be made,
// those made are destroyed and the CUDA error is thrown.
class TimingEvents {
 public:
  explicit TimingEvents(size_t count) : e_(count, nullptr) {
    for (cudaEvent_t& x : e_) {
      const cudaError_t r = cudaEventCreate(&x);
      if (r != cudaSuccess) {
        x = nullptr;
        release();
        ANYR_CUDA_CHECK(r);
      }
    }
  }
  ~TimingEvents() { release(); }
  TimingEvents(const TimingEvents&) = delete;
  TimingEvents& operator=(const TimingEvents&) = delete;

  cudaEvent_t operator[](size_t i) const { return e_[i]; }

 private:
  void release() {
    for (cudaEvent_t& x : e_) {
      if (x != nullptr) (void)cudaEventDestroy(x);
      x = nullptr;
    }
  }

  std::vector<cudaEvent_t> e_;
};

}  // namespace anyr
