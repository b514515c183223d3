// Plain structs of the host-memory transport, shared by the control plane (host_transport.cc) and
// the host algorithms (host_oneshot.cu, host_twoshot.cu, host_copy.cu). One POSIX shared-memory
// segment, mapped by every rank's process and registered with CUDA as mapped pinned memory, holds
// one region per rank. A rank writes only its own region (its contribution, its reduced segment,
// its flags) and reads its peers'; so every word has one writer.
#pragma once

#include <cstddef>
#include <cstdint>

#include "device/handles.h"

namespace anyr {

// Flags a rank raises in its own region, one 32-bit word each. Both host algorithms share the
// data buffers and their epoch (LocalState::syncEpoch of the transport's own state, whose
// parity picks the buffer), so consecutive calls alternate buffers whichever algorithm runs;
// each algorithm has its own flag words, so one's values are never mistaken for the other's.
struct HostFlags {
  uint32_t data[kMaxBlocks];      // two-shot: block's use count (LocalState::flagUse) whose
                                  // scatter was complete
  uint32_t result[kMaxBlocks];    // two-shot: block's use count whose segment was reduced
  uint32_t rounds[kMaxBlocks];    // one-shot: rounds of contribution published so far, per block
  uint32_t copy[kMaxCopyChunks];  // host-copy: uses of chunk c (LocalState::copyUse) in place
  uint32_t copyReady;  // host-copy: number of the launch this rank started (its previous is done)
  uint32_t copyPad[3];
};
static_assert(sizeof(HostFlags) == 3 * kMaxBlocks * 4 + kMaxCopyChunks * 4 + 16,
              "HostFlags layout");

// Offsets inside one rank's region (identical for every rank: computed from the agreed
// configuration). Rank r's region starts at r * rankBytes.
struct HostLayout {
  uint64_t headerOffset;  // WorkspaceHeader: peers write abortedBy here
  uint64_t flagsOffset;   // HostFlags
  uint64_t dataOffset;    // 2 buffers (epoch parity) x dataBytes: this rank's contribution
  uint64_t dataBytes;
  uint64_t resultOffset;  // 2 buffers x resultBytes: this rank's reduced segment (two-shot)
  uint64_t resultBytes;
  uint64_t launchBytes;  // most bytes of input one launch carries (larger messages are chunked)
  uint64_t rankBytes;    // size of one rank's region
  uint64_t totalBytes;   // nranks x rankBytes
  uint64_t llOffset;  // 2 buffers (hostLLBuffer) x llBytes: low-latency lines (host_oneshot_ll.cu)
  uint64_t llBytes;   // 2 x llMaxBytes rounded up to a page: 16-byte lines with 8-byte payloads
  uint64_t llMaxBytes;  // largest launch the low-latency protocol carries (0: never used)
  // host-copy (host_copy.cu): a launch moves through the copy engines in chunks of at most this
  // many bytes (a multiple of 64 KiB; hostCopyLaunchChunkBytes); chunk c of a launch sits at c x
  // its chunk size in the own copy buffer (one, not two: its reuse is guarded by a barrier, see
  // host_copy.cu), which holds every chunk of a launch whole.
  uint64_t copyChunkBytes;
  uint64_t copyOffset;
  uint64_t copyBytes;
};
static_assert(sizeof(HostLayout) == 120, "HostLayout layout");

// Wire formats (values of anyrWire_t).
constexpr int kWireNative = 0;
constexpr int kWireFp8 = 1;
constexpr int kWireInt8 = 2;
// Compressed wire: one power-of-two fp32 scale per group of this many 16-byte input vectors
// (128 elements of a 16-bit type, 64 of fp32). Payload of vector v at v * (elements per vector)
// bytes from the buffer start; scale of group g at dataBytes / 2 + 4 g (resultBytes / 2 + 4 g).
constexpr int kWireGroupVecs = 16;
// Block ranges are whole multiples of this many vectors, so no wire group straddles blocks.
constexpr int kHostBlockQuantum = 32;

// The host one-shot's low-latency protocol (host_oneshot_ll.cu): launch tag, buffer and sweep.
// Its launch number k (LocalState::llUse + 1, modulo 2^32, equal on every rank) is the tag
// every line of the launch carries (a reader takes a line only when it carries the tag) and
// picks the buffer, k % 2. A launch whose tag hostLLSweeps also writes every line of its
// buffer past its own lines, zero payload, with hostLLSweepTag (an older tag of the buffer, so
// that only the launch's own data carries its tag, even for a peer that reads past them).
// Each buffer is swept at least every kHostLLSweepPeriod + 1 launches, so when launch k starts,
// every line of its buffer carries the tag of a launch 1 to kHostLLSweepPeriod + 2 launches
// before it, never k itself modulo 2^32: no launch can take a stale line, however long a line
// went unwritten. (A count shared with other kernels, or no sweep, let a line left 2^32
// launches earlier match again.) The segment starts zeroed with the count at 0; whatever sets
// the count elsewhere (a self-test reset, a test's start value) sets every line's tag to it.
constexpr uint32_t kHostLLSweepPeriod = 1u << 30;
constexpr uint32_t hostLLBuffer(uint32_t tag) { return tag & 1u; }
constexpr bool hostLLSweeps(uint32_t tag) { return (tag & (kHostLLSweepPeriod - 1u)) < 2u; }
constexpr uint32_t hostLLSweepTag(uint32_t tag) { return tag - 2u; }

// Arguments of the host-memory kernels: raw pointers and sizes only.
struct HostArgs {
  const void* input;
  void* output;
  uint64_t count;    // elements in this launch
  uint64_t numVecs;  // 16-byte vectors covering `count` elements
  char* base;        // device pointer of the shared segment (rank 0's region first)
  HostLayout layout;
  const WaitControl* wait;  // device memory; its peer headers are the host regions' headers
  LocalState* state;        // this transport's own: syncEpoch, pushEpoch (one-shot rounds)
  int32_t rank;
  int32_t nranks;
  int32_t wire;          // kWire*
  int32_t roundVecs;     // host one-shot: vectors per thread per pipelined round (ANYR_HOST_ROUND)
  int32_t llEager;       // low-latency protocol: 1 = every thread polls its own lines (a small
                         // launch, ANYR_HOST_LL_EAGER_BYTES); 0 = one line a warp first
  int32_t releaseEarly;  // as AllReduceArgs::releaseEarly (ANYR_PDL_EARLY)
};

// Arguments of the host-copy kernels (host_copy.cu) for one launch: the host algorithms' own
// plus the device staging buffers. Chunk c covers input vectors [c x chunkVecs, ...).
struct HostCopyArgs {
  HostArgs h;
  char* hostBase;      // this process's mapping of the segment (copy-engine source / destination)
  char* sendStage;     // device, layout.copyBytes: the own compressed chunks (compressed wire)
  char* recvStage;     // device, (nranks - 1) x layout.copyBytes: peer s's chunks at slot s' x
                       // copyBytes, s' = s for s < rank, s - 1 above (chunk c at c x chunkBytes)
  uint64_t chunkVecs;  // 16-byte vectors per chunk (hostCopyLaunchChunkBytes / 16); chunk c
                       // at c x chunkVecs x 16 bytes in the copy buffer and the staging
  uint32_t chunks;     // chunks in this launch (1..kMaxCopyChunks)
  uint32_t pad;
};

// Chunk size of one host-copy launch of `launchBytes` input bytes: the configured chunk, or, for
// launches of less than four of those, a quarter of the launch (whole 64 KiB units, at least
// kHostCopyMinChunkBytes), so that a small launch still overlaps its two directions. Depends on
// agreed values only: every rank cuts a launch the same way.
constexpr uint64_t kHostCopyMinChunkBytes = 256u << 10;
// The default of ANYR_HOST_COPY_CHUNK_BYTES (base/env.cc registers it as "2M"): what the seed
// model assumes where the transport has not set the agreed value.
constexpr uint64_t kHostCopyDefaultChunkBytes = 2u << 20;
constexpr uint64_t hostCopyLaunchChunkBytes(uint64_t launchBytes, uint64_t copyChunkBytes) {
  const uint64_t unit = 64u << 10;
  const uint64_t quarter = (launchBytes / 4 + unit - 1) / unit * unit;
  const uint64_t floor =
      copyChunkBytes < kHostCopyMinChunkBytes ? copyChunkBytes : kHostCopyMinChunkBytes;
  const uint64_t c = quarter > floor ? quarter : floor;
  return c < copyChunkBytes ? c : copyChunkBytes;
}

// Vectors of chunk c of a launch of numVecs vectors (the last chunk may be short). These helpers
// are constexpr so that kernels call them too (--expt-relaxed-constexpr).
constexpr uint64_t hostCopyChunkVecs(uint64_t chunkVecs, uint64_t numVecs, uint64_t c) {
  const uint64_t lo = c * chunkVecs;
  return numVecs - lo < chunkVecs ? numVecs - lo : chunkVecs;
}

// A chunk on a compressed wire (host_copy.cu): its vectors padded to whole block quanta (so no
// wire group straddles chunks), the payload of those at one byte per element, then one fp32
// scale per kWireGroupVecs vectors, contiguous so one copy moves it. Never more bytes than the
// chunk's native slot (chunkVecs is a multiple of kHostBlockQuantum).
constexpr uint64_t hostCopyPaddedVecs(uint64_t vecs) {
  return (vecs + kHostBlockQuantum - 1) / kHostBlockQuantum * kHostBlockQuantum;
}
constexpr uint64_t hostCopyWireBytes(uint64_t vecs, uint64_t elemsPerVec) {
  const uint64_t padded = hostCopyPaddedVecs(vecs);
  return padded * elemsPerVec + padded / kWireGroupVecs * 4;
}

// Most input bytes one launch of a host algorithm carries (ANYR_HOST_LAUNCH_BYTES; base/env.cc
// registers the default as "16M"): a larger message runs as several launches, each paying its
// fixed costs again (host-copy about 32 us: the launch barrier, the fork and join, the pipeline's
// fill), so launches are large; the seed model assumes this where the transport has not set the
// agreed value. Every buffer of the transport is sized from it (computeHostLayout,
// Communicator::initHostCopy); at 16 MiB and the default 2 MiB copy chunk, per rank:
//   pinned host region (rankBytes): 2 x 16 MiB contributions + 2 x (16 MiB / n + 64 KiB) reduced
//     segments + 2 x 64 KiB low-latency lines + 18 MiB copy buffer + 12 KiB header and flags:
//     66.26 MiB at n = 2 (segment 132.5 MiB), 54.26 MiB at n = 8 (segment 434.1 MiB), which
//     every process maps whole;
//   device staging (host-copy): n x 18 MiB (send + (n - 1) receive slots of copyBytes): 36 MiB at
//     n = 2, 144 MiB at n = 8; 8 events each for copied / arrived / recv.
//     (tests/cpu/test_host_memory.cc checks these.)
constexpr uint64_t kHostDefaultLaunchBytes = 16u << 20;

}  // namespace anyr
