#include "core/comm.h"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "algo/algo.h"
#include "base/env.h"
#include "base/error.h"
#include "base/log.h"
#include "base/names.h"
#include "base/validate.h"
#include "core/selftest.h"
#include "fused/fused.h"
#include "fused/fused_algo.h"
#include "topology/nvml.h"
#include "topology/probe.h"
#include "topology/probe_kernels.h"
#include "transport/check.h"
#include "transport/nccl_comm.h"

namespace anyr {

namespace {

using Clock = std::chrono::steady_clock;

// Serialized GPU description exchanged at init: JSON of a one-GPU topology, padded.
constexpr size_t kGpuInfoWire = 4096;

}  // namespace

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

uint64_t WorkspaceLayout::hash() const {
  const uint64_t fields[] = {headerOffset, flagsOffset,   checkOffset,   checkBytes,
                             pushOffset,   pushSlotBytes, stagingOffset, resultOffset,
                             chunkBytes,   tsOffset,      tsSlotBytes,   totalBytes};
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
  l.totalBytes = l.tsOffset + 3 * 2 * n * l.tsSlotBytes;
  return l;
}

// ---------------------------------------------------------------------------------------------
// Creation
// ---------------------------------------------------------------------------------------------

std::unique_ptr<Communicator> Communicator::create(std::unique_ptr<Bootstrap> bs, const Config& cfg,
                                                   ncclComm_t externalNccl) {
  std::unique_ptr<Communicator> c(new Communicator());
  c->init(std::move(bs), cfg, externalNccl);
  return c;
}

void Communicator::init(std::unique_ptr<Bootstrap> bs, const Config& cfg, ncclComm_t externalNccl) {
  bs_ = std::move(bs);
  rank_ = bs_->rank();
  nranks_ = bs_->size();
  if (nranks_ > kMaxRanks) {  // an NCCL communicator's size (anyrCommInitRank checks its own)
    throwError(anyrInvalidArgument, "argument 'ncclComm': " + std::to_string(nranks_) +
                                        " ranks; a communicator takes at most " +
                                        std::to_string(kMaxRanks));
  }
  ANYR_CUDA_CHECK(cudaGetDevice(&device_));
  ANYR_CUDA_CHECK(cudaStreamCreateWithFlags(&internalStream_, cudaStreamNonBlocking));
  ANYR_CUDA_CHECK(cudaEventCreateWithFlags(&lastWork_, cudaEventDisableTiming));

  // Host-mapped failure record and abort word: kernels write/read them without any host
  // synchronization; the host reads them on every call.
  ANYR_CUDA_CHECK(
      cudaHostAlloc(&hostMapped_, kHostMappedBytes, cudaHostAllocMapped | cudaHostAllocPortable));
  std::memset(hostMapped_, 0, kHostMappedBytes);
  hError_ = static_cast<ErrorRecord*>(hostMapped_);
  hAbort_ =
      reinterpret_cast<volatile int32_t*>(static_cast<char*>(hostMapped_) + sizeof(ErrorRecord));
  void* dMapped = nullptr;
  ANYR_CUDA_CHECK(cudaHostGetDevicePointer(&dMapped, hostMapped_, 0));
  dError_ = static_cast<ErrorRecord*>(dMapped);
  dAbort_ = reinterpret_cast<const int32_t*>(static_cast<char*>(dMapped) + sizeof(ErrorRecord));

  agreeConfig(cfg);
  calls_.init(*bs_, validateCallsFromEnv());
  // Scratch for the unfused composition of the fused op when normOut is NULL: at least 128
  // rows of the widest hidden size.
  scratchBytes_ = std::max<size_t>(cfg_.chunkBytes, 128ull * 16384 * 4);
  ANYR_CUDA_CHECK(cudaMalloc(&scratch_, scratchBytes_));
  exchangeDeviceInfo();
  // Every block of a launch must be resident at once on every rank (blocks wait on the
  // same-index block of peers). Fused and host kernels: at most one block per SM of the
  // smallest GPU. The peer all-reduce kernels (small blocks, few registers): as many per SM as
  // the occupancy of every variant allows on every rank, at most kPeerBlocksPerSm.
  int minSm = 1 << 30;
  for (const GpuInfo& g : topo_.gpus) minSm = std::min(minSm, g.smCount > 0 ? g.smCount : 1);
  maxBlocks_ = std::min(minSm, kMaxBlocks);
  // The fused two-shot's register form likewise (at most kFusedDensePerSm) in blocks of
  // kFusedDenseThreads threads, for launches of more rows than SMs (fusedTwoShotShape); and
  // the cluster forms at two blocks per SM, per kernel variant (form x dtype x quantization;
  // fusedClusterPairBlocks). One gather agrees on all of them.
  struct PerSm {
    int32_t peer, fused;
    int32_t pairThreads[kClusterPairVariants];
  };
  PerSm perSm{kPeerBlocksPerSm, kFusedDensePerSm, {}};
  for (const AlgoInfo& r : algoRegistry()) {
    if (r.residentPerSm != nullptr) ANYR_CUDA_CHECK(r.residentPerSm(&perSm.peer));
  }
  ANYR_CUDA_CHECK(fusedTwoShotDenseResidentPerSm(&perSm.fused));
  for (anyrAlgo_t algo : {anyrAlgoOneShotPush, anyrAlgoTwoShotPush}) {
    for (anyrDataType_t dt : {anyrFloat16, anyrBfloat16}) {
      for (int q : {anyrQuantNone, anyrQuantFp8, anyrQuantNvfp4}) {
        int threads = kFusedClusterMaxThreads;
        ANYR_CUDA_CHECK(algo == anyrAlgoOneShotPush
                            ? fusedOneShotClusterPairThreads(dt, q, &threads)
                            : fusedTwoShotClusterPairThreads(dt, q, &threads));
        perSm.pairThreads[clusterPairVariant(algo, dt, q)] = threads;
      }
    }
  }
  for (const PerSm& o : bs_->allGatherValue(perSm)) {
    perSm.peer = std::min(perSm.peer, o.peer);
    perSm.fused = std::min(perSm.fused, o.fused);
    for (int v = 0; v < kClusterPairVariants; ++v) {
      perSm.pairThreads[v] = std::min(perSm.pairThreads[v], o.pairThreads[v]);
    }
  }
  for (int v = 0; v < kClusterPairVariants; ++v) {
    clusterPairThreads_[static_cast<size_t>(v)] = perSm.pairThreads[v];
  }
  // Not where ranks share a GPU: their grids would need four blocks per SM at once.
  clusterPairBlocks_ = facts_.distinctDevices ? std::min(minSm * 2, kMaxBlocks) : 0;
  peerPerSm_ = std::max(1, static_cast<int>(perSm.peer));
  peerBlocks_ = std::min(minSm * peerPerSm_, kMaxBlocks);
  fusedDenseBlocks_ = std::min(minSm * std::max(1, static_cast<int>(perSm.fused)), kMaxBlocks);
  if (cfg_.maxBlocks > 0) {
    maxBlocks_ = std::min(maxBlocks_, cfg_.maxBlocks);
    peerBlocks_ = std::min(peerBlocks_, cfg_.maxBlocks);
    fusedDenseBlocks_ = std::min(fusedDenseBlocks_, cfg_.maxBlocks);
    clusterPairBlocks_ = std::min(clusterPairBlocks_, cfg_.maxBlocks);
  }
  if (clusterPairBlocks_ <= maxBlocks_) clusterPairBlocks_ = 0;
  initNccl(externalNccl);
  initTransport();
  checkTransport();
  initHostTransport();
  probeProgrammaticLaunch();
  probeClusters();
  probeNvfp4Encoder();
  decide();
  loadOrTuneAtInit();
  startEpochsForTests();
  bs_->barrier();
  callCount_ = 0;  // the application's calls are numbered from 1 (init made some of its own)
  ANYR_LOG(
      Info, rank_,
      "communicator ready: " << nranks_ << " ranks, device " << device_ << ", " << cfg_.describe());
}

// A tests-only variable's value, rank 0's (-1 when unset there), checked on every rank after
// the broadcast, so that a malformed or out-of-range value fails every rank together rather
// than leaving the others waiting in the broadcast.
int64_t Communicator::testValueOfRank0(const char* name, int64_t max) {
  struct {
    int64_t value;
    int32_t state;  // 0 unset, 1 set, 2 not an integer
    int32_t pad;
  } w{-1, 0, 0};
  if (rank_ == 0 && !env::getString(name).empty()) {
    try {
      w.value = env::getInt(name);
      w.state = 1;
    } catch (const Error&) {
      w.state = 2;
    }
  }
  bs_->broadcast(&w, sizeof(w), 0);
  if (w.state == 0) return -1;
  if (w.state == 2 || w.value < 0 || w.value > max) {
    throwError(anyrInvalidArgument,
               std::string("environment variable ") + name +
                   (w.state == 1 ? "=" + std::to_string(w.value) : std::string()) +
                   " (rank 0's): must be an integer in 0.." + std::to_string(max));
  }
  return w.value;
}

// ANYR_TEST_SYNC_EPOCH and ANYR_TEST_PUSH_EPOCH (tests only): the flag algorithms' epoch
// (syncEpoch, device and host transport; flags left as they are), and the push families' epoch
// for the next launch, so that a test's calls run with flags 2^31 launches old or cross the
// push count's wrap. For the push epoch every phase of the push areas is cleared first, as a
// launch of any epoch expects of its current phase.
void Communicator::startEpochsForTests() {
  auto fill = [&](uint32_t* slots, int64_t value) {
    const std::vector<uint32_t> e(static_cast<size_t>(kMaxBlocks), static_cast<uint32_t>(value));
    ANYR_CUDA_CHECK(cudaMemcpyAsync(slots, e.data(), e.size() * sizeof(uint32_t),
                                    cudaMemcpyHostToDevice, internalStream_));
    waitStreamIdle(internalStream_, "setting a test epoch");
  };
  const int64_t sync = testValueOfRank0("ANYR_TEST_SYNC_EPOCH", UINT32_MAX);
  if (sync >= 0) {
    for (LocalState* st : {dState_, dHostState_}) {
      if (st != nullptr) fill(st->syncEpoch, sync);
    }
  }
  const int64_t push = testValueOfRank0("ANYR_TEST_PUSH_EPOCH", kPushEpochPeriod - 1);
  if (push < 0 || !facts_.peerMemory) return;
  clearPushAreas(internalStream_);
  fill(dState_->pushEpoch, push);
  fill(dState_->tsEpoch, push);
  ANYR_LOG(Warn, rank_, "ANYR_TEST_PUSH_EPOCH: push epochs start at " << push);
}

// A probe's round trip on the internal stream: `bytes` of zeroed device memory (stream-ordered,
// so no device-wide synchronization), `launch` on them, read back into `hostOut`; every wait
// bounded (waitStreamIdle), none behind other work on the GPU. Returns the launch's own error (a
// refused launch leaves no sticky error, and hostOut then holds what the memset left); throws
// on any other failure.
cudaError_t Communicator::probeOnStream(
    const char* what, size_t bytes, void* hostOut,
    const std::function<cudaError_t(void*, cudaStream_t)>& launch) {
  void* d = nullptr;
  ANYR_CUDA_CHECK(cudaMallocAsync(&d, bytes, internalStream_));
  cudaError_t e = cudaMemsetAsync(d, 0, bytes, internalStream_);
  if (e == cudaSuccess) {
    e = launch(d, internalStream_);
    if (e != cudaSuccess) (void)cudaGetLastError();
  } else {
    (void)cudaFreeAsync(d, internalStream_);
    ANYR_CUDA_CHECK(e);
  }
  waitStreamIdle(internalStream_, what);
  // The stream is idle: this copy (to pageable memory, so it returns when done) waits for
  // nothing else.
  const cudaError_t c = cudaMemcpyAsync(hostOut, d, bytes, cudaMemcpyDeviceToHost, internalStream_);
  (void)cudaFreeAsync(d, internalStream_);
  ANYR_CUDA_CHECK(c);
  waitStreamIdle(internalStream_, what);
  return e;
}

void Communicator::probeProgrammaticLaunch() {
  if (env::getInt("ANYR_PDL") == 0) {
    pdlReason_ = "off (ANYR_PDL=0); not probed";
    return;
  }
  int got = 0;
  const cudaError_t e = probeOnStream(
      "the programmatic-launch probe", sizeof(int), &got, [](void* word, cudaStream_t s) {
        return probekernels::launchDependentPair(static_cast<int*>(word), s);
      });
  pdlOn_ = e == cudaSuccess && got == 2;
  if (e != cudaSuccess) {
    pdlReason_ = std::string("the probe launch was refused: ") + cudaGetErrorString(e);
  } else if (got != 2) {
    pdlReason_ = "the probe's second kernel read " + std::to_string(got - 1) +
                 " where the first had written 1";
  } else {
    pdlReason_ = "the probe launch worked";
  }
  // Each peer, host and fused kernel then releases the next launch right after its own wait
  // (the fused two-shot's dense shape excepted: launchFusedRows).
  argsTemplate_.releaseEarly = pdlOn_ && env::getInt("ANYR_PDL_EARLY") != 0 ? 1 : 0;
  hostTemplate_.releaseEarly = argsTemplate_.releaseEarly;
}

void Communicator::probeNvfp4Encoder() {
  int got = -1;
  ANYR_CUDA_CHECK(
      probeOnStream("the NVFP4 encoder probe", sizeof(int), &got, [](void* word, cudaStream_t s) {
        return launchE2m1InstructionProbe(static_cast<int*>(word), s);
      }));
  if (got != 0 && got != 1) {
    throwError(anyrCudaError,
               "the NVFP4 encoder probe's kernel wrote " + std::to_string(got) + ", not 0 or 1");
  }
  nvfp4Instruction_ = got == 1;
  nvfp4Reason_ =
      nvfp4Instruction_
          ? "the machine code this GPU runs has the e2m1 conversion instruction (a family-specific "
            "build target: ANYR_CUDA_FAMILY_TARGETS)"
          : "fp32 arithmetic: the machine code this GPU runs has no e2m1 conversion instruction "
            "(compute capability 10.0 to 12.x and a family-specific build target have it: "
            "ANYR_CUDA_FAMILY_TARGETS)";
}

void Communicator::probeClusters() {
  // Every rank probes (its GPU may differ), then all agree: a launch shape that differs
  // between ranks is harmless to the protocol, but every choice is the communicator's.
  struct Vote {
    int32_t ok;
  };
  Vote mine{0};
  std::string why;
  if (cfg_.fusedCluster == 1) {
    why = "off (config.fusedCluster / ANYR_FUSED_CLUSTER = 1); not probed";
  } else if (!topo_.gpus.empty() && !topo_.gpus[static_cast<size_t>(rank_)].clusterLaunch) {
    why = "the GPU has no thread-block clusters (cudaDevAttrClusterLaunch = 0)";
  } else {
    unsigned int got[4] = {0, 0, 0, 0};
    const cudaError_t e =
        probeOnStream("the cluster probe", sizeof(got), got, [](void* out, cudaStream_t s) {
          return probekernels::launchClusterExchange(static_cast<unsigned int*>(out), s);
        });
    if (e != cudaSuccess) {
      why = std::string("the probe's cluster launch was refused: ") + cudaGetErrorString(e);
    } else if (got[0] != 0x5101u || got[1] != 0x5100u) {
      std::ostringstream os;
      os << "the probe's blocks read 0x" << std::hex << got[0] << " and 0x" << got[1]
         << " through distributed shared memory, not 0x5101 and 0x5100";
      why = os.str();
    } else if (got[2] != 0x5201u || got[3] != 0x5200u) {
      std::ostringstream os;
      os << "the probe's blocks received 0x" << std::hex << got[2] << " and 0x" << got[3]
         << " by asynchronous stores into each other's shared memory (st.async with an "
            "mbarrier), not 0x5201 and 0x5200";
      why = os.str();
    } else {
      mine.ok = 1;
      why =
          "the probe's cluster launch, distributed shared memory and asynchronous stores "
          "into a peer block's shared memory worked";
    }
  }
  const std::vector<Vote> votes = bs_->allGatherValue(mine);
  clusterOn_ = true;
  for (size_t r = 0; r < votes.size(); ++r) {
    if (votes[r].ok == 0) {
      clusterOn_ = false;
      if (static_cast<int>(r) != rank_ && mine.ok != 0) {
        why = "rank " + std::to_string(r) + "'s probe did not pass";
      }
    }
  }
  clusterReason_ = why;
}

std::string Communicator::clusterPairThreadsJson() const {
  nlohmann::json j = nlohmann::json::object();
  for (anyrAlgo_t algo : {anyrAlgoOneShotPush, anyrAlgoTwoShotPush}) {
    nlohmann::json byType = nlohmann::json::object();
    for (anyrDataType_t dt : {anyrFloat16, anyrBfloat16}) {
      nlohmann::json byQuant = nlohmann::json::object();
      for (int q : {0, 1, 2}) {
        byQuant[quantName(q)] = clusterPairThreads(algo, dt, q);
      }
      byType[dtypeShortName(dt)] = byQuant;
    }
    j[anyrAlgoName(algo)] = byType;
  }
  return j.dump();
}

std::vector<std::pair<int, int>> Communicator::clusterSizeSamples() const {
  std::vector<std::pair<int, int>> out;
  for (int rows : {1, 8, 16, 32, 64, 96, 128}) {
    out.emplace_back(
        rows, clusterOn_
                  ? fusedClusterSize(rows, kClusterSampleHidden, maxBlocks_, cfg_.fusedCluster,
                                     clusterGridCap(kClusterSampleHidden, 2, 0, anyrAlgoOneShotPush,
                                                    anyrBfloat16, 0))
                  : 1);
  }
  return out;
}

void Communicator::agreeConfig(const Config& local) {
  // Rank 0's resolved configuration is the communicator's; a rank whose own differs is told.
  Config::Wire w = local.toWire();
  bs_->broadcast(&w, sizeof(w), 0);
  cfg_ = Config::fromWire(w);
  // Rank-local: only rank 0's are used, and the tuning step broadcasts what it decides.
  cfg_.tuningFile = local.tuningFile;
  cfg_.tuneBudgetMs = local.tuneBudgetMs;
  if (!(cfg_ == local)) {
    ANYR_LOG(Warn, rank_,
             "this rank's configuration (" << local.describe()
                                           << ") differs from rank 0's; using rank 0's ("
                                           << cfg_.describe() << ")");
  }
}

void Communicator::exchangeDeviceInfo() {
  Topology mine;
  mine.gpus.push_back(probeGpu(device_));
  mine.gpus[0].index = rank_;
  mine.resizePairs();
  std::string text = topologyToJson(mine, -1);
  if (text.size() >= kGpuInfoWire) {
    throwError(anyrInternalError,
               "GPU description too long to exchange (" + std::to_string(text.size()) + " bytes)");
  }
  std::vector<char> buf(kGpuInfoWire, 0);
  std::memcpy(buf.data(), text.data(), text.size());
  std::vector<char> all(kGpuInfoWire * static_cast<size_t>(nranks_));
  bs_->allGather(buf.data(), all.data(), kGpuInfoWire);

  topo_ = Topology();
  topo_.source = "communicator";
  topo_.hostName = mine.hostName;
  int drv = 0, rt = 0;
  (void)cudaDriverGetVersion(&drv);
  (void)cudaRuntimeGetVersion(&rt);
  topo_.cudaDriverVersion = drv;
  topo_.driverVersion = nvml::driverVersion();  // a tuning table's fingerprint names it
  topo_.cudaRuntimeVersion = rt;
  for (int r = 0; r < nranks_; ++r) {
    const char* p = all.data() + kGpuInfoWire * static_cast<size_t>(r);
    Topology t = topologyFromJson(std::string(p, strnlen(p, kGpuInfoWire)));
    if (t.gpus.size() != 1) {
      throwError(anyrRemoteError,
                 "rank " + std::to_string(r) + " sent a malformed GPU description");
    }
    topo_.gpus.push_back(t.gpus[0]);
  }
  topo_.resizePairs();

  facts_.nranks = nranks_;
  facts_.sameHost = true;
  facts_.distinctDevices = true;
  for (int r = 0; r < nranks_; ++r) {
    if (topo_.gpus[static_cast<size_t>(r)].hostHash != topo_.gpus[0].hostHash)
      facts_.sameHost = false;
    for (int q = 0; q < r; ++q) {
      if (topo_.gpus[static_cast<size_t>(r)].pciBusId ==
              topo_.gpus[static_cast<size_t>(q)].pciBusId &&
          topo_.gpus[static_cast<size_t>(r)].hostHash ==
              topo_.gpus[static_cast<size_t>(q)].hostHash) {
        facts_.distinctDevices = false;
      }
    }
  }
  // Driver-reported facts for this rank's row, then everyone's rows. Across hosts every pair
  // but a rank with itself has no link of ours, so nothing is exchanged.
  if (!facts_.sameHost) {
    for (int s = 0; s < nranks_; ++s) {
      for (int d = 0; d < nranks_; ++d)
        topo_.pair(s, d).link = s == d ? LinkType::Self : LinkType::None;
    }
    return;
  }
  struct PairWire {
    int32_t link, nvlinkCount, driverPeerAccess, driverAtomics;
    double linkGBps;
    char relation[16];
  };
  static_assert(sizeof(PairWire) == 40, "PairWire layout");
  std::vector<PairWire> row(static_cast<size_t>(nranks_));
  for (int d = 0; d < nranks_; ++d) {
    PairWire& w = row[static_cast<size_t>(d)];
    std::memset(&w, 0, sizeof(w));
    if (d == rank_) {
      w.link = static_cast<int32_t>(LinkType::Self);
      continue;
    }
    PairInfo p = describePair(device_, topo_.gpus[static_cast<size_t>(rank_)],
                              topo_.gpus[static_cast<size_t>(d)]);
    w.link = static_cast<int32_t>(p.link);
    w.nvlinkCount = p.nvlinkCount;
    w.driverPeerAccess = p.driverPeerAccess;
    w.driverAtomics = p.driverAtomics;
    w.linkGBps = p.linkGBps;
    std::snprintf(w.relation, sizeof(w.relation), "%s", p.pcieRelation.c_str());
  }
  std::vector<PairWire> allRows(static_cast<size_t>(nranks_) * static_cast<size_t>(nranks_));
  bs_->allGather(row.data(), allRows.data(), sizeof(PairWire) * static_cast<size_t>(nranks_));
  for (int s = 0; s < nranks_; ++s) {
    for (int d = 0; d < nranks_; ++d) {
      const PairWire& w = allRows[static_cast<size_t>(s * nranks_ + d)];
      PairInfo& p = topo_.pair(s, d);
      p.link = static_cast<LinkType>(w.link);
      p.nvlinkCount = w.nvlinkCount;
      p.driverPeerAccess = w.driverPeerAccess != 0;
      p.driverAtomics = w.driverAtomics != 0;
      p.linkGBps = w.linkGBps;
      p.pcieRelation = std::string(w.relation, strnlen(w.relation, sizeof(w.relation)));
    }
  }
}

void Communicator::initNccl(ncclComm_t externalNccl) {
  std::string why;
  ncclComm_t comm = nullptr;
  if (externalNccl != nullptr) {
    comm = externalNccl;
  } else if (!cfg_.useNccl) {
    why = "disabled by configuration (ANYR_USE_NCCL=0)";
  } else if (!facts_.distinctDevices) {
    why = "ranks share a GPU (NCCL needs one rank per GPU)";
  } else {
    comm = createNcclComm(*bs_, cfg_.timeoutMs, &why);
  }
  // NCCL is usable only if it is usable on every rank.
  struct Vote {
    int32_t ok;
    char why[124];
  };
  Vote mine{};
  mine.ok = comm != nullptr;
  std::snprintf(mine.why, sizeof(mine.why), "%s", why.c_str());
  std::vector<Vote> votes;
  try {
    votes = bs_->allGatherValue(mine);
  } catch (...) {
    // Init fails here (a peer gone): the communicator NCCL made is not kept, so release it.
    if (comm != nullptr && externalNccl == nullptr) releaseNcclComm(comm, false);
    throw;
  }
  facts_.ncclAvailable = true;
  for (int r = 0; r < nranks_; ++r) {
    if (!votes[static_cast<size_t>(r)].ok) {
      facts_.ncclAvailable = false;
      facts_.ncclReason = "rank " + std::to_string(r) + ": " +
                          std::string(votes[static_cast<size_t>(r)].why,
                                      strnlen(votes[static_cast<size_t>(r)].why, sizeof(mine.why)));
      break;
    }
  }
  if (facts_.ncclAvailable) {
    nccl_.adopt(comm, externalNccl == nullptr, rank_, device_,
                [this](anyrResult_t code, const std::string& msg) { setFailed(code, msg); });
  } else if (comm != nullptr && externalNccl == nullptr) {
    releaseNcclComm(comm, true);
  }
}

void Communicator::initTransport() {
  facts_.peerMemory = false;
  if (nranks_ < 2) {
    facts_.peerMemoryReason = "a single rank needs no peer memory";
    return;
  }
  if (nranks_ > kMaxLocalRanks || !facts_.sameHost) {
    facts_.peerMemoryReason =
        nranks_ > kMaxLocalRanks ? "more than 8 ranks" : "ranks on several hosts";
    return;
  }
  // Diagnostic: behave as GPUs without peer access (rank 0's setting, through the agreed
  // configuration, counts for everyone).
  if (cfg_.peerMemory == anyrPeerMemoryNone) {
    facts_.peerMemoryReason = "disabled by config.peerMemory / ANYR_PEER_MEMORY=none";
    return;
  }
  layout_ = computeLayout(cfg_, nranks_);
  mapPeerMemory();
  if (!peers_) return;
  char* base = peers_->local();
  // Header, zeroed flags and check area, cleared push buffers.
  const WorkspaceHeader h = headerOfThisRank(layout_.hash());
  ANYR_CUDA_CHECK(cudaMemsetAsync(base, 0, layout_.pushOffset, internalStream_));
  ANYR_CUDA_CHECK(cudaMemcpyAsync(base + layout_.headerOffset, &h, sizeof(h),
                                  cudaMemcpyHostToDevice, internalStream_));
  clearPushAreas(internalStream_);
  ANYR_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&dState_), sizeof(LocalState)));
  ANYR_CUDA_CHECK(cudaMemsetAsync(dState_, 0, sizeof(LocalState), internalStream_));
  waitStreamIdle(internalStream_, "clearing the workspace");
  facts_.peerMemory = true;

  // Kernel argument template.
  std::memset(&argsTemplate_, 0, sizeof(argsTemplate_));
  for (int r = 0; r < nranks_; ++r) argsTemplate_.peerWorkspace[r] = peers_->peer(r);
  argsTemplate_.layout = layout_;
  WorkspaceHeader* peerHeaders[kMaxLocalRanks] = {};
  for (int r = 0; r < nranks_; ++r) {
    peerHeaders[r] =
        peers_->peer(r) ? reinterpret_cast<WorkspaceHeader*>(peers_->peer(r)) : nullptr;
  }
  dWait_ = newWaitControl(dState_, reinterpret_cast<WorkspaceHeader*>(base + layout_.headerOffset),
                          peerHeaders);
  argsTemplate_.wait = dWait_;
  argsTemplate_.state = dState_;
  argsTemplate_.rank = rank_;
  argsTemplate_.nranks = nranks_;
  argsTemplate_.pushFence = env::getInt("ANYR_PUSH_FENCE") != 0 ? 1 : 0;
  argsTemplate_.wire = static_cast<int32_t>(cfg_.wire);
}

Communicator::MapSummary Communicator::summarize(const PeerMemory& m) {
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
  for (int p = 0; p < nranks_; ++p) {
    if (p == rank_) continue;
    if (m.peer(p) != nullptr) {
      ++mine.mapped;
      continue;
    }
    const PairInfo& pi = topo_.pair(rank_, p);
    if (pi.driverPeerAccess || pi.link == LinkType::Self) ++mine.reachableUnmapped;
    if (mine.firstFailed < 0) {
      mine.firstFailed = p;
      std::snprintf(mine.why, sizeof(mine.why), "%s", m.mapError(p).c_str());
    }
  }
  MapSummary out;
  std::string failure;
  const std::vector<Row> rows = bs_->allGatherValue(mine);
  for (int r = 0; r < nranks_; ++r) {
    const Row& row = rows[static_cast<size_t>(r)];
    out.mapped += row.mapped;
    out.reachableUnmapped += row.reachableUnmapped;
    if (failure.empty() && row.firstFailed >= 0) {
      failure = "; rank " + std::to_string(r) + " cannot map rank " +
                std::to_string(row.firstFailed) +
                "'s workspace: " + std::string(row.why, strnlen(row.why, sizeof(row.why)));
    }
  }
  out.text = std::to_string(out.mapped) + " of " + std::to_string(nranks_ * (nranks_ - 1)) +
             " ordered pairs mapped" + failure;
  return out;
}

void Communicator::mapPeerMemory() {
  const anyrPeerMemory_t want = cfg_.peerMemory;
  const bool forced = want != anyrPeerMemoryAuto;
  const std::string how = forced ? "forced by config.peerMemory / ANYR_PEER_MEMORY" : "auto";
  const int pairs = nranks_ * (nranks_ - 1);
  const FaultInjection fault = parseFaultInjection(env::getString("ANYR_FAULT_INJECT"));
  const bool failIpc = fault.kind == FaultInjection::IpcOpenFails && fault.rank == rank_;
  const bool coarseVmm = fault.kind == FaultInjection::VmmGranularity && fault.rank == rank_;
  // Releases `m` on every rank without freeing a region a peer still maps.
  auto release = [&](std::unique_ptr<PeerMemory>* m) {
    (*m)->unmapPeers();
    bs_->barrier();
    m->reset();
  };

  MapSummary ipc;
  if (want == anyrPeerMemoryCudaIpc || want == anyrPeerMemoryAuto) {
    peers_ = createIpcPeerMemory(*bs_, layout_.totalBytes, failIpc);
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
      createVmmPeerMemory(*bs_, layout_.totalBytes, cfg_.timeoutMs, coarseVmm, &vmmWhy);
  MapSummary v;  // null on every rank or on none
  if (vmm) v = summarize(*vmm);
  const std::string vmmText = vmm ? v.text : "not set up: " + vmmWhy;
  if (forced) {
    if (!vmm) {
      facts_.peerMemoryReason = "vmm (" + how + ") " + vmmText;
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
  peers_ = createIpcPeerMemory(*bs_, layout_.totalBytes, failIpc);
  peerMemoryNote_ = "cuda-ipc (auto): " + summarize(*peers_).text + " (vmm " + vmmText + ")";
}

std::string Communicator::peerMemoryText() const {
  return peers_ ? peerMemoryNote_ : "none (" + facts_.peerMemoryReason + ")";
}

WorkspaceHeader Communicator::headerOfThisRank(uint64_t layoutHash) const {
  WorkspaceHeader h{};
  h.magic = kWorkspaceMagic;
  h.layoutVersion = kWorkspaceLayoutVersion;
  h.rank = rank_;
  h.nranks = nranks_;
  h.layoutHash = layoutHash;
  return h;
}

WaitControl* Communicator::newWaitControl(LocalState* state, WorkspaceHeader* ownHeader,
                                          WorkspaceHeader* const* peerHeaders) {
  WaitControl w{};
  w.hostAbort = dAbort_;
  w.error = dError_;
  w.state = state;
  w.ownHeader = ownHeader;
  for (int r = 0; r < nranks_; ++r) w.peerHeaders[r] = peerHeaders[r];
  w.timeoutNs = static_cast<uint64_t>(cfg_.timeoutMs) * 1000000ull;
  w.rank = rank_;
  w.nranks = nranks_;
  WaitControl* d = nullptr;
  ANYR_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&d), sizeof(WaitControl)));
  // On the internal stream, bounded: cudaMemcpy would queue behind the application's work on
  // the legacy default stream. (A copy from pageable memory returns once it is staged.)
  waitStreamIdle(internalStream_, "the wait control's copy");
  ANYR_CUDA_CHECK(cudaMemcpyAsync(d, &w, sizeof(w), cudaMemcpyHostToDevice, internalStream_));
  waitStreamIdle(internalStream_, "the wait control's copy");
  return d;
}

void Communicator::clearPushAreas(cudaStream_t s) {
  char* base = peers_->local();
  // Three phases of one slot per rank (one-shot push), six of one segment slot per rank
  // (two-shot push: reduce-scatter and all-gather), all in the clear pattern (device/lamport.cuh).
  ANYR_CUDA_CHECK(launchFillWords(reinterpret_cast<uint32_t*>(base + layout_.pushOffset),
                                  3 * layout_.pushSlotBytes * static_cast<uint64_t>(nranks_) / 4,
                                  kPushClearWord, s));
  ANYR_CUDA_CHECK(launchFillWords(reinterpret_cast<uint32_t*>(base + layout_.tsOffset),
                                  6 * layout_.tsSlotBytes * static_cast<uint64_t>(nranks_) / 4,
                                  kPushClearWord, s));
}

void Communicator::checkTransport() {
  if (!facts_.peerMemory) return;
  // Real transfers over every mapped pair: this rank writes a pattern into every peer's area,
  // publishes one for peers to read, and (where the driver reports peer atomics) adds
  // atomically into every peer's counter; then each rank verifies what it received.
  std::random_device rd;
  uint32_t salt = 0;
  if (rank_ == 0) salt = rd();
  bs_->broadcast(&salt, sizeof(salt), 0);
  CheckArea* own = reinterpret_cast<CheckArea*>(peers_->local() + layout_.checkOffset);
  uint32_t* dCounts = nullptr;
  ANYR_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&dCounts),
                                  2 * kMaxLocalRanks * sizeof(uint32_t), internalStream_));
  ANYR_CUDA_CHECK(
      cudaMemsetAsync(dCounts, 0, 2 * kMaxLocalRanks * sizeof(uint32_t), internalStream_));
  ANYR_CUDA_CHECK(launchCheckPublish(own, rank_, salt, internalStream_));
  waitStreamIdle(internalStream_, "publishing the transport check pattern");
  bs_->barrier();

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
  for (int p = 0; p < nranks_; ++p) {
    if (p == rank_ || peers_->peer(p) == nullptr) continue;
    row.mapped[p] = 1;
    CheckArea* peerArea = reinterpret_cast<CheckArea*>(peers_->peer(p) + layout_.checkOffset);
    ANYR_CUDA_CHECK(launchCheckWrite(peerArea, rank_, p, salt, internalStream_));
    ANYR_CUDA_CHECK(launchCheckRead(peerArea, p, salt, dCounts + p, internalStream_));
    if (topo_.pair(rank_, p).driverAtomics || topo_.pair(rank_, p).link == LinkType::Self) {
      row.atomicTried[p] = 1;
      ANYR_CUDA_CHECK(launchCheckAtomics(peerArea, rank_, internalStream_));
    }
  }
  waitStreamIdle(internalStream_, "the transport check transfers");
  bs_->barrier();
  for (int p = 0; p < nranks_; ++p) {
    if (p == rank_) continue;
    ANYR_CUDA_CHECK(
        launchCheckVerify(own, p, rank_, salt, dCounts + kMaxLocalRanks + p, internalStream_));
  }
  uint32_t counts[2 * kMaxLocalRanks] = {};
  uint32_t atomics[kMaxLocalRanks] = {};
  ANYR_CUDA_CHECK(
      cudaMemcpyAsync(counts, dCounts, sizeof(counts), cudaMemcpyDeviceToHost, internalStream_));
  ANYR_CUDA_CHECK(cudaMemcpyAsync(atomics, own->atomics, sizeof(atomics), cudaMemcpyDeviceToHost,
                                  internalStream_));
  ANYR_CUDA_CHECK(cudaFreeAsync(dCounts, internalStream_));
  waitStreamIdle(internalStream_, "verifying the transport check");
  std::vector<Row> rows = bs_->allGatherValue(row);
  for (int p = 0; p < nranks_; ++p) {
    if (p == rank_) continue;
    row.readOk[p] = row.mapped[p] && counts[p] == 0;
    row.writeOkFrom[p] =
        rows[static_cast<size_t>(p)].mapped[rank_] && counts[kMaxLocalRanks + p] == 0;
    row.atomicOkFrom[p] =
        rows[static_cast<size_t>(p)].atomicTried[rank_] &&
        atomics[p] == static_cast<uint32_t>(kAtomicThreads * kAtomicAddsPerThread);
  }
  rows = bs_->allGatherValue(row);
  for (int s = 0; s < nranks_; ++s) {
    for (int d = 0; d < nranks_; ++d) {
      if (s == d) continue;
      PairInfo& p = topo_.pair(s, d);
      p.peerReadOk = rows[static_cast<size_t>(s)].readOk[d] != 0;
      p.peerWriteOk = rows[static_cast<size_t>(d)].writeOkFrom[s] != 0;
      p.peerAtomicOk = rows[static_cast<size_t>(d)].atomicOkFrom[s] != 0;
      if (s == rank_ && !peers_->mapError(d).empty()) {
        ANYR_LOG(Warn, rank_, "cannot map rank " << d << "'s memory: " << peers_->mapError(d));
      }
      if (!p.peerWriteOk || !p.peerReadOk) {
        ANYR_LOG(Info, rank_,
                 "transport check rank " << s << " -> rank " << d << ": write "
                                         << (p.peerWriteOk ? "ok" : "FAILED") << ", read "
                                         << (p.peerReadOk ? "ok" : "FAILED"));
      }
    }
  }
}

void Communicator::decide() {
  admission_ = admit(topo_, facts_);
  SelfTest(*this).run();  // may disable admitted paths, on every rank alike
  thresholds_ = defaultThresholds(topo_, admission_, cfg_, nranks_);
  if (nranks_ > 1 && !admission_.any()) {
    std::string reasons;
    for (int a = 1; a < anyrNumAlgos; ++a) {
      reasons += std::string("\n  ") + anyrAlgoName(static_cast<anyrAlgo_t>(a)) + ": " +
                 admission_.algo[static_cast<size_t>(a)].reason;
    }
    throwError(anyrUnsupported, "no all-reduce algorithm is admitted on this hardware:" + reasons);
  }
  if (cfg_.algorithm != anyrAlgoAuto) setAlgorithm(cfg_.algorithm);
  // Dispatch: candidates per operation and the seed table (select/dispatch.h); a tuning table
  // may replace the seed's choices in loadOrTuneAtInit().
  for (int o = 0; o < kNumOps; ++o) {
    candidates_[static_cast<size_t>(o)] = candidates(static_cast<Op>(o), topo_, admission_);
  }
  dispatch_ = seedTable(topo_, admission_, cfg_, nranks_);
  for (const Candidate& c : candidates_[static_cast<size_t>(Op::AddRmsNorm)]) {
    if (c.path.fusedKernel) fusedKernelOk_[static_cast<size_t>(c.path.algo)] = c.admitted;
  }
  for (int a = 1; a < anyrNumAlgos; ++a) {
    ANYR_LOG(
        Info, rank_,
        anyrAlgoName(static_cast<anyrAlgo_t>(a))
            << (admission_.algo[static_cast<size_t>(a)].admitted ? " admitted: " : " rejected: ")
            << admission_.algo[static_cast<size_t>(a)].reason);
  }
}

// ---------------------------------------------------------------------------------------------
// Failure state
// ---------------------------------------------------------------------------------------------

void Communicator::setFailed(anyrResult_t code, const std::string& msg) {
  std::lock_guard<std::mutex> lock(failMu_);
  if (failCode_.load() == anyrSuccess) {
    failMsg_ = msg;
    failCode_.store(code);
  }
}

anyrResult_t Communicator::asyncError(std::string* msg) {
  if (failCode_.load() == anyrSuccess && hError_ != nullptr) {
    int32_t code = *reinterpret_cast<volatile int32_t*>(&hError_->code);
    if (code != kFailNone) {
      const ErrorRecord e = *const_cast<const ErrorRecord*>(hError_);
      std::string where = std::string(waitWhatName(e.what)) + ", block " + std::to_string(e.block) +
                          ", call " + std::to_string(e.epoch);
      if (code == kFailTimeout) {
        setFailed(anyrTimeout, "rank " + std::to_string(rank_) + " timed out after " +
                                   std::to_string(cfg_.timeoutMs) + " ms waiting for rank " +
                                   std::to_string(e.waitedRank) + " (" + where + ")");
      } else if (code == kFailAborted) {
        setFailed(anyrAborted, "rank " + std::to_string(rank_) +
                                   " was aborted (anyrCommAbort) while "
                                   "waiting for rank " +
                                   std::to_string(e.waitedRank) + " (" + where + ")");
      } else {
        std::string failed = " failed";
        if (e.cause > 0) {
          failed += " (it timed out waiting for rank " + std::to_string(e.cause - 1) + ")";
        } else if (e.cause == kCauseRefused || e.cause == kCauseAborted) {
          if (e.cause == kCauseRefused) {
            const std::string note = stopNote();
            failed = " refused a call that this rank made";
            if (!note.empty()) failed += " (its " + note + ")";
          } else {
            failed = " was aborted or destroyed while this rank waited for it";
          }
        }
        setFailed(anyrRemoteError, "rank " + std::to_string(e.waitedRank) + failed +
                                       " and stopped the communicator (rank " +
                                       std::to_string(rank_) + " was waiting in " + where + ")");
      }
    }
  }
  if (failCode_.load() == anyrSuccess) {
    const ncclResult_t st = nccl_.asyncError();
    if (st != ncclSuccess && st != ncclInProgress) {
      setFailed(anyrNcclError, std::string("NCCL asynchronous error: ") + ncclGetErrorString(st));
    }
  }
  // Healthy (every call comes here): no lock and no copy. setFailed writes the message before
  // the code, so a code other than success always has its message.
  if (failCode_.load() == anyrSuccess) {
    if (msg != nullptr) msg->clear();
    return anyrSuccess;
  }
  std::lock_guard<std::mutex> lock(failMu_);
  if (msg != nullptr) *msg = failMsg_;
  return static_cast<anyrResult_t>(failCode_.load());
}

void Communicator::requireHealthy(bool& settled) {
  std::string msg;
  const anyrResult_t failed = asyncError(&msg);
  settled = failed != anyrSuccess;
  if (settled) throwError(failed, "communicator has failed: " + msg);
}

namespace {

// While it lives, this thread may make the calls a graph capture in progress on it would
// otherwise refuse, and be invalidated by (event and stream queries, copies on other streams):
// the stop runs on the communicator's own stream, outside any capture, even when the refused
// call was made while capturing.
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() { ok_ = cudaThreadExchangeStreamCaptureMode(&mode_) == cudaSuccess; }
  ~RelaxedCaptureMode() {
    if (ok_) (void)cudaThreadExchangeStreamCaptureMode(&mode_);
  }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
  bool ok_ = false;
};

// "argument 'NAME': ..." -> "NAME"; otherwise the message's first words (what a peer's error
// repeats about this rank's refusal: WorkspaceHeader::stopWhat holds 27 characters).
std::string refusedWhat(const std::string& msg) {
  const std::string tag = "argument '";
  const size_t a = msg.find(tag);
  if (a != std::string::npos) {
    const size_t b = msg.find('\'', a + tag.size());
    if (b != std::string::npos)
      return "argument '" + msg.substr(a + tag.size(), b - a - tag.size()) + "'";
  }
  return msg;
}

}  // namespace

void Communicator::refuse(const char* fn, const Error& e, bool holdingGuard) {
  const uint64_t call = callCount_ + (holdingGuard ? 0 : 1);
  const std::string msg =
      "rank " + std::to_string(rank_) + " refused its call #" + std::to_string(call) + " (" + fn +
      ": " + e.what() +
      "); its peers may have made that call, so the communicator is stopped on every rank (no "
      "later call can pair with theirs): destroy it and create a new one";
  ANYR_LOG(Warn, rank_,
           fn << " refused after its peers may have made it; stopping the communicator on "
                 "every rank: "
              << e.what());
  {
    std::lock_guard<std::mutex> lock(failMu_);
    pendingFailMsg_ = msg;
    stopWhat_ = refusedWhat(e.what());
  }
  stopPending_.store(true);
  // Another thread is inside a call that the peers have matched: it fails the communicator
  // once that call is launched (applyPendingStop at its end), not before.
  if (holdingGuard) applyPendingStop();
}

void Communicator::applyPendingStop() {
  if (!stopPending_.exchange(false)) return;
  std::string msg, what;
  {
    std::lock_guard<std::mutex> lock(failMu_);
    msg = pendingFailMsg_;
    what = stopWhat_;
  }
  setFailed(anyrInvalidUsage, msg);
  stopEverywhere(kCauseRefused, what, true);
}

void Communicator::stopEverywhere(int32_t cause, const std::string& what, bool afterOwnWork,
                                  bool tellPeers) {
  if (stopped_.exchange(true)) return;
  // Every copy is asynchronous from pinned memory on the communicator's own stream, in the
  // relaxed capture mode, so a graph the calling thread is capturing is left as it was; bounded
  // by the timeout as a whole: a copy that cannot complete is logged, not waited for.
  RelaxedCaptureMode relaxed;
  try {
    if (afterOwnWork && haveLastWork_ && !eventDoneWithin(lastWork_, cfg_.timeoutMs)) {
      ANYR_LOG(Warn, rank_, "stopping: this rank's last call had not finished; stopping anyway");
    }
    StopStaging* stage = stopStaging();
    std::memset(stage, 0, sizeof(*stage));
    stage->one = 1;
    stage->cause = cause;
    stage->by = rank_ + 1;
    stage->call = static_cast<uint32_t>(callCount_);
    std::snprintf(stage->what, sizeof(stage->what), "%s", what.c_str());
    for (LocalState* st : {dState_, dHostState_}) {
      if (st == nullptr) continue;
      ANYR_CUDA_CHECK(cudaMemcpyAsync(&st->failClaim, &stage->one, sizeof(stage->one),
                                      cudaMemcpyHostToDevice, internalStream_));
    }
    constexpr size_t kNoteOffset = offsetof(WorkspaceHeader, stopCall);
    constexpr size_t kNoteBytes =
        sizeof(WorkspaceHeader::stopCall) + sizeof(WorkspaceHeader::stopWhat);
    static_assert(offsetof(WorkspaceHeader, stopWhat) == kNoteOffset + sizeof(uint32_t),
                  "stopCall and stopWhat are adjacent");
    static_assert(offsetof(StopStaging, what) == offsetof(StopStaging, call) + sizeof(uint32_t) &&
                      sizeof(StopStaging::what) == sizeof(WorkspaceHeader::stopWhat),
                  "the staged note has the header's layout");
    // The peer workspaces: device memory mapped into this process (a copy engine writes them,
    // so spinning kernels do not hold it up). Note, then cause, then the word waits check.
    if (tellPeers && peers_ && nranks_ <= kMaxLocalRanks) {
      for (int p = 0; p < nranks_; ++p) {
        char* h = argsTemplate_.peerWorkspace[p];
        if (p == rank_ || h == nullptr) continue;
        h += layout_.headerOffset;
        ANYR_CUDA_CHECK(cudaMemcpyAsync(h + kNoteOffset, &stage->call, kNoteBytes,
                                        cudaMemcpyHostToDevice, internalStream_));
        ANYR_CUDA_CHECK(cudaMemcpyAsync(h + offsetof(WorkspaceHeader, abortCause), &stage->cause,
                                        sizeof(int32_t), cudaMemcpyHostToDevice, internalStream_));
        ANYR_CUDA_CHECK(cudaMemcpyAsync(h + offsetof(WorkspaceHeader, abortedBy), &stage->by,
                                        sizeof(int32_t), cudaMemcpyHostToDevice, internalStream_));
      }
    }
    // The host segment: this process's own mapping of it.
    if (tellPeers && host_) {
      for (int p = 0; p < nranks_; ++p) {
        if (p == rank_) continue;
        char* h = host_->host() + static_cast<uint64_t>(p) * hostLayout_.rankBytes +
                  hostLayout_.headerOffset;
        std::memcpy(h + kNoteOffset, &stage->call, kNoteBytes);
        std::atomic_thread_fence(std::memory_order_seq_cst);
        *reinterpret_cast<volatile int32_t*>(h + offsetof(WorkspaceHeader, abortCause)) = cause;
        std::atomic_thread_fence(std::memory_order_seq_cst);
        *reinterpret_cast<volatile int32_t*>(h + offsetof(WorkspaceHeader, abortedBy)) = rank_ + 1;
        std::atomic_thread_fence(std::memory_order_seq_cst);
      }
    }
    if (!streamIdleWithin(internalStream_, cfg_.timeoutMs)) {
      ANYR_LOG(
          Warn, rank_,
          "stopping: telling the peers to stop did not finish within " << cfg_.timeoutMs << " ms");
    }
  } catch (const Error& e) {
    ANYR_LOG(Warn, rank_, "stopping the communicator on every rank: " << e.what());
  }
}

std::string Communicator::stopNote() {
  std::lock_guard<std::mutex> lock(stopNoteMu_);
  RelaxedCaptureMode relaxed;  // asyncError runs inside calls made while capturing
  WorkspaceHeader h{};
  bool have = false;
  if (host_) {
    const char* mine = host_->host() + static_cast<uint64_t>(rank_) * hostLayout_.rankBytes +
                       hostLayout_.headerOffset;
    std::memcpy(&h, mine, sizeof(h));
    have = h.stopWhat[0] != '\0';
  }
  if (!have && peers_ && nranks_ <= kMaxLocalRanks && argsTemplate_.peerWorkspace[rank_]) {
    // Into pinned memory, asynchronously: allowed while this thread captures a graph.
    WorkspaceHeader* pinned = &stopStaging()->readBack;
    if (cudaMemcpyAsync(pinned, argsTemplate_.peerWorkspace[rank_] + layout_.headerOffset,
                        sizeof(h), cudaMemcpyDeviceToHost, internalStream_) == cudaSuccess &&
        streamIdleWithin(internalStream_, cfg_.timeoutMs)) {
      std::memcpy(&h, pinned, sizeof(h));
      have = h.stopWhat[0] != '\0';
    }
    (void)cudaGetLastError();
  }
  if (!have) return "";
  h.stopWhat[sizeof(h.stopWhat) - 1] = '\0';
  return "call #" + std::to_string(h.stopCall) + ": " + h.stopWhat;
}

void Communicator::throwIfFailed() {
  bool settled = false;
  requireHealthy(settled);
}

bool Communicator::stoppedByPeer() const {
  return hError_ != nullptr &&
         *reinterpret_cast<const volatile int32_t*>(&hError_->code) == kFailPeerAborted;
}

void Communicator::abort() {
  if (hAbort_ != nullptr) *hAbort_ = 1;
  const bool byPeer = stoppedByPeer();
  setFailed(anyrAborted,
            "rank " + std::to_string(rank_) + ": communicator aborted by anyrCommAbort");
  // This rank's kernels still queued or in captured graphs must not pair with the peers'
  // calls, and the peers must not wait out their timeout for it (unless a peer's stop is what
  // failed this rank: the peers know, and the first stopper's note in their headers stays).
  stopEverywhere(kCauseAborted, "anyrCommAbort", false, !byPeer);
  nccl_.release(false);
}

// ---------------------------------------------------------------------------------------------
// All-reduce
// ---------------------------------------------------------------------------------------------

void Communicator::checkStream(cudaStream_t stream, bool capturing) const {
  // The stream's device can only be asked outside graph capture (the query is not permitted
  // on a capturing stream); a capture on another device's stream fails at instantiation.
  if (!capturing) checkStreamDevice(streamDevice(stream), device_);
}

void Communicator::validate(const void* sendbuff, void* recvbuff, size_t count,
                            anyrDataType_t dtype, anyrRedOp_t op, cudaStream_t stream,
                            bool capturing) const {
  checkDatatype(dtype);
  checkOp(op);
  checkStream(stream, capturing);
  if (count == 0) return;
  const size_t es = dtypeSize(dtype);
  checkCountFits(count, es, "count");
  for (auto [p, name] : {std::pair<const void*, const char*>{sendbuff, "sendbuff"},
                         std::pair<const void*, const char*>{recvbuff, "recvbuff"}}) {
    ANYR_REQUIRE_ARG(p != nullptr, name, "must not be NULL when count > 0");
    checkAligned(p, es, name);
    requireDevicePointer(p, name, device_);
  }
  const uintptr_t s = reinterpret_cast<uintptr_t>(sendbuff);
  const uintptr_t r = reinterpret_cast<uintptr_t>(recvbuff);
  const uintptr_t bytes = count * es;
  ANYR_REQUIRE_ARG(s == r || s + bytes <= r || r + bytes <= s, "recvbuff",
                   "overlaps sendbuff partially (must be the same pointer or disjoint)");
}

void Communicator::allReduce(const void* sendbuff, void* recvbuff, size_t count,
                             anyrDataType_t dtype, anyrRedOp_t op, cudaStream_t stream) {
  collectiveCall("anyrAllReduce", [&](bool& settled) {
    DeviceScope onDevice(device_);
    bool capturing = false;
    calls_.checked(
        *bs_, rank_, CallSignature::allReduce(count, dtype, op),
        [&] {
          capturing = streamCapturing(stream);
          validate(sendbuff, recvbuff, count, dtype, op, stream, capturing);
        },
        settled);
    requireHealthy(settled);
    if (count == 0) return;
    const size_t bytes = count * dtypeSize(dtype);
    if (nranks_ == 1) {
      if (sendbuff != recvbuff) {
        ANYR_CUDA_CHECK(
            cudaMemcpyAsync(recvbuff, sendbuff, bytes, cudaMemcpyDeviceToDevice, stream));
      }
      return;
    }
    orderAfterLastWork(stream, capturing);
    const anyrAlgo_t algo = pathFor(Op::AllReduce, bytes).algo;
    counters_.note(algo, bytes, CallKind::AllReduce, forced_.load() != anyrAlgoAuto, capturing);
    if (algo == anyrAlgoNccl) {
      nccl_.allReduceSum(sendbuff, recvbuff, count, dtype, stream, cfg_.timeoutMs);
      noteWork(stream, capturing);
      return;
    }
    if (algo == anyrAlgoAuto) throwError(anyrUnsupported, "no all-reduce algorithm is admitted");
    launchPeerAlgo(algo, sendbuff, recvbuff, count, dtype, stream);
    noteWork(stream, capturing);
  });
}

void Communicator::noteWork(cudaStream_t stream, bool capturing) {
  if (capturing) return;
  ANYR_CUDA_CHECK(cudaEventRecord(lastWork_, stream));
  haveLastWork_ = true;
  lastWorkStream_ = stream;
}

void Communicator::orderAfterLastWork(cudaStream_t stream, bool capturing) {
  // Calls on one communicator share its flags and epochs, so they must run one after the
  // other on the device even when the user alternates streams. During capture the graph's
  // position is the user's to order (an eager event cannot be waited on inside a capture).
  if (capturing || !haveLastWork_ || stream == lastWorkStream_) return;
  ANYR_CUDA_CHECK(cudaStreamWaitEvent(stream, lastWork_, 0));
}

void Communicator::allReduceAddRmsNorm(const void* partial, const void* residualIn,
                                       void* residualOut, const void* weight, float epsilon,
                                       void* normOut, size_t tokens, size_t hidden,
                                       anyrDataType_t dtype, const anyrFusedOptions_t* options,
                                       cudaStream_t stream) {
  collectiveCall("anyrAllReduceAddRmsNorm", [&](bool& settled) {
    fusedCall(partial, residualIn, residualOut, weight, epsilon, normOut, tokens, hidden, dtype,
              options, stream, settled);
  });
}

void Communicator::fusedCall(const void* partial, const void* residualIn, void* residualOut,
                             const void* weight, float epsilon, void* normOut, size_t tokens,
                             size_t hidden, anyrDataType_t dtype, const anyrFusedOptions_t* options,
                             cudaStream_t stream, bool& settled) {
  DeviceScope onDevice(device_);
  bool capturing = false;
  FusedParams p{};
  auto check = [&] {
    capturing = streamCapturing(stream);
    checkStream(stream, capturing);
    p = makeFusedParams(partial, "partial", residualIn, residualOut, weight, epsilon, normOut,
                        tokens, hidden, dtype, options);
    if (tokens == 0) return;
    for (const FusedBuffer& b : fusedBuffers(partial, "partial", p)) {
      requireDevicePointer(b.ptr, b.name, device_);
    }
  };
  calls_.checked(*bs_, rank_,
                 CallSignature::fused(tokens, hidden, dtype, options ? options->quant : 0), check,
                 settled);
  requireHealthy(settled);
  if (tokens == 0) return;
  const size_t es = dtypeSize(dtype);
  const size_t rowBytes = hidden * es;
  const uint64_t bytes = static_cast<uint64_t>(tokens) * rowBytes;
  // The standalone epilogue on rows [rowBase, rowBase + rows) of the outputs, reading x (the
  // all-reduced rows, x row 0 = output row rowBase). rowBase is 0 or a multiple of 128, so the
  // swizzled NVFP4 scales shift by whole 128-row tiles.
  auto epilogueOn = [&](const void* x, int rowBase, int rows) {
    FusedParams q = p;
    const size_t r0 = static_cast<size_t>(rowBase);
    auto shift = [&](auto* ptr, size_t rowStride) {
      using P = decltype(ptr);
      return ptr == nullptr
                 ? ptr
                 : reinterpret_cast<P>(reinterpret_cast<uintptr_t>(ptr) + r0 * rowStride);
    };
    q.residualIn = shift(p.residualIn, rowBytes);
    q.residualOut = shift(p.residualOut, rowBytes);
    q.normOut = shift(p.normOut, rowBytes);
    q.quantOut = shift(p.quantOut, p.quant == anyrQuantNvfp4 ? hidden / 2 : hidden);
    q.blockScales = shift(p.blockScales, hidden / kNvfp4BlockElems);
    q.blockScalesSwizzled = shift(p.blockScalesSwizzled,
                                  static_cast<size_t>(swizzledPaddedCols(nvfp4ScaleCols(hidden))));
    q.tokens = rows;
    ANYR_CUDA_CHECK(launchAddRmsNorm(dtype, x, q, stream, 0, pdlOn_));
  };
  if (nranks_ == 1) {
    epilogueOn(partial, 0, static_cast<int>(tokens));
    noteWork(stream, capturing);
    return;
  }
  orderAfterLastWork(stream, capturing);
  // The path comes from the dispatch table (select/dispatch.h): the fused kernel or the
  // composition all-reduce + standalone epilogue, as seeded or measured per size bucket. The
  // fused kernel needs an admitted kernel that passed the startup self-test and at least one
  // row per launch's buffers (two-shot slots of a small ANYR_CHUNK_BYTES may not hold a wide
  // row); otherwise the composition, which chunks through the scratch buffer. Nothing here
  // depends on this rank's pointers (the kernels take any alignment): the fused kernel and
  // the composition cut a call into launches differently, so every rank must make the same
  // choice.
  const Path path =
      pathFor(p.quant != anyrQuantNone ? Op::AddRmsNormQuant : Op::AddRmsNorm, bytes, p.hidden);
  const anyrAlgo_t algo = path.algo;
  if (algo == anyrAlgoAuto) throwError(anyrUnsupported, "no all-reduce algorithm is admitted");
  const size_t maxRows = static_cast<size_t>(fusedRowsPerLaunch(algo, rowBytes));
  // The fused kernels hold a row in registers up to two vectors per thread (hidden 8192).
  // Wider, the one-shot spills and the two-shot stages the row in shared memory, and both
  // measured slower than the composition (one-shot, hidden 16384, 1 token: 14.6 vs 9.9 us on
  // 2 x H200, docs/PERFORMANCE.md), so there they run only when forced.
  const bool fusedKernel = maxRows > 0 && path.fusedKernel &&
                           fusedKernelOk_[static_cast<size_t>(algo)] &&
                           (fusedRowFitsRegisters(p.hidden) || forced_.load() == algo);
  counters_.note(algo, bytes, fusedKernel ? CallKind::FusedKernel : CallKind::FusedComposed,
                 forced_.load() != anyrAlgoAuto, capturing);
  if (fusedKernel) {
    for (size_t row = 0; row < tokens; row += maxRows) {
      const int rows = static_cast<int>(std::min(maxRows, tokens - row));
      const int clusterBlocks =
          fusedClusterBlocks(rows, p.hidden, path.cluster, algo, dtype, p.quant);
      const cudaError_t e =
          launchFusedRows(algo, dtype, static_cast<const char*>(partial) + row * rowBytes, p,
                          static_cast<int>(row), rows, clusterBlocks, stream);
      if (e != cudaSuccess) {
        throwError(anyrCudaError, std::string("launching fused ") + anyrAlgoName(algo) + ": " +
                                      cudaGetErrorString(e));
      }
      counters_.noteFusedLaunch(clusterBlocks);
    }
    noteWork(stream, capturing);
    return;
  }
  // Unfused composition: all-reduce into normOut (or, without it, the scratch buffer), then the
  // standalone epilogue kernel on it: NCCL, the pull and host algorithms, and what the table picks.
  // Chunks of the scratch buffer's rows either way: normOut may be NULL on one rank and not on
  // another (a quantized output alone), and the ranks' all-reduce launches must match.
  // normOut in place of residualIn would be overwritten by the all-reduce before the epilogue
  // reads the residual: the scratch buffer then.
  const size_t chunkRows = scratchBytes_ / rowBytes / 128 * 128;
  const bool intoNormOut = normOut != nullptr && normOut != residualIn;
  for (size_t row = 0; row < tokens; row += chunkRows) {
    const size_t rows = std::min(chunkRows, tokens - row);
    void* x = intoNormOut ? static_cast<char*>(normOut) + row * rowBytes : scratch_;
    const void* src = static_cast<const char*>(partial) + row * rowBytes;
    if (algo == anyrAlgoNccl) {
      nccl_.allReduceSum(src, x, rows * hidden, dtype, stream, cfg_.timeoutMs);
    } else {
      launchPeerAlgo(algo, src, x, rows * hidden, dtype, stream);
    }
    epilogueOn(x, static_cast<int>(row), static_cast<int>(rows));
  }
  noteWork(stream, capturing);
}

cudaError_t Communicator::launchFusedRows(anyrAlgo_t algo, anyrDataType_t dtype, const void* rowsIn,
                                          const FusedParams& p, int rowBase, int rows,
                                          int clusterBlocks, cudaStream_t stream) {
  AllReduceArgs a = argsTemplate_;
  a.input = rowsIn;
  a.output = nullptr;
  a.count = static_cast<uint64_t>(rows) * static_cast<uint64_t>(p.hidden);
  a.numVecs = static_cast<uint64_t>(rows) * static_cast<uint64_t>(p.hidden / 8);
  // Rows spread over thread-block clusters of clusterBlocks blocks (1: a block per row; the
  // same bits either way).
  if (algo == anyrAlgoOneShotPush) {
    if (clusterBlocks > 1) {
      return launchFusedOneShotPushCluster(
          dtype, a, p, rowBase, rows, clusterBlocks,
          clusterGridCap(p.hidden, clusterBlocks, rows, algo, dtype, p.quant), stream, pdlOn_);
    }
    return launchFusedOneShotPush(dtype, a, p, rowBase, rows,
                                  fusedOneShotBlocks(rows, a.numVecs, maxBlocks_), stream, pdlOn_);
  }
  if (clusterBlocks > 1) {
    return launchFusedTwoShotPushCluster(
        dtype, a, p, rowBase, rows, clusterBlocks,
        clusterGridCap(p.hidden, clusterBlocks, rows, algo, dtype, p.quant), stream, pdlOn_);
  }
  const FusedLaunchShape shape =
      fusedTwoShotShape(rows, nranks_, p.hidden, a.numVecs, maxBlocks_, fusedDenseBlocks_);
  // The dense shape (two blocks per SM) measured 0.5-1% slower with the early release at 256
  // to 1024 rows of 6144 and 7168 on 2 x H200 (docs/PERFORMANCE.md):
  // not taken apart further (the next launch's waiting blocks may crowd the second blocks).
  if (shape.threads == kFusedDenseThreads) a.releaseEarly = 0;
  return launchFusedTwoShotPush(dtype, a, p, rowBase, rows, shape.blocks, stream, pdlOn_,
                                shape.threads);
}

int Communicator::fusedClusterBlocks(int rows, int hidden, int pathCluster, anyrAlgo_t algo,
                                     anyrDataType_t dtype, int quant) const {
  const int setting = cfg_.fusedCluster != 0 ? cfg_.fusedCluster : pathCluster;
  return clusterOn_ ? fusedClusterSize(rows, hidden, maxBlocks_, setting,
                                       clusterGridCap(hidden, 2, 0, algo, dtype, quant))
                    : 1;
}

int Communicator::clusterPairVariant(anyrAlgo_t algo, anyrDataType_t dtype, int quant) {
  if ((dtype != anyrFloat16 && dtype != anyrBfloat16) || quant < 0 || quant > 2) return -1;
  return (algo == anyrAlgoOneShotPush ? 0 : 6) + (dtype == anyrFloat16 ? 0 : 3) + quant;
}

int Communicator::clusterPairThreads(anyrAlgo_t algo, anyrDataType_t dtype, int quant) const {
  const int v = clusterPairVariant(algo, dtype, quant);
  return v < 0 ? 0 : clusterPairThreads_[static_cast<size_t>(v)];
}

int Communicator::clusterGridCap(int hidden, int clusterBlocks, int rows, anyrAlgo_t algo,
                                 anyrDataType_t dtype, int quant) const {
  // Within one block per SM, one block per SM; beyond it two where the variant holds them.
  if (rows > 0 && static_cast<int64_t>(rows) * clusterBlocks <= maxBlocks_) return maxBlocks_;
  return fusedClusterPairBlocks(hidden, clusterBlocks, maxBlocks_,
                                clusterPairThreads(algo, dtype, quant), clusterPairBlocks_);
}

uint64_t Communicator::fusedRowsPerLaunch(anyrAlgo_t algo, uint64_t rowBytes) const {
  return algo == anyrAlgoOneShotPush
             ? layout_.pushSlotBytes / rowBytes
             : (layout_.tsSlotBytes / rowBytes) * static_cast<uint64_t>(nranks_);
}

namespace {
constexpr uint64_t kHostBytesPerBlock = 64u << 10;
}  // namespace

LaunchShape Communicator::shapeFor(anyrAlgo_t algo, uint64_t numVecs) const {
  // spreadShape (algo/algo.h) under this algorithm's block cap. Every rank computes the same
  // shape (agreed inputs only), which the per-block flags rely on.
  const AlgoInfo* row = findAlgo(algo);
  const bool host = row != nullptr && row->kind == AlgoKind::HostMemory;
  const bool perRank = row != nullptr && row->perRankShare;
  const uint64_t work = perRank ? (numVecs + nranks_ - 1) / nranks_ : numVecs;
  uint64_t blocksCap = static_cast<uint64_t>(host ? maxBlocks_ : peerBlocks_);
  if (host && cfg_.wire == anyrWireNative) {
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
  LaunchShape shape = peerLaunchShape(work, static_cast<uint64_t>(maxBlocks_), blocksCap);
  shape.pdl = pdlOn_;
  return shape;
}

void Communicator::launchPeerAlgo(anyrAlgo_t algo, const void* in, void* out, size_t count,
                                  anyrDataType_t dtype, cudaStream_t stream) {
  const AlgoInfo* row = findAlgo(algo);
  if (row != nullptr && row->kind == AlgoKind::HostMemory) {
    launchHostAlgo(algo, in, out, count, dtype, stream);
    return;
  }
  // Per-launch capacity: one push slot, or one staging chunk (the row's LaunchCapacity).
  const uint64_t capacity = row != nullptr && row->capacity == LaunchCapacity::PushSlot
                                ? layout_.pushSlotBytes
                                : layout_.chunkBytes;
  const PeerLaunchFn launch =
      row != nullptr && row->kind == AlgoKind::PeerMemory ? row->launch : nullptr;
  launchInPieces(algo, argsTemplate_, in, out, count, dtype, capacity,
                 [&](const AllReduceArgs& a, const LaunchShape& shape) {
                   if (launch == nullptr) {
                     throwError(anyrInternalError, "launchPeerAlgo: not a peer algorithm");
                   }
                   return launch(dtype, a, shape, stream);
                 });
}

void Communicator::throwLaunchFailed(anyrAlgo_t algo, cudaError_t e) {
  throwError(anyrCudaError,
             std::string("launching ") + anyrAlgoName(algo) + ": " + cudaGetErrorString(e));
}

void Communicator::setAlgorithm(anyrAlgo_t algo) {
  // Collective: the ranks' kernels must take the same algorithm, so a rank that refuses the
  // change while its peers make it would pair differently shaped launches.
  collectiveCall("anyrCommSetAlgorithm", [&](bool& settled) {
    auto check = [&] {
      ANYR_REQUIRE_ARG(
          algo >= 0 && algo < anyrNumAlgos, "algorithm",
          "must be one of " + algoNames() + " (0.." + std::to_string(anyrNumAlgos - 1) + ")");
      if (nranks_ > 1) {
        const std::string err = overrideError(admission_, algo);
        // Admission is agreed at init: every rank refuses the same algorithm alike, and none
        // changes what it runs, so nothing can pair wrongly.
        settled = !err.empty();
        if (!err.empty()) throwError(anyrUnsupported, err);
      }
    };
    calls_.checked(*bs_, rank_, CallSignature::setAlgorithm(algo), check, settled);
    requireHealthy(settled);
    forced_.store(algo);
  });
}

anyrAlgo_t Communicator::queryAlgorithm(size_t count, anyrDataType_t dtype) const {
  ANYR_REQUIRE_ARG(dtype >= 0 && dtype < anyrNumTypes, "datatype", "unsupported datatype");
  checkCountFits(count, dtypeSize(dtype), "count");
  if (nranks_ == 1) return anyrAlgoAuto;
  std::lock_guard<std::mutex> lock(tableMu_);  // anyrCommTune may be installing a table
  return pathFor(Op::AllReduce, count * dtypeSize(dtype)).algo;
}

std::string Communicator::explainJson() const {
  std::lock_guard<std::mutex> lock(tableMu_);  // anyrCommTune may be installing a table
  nlohmann::json j;
  j["rank"] = rank_;
  j["nranks"] = nranks_;
  j["device"] = device_;
  j["config"] = cfg_.describe();
  j["forced"] = anyrAlgoName(static_cast<anyrAlgo_t>(forced_.load()));
  j["topology"] = nlohmann::json::parse(topologyToJson(topo_, -1));
  nlohmann::json adm = nlohmann::json::object();
  for (int a = 1; a < anyrNumAlgos; ++a) {
    adm[anyrAlgoName(static_cast<anyrAlgo_t>(a))] = {
        {"admitted", admission_.algo[static_cast<size_t>(a)].admitted},
        {"reason", admission_.algo[static_cast<size_t>(a)].reason}};
  }
  j["admission"] = adm;
  j["thresholds"] = {{"oneShot", anyrAlgoName(thresholds_.oneShot)},
                     {"oneShotWhy", thresholds_.oneShotWhy},
                     {"oneShotMaxBytes", thresholds_.oneShotMaxBytes},
                     {"twoShot", anyrAlgoName(thresholds_.twoShot)},
                     {"twoShotWhy", thresholds_.twoShotWhy},
                     {"twoShotMaxBytes", thresholds_.twoShotMaxBytes}};
  nlohmann::json choices = nlohmann::json::array();
  for (uint64_t b = 1024; b <= (256ull << 20); b *= 4) {
    choices.push_back(
        {{"bytes", b},
         {"choice", pathName(Op::AllReduce, pathFor(Op::AllReduce, b))},
         {"source", forced_.load() != anyrAlgoAuto
                        ? "forced"
                        : sourceName(dispatch_.source[0][static_cast<size_t>(bucketOf(b))])}});
  }
  j["choices"] = choices;
  if (!selfTestJson_.empty()) j["selfTest"] = nlohmann::json::parse(selfTestJson_);
  j["dispatchText"] = explainTextLocked();
  j["tuning"] = tuningNote_;
  j["programmaticLaunch"] = {{"enabled", pdlOn_},
                             {"reason", pdlReason_},
                             {"earlyRelease", argsTemplate_.releaseEarly != 0}};
  // Grid caps: every block of a launch is resident at once on every rank.
  j["blocks"] = {
      {"fusedAndHost", maxBlocks_},
      {"peer", peerBlocks_},
      {"peerPerSm", peerPerSm_},
      {"fusedTwoShotDense", fusedDenseBlocks_},
      {"fusedClusterPairs", clusterPairBlocks_},
      {"fusedClusterPairThreads", nlohmann::json::parse(clusterPairThreadsJson())},
      {"reason",
       "fused and host kernels: one block per SM of the smallest GPU; peer "
       "all-reduce kernels: the fewest blocks per SM any of their variants "
       "holds on any rank, at most " +
           std::to_string(kPeerBlocksPerSm) + "; the fused two-shot's register form at " +
           std::to_string(kFusedDenseThreads) +
           " threads a block, for launches of more rows than fusedAndHost: likewise, "
           "at most " +
           std::to_string(kFusedDensePerSm) +
           " (dense above fusedAndHost); the fused cluster forms at two blocks per SM "
           "(fusedClusterPairs, 0: not admitted) for blocks of at most the "
           "fusedClusterPairThreads of the launch's kernel variant (form, dtype, "
           "quantization; aligned buffers), where every rank holds two such blocks per SM "
           "and no two ranks share a GPU; all capped by config.maxBlocks and at " +
           std::to_string(kMaxBlocks)}};
  // The fused kernels' cluster form: the size they take by rows (clusterSizeSamples).
  nlohmann::json sizes = nlohmann::json::object();
  for (const auto& [rows, size] : clusterSizeSamples()) sizes[std::to_string(rows)] = size;
  // Either encoder gives the same bits (fused/fused.h, e2m1Pack8).
  j["nvfp4Encoding"] = {{"instruction", nvfp4Instruction_}, {"reason", nvfp4Reason_}};
  j["fusedClusters"] = {{"enabled", clusterOn_},
                        {"reason", clusterReason_},
                        {"setting", cfg_.fusedCluster},
                        {"hidden", kClusterSampleHidden},
                        {"sizeByRows", sizes}};
  if (peers_) {
    j["transport"] = peers_->kind();
    j["workspaceBytes"] = layout_.totalBytes;
  }
  j["peerMemory"] = {{"kind", peers_ ? peers_->kind() : "none"},
                     {"setting", peerMemoryName(cfg_.peerMemory)},
                     {"reason", peerMemoryText()}};
  explainHost(&j);
  return j.dump(2);
}

// ---------------------------------------------------------------------------------------------
// Teardown
// ---------------------------------------------------------------------------------------------

template <typename Query>
bool Communicator::doneWithin(Query&& query, int ms) {
  auto deadline = Clock::now() + std::chrono::milliseconds(ms);
  while (true) {
    cudaError_t e = query();
    if (e == cudaSuccess) return true;
    if (e != cudaErrorNotReady) ANYR_CUDA_CHECK(e);
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

bool Communicator::streamIdleWithin(cudaStream_t s, int ms) {
  return doneWithin([s] { return cudaStreamQuery(s); }, ms);
}

bool Communicator::eventDoneWithin(cudaEvent_t ev, int ms) {
  return doneWithin([ev] { return cudaEventQuery(ev); }, ms);
}

void Communicator::waitStreamIdle(cudaStream_t s, const char* what, int graceMs) {
  const int ms = cfg_.timeoutMs + graceMs;
  if (streamIdleWithin(s, ms)) return;
  throwIfFailed();  // a kernel's own timeout names the rank it waited for
  throwError(anyrTimeout, std::string("rank ") + std::to_string(rank_) + ": " + what +
                              " did not finish within " + std::to_string(ms) + " ms");
}

void Communicator::destroy() {
  // Refused (anyrInvalidUsage, nothing freed) while another thread is inside a call.
  CallGuard::Scope busy(calls_, "anyrCommDestroy");
  // 1. This rank's launched work (bounded: our kernels give up at the timeout).
  if (haveLastWork_) {
    auto deadline = Clock::now() + std::chrono::milliseconds(cfg_.timeoutMs + kTeardownGraceMs);
    while (cudaEventQuery(lastWork_) == cudaErrorNotReady && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    if (cudaEventQuery(lastWork_) == cudaErrorNotReady) {
      // Only NCCL's kernels wait without a bound of ours (a peer gone mid-call).
      teardownClean_ = false;
      ANYR_LOG(Warn, rank_,
               "destroy: this rank's last call had not finished after "
                   << cfg_.timeoutMs + kTeardownGraceMs
                   << " ms; aborting NCCL instead of destroying it");
    }
    (void)cudaGetLastError();
  }
  // 2. Peers must stop reading this rank's memory before it is freed.
  if (failCode_.load() == anyrSuccess && bs_) {
    try {
      bs_->barrier();
    } catch (const Error& e) {
      teardownClean_ = false;
      ANYR_LOG(Warn, rank_, "destroy: peers did not all reach teardown: " << e.what());
    }
  }
  // A refusal by another thread that no call has applied yet (collectiveCall).
  applyPendingStop();
  // 3. The frees in the destructor wait for every kernel of this process's context. Where this
  // rank's work may still be queued or running -- a failed communicator, an unfinished last
  // call, graph replays (not tracked by lastWork_) -- stop it: its kernels that start now
  // return at once and those waiting give up at their next check, so the frees wait for
  // nothing of this communicator's beyond that, and the peers are told not to wait for it.
  (void)asyncError(nullptr);  // a failure a kernel recorded since the last call counts here
  if (failCode_.load() != anyrSuccess || !teardownClean_) {
    if (hAbort_ != nullptr) *hAbort_ = 1;
    // A rank that a peer stopped tells nobody: the peers know, and the first stopper's note in
    // their headers stays (it names the cause their errors report).
    stopEverywhere(kCauseAborted, "anyrCommDestroy", false, !stoppedByPeer());
  }
}

Communicator::~Communicator() {
  // NCCL first: after a failure its kernels may still wait for a dead peer, and only
  // ncclCommAbort releases them; cudaFree below would otherwise wait for them forever.
  nccl_.release(failCode_.load() == anyrSuccess && teardownClean_);
  peers_.reset();
  freeHostCopy();
  host_.reset();
  if (dHostState_ != nullptr) (void)cudaFree(dHostState_);
  if (dHostWait_ != nullptr) (void)cudaFree(dHostWait_);
  if (dState_ != nullptr) (void)cudaFree(dState_);
  if (dWait_ != nullptr) (void)cudaFree(dWait_);
  if (scratch_ != nullptr) (void)cudaFree(scratch_);
  if (lastWork_ != nullptr) (void)cudaEventDestroy(lastWork_);
  if (internalStream_ != nullptr) (void)cudaStreamDestroy(internalStream_);
  if (hostMapped_ != nullptr) (void)cudaFreeHost(hostMapped_);
  (void)cudaGetLastError();
}

}  // namespace anyr
