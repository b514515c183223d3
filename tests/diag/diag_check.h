// The diagnostic tools' (tests/diag) shared pieces: the error check (on a CUDA error, prints
// where and why and exits with status 1), the GPU count and the command-line helpers.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#define DIAG_CHECK(x)                                                                  \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

// The number of visible GPUs, or 0 after printing "<tool>: no CUDA GPU visible; nothing to
// measure" (the tool then exits with status 0).
inline int diagGpuCount(const char* tool) {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
    std::printf("%s: no CUDA GPU visible; nothing to measure\n", tool);
    return 0;
  }
  return ndev;
}

// Whether argv[i] is the switch `name` (an option without a value); sets *on where it is.
inline bool diagSwitch(const char* arg, const char* name, bool* on) {
  if (std::strcmp(arg, name) != 0) return false;
  *on = true;
  return true;
}

// Whether the option argv[i] has its value argv[i + 1]; prints "<tool>: '<option>' needs a
// value" where it has not (the tool then exits with status 2).
inline bool diagHasValue(const char* tool, int i, int argc, char** argv) {
  if (i + 1 < argc) return true;
  std::fprintf(stderr, "%s: '%s' needs a value\n", tool, argv[i]);
  return false;
}
