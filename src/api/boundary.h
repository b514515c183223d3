// The C API boundary's one error idiom: run a body, catch anyr::Error once, record its message
// for anyrGetLastError (per thread, and per communicator when one is involved), and return
// the result code. Every exported function of the library goes through guarded().
#pragma once

#include <memory>
#include <mutex>
#include <new>
#include <string>

#include "anyreduce/anyreduce.h"
#include "base/error.h"
#include "base/log.h"

namespace anyr {
class Communicator;
}

struct anyrComm {
  std::unique_ptr<anyr::Communicator> impl;
  std::mutex mu;
  std::string lastError;
};

namespace anyr {

// Records `msg` as the calling thread's last error and, when comm != NULL, the communicator's.
void record(anyrComm_t comm, const std::string& msg);
const std::string& threadLastError();

// The communicator behind `comm`: NULL is an invalid argument, a destroyed one invalid usage.
inline Communicator& liveComm(anyrComm_t comm) {
  ANYR_REQUIRE_ARG(comm != nullptr, "comm", "must not be NULL");
  if (comm->impl == nullptr) throwError(anyrInvalidUsage, "communicator was destroyed");
  return *comm->impl;
}

// Hands a text out the way every query of the C API does: at most `len` bytes, NUL-terminated
// (buf may be NULL only with len 0); *needed (when not NULL) = its size + 1.
void copyText(const std::string& s, char* buf, size_t len, size_t* needed);

template <typename F>
anyrResult_t guarded(anyrComm_t comm, const char* fn, F&& f) {
  try {
    f();
    return anyrSuccess;
  } catch (const Error& e) {
    record(comm, std::string(fn) + ": " + e.what());
    ANYR_LOG(Info, -1, fn << " failed: " << e.what());
    return e.code();
  } catch (const std::bad_alloc&) {
    record(comm, std::string(fn) + ": out of host memory");
    return anyrSystemError;
  } catch (const std::exception& e) {
    record(comm, std::string(fn) + ": internal error: " + e.what());
    return anyrInternalError;
  } catch (...) {
    record(comm, std::string(fn) + ": internal error: unknown exception");
    return anyrInternalError;
  }
}

}  // namespace anyr
