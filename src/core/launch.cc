// Launches of the unfused all-reduce algorithms (core/launch.h).
#include "core/launch.h"

#include <algorithm>
#include <string>

#include "base/error.h"
#include "base/names.h"
#include "core/capabilities.h"
#include "core/context.h"
#include "core/host_transport.h"
#include "core/peer_workspace.h"
#include "topology/islands.h"

namespace anyr {

size_t dtypeSize(anyrDataType_t t) {
  switch (t) {
    case anyrFloat32:
      return 4;
    case anyrFloat16:
    case anyrBfloat16:
      return 2;
    default:
      return 0;
  }
}

namespace {
constexpr uint64_t kHostBytesPerBlock = 64u << 10;
}  // namespace

LaunchShape Launcher::shapeFor(anyrAlgo_t algo, uint64_t numVecs) const {
  // spreadShape (algo/algo.h) under this algorithm's block cap. Every rank computes the same
  // shape (agreed inputs only), which the per-block flags rely on.
  const AlgoInfo* row = findAlgo(algo);
  const bool host = row != nullptr && row->kind == AlgoKind::HostMemory;
  const bool perRank = row != nullptr && row->perRankShare;
  const uint64_t work = perRank ? (numVecs + ctx_.nranks - 1) / ctx_.nranks : numVecs;
  uint64_t blocksCap = static_cast<uint64_t>(host ? caps_.maxBlocks() : caps_.peerBlocks());
  if (host && ctx_.cfg.wire == anyrWireNative) {
    // The host paths are bound by each GPU's PCIe link, not by its SMs, and every block polls
    // its own flags across that link: about one block per 64 KiB of message, at least 16 and
    // at most half the SMs (measured on 2 x H200 from 64 KiB to 16 MiB: 16 blocks beat 32..132
    // by 1.1-1.6x up to 1 MiB, and half the SMs beat all of them by 1.05x at 16 MiB). A
    // compressed wire spends SM time on (de)quantization and keeps every block (with half the
    // SMs the fp8 host-oneshot took 622 us at 16 MiB, with every block 456-460 us).
    const uint64_t byBytes = (numVecs * 16 + kHostBytesPerBlock - 1) / kHostBytesPerBlock;
    const uint64_t most = std::max<uint64_t>(1, blocksCap / 2);
    blocksCap = std::min(most, std::max<uint64_t>(std::min<uint64_t>(16, most), byBytes));
  }
  // One block per SM first; the peer kernels' second block only for large messages.
  LaunchShape shape = peerLaunchShape(work, static_cast<uint64_t>(caps_.maxBlocks()), blocksCap);
  shape.pdl = caps_.pdlOn();
  return shape;
}

void Launcher::launchPeerAlgo(anyrAlgo_t algo, const void* in, void* out, size_t count,
                              anyrDataType_t dtype, cudaStream_t stream) const {
  const AlgoInfo* row = findAlgo(algo);
  if (row != nullptr && row->kind == AlgoKind::HostMemory) {
    launchHostAlgo(algo, in, out, count, dtype, stream);
    return;
  }
  if (row != nullptr && row->launchPeerCopy != nullptr) {
    // The copy engines' form (ring-copy): side streams of the workspace, large launches.
    const RingCopyStreams& streams = workspace_.ringCopyStreams();
    launchInPieces(algo, workspace_.args(), in, out, count, dtype, kRingCopyLaunchBytes,
                   [&](const AllReduceArgs& a, const LaunchShape& shape) {
                     return row->launchPeerCopy(dtype, a, shape, streams, stream);
                   });
    return;
  }
  // Per-launch capacity: one push slot, the islands' share of a two-shot push slot, or one
  // staging chunk (the row's LaunchCapacity).
  const LaunchCapacity kind = row != nullptr ? row->capacity : LaunchCapacity::Chunk;
  const uint64_t capacity =
      kind == LaunchCapacity::PushSlot ? workspace_.layout().pushSlotBytes
      : kind == LaunchCapacity::IslandSlots
          ? islandLaunchBytes(workspace_.args().islands, workspace_.layout().tsSlotBytes)
          : workspace_.layout().chunkBytes;
  if (capacity == 0) throwError(anyrInternalError, "launchPeerAlgo: no launch capacity");
  const PeerLaunchFn launch =
      row != nullptr && row->kind == AlgoKind::PeerMemory ? row->launch : nullptr;
  launchInPieces(algo, workspace_.args(), in, out, count, dtype, capacity,
                 [&](const AllReduceArgs& a, const LaunchShape& shape) {
                   if (launch == nullptr) {
                     throwError(anyrInternalError, "launchPeerAlgo: not a peer algorithm");
                   }
                   return launch(dtype, a, shape, stream);
                 });
}

void Launcher::throwLaunchFailed(anyrAlgo_t algo, cudaError_t e) {
  throwError(anyrCudaError,
             std::string("launching ") + anyrAlgoName(algo) + ": " + cudaGetErrorString(e));
}

void Launcher::launchHostAlgo(anyrAlgo_t algo, const void* in, void* out, size_t count,
                              anyrDataType_t dtype, cudaStream_t stream) const {
  if (!host_.present()) throwError(anyrInternalError, "launchHostAlgo: no host transport");
  const AlgoInfo& row = algoInfo(algo);
  if (row.launchHostCopy != nullptr) {
    // The copy engines' form (host-copy): its own streams and events, and device staging.
    HostCopyArgs t{};
    t.h = host_.args();
    t.hostBase = host_.memory()->host();
    t.sendStage = host_.copy().sendStage;
    t.recvStage = host_.copy().recvStage;
    const HostCopyStreams streams{host_.copy().d2h,
                                  host_.copy().sig,
                                  host_.copy().poll,
                                  host_.copy().h2d,
                                  host_.copy().fork,
                                  host_.copy().signaled,
                                  host_.copy().copied.data(),
                                  host_.copy().arrived.data(),
                                  host_.copy().recv.data(),
                                  host_.copy().packed.data(),
                                  static_cast<uint32_t>(host_.copy().copied.size())};
    launchInPieces(algo, host_.args(), in, out, count, dtype, host_.layout().launchBytes,
                   [&](const HostArgs& a, const LaunchShape& piece) {
                     HostCopyArgs c = t;
                     c.h = a;
                     c.chunkVecs = hostCopyLaunchChunkBytes(a.count * dtypeSize(dtype),
                                                            host_.layout().copyChunkBytes) /
                                   16;
                     c.chunks = static_cast<uint32_t>((a.numVecs + c.chunkVecs - 1) / c.chunkVecs);
                     // The reduction is local (device memory): spread it over every block.
                     LaunchShape shape = spreadShape(std::min(a.numVecs, c.chunkVecs),
                                                     static_cast<uint64_t>(caps_.maxBlocks()));
                     shape.aligned = piece.aligned;
                     return row.launchHostCopy(dtype, c, shape, streams, stream);
                   });
    return;
  }
  // One-shot messages of at most llMaxBytes with the native wire take the low-latency protocol
  // (one PCIe round trip instead of two); the decision depends only on agreed values and the
  // call's count, so every rank takes the same one.
  const uint64_t bytes = count * dtypeSize(dtype);
  const bool ll = row.launchHostLowLatency != nullptr && host_.args().wire == kWireNative &&
                  bytes <= host_.layout().llMaxBytes;
  launchInPieces(algo, host_.args(), in, out, count, dtype, host_.layout().launchBytes,
                 [&](const HostArgs& a, const LaunchShape& shape) {
                   if (ll) {
                     HostArgs l = a;
                     l.llEager = bytes <= ctx_.cfg.hostLowLatencyEagerBytes ? 1 : 0;
                     LaunchShape s = hostLowLatencyShape(a.numVecs, caps_.maxBlocks());
                     s.aligned = shape.aligned;
                     s.pdl = shape.pdl;
                     return row.launchHostLowLatency(dtype, l, s, stream);
                   }
                   if (row.launchHost == nullptr) {
                     throwError(anyrInternalError, "launchHostAlgo: not a host algorithm");
                   }
                   return row.launchHost(dtype, a, shape, stream);
                 });
}

}  // namespace anyr
