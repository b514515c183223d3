#include "topology/probe.h"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "base/env.h"
#include "base/error.h"
#include "base/log.h"
#include "topology/nvml.h"
#include "topology/probe_kernels.h"

namespace anyr {

namespace {

namespace pk = probekernels;

// ---------------------------------------------------------------------------------------------
// Host facts

std::string localHostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "";
  return buf;
}

std::string readFirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (in) std::getline(in, line);
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r' || line.back() == ' ')) {
    line.pop_back();
  }
  return line;
}

uint64_t fnv1a64(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

// Equal for GPUs of one host (and one boot), different across hosts (hostHashOf). Read at every
// probe: ANYR_HOST_ID may be set by the process before it creates a communicator.
uint64_t localHostHash() {
  return hostHashOf(env::getString("ANYR_HOST_ID"), localHostName(),
                    readFirstLine("/proc/sys/kernel/random/boot_id"));
}

std::string uuidString(const cudaUUID_t& u) {
  const unsigned char* b = reinterpret_cast<const unsigned char*>(u.bytes);
  char out[64];
  std::snprintf(out, sizeof(out),
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                b[14], b[15]);
  return out;
}

int numaNodeOf(const std::string& busId) {
  if (busId.empty()) return -1;
  const std::string text = readFirstLine("/sys/bus/pci/devices/" + busId + "/numa_node");
  if (text.empty()) return -1;
  char* end = nullptr;
  long v = std::strtol(text.c_str(), &end, 10);
  if (end == text.c_str() || v < 0 || v > 65535) return -1;  // the kernel says -1 for "none"
  return static_cast<int>(v);
}

// Makes `dev` current and restores the previous device on scope exit.
class DeviceGuard {
 public:
  explicit DeviceGuard(int dev) {
    if (cudaGetDevice(&prev_) != cudaSuccess) {
      cudaGetLastError();
      prev_ = -1;
    }
    ANYR_CUDA_CHECK(cudaSetDevice(dev));
  }
  ~DeviceGuard() {
    if (prev_ >= 0 && cudaSetDevice(prev_) != cudaSuccess) cudaGetLastError();
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
};

int hostTimeoutMs() {
  int64_t ms = env::getInt("ANYR_TIMEOUT_MS");
  return ms > 0 && ms < (1ll << 30) ? static_cast<int>(ms) : 30000;
}

// cudaSuccess when stream s drained within `ms`, cudaErrorNotReady past it, else its error.
cudaError_t streamDrainedWithin(cudaStream_t s, int ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  for (;;) {
    const cudaError_t e = cudaStreamQuery(s);
    if (e != cudaErrorNotReady) return e;
    if (std::chrono::steady_clock::now() > deadline) return cudaErrorNotReady;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

double median(std::vector<double> v) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// ---------------------------------------------------------------------------------------------
// Probe session: per-GPU buffers, streams and events, allocated on first use.

constexpr size_t kConfirmBytes = 16u << 20;    // pattern checks
constexpr size_t kCalibrateBytes = 16u << 20;  // first, untimed-size bandwidth run
constexpr size_t kMinBandwidthBytes = 1u << 20;
constexpr double kTargetIterationSeconds = 0.05;  // bounds the time of slow links
constexpr int kNumCounters = 8;
constexpr int kCounterStride = 32;  // words: one 128-byte line per counter
constexpr int kAtomicBlocks = 64;
constexpr int kAtomicThreads = 256;
constexpr int kAtomicRepeats = 16;
constexpr int kRoundsPerBatch = 100;
constexpr unsigned long long kMaxSpinTimeoutNs = 1000000000ull;  // 1 s per device-side wait

// Scratch layout: each field on its own 128-byte line.
constexpr size_t kMismatchOff = 0;
constexpr size_t kStatusOff = 128;
constexpr size_t kPingOff = 256;
constexpr size_t kPongOff = 384;
constexpr size_t kCountersOff = 1024;
constexpr size_t kBatchNsOff = kCountersOff + sizeof(unsigned) * kNumCounters * kCounterStride;

struct GpuRes {
  int dev = -1;
  bool ready = false;
  int smCount = 1;
  void* buf = nullptr;
  unsigned char* scratch = nullptr;
  cudaStream_t stream = nullptr;
  std::vector<cudaEvent_t> events;

  unsigned long long* mismatch() const {
    return reinterpret_cast<unsigned long long*>(scratch + kMismatchOff);
  }
  int* status() const { return reinterpret_cast<int*>(scratch + kStatusOff); }
  unsigned* ping() const { return reinterpret_cast<unsigned*>(scratch + kPingOff); }
  unsigned* pong() const { return reinterpret_cast<unsigned*>(scratch + kPongOff); }
  unsigned* counters() const { return reinterpret_cast<unsigned*>(scratch + kCountersOff); }
  unsigned long long* batchNs() const {
    return reinterpret_cast<unsigned long long*>(scratch + kBatchNsOff);
  }
};

class Session {
 public:
  Session(const Topology& t, const ProbeOptions& o)
      : opt_(o), timeoutMs_(hostTimeoutMs()), res_(static_cast<size_t>(t.size())) {
    bandwidthBytes_ = std::max(kMinBandwidthBytes, o.bandwidthBytes / 16 * 16);
    bufBytes_ = o.measure ? std::max(kConfirmBytes, bandwidthBytes_) : kConfirmBytes;
    scratchBytes_ = kBatchNsOff + sizeof(unsigned long long) * static_cast<size_t>(batches());
    for (int i = 0; i < t.size(); ++i) {
      res_[static_cast<size_t>(i)].dev = i;
      res_[static_cast<size_t>(i)].smCount = std::max(1, t.gpus[static_cast<size_t>(i)].smCount);
    }
    spinTimeoutNs_ =
        std::min(kMaxSpinTimeoutNs, static_cast<unsigned long long>(timeoutMs_) * 1000000ull / 4);
  }

  // Frees everything, unless a wait timed out: then kernels may still be running, and freeing
  // (which synchronizes) would hang, so the memory is left to the process.
  ~Session() {
    if (hung) return;
    for (GpuRes& r : res_) {
      if (!r.ready && r.buf == nullptr && r.scratch == nullptr && r.stream == nullptr) continue;
      if (cudaSetDevice(r.dev) != cudaSuccess) {
        cudaGetLastError();
        continue;
      }
      for (cudaEvent_t e : r.events) cudaEventDestroy(e);
      if (r.stream != nullptr) cudaStreamDestroy(r.stream);
      if (r.buf != nullptr) cudaFree(r.buf);
      if (r.scratch != nullptr) cudaFree(r.scratch);
      cudaGetLastError();
    }
  }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  int batches() const { return opt_.iterations + 1; }  // batch 0 warms up
  unsigned long long spinTimeoutNs() const { return spinTimeoutNs_; }
  const ProbeOptions& options() const { return opt_; }

  GpuRes& res(int dev) {
    GpuRes& r = res_.at(static_cast<size_t>(dev));
    if (r.ready) return r;
    DeviceGuard g(dev);
    ANYR_CUDA_CHECK(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking));
    ANYR_CUDA_CHECK(cudaMalloc(&r.buf, bufBytes_));
    ANYR_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&r.scratch), scratchBytes_));
    ANYR_CUDA_CHECK(cudaMemset(r.scratch, 0, scratchBytes_));
    if (opt_.measure) {
      r.events.reserve(static_cast<size_t>(2 * opt_.iterations));
      for (int i = 0; i < 2 * opt_.iterations; ++i) {
        cudaEvent_t e = nullptr;
        ANYR_CUDA_CHECK(cudaEventCreate(&e));
        r.events.push_back(e);
      }
    }
    ANYR_CUDA_CHECK(cudaDeviceSynchronize());
    r.ready = true;
    return r;
  }

  // Waits for everything queued on r's stream, bounded by ANYR_TIMEOUT_MS.
  void wait(const GpuRes& r, const std::string& what) {
    cudaError_t e = pollStream(r);
    if (e == cudaErrorNotReady) {
      hung = true;
      throwError(anyrTimeout, "probe: GPU " + std::to_string(r.dev) + " did not finish " + what +
                                  " within " + std::to_string(timeoutMs_) +
                                  " ms (ANYR_TIMEOUT_MS); peer memory access may hang on this "
                                  "system, or the GPU is busy");
    }
    if (e != cudaSuccess) throwCuda(e, what.c_str(), __FILE__, __LINE__);
  }

  // cudaSuccess when r's stream drained, cudaErrorNotReady on timeout, else the error.
  cudaError_t pollStream(const GpuRes& r) const {
    return streamDrainedWithin(r.stream, timeoutMs_);
  }

  // True when the device's context still works after an error in a pair's checks.
  bool healthy(int dev) {
    GpuRes& r = res_.at(static_cast<size_t>(dev));
    if (cudaSetDevice(dev) != cudaSuccess) return false;
    if (r.ready) {
      cudaError_t e = pollStream(r);
      if (e == cudaErrorNotReady) {
        hung = true;
        return false;
      }
    }
    cudaGetLastError();
    return cudaDeviceSynchronize() == cudaSuccess && cudaGetLastError() == cudaSuccess;
  }

  // Median bandwidth of launchCopy16(dst, src) on `r` in GB/s. A first run of up to 16 MiB
  // calibrates the size so that one iteration takes about 50 ms (between 1 MiB and
  // bandwidthBytes): a slow link is then measured on a smaller transfer instead of taking
  // minutes.
  double measureCopy(GpuRes& r, void* dst, const void* src, const std::string& what) {
    DeviceGuard g(r.dev);
    const int blocks = 2 * r.smCount;
    const size_t calib = std::min(kCalibrateBytes, bandwidthBytes_);
    float calibMs = 0;
    for (int pass = 0; pass < 2; ++pass) {  // pass 0 loads the module and warms the path
      ANYR_CUDA_CHECK(cudaEventRecord(r.events[0], r.stream));
      ANYR_CUDA_CHECK(pk::launchCopy16(dst, src, calib / 16, blocks, r.stream));
      ANYR_CUDA_CHECK(cudaEventRecord(r.events[1], r.stream));
      wait(r, what + " (calibration)");
      ANYR_CUDA_CHECK(cudaEventElapsedTime(&calibMs, r.events[0], r.events[1]));
    }
    const double rate = calibMs > 0 ? static_cast<double>(calib) / (calibMs * 1e-3) : 1e12;
    size_t bytes = static_cast<size_t>(std::min(
        static_cast<double>(bandwidthBytes_),
        std::max(static_cast<double>(kMinBandwidthBytes), rate * kTargetIterationSeconds)));
    bytes = std::min(bytes / 16 * 16, bandwidthBytes_);
    for (int i = 0; i < opt_.iterations; ++i) {
      ANYR_CUDA_CHECK(cudaEventRecord(r.events[static_cast<size_t>(2 * i)], r.stream));
      ANYR_CUDA_CHECK(pk::launchCopy16(dst, src, bytes / 16, blocks, r.stream));
      ANYR_CUDA_CHECK(cudaEventRecord(r.events[static_cast<size_t>(2 * i + 1)], r.stream));
    }
    wait(r, what);
    std::vector<double> ms;
    for (int i = 0; i < opt_.iterations; ++i) {
      float t = 0;
      ANYR_CUDA_CHECK(cudaEventElapsedTime(&t, r.events[static_cast<size_t>(2 * i)],
                                           r.events[static_cast<size_t>(2 * i + 1)]));
      ms.push_back(t);
    }
    const double m = median(ms);
    return m > 0 ? static_cast<double>(bytes) / (m * 1e-3) / 1e9 : -1;
  }

  bool hung = false;

 private:
  ProbeOptions opt_;
  int timeoutMs_;
  unsigned long long spinTimeoutNs_ = kMaxSpinTimeoutNs;
  size_t bandwidthBytes_ = 0;
  size_t bufBytes_ = 0;
  size_t scratchBytes_ = 0;
  std::vector<GpuRes> res_;
};

// Copies device memory of r's GPU to the host once r's stream has drained. The bounded wait
// comes first: a copy to pageable memory blocks the host until the work before it finished,
// which must never be unbounded.
void copyBack(void* host, const void* devPtr, size_t bytes, const GpuRes& r, Session& ses,
              const std::string& what) {
  DeviceGuard g(r.dev);
  ses.wait(r, what);
  ANYR_CUDA_CHECK(cudaMemcpyAsync(host, devPtr, bytes, cudaMemcpyDeviceToHost, r.stream));
  ses.wait(r, what);
}

template <typename T>
T readBack(const GpuRes& r, const T* devPtr, Session& ses, const std::string& what) {
  T v{};
  copyBack(&v, devPtr, sizeof(T), r, ses, what);
  return v;
}

// ---------------------------------------------------------------------------------------------
// The checks of one ordered pair (peer access s -> d enabled). Each result is written to `p`
// as soon as it is known, so an exception leaves the later ones at failed / not measured.

void checkPair(Session& ses, int s, int d, PairInfo& p) {
  GpuRes& rs = ses.res(s);
  GpuRes& rd = ses.res(d);
  const std::string tag = "GPU " + std::to_string(s) + " -> GPU " + std::to_string(d);
  const size_t n16 = kConfirmBytes / 16;
  const int fillBlocksS = 4 * rs.smCount;
  const int fillBlocksD = 4 * rd.smCount;
  const uint32_t seed = 0x5eed0000u + static_cast<uint32_t>(s) * 257u + static_cast<uint32_t>(d);

  // 1. Write: s stores the pattern into d's memory; d checks it locally.
  {
    DeviceGuard g(d);
    ANYR_CUDA_CHECK(cudaMemsetAsync(rd.buf, 0, kConfirmBytes, rd.stream));
    ANYR_CUDA_CHECK(cudaMemsetAsync(rd.mismatch(), 0, sizeof(unsigned long long), rd.stream));
    ses.wait(rd, "clearing the write-check buffer");
  }
  {
    DeviceGuard g(s);
    ANYR_CUDA_CHECK(pk::launchFillPattern(rd.buf, n16, seed, fillBlocksS, rs.stream));
    ses.wait(rs, "peer writes " + tag);
  }
  {
    DeviceGuard g(d);
    ANYR_CUDA_CHECK(
        pk::launchCheckPattern(rd.buf, n16, seed, rd.mismatch(), fillBlocksD, rd.stream));
  }
  const unsigned long long writeBad = readBack(rd, rd.mismatch(), ses, "write check " + tag);
  p.peerWriteOk = writeBad == 0;
  if (!p.peerWriteOk) {
    ANYR_LOG(Warn, -1,
             "probe: " << tag << ": peer writes reported by the driver arrived wrong (" << writeBad
                       << " of " << kConfirmBytes / 4 << " words)");
  }

  // 2. Read: d writes a pattern locally; s reads it through peer access and checks it.
  const uint32_t readSeed = seed ^ 0xa5a5a5a5u;
  {
    DeviceGuard g(d);
    ANYR_CUDA_CHECK(pk::launchFillPattern(rd.buf, n16, readSeed, fillBlocksD, rd.stream));
    ses.wait(rd, "filling the read-check buffer");
  }
  {
    DeviceGuard g(s);
    ANYR_CUDA_CHECK(cudaMemsetAsync(rs.mismatch(), 0, sizeof(unsigned long long), rs.stream));
    ANYR_CUDA_CHECK(
        pk::launchCheckPattern(rd.buf, n16, readSeed, rs.mismatch(), fillBlocksS, rs.stream));
  }
  const unsigned long long readBad = readBack(rs, rs.mismatch(), ses, "peer reads " + tag);
  p.peerReadOk = readBad == 0;
  if (!p.peerReadOk) {
    ANYR_LOG(Warn, -1,
             "probe: " << tag << ": peer reads reported by the driver returned wrong "
                       << "data (" << readBad << " of " << kConfirmBytes / 4 << " words)");
  }

  // 3. Atomics, only where the driver reports native peer atomics: on links without them an
  // atomic may be split into a read and a write (wrong totals) or fault the context.
  if (p.driverAtomics) {
    const size_t countersBytes = sizeof(unsigned) * kNumCounters * kCounterStride;
    {
      DeviceGuard g(d);
      ANYR_CUDA_CHECK(cudaMemsetAsync(rd.counters(), 0, countersBytes, rd.stream));
      ses.wait(rd, "clearing the atomic counters");
    }
    {
      DeviceGuard g(s);
      ANYR_CUDA_CHECK(pk::launchAtomicAdd(rd.counters(), kNumCounters, kCounterStride,
                                          kAtomicRepeats, kAtomicBlocks, kAtomicThreads,
                                          rs.stream));
      ses.wait(rs, "peer atomics " + tag);
    }
    std::vector<unsigned> got(static_cast<size_t>(kNumCounters) * kCounterStride);
    copyBack(got.data(), rd.counters(), countersBytes, rd, ses, "reading the atomic counters");
    const long long threads = static_cast<long long>(kAtomicBlocks) * kAtomicThreads;
    bool ok = true;
    for (int k = 0; k < kNumCounters; ++k) {
      const long long perCounter = threads / kNumCounters + (k < threads % kNumCounters ? 1 : 0);
      const long long want = perCounter * kAtomicRepeats;
      const unsigned have = got[static_cast<size_t>(k) * kCounterStride];
      if (static_cast<long long>(have) != want) {
        ok = false;
        ANYR_LOG(Warn, -1,
                 "probe: " << tag << ": peer atomicAdd total " << have << ", expected " << want
                           << " (counter " << k << ")");
      }
    }
    p.peerAtomicOk = ok;
  }

  if (!ses.options().measure) return;

  // 4. Bandwidth, on confirmed directions only: s stores into d's memory, s loads from it.
  if (p.peerWriteOk) p.writeGBps = ses.measureCopy(rs, rd.buf, rs.buf, "write bandwidth " + tag);
  if (p.peerReadOk) p.readGBps = ses.measureCopy(rs, rs.buf, rd.buf, "read bandwidth " + tag);

  // 5. One-way flag latency: both flags in d's memory; the kernel on s stores ping remotely
  // and polls pong remotely, the kernel on d answers locally. One-way = round trip / 2.
  if (p.peerWriteOk && p.peerReadOk) {
    const int batches = ses.batches();
    {
      DeviceGuard g(d);
      ANYR_CUDA_CHECK(cudaMemsetAsync(rd.scratch + kStatusOff, 0, kCountersOff - kStatusOff,
                                      rd.stream));  // status, ping, pong
      ses.wait(rd, "clearing the latency flags");
    }
    {
      DeviceGuard g(s);
      ANYR_CUDA_CHECK(cudaMemsetAsync(rs.status(), 0, sizeof(int), rs.stream));
      ses.wait(rs, "clearing the latency status");
    }
    {
      DeviceGuard g(d);
      ANYR_CUDA_CHECK(pk::launchPingPongResponder(rd.ping(), rd.pong(), batches * kRoundsPerBatch,
                                                  ses.spinTimeoutNs(), rd.status(), rd.stream));
    }
    {
      DeviceGuard g(s);
      ANYR_CUDA_CHECK(pk::launchPingPongInitiator(rd.ping(), rd.pong(), batches, kRoundsPerBatch,
                                                  ses.spinTimeoutNs(), rs.batchNs(), rs.status(),
                                                  rs.stream));
    }
    ses.wait(rs, "latency ping-pong " + tag);
    ses.wait(rd, "latency ping-pong " + tag);
    const int statusS = readBack(rs, rs.status(), ses, "latency status " + tag);
    const int statusD = readBack(rd, rd.status(), ses, "latency status " + tag);
    if (statusS == pk::kPingPongOk && statusD == pk::kPingPongOk) {
      std::vector<unsigned long long> ns(static_cast<size_t>(batches));
      copyBack(ns.data(), rs.batchNs(), ns.size() * sizeof(ns[0]), rs, ses,
               "reading latency timings " + tag);
      std::vector<double> perRoundUs;
      for (size_t b = 1; b < ns.size(); ++b) {  // batch 0 warmed up
        perRoundUs.push_back(static_cast<double>(ns[b]) / kRoundsPerBatch / 1000.0);
      }
      const double rtt = median(perRoundUs);
      p.latencyUs = rtt > 0 ? rtt / 2 : -1;
    } else {
      ANYR_LOG(Warn, -1,
               "probe: " << tag << ": flag ping-pong did not complete (initiator status " << statusS
                         << ", responder status " << statusD << "); latency not measured");
    }
  }
}

void probePair(Session& ses, Topology& t, int s, int d) {
  PairInfo& p = t.pair(s, d);
  const std::string tag = "GPU " + std::to_string(s) + " -> GPU " + std::to_string(d);
  bool enabledByUs = false;
  {
    DeviceGuard g(s);
    cudaError_t e = cudaDeviceEnablePeerAccess(d, 0);
    if (e == cudaSuccess) {
      enabledByUs = true;
    } else if (e == cudaErrorPeerAccessAlreadyEnabled) {
      cudaGetLastError();
    } else {
      cudaGetLastError();
      ANYR_LOG(Warn, -1,
               "probe: " << tag << ": the driver reports peer access, but enabling it "
                         << "failed (" << cudaGetErrorString(e)
                         << "); the pair counts as unconfirmed");
      return;
    }
  }
  try {
    checkPair(ses, s, d, p);
  } catch (const Error& err) {
    if (ses.hung) rethrowWithContext(err, "probing " + tag);
    cudaGetLastError();
    if (!ses.healthy(s) || !ses.healthy(d)) {
      rethrowWithContext(err, "probing " + tag + " (the CUDA context is no longer usable)");
    }
    ANYR_LOG(Warn, -1,
             "probe: " << tag << ": " << err.what()
                       << "; the remaining checks of this pair count as failed");
  }
  if (enabledByUs) {
    DeviceGuard g(s);
    cudaError_t e = cudaDeviceDisablePeerAccess(d);
    if (e != cudaSuccess) {
      cudaGetLastError();
      ANYR_LOG(
          Warn, -1,
          "probe: " << tag << ": disabling peer access failed (" << cudaGetErrorString(e) << ")");
    }
  }
  ANYR_LOG(Info, -1,
           "probe: " << tag << ": write " << (p.peerWriteOk ? "ok" : "FAIL") << ", read "
                     << (p.peerReadOk ? "ok" : "FAIL") << ", atomic "
                     << (p.peerAtomicOk ? "ok" : "no") << ", write " << p.writeGBps
                     << " GB/s, read " << p.readGBps << " GB/s, latency " << p.latencyUs << " us");
}

}  // namespace

uint64_t hostHashOf(const std::string& hostId, const std::string& hostName,
                    const std::string& bootId) {
  if (!hostId.empty()) return fnv1a64("ANYR_HOST_ID\n" + hostId);
  return fnv1a64(hostName + "\n" + bootId);
}

// ---------------------------------------------------------------------------------------------

GpuInfo probeGpu(int cudaDevice) {
  int count = 0;
  ANYR_CUDA_CHECK(cudaGetDeviceCount(&count));
  ANYR_REQUIRE_ARG(cudaDevice >= 0 && cudaDevice < count, "cudaDevice",
                   "must be a CUDA device ordinal in [0, " + std::to_string(count) + ")");
  cudaDeviceProp prop{};
  ANYR_CUDA_CHECK(cudaGetDeviceProperties(&prop, cudaDevice));
  GpuInfo g;
  g.index = cudaDevice;
  g.name = prop.name;
  char bus[64] = {};
  ANYR_CUDA_CHECK(cudaDeviceGetPCIBusId(bus, sizeof(bus) - 1, cudaDevice));
  g.pciBusId = nvml::normalizeBusId(bus);
  if (g.pciBusId.empty()) {
    g.pciBusId = bus;
    for (char& c : g.pciBusId) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  g.uuid = uuidString(prop.uuid);
  g.hostHash = localHostHash();
  g.ccMajor = prop.major;
  g.ccMinor = prop.minor;
  g.smCount = prop.multiProcessorCount;
  g.sharedMemPerBlockOptin = static_cast<int64_t>(prop.sharedMemPerBlockOptin);
  g.sharedMemPerSm = static_cast<int64_t>(prop.sharedMemPerMultiprocessor);
  int v = 0;
  ANYR_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrClusterLaunch, cudaDevice));
  g.clusterLaunch = v != 0;
  v = 0;
  ANYR_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrHostNativeAtomicSupported, cudaDevice));
  g.hostNativeAtomics = v != 0;
  g.totalMemBytes = static_cast<int64_t>(prop.totalGlobalMem);
  g.numaNode = numaNodeOf(g.pciBusId);
  nvml::PcieLink link;
  nvml::pcieLink(g.pciBusId, &link);
  g.pcieGen = link.gen;
  g.pcieWidth = link.width;
  g.pcieMaxGen = link.maxGen;
  g.pcieMaxWidth = link.maxWidth;
  return g;
}

PairInfo describePair(int myCudaDevice, const GpuInfo& me, const GpuInfo& peer) {
  PairInfo p;
  p.src = me.index;
  p.dst = peer.index;
  if (me.hostHash != 0 && peer.hostHash != 0 && me.hostHash != peer.hostHash) {
    p.link = LinkType::None;  // another host: no peer-to-peer path
    return p;
  }
  const std::string myBus = nvml::normalizeBusId(me.pciBusId);
  const std::string peerBus = nvml::normalizeBusId(peer.pciBusId);
  if (!myBus.empty() && myBus == peerBus) {
    p.link = LinkType::Self;
    return p;
  }
  p.pcieRelation = nvml::commonAncestor(myBus, peerBus);
  const nvml::P2PStatus st = nvml::p2pStatus(myBus, peerBus);

  // Driver peer access: from CUDA when the peer is visible here, else from NVML.
  int peerDev = -1;
  bool visible = false;
  if (!peerBus.empty() && cudaDeviceGetByPCIBusId(&peerDev, peerBus.c_str()) == cudaSuccess) {
    visible = peerDev != myCudaDevice;
  } else {
    cudaGetLastError();  // not visible in this process: not an error
  }
  bool known = visible;
  if (visible) {
    int can = 0;
    ANYR_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, myCudaDevice, peerDev));
    p.driverPeerAccess = can != 0;
    if (p.driverPeerAccess) {
      int atom = 0;
      ANYR_CUDA_CHECK(cudaDeviceGetP2PAttribute(&atom, cudaDevP2PAttrNativeAtomicSupported,
                                                myCudaDevice, peerDev));
      p.driverAtomics = atom != 0;
    }
  } else if (st.read != nvml::Tri::Unknown || st.write != nvml::Tri::Unknown) {
    known = true;
    p.driverPeerAccess = st.read == nvml::Tri::Yes && st.write == nvml::Tri::Yes;
    p.driverAtomics = p.driverPeerAccess && st.atomics == nvml::Tri::Yes;
  }

  // NVLink: direct links to the peer, else NVSwitch links on both sides. Nominal speed per link
  // from NVML's speed field, else from the NVLink version of the links counted.
  std::vector<nvml::NvLink> mine;
  if (nvml::activeNvLinks(myBus, &mine)) {
    int direct = 0, toSwitch = 0;
    double directPerLink = 1e300, switchPerLink = 1e300;
    for (const nvml::NvLink& l : mine) {
      if (!l.remoteBusId.empty() && l.remoteBusId == peerBus) {
        ++direct;
        directPerLink = std::min(directPerLink, nvml::nvlinkGBpsPerLink(l.version));
      } else if (l.remoteType == nvml::RemoteType::Switch) {
        ++toSwitch;
        switchPerLink = std::min(switchPerLink, nvml::nvlinkGBpsPerLink(l.version));
      }
    }
    int count = 0;
    double perLink = -1;
    if (direct > 0) {
      count = direct;
      perLink = directPerLink;
    } else if (toSwitch > 0 && st.nvlink == nvml::Tri::Yes) {
      std::vector<nvml::NvLink> theirs;
      int peerSwitch = toSwitch;
      if (nvml::activeNvLinks(peerBus, &theirs)) {
        int c = 0;
        for (const nvml::NvLink& l : theirs) c += l.remoteType == nvml::RemoteType::Switch;
        if (c > 0) peerSwitch = c;
      }
      count = std::min(toSwitch, peerSwitch);
      perLink = switchPerLink;
    }
    if (count > 0) {
      const double speed = nvml::nvlinkSpeedGBps(myBus);
      if (speed > 0) perLink = speed;
      p.link = LinkType::NVLink;
      p.nvlinkCount = count;
      p.linkGBps = perLink > 0 && perLink < 1e300 ? count * perLink : -1;
    }
  }
  if (p.link == LinkType::Unknown && st.nvlink == nvml::Tri::Yes) {
    p.link = LinkType::NVLink;  // NVML says NVLink, without the wiring
  }
  if (p.link == LinkType::Unknown && known) {
    p.link = p.driverPeerAccess ? LinkType::PCIe : LinkType::None;
  }
  return p;
}

Topology probeLocal(const ProbeOptions& options) {
  ANYR_REQUIRE_ARG(options.iterations >= 1 && options.iterations <= 10000, "iterations",
                   "must be in [1, 10000]");
  ANYR_REQUIRE_ARG(!options.measure || options.bandwidthBytes >= (1u << 20), "bandwidthBytes",
                   "must be at least 1 MiB");

  Topology t;
  t.source = "probe";
  t.hostName = localHostName();
  t.driverVersion = nvml::driverVersion();
  if (cudaDriverGetVersion(&t.cudaDriverVersion) != cudaSuccess) {
    cudaGetLastError();
    t.cudaDriverVersion = 0;
  }
  if (cudaRuntimeGetVersion(&t.cudaRuntimeVersion) != cudaSuccess) {
    cudaGetLastError();
    t.cudaRuntimeVersion = 0;
  }

  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) {
    cudaGetLastError();
    ANYR_LOG(Info, -1, "probe: no usable GPU (" << cudaGetErrorString(e) << ")");
    return t;
  }
  ANYR_CUDA_CHECK(e);

  int prev = -1;
  if (n > 0) ANYR_CUDA_CHECK(cudaGetDevice(&prev));
  try {
    for (int i = 0; i < n; ++i) t.gpus.push_back(probeGpu(i));
    t.resizePairs();
    for (int s = 0; s < n; ++s) {
      for (int d = 0; d < n; ++d) {
        if (s != d)
          t.pair(s, d) =
              describePair(s, t.gpus[static_cast<size_t>(s)], t.gpus[static_cast<size_t>(d)]);
      }
    }
    Session ses(t, options);
    for (int s = 0; s < n; ++s) {
      for (int d = 0; d < n; ++d) {
        if (s != d && t.pair(s, d).driverPeerAccess) probePair(ses, t, s, d);
      }
    }
  } catch (const Error&) {
    if (prev >= 0 && cudaSetDevice(prev) != cudaSuccess) cudaGetLastError();
    throw;
  }
  if (prev >= 0) ANYR_CUDA_CHECK(cudaSetDevice(prev));
  return t;
}

// ---------------------------------------------------------------------------------------------

bool dependentLaunchWorks(cudaError_t launched, int word, std::string* reason) {
  if (launched != cudaSuccess) {
    *reason = std::string("the probe launch was refused: ") + cudaGetErrorString(launched);
    return false;
  }
  if (word == pk::kDependentNoWait) {
    *reason =
        "this build's device code for the GPU has no wait instruction (compiled for a target "
        "below 9.0)";
    return false;
  }
  if (word != 2) {
    *reason = "the probe's second kernel read " + std::to_string(word - 1) +
              " where the first had written 1";
    return false;
  }
  *reason = "the probe launch worked";
  return true;
}

namespace {

// launchDependentPair on a stream of its own on the current device. The calls touch only that
// stream and its memory, so they run in the relaxed capture mode: another thread capturing a
// graph in the global mode is neither disturbed nor a reason to refuse. A wait past
// ANYR_TIMEOUT_MS ends the probe as failed (its stream and memory are then left behind), so a
// busy or hung GPU costs that wait once per process, not once per call.
DependentLaunch probeDependentLaunch(int device) {
  struct RestoreCaptureMode {
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    ~RestoreCaptureMode() { (void)cudaThreadExchangeStreamCaptureMode(&mode); }
  } restore;
  ANYR_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&restore.mode));
  cudaStream_t s = nullptr;
  ANYR_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const int timeoutMs = hostTimeoutMs();
  DependentLaunch out;
  out.probed = true;
  // True once the stream drained; false (out.reason set) past the deadline.
  auto drained = [&](const char* what) {
    const cudaError_t e = streamDrainedWithin(s, timeoutMs);
    if (e == cudaSuccess) return true;
    if (e != cudaErrorNotReady) throwCuda(e, what, __FILE__, __LINE__);
    out.reason = std::string(what) + " did not finish within " + std::to_string(timeoutMs) +
                 " ms (ANYR_TIMEOUT_MS)";
    ANYR_LOG(Warn, -1, "GPU " << device << ": " << out.reason);
    return false;
  };
  void* word = nullptr;
  cudaError_t e = cudaMallocAsync(&word, sizeof(int), s);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    (void)cudaStreamDestroy(s);
    out.reason = std::string("no stream-ordered memory for the probe: ") + cudaGetErrorString(e);
    return out;
  }
  ANYR_CUDA_CHECK(cudaMemsetAsync(word, 0, sizeof(int), s));
  const cudaError_t launched = pk::launchDependentPair(static_cast<int*>(word), s);
  if (launched != cudaSuccess) (void)cudaGetLastError();
  if (!drained("the programmatic-launch probe")) return out;
  // The stream is idle: this copy (to pageable memory, so it returns when done) waits for
  // nothing else.
  int got = 0;
  ANYR_CUDA_CHECK(cudaMemcpyAsync(&got, word, sizeof(int), cudaMemcpyDeviceToHost, s));
  ANYR_CUDA_CHECK(cudaFreeAsync(word, s));
  if (!drained("the programmatic-launch probe's release")) return out;
  ANYR_CUDA_CHECK(cudaStreamDestroy(s));
  out.works = dependentLaunchWorks(launched, got, &out.reason);
  return out;
}

}  // namespace

DependentLaunch dependentLaunchOn(int device, bool mayProbe) {
  static std::mutex mu;
  static std::map<int, DependentLaunch> known;
  std::lock_guard<std::mutex> lock(mu);
  auto it = known.find(device);
  if (it != known.end()) return it->second;
  if (!mayProbe) return DependentLaunch{};
  DependentLaunch d = probeDependentLaunch(device);
  ANYR_LOG(Info, -1,
           "GPU " << device << ": programmatic launch for kernels launched without a "
                  << "communicator " << (d.works ? "on" : "off") << " (" << d.reason << ")");
  known.emplace(device, d);
  return d;
}

}  // namespace anyr
