// The communicator's host-memory transport: setup of the shared pinned segment and launches of
// the host algorithms (src/algo/host_oneshot.cu, host_twoshot.cu, host_copy.cu). Set up on every
// single-host communicator of 2..8 ranks (unless ANYR_HOST_MEMORY=0), whether or not the GPUs
// have peer access: admission decides when it is the default, and tests can force it anywhere.
#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <vector>

#include "algo/algo.h"
#include "base/env.h"
#include "base/error.h"
#include "base/log.h"
#include "bootstrap/bootstrap.h"
#include "core/comm.h"

namespace anyr {

namespace {

// Every 16-byte line of a rank's two low-latency buffers (at `lines`, 2 x layout.llBytes bytes)
// as {0, tag, 0, tag}: the state a sweep leaves (host_oneshot_ll.cu).
void tagLowLatencyLines(char* lines, const HostLayout& layout, uint32_t tag) {
  const uint32_t line[4] = {0, tag, 0, tag};
  for (uint64_t off = 0; off < 2 * layout.llBytes; off += sizeof(line)) {
    std::memcpy(lines + off, line, sizeof(line));
  }
}

}  // namespace

void Communicator::initHostTransport() {
  facts_.hostMemory = false;
  if (nranks_ < 2) {
    facts_.hostMemoryReason = "a single rank needs no transport";
    return;
  }
  if (nranks_ > kMaxLocalRanks || !facts_.sameHost) {
    facts_.hostMemoryReason =
        nranks_ > kMaxLocalRanks ? "more than 8 ranks" : "ranks on several hosts";
    return;
  }
  // Rank 0's choice counts for everyone (the environment may differ between processes).
  const HostSettings agreed = agreeHostSettings(*bs_, rank_);
  if (!agreed.enabled) {
    facts_.hostMemoryReason = "disabled by ANYR_HOST_MEMORY=0";
    return;
  }
  hostLayout_ =
      computeHostLayout(agreed.launchBytes, nranks_, agreed.llBytes, agreed.copyChunkBytes);
  cfg_.hostLowLatencyBytes = hostLayout_.llMaxBytes;
  cfg_.hostLowLatencyEagerBytes = std::min(agreed.llEagerBytes, hostLayout_.llMaxBytes);
  cfg_.hostCopyChunkBytes = hostLayout_.copyChunkBytes;
  cfg_.hostLaunchBytes = hostLayout_.launchBytes;
  std::string why;
  host_ = createHostMemory(*bs_, hostLayout_.totalBytes, &why);
  if (!host_) {
    facts_.hostMemoryReason = "shared host memory could not be set up: " + why;
    ANYR_LOG(Warn, rank_, facts_.hostMemoryReason);
    return;
  }
  // The own region's header (the segment starts zeroed: flags are 0, no one aborted).
  char* mine = host_->host() + static_cast<uint64_t>(rank_) * hostLayout_.rankBytes;
  const WorkspaceHeader h = headerOfThisRank(0);
  std::memcpy(mine + hostLayout_.headerOffset, &h, sizeof(h));

  ANYR_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&dHostState_), sizeof(LocalState)));
  ANYR_CUDA_CHECK(cudaMemsetAsync(dHostState_, 0, sizeof(LocalState), internalStream_));
  // ANYR_TEST_HOST_LL_COUNT (tests only): the low-latency protocol's launch count starts at the
  // value, and the own lines carry it as their tag, as a sweep at that count would have left
  // them; the ranks' calls then cross the count's wrap and the sweeps.
  const int64_t llCount = testValueOfRank0("ANYR_TEST_HOST_LL_COUNT", UINT32_MAX);
  std::vector<uint32_t> llSlots;
  if (llCount >= 0) {
    tagLowLatencyLines(mine + hostLayout_.llOffset, hostLayout_, static_cast<uint32_t>(llCount));
    llSlots.assign(static_cast<size_t>(kMaxBlocks), static_cast<uint32_t>(llCount));
    ANYR_CUDA_CHECK(cudaMemcpyAsync(dHostState_->llUse, llSlots.data(),
                                    llSlots.size() * sizeof(uint32_t), cudaMemcpyHostToDevice,
                                    internalStream_));
    ANYR_LOG(Warn, rank_,
             "ANYR_TEST_HOST_LL_COUNT: the low-latency launch count starts at " << llCount);
  }
  waitStreamIdle(internalStream_, "clearing the host transport's state");
  char* dev = host_->device();
  WorkspaceHeader* headers[kMaxLocalRanks] = {};
  for (int r = 0; r < nranks_; ++r) {
    headers[r] = reinterpret_cast<WorkspaceHeader*>(
        dev + static_cast<uint64_t>(r) * hostLayout_.rankBytes + hostLayout_.headerOffset);
  }
  dHostWait_ = newWaitControl(dHostState_, headers[rank_], headers);

  std::memset(&hostTemplate_, 0, sizeof(hostTemplate_));
  hostTemplate_.base = dev;
  hostTemplate_.layout = hostLayout_;
  hostTemplate_.wait = dHostWait_;
  hostTemplate_.state = dHostState_;
  hostTemplate_.rank = rank_;
  hostTemplate_.nranks = nranks_;
  hostTemplate_.wire = static_cast<int32_t>(cfg_.wire);
  hostTemplate_.roundVecs = agreed.roundVecs;
  initHostCopy();
  bs_->barrier();  // every header written before any kernel may look at it
  facts_.hostMemory = true;
  facts_.hostMemoryReason = "shared pinned host segment of " +
                            std::to_string(hostLayout_.totalBytes) + " bytes mapped by every rank";
}

void Communicator::initHostCopy() {
  // Device staging of the host-copy algorithm: the own compressed chunks (compressed wire),
  // and every peer's chunks of one launch, copied in from host memory before the reduction:
  // n x copyBytes in all (copyBytes: a launch plus one copy chunk, 18 MiB with the default 16 MiB
  // launch and 2 MiB chunks: 36 MiB at 2 ranks, 144 MiB at 8).
  const uint64_t slot = hostLayout_.copyBytes;
  ANYR_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&copy_.sendStage), slot));
  ANYR_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&copy_.recvStage),
                             slot * static_cast<uint64_t>(nranks_ - 1)));
  for (cudaStream_t* st : {&copy_.d2h, &copy_.sig, &copy_.poll, &copy_.h2d}) {
    ANYR_CUDA_CHECK(cudaStreamCreateWithFlags(st, cudaStreamNonBlocking));
  }
  ANYR_CUDA_CHECK(cudaEventCreateWithFlags(&copy_.fork, cudaEventDisableTiming));
  ANYR_CUDA_CHECK(cudaEventCreateWithFlags(&copy_.signaled, cudaEventDisableTiming));
  // Chunks of one launch: at most a launch's worth of configured chunks, or four smaller ones.
  const uint64_t most = std::max<uint64_t>(
      4, (hostLayout_.launchBytes + hostLayout_.copyChunkBytes - 1) / hostLayout_.copyChunkBytes);
  for (std::vector<cudaEvent_t>* v : {&copy_.copied, &copy_.arrived, &copy_.recv, &copy_.packed}) {
    v->resize(most, nullptr);
    for (cudaEvent_t& e : *v) {
      ANYR_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
  }
}

void Communicator::freeHostCopy() {
  for (std::vector<cudaEvent_t>* v : {&copy_.copied, &copy_.arrived, &copy_.recv, &copy_.packed}) {
    for (cudaEvent_t e : *v) {
      if (e != nullptr) (void)cudaEventDestroy(e);
    }
  }
  for (cudaEvent_t e : {copy_.fork, copy_.signaled}) {
    if (e != nullptr) (void)cudaEventDestroy(e);
  }
  for (cudaStream_t st : {copy_.d2h, copy_.sig, copy_.poll, copy_.h2d}) {
    if (st != nullptr) (void)cudaStreamDestroy(st);
  }
  if (copy_.sendStage != nullptr) (void)cudaFree(copy_.sendStage);
  if (copy_.recvStage != nullptr) (void)cudaFree(copy_.recvStage);
  copy_ = HostCopyResources{};
}

void Communicator::launchHostAlgo(anyrAlgo_t algo, const void* in, void* out, size_t count,
                                  anyrDataType_t dtype, cudaStream_t stream) {
  if (!host_) throwError(anyrInternalError, "launchHostAlgo: no host transport");
  const AlgoInfo& row = algoInfo(algo);
  if (row.launchHostCopy != nullptr) {
    // The copy engines' form (host-copy): its own streams and events, and device staging.
    HostCopyArgs t{};
    t.h = hostTemplate_;
    t.hostBase = host_->host();
    t.sendStage = copy_.sendStage;
    t.recvStage = copy_.recvStage;
    const HostCopyStreams streams{copy_.d2h,
                                  copy_.sig,
                                  copy_.poll,
                                  copy_.h2d,
                                  copy_.fork,
                                  copy_.signaled,
                                  copy_.copied.data(),
                                  copy_.arrived.data(),
                                  copy_.recv.data(),
                                  copy_.packed.data(),
                                  static_cast<uint32_t>(copy_.copied.size())};
    launchInPieces(
        algo, hostTemplate_, in, out, count, dtype, hostLayout_.launchBytes,
        [&](const HostArgs& a, const LaunchShape& piece) {
          HostCopyArgs c = t;
          c.h = a;
          c.chunkVecs =
              hostCopyLaunchChunkBytes(a.count * dtypeSize(dtype), hostLayout_.copyChunkBytes) / 16;
          c.chunks = static_cast<uint32_t>((a.numVecs + c.chunkVecs - 1) / c.chunkVecs);
          // The reduction is local (device memory): spread it over every block.
          LaunchShape shape =
              spreadShape(std::min(a.numVecs, c.chunkVecs), static_cast<uint64_t>(maxBlocks_));
          shape.aligned = piece.aligned;
          return row.launchHostCopy(dtype, c, shape, streams, stream);
        });
    return;
  }
  // One-shot messages of at most llMaxBytes with the native wire take the low-latency protocol
  // (one PCIe round trip instead of two); the decision depends only on agreed values and the
  // call's count, so every rank takes the same one.
  const uint64_t bytes = count * dtypeSize(dtype);
  const bool ll = row.launchHostLowLatency != nullptr && hostTemplate_.wire == kWireNative &&
                  bytes <= hostLayout_.llMaxBytes;
  launchInPieces(algo, hostTemplate_, in, out, count, dtype, hostLayout_.launchBytes,
                 [&](const HostArgs& a, const LaunchShape& shape) {
                   if (ll) {
                     HostArgs l = a;
                     l.llEager = bytes <= cfg_.hostLowLatencyEagerBytes ? 1 : 0;
                     LaunchShape s = hostLowLatencyShape(a.numVecs, maxBlocks_);
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

void Communicator::explainHost(void* json) const {
  nlohmann::json& j = *static_cast<nlohmann::json*>(json);
  j["hostTransport"] = {{"available", facts_.hostMemory},
                        {"reason", facts_.hostMemoryReason},
                        {"wire", wireName(cfg_.wire)},
                        {"lowLatencyMaxBytes", hostLayout_.llMaxBytes},
                        {"lowLatencyEagerMaxBytes", cfg_.hostLowLatencyEagerBytes},
                        {"copyChunkBytes", hostLayout_.copyChunkBytes},
                        {"launchBytes", hostLayout_.launchBytes}};
  if (host_) j["hostTransport"]["segmentBytes"] = hostLayout_.totalBytes;
}

}  // namespace anyr
