#include "nvml_sampler.h"

#include <dlfcn.h>
#include <time.h>

#include <chrono>
#include <cstdio>
#include <string>

namespace anyr {
namespace doctor {

namespace {

// "dddd:bb:dd.f" in lower case (4-digit domain, 8 when it does not fit), from any of the
// spellings CUDA, NVML and sysfs use ("0000:1B:00.0", "00000000:1b:00.0", "1b:00.0"), as NVML's
// bus-id lookup takes it; "" when `busId` is not a PCI address.
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

// The few NVML declarations used (NVML's stable ABI; nvml.h is not needed to build).
typedef struct nvmlDevice_st* nvmlDevice_t;
typedef int nvmlReturn_t;
constexpr nvmlReturn_t kNvmlSuccess = 0;
constexpr int kNvmlClockSm = 1;  // NVML_CLOCK_SM
struct nvmlUtilization_t {
  unsigned int gpu;
  unsigned int memory;
};
// nvmlDeviceGetFieldValues, for the instantaneous power reading (NVML_FI_DEV_POWER_INSTANT,
// driver r535 and later); nvmlDeviceGetPowerUsage averages over about a second on recent GPUs.
constexpr unsigned int kFieldPowerInstant = 186;
union nvmlValue_t {
  double dVal;
  int siVal;
  unsigned int uiVal;
  unsigned long ulVal;
  unsigned long long ullVal;
  signed long long sllVal;
  unsigned short usVal;
};
struct nvmlFieldValue_t {
  unsigned int fieldId;
  unsigned int scopeId;
  long long timestamp;
  long long latencyUsec;
  int valueType;
  nvmlReturn_t nvmlReturn;
  nvmlValue_t value;
};
static_assert(sizeof(nvmlFieldValue_t) == 40, "nvmlFieldValue_t must match NVML's layout");

// The field's value as a double; false when NVML did not answer.
bool fieldNumber(const nvmlFieldValue_t& f, double* out) {
  if (f.nvmlReturn != kNvmlSuccess) return false;
  switch (f.valueType) {
    case 0:
      *out = f.value.dVal;
      return true;
    case 1:
      *out = f.value.uiVal;
      return true;
    case 2:
      *out = static_cast<double>(f.value.ulVal);
      return true;
    case 3:
      *out = static_cast<double>(f.value.ullVal);
      return true;
    case 4:
      *out = static_cast<double>(f.value.sllVal);
      return true;
    case 5:
      *out = f.value.siVal;
      return true;
    default:
      return false;
  }
}

struct Api {
  bool ok = false;
  std::string why;
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*count)(unsigned*) = nullptr;
  nvmlReturn_t (*byIndex)(unsigned, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*byBusId)(const char*, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*index)(nvmlDevice_t, unsigned*) = nullptr;
  nvmlReturn_t (*name)(nvmlDevice_t, char*, unsigned) = nullptr;
  nvmlReturn_t (*limit)(nvmlDevice_t, unsigned*) = nullptr;
  nvmlReturn_t (*power)(nvmlDevice_t, unsigned*) = nullptr;
  nvmlReturn_t (*clock)(nvmlDevice_t, int, unsigned*) = nullptr;
  nvmlReturn_t (*maxClock)(nvmlDevice_t, int, unsigned*) = nullptr;
  nvmlReturn_t (*util)(nvmlDevice_t, nvmlUtilization_t*) = nullptr;
  nvmlReturn_t (*fields)(nvmlDevice_t, int, nvmlFieldValue_t*) = nullptr;  // optional
};

template <typename Fn>
bool sym(void* lib, const char* n, Fn* fn) {
  *fn = reinterpret_cast<Fn>(dlsym(lib, n));
  return *fn != nullptr;
}

const Api& api() {
  static std::once_flag once;
  static Api a;
  std::call_once(once, [] {
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* e = dlerror();
      a.why = e ? e : "libnvidia-ml.so.1 not found";
      return;
    }
    bool all = sym(lib, "nvmlInit_v2", &a.init) && sym(lib, "nvmlDeviceGetCount_v2", &a.count) &&
               sym(lib, "nvmlDeviceGetHandleByIndex_v2", &a.byIndex) &&
               sym(lib, "nvmlDeviceGetHandleByPciBusId_v2", &a.byBusId) &&
               sym(lib, "nvmlDeviceGetIndex", &a.index) && sym(lib, "nvmlDeviceGetName", &a.name) &&
               sym(lib, "nvmlDeviceGetEnforcedPowerLimit", &a.limit) &&
               sym(lib, "nvmlDeviceGetPowerUsage", &a.power) &&
               sym(lib, "nvmlDeviceGetClockInfo", &a.clock) &&
               sym(lib, "nvmlDeviceGetMaxClockInfo", &a.maxClock) &&
               sym(lib, "nvmlDeviceGetUtilizationRates", &a.util);
    if (!all) {
      a.why = "an NVML function is missing from libnvidia-ml.so.1";
      return;
    }
    sym(lib, "nvmlDeviceGetFieldValues", &a.fields);
    if (a.init() != kNvmlSuccess) {
      a.why = "nvmlInit_v2 failed";
      return;
    }
    a.ok = true;
  });
  return a;
}

bool fill(nvmlDevice_t d, GpuStatic* out) {
  const Api& a = api();
  unsigned idx = 0, mw = 0, mhz = 0;
  if (a.index(d, &idx) == kNvmlSuccess) out->index = static_cast<int>(idx);
  char buf[96] = {0};
  if (a.name(d, buf, sizeof(buf)) == kNvmlSuccess) out->name = buf;
  if (a.limit(d, &mw) == kNvmlSuccess) out->powerLimitW = mw / 1000.0;
  if (a.maxClock(d, kNvmlClockSm, &mhz) == kNvmlSuccess) out->maxSmMHz = mhz;
  return true;
}

}  // namespace

double monotonicSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

bool NvmlSampler::available(std::string* why) {
  const Api& a = api();
  if (!a.ok && why) *why = a.why;
  return a.ok;
}

int NvmlSampler::deviceCount() {
  const Api& a = api();
  unsigned n = 0;
  if (!a.ok || a.count(&n) != kNvmlSuccess) return 0;
  return static_cast<int>(n);
}

bool NvmlSampler::describe(int index, GpuStatic* out) {
  const Api& a = api();
  nvmlDevice_t d;
  if (!a.ok || a.byIndex(static_cast<unsigned>(index), &d) != kNvmlSuccess) return false;
  return fill(d, out);
}

bool NvmlSampler::describeBusId(const std::string& busId, GpuStatic* out) {
  const Api& a = api();
  const std::string norm = normalizeBusId(busId);
  nvmlDevice_t d;
  if (!a.ok || norm.empty() || a.byBusId(norm.c_str(), &d) != kNvmlSuccess) return false;
  out->busId = norm;
  return fill(d, out);
}

void NvmlSampler::start(const std::vector<int>& indices, int intervalMs, double t0) {
  stop();
  indices_ = indices;
  samples_.assign(indices.size(), {});
  if (!available(nullptr) || indices.empty()) return;
  running_ = true;
  thread_ = std::thread([this, intervalMs, t0] {
    const Api& a = api();
    std::vector<nvmlDevice_t> devs(indices_.size(), nullptr);
    for (size_t i = 0; i < indices_.size(); ++i) {
      if (a.byIndex(static_cast<unsigned>(indices_[i]), &devs[i]) != kNvmlSuccess)
        devs[i] = nullptr;
    }
    auto next = std::chrono::steady_clock::now();
    while (running_.load()) {
      for (size_t i = 0; i < devs.size(); ++i) {
        if (devs[i] == nullptr) continue;
        Sample s;
        s.t = monotonicSeconds() - t0;
        unsigned mw = 0, mhz = 0;
        nvmlUtilization_t u{};
        nvmlFieldValue_t f{};
        f.fieldId = kFieldPowerInstant;
        double instantMw = -1;
        if (a.fields != nullptr && a.fields(devs[i], 1, &f) == kNvmlSuccess &&
            fieldNumber(f, &instantMw) && instantMw > 0) {
          s.powerW = instantMw / 1000.0;
        } else if (a.power(devs[i], &mw) == kNvmlSuccess) {
          s.powerW = mw / 1000.0;
        }
        if (a.clock(devs[i], kNvmlClockSm, &mhz) == kNvmlSuccess) s.smMHz = mhz;
        if (a.util(devs[i], &u) == kNvmlSuccess) s.utilPct = u.gpu;
        samples_[i].push_back(s);
      }
      next += std::chrono::milliseconds(intervalMs);
      std::this_thread::sleep_until(next);
    }
  });
}

void NvmlSampler::stop() {
  if (running_.exchange(false) && thread_.joinable()) thread_.join();
  if (thread_.joinable()) thread_.join();
}

}  // namespace doctor
}  // namespace anyr
