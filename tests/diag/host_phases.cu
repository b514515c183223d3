// anyr_host_phases: where the time of a small all-reduce through pinned host memory goes, on
// two GPUs without peer access (the host one-shot kernels: algo/host_oneshot.cu, flag protocol;
// algo/host_oneshot_ll.cu, low-latency protocol). One process drives both GPUs, one stream each;
// each GPU writes its region of one mapped portable pinned segment and reads the other's.
// Variants (1 KiB .. 256 KiB of fp32, 1..64 blocks, one launch per GPU at a time):
//   flag   write, __syncthreads, per-block flag st.release.sys, poll the peer's same-block flag
//          (ld.acquire.sys), then read the peer's data one vector at a time (as host_oneshot.cu
//          with one round);
//   batch  the same, but each thread issues up to 8 peer loads before using any;
//   ll     16-byte lines {data, epoch, data, epoch}, one lane per warp probes, then the warp
//          reads (as host_oneshot_ll.cu: 2 vectors per pass, 200 ns pause between polls);
//   write  the stores and the release fence only; read: the (batched) peer loads only.
// Thread 0 of each block records %globaltimer at each phase (after a __syncthreads, so the
// block's slowest thread counts). A phase's time is when the last block passed it, from the
// first block's start on the same GPU; each is the median over the repetitions.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "device/common.cuh"
#include "device/ll_lines.cuh"
#include "diag_check.h"

namespace {

enum Variant { kFlag, kBatch, kLL, kWrite, kRead, kVariants };
const char* const kVariantNames[kVariants] = {"flag", "batch", "ll", "write", "read"};
enum Phase { kStart, kWritten, kReleased, kSeen, kReadDone, kEnd, kPhases };

constexpr int kMaxBlocks = 64;
constexpr size_t kMaxBytes = 256u << 10;
// One GPU's region: flags (one word per block), two data buffers, two LL buffers (epoch parity).
constexpr size_t kDataOff = 4096;
constexpr size_t kLLOff = kDataOff + 2 * kMaxBytes;
constexpr size_t kRegionBytes = kLLOff + 4 * kMaxBytes;
constexpr size_t kAbortOff = 2 * kRegionBytes;  // one word after both regions
constexpr uint64_t kTimeoutNs = 1000000000ull;  // every wait gives up after 1 s
constexpr int kBatchVecs = 8;
constexpr int kLLVecsPerPass = 2;
constexpr unsigned kLLPollPauseNs = 200;
constexpr int kWarm = 20, kReps = 200;

struct Args {
  char* own;                // this GPU's region of the segment
  const char* peer;         // the other GPU's region
  volatile int* abortWord;  // mapped: set by the first wait that times out, stops the peer
  const float4* in;         // this GPU's contribution (device memory)
  float4* out;
  uint64_t V;      // 16-byte vectors
  uint32_t epoch;  // grows by one per launch, equal on both GPUs
  int rank;
  unsigned long long* ts;  // [blocks][kPhases] of this launch
  int* errors;             // [0] waits timed out or aborted, [1] wrong sums
};

__device__ __forceinline__ float inValue(int r, uint64_t i) {
  return static_cast<float>(static_cast<int>((i * 7 + static_cast<uint64_t>(r) * 5) % 17) - 8);
}
// What this rank sends for vector v: its input plus a launch-dependent integer, so a stale
// buffer (two launches old) gives a wrong sum.
__device__ __forceinline__ float4 mine(const Args& a, uint64_t v) {
  const float e = static_cast<float>(a.epoch & 7u);
  float4 x = a.in[v];
  x.x += e, x.y += e, x.z += e, x.w += e;
  return x;
}
__device__ __forceinline__ uint4 bits(float4 x) {
  return make_uint4(__float_as_uint(x.x), __float_as_uint(x.y), __float_as_uint(x.z),
                    __float_as_uint(x.w));
}
// Rank order 0, 1 (as the kernels); checks against the formula, stores the result.
__device__ __forceinline__ void reduceOne(const Args& a, uint64_t v, uint4 peerBits) {
  const float4 m = mine(a, v);
  const float p[4] = {__uint_as_float(peerBits.x), __uint_as_float(peerBits.y),
                      __uint_as_float(peerBits.z), __uint_as_float(peerBits.w)};
  const float o[4] = {m.x, m.y, m.z, m.w};
  float s[4];
  bool bad = false;
  const float e2 = 2.0f * static_cast<float>(a.epoch & 7u);
  for (int j = 0; j < 4; ++j) {
    s[j] = a.rank == 0 ? o[j] + p[j] : p[j] + o[j];
    bad |= s[j] != inValue(0, v * 4 + j) + inValue(1, v * 4 + j) + e2;
  }
  if (bad) atomicAdd(&a.errors[1], 1);
  a.out[v] = make_float4(s[0], s[1], s[2], s[3]);
}

// Checked every 16th call only (the abort word is in host memory: a PCIe read).
__device__ bool timedOut(const Args& a, uint64_t t0, uint32_t& calls) {
  if (++calls % 16 != 0) return false;
  if (*a.abortWord != 0) return true;
  if (anyr::dev::globalTimerNs() - t0 < kTimeoutNs) return false;
  *a.abortWord = 1;
  __threadfence_system();
  return true;
}

template <int kV>
__global__ void __launch_bounds__(512) phasesKernel(Args a) {
  using namespace anyr::dev;
  __shared__ unsigned long long seenMax;
  unsigned long long t[kPhases] = {};
  t[kStart] = globalTimerNs();
  const unsigned tid = threadIdx.x, bd = blockDim.x;
  const uint32_t par = a.epoch & 1u;
  int failed = 0;
  if (tid == 0) seenMax = 0;
  if constexpr (kV != kLL) {
    // Block-contiguous ranges, one flag per block (host_oneshot.cu, one round).
    const uint64_t per = (a.V + gridDim.x - 1) / gridDim.x;
    const uint64_t lo = per * blockIdx.x, hi = min(a.V, lo + per);
    char* own = a.own + kDataOff + par * kMaxBytes;
    const char* peer = a.peer + kDataOff + par * kMaxBytes;
    if (kV != kRead) {
      for (uint64_t v = lo + tid; v < hi; v += bd) storeSys(own + v * 16, bits(mine(a, v)));
    }
    __syncthreads();
    t[kWritten] = globalTimerNs();
    if (kV != kRead && tid == 0) {
      storeReleaseSys(reinterpret_cast<uint32_t*>(a.own) + blockIdx.x, a.epoch);
    }
    t[kReleased] = globalTimerNs();
    if (kV == kFlag || kV == kBatch) {
      // As hostWaitFlags: the thread numbered as the peer polls its flag.
      if (static_cast<int>(tid) == 1 - a.rank) {
        const uint32_t* f = reinterpret_cast<const uint32_t*>(a.peer) + blockIdx.x;
        const uint64_t t0 = globalTimerNs();
        uint32_t calls = 0;
        while (static_cast<int32_t>(loadAcquireSys(f) - a.epoch) < 0) {
          if (timedOut(a, t0, calls)) {
            failed = 1;
            break;
          }
        }
      }
      failed = __syncthreads_or(failed);
      t[kSeen] = globalTimerNs();
      if (!failed && kV == kFlag) {
        for (uint64_t v = lo + tid; v < hi; v += bd) reduceOne(a, v, loadVolatile(peer + v * 16));
      } else if (!failed) {
        for (uint64_t v0 = lo + tid; v0 < hi; v0 += kBatchVecs * bd) {
          uint4 x[kBatchVecs];
#pragma unroll
          for (int k = 0; k < kBatchVecs; ++k) {
            if (v0 + k * bd < hi) x[k] = loadVolatile(peer + (v0 + k * bd) * 16);
          }
#pragma unroll
          for (int k = 0; k < kBatchVecs; ++k) {
            if (v0 + k * bd < hi) reduceOne(a, v0 + k * bd, x[k]);
          }
        }
      }
    } else if (kV == kRead) {
      t[kSeen] = t[kReleased];
      for (uint64_t v0 = lo + tid; v0 < hi; v0 += kBatchVecs * bd) {
        uint4 x[kBatchVecs];
#pragma unroll
        for (int k = 0; k < kBatchVecs; ++k) {
          if (v0 + k * bd < hi) x[k] = loadVolatile(peer + (v0 + k * bd) * 16);
        }
        uint4 s = make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int k = 0; k < kBatchVecs; ++k) {
          if (v0 + k * bd < hi) s.x ^= x[k].x, s.y ^= x[k].y, s.z ^= x[k].z, s.w ^= x[k].w;
        }
        a.out[v0] = make_float4(__uint_as_float(s.x), __uint_as_float(s.y), __uint_as_float(s.z),
                                __uint_as_float(s.w));
      }
    } else {
      t[kSeen] = t[kReleased];
    }
  } else {
    // LL (host_oneshot_ll.cu): grid-stride, each vector as two flagged lines.
    char* own = a.own + kLLOff + par * 2 * kMaxBytes;
    const char* src = a.peer + kLLOff + par * 2 * kMaxBytes;
    const uint64_t stride = static_cast<uint64_t>(gridDim.x) * bd;
    const uint64_t first = static_cast<uint64_t>(blockIdx.x) * bd + tid;
    const uint32_t ep = a.epoch;
    for (uint64_t v = first; v < a.V; v += stride) {
      const uint4 x = bits(mine(a, v));
      storeSys(own + v * 32, make_uint4(x.x, ep, x.y, ep));
      storeSys(own + v * 32 + 16, make_uint4(x.z, ep, x.w, ep));
    }
    __syncthreads();
    t[kWritten] = t[kReleased] = globalTimerNs();
    const uint64_t t0 = t[kWritten];
    bool ok = true;
    uint32_t calls = 0;
    for (uint64_t v0 = first; v0 < a.V && ok; v0 += stride * kLLVecsPerPass) {
      const unsigned active = __activemask();
      if (static_cast<int>(tid % 32) == 31 - __clz(active)) {
        uint4 probe = loadVolatile(src + v0 * 32 + 16);
        while (probe.y != ep || probe.w != ep) {
          if (timedOut(a, t0, calls)) {
            ok = false;
            break;
          }
          __nanosleep(kLLPollPauseNs);
          probe = loadVolatile(src + v0 * 32 + 16);
        }
        if (ok && v0 == first) atomicMax(&seenMax, globalTimerNs());
      }
      if (__any_sync(active, !ok)) ok = false;
      if (!ok) break;
      uint4 lo[kLLVecsPerPass], hi[kLLVecsPerPass];
      anyr::dev::loadLLPass(src, v0, stride, a.V, lo, hi);
#pragma unroll
      for (int k = 0; k < kLLVecsPerPass; ++k) {
        const uint64_t v = v0 + k * stride;
        if (v >= a.V || !ok) continue;
        while (lo[k].y != ep || lo[k].w != ep || hi[k].y != ep || hi[k].w != ep) {
          if (timedOut(a, t0, calls)) {
            ok = false;
            break;
          }
          __nanosleep(kLLPollPauseNs);
          lo[k] = loadVolatile(src + v * 32), hi[k] = loadVolatile(src + v * 32 + 16);
        }
        if (ok) reduceOne(a, v, make_uint4(lo[k].x, lo[k].z, hi[k].x, hi[k].z));
      }
    }
    failed = !ok;
    failed = __syncthreads_or(failed);
    t[kSeen] = seenMax != 0 ? seenMax : t[kWritten];  // blocks without work: nothing to see
  }
  __syncthreads();
  t[kReadDone] = globalTimerNs();
  __syncthreads();
  t[kEnd] = globalTimerNs();
  if (tid == 0) {
    if (failed) atomicAdd(&a.errors[0], 1);
    for (int p = 0; p < kPhases; ++p) a.ts[blockIdx.x * kPhases + p] = t[p];
  }
}

// Smallest step of %globaltimer seen (its resolution on this GPU).
__global__ void timerStep(unsigned long long* out) {
  unsigned long long best = ~0ull;
  for (int i = 0; i < 50; ++i) {
    const unsigned long long a = anyr::dev::globalTimerNs();
    unsigned long long b = a;
    while (b == a) b = anyr::dev::globalTimerNs();
    best = min(best, b - a);
  }
  *out = best;
}

struct Gpu {
  cudaStream_t s;
  float4 *in, *out;
  unsigned long long* ts;
  int* errors;
  std::vector<cudaEvent_t> ev;  // [rep][2]
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main() {
  const int ndev = diagGpuCount("anyr_host_phases");
  if (ndev == 0) return 0;
  if (ndev < 2) {
    std::printf("anyr_host_phases: needs two GPUs, %d visible; nothing to measure\n", ndev);
    return 0;
  }
  char* seg = nullptr;
  DIAG_CHECK(cudaHostAlloc(&seg, kAbortOff + 64, cudaHostAllocPortable | cudaHostAllocMapped));
  std::fill(seg, seg + kAbortOff + 64, 0);
  auto* abortWord = reinterpret_cast<volatile int*>(seg + kAbortOff);
  const size_t tsWords = static_cast<size_t>(kWarm + kReps) * kMaxBlocks * kPhases;
  Gpu g[2];
  std::vector<float> host(kMaxBytes / 4);
  for (int d = 0; d < 2; ++d) {
    DIAG_CHECK(cudaSetDevice(d));
    DIAG_CHECK(cudaStreamCreateWithFlags(&g[d].s, cudaStreamNonBlocking));
    DIAG_CHECK(cudaMalloc(&g[d].in, kMaxBytes));
    DIAG_CHECK(cudaMalloc(&g[d].out, kMaxBytes));
    DIAG_CHECK(cudaMalloc(&g[d].ts, tsWords * 8));
    DIAG_CHECK(cudaMalloc(&g[d].errors, 2 * sizeof(int)));
    for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>((i * 7 + d * 5) % 17) - 8;
    DIAG_CHECK(cudaMemcpy(g[d].in, host.data(), kMaxBytes, cudaMemcpyHostToDevice));
    g[d].ev.resize(2 * (kWarm + kReps));
    for (auto& e : g[d].ev) DIAG_CHECK(cudaEventCreate(&e));
    unsigned long long* step = nullptr;
    unsigned long long stepNs = 0;
    DIAG_CHECK(cudaMalloc(&step, 8));
    timerStep<<<1, 1>>>(step);
    DIAG_CHECK(cudaMemcpy(&stepNs, step, 8, cudaMemcpyDeviceToHost));
    std::printf("GPU %d: %%globaltimer step %llu ns\n", d, stepNs);
  }
  void (*kernels[kVariants])(Args) = {phasesKernel<kFlag>, phasesKernel<kBatch>, phasesKernel<kLL>,
                                      phasesKernel<kWrite>, phasesKernel<kRead>};
  std::printf(
      "us, medians of %d launches per GPU (after %d warm-up); phases on GPU 0 from its first "
      "block's start to the last block past: skew = blocks' start spread, wrote = own data "
      "stored, rel = flag released (fence), seen = peer flag / first LL line seen, read = peer "
      "data read and summed, end; end1 = GPU 1's end; ev0/ev1 = cudaEvent time per launch\n",
      kReps, kWarm);
  std::printf("%-5s %6s %4s %4s %4s | %6s %6s %6s %6s %6s %6s | %6s | %6s %6s | %s\n", "var",
              "bytes", "blk", "thr", "vpt", "skew", "wrote", "rel", "seen", "read", "end", "end1",
              "ev0", "ev1", "check");
  uint32_t epoch = 0;
  bool anyFail = false;
  for (int var = 0; var < kVariants; ++var) {
    for (size_t bytes : {size_t{1} << 10, size_t{4} << 10, size_t{16} << 10, size_t{64} << 10,
                         size_t{256} << 10}) {
      for (int blocks : {1, 4, 8, 16, 32, 64}) {
        const uint64_t V = bytes / 16;
        const uint64_t perBlock = (V + blocks - 1) / blocks;
        const int threads = static_cast<int>(
            std::min<uint64_t>(512, std::max<uint64_t>(32, (perBlock + 31) / 32 * 32)));
        const uint64_t vpt = (perBlock + threads - 1) / threads;
        *abortWord = 0;
        for (int d = 0; d < 2; ++d) {
          DIAG_CHECK(cudaSetDevice(d));
          DIAG_CHECK(cudaMemset(g[d].errors, 0, 2 * sizeof(int)));
          DIAG_CHECK(cudaDeviceSynchronize());
        }
        for (int rep = 0; rep < kWarm + kReps; ++rep) {
          ++epoch;
          for (int d = 0; d < 2; ++d) {
            DIAG_CHECK(cudaSetDevice(d));
            Args a{seg + d * kRegionBytes,
                   seg + (1 - d) * kRegionBytes,
                   abortWord,
                   g[d].in,
                   g[d].out,
                   V,
                   epoch,
                   d,
                   g[d].ts + static_cast<size_t>(rep) * kMaxBlocks * kPhases,
                   g[d].errors};
            DIAG_CHECK(cudaEventRecord(g[d].ev[2 * rep], g[d].s));
            kernels[var]<<<blocks, threads, 0, g[d].s>>>(a);
            DIAG_CHECK(cudaGetLastError());
            DIAG_CHECK(cudaEventRecord(g[d].ev[2 * rep + 1], g[d].s));
          }
        }
        std::vector<unsigned long long> ts[2];
        std::vector<double> evUs[2];
        int errs[2][2];
        for (int d = 0; d < 2; ++d) {
          DIAG_CHECK(cudaSetDevice(d));
          DIAG_CHECK(cudaStreamSynchronize(g[d].s));
          ts[d].resize(tsWords);
          DIAG_CHECK(cudaMemcpy(ts[d].data(), g[d].ts, tsWords * 8, cudaMemcpyDeviceToHost));
          DIAG_CHECK(cudaMemcpy(errs[d], g[d].errors, sizeof(errs[d]), cudaMemcpyDeviceToHost));
          for (int rep = kWarm; rep < kWarm + kReps; ++rep) {
            float ms = 0;
            DIAG_CHECK(cudaEventElapsedTime(&ms, g[d].ev[2 * rep], g[d].ev[2 * rep + 1]));
            evUs[d].push_back(ms * 1e3);
          }
        }
        // Per launch and GPU: phase p = (last block past p) - (first block's start).
        auto phaseUs = [&](int d, int p) {
          std::vector<double> v;
          for (int rep = kWarm; rep < kWarm + kReps; ++rep) {
            const unsigned long long* r = &ts[d][static_cast<size_t>(rep) * kMaxBlocks * kPhases];
            unsigned long long first = ~0ull, last = 0, lastStart = 0;
            for (int b = 0; b < blocks; ++b) {
              first = std::min(first, r[b * kPhases + kStart]);
              lastStart = std::max(lastStart, r[b * kPhases + kStart]);
              last = std::max(last, r[b * kPhases + p]);
            }
            v.push_back(static_cast<double>((p == kStart ? lastStart : last) - first) / 1e3);
          }
          return median(v);
        };
        const bool fail = errs[0][0] + errs[1][0] + errs[0][1] + errs[1][1] != 0;
        anyFail |= fail;
        char check[96] = "ok";
        const bool checked = var == kFlag || var == kBatch || var == kLL;
        if (fail) {
          std::snprintf(check, sizeof(check), "FAILED: %d block waits timed out, %d wrong sums",
                        errs[0][0] + errs[1][0], errs[0][1] + errs[1][1]);
        } else if (!checked) {
          std::snprintf(check, sizeof(check), "(no data check)");
        }
        std::printf(
            "%-5s %6zu %4d %4d %4llu | %6.2f %6.2f %6.2f %6.2f %6.2f %6.2f | %6.2f | %6.2f %6.2f "
            "| %s\n",
            kVariantNames[var], bytes, blocks, threads, static_cast<unsigned long long>(vpt),
            phaseUs(0, kStart), phaseUs(0, kWritten), phaseUs(0, kReleased), phaseUs(0, kSeen),
            phaseUs(0, kReadDone), phaseUs(0, kEnd), phaseUs(1, kEnd), median(evUs[0]),
            median(evUs[1]), check);
        std::fflush(stdout);
      }
    }
  }
  if (anyFail) std::printf("anyr_host_phases: FAILED (see the check column)\n");
  return anyFail ? 1 : 0;
}
