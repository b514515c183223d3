#include "transport/cu_driver.h"

#include <cuda_runtime_api.h>

#include <mutex>

namespace anyr {
namespace {

// The driver ABI these calls are declared with in <cuda.h> of CUDA 12 (none of them changed
// signature since 10.2, when the virtual-memory calls appeared).
constexpr int kDriverAbi = 12000;

struct Loaded {
  CuDriver driver;
  bool ok = false;
  std::string why;
};

template <typename Fn>
bool lookUp(const char* name, Fn* fn, std::string* why) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t e =
      cudaGetDriverEntryPointByVersion(name, &p, kDriverAbi, cudaEnableDefault, &status);
  if (e != cudaSuccess || status != cudaDriverEntryPointSuccess || p == nullptr) {
    (void)cudaGetLastError();
    *why = std::string("the driver has no ") + name +
           (e != cudaSuccess ? std::string(" (") + cudaGetErrorString(e) + ")" : std::string());
    return false;
  }
  *fn = reinterpret_cast<Fn>(p);
  return true;
}

Loaded load() {
  Loaded l;
  CuDriver& d = l.driver;
  l.ok = lookUp("cuGetErrorString", &d.getErrorString, &l.why) &&
         lookUp("cuDeviceGet", &d.deviceGet, &l.why) &&
         lookUp("cuDeviceGetAttribute", &d.deviceGetAttribute, &l.why) &&
         lookUp("cuMemGetAllocationGranularity", &d.memGetAllocationGranularity, &l.why) &&
         lookUp("cuMemCreate", &d.memCreate, &l.why) &&
         lookUp("cuMemRelease", &d.memRelease, &l.why) &&
         lookUp("cuMemAddressReserve", &d.memAddressReserve, &l.why) &&
         lookUp("cuMemAddressFree", &d.memAddressFree, &l.why) &&
         lookUp("cuMemMap", &d.memMap, &l.why) && lookUp("cuMemUnmap", &d.memUnmap, &l.why) &&
         lookUp("cuMemSetAccess", &d.memSetAccess, &l.why) &&
         lookUp("cuMemExportToShareableHandle", &d.memExportToShareableHandle, &l.why) &&
         lookUp("cuMemImportFromShareableHandle", &d.memImportFromShareableHandle, &l.why);
  return l;
}

}  // namespace

std::string CuDriver::text(const char* call, CUresult r) const {
  const char* s = nullptr;
  if (getErrorString == nullptr || getErrorString(r, &s) != CUDA_SUCCESS || s == nullptr) {
    s = "unknown error";
  }
  return std::string(call) + ": error " + std::to_string(static_cast<int>(r)) + " (" + s + ")";
}

const CuDriver* cuDriver(std::string* why) {
  static std::once_flag once;
  static Loaded loaded;
  std::call_once(once, [] { loaded = load(); });
  if (!loaded.ok) {
    if (why != nullptr) *why = loaded.why;
    return nullptr;
  }
  return &loaded.driver;
}

}  // namespace anyr
