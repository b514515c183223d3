// Plain structs of the host-memory transport, shared by the control plane (comm_host.cc) and
// the host algorithms (host_oneshot.cu, host_twoshot.cu). One POSIX shared-memory segment,
// mapped by every rank's process and registered with CUDA as mapped pinned memory, holds one
// region per rank. A rank writes only its own region (its contribution, its reduced segment,
// its flags) and reads its peers'; so every word has one writer.
#pragma once

#include <cstddef>
#include <cstdint>

#include "transport/device_handles.h"

namespace anyr {

// Flags a rank raises in its own region, one 32-bit word each. Both host algorithms share the
// data buffers and their epoch (LocalState::syncEpoch of the transport's own state, whose
// parity picks the buffer), so consecutive calls alternate buffers whichever algorithm runs;
// each algorithm has its own flag words, so one's values are never mistaken for the other's.
struct HostFlags {
  uint32_t data[kMaxBlocks];    // two-shot: epoch of the last launch whose scatter was complete
  uint32_t result[kMaxBlocks];  // two-shot: epoch of the last launch whose segment was reduced
  uint32_t rounds[kMaxBlocks];  // one-shot: rounds of contribution published so far, per block
};
static_assert(sizeof(HostFlags) == 3 * kMaxBlocks * 4, "HostFlags layout");

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
  uint64_t llOffset;  // 2 buffers (epoch parity) x llBytes: low-latency lines (host_oneshot_ll.cu)
  uint64_t llBytes;   // 2 x llMaxBytes rounded up to a page: 16-byte lines with 8-byte payloads
  uint64_t llMaxBytes;  // largest launch the low-latency protocol carries (0: never used)
};
static_assert(sizeof(HostLayout) == 96, "HostLayout layout");

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
  int32_t wire;       // kWire*
  int32_t roundVecs;  // host one-shot: vectors per thread per pipelined round (ANYR_HOST_ROUND)
};

HostLayout computeHostLayout(uint64_t chunkBytes, int nranks, uint64_t llMaxBytes);

}  // namespace anyr
