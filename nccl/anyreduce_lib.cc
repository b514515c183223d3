#include "anyreduce_lib.h"

#include <dlfcn.h>

#include <cstdlib>
#include <string>

#include "shim.h"

namespace anyrn {

namespace {

#define ANYRN_STR2(x) #x
#define ANYRN_STR(x) ANYRN_STR2(x)

// libanyreduce's NCCL calls resolve, like any symbol, in the global scope first (where this
// library is when preloaded), then in its own dependencies (libnccl.so.2: whichever library of
// that name is loaded already). Both places must lead to the real NCCL we forward to, or to us.
std::string bindingProblem(void* anyreduceHandle) {
  const RealNccl& real = realNccl();
  const char* const probe = "ncclCommGetAsyncError";
  const void* inGlobal = dlsym(RTLD_DEFAULT, probe);
  const void* inDeps = dlsym(anyreduceHandle, probe);
  for (const void* p : {inGlobal, inDeps}) {
    void* base = baseOf(p);
    if (base != nullptr && (base == ownBase() || base == real.base)) continue;
    return "libanyreduce's NCCL calls would go to " + fileOf(p) +
           ", not to the real NCCL this library forwards to (" + real.path +
           "): point ANYR_NCCL_LIBRARY at the NCCL the application loads";
  }
  return "";
}

Anyreduce load() {
  Anyreduce a;
  const char* env = std::getenv("ANYREDUCE_LIBRARY");
  const std::string name =
      env != nullptr && *env != '\0' ? std::string(env) : "libanyreduce.so." ANYRN_STR(ANYR_MAJOR);
  void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    const char* e = dlerror();
    a.error = "libanyreduce could not be loaded (" + name + "): " + (e != nullptr ? e : "?");
    return a;
  }
  std::string absent;
#define ANYRN_LOOKUP(fn, type)                  \
  a.fn = reinterpret_cast<type>(dlsym(h, #fn)); \
  if (a.fn == nullptr) absent += std::string(absent.empty() ? "" : ", ") + #fn;
  ANYRN_ANYREDUCE_FUNCTIONS(ANYRN_LOOKUP)
  ANYRN_CUDA_FUNCTIONS(ANYRN_LOOKUP)
#undef ANYRN_LOOKUP
  a.path = fileOf(reinterpret_cast<const void*>(a.anyrCommInitFromNccl));
  if (!absent.empty()) {
    a.error = "libanyreduce (" + name + ") or its CUDA runtime lacks " + absent;
    return a;
  }
  // The configuration struct handed to anyrCommInitFromNccl is this header's: the same major
  // and minor version.
  int version = 0;
  auto getVersion = reinterpret_cast<decltype(&::anyrGetVersion)>(dlsym(h, "anyrGetVersion"));
  if (getVersion == nullptr || getVersion(&version) != anyrSuccess ||
      version / 100 != ANYR_VERSION_CODE / 100) {
    a.error = "libanyreduce (" + a.path + ") is version " + std::to_string(version) +
              "; this library was built against " + std::to_string(ANYR_VERSION_CODE);
    return a;
  }
  a.error = bindingProblem(h);
  if (a.error.empty()) logLine(Level::kInfo, "twins are made by " + a.path);
  return a;
}

}  // namespace

const Anyreduce& anyreduce() {
  static const Anyreduce a = load();
  return a;
}

DeviceGuard::DeviceGuard(int device) {
  const Anyreduce& a = anyreduce();
  status_ = a.cudaGetDevice(&prev_);
  if (status_ != cudaSuccess) {
    prev_ = -1;
    return;
  }
  if (prev_ == device) {
    prev_ = -1;  // nothing to restore
    return;
  }
  status_ = a.cudaSetDevice(device);
  if (status_ != cudaSuccess) prev_ = -1;
}

DeviceGuard::~DeviceGuard() {
  if (prev_ >= 0) (void)anyreduce().cudaSetDevice(prev_);
}

std::string cudaFailure(const char* what, cudaError_t e) {
  const Anyreduce& a = anyreduce();
  (void)a.cudaGetLastError();
  return std::string(what) + " failed: " + a.cudaGetErrorString(e);
}

}  // namespace anyrn
