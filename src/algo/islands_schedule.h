// The islands kernel's schedule (algo/islands.cu): which rank owns a vector of the launch, where
// it lands in the owner's slots, which vectors a rank owns, and how far into a slot a launch
// writes. Host and device alike, so that the CPU tests walk the kernel's schedule with the
// kernel's own arithmetic (tests/cpu/test_islands.cc).
//
// A launch of V vectors is cut into S = map.slices slices of L = ceil(V / S) vectors (slice j:
// vectors jL .. jL + L - 1, the last ones past V absent). In an island of m ranks, member k owns
// slices k, k + m, k + 2m, ...; its q-th owned slice's vector i sits at place qL + i of its
// slots. Launches carry at most islandLaunchBytes (topology/islands.h), so every count fits 32
// bits and every place fits a slot.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "device/handles.h"

namespace anyr {
namespace islands {

// Vectors a slice of a launch of V vectors.
__host__ __device__ inline uint32_t sliceVecs(const IslandMap& map, uint32_t V) {
  return (V + map.slices - 1) / map.slices;
}

// The owner of vector i of slice j in island `island`, and that vector's place in the owner's
// slots.
struct Owner {
  int rank;
  uint32_t at;
};
__host__ __device__ inline Owner ownerOf(const IslandMap& map, int island, uint32_t j, uint32_t i,
                                         uint32_t L) {
  const uint32_t m = map.size[island];
  const uint32_t q = j / m;
  return Owner{map.member[island][j - q * m], q * L + i};
}

// The places a rank's slots take: the vectors of the slices it owns (slices / m of them).
__host__ __device__ inline uint32_t ownedVecs(const IslandMap& map, int rank, uint32_t L) {
  return map.slices / map.size[map.islandOf[rank]] * L;
}

// The vector of the launch at place t of `rank`'s slots (t < ownedVecs): v = jL + i, slice j
// into *slice; v >= V where the place lies past the end of the launch.
__host__ __device__ inline uint32_t ownedVector(const IslandMap& map, int rank, uint32_t t,
                                                uint32_t L, uint32_t* slice) {
  const uint32_t m = map.size[map.islandOf[rank]];
  const uint32_t q = t / L, i = t - q * L;
  *slice = map.indexOf[rank] + q * m;
  return *slice * L + i;
}

// The most places any slot of any rank takes in a launch: the owner of the most slices (a
// member of the smallest island). What the launch records for the next one to clear (tsVecs).
__host__ __device__ inline uint32_t slotExtent(const IslandMap& map, uint32_t L) {
  return map.slices / map.minSize * L;
}

}  // namespace islands
}  // namespace anyr
