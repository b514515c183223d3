// What the device algorithms' host-side entry points share: their launch shape and the
// host-copy algorithm's streams. One .cu file per algorithm; each launcher takes the plain
// AllReduceArgs (or HostArgs) struct and a launch shape and returns the launch's cudaError_t.
// The launchers are declared and reached through the registry (algo/registry.h, registry.cc).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "algo/ring_plan.h"
#include "anyreduce/anyreduce.h"
#include "device/handles.h"
#include "device/host_handles.h"

namespace anyr {

constexpr int kAlgoThreads = 512;

// Bytes of one element of a call's type (fp32 4, the 16-bit types 2), for the launchers' copies.
inline size_t elemBytes(anyrDataType_t dtype) { return dtype == anyrFloat32 ? 4 : 2; }
// Blocks of kAlgoThreads threads per SM the peer all-reduce kernels (one-shot push and pull,
// two-shot and two-shot push) are built for (__launch_bounds__: at most 64 registers a thread)
// and launched with where every variant's occupancy allows it on every rank
// (Communicator::peerBlocks_) for large messages (peerLaunchShape). Two measured 5-7% faster
// than one from 16 MB up on 2 x H200 (two-shot push 16 MB 54.2 against 57.2 us, 256 MB 860
// against 924; docs/PERFORMANCE.md, "Peer launches").
constexpr int kPeerBlocksPerSm = 2;

struct LaunchShape {
  int blocks = 1;
  int threads = kAlgoThreads;  // <= kAlgoThreads, a multiple of 32
  bool aligned = false;        // input and output are 16-byte aligned
  bool pdl = false;            // programmatic dependent launch (device/launch.cuh)
};

// `work` vectors spread over as many blocks as possible (at most blocksCap) before blocks grow:
// minThreads..kAlgoThreads threads, a multiple of 32. Small messages then inject from many SMs.
inline LaunchShape spreadShape(uint64_t work, uint64_t blocksCap, uint64_t minThreads = 128) {
  uint64_t threads = (work + blocksCap - 1) / blocksCap;
  threads =
      std::min<uint64_t>(kAlgoThreads, std::max<uint64_t>(minThreads, (threads + 31) / 32 * 32));
  LaunchShape shape;
  shape.threads = static_cast<int>(threads);
  shape.blocks = static_cast<int>(
      std::max<uint64_t>(1, std::min<uint64_t>((work + threads - 1) / threads, blocksCap)));
  return shape;
}

// The peer all-reduce kernels' launches: spreadShape over at most one block per SM (perSmCap)
// first; over the wider peerCap (a second block per SM, Communicator::peerBlocks_) only once
// every thread of that grid still has two vectors. On 2 x H200 the second block gained 5-7%
// from 16 MB up, about 1% at 4 MB, and cost the flag-based pull algorithms 12-19% at 1 MB, where
// it halved the threads a block (docs/PERFORMANCE.md, "Peer launches").
inline LaunchShape peerLaunchShape(uint64_t work, uint64_t perSmCap, uint64_t peerCap) {
  if (peerCap > perSmCap && work >= 2 * peerCap * kAlgoThreads) return spreadShape(work, peerCap);
  return spreadShape(work, std::min(perSmCap, peerCap));
}

// The host one-shot's low-latency launches: one vector a thread, in blocks of 32 threads or
// more over as many SMs as possible (at most 64 blocks and blocksCap), threads growing only
// past that. A block's polls and reads of host memory go out from its own SM; spread over many
// SMs they land sooner (measured on 2 x H200, anyr_host_phases: 16 KiB in 32 blocks of 32
// threads 6.8 us, in 8 of 128 7.9 us; 64 KiB in 64 blocks of 64 threads 11.5 us, in 16 of 256
// 19.1 us).
inline LaunchShape hostLowLatencyShape(uint64_t numVecs, uint64_t blocksCap) {
  return spreadShape(numVecs, std::max<uint64_t>(1, std::min<uint64_t>(64, blocksCap)), 32);
}

// host_copy.cu: the copy-engine host algorithm. Its side streams and per-chunk events (owned by
// the communicator); every call forks from and joins back into the caller's stream.
struct HostCopyStreams {
  cudaStream_t d2h;   // the own chunks out to host memory, back to back
  cudaStream_t sig;   // a flag per chunk once it is out
  cudaStream_t poll;  // waits for the peers' flags, ahead of the copies in
  cudaStream_t h2d;   // the peers' chunks in to device staging, back to back
  cudaEvent_t fork;
  cudaEvent_t signaled;  // the launch's last flag raised (recorded on sig)
  cudaEvent_t* copied;   // [chunk]: the own chunk is in host memory (recorded on d2h)
  cudaEvent_t* arrived;  // [chunk]: every peer raised its flag (recorded on poll)
  cudaEvent_t* recv;     // [chunk]: every peer's chunk is in device staging (recorded on h2d)
  cudaEvent_t* packed;   // [chunk]: compressed wire: the own chunk quantized (caller's stream)
  uint32_t events;       // entries of copied, arrived, recv and packed
};

// ring_copy.cu: the copy-engine ring's streams and events (owned by the peer workspace); every
// call forks from the caller's stream and joins back into it.
struct RingCopyStreams {
  cudaStream_t fold[kRingCopyStreams];    // per pipeline: waits, pulls of partials, folds
  cudaStream_t result[kRingCopyStreams];  // per pipeline: waits, pulls of results
  cudaEvent_t fork;
  cudaEvent_t joined[2 * kRingCopyStreams];  // each side stream's end (fold, then result)
};

}  // namespace anyr
