// Plain structs shared between the host control plane and the kernels, and the layout of the
// per-rank workspace that peers map. Everything here is POD with static_asserted sizes: the
// workspace is read and written by other processes, so its layout must not drift.
#pragma once

#include <cstddef>
#include <cstdint>

namespace anyr {

constexpr int kMaxLocalRanks = 8;                 // ranks one communicator maps peer to peer
constexpr int kMaxBlocks = 256;                   // thread blocks per kernel (flags are per block)
constexpr uint32_t kPushClearWord = 0x80008000u;  // see oneshot_push.cu: dtype-independent
// Most copy-engine chunks one host-copy launch is cut into (computeHostLayout raises the chunk
// size so that a launch never needs more): one flag word each (host_handles.h's HostFlags).
constexpr int kMaxCopyChunks = 1024;

// The ring's pipelines (algo/ring.cu): at most this many streams of chunks, each one fold and
// one result block of the ring kernel.
constexpr int kRingMaxStreams = 8;
// The ring's flags in a rank's workspace, per stream, each a count of chunks (modulo 2^32) that
// only grows; each array on its own 128-byte line, since each has one writer: data ready from
// the rank before it (foldReady) or from its result source (resultReady), and room freed at the
// rank after it (foldFree) or at its result destination on either arm (resultFree).
struct RingFlags {
  uint32_t foldReady[32];
  uint32_t foldFree[32];
  uint32_t resultReady[32];
  uint32_t resultFree[2][32];
};
static_assert(sizeof(RingFlags) == 5 * 128 && kRingMaxStreams <= 32, "RingFlags layout");

// Flags a peer writes into this rank's workspace. Each flag is its own 32-bit word, so no two
// flags share a word; start and end barriers use separate arrays.
struct FlagArea {
  uint32_t start[kMaxBlocks][kMaxLocalRanks];  // [block][source rank] = epoch signalled
  uint32_t end[kMaxBlocks][kMaxLocalRanks];
  RingFlags ring;
};
static_assert(sizeof(FlagArea) == 2 * kMaxBlocks * kMaxLocalRanks * 4 + sizeof(RingFlags),
              "FlagArea layout");

// First bytes of every workspace: identifies the region and its layout (written at init), and
// holds the word through which peers tell this rank to stop. Peers do not yet verify the
// identifying fields after mapping; the init-time transfer checks are what catch a mapping
// that does not work.
struct WorkspaceHeader {
  uint32_t magic;  // kWorkspaceMagic
  uint32_t layoutVersion;
  int32_t rank;
  int32_t nranks;
  uint64_t layoutHash;  // hash of the offsets below; equal on every rank
  int32_t abortedBy;    // 0, or 1 + the rank that failed and told this rank to stop
  int32_t abortCause;   // 0, 1 + the rank that rank timed out waiting for, or a kCause* (first)
  // Written by a rank that stops this one from the host (a refused call, an abort), before
  // abortCause: that rank's call number and what it refused (NUL-terminated, truncated).
  uint32_t stopCall;
  char stopWhat[28];
};
static_assert(sizeof(WorkspaceHeader) == 64, "WorkspaceHeader layout");
constexpr uint32_t kWorkspaceMagic = 0x414e5957u;  // "ANYW"
// WorkspaceHeader::abortCause values other than a rank: why a peer stopped this rank from its
// host rather than from a failed wait.
constexpr int32_t kCauseRefused = -1;  // it refused a call its peers may have made
constexpr int32_t kCauseAborted = -2;  // anyrCommAbort on it
constexpr uint32_t kWorkspaceLayoutVersion = 1;

// Offsets inside one rank's workspace. Computed from the agreed configuration, therefore
// identical on every rank.
struct WorkspaceLayout {
  uint64_t headerOffset;
  uint64_t flagsOffset;
  uint64_t checkOffset;  // transport self-check area
  uint64_t checkBytes;
  uint64_t pushOffset;  // one-shot push: 3 phases x nranks slots x pushSlotBytes
  uint64_t pushSlotBytes;
  uint64_t stagingOffset;  // pull / two-shot: 2 buffers x chunkBytes
  uint64_t resultOffset;   // two-shot reduced segments: 2 buffers x chunkBytes
  uint64_t chunkBytes;
  uint64_t tsOffset;        // two-shot push: 3 phases x {scatter, gather} x nranks slots
  uint64_t tsSlotBytes;     //   x tsSlotBytes (one segment of a chunkBytes message)
  uint64_t ringOffset;      // ring: its fold and result inboxes (algo/ring_plan.h, kRingAreaBytes)
  uint64_t ringCopyOffset;  // ring-copy: its slots and inboxes (algo/ring_plan.h)
  uint64_t totalBytes;
  uint64_t hash() const;
};
static_assert(sizeof(WorkspaceLayout) == 112, "WorkspaceLayout layout");

// Why a device wait gave up; written to host-visible memory by the first thread that fails.
enum WaitWhat : int32_t {
  kWaitNone = 0,
  kWaitPushData = 1,     // one-shot push: a peer's data in this rank's buffer
  kWaitStartFlag = 2,    // pull / two-shot: a peer's "my data is staged" flag
  kWaitEndFlag = 3,      // two-shot: a peer's "my reduced segment is ready" flag
  kWaitHostData = 4,     // host memory: a peer's "my contribution is in host memory" flag
  kWaitHostResult = 5,   // host two-shot: a peer's "my reduced segment is in host memory" flag
  kWaitHostReady = 6,    // host-copy: a peer's "I finished the previous launch" flag
  kWaitClusterRow = 7,   // fused cluster form: the row sums of the other blocks of a cluster
  kWaitRingData = 8,     // ring: a neighbour's chunk (partial sums or results) in this rank's inbox
  kWaitRingRoom = 9,     // ring: a neighbour freeing a slot of its inbox for this rank's next chunk
  kWaitLaterRound = 10,  // data its sender sends only after waits of its own: the staged and
                         // doubling push's later rounds, what islands relay, the two-shot push's
                         // reduced segments (all-gather)
};
// Whether a wait of kind `what` waits for a party that sends only after waits of its own, so that
// it gives up kSecondHandGraceNs after the deadline (device/common.cuh): the party's own wait, or
// the wait that takes the missing rank's data first hand, gives up first and names the root
// cause. The other blocks of the own cluster; a later round's data; a pull round's end flag (a
// peer raises it once its start round, which waits for every rank, has passed); a host-memory
// two-shot owner's result flag (raised once it has read every rank's data).
constexpr bool waitIsSecondHand(int32_t what) {
  return what == kWaitClusterRow || what == kWaitLaterRound || what == kWaitEndFlag ||
         what == kWaitHostResult;
}
// Words for a WaitWhat in error messages and the self-test's reasons.
inline const char* waitWhatName(int32_t w) {
  switch (w) {
    case kWaitPushData:
      return "one-shot push data";
    case kWaitStartFlag:
      return "start flag";
    case kWaitEndFlag:
      return "end flag";
    case kWaitHostData:
      return "host-memory data flag";
    case kWaitHostResult:
      return "host-memory result flag";
    case kWaitHostReady:
      return "host-memory ready flag (host-copy launch barrier)";
    case kWaitClusterRow:
      return "row sums of its own thread-block cluster";
    case kWaitRingData:
      return "ring chunk (the call number counts the stream's chunks)";
    case kWaitRingRoom:
      return "ring inbox slot freed (the call number counts the stream's chunks)";
    case kWaitLaterRound:
      return "push data of a later round (that rank sends it once its own earlier waits are done)";
    default:
      return "nothing";
  }
}
enum FailCode : int32_t {
  kFailNone = 0,
  kFailTimeout = 1,      // the deadline passed
  kFailAborted = 2,      // anyrCommAbort on this rank
  kFailPeerAborted = 3,  // a peer failed and told this rank to stop
};

struct ErrorRecord {   // host-mapped pinned memory
  int32_t code;        // FailCode; written last
  int32_t waitedRank;  // the rank waited for (or the peer that aborted)
  int32_t what;        // WaitWhat
  int32_t block;
  uint32_t epoch;
  int32_t cause;  // kFailPeerAborted: 1 + the rank the stopping peer timed out on, or 0
  int32_t pad[2];
};
static_assert(sizeof(ErrorRecord) == 32, "ErrorRecord layout");

// The push families (one-shot push and two-shot push, plain and fused) count their launches
// in LocalState::pushEpoch / tsEpoch modulo this multiple of 3, so that their three-phase
// buffer rotation (epoch % 3, device/lamport.cuh) goes on unbroken where the count wraps.
constexpr uint32_t kPushEpochPeriod = 3u << 30;

// Device-local state of one communicator (not shared with peers). Lives in device memory so
// that CUDA-graph replays advance it: nothing call-specific is baked into a captured kernel.
// Epochs are kept per block slot: block b reads slot b at its start and writes it at its end,
// and block 0 also advances the slots of blocks the launch did not use, so every slot holds
// the same value between launches without any atomic or fence at the end of a kernel.
struct LocalState {
  uint32_t pushVecs[3];   // one-shot push: vectors per slot written in each phase
  uint32_t tsVecs[3];     // two-shot push: vectors per segment slot written in each phase
  int32_t failClaim;      // elects the one thread that writes the ErrorRecord
  uint32_t copyLaunches;  // host transport: host-copy launches completed (its barrier's flag)
  int32_t pad[8];
  uint32_t pushEpoch[kMaxBlocks];  // one-shot push launches completed
  uint32_t syncEpoch[kMaxBlocks];  // flag-based (pull, two-shot) launches completed
  uint32_t tsEpoch[kMaxBlocks];    // two-shot push launches completed
  // Flag algorithms (pull, two-shot, host two-shot): launches in which block b ran. A block's
  // flags carry this count, not syncEpoch, which advances for every slot at every launch: a
  // block left unused for 2^31 launches would otherwise find flags that old, and the wrapping
  // comparison `flag - count >= 0` would take them as raised.
  uint32_t flagUse[kMaxBlocks];
  // Host transport, the host one-shot's low-latency protocol: its launches completed. A launch's
  // lines carry this count + 1 as their tag, and it picks their buffer; it advances only with
  // that protocol's own launches, which keep every line's tag recent (host_oneshot_ll.cu).
  uint32_t llUse[kMaxBlocks];
  // Host transport, host-copy: launches in which chunk c was used, which is what its flags
  // carry, for the same reason (a chunk index left unused while messages stay small).
  uint32_t copyUse[kMaxCopyChunks];
  // Ring: chunks each stream has moved, per role (0: fold block, 1: result block). Both roles
  // of a stream, and every rank, count alike; the ring's flags (RingFlags) carry these counts.
  uint32_t ringUse[2][kRingMaxStreams];
};
static_assert(sizeof(LocalState) ==
                  64 + 5 * 4 * kMaxBlocks + 4 * kMaxCopyChunks + 2 * 4 * kRingMaxStreams,
              "LocalState layout");

// Everything a kernel needs to wait safely. Kept in device memory (one per communicator) and
// passed by pointer, so kernels never take the address of their parameters.
struct WaitControl {
  const volatile int32_t* hostAbort;  // host-mapped; set by anyrCommAbort
  ErrorRecord* error;                 // host-mapped (device pointer)
  LocalState* state;
  WorkspaceHeader* ownHeader;  // peers write abortedBy here
  WorkspaceHeader* peerHeaders[kMaxLocalRanks];
  uint64_t timeoutNs;
  int32_t rank;
  int32_t nranks;
};

// The islands of the two-level all-reduce (algo/islands.cu), as its kernel reads them: built by
// topology/islands.h (islandMapOf) from the agreed topology and configuration, so equal on every
// rank. count 0: no islands (the algorithm is not admitted).
struct IslandMap {
  uint8_t count;    // islands
  uint8_t slices;   // the message is cut into this many slices: the sizes' least common multiple
  uint8_t minSize;  // ranks in the smallest island
  uint8_t pad;
  uint8_t islandOf[kMaxLocalRanks];                // [rank]: its island
  uint8_t indexOf[kMaxLocalRanks];                 // [rank]: its place among its island's members
  uint8_t size[kMaxLocalRanks];                    // [island]: its ranks
  uint8_t member[kMaxLocalRanks][kMaxLocalRanks];  // [island][place]: ranks, ascending
};
static_assert(sizeof(IslandMap) == 4 + 3 * kMaxLocalRanks + kMaxLocalRanks * kMaxLocalRanks,
              "IslandMap layout");

// One rank's schedule of the doubling push (algo/doubling_schedule.h, planOf), packed once on the
// host so that its kernels read it instead of deriving it each launch: per round (count of them,
// at most 3) 16 bits of `rounds`, the partner in bits 0-3, the sources it sends in bits 4-11 and
// the rank it receives from in bits 12-15; per source 4 bits of `writers`, the rank that stores
// that source's vectors into this rank's slots (the own rank for its own).
struct DoublingPlan {
  uint64_t rounds;
  uint32_t writers;
  uint32_t count;
};

// Arguments of every all-reduce kernel: raw pointers and sizes only.
struct AllReduceArgs {
  const void* input;
  void* output;
  uint64_t count;                       // elements in this launch
  uint64_t numVecs;                     // 16-byte vectors covering `count` elements
  char* peerWorkspace[kMaxLocalRanks];  // mapped base of every rank's workspace (own included)
  WorkspaceLayout layout;
  const WaitControl* wait;  // in device memory; read only on the slow path of a wait
  LocalState* state;
  int32_t rank;
  int32_t nranks;
  int32_t pushFence;  // 1: system-scope fence after the pushes, before polling (ANYR_PUSH_FENCE)
  int32_t wire;       // anyrWire_t; honoured by one-shot pull (and the host algorithms' HostArgs)
  int32_t releaseEarly;   // 1: the kernel releases the next launch on its stream right after its
                          // wait (dev::waitForPrevious; ANYR_PDL_EARLY)
  IslandMap islands;      // the two-level all-reduce's islands (algo/islands.cu)
  DoublingPlan doubling;  // this rank's doubling push schedule (algo/doubling_push.cu)
};

}  // namespace anyr
