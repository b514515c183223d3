#include "topology/nvml.h"

#include <dlfcn.h>

#include <cctype>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "base/log.h"

namespace anyr {
namespace nvml {

// ---------------------------------------------------------------------------------------------
// The handful of NVML declarations used here. They mirror NVML's ABI (nvml.h of the CUDA
// toolkit / driver, stable since NVML 10): opaque handle, return codes, enums with their exact
// numeric values, the nvmlPciInfo_t layout of the *_v2/_v3 entry points, and the function
// signatures. nvml.h is not needed to build anyreduce.

namespace {

typedef struct nvmlDevice_st* nvmlDevice_t;
typedef int nvmlReturn_t;  // enum nvmlReturn_enum
constexpr nvmlReturn_t NVML_SUCCESS = 0;
constexpr nvmlReturn_t NVML_ERROR_NOT_SUPPORTED = 3;

typedef int nvmlEnableState_t;  // NVML_FEATURE_DISABLED = 0, NVML_FEATURE_ENABLED = 1
constexpr nvmlEnableState_t NVML_FEATURE_ENABLED = 1;

typedef int nvmlGpuTopologyLevel_t;
constexpr nvmlGpuTopologyLevel_t NVML_TOPOLOGY_INTERNAL = 0;
constexpr nvmlGpuTopologyLevel_t NVML_TOPOLOGY_SINGLE = 10;
constexpr nvmlGpuTopologyLevel_t NVML_TOPOLOGY_MULTIPLE = 20;
constexpr nvmlGpuTopologyLevel_t NVML_TOPOLOGY_HOSTBRIDGE = 30;
constexpr nvmlGpuTopologyLevel_t NVML_TOPOLOGY_NODE = 40;
constexpr nvmlGpuTopologyLevel_t NVML_TOPOLOGY_SYSTEM = 50;

typedef int nvmlGpuP2PCapsIndex_t;
constexpr nvmlGpuP2PCapsIndex_t NVML_P2P_CAPS_INDEX_READ = 0;
constexpr nvmlGpuP2PCapsIndex_t NVML_P2P_CAPS_INDEX_WRITE = 1;
constexpr nvmlGpuP2PCapsIndex_t NVML_P2P_CAPS_INDEX_NVLINK = 2;
constexpr nvmlGpuP2PCapsIndex_t NVML_P2P_CAPS_INDEX_ATOMICS = 3;

typedef int nvmlGpuP2PStatus_t;
constexpr nvmlGpuP2PStatus_t NVML_P2P_STATUS_OK = 0;
constexpr nvmlGpuP2PStatus_t NVML_P2P_STATUS_UNKNOWN = 6;

typedef int nvmlIntNvLinkDeviceType_t;
constexpr nvmlIntNvLinkDeviceType_t NVML_NVLINK_DEVICE_TYPE_GPU = 0x00;
constexpr nvmlIntNvLinkDeviceType_t NVML_NVLINK_DEVICE_TYPE_SWITCH = 0x02;
constexpr nvmlIntNvLinkDeviceType_t NVML_NVLINK_DEVICE_TYPE_UNKNOWN = 0xFF;

constexpr int NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE = 32;
constexpr int NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE = 16;
constexpr int NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE = 80;

typedef struct nvmlPciInfo_st {
  char busIdLegacy[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE];
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pciDeviceId;
  unsigned int pciSubSystemId;
  char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
} nvmlPciInfo_t;
static_assert(sizeof(nvmlPciInfo_t) == 68, "nvmlPciInfo_t must match NVML's layout");

typedef int nvmlValueType_t;
constexpr nvmlValueType_t NVML_VALUE_TYPE_DOUBLE = 0;
constexpr nvmlValueType_t NVML_VALUE_TYPE_UNSIGNED_INT = 1;
constexpr nvmlValueType_t NVML_VALUE_TYPE_UNSIGNED_LONG = 2;
constexpr nvmlValueType_t NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3;
constexpr nvmlValueType_t NVML_VALUE_TYPE_SIGNED_LONG_LONG = 4;
constexpr nvmlValueType_t NVML_VALUE_TYPE_SIGNED_INT = 5;

typedef union nvmlValue_st {
  double dVal;
  int siVal;
  unsigned int uiVal;
  unsigned long ulVal;
  unsigned long long ullVal;
  signed long long sllVal;
  unsigned short usVal;
} nvmlValue_t;

typedef struct nvmlFieldValue_st {
  unsigned int fieldId;
  unsigned int scopeId;
  long long timestamp;
  long long latencyUsec;
  nvmlValueType_t valueType;
  nvmlReturn_t nvmlReturn;
  nvmlValue_t value;
} nvmlFieldValue_t;
static_assert(sizeof(nvmlFieldValue_t) == 40, "nvmlFieldValue_t must match NVML's layout");

// Common NVLink speed of the active links in MB/s per direction (what `nvidia-smi nvlink -s`
// prints per link).
constexpr unsigned int NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON = 90;

// Links a GPU may have. NVML_NVLINK_MAX_LINKS is 18 today; querying past a device's last link
// just returns an error, so a larger bound costs nothing and covers later parts.
constexpr unsigned kMaxNvLinks = 32;

struct Api {
  void* lib = nullptr;
  bool initialized = false;
  nvmlReturn_t (*init)() = nullptr;                    // nvmlInit_v2
  nvmlReturn_t (*shutdown)() = nullptr;                // nvmlShutdown
  const char* (*errorString)(nvmlReturn_t) = nullptr;  // nvmlErrorString
  nvmlReturn_t (*handleByBusId)(const char*, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*nvLinkState)(nvmlDevice_t, unsigned, nvmlEnableState_t*) = nullptr;
  nvmlReturn_t (*nvLinkRemotePci)(nvmlDevice_t, unsigned, nvmlPciInfo_t*) = nullptr;
  nvmlReturn_t (*nvLinkRemoteType)(nvmlDevice_t, unsigned, nvmlIntNvLinkDeviceType_t*) = nullptr;
  nvmlReturn_t (*nvLinkVersion)(nvmlDevice_t, unsigned, unsigned*) = nullptr;
  nvmlReturn_t (*commonAncestor)(nvmlDevice_t, nvmlDevice_t, nvmlGpuTopologyLevel_t*) = nullptr;
  nvmlReturn_t (*p2pStatus)(nvmlDevice_t, nvmlDevice_t, nvmlGpuP2PCapsIndex_t,
                            nvmlGpuP2PStatus_t*) = nullptr;
  nvmlReturn_t (*pcieGen)(nvmlDevice_t, unsigned*) = nullptr;
  nvmlReturn_t (*pcieWidth)(nvmlDevice_t, unsigned*) = nullptr;
  nvmlReturn_t (*pcieMaxGen)(nvmlDevice_t, unsigned*) = nullptr;
  nvmlReturn_t (*pcieMaxWidth)(nvmlDevice_t, unsigned*) = nullptr;
  nvmlReturn_t (*driverVersion)(char*, unsigned) = nullptr;
  nvmlReturn_t (*fieldValues)(nvmlDevice_t, int, nvmlFieldValue_t*) = nullptr;
};

std::mutex gMutex;
Api gApi;
bool gTried = false;

template <typename Fn>
void resolve(void* lib, const char* name, Fn* fn) {
  *fn = reinterpret_cast<Fn>(dlsym(lib, name));
  if (*fn == nullptr) ANYR_LOG(Info, -1, "NVML: " << name << " not found; reported as unknown");
}

const char* errorText(nvmlReturn_t r) {
  if (gApi.errorString != nullptr) {
    const char* s = gApi.errorString(r);
    if (s != nullptr) return s;
  }
  return "unknown NVML error";
}

// Loads and initializes NVML once. Returns nullptr when it is not usable.
const Api* api() {
  std::lock_guard<std::mutex> lock(gMutex);
  if (gTried) return gApi.initialized ? &gApi : nullptr;
  gTried = true;
  if (gApi.lib == nullptr) {
    dlerror();
    gApi.lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (gApi.lib == nullptr) {
      const char* why = dlerror();
      ANYR_LOG(Info, -1,
               "NVML not available (" << (why ? why : "libnvidia-ml.so.1 not found")
                                      << "); NVLink, PCIe and driver details are unknown");
      return nullptr;
    }
    resolve(gApi.lib, "nvmlInit_v2", &gApi.init);
    resolve(gApi.lib, "nvmlShutdown", &gApi.shutdown);
    resolve(gApi.lib, "nvmlErrorString", &gApi.errorString);
    resolve(gApi.lib, "nvmlDeviceGetHandleByPciBusId_v2", &gApi.handleByBusId);
    resolve(gApi.lib, "nvmlDeviceGetNvLinkState", &gApi.nvLinkState);
    resolve(gApi.lib, "nvmlDeviceGetNvLinkRemotePciInfo_v2", &gApi.nvLinkRemotePci);
    resolve(gApi.lib, "nvmlDeviceGetNvLinkRemoteDeviceType", &gApi.nvLinkRemoteType);
    resolve(gApi.lib, "nvmlDeviceGetNvLinkVersion", &gApi.nvLinkVersion);
    resolve(gApi.lib, "nvmlDeviceGetTopologyCommonAncestor", &gApi.commonAncestor);
    resolve(gApi.lib, "nvmlDeviceGetP2PStatus", &gApi.p2pStatus);
    resolve(gApi.lib, "nvmlDeviceGetCurrPcieLinkGeneration", &gApi.pcieGen);
    resolve(gApi.lib, "nvmlDeviceGetCurrPcieLinkWidth", &gApi.pcieWidth);
    resolve(gApi.lib, "nvmlDeviceGetMaxPcieLinkGeneration", &gApi.pcieMaxGen);
    resolve(gApi.lib, "nvmlDeviceGetMaxPcieLinkWidth", &gApi.pcieMaxWidth);
    resolve(gApi.lib, "nvmlSystemGetDriverVersion", &gApi.driverVersion);
    resolve(gApi.lib, "nvmlDeviceGetFieldValues", &gApi.fieldValues);
  }
  if (gApi.init == nullptr) return nullptr;
  nvmlReturn_t r = gApi.init();
  if (r != NVML_SUCCESS) {
    ANYR_LOG(Info, -1,
             "NVML: nvmlInit_v2 failed (" << errorText(r) << "); NVML details are unknown");
    return nullptr;
  }
  gApi.initialized = true;
  return &gApi;
}

bool handle(const Api* a, const std::string& busId, nvmlDevice_t* dev) {
  if (a == nullptr || a->handleByBusId == nullptr) return false;
  const std::string norm = normalizeBusId(busId);
  if (norm.empty()) return false;
  nvmlReturn_t r = a->handleByBusId(norm.c_str(), dev);
  if (r != NVML_SUCCESS) {
    ANYR_LOG(Info, -1, "NVML: no device at " << norm << " (" << errorText(r) << ")");
    return false;
  }
  return true;
}

Tri p2pCap(const Api* a, nvmlDevice_t x, nvmlDevice_t y, nvmlGpuP2PCapsIndex_t index) {
  nvmlGpuP2PStatus_t s = NVML_P2P_STATUS_UNKNOWN;
  if (a->p2pStatus(x, y, index, &s) != NVML_SUCCESS) return Tri::Unknown;
  if (s == NVML_P2P_STATUS_OK) return Tri::Yes;
  if (s == NVML_P2P_STATUS_UNKNOWN) return Tri::Unknown;
  return Tri::No;
}

}  // namespace

bool available() { return api() != nullptr; }

void shutdown() {
  std::lock_guard<std::mutex> lock(gMutex);
  if (gApi.initialized && gApi.shutdown != nullptr) gApi.shutdown();
  gApi.initialized = false;
  gTried = false;  // the library stays loaded; the next query initializes NVML again
}

std::string normalizeBusId(const std::string& busId) {
  unsigned long long domain = 0;
  unsigned bus = 0, dev = 0, fn = 0;
  int used = -1;
  const char* s = busId.c_str();
  // Either "domain:bus:device.function" or "bus:device.function".
  bool ok = std::sscanf(s, "%llx:%x:%x.%x%n", &domain, &bus, &dev, &fn, &used) == 4 && used >= 0 &&
            s[used] == '\0';
  if (!ok) {
    domain = 0;
    used = -1;
    ok = std::sscanf(s, "%x:%x.%x%n", &bus, &dev, &fn, &used) == 3 && used >= 0 && s[used] == '\0';
  }
  if (!ok) return "";
  if (domain > 0xffffffffull || bus > 0xff || dev > 0x1f || fn > 0x7) return "";
  char out[32];
  if (domain > 0xffff) {
    std::snprintf(out, sizeof(out), "%08llx:%02x:%02x.%x", domain, bus, dev, fn);
  } else {
    std::snprintf(out, sizeof(out), "%04llx:%02x:%02x.%x", domain, bus, dev, fn);
  }
  return out;
}

std::string driverVersion() {
  const Api* a = api();
  if (a == nullptr || a->driverVersion == nullptr) return "";
  char buf[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE] = {};
  if (a->driverVersion(buf, sizeof(buf)) != NVML_SUCCESS) return "";
  buf[sizeof(buf) - 1] = '\0';
  return buf;
}

bool pcieLink(const std::string& busId, PcieLink* link) {
  *link = PcieLink{};
  const Api* a = api();
  nvmlDevice_t d = nullptr;
  if (!handle(a, busId, &d)) return false;
  bool ok = false;
  auto get = [&](nvmlReturn_t (*fn)(nvmlDevice_t, unsigned*), int* out) {
    unsigned v = 0;
    if (fn != nullptr && fn(d, &v) == NVML_SUCCESS && v < 1024) {
      *out = static_cast<int>(v);
      ok = true;
    }
  };
  get(a->pcieGen, &link->gen);
  get(a->pcieWidth, &link->width);
  get(a->pcieMaxGen, &link->maxGen);
  get(a->pcieMaxWidth, &link->maxWidth);
  return ok;
}

P2PStatus p2pStatus(const std::string& busA, const std::string& busB) {
  P2PStatus st;
  const Api* a = api();
  nvmlDevice_t x = nullptr, y = nullptr;
  if (a == nullptr || a->p2pStatus == nullptr || !handle(a, busA, &x) || !handle(a, busB, &y)) {
    return st;
  }
  st.read = p2pCap(a, x, y, NVML_P2P_CAPS_INDEX_READ);
  st.write = p2pCap(a, x, y, NVML_P2P_CAPS_INDEX_WRITE);
  st.nvlink = p2pCap(a, x, y, NVML_P2P_CAPS_INDEX_NVLINK);
  st.atomics = p2pCap(a, x, y, NVML_P2P_CAPS_INDEX_ATOMICS);
  return st;
}

std::string commonAncestor(const std::string& busA, const std::string& busB) {
  const Api* a = api();
  nvmlDevice_t x = nullptr, y = nullptr;
  if (a == nullptr || a->commonAncestor == nullptr || !handle(a, busA, &x) ||
      !handle(a, busB, &y)) {
    return "";
  }
  nvmlGpuTopologyLevel_t level = -1;
  if (a->commonAncestor(x, y, &level) != NVML_SUCCESS) return "";
  switch (level) {
    case NVML_TOPOLOGY_INTERNAL:
      return "board";
    case NVML_TOPOLOGY_SINGLE:
      return "switch";
    case NVML_TOPOLOGY_MULTIPLE:
      return "switches";
    case NVML_TOPOLOGY_HOSTBRIDGE:
      return "hostbridge";
    case NVML_TOPOLOGY_NODE:
      return "numa";
    case NVML_TOPOLOGY_SYSTEM:
      return "system";
    default:
      return "";
  }
}

bool activeNvLinks(const std::string& busId, std::vector<NvLink>* links) {
  links->clear();
  const Api* a = api();
  nvmlDevice_t d = nullptr;
  if (a == nullptr || a->nvLinkState == nullptr || !handle(a, busId, &d)) return false;
  for (unsigned l = 0; l < kMaxNvLinks; ++l) {
    nvmlEnableState_t active = 0;
    nvmlReturn_t r = a->nvLinkState(d, l, &active);
    if (r == NVML_ERROR_NOT_SUPPORTED && l == 0) return true;  // no NVLink on this GPU
    if (r != NVML_SUCCESS || active != NVML_FEATURE_ENABLED) continue;
    NvLink link;
    link.link = static_cast<int>(l);
    nvmlPciInfo_t pci;
    std::memset(&pci, 0, sizeof(pci));
    if (a->nvLinkRemotePci != nullptr && a->nvLinkRemotePci(d, l, &pci) == NVML_SUCCESS) {
      pci.busId[sizeof(pci.busId) - 1] = '\0';
      link.remoteBusId = normalizeBusId(pci.busId);
    }
    nvmlIntNvLinkDeviceType_t type = NVML_NVLINK_DEVICE_TYPE_UNKNOWN;
    if (a->nvLinkRemoteType != nullptr && a->nvLinkRemoteType(d, l, &type) == NVML_SUCCESS) {
      link.remoteType = type == NVML_NVLINK_DEVICE_TYPE_GPU       ? RemoteType::Gpu
                        : type == NVML_NVLINK_DEVICE_TYPE_SWITCH  ? RemoteType::Switch
                        : type == NVML_NVLINK_DEVICE_TYPE_UNKNOWN ? RemoteType::Unknown
                                                                  : RemoteType::Other;
    }
    unsigned version = 0;
    if (a->nvLinkVersion != nullptr && a->nvLinkVersion(d, l, &version) == NVML_SUCCESS) {
      link.version = version;
    }
    links->push_back(link);
  }
  return true;
}

double nvlinkSpeedGBps(const std::string& busId) {
  const Api* a = api();
  nvmlDevice_t d = nullptr;
  if (a == nullptr || a->fieldValues == nullptr || !handle(a, busId, &d)) return -1;
  nvmlFieldValue_t fv;
  std::memset(&fv, 0, sizeof(fv));
  fv.fieldId = NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON;
  if (a->fieldValues(d, 1, &fv) != NVML_SUCCESS || fv.nvmlReturn != NVML_SUCCESS) return -1;
  double mbps = -1;
  switch (fv.valueType) {
    case NVML_VALUE_TYPE_DOUBLE:
      mbps = fv.value.dVal;
      break;
    case NVML_VALUE_TYPE_UNSIGNED_INT:
      mbps = fv.value.uiVal;
      break;
    case NVML_VALUE_TYPE_UNSIGNED_LONG:
      mbps = static_cast<double>(fv.value.ulVal);
      break;
    case NVML_VALUE_TYPE_UNSIGNED_LONG_LONG:
      mbps = static_cast<double>(fv.value.ullVal);
      break;
    case NVML_VALUE_TYPE_SIGNED_LONG_LONG:
      mbps = static_cast<double>(fv.value.sllVal);
      break;
    case NVML_VALUE_TYPE_SIGNED_INT:
      mbps = fv.value.siVal;
      break;
    default:
      return -1;
  }
  return mbps > 0 ? mbps / 1000.0 : -1;
}

// Nominal per-link, per-direction bandwidth by NVML nvmlNvlinkVersion_t value: the fallback
// when the speed field above is not available. The values are what `nvidia-smi nvlink -s`
// reports per link. NVML returns an enum value, not the marketing generation:
//   1 = NVLink 1.0          20      GB/s  (P100)
//   2 = NVLink 2.0          25      GB/s  (V100)
//   3 = NVLink 2.2          25      GB/s
//   4 = NVLink 3.0          25      GB/s  (A100)
//   5 = NVLink 3.1          25      GB/s  (bridged consumer parts may run slower)
//   6 = NVLink 4.0          26.5625 GB/s  (18 links = 478 GB/s)
//   7 = NVLink 5.0          53.125  GB/s  (18 links = 956 GB/s)
// Anything else is unknown (-1). Public reports say some drivers answer one step higher than
// this enum (A100: 5, H100: 7), which is why the speed field is preferred. Either way this is
// informational: the probe measures the real bandwidth.
double nvlinkGBpsPerLink(unsigned version) {
  switch (version) {
    case 1:
      return 20.0;
    case 2:
    case 3:
    case 4:
    case 5:
      return 25.0;
    case 6:
      return 26.5625;
    case 7:
      return 53.125;
    default:
      return -1.0;
  }
}

}  // namespace nvml
}  // namespace anyr
