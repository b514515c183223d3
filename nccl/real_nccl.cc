// The real NCCL library: found and loaded once, at the first call through this library; which
// callers are a libanyreduce; the calling thread's last failure; the log.
#include <dlfcn.h>
#include <link.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "shim.h"

namespace anyrn {

namespace {

const char* const kNames[kNumSlots] = {
#define ANYRN_FN_PLAIN(ret, name, params, args) #name,
#define ANYRN_FN_HOOKED(ret, name, params, args) #name,
#include "nccl_api.inc"
};

void ownAnchor() {}

// Loads `name` and checks it is an NCCL library other than this one. Returns its handle, or
// NULL with *why set.
void* tryLoad(const std::string& name, std::string* why) {
  void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    const char* e = dlerror();
    *why = e != nullptr ? e : name + ": cannot be loaded";
    return nullptr;
  }
  void* version = dlsym(h, "ncclGetVersion");
  if (version == nullptr) {
    dlclose(h);
    *why = name + ": not an NCCL library (it has no ncclGetVersion)";
    return nullptr;
  }
  if (baseOf(version) == ownBase()) {
    // Installed or preloaded under the real library's name: the loader handed back this very
    // library. Calling it would call ourselves.
    dlclose(h);
    *why = name + ": is this library itself (" + fileOf(version) + "), not the real NCCL";
    return nullptr;
  }
  return h;
}

std::vector<std::string> defaultCandidates() {
  std::vector<std::string> c = {"libnccl.so.2"};
#ifdef ANYRN_BUILD_NCCL_DIR
  c.push_back(std::string(ANYRN_BUILD_NCCL_DIR) + "/libnccl.so.2");
#endif
#ifdef ANYRN_MULTIARCH
  c.push_back(std::string("/usr/lib/") + ANYRN_MULTIARCH + "/libnccl.so.2");
#endif
  c.push_back("/usr/local/cuda/lib64/libnccl.so.2");
  c.push_back("/usr/lib64/libnccl.so.2");
  return c;
}

RealNccl load() {
  RealNccl r;
  const char* env = std::getenv("ANYR_NCCL_LIBRARY");
  const bool chosen = env != nullptr && *env != '\0';
  const std::vector<std::string> candidates =
      chosen ? std::vector<std::string>{env} : defaultCandidates();
  std::string tried;
  for (const std::string& c : candidates) {
    std::string why;
    r.handle = tryLoad(c, &why);
    if (r.handle != nullptr) break;
    tried += (tried.empty() ? "" : "; ") + why;
  }
  if (r.handle == nullptr) {
    r.error = std::string("the real NCCL library could not be loaded") +
              (chosen ? " (ANYR_NCCL_LIBRARY=" + std::string(env) + ")" : "") + ": " + tried;
    logLine(Level::kWarn, r.error + "; every NCCL call fails with ncclSystemError");
    return r;
  }
  for (int i = 0; i < kNumSlots; ++i) r.fn[i] = dlsym(r.handle, kNames[i]);
  void* version = dlsym(r.handle, "ncclGetVersion");
  r.base = baseOf(version);
  r.path = fileOf(version);
  logLine(Level::kInfo, "forwarding to the real NCCL library " + r.path);
  return r;
}

// The address ranges of the objects that called a hooked function, and whether each is a
// libanyreduce. Append-only; readers take no lock.
struct Caller {
  uintptr_t lo = 0;
  uintptr_t hi = 0;
  bool anyreduce = false;
};
constexpr int kMaxCallers = 64;
Caller gCallers[kMaxCallers];
std::atomic<int> gNumCallers{0};
std::mutex gCallersMu;

struct Extent {
  uintptr_t base;
  uintptr_t lo;
  uintptr_t hi;
};

int extentOf(struct dl_phdr_info* info, size_t, void* data) {
  Extent* e = static_cast<Extent*>(data);
  if (info->dlpi_addr != e->base) return 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD) continue;
    const uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
    const uintptr_t hi = lo + ph.p_memsz;
    if (e->lo == 0 || lo < e->lo) e->lo = lo;
    if (hi > e->hi) e->hi = hi;
  }
  return 1;
}

// Classifies the object holding `addr` and remembers its range.
bool classify(uintptr_t addr) {
  std::lock_guard<std::mutex> lock(gCallersMu);
  const int n = gNumCallers.load();
  for (int i = 0; i < n; ++i) {
    if (addr >= gCallers[i].lo && addr < gCallers[i].hi) return gCallers[i].anyreduce;
  }
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(addr), &info) == 0) return false;
  Extent e{reinterpret_cast<uintptr_t>(info.dli_fbase), 0, 0};
  dl_iterate_phdr(extentOf, &e);
  bool anyreduce = false;
  if (info.dli_fname != nullptr && *info.dli_fname != '\0') {
    if (void* h = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD)) {
      void* sym = dlsym(h, "anyrCommInitFromNccl");
      anyreduce = sym != nullptr && baseOf(sym) == info.dli_fbase;
      dlclose(h);
    }
  }
  if (e.hi > e.lo && addr >= e.lo && addr < e.hi && n < kMaxCallers) {
    gCallers[n] = Caller{e.lo, e.hi, anyreduce};
    gNumCallers.store(n + 1);
  }
  return anyreduce;
}

thread_local bool tOurs = false;
thread_local std::string tMessage;

}  // namespace

const RealNccl& realNccl() {
  static const RealNccl real = load();
  return real;
}

bool fromAnyreduce(const void* returnAddress) {
  const uintptr_t addr = reinterpret_cast<uintptr_t>(returnAddress);
  const int n = gNumCallers.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) {
    if (addr >= gCallers[i].lo && addr < gCallers[i].hi) return gCallers[i].anyreduce;
  }
  return classify(addr);
}

void* ownBase() {
  static void* const base = baseOf(reinterpret_cast<const void*>(&ownAnchor));
  return base;
}

void* baseOf(const void* addr) {
  Dl_info info;
  if (addr == nullptr || dladdr(addr, &info) == 0) return nullptr;
  return info.dli_fbase;
}

std::string fileOf(const void* addr) {
  Dl_info info;
  if (addr == nullptr || dladdr(addr, &info) == 0 || info.dli_fname == nullptr) return "?";
  return info.dli_fname;
}

void setOurError(const std::string& msg) {
  tOurs = true;
  tMessage = "anyreduce-nccl: " + msg;
}

void noteResult(ncclResult_t r) {
  if (r != ncclSuccess && r != ncclInProgress) tOurs = false;
}

const char* ourError() { return tOurs ? tMessage.c_str() : nullptr; }

ncclResult_t missingResult(const char* name) {
  const RealNccl& real = realNccl();
  if (real.handle == nullptr) {
    setOurError(std::string(name) + ": " + real.error);
    return ncclSystemError;
  }
  setOurError(std::string(name) + " is not in the real NCCL library " + real.path +
              " (this library was built against NCCL " ANYRN_HEADER_VERSION ")");
  return ncclInvalidUsage;
}

void logLine(Level level, const std::string& msg) {
  static const int threshold = [] {
    const char* v = std::getenv("ANYR_DEBUG");
    const std::string s = v != nullptr ? v : "";
    if (s == "NONE") return -1;
    if (s == "INFO" || s == "TRACE") return 1;
    return 0;
  }();
  const int rank = level == Level::kWarn ? 0 : 1;
  if (rank > threshold) return;
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(stderr, "anyreduce-nccl[pid %d] %s %s\n", static_cast<int>(getpid()),
               level == Level::kWarn ? "WARN" : "INFO", msg.c_str());
  std::fflush(stderr);
}

}  // namespace anyrn
