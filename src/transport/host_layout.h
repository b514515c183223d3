// The host-memory transport's layout and settings: the segment layout every rank computes from
// the agreed settings, the rules of the settings, and their agreement (rank 0's values for every
// rank). The plain structs the kernels read are in device/host_handles.h.
#pragma once

#include <cstdint>
#include <string>

#include "device/host_handles.h"

namespace anyr {

class Bootstrap;

// The segment's layout for launches of at most `launchBytes` input bytes (the agreed
// ANYR_HOST_LAUNCH_BYTES, not ANYR_CHUNK_BYTES, which sizes the peer algorithms' staging).
HostLayout computeHostLayout(uint64_t launchBytes, int nranks, uint64_t llMaxBytes,
                             uint64_t copyChunkBytes);

// "" when `bytes` is a valid ANYR_HOST_COPY_CHUNK_BYTES, else the rule it broke.
std::string hostCopyChunkError(uint64_t bytes);

// "" when `bytes` is a valid ANYR_HOST_LAUNCH_BYTES, else the rule it broke (the granularity of
// ANYR_CHUNK_BYTES: whole pages, so the layout's areas stay page-aligned).
std::string hostLaunchBytesError(uint64_t bytes);

// The host transport's settings from the environment, rank 0's for every rank.
struct HostSettings {
  bool enabled = false;         // ANYR_HOST_MEMORY != 0
  bool numa = false;            // ANYR_HOST_NUMA != 0: place the regions on their GPUs' nodes
  int32_t roundVecs = 0;        // ANYR_HOST_ROUND: 1..64
  uint64_t llBytes = 0;         // ANYR_HOST_LL_BYTES: a multiple of 16 in 0..1 MiB
  uint64_t llEagerBytes = 0;    // ANYR_HOST_LL_EAGER_BYTES: a multiple of 16 in 0..1 MiB
  uint64_t copyChunkBytes = 0;  // ANYR_HOST_COPY_CHUNK_BYTES (hostCopyChunkError)
  uint64_t launchBytes = 0;     // ANYR_HOST_LAUNCH_BYTES (hostLaunchBytesError)
};

// Rank 0's values of every variable above, in one bootstrap broadcast, validated after it on
// every rank (anyrInvalidArgument naming the variable, rank 0's value and the rule: the same
// error on every rank), whether or not ANYR_HOST_MEMORY enables the transport. A rank whose own
// ANYR_HOST_LAUNCH_BYTES differs is told in a warning. Collective over `bs`.
HostSettings agreeHostSettings(Bootstrap& bs, int rank);

}  // namespace anyr
