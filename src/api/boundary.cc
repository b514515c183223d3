#include "api/boundary.h"

namespace anyr {

namespace {
thread_local std::string tlsLastError;
}

void record(anyrComm_t comm, const std::string& msg) {
  tlsLastError = msg;
  if (comm != nullptr) {
    std::lock_guard<std::mutex> lock(comm->mu);
    comm->lastError = msg;
  }
}

const std::string& threadLastError() { return tlsLastError; }

}  // namespace anyr
