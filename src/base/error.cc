#include "base/error.h"

#include <cerrno>
#include <cstring>

namespace anyr {

void throwError(anyrResult_t code, const std::string& msg) { throw Error(code, msg); }

void throwCuda(cudaError_t err, const char* expr, const char* file, int line) {
  const char* base = std::strrchr(file, '/');
  throw Error(anyrCudaError, std::string("CUDA error ") + cudaGetErrorName(err) + " (" +
                                 cudaGetErrorString(err) + ") in " + expr + " at " +
                                 (base ? base + 1 : file) + ":" + std::to_string(line));
}

void throwErrno(const std::string& what) {
  int e = errno;
  throw Error(anyrSystemError, what + ": " + std::strerror(e));
}

void rethrowWithContext(const Error& e, const std::string& context) {
  throw Error(e.code(), std::string(e.what()) + "\n  while " + context);
}

}  // namespace anyr
