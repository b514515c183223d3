// The communicator's shared facts: the agreements every rank makes at init (configuration,
// device descriptions, pair facts, tests-only values), the bounded waits on its own stream, and
// the headers and wait controls both transports set up.
#include "core/context.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "base/env.h"
#include "base/error.h"
#include "base/log.h"
#include "core/failure_state.h"
#include "topology/nvml.h"
#include "topology/probe.h"

namespace anyr {

namespace {

using Clock = std::chrono::steady_clock;

// Serialized GPU description exchanged at init: JSON of a one-GPU topology, padded.
constexpr size_t kGpuInfoWire = 4096;

}  // namespace

// A tests-only variable's value, rank 0's (-1 when unset there), checked on every rank after
// the broadcast, so that a malformed or out-of-range value fails every rank together rather
// than leaving the others waiting in the broadcast.
int64_t CommContext::testValueOfRank0(const char* name, int64_t max) {
  struct {
    int64_t value;
    int32_t state;  // 0 unset, 1 set, 2 not an integer
    int32_t pad;
  } w{-1, 0, 0};
  if (rank == 0 && !env::getString(name).empty()) {
    try {
      w.value = env::getInt(name);
      w.state = 1;
    } catch (const Error&) {
      w.state = 2;
    }
  }
  bs->broadcast(&w, sizeof(w), 0);
  if (w.state == 0) return -1;
  if (w.state == 2 || w.value < 0 || w.value > max) {
    throwError(anyrInvalidArgument,
               std::string("environment variable ") + name +
                   (w.state == 1 ? "=" + std::to_string(w.value) : std::string()) +
                   " (rank 0's): must be an integer in 0.." + std::to_string(max));
  }
  return w.value;
}

void CommContext::agreeConfig(const Config& local) {
  // Rank 0's resolved configuration is the communicator's; a rank whose own differs is told.
  Config::Wire w = local.toWire();
  bs->broadcast(&w, sizeof(w), 0);
  cfg = Config::fromWire(w);
  // Rank-local: only rank 0's are used, and the tuning step broadcasts what it decides.
  cfg.tuningFile = local.tuningFile;
  cfg.tuneBudgetMs = local.tuneBudgetMs;
  cfg.epilogueHints = local.epilogueHints;  // timing only: each rank's own
  if (!(cfg == local)) {
    ANYR_LOG(Warn, rank,
             "this rank's configuration (" << local.describe()
                                           << ") differs from rank 0's; using rank 0's ("
                                           << cfg.describe() << ")");
  }
}

void CommContext::exchangeDeviceInfo() {
  Topology mine;
  mine.gpus.push_back(probeGpu(device));
  mine.gpus[0].index = rank;
  mine.resizePairs();
  std::string text = topologyToJson(mine, -1);
  if (text.size() >= kGpuInfoWire) {
    throwError(anyrInternalError,
               "GPU description too long to exchange (" + std::to_string(text.size()) + " bytes)");
  }
  std::vector<char> buf(kGpuInfoWire, 0);
  std::memcpy(buf.data(), text.data(), text.size());
  std::vector<char> all(kGpuInfoWire * static_cast<size_t>(nranks));
  bs->allGather(buf.data(), all.data(), kGpuInfoWire);

  topo = Topology();
  topo.source = "communicator";
  topo.hostName = mine.hostName;
  int drv = 0, rt = 0;
  (void)cudaDriverGetVersion(&drv);
  (void)cudaRuntimeGetVersion(&rt);
  topo.cudaDriverVersion = drv;
  topo.driverVersion = nvml::driverVersion();  // a tuning table's fingerprint names it
  topo.cudaRuntimeVersion = rt;
  for (int r = 0; r < nranks; ++r) {
    const char* p = all.data() + kGpuInfoWire * static_cast<size_t>(r);
    Topology t = topologyFromJson(std::string(p, strnlen(p, kGpuInfoWire)));
    if (t.gpus.size() != 1) {
      throwError(anyrRemoteError,
                 "rank " + std::to_string(r) + " sent a malformed GPU description");
    }
    topo.gpus.push_back(t.gpus[0]);
  }
  topo.resizePairs();

  facts.nranks = nranks;
  facts.sameHost = true;
  facts.distinctDevices = true;
  for (int r = 0; r < nranks; ++r) {
    if (topo.gpus[static_cast<size_t>(r)].hostHash != topo.gpus[0].hostHash) facts.sameHost = false;
    for (int q = 0; q < r; ++q) {
      if (topo.gpus[static_cast<size_t>(r)].pciBusId ==
              topo.gpus[static_cast<size_t>(q)].pciBusId &&
          topo.gpus[static_cast<size_t>(r)].hostHash ==
              topo.gpus[static_cast<size_t>(q)].hostHash) {
        facts.distinctDevices = false;
      }
    }
  }
  // Driver-reported facts for this rank's row, then everyone's rows. Across hosts every pair
  // but a rank with itself has no link of ours, so nothing is exchanged.
  if (!facts.sameHost) {
    for (int s = 0; s < nranks; ++s) {
      for (int d = 0; d < nranks; ++d)
        topo.pair(s, d).link = s == d ? LinkType::Self : LinkType::None;
    }
    return;
  }
  struct PairWire {
    int32_t link, nvlinkCount, driverPeerAccess, driverAtomics;
    double linkGBps;
    char relation[16];
  };
  static_assert(sizeof(PairWire) == 40, "PairWire layout");
  std::vector<PairWire> row(static_cast<size_t>(nranks));
  for (int d = 0; d < nranks; ++d) {
    PairWire& w = row[static_cast<size_t>(d)];
    std::memset(&w, 0, sizeof(w));
    if (d == rank) {
      w.link = static_cast<int32_t>(LinkType::Self);
      continue;
    }
    PairInfo p = describePair(device, topo.gpus[static_cast<size_t>(rank)],
                              topo.gpus[static_cast<size_t>(d)]);
    w.link = static_cast<int32_t>(p.link);
    w.nvlinkCount = p.nvlinkCount;
    w.driverPeerAccess = p.driverPeerAccess;
    w.driverAtomics = p.driverAtomics;
    w.linkGBps = p.linkGBps;
    std::snprintf(w.relation, sizeof(w.relation), "%s", p.pcieRelation.c_str());
  }
  std::vector<PairWire> allRows(static_cast<size_t>(nranks) * static_cast<size_t>(nranks));
  bs->allGather(row.data(), allRows.data(), sizeof(PairWire) * static_cast<size_t>(nranks));
  for (int s = 0; s < nranks; ++s) {
    for (int d = 0; d < nranks; ++d) {
      const PairWire& w = allRows[static_cast<size_t>(s * nranks + d)];
      PairInfo& p = topo.pair(s, d);
      p.link = static_cast<LinkType>(w.link);
      p.nvlinkCount = w.nvlinkCount;
      p.driverPeerAccess = w.driverPeerAccess != 0;
      p.driverAtomics = w.driverAtomics != 0;
      p.linkGBps = w.linkGBps;
      p.pcieRelation = std::string(w.relation, strnlen(w.relation, sizeof(w.relation)));
    }
  }
}

const char* CommContext::localTransportRefusal(const char* single) const {
  if (nranks < 2) return single;
  if (nranks > kMaxLocalRanks) return "more than 8 ranks";
  if (!facts.sameHost) return "ranks on several hosts";
  return nullptr;
}

WorkspaceHeader CommContext::headerOfThisRank(uint64_t layoutHash) const {
  WorkspaceHeader h{};
  h.magic = kWorkspaceMagic;
  h.layoutVersion = kWorkspaceLayoutVersion;
  h.rank = rank;
  h.nranks = nranks;
  h.layoutHash = layoutHash;
  return h;
}

WaitControl* CommContext::newWaitControl(LocalState* state, WorkspaceHeader* ownHeader,
                                         WorkspaceHeader* const* peerHeaders) {
  WaitControl w{};
  w.hostAbort = failure->deviceAbort();
  w.error = failure->deviceError();
  w.state = state;
  w.ownHeader = ownHeader;
  for (int r = 0; r < nranks; ++r) w.peerHeaders[r] = peerHeaders[r];
  w.timeoutNs = static_cast<uint64_t>(cfg.timeoutMs) * 1000000ull;
  w.rank = rank;
  w.nranks = nranks;
  WaitControl* d = nullptr;
  ANYR_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&d), sizeof(WaitControl)));
  // On the internal stream, bounded: cudaMemcpy would queue behind the application's work on
  // the legacy default stream. (A copy from pageable memory returns once it is staged.)
  waitStreamIdle(internalStream, "the wait control's copy");
  ANYR_CUDA_CHECK(cudaMemcpyAsync(d, &w, sizeof(w), cudaMemcpyHostToDevice, internalStream));
  waitStreamIdle(internalStream, "the wait control's copy");
  return d;
}

template <typename Query>
bool CommContext::doneWithin(Query&& query, int ms) {
  auto deadline = Clock::now() + std::chrono::milliseconds(ms);
  while (true) {
    cudaError_t e = query();
    if (e == cudaSuccess) return true;
    if (e != cudaErrorNotReady) ANYR_CUDA_CHECK(e);
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

bool CommContext::streamIdleWithin(cudaStream_t s, int ms) {
  return doneWithin([s] { return cudaStreamQuery(s); }, ms);
}

bool CommContext::eventDoneWithin(cudaEvent_t ev, int ms) {
  return doneWithin([ev] { return cudaEventQuery(ev); }, ms);
}

void CommContext::waitStreamIdle(cudaStream_t s, const char* what, int graceMs) {
  const int ms = cfg.timeoutMs + graceMs;
  if (streamIdleWithin(s, ms)) return;
  failure->throwIfFailed();  // a kernel's own timeout names the rank it waited for
  throwError(anyrTimeout, std::string("rank ") + std::to_string(rank) + ": " + what +
                              " did not finish within " + std::to_string(ms) + " ms");
}

}  // namespace anyr
