// One error idiom inside the library: functions throw anyr::Error (result code + message);
// the C API boundary (src/api/api.cc) catches it once, records the message and returns the
// code. Nothing inside the library exits or aborts the process.
#pragma once

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

#include "anyreduce/anyreduce.h"

namespace anyr {

class Error : public std::runtime_error {
 public:
  Error(anyrResult_t code, const std::string& msg) : std::runtime_error(msg), code_(code) {}
  anyrResult_t code() const { return code_; }

 private:
  anyrResult_t code_;
};

[[noreturn]] void throwError(anyrResult_t code, const std::string& msg);
[[noreturn]] void throwCuda(cudaError_t err, const char* expr, const char* file, int line);
[[noreturn]] void throwErrno(const std::string& what);

// Adds one line of context ("while X") to an in-flight error and rethrows it.
[[noreturn]] void rethrowWithContext(const Error& e, const std::string& context);

}  // namespace anyr

#define ANYR_CUDA_CHECK(expr)                                  \
  do {                                                         \
    cudaError_t anyr_err_ = (expr);                            \
    if (anyr_err_ != cudaSuccess) {                            \
      ::anyr::throwCuda(anyr_err_, #expr, __FILE__, __LINE__); \
    }                                                          \
  } while (0)

// Throws anyrInvalidArgument naming the argument and the rule when `cond` is false.
#define ANYR_REQUIRE_ARG(cond, arg, rule)                                                          \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      ::anyr::throwError(anyrInvalidArgument, std::string("argument '") + (arg) + "': " + (rule)); \
    }                                                                                              \
  } while (0)
