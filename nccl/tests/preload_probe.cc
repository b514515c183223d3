// An application linked against "libnccl.so.2" (the test double, which records every call),
// run with libanyreduce_nccl.so preloaded (nccl_preload in CMakeLists.txt): the application's
// NCCL calls reach the preloaded library, which finds the application's libnccl.so.2 by itself
// (no ANYR_NCCL_LIBRARY) and forwards to it, returning its version; an eligible all-reduce
// whose twin cannot be set up arrives at the double unchanged. Exits 1, saying why, otherwise.
#include <dlfcn.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "call_format.h"

namespace {

int failed(const std::string& why) {
  std::fprintf(stderr, "preload_probe: %s\n", why.c_str());
  return 1;
}

}  // namespace

int main() {
  const char* logPath = std::getenv("NCCL_DOUBLE_LOG");
  if (logPath == nullptr) return failed("NCCL_DOUBLE_LOG is not set");
  std::ofstream(logPath, std::ios::trunc).close();  // this run's calls only
  Dl_info info;
  void* version = dlsym(RTLD_DEFAULT, "ncclGetVersion");
  if (version == nullptr || dladdr(version, &info) == 0 || info.dli_fname == nullptr ||
      std::string(info.dli_fname).find("libanyreduce_nccl") == std::string::npos) {
    return failed("ncclGetVersion is not the preloaded library's (is LD_PRELOAD set?)");
  }
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return failed("ncclGetVersion failed");
  const char* want = std::getenv("NCCL_DOUBLE_VERSION");
  if (want == nullptr || v != std::atoi(want)) {
    return failed("ncclGetVersion gave " + std::to_string(v) + ", the double's is " +
                  (want != nullptr ? want : "unset"));
  }
  ncclUniqueId id;
  ncclComm_t comm = nullptr;
  if (ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&comm, 2, id, 1) != ncclSuccess) {
    return failed("creating the communicator failed");
  }
  void* buf = reinterpret_cast<void*>(0x4000);
  if (ncclAllReduce(buf, buf, 256, ncclFloat, ncclSum, comm, nullptr) != ncclSuccess) {
    return failed("the eligible all-reduce failed");
  }
  const std::string line = anyrn_test::formatCall(
      "ncclAllReduce", anyrn_test::formatArgs(buf, buf, 256, ncclFloat, ncclSum, comm,
                                              static_cast<cudaStream_t>(nullptr)));
  std::ifstream log(logPath);
  std::string l;
  bool found = false;
  while (std::getline(log, l)) found = found || l == line;
  if (!found) return failed("the double did not receive " + line);
  if (ncclCommDestroy(comm) != ncclSuccess) return failed("ncclCommDestroy failed");
  std::printf("preload_probe: ok (NCCL %d through %s)\n", v, info.dli_fname);
  return 0;
}
