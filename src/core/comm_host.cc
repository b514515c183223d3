// The communicator's host-memory transport: setup of the shared pinned segment and launches of
// the host algorithms (src/algo/host_oneshot.cu, host_twoshot.cu). Set up on every
// single-host communicator of 2..8 ranks (unless ANYR_HOST_MEMORY=0), whether or not the GPUs
// have peer access: admission decides when it is the default, and tests can force it anywhere.
#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "algo/algo.h"
#include "core/comm.h"
#include "core/env.h"
#include "core/error.h"
#include "core/log.h"

namespace anyr {

HostLayout computeHostLayout(uint64_t chunkBytes, int nranks, uint64_t llMaxBytes) {
  HostLayout l{};
  const uint64_t page = 4096;
  const uint64_t n = static_cast<uint64_t>(nranks > 0 ? nranks : 1);
  l.launchBytes = chunkBytes;
  l.headerOffset = 0;
  l.flagsOffset = page;
  l.dataOffset = roundUp(l.flagsOffset + sizeof(HostFlags), page);
  l.dataBytes = roundUp(chunkBytes, page);
  l.resultOffset = l.dataOffset + 2 * l.dataBytes;
  // One segment (rounded up to whole block quanta, see host_twoshot.cu) plus slack.
  l.resultBytes = roundUp(chunkBytes / n + (64u << 10), page);
  l.llMaxBytes = std::min(llMaxBytes, chunkBytes);
  l.llOffset = l.resultOffset + 2 * l.resultBytes;
  l.llBytes = roundUp(2 * l.llMaxBytes, page);
  l.rankBytes = roundUp(l.llOffset + 2 * l.llBytes, page);
  l.totalBytes = l.rankBytes * n;
  return l;
}

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
  int32_t agreed[3] = {env::getInt("ANYR_HOST_MEMORY") != 0 ? 1 : 0,
                       static_cast<int32_t>(env::getInt("ANYR_HOST_ROUND")),
                       static_cast<int32_t>(env::getInt("ANYR_HOST_LL_BYTES"))};
  bs_->broadcast(agreed, sizeof(agreed), 0);
  const int32_t enabled = agreed[0];
  if (agreed[1] < 1 || agreed[1] > 64) {
    throwError(anyrInvalidArgument, "environment variable ANYR_HOST_ROUND=" +
                                        std::to_string(agreed[1]) + " (rank 0's): must be 1..64");
  }
  if (agreed[2] < 0 || agreed[2] > (1 << 20) || agreed[2] % 16 != 0) {
    throwError(anyrInvalidArgument,
               "environment variable ANYR_HOST_LL_BYTES=" + std::to_string(agreed[2]) +
                   " (rank 0's): must be a multiple of 16 in 0..1048576");
  }
  if (!enabled) {
    facts_.hostMemoryReason = "disabled by ANYR_HOST_MEMORY=0";
    return;
  }
  hostLayout_ = computeHostLayout(cfg_.chunkBytes, nranks_, static_cast<uint64_t>(agreed[2]));
  cfg_.hostLowLatencyBytes = hostLayout_.llMaxBytes;
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
  ANYR_CUDA_CHECK(cudaMemset(dHostState_, 0, sizeof(LocalState)));
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
  hostTemplate_.roundVecs = agreed[1];
  bs_->barrier();  // every header written before any kernel may look at it
  facts_.hostMemory = true;
  facts_.hostMemoryReason = "shared pinned host segment of " +
                            std::to_string(hostLayout_.totalBytes) + " bytes mapped by every rank";
}

void Communicator::launchHostAlgo(anyrAlgo_t algo, const void* in, void* out, size_t count,
                                  anyrDataType_t dtype, cudaStream_t stream) {
  if (!host_) throwError(anyrInternalError, "launchHostAlgo: no host transport");
  // One-shot messages of at most llMaxBytes with the native wire take the low-latency protocol
  // (one PCIe round trip instead of two); the decision depends only on agreed values and the
  // call's count, so every rank takes the same one.
  const bool ll = algo == anyrAlgoHostOneShot && hostTemplate_.wire == kWireNative &&
                  count * dtypeSize(dtype) <= hostLayout_.llMaxBytes;
  launchInPieces(algo, hostTemplate_, in, out, count, dtype, hostLayout_.launchBytes,
                 [&](const HostArgs& a, const LaunchShape& shape) {
                   if (ll) return launchHostOneShotLL(dtype, a, shape, stream);
                   return algo == anyrAlgoHostOneShot ? launchHostOneShot(dtype, a, shape, stream)
                                                      : launchHostTwoShot(dtype, a, shape, stream);
                 });
}

void Communicator::explainHost(void* json) const {
  nlohmann::json& j = *static_cast<nlohmann::json*>(json);
  j["hostTransport"] = {{"available", facts_.hostMemory},
                        {"reason", facts_.hostMemoryReason},
                        {"wire", wireName(cfg_.wire)},
                        {"lowLatencyMaxBytes", hostLayout_.llMaxBytes}};
  if (host_) j["hostTransport"]["segmentBytes"] = hostLayout_.totalBytes;
}

}  // namespace anyr
