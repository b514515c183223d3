// The host-memory transport (core/host_transport.h): setup of the shared pinned segment and of
// host-copy's resources. The host algorithms' launches are in core/launch.cc.
#include "core/host_transport.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/env.h"
#include "base/error.h"
#include "base/log.h"
#include "base/names.h"
#include "bootstrap/bootstrap.h"
#include "core/context.h"

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

void HostTransport::init() {
  ctx_.facts.hostMemory = false;
  if (const char* refusal = ctx_.localTransportRefusal("a single rank needs no transport")) {
    ctx_.facts.hostMemoryReason = refusal;
    return;
  }
  // Rank 0's choice counts for everyone (the environment may differ between processes).
  const HostSettings agreed = agreeHostSettings(*ctx_.bs, ctx_.rank);
  if (!agreed.enabled) {
    ctx_.facts.hostMemoryReason = "disabled by ANYR_HOST_MEMORY=0";
    return;
  }
  hostLayout_ =
      computeHostLayout(agreed.launchBytes, ctx_.nranks, agreed.llBytes, agreed.copyChunkBytes);
  ctx_.cfg.hostLowLatencyBytes = hostLayout_.llMaxBytes;
  ctx_.cfg.hostLowLatencyEagerBytes = std::min(agreed.llEagerBytes, hostLayout_.llMaxBytes);
  ctx_.cfg.hostCopyChunkBytes = hostLayout_.copyChunkBytes;
  ctx_.cfg.hostLaunchBytes = hostLayout_.launchBytes;
  // Each rank's region on its GPU's NUMA node (the topology's nodes, gathered from every rank
  // at init), rank 0's ANYR_HOST_NUMA deciding for everyone.
  HostPlacement placement;
  placement.rankBytes = hostLayout_.rankBytes;
  for (int r = 0; r < ctx_.nranks; ++r) {
    placement.wanted.push_back(ctx_.topo.gpus[static_cast<size_t>(r)].numaNode);
  }
  if (!agreed.numa) placement.refusal = "NUMA placement turned off (ANYR_HOST_NUMA=0)";
  std::string why;
  host_ = createHostMemory(*ctx_.bs, hostLayout_.totalBytes, &placement, &why);
  if (!host_) {
    ctx_.facts.hostMemoryReason = "shared host memory could not be set up: " + why;
    ANYR_LOG(Warn, ctx_.rank, ctx_.facts.hostMemoryReason);
    return;
  }
  ctx_.facts.hostRegionNodes = placement.placed;
  ctx_.facts.hostPlacement = describeHostPlacement(placement);
  ANYR_LOG(Info, ctx_.rank, "host segment: " << ctx_.facts.hostPlacement);
  // The own region's header (the segment starts zeroed: flags are 0, no one aborted).
  char* mine = host_->host() + static_cast<uint64_t>(ctx_.rank) * hostLayout_.rankBytes;
  const WorkspaceHeader h = ctx_.headerOfThisRank(0);
  std::memcpy(mine + hostLayout_.headerOffset, &h, sizeof(h));

  ANYR_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&dHostState_), sizeof(LocalState)));
  ANYR_CUDA_CHECK(cudaMemsetAsync(dHostState_, 0, sizeof(LocalState), ctx_.internalStream));
  // ANYR_TEST_HOST_LL_COUNT (tests only): the low-latency protocol's launch count starts at the
  // value, and the own lines carry it as their tag, as a sweep at that count would have left
  // them; the ranks' calls then cross the count's wrap and the sweeps.
  const int64_t llCount = ctx_.testValueOfRank0("ANYR_TEST_HOST_LL_COUNT", UINT32_MAX);
  std::vector<uint32_t> llSlots;
  if (llCount >= 0) {
    tagLowLatencyLines(mine + hostLayout_.llOffset, hostLayout_, static_cast<uint32_t>(llCount));
    llSlots.assign(static_cast<size_t>(kMaxBlocks), static_cast<uint32_t>(llCount));
    ANYR_CUDA_CHECK(cudaMemcpyAsync(dHostState_->llUse, llSlots.data(),
                                    llSlots.size() * sizeof(uint32_t), cudaMemcpyHostToDevice,
                                    ctx_.internalStream));
    ANYR_LOG(Warn, ctx_.rank,
             "ANYR_TEST_HOST_LL_COUNT: the low-latency launch count starts at " << llCount);
  }
  ctx_.waitStreamIdle(ctx_.internalStream, "clearing the host transport's state");
  char* dev = host_->device();
  WorkspaceHeader* headers[kMaxLocalRanks] = {};
  for (int r = 0; r < ctx_.nranks; ++r) {
    headers[r] = reinterpret_cast<WorkspaceHeader*>(
        dev + static_cast<uint64_t>(r) * hostLayout_.rankBytes + hostLayout_.headerOffset);
  }
  dHostWait_ = ctx_.newWaitControl(dHostState_, headers[ctx_.rank], headers);

  std::memset(&hostTemplate_, 0, sizeof(hostTemplate_));
  hostTemplate_.base = dev;
  hostTemplate_.layout = hostLayout_;
  hostTemplate_.wait = dHostWait_;
  hostTemplate_.state = dHostState_;
  hostTemplate_.rank = ctx_.rank;
  hostTemplate_.nranks = ctx_.nranks;
  hostTemplate_.wire = static_cast<int32_t>(ctx_.cfg.wire);
  hostTemplate_.roundVecs = agreed.roundVecs;
  initHostCopy();
  ctx_.bs->barrier();  // every header written before any kernel may look at it
  ctx_.facts.hostMemory = true;
  ctx_.facts.hostMemoryReason = "shared pinned host segment of " +
                                std::to_string(hostLayout_.totalBytes) +
                                " bytes mapped by every rank";
}

void HostTransport::initHostCopy() {
  // Device staging of the host-copy algorithm: the own compressed chunks (compressed wire),
  // and every peer's chunks of one launch, copied in from host memory before the reduction:
  // n x copyBytes in all (copyBytes: a launch plus one copy chunk, 18 MiB with the default 16 MiB
  // launch and 2 MiB chunks: 36 MiB at 2 ranks, 144 MiB at 8).
  const uint64_t slot = hostLayout_.copyBytes;
  ANYR_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&copy_.sendStage), slot));
  ANYR_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&copy_.recvStage),
                             slot * static_cast<uint64_t>(ctx_.nranks - 1)));
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

void HostTransport::freeHostCopy() {
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

void HostTransport::release() {
  freeHostCopy();
  host_.reset();
  if (dHostState_ != nullptr) (void)cudaFree(dHostState_);
  if (dHostWait_ != nullptr) (void)cudaFree(dHostWait_);
  dHostState_ = nullptr;
  dHostWait_ = nullptr;
}

void HostTransport::explainHost(void* json) const {
  nlohmann::json& j = *static_cast<nlohmann::json*>(json);
  j["hostTransport"] = {{"available", ctx_.facts.hostMemory},
                        {"reason", ctx_.facts.hostMemoryReason},
                        {"wire", wireName(ctx_.cfg.wire)},
                        {"lowLatencyMaxBytes", hostLayout_.llMaxBytes},
                        {"lowLatencyEagerMaxBytes", ctx_.cfg.hostLowLatencyEagerBytes},
                        {"copyChunkBytes", hostLayout_.copyChunkBytes},
                        {"launchBytes", hostLayout_.launchBytes}};
  if (host_) {
    j["hostTransport"]["segmentBytes"] = hostLayout_.totalBytes;
    std::vector<int> gpuNodes;
    for (const GpuInfo& g : ctx_.topo.gpus) gpuNodes.push_back(g.numaNode);
    j["hostTransport"]["numa"] = {{"regionNodes", ctx_.facts.hostRegionNodes},
                                  {"gpuNodes", gpuNodes},
                                  {"placement", ctx_.facts.hostPlacement}};
  }
}

}  // namespace anyr
