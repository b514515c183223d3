// A test double of the real NCCL library: every function of nccl.h (generated list), each
// appending its call with its arguments (call_format.h) as one line to the file named by
// NCCL_DOUBLE_LOG, then returning ncclSuccess (a text function "double", a void one nothing).
// The few that must produce something:
//   ncclGetVersion              NCCL_DOUBLE_VERSION (default 21903: not the header's)
//   ncclGetUniqueId             128 bytes of 'D'
//   ncclCommInitRank[Config]    the communicator 0x10000 + 16 * rank; nranks < 1 fails with
//                               ncclInvalidArgument ("double: bad nranks" as its last error)
//   ncclCommSplit               the communicator 0x20000 + 16 * (number of splits so far)
//   ncclCommCount               NCCL_DOUBLE_NRANKS (default 2); CuDevice 0; UserRank 0
//   ncclCommGetAsyncError       ncclSuccess in *asyncError
//   ncclGetErrorString          "double: error <n>"; ncclGetLastError the last error
// ncclMemFree is left out, as a function an older real library lacks.
#include <nccl.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "call_format.h"

namespace {

std::mutex gMu;
std::string gLastError;

void record(const char* name, const std::string& args) {
  const char* path = std::getenv("NCCL_DOUBLE_LOG");
  if (path == nullptr || *path == '\0') return;
  std::lock_guard<std::mutex> lock(gMu);
  FILE* f = std::fopen(path, "a");
  if (f == nullptr) return;
  std::fprintf(f, "%s\n", anyrn_test::formatCall(name, args).c_str());
  std::fclose(f);
}

template <typename R>
R defaultResult() {
  if constexpr (std::is_same_v<R, ncclResult_t>) {
    return ncclSuccess;
  } else if constexpr (std::is_same_v<R, const char*>) {
    return "double";
  }
}

int envInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : fallback;
}

ncclComm_t fakeComm(int rank) { return reinterpret_cast<ncclComm_t>(0x10000 + 16 * rank); }

}  // namespace

#define DOUBLE_EXPORT __attribute__((visibility("default")))
#define ANYRN_FN_PLAIN(ret, name, params, args) \
  extern "C" DOUBLE_EXPORT ret name params {    \
    record(#name, anyrn_test::formatArgs args); \
    return defaultResult<ret>();                \
  }
#include "nccl_api.inc"

extern "C" {

DOUBLE_EXPORT ncclResult_t ncclGetVersion(int* version) {
  record("ncclGetVersion", anyrn_test::formatArgs(version));
  *version = envInt("NCCL_DOUBLE_VERSION", 21903);
  return ncclSuccess;
}

DOUBLE_EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  record("ncclGetUniqueId", anyrn_test::formatArgs(uniqueId));
  std::memset(uniqueId->internal, 'D', sizeof(uniqueId->internal));
  return ncclSuccess;
}

DOUBLE_EXPORT ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId,
                                            int rank) {
  record("ncclCommInitRank", anyrn_test::formatArgs(comm, nranks, commId, rank));
  if (nranks < 1) {
    std::lock_guard<std::mutex> lock(gMu);
    gLastError = "double: bad nranks";
    return ncclInvalidArgument;
  }
  *comm = fakeComm(rank);
  return ncclSuccess;
}

DOUBLE_EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId,
                                                  int rank, ncclConfig_t* config) {
  record("ncclCommInitRankConfig", anyrn_test::formatArgs(comm, nranks, commId, rank, config));
  *comm = fakeComm(rank);
  return ncclSuccess;
}

DOUBLE_EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                         ncclConfig_t* config) {
  static std::atomic<int> splits{0};
  record("ncclCommSplit", anyrn_test::formatArgs(comm, color, key, newcomm, config));
  *newcomm = reinterpret_cast<ncclComm_t>(0x20000 + 16 * splits++);
  return ncclSuccess;
}

DOUBLE_EXPORT ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  record("ncclCommCount", anyrn_test::formatArgs(comm, count));
  *count = envInt("NCCL_DOUBLE_NRANKS", 2);
  return ncclSuccess;
}

DOUBLE_EXPORT ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  record("ncclCommCuDevice", anyrn_test::formatArgs(comm, device));
  *device = 0;
  return ncclSuccess;
}

DOUBLE_EXPORT ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  record("ncclCommUserRank", anyrn_test::formatArgs(comm, rank));
  *rank = 0;
  return ncclSuccess;
}

DOUBLE_EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  record("ncclCommGetAsyncError", anyrn_test::formatArgs(comm, asyncError));
  *asyncError = ncclSuccess;
  return ncclSuccess;
}

DOUBLE_EXPORT const char* ncclGetErrorString(ncclResult_t result) {
  record("ncclGetErrorString", anyrn_test::formatArgs(result));
  static thread_local std::string s;
  s = "double: error " + std::to_string(static_cast<int>(result));
  return s.c_str();
}

DOUBLE_EXPORT const char* ncclGetLastError(ncclComm_t comm) {
  record("ncclGetLastError", anyrn_test::formatArgs(comm));
  std::lock_guard<std::mutex> lock(gMu);
  return gLastError.c_str();
}

}  // extern "C"

#define ANYRN_FN_ALIAS(ret, twin, name, params) \
  extern "C" DOUBLE_EXPORT ret twin params __attribute__((alias(#name)));
#include "nccl_api.inc"
