// The peer workspace (core/peer_workspace.h): its layout, the choice of peer memory, the setup
// and the transport check.
#include "core/peer_workspace.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "algo/algo.h"
#include "algo/doubling_schedule.h"
#include "algo/ring_plan.h"
#include "base/env.h"
#include "base/error.h"
#include "base/log.h"
#include "core/context.h"
#include "core/selftest.h"
#include "device/vectors.h"
#include "topology/islands.h"
#include "transport/check.h"

namespace anyr {

uint64_t WorkspaceLayout::hash() const {
  const uint64_t fields[] = {headerOffset,  flagsOffset,   checkOffset,    checkBytes, pushOffset,
                             pushSlotBytes, stagingOffset, resultOffset,   chunkBytes, tsOffset,
                             tsSlotBytes,   ringOffset,    ringCopyOffset, totalBytes};
  uint64_t h = 1469598103934665603ull;
  for (uint64_t f : fields) {
    h ^= f;
    h *= 1099511628211ull;
  }
  return h;
}

WorkspaceLayout computeLayout(const Config& cfg, int nranks) {
  WorkspaceLayout l{};
  const uint64_t page = 4096;
  l.headerOffset = 0;
  l.flagsOffset = page;
  l.checkOffset = roundUp(l.flagsOffset + sizeof(FlagArea), page);
  l.checkBytes = roundUp(sizeof(CheckArea), page);
  l.pushOffset = l.checkOffset + l.checkBytes;
  uint64_t oneShot = cfg.oneShotMaxBytes ? cfg.oneShotMaxBytes : defaultOneShotMaxBytes(nranks);
  l.pushSlotBytes = roundUp(std::max<uint64_t>(oneShot, 64u << 10), page);
  l.stagingOffset =
      roundUp(l.pushOffset + 3 * l.pushSlotBytes * static_cast<uint64_t>(nranks), page);
  l.chunkBytes = cfg.chunkBytes;
  l.resultOffset = l.stagingOffset + 2 * l.chunkBytes;
  l.tsOffset = l.resultOffset + 2 * l.chunkBytes;
  const uint64_t n = static_cast<uint64_t>(nranks);
  l.tsSlotBytes = roundUp((l.chunkBytes / 16 + n - 1) / n * 16, page);
  l.ringOffset = l.tsOffset + 3 * 2 * n * l.tsSlotBytes;
  l.ringCopyOffset = roundUp(l.ringOffset + kRingAreaBytes, page);
  l.totalBytes = l.ringCopyOffset + kRingCopyAreaBytes;
  return l;
}

void PeerWorkspace::init() {
  ctx_.facts.peerMemory = false;
  if (const char* refusal = ctx_.localTransportRefusal("a single rank needs no peer memory")) {
    ctx_.facts.peerMemoryReason = refusal;
    return;
  }
  // Diagnostic: behave as GPUs without peer access (rank 0's setting, through the agreed
  // configuration, counts for everyone).
  if (ctx_.cfg.peerMemory == anyrPeerMemoryNone) {
    ctx_.facts.peerMemoryReason = "disabled by config.peerMemory / ANYR_PEER_MEMORY=none";
    return;
  }
  layout_ = computeLayout(ctx_.cfg, ctx_.nranks);
  mapPeerMemory();
  if (!peers_) return;
  char* base = peers_->local();
  // Header, zeroed flags and check area, cleared push buffers.
  const WorkspaceHeader h = ctx_.headerOfThisRank(layout_.hash());
  ANYR_CUDA_CHECK(cudaMemsetAsync(base, 0, layout_.pushOffset, ctx_.internalStream));
  ANYR_CUDA_CHECK(cudaMemcpyAsync(base + layout_.headerOffset, &h, sizeof(h),
                                  cudaMemcpyHostToDevice, ctx_.internalStream));
  clearPushAreas(ctx_.internalStream);
  ANYR_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&dState_), sizeof(LocalState)));
  ANYR_CUDA_CHECK(cudaMemsetAsync(dState_, 0, sizeof(LocalState), ctx_.internalStream));
  ctx_.waitStreamIdle(ctx_.internalStream, "clearing the workspace");
  for (int b = 0; b < kRingCopyStreams; ++b) {
    for (cudaStream_t* st : {&ringCopy_.fold[b], &ringCopy_.result[b]}) {
      ANYR_CUDA_CHECK(cudaStreamCreateWithFlags(st, cudaStreamNonBlocking));
    }
  }
  ANYR_CUDA_CHECK(cudaEventCreateWithFlags(&ringCopy_.fork, cudaEventDisableTiming));
  for (cudaEvent_t& e : ringCopy_.joined) {
    ANYR_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  ctx_.facts.peerMemory = true;

  // Kernel argument template.
  std::memset(&argsTemplate_, 0, sizeof(argsTemplate_));
  for (int r = 0; r < ctx_.nranks; ++r) argsTemplate_.peerWorkspace[r] = peers_->peer(r);
  argsTemplate_.layout = layout_;
  WorkspaceHeader* peerHeaders[kMaxLocalRanks] = {};
  for (int r = 0; r < ctx_.nranks; ++r) {
    peerHeaders[r] =
        peers_->peer(r) ? reinterpret_cast<WorkspaceHeader*>(peers_->peer(r)) : nullptr;
  }
  dWait_ = ctx_.newWaitControl(
      dState_, reinterpret_cast<WorkspaceHeader*>(base + layout_.headerOffset), peerHeaders);
  argsTemplate_.wait = dWait_;
  argsTemplate_.state = dState_;
  argsTemplate_.rank = ctx_.rank;
  argsTemplate_.nranks = ctx_.nranks;
  argsTemplate_.pushFence = env::getInt("ANYR_PUSH_FENCE") != 0 ? 1 : 0;
  argsTemplate_.wire = static_cast<int32_t>(ctx_.cfg.wire);
  // The two-level all-reduce's islands: from the agreed topology and configuration.
  argsTemplate_.islands = islandMapOf(islandsOf(ctx_.topo, ctx_.cfg.islands, ctx_.nranks));
  // The doubling push's schedule for this rank, its partner order from the same islands (as
  // its admission and cost take it).
  argsTemplate_.doubling = doubling::planOf(
      ctx_.nranks, doubling::doublingOrder(argsTemplate_.islands, ctx_.nranks), ctx_.rank);
}

PeerWorkspace::MapSummary PeerWorkspace::summarize(const PeerMemory& m) {
  // Per rank: the peers it mapped, those it did not whose devices reach its own (the driver's
  // peer access, or one GPU), and its first unmapped peer with the reason. One gather.
  struct Row {
    int32_t mapped;
    int32_t reachableUnmapped;
    int32_t firstFailed;  // -1: every peer mapped
    char why[116];
  };
  static_assert(sizeof(Row) == 128, "Row layout");
  Row mine{};
  mine.firstFailed = -1;
  for (int p = 0; p < ctx_.nranks; ++p) {
    if (p == ctx_.rank) continue;
    if (m.peer(p) != nullptr) {
      ++mine.mapped;
      continue;
    }
    const PairInfo& pi = ctx_.topo.pair(ctx_.rank, p);
    if (pi.driverPeerAccess || pi.link == LinkType::Self) ++mine.reachableUnmapped;
    if (mine.firstFailed < 0) {
      mine.firstFailed = p;
      std::snprintf(mine.why, sizeof(mine.why), "%s", m.mapError(p).c_str());
    }
  }
  MapSummary out;
  std::string failure;
  const std::vector<Row> rows = ctx_.bs->allGatherValue(mine);
  for (int r = 0; r < ctx_.nranks; ++r) {
    const Row& row = rows[static_cast<size_t>(r)];
    out.mapped += row.mapped;
    out.reachableUnmapped += row.reachableUnmapped;
    if (failure.empty() && row.firstFailed >= 0) {
      failure = "; rank " + std::to_string(r) + " cannot map rank " +
                std::to_string(row.firstFailed) +
                "'s workspace: " + std::string(row.why, strnlen(row.why, sizeof(row.why)));
    }
  }
  out.text = std::to_string(out.mapped) + " of " + std::to_string(ctx_.nranks * (ctx_.nranks - 1)) +
             " ordered pairs mapped" + failure;
  return out;
}

void PeerWorkspace::mapPeerMemory() {
  const anyrPeerMemory_t want = ctx_.cfg.peerMemory;
  const bool forced = want != anyrPeerMemoryAuto;
  const std::string how = forced ? "forced by config.peerMemory / ANYR_PEER_MEMORY" : "auto";
  const int pairs = ctx_.nranks * (ctx_.nranks - 1);
  const FaultInjection fault = parseFaultInjection(env::getString("ANYR_FAULT_INJECT"));
  const bool failIpc = fault.kind == FaultInjection::IpcOpenFails && fault.rank == ctx_.rank;
  const bool coarseVmm = fault.kind == FaultInjection::VmmGranularity && fault.rank == ctx_.rank;
  // Releases `m` on every rank without freeing a region a peer still maps.
  auto release = [&](std::unique_ptr<PeerMemory>* m) {
    (*m)->unmapPeers();
    ctx_.bs->barrier();
    m->reset();
  };

  MapSummary ipc;
  if (want == anyrPeerMemoryCudaIpc || want == anyrPeerMemoryAuto) {
    peers_ = createIpcPeerMemory(*ctx_.bs, layout_.totalBytes, failIpc);
    ipc = summarize(*peers_);
    if (forced || ipc.mapped == pairs) {
      peerMemoryNote_ = "cuda-ipc (" + how + "): " + ipc.text;
      return;
    }
    // vmm can map only pairs whose devices reach each other: where no pair IPC left unmapped
    // is such a pair, it cannot do better (GPUs without peer access), and is not set up.
    if (ipc.reachableUnmapped == 0) {
      peerMemoryNote_ =
          "cuda-ipc (auto): " + ipc.text + " (vmm not tried: no unmapped pair has peer access)";
      return;
    }
    release(&peers_);
  }
  // vmm: forced, or auto after legacy IPC left a pair unmapped.
  std::string vmmWhy;
  std::unique_ptr<PeerMemory> vmm =
      createVmmPeerMemory(*ctx_.bs, layout_.totalBytes, ctx_.cfg.timeoutMs, coarseVmm, &vmmWhy);
  MapSummary v;  // null on every rank or on none
  if (vmm) v = summarize(*vmm);
  const std::string vmmText = vmm ? v.text : "not set up: " + vmmWhy;
  if (forced) {
    if (!vmm) {
      ctx_.facts.peerMemoryReason = "vmm (" + how + ") " + vmmText;
      return;
    }
    peers_ = std::move(vmm);
    peerMemoryNote_ = "vmm (" + how + "): " + vmmText;
    return;
  }
  if (vmm && v.mapped > ipc.mapped) {
    peers_ = std::move(vmm);
    peerMemoryNote_ = "vmm (auto): " + vmmText + " (cuda-ipc " + ipc.text + ")";
    return;
  }
  // Legacy IPC mapped as many pairs: set up again, and the pair checks decide per pair.
  if (vmm) release(&vmm);
  peers_ = createIpcPeerMemory(*ctx_.bs, layout_.totalBytes, failIpc);
  peerMemoryNote_ = "cuda-ipc (auto): " + summarize(*peers_).text + " (vmm " + vmmText + ")";
}

std::string PeerWorkspace::peerMemoryText() const {
  return peers_ ? peerMemoryNote_ : "none (" + ctx_.facts.peerMemoryReason + ")";
}

void PeerWorkspace::clearPushAreas(cudaStream_t s) {
  char* base = peers_->local();
  // Three phases of one slot per rank (one-shot push), six of one segment slot per rank
  // (two-shot push: reduce-scatter and all-gather), all in the clear pattern (device/lamport.cuh).
  ANYR_CUDA_CHECK(launchFillWords(
      reinterpret_cast<uint32_t*>(base + layout_.pushOffset),
      3 * layout_.pushSlotBytes * static_cast<uint64_t>(ctx_.nranks) / 4, kPushClearWord, s));
  ANYR_CUDA_CHECK(launchFillWords(reinterpret_cast<uint32_t*>(base + layout_.tsOffset),
                                  6 * layout_.tsSlotBytes * static_cast<uint64_t>(ctx_.nranks) / 4,
                                  kPushClearWord, s));
}

void PeerWorkspace::checkTransport() {
  if (!ctx_.facts.peerMemory) return;
  // Real transfers over every mapped pair: this rank writes a pattern into every peer's area,
  // publishes one for peers to read, and (where the driver reports peer atomics) adds
  // atomically into every peer's counter; then each rank verifies what it received.
  std::random_device rd;
  uint32_t salt = 0;
  if (ctx_.rank == 0) salt = rd();
  ctx_.bs->broadcast(&salt, sizeof(salt), 0);
  CheckArea* own = reinterpret_cast<CheckArea*>(peers_->local() + layout_.checkOffset);
  uint32_t* dCounts = nullptr;
  ANYR_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&dCounts),
                                  2 * kMaxLocalRanks * sizeof(uint32_t), ctx_.internalStream));
  ANYR_CUDA_CHECK(
      cudaMemsetAsync(dCounts, 0, 2 * kMaxLocalRanks * sizeof(uint32_t), ctx_.internalStream));
  ANYR_CUDA_CHECK(launchCheckPublish(own, ctx_.rank, salt, ctx_.internalStream));
  ctx_.waitStreamIdle(ctx_.internalStream, "publishing the transport check pattern");
  ctx_.bs->barrier();

  // Ordered pair facts this rank can establish: mapped (both ways known after the gather),
  // read me->p, write p->me, atomic p->me.
  struct Row {
    uint8_t mapped[kMaxLocalRanks];
    uint8_t readOk[kMaxLocalRanks];
    uint8_t writeOkFrom[kMaxLocalRanks];
    uint8_t atomicOkFrom[kMaxLocalRanks];
    uint8_t atomicTried[kMaxLocalRanks];
  };
  Row row{};
  for (int p = 0; p < ctx_.nranks; ++p) {
    if (p == ctx_.rank || peers_->peer(p) == nullptr) continue;
    row.mapped[p] = 1;
    CheckArea* peerArea = reinterpret_cast<CheckArea*>(peers_->peer(p) + layout_.checkOffset);
    ANYR_CUDA_CHECK(launchCheckWrite(peerArea, ctx_.rank, p, salt, ctx_.internalStream));
    ANYR_CUDA_CHECK(launchCheckRead(peerArea, p, salt, dCounts + p, ctx_.internalStream));
    if (ctx_.topo.pair(ctx_.rank, p).driverAtomics ||
        ctx_.topo.pair(ctx_.rank, p).link == LinkType::Self) {
      row.atomicTried[p] = 1;
      ANYR_CUDA_CHECK(launchCheckAtomics(peerArea, ctx_.rank, ctx_.internalStream));
    }
  }
  ctx_.waitStreamIdle(ctx_.internalStream, "the transport check transfers");
  ctx_.bs->barrier();
  for (int p = 0; p < ctx_.nranks; ++p) {
    if (p == ctx_.rank) continue;
    ANYR_CUDA_CHECK(launchCheckVerify(own, p, ctx_.rank, salt, dCounts + kMaxLocalRanks + p,
                                      ctx_.internalStream));
  }
  uint32_t counts[2 * kMaxLocalRanks] = {};
  uint32_t atomics[kMaxLocalRanks] = {};
  ANYR_CUDA_CHECK(cudaMemcpyAsync(counts, dCounts, sizeof(counts), cudaMemcpyDeviceToHost,
                                  ctx_.internalStream));
  ANYR_CUDA_CHECK(cudaMemcpyAsync(atomics, own->atomics, sizeof(atomics), cudaMemcpyDeviceToHost,
                                  ctx_.internalStream));
  ANYR_CUDA_CHECK(cudaFreeAsync(dCounts, ctx_.internalStream));
  ctx_.waitStreamIdle(ctx_.internalStream, "verifying the transport check");
  std::vector<Row> rows = ctx_.bs->allGatherValue(row);
  for (int p = 0; p < ctx_.nranks; ++p) {
    if (p == ctx_.rank) continue;
    row.readOk[p] = row.mapped[p] && counts[p] == 0;
    row.writeOkFrom[p] =
        rows[static_cast<size_t>(p)].mapped[ctx_.rank] && counts[kMaxLocalRanks + p] == 0;
    row.atomicOkFrom[p] =
        rows[static_cast<size_t>(p)].atomicTried[ctx_.rank] &&
        atomics[p] == static_cast<uint32_t>(kAtomicThreads * kAtomicAddsPerThread);
  }
  rows = ctx_.bs->allGatherValue(row);
  for (int s = 0; s < ctx_.nranks; ++s) {
    for (int d = 0; d < ctx_.nranks; ++d) {
      if (s == d) continue;
      PairInfo& p = ctx_.topo.pair(s, d);
      p.peerReadOk = rows[static_cast<size_t>(s)].readOk[d] != 0;
      p.peerWriteOk = rows[static_cast<size_t>(d)].writeOkFrom[s] != 0;
      p.peerAtomicOk = rows[static_cast<size_t>(d)].atomicOkFrom[s] != 0;
      if (s == ctx_.rank && !peers_->mapError(d).empty()) {
        ANYR_LOG(Warn, ctx_.rank, "cannot map rank " << d << "'s memory: " << peers_->mapError(d));
      }
      if (!p.peerWriteOk || !p.peerReadOk) {
        ANYR_LOG(Info, ctx_.rank,
                 "transport check rank " << s << " -> rank " << d << ": write "
                                         << (p.peerWriteOk ? "ok" : "FAILED") << ", read "
                                         << (p.peerReadOk ? "ok" : "FAILED"));
      }
    }
  }
}

void PeerWorkspace::freeState() {
  if (dState_ != nullptr) (void)cudaFree(dState_);
  if (dWait_ != nullptr) (void)cudaFree(dWait_);
  dState_ = nullptr;
  dWait_ = nullptr;
  for (int b = 0; b < kRingCopyStreams; ++b) {
    for (cudaStream_t st : {ringCopy_.fold[b], ringCopy_.result[b]}) {
      if (st != nullptr) (void)cudaStreamDestroy(st);
    }
  }
  if (ringCopy_.fork != nullptr) (void)cudaEventDestroy(ringCopy_.fork);
  for (cudaEvent_t e : ringCopy_.joined) {
    if (e != nullptr) (void)cudaEventDestroy(e);
  }
  ringCopy_ = RingCopyStreams{};
}

}  // namespace anyr
