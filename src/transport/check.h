// Transport self-check: real transfers over every mapped pair, run at communicator init, so
// that peer access the driver reports but that does not work (IOMMU, risers, one broken
// direction, missing atomics) is found before any all-reduce uses it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "device/handles.h"

namespace anyr {

constexpr int kCheckWords = 1024;
constexpr int kAtomicThreads = 256;
constexpr int kAtomicAddsPerThread = 8;

// Words per rank of the fabric measurement's flags (transport/fabric_kernels.h): one 128-byte
// line per source rank.
constexpr int kFabricWords = 32;

// Layout of the check area inside every workspace.
struct CheckArea {
  uint32_t written[kMaxLocalRanks][kCheckWords];  // [writer rank][i], written by peers
  uint32_t published[kCheckWords];                // written by the owner, read by peers
  uint32_t atomics[kMaxLocalRanks];               // [adder rank], atomically incremented
  uint32_t pad[32 - kMaxLocalRanks];
  // The fabric measurement's flags (after the transfer checks): [source rank][word], written
  // by that rank, zeroed by the owner before each measurement.
  uint32_t fabric[kMaxLocalRanks][kFabricWords];
};
static_assert(sizeof(CheckArea) ==
                  (kMaxLocalRanks + 1) * kCheckWords * 4 + 128 + kMaxLocalRanks * kFabricWords * 4,
              "CheckArea");

// The pattern rank `from` writes for rank `to`; `to` == -1: the owner's published words.
__host__ __device__ inline uint32_t checkPattern(int from, int to, int i, uint32_t salt) {
  uint32_t x = salt ^ (static_cast<uint32_t>(from + 1) * 0x9E3779B1u) ^
               (static_cast<uint32_t>(to + 2) * 0x85EBCA77u) ^
               (static_cast<uint32_t>(i) * 0xC2B2AE3Du);
  x ^= x >> 15;
  x *= 0x2C1B3C6Du;
  x ^= x >> 12;
  return x;
}

// Launchers (stream-ordered; the caller synchronizes with a deadline).
cudaError_t launchFillWords(uint32_t* dst, uint64_t words, uint32_t value, cudaStream_t s);
cudaError_t launchCheckPublish(CheckArea* own, int me, uint32_t salt, cudaStream_t s);
cudaError_t launchCheckWrite(CheckArea* peer, int me, int peerRank, uint32_t salt, cudaStream_t s);
cudaError_t launchCheckAtomics(CheckArea* peer, int me, cudaStream_t s);
// Counts words of peer's published area that differ from the pattern into *mismatches.
cudaError_t launchCheckRead(const CheckArea* peer, int peerRank, uint32_t salt,
                            uint32_t* mismatches, cudaStream_t s);
// Counts words written by `from` into own area that differ from the pattern.
cudaError_t launchCheckVerify(const CheckArea* own, int from, int me, uint32_t salt,
                              uint32_t* mismatches, cudaStream_t s);

}  // namespace anyr
