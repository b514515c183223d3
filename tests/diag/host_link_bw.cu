// anyr_host_link_bw: what each GPU's link to pinned host memory gives, the ceiling of the
// host-memory transport. One process, up to two GPUs, each writing to its own pinned buffer and
// reading the other GPU's (as the host algorithms do):
//   - copy engines: device-to-host, host-to-device, and both directions at once;
//   - SM stores to and loads from mapped pinned memory, with 16..132 blocks;
//   - the one-way flag latency between two GPUs through host memory (a ping-pong).
// Times are CUDA-event times of the best of five runs; with two GPUs the slower GPU counts.
// Large sizes only mean something: below ~1 MiB launch overhead dominates.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "diag_check.h"

namespace {

__global__ void storeToHost(uint4* dst, const uint4* src, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint4 v = src[i];
    asm volatile("st.volatile.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(dst + i), "r"(v.x),
                 "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
  }
}

__global__ void loadFromHost(uint4* dst, const uint4* src, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint4 v;
    asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(src + i));
    dst[i] = v;
  }
}

__device__ uint64_t nowNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Bounded: gives up after 2 s (a missing peer must not hang the diagnostic).
__global__ void pingPong(volatile uint32_t* mine, volatile const uint32_t* theirs, int iters,
                         int first, unsigned long long* ns) {
  const uint64_t t0 = nowNs();
  for (int i = 1; i <= iters; ++i) {
    if (first) *mine = static_cast<uint32_t>(i);
    while (*theirs < static_cast<uint32_t>(i)) {
      if (nowNs() - t0 > 2000000000ull) {
        *ns = 0;
        return;
      }
    }
    if (!first) *mine = static_cast<uint32_t>(i);
  }
  *ns = nowNs() - t0;
}

struct Gpu {
  void* dev[2];
  cudaStream_t s[2];
  cudaEvent_t start, end, join;
};

}  // namespace

int main() {
  const int ndev = diagGpuCount("anyr_host_link_bw");
  if (ndev == 0) return 0;
  const int nd = ndev < 2 ? ndev : 2;
  const size_t maxBytes = 16u << 20;
  void* host[2];
  DIAG_CHECK(cudaHostAlloc(&host[0], 2 * maxBytes, cudaHostAllocPortable | cudaHostAllocMapped));
  DIAG_CHECK(cudaHostAlloc(&host[1], 2 * maxBytes, cudaHostAllocPortable | cudaHostAllocMapped));
  Gpu g[2];
  for (int d = 0; d < nd; ++d) {
    DIAG_CHECK(cudaSetDevice(d));
    for (int k = 0; k < 2; ++k) {
      DIAG_CHECK(cudaMalloc(&g[d].dev[k], maxBytes));
      DIAG_CHECK(cudaMemset(g[d].dev[k], 1, maxBytes));
      DIAG_CHECK(cudaStreamCreateWithFlags(&g[d].s[k], cudaStreamNonBlocking));
    }
    DIAG_CHECK(cudaEventCreate(&g[d].start));
    DIAG_CHECK(cudaEventCreate(&g[d].end));
    DIAG_CHECK(cudaEventCreateWithFlags(&g[d].join, cudaEventDisableTiming));
  }
  // Best of five; each run's time is the slowest GPU's. body(d) enqueues on g[d].s[0] (and
  // may use s[1] after waiting for `start`).
  auto timeUs = [&](int gpus, auto&& body) -> double {
    float best = 1e30f;
    for (int rep = 0; rep < 5; ++rep) {
      for (int d = 0; d < gpus; ++d) {
        cudaSetDevice(d);
        cudaEventRecord(g[d].start, g[d].s[0]);
      }
      for (int d = 0; d < gpus; ++d) {
        cudaSetDevice(d);
        body(d);
      }
      float worst = 0;
      for (int d = 0; d < gpus; ++d) {
        cudaSetDevice(d);
        cudaEventRecord(g[d].join, g[d].s[1]);
        cudaStreamWaitEvent(g[d].s[0], g[d].join, 0);
        cudaEventRecord(g[d].end, g[d].s[0]);
        cudaEventSynchronize(g[d].end);
        float ms = 0;
        cudaEventElapsedTime(&ms, g[d].start, g[d].end);
        worst = ms > worst ? ms : worst;
      }
      best = worst < best ? worst : best;
    }
    return best * 1000.0;
  };
  auto gbps = [](size_t bytes, double us) { return static_cast<double>(bytes) / us / 1e3; };
  std::printf("copy engines (pinned host buffers; 'both' = D2H and H2D at once on each GPU)\n");
  for (size_t bytes : {size_t{1} << 20, size_t{4} << 20, size_t{16} << 20}) {
    for (int gpus = 1; gpus <= nd; ++gpus) {
      const double d2h = timeUs(gpus, [&](int d) {
        cudaMemcpyAsync(host[d], g[d].dev[0], bytes, cudaMemcpyDeviceToHost, g[d].s[0]);
      });
      const double h2d = timeUs(gpus, [&](int d) {
        cudaMemcpyAsync(g[d].dev[1], host[nd - 1 - d], bytes, cudaMemcpyHostToDevice, g[d].s[0]);
      });
      const double both = timeUs(gpus, [&](int d) {
        cudaStreamWaitEvent(g[d].s[1], g[d].start, 0);
        cudaMemcpyAsync(host[d], g[d].dev[0], bytes, cudaMemcpyDeviceToHost, g[d].s[0]);
        cudaMemcpyAsync(g[d].dev[1], static_cast<char*>(host[nd - 1 - d]) + maxBytes, bytes,
                        cudaMemcpyHostToDevice, g[d].s[1]);
      });
      std::printf(
          "  %5zu KiB, %d GPU(s): D2H %7.1f us %5.1f GB/s | H2D %7.1f us %5.1f GB/s | "
          "both %7.1f us\n",
          bytes >> 10, gpus, d2h, gbps(bytes, d2h), h2d, gbps(bytes, h2d), both);
    }
  }
  std::printf("SM stores to / loads from mapped pinned memory, 512-thread blocks\n");
  for (size_t bytes : {size_t{1} << 20, size_t{4} << 20, size_t{16} << 20}) {
    const size_t n = bytes / 16;
    for (int blocks : {16, 32, 66, 132}) {
      for (int gpus = 1; gpus <= nd; ++gpus) {
        const double w = timeUs(gpus, [&](int d) {
          storeToHost<<<blocks, 512, 0, g[d].s[0]>>>(static_cast<uint4*>(host[d]),
                                                     static_cast<const uint4*>(g[d].dev[0]), n);
        });
        const double r = timeUs(gpus, [&](int d) {
          loadFromHost<<<blocks, 512, 0, g[d].s[0]>>>(
              static_cast<uint4*>(g[d].dev[1]), static_cast<const uint4*>(host[nd - 1 - d]), n);
        });
        std::printf(
            "  %5zu KiB, %3d blocks, %d GPU(s): store %7.1f us %5.1f GB/s | load %7.1f "
            "us %5.1f GB/s\n",
            bytes >> 10, blocks, gpus, w, gbps(bytes, w), r, gbps(bytes, r));
      }
    }
  }
  DIAG_CHECK(cudaGetLastError());
  if (nd == 2) {
    auto* flags = static_cast<volatile uint32_t*>(host[0]);
    flags[0] = 0;
    flags[32] = 0;
    unsigned long long* ns[2];
    const int iters = 2000;
    for (int d = 0; d < 2; ++d) {
      DIAG_CHECK(cudaSetDevice(d));
      DIAG_CHECK(cudaMalloc(&ns[d], sizeof(unsigned long long)));
      pingPong<<<1, 1, 0, g[d].s[0]>>>(flags + 32 * d, flags + 32 * (1 - d), iters, d == 0, ns[d]);
    }
    for (int d = 0; d < 2; ++d) {
      DIAG_CHECK(cudaSetDevice(d));
      DIAG_CHECK(cudaStreamSynchronize(g[d].s[0]));
    }
    unsigned long long total = 0;
    DIAG_CHECK(cudaSetDevice(0));
    DIAG_CHECK(cudaMemcpy(&total, ns[0], sizeof(total), cudaMemcpyDeviceToHost));
    if (total == 0) {
      std::printf("flag ping-pong through host memory: the peer did not answer within 2 s\n");
      return 1;
    }
    std::printf("flag ping-pong through host memory: %.2f us per round trip (%d round trips)\n",
                static_cast<double>(total) / 1e3 / iters, iters);
  }
  return 0;
}
