// The NCCL-compatible library (libanyreduce_nccl.so): every function of the nccl.h it is built
// against, forwarded to the real NCCL, except the all-reduces an anyreduce twin of the
// communicator serves (docs/INTEGRATION.md, "The NCCL-compatible library").
//
// Parts, each owning its state:
//   real_nccl.cc      the real NCCL library (found, loaded once, its functions), which callers
//                     are a libanyreduce, the calling thread's last failure, the log
//   anyreduce_lib.cc  libanyreduce and the CUDA runtime it brings, loaded at the first setup;
//                     whether libanyreduce's own NCCL calls reach the same real NCCL
//   twin.cc           per communicator: the twin, its collective setup, the calls it serves,
//                     its teardown and its errors
//   exports.cc        the exported functions (generated list, nccl_api.inc)
// Only the public anyreduce API (include/anyreduce/anyreduce.h) is used, through dlopen.
#pragma once

#include <nccl.h>

#include <string>
#include <type_traits>

#include "anyreduce/anyreduce.h"

namespace anyrn {

// One slot per function of nccl.h (pnccl* twins excepted: they are aliases of ours).
enum Slot : int {
#define ANYRN_FN_PLAIN(ret, name, params, args) kSlot_##name,
#define ANYRN_FN_HOOKED(ret, name, params, args) kSlot_##name,
#include "nccl_api.inc"
  kNumSlots
};

// ---- The real NCCL (real_nccl.cc) ----------------------------------------------------------

// The real library, loaded at the first call: ANYR_NCCL_LIBRARY (a path or a name; when set,
// the only one tried), else "libnccl.so.2" through the loader, else the NCCL this library was
// built against and the usual folders. A candidate that turns out to be this library itself
// (installed or preloaded as libnccl.so.2) is skipped, never called.
struct RealNccl {
  void* handle = nullptr;
  void* base = nullptr;  // its load address (dladdr's dli_fbase)
  std::string path;      // the file loaded
  std::string error;     // why none was loaded ("" when one was)
  void* fn[kNumSlots] = {};
};
const RealNccl& realNccl();

// The real function of `slot`, typed; NULL when the real library lacks it.
template <typename Fn>
Fn realFn(Slot slot) {
  return reinterpret_cast<Fn>(realNccl().fn[slot]);
}

// Whether the call that returns to `returnAddress` was made by a libanyreduce (any copy of it:
// an object exporting anyrCommInitFromNccl). anyreduce's own NCCL calls (its bootstrap, its NCCL
// path, its watchdog) are forwarded as they are, never served by a twin.
bool fromAnyreduce(const void* returnAddress);
// This library's load address.
void* ownBase();
// The load address of the object holding `addr` (NULL if none).
void* baseOf(const void* addr);
// The file of the object holding `addr` ("?" if unknown).
std::string fileOf(const void* addr);

// The calling thread's last failure: ours (a message) or the real NCCL's.
void setOurError(const std::string& msg);
// A forwarded call's result: an error there makes the real NCCL's message the last one.
void noteResult(ncclResult_t r);
// Our message when the calling thread's last failure was ours, else NULL.
const char* ourError();

// What a function the real library lacks (or a missing real library) returns: ncclSystemError
// without a real library, ncclInvalidUsage without the function; the message is kept for
// ncclGetLastError. A function returning text returns the message; void returns nothing.
ncclResult_t missingResult(const char* name);
template <typename R>
R missing(const char* name) {
  if constexpr (std::is_same_v<R, ncclResult_t>) {
    return missingResult(name);
  } else if constexpr (std::is_same_v<R, const char*>) {
    (void)missingResult(name);
    return ourError();
  } else {
    static_assert(std::is_void_v<R>, "nccl.h function of an unexpected return type");
    (void)missingResult(name);
  }
}

// Forwards a call through `call` and notes its result where it is an ncclResult_t.
template <typename R, typename Call>
R forwarded(Call&& call) {
  if constexpr (std::is_same_v<R, ncclResult_t>) {
    const ncclResult_t r = call();
    noteResult(r);
    return r;
  } else {
    return call();
  }
}

// Calls the real `name` with `args`, or returns missingResult when it is absent.
#define ANYRN_REAL(name, ...)                                                           \
  ([&]() -> ncclResult_t {                                                              \
    auto anyrn_fn = ::anyrn::realFn<decltype(&::name)>(::anyrn::kSlot_##name);          \
    return anyrn_fn != nullptr ? anyrn_fn(__VA_ARGS__) : ::anyrn::missingResult(#name); \
  }())

// The log: stderr lines "anyreduce-nccl[pid P] WARN ...". ANYR_DEBUG as libanyreduce reads it:
// NONE (nothing), WARN (default: warnings), INFO or TRACE (also what is served).
enum class Level { kWarn, kInfo };
void logLine(Level level, const std::string& msg);

// ---- The hooks (twin.cc) -------------------------------------------------------------------

// `caller`: the call's return address (fromAnyreduce).
ncclResult_t allReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                       ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream, const void* caller);
ncclResult_t groupStart();
ncclResult_t groupEnd();
// How a communicator ends; its twin goes first (destroyed, or aborted where the communicator is).
enum class Ending { kFinalize, kDestroy, kAbort, kRevoke };
ncclResult_t endComm(ncclComm_t comm, Ending how, int revokeFlags);
ncclResult_t commGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError, const void* caller);
const char* getLastError(ncclComm_t comm, const void* caller);
anyrResult_t commGetTwin(void* comm, anyrComm_t* twin);

}  // namespace anyrn
