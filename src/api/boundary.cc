#include "api/boundary.h"

#include <algorithm>
#include <cstring>

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

void copyText(const std::string& s, char* buf, size_t len, size_t* needed) {
  ANYR_REQUIRE_ARG(buf != nullptr || len == 0, "buf", "must not be NULL when len > 0");
  if (needed != nullptr) *needed = s.size() + 1;
  if (buf != nullptr && len > 0) {
    const size_t n = std::min(len - 1, s.size());
    std::memcpy(buf, s.data(), n);
    buf[n] = '\0';
  }
}

}  // namespace anyr
