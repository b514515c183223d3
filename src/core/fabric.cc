// The fabric measured live (core/fabric.h): the schedule every rank follows, the kernels'
// launches over the peer workspace, the exchange of the rows, the cached record, and applying
// the agreed record.
#include "core/fabric.h"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <vector>

#include "base/env.h"
#include "base/error.h"
#include "base/log.h"
#include "core/context.h"
#include "core/host_transport.h"
#include "core/peer_workspace.h"
#include "core/selftest.h"
#include "core/timing_events.h"
#include "select/tuning.h"
#include "topology/islands.h"
#include "transport/check.h"
#include "transport/fabric_kernels.h"

namespace anyr {

namespace {

using Clock = std::chrono::steady_clock;

// Bound of one device wait of the measurement: generous next to the microseconds a healthy
// round takes (ranks time-sliced on one GPU, a first launch loading its module), and well
// inside the communicator's timeout, so that the peers of a rank that gave up reach the next
// bootstrap exchange before it runs out.
constexpr int kMaxWaitMs = 5000;
// Bytes per transfer: a pair's timed copy (twice per direction, after a smaller warm-up), each
// rank's copy to each peer all at once, and to its ring neighbour; all within the measurement
// region (the staging, 4 x ANYR_CHUNK_BYTES: 32 MiB by default, at least 256 KiB).
constexpr uint64_t kPairBytes = 1ull << 20;
constexpr uint64_t kWarmBytes = 256ull << 10;
constexpr uint64_t kAllToAllBytes = 512ull << 10;
constexpr uint64_t kRingBytes = 1ull << 20;
// The copy engines' pulls from the ring neighbour: kRingBytes each, back to back, so that the
// skew of the ranks' starts is small beside them.
constexpr int kRingCopyPulls = 4;
// Through the host segment, in its copy area (host-copy's buffer, whose bytes no launch keeps
// from one launch to the next): the flags of the rounds first (kFabricWords per source rank),
// then the bytes. Each copy engine's copies: this many bytes (at most the area), kHostCopies
// times back to back, so that the skew of the ranks' starts is small beside them.
constexpr uint64_t kHostFlagBytes = 4096;
constexpr uint64_t kHostCopyBytes = 4ull << 20;
constexpr int kHostCopies = 4;
static_assert(kHostFlagBytes >= sizeof(uint32_t) * kMaxLocalRanks * kFabricWords,
              "the host rounds' flags fit before the bytes");
// fabric-slow-writes:R divides rank R's write bandwidths by this (tests only).
constexpr double kInjectedSlowWrites = 50.0;

// Timing slots: per peer (write warm-up and two timed, read likewise, the round trip), then the
// fabric under load (all-to-all twice, ring twice, synchronisation rounds, one-partner rounds,
// inside the islands twice), the synchronisation rounds through the host memory.
constexpr int kPairSlots = 7;
constexpr int kLoadSlot = kMaxLocalRanks * kPairSlots;
constexpr int kHostSlot = kLoadSlot + 8;
constexpr int kSlots = kHostSlot + 1;

struct Results {
  FabricStatus status;
  FabricTimes times[kSlots];
};

// Repeats: the flag kernels' warm-up and timed rounds, and the passes of each transfer under
// load (the best counts). Ranks that share a GPU take turns on it in time slices (every wait of
// every rank at once costs slices, not microseconds) and their figures are not applied: they
// run every step of the protocol once.
struct Repeats {
  int warm, timed, passes;
};
constexpr Repeats kDistinctRepeats{2, 16, 2};
constexpr Repeats kSharedRepeats{0, 1, 1};

double gbps(const FabricTimes& t, uint64_t bytes) {
  if (t.startNs == ~0ull || t.endNs <= t.startNs) return -1;
  return static_cast<double>(bytes) / static_cast<double>(t.endNs - t.startNs);  // bytes/ns
}

double usPer(const FabricTimes& t, int count, double divide) {
  if (t.endNs <= t.startNs || count <= 0) return -1;
  return static_cast<double>(t.endNs - t.startNs) / 1000.0 / count / divide;
}

const char* whatName(int32_t what) {
  switch (what) {
    case kFabricWhatBarrier:
      return "the barrier before a transfer";
    case kFabricWhatSync:
      return "a synchronisation round";
    case kFabricWhatRoundTrip:
      return "a flag round trip";
    case kFabricWhatHop:
      return "a one-partner round";
  }
  return "a wait";
}

// What every step of one measurement needs: where things are, the bounds, and the device
// results with their host copy.
struct Plan {
  int n = 0, me = 0;
  cudaStream_t s = nullptr;
  int waitMs = 0;   // device waits
  int drainMs = 0;  // host waits for the stream
  uint64_t regionBytes = 0;
  int blocks = 0;
  Repeats rounds{};
  // The other members of this rank's island, where the ranks form islands (every rank measures
  // its island at once; none where there is one island).
  bool islands = false;
  std::vector<int> islandPeers;
  FabricPeers peers{};
  // The same through the host segment: each rank's flags and slots in its region's copy area.
  FabricPeers hostPeers{};
  Results* d = nullptr;
  Results h{};
};

// Waits (bounded) for the stream, then copies the results back. *hung where the stream did not
// drain: a kernel may still write, so nothing more is launched or freed.
void drainAndRead(CommContext& ctx, Plan& plan, const char* what, bool* hung) {
  for (int pass = 0; pass < 2; ++pass) {
    if (!ctx.streamIdleWithin(plan.s, plan.drainMs)) {
      *hung = true;
      throwError(anyrTimeout, std::string(what) + " did not finish within " +
                                  std::to_string(plan.drainMs) + " ms");
    }
    if (pass == 0) {
      ANYR_CUDA_CHECK(
          cudaMemcpyAsync(&plan.h, plan.d, sizeof(Results), cudaMemcpyDeviceToHost, plan.s));
    }
  }
}

std::string describeWait(const Plan& plan, const FabricStatus& st) {
  const std::string what = std::string(whatName(st.what)) + ", step " + std::to_string(st.step);
  if (st.code == kFabricPeerGaveUp) {
    return "rank " + std::to_string(st.peer) + " gave up (" + what + ")";
  }
  return "timed out after " + std::to_string(plan.waitMs) + " ms waiting for rank " +
         std::to_string(st.peer) + " (" + what + ")";
}

// This rank's turn: the pairs it is the source of, one peer after the other.
void measurePairs(CommContext& ctx, Plan& plan, FabricRow* row, bool* hung) {
  const int me = plan.me;
  char* mine = plan.peers.region[me];
  const uint64_t pair = std::min(plan.regionBytes, kPairBytes) / 16 * 16;
  const uint64_t warm = std::min(plan.regionBytes, kWarmBytes) / 16 * 16;
  auto copy = [&](void* dst, const void* src, uint64_t bytes, int slot) {
    FabricCopy c{};
    c.dst[0] = dst;
    c.src[0] = src;
    c.segs = 1;
    c.n16 = bytes / 16;
    ANYR_CUDA_CHECK(
        launchFabricCopy(c, plan.blocks, &plan.d->times[slot], &plan.d->status, plan.s));
  };
  for (int p = 0; p < plan.n; ++p) {
    if (p == me || plan.peers.region[p] == nullptr) continue;
    const PairInfo& pi = ctx.topo.pair(me, p);
    const int b = p * kPairSlots;
    if (pi.peerWriteOk) {
      copy(plan.peers.region[p], mine, warm, b);
      copy(plan.peers.region[p], mine, pair, b + 1);
      copy(plan.peers.region[p], mine, pair, b + 2);
    }
    if (pi.peerReadOk) {
      copy(mine, plan.peers.region[p], warm, b + 3);
      copy(mine, plan.peers.region[p], pair, b + 4);
      copy(mine, plan.peers.region[p], pair, b + 5);
    }
    if (pi.peerWriteOk && pi.peerReadOk) {
      ANYR_CUDA_CHECK(launchFabricRoundTrip(
          plan.peers.flags[p] + me * kFabricWords + kFabricLatencyWord, p, plan.rounds.warm,
          plan.rounds.timed, plan.peers.timeoutNs, &plan.d->times[b + 6], &plan.d->status, plan.s));
    }
  }
  drainAndRead(ctx, plan, "its pairs' transfers", hung);
  if (plan.h.status.code != kFabricOk) {
    throwError(anyrTimeout, "a flag round trip to rank " + std::to_string(plan.h.status.peer) +
                                "'s memory did not complete within " + std::to_string(plan.waitMs) +
                                " ms");
  }
  for (int p = 0; p < plan.n; ++p) {
    if (p == me) continue;
    const FabricTimes* t = &plan.h.times[p * kPairSlots];
    row->writeGBps[p] = std::max(gbps(t[1], pair), gbps(t[2], pair));
    row->readGBps[p] = std::max(gbps(t[4], pair), gbps(t[5], pair));
    row->latencyUs[p] = usPer(t[6], plan.rounds.timed, 2.0);  // half a round trip
  }
}

// Every rank at once: all-to-all and ring stores (each twice, after a barrier), then the
// synchronisation rounds and the one-partner rounds, then, where there are islands, stores into
// every other member of the own island (twice, after a barrier; a rank alone in its island takes
// part in the barriers only), then the copy engines pulling from the previous rank (after a
// barrier). A wait that failed is recorded in `row`, naming the rank waited for.
void measureLoad(CommContext& ctx, Plan& plan, FabricRow* row, bool* hung) {
  const int n = plan.n;
  const int me = plan.me;
  const FabricPeers& fp = plan.peers;
  const uint64_t a2a = std::min(fp.slotBytes, kAllToAllBytes) / 16 * 16;
  const uint64_t ring = std::min(fp.slotBytes, kRingBytes) / 16 * 16;
  // This rank's own slot of its own region: no peer writes there.
  const char* own = fp.region[me] + fp.slotBytes * static_cast<uint64_t>(me);
  FabricCopy all{};
  all.n16 = a2a / 16;
  for (int q = 0; q < n; ++q) {
    if (q == me) continue;
    all.dst[all.segs] = fp.region[q] + fp.slotBytes * static_cast<uint64_t>(me);
    all.src[all.segs] = own;
    ++all.segs;
  }
  FabricCopy next{};
  next.segs = 1;
  next.n16 = ring / 16;
  next.dst[0] = fp.region[(me + 1) % n] + fp.slotBytes * static_cast<uint64_t>(me);
  next.src[0] = own;
  Results* d = plan.d;
  uint32_t seq = 0;
  // Slots: all-to-all passes at kLoadSlot + 0, 1; ring passes at + 2, 3. Every pass starts
  // after a barrier, so every rank's stores run at once.
  for (int kind = 0; kind < 2; ++kind) {
    for (int pass = 0; pass < plan.rounds.passes; ++pass) {
      ANYR_CUDA_CHECK(launchFabricBarrier(fp, ++seq, &d->status, plan.s));
      ANYR_CUDA_CHECK(launchFabricCopy(kind == 0 ? all : next, plan.blocks,
                                       &d->times[kLoadSlot + 2 * kind + pass], &d->status, plan.s));
    }
  }
  ANYR_CUDA_CHECK(launchFabricSyncRounds(fp, plan.rounds.warm, plan.rounds.timed,
                                         &d->times[kLoadSlot + 4], &d->status, plan.s));
  ANYR_CUDA_CHECK(launchFabricHopRounds(fp, plan.rounds.warm, plan.rounds.timed,
                                        &d->times[kLoadSlot + 5], &d->status, plan.s));
  FabricCopy island{};
  island.n16 = a2a / 16;
  for (int q : plan.islandPeers) {
    island.dst[island.segs] = fp.region[q] + fp.slotBytes * static_cast<uint64_t>(me);
    island.src[island.segs] = own;
    ++island.segs;
  }
  for (int pass = 0; plan.islands && pass < plan.rounds.passes; ++pass) {
    ANYR_CUDA_CHECK(launchFabricBarrier(fp, ++seq, &d->status, plan.s));
    if (island.segs > 0) {
      ANYR_CUDA_CHECK(launchFabricCopy(island, plan.blocks, &d->times[kLoadSlot + 6 + pass],
                                       &d->status, plan.s));
    }
  }
  // ring-copy's pattern: after a barrier, this rank's copy engine pulls kRingCopyPulls times
  // from the previous rank's own slot of its region (no rank writes there in this step) into
  // its own region's slot of that rank (no rank reads there), every rank at once, timed by
  // events around the copies.
  const int prev = (me + n - 1) % n;
  const uint64_t slotOfPrev = fp.slotBytes * static_cast<uint64_t>(prev);
  const TimingEvents ev(2);
  ANYR_CUDA_CHECK(launchFabricBarrier(fp, ++seq, &d->status, plan.s));
  ANYR_CUDA_CHECK(cudaEventRecord(ev[0], plan.s));
  for (int k = 0; k < kRingCopyPulls; ++k) {
    ANYR_CUDA_CHECK(cudaMemcpyAsync(fp.region[me] + slotOfPrev, fp.region[prev] + slotOfPrev, ring,
                                    cudaMemcpyDeviceToDevice, plan.s));
  }
  ANYR_CUDA_CHECK(cudaEventRecord(ev[1], plan.s));
  drainAndRead(ctx, plan, "the transfers under load", hung);
  const FabricStatus& st = plan.h.status;
  if (st.code != kFabricOk) {
    failFabricRow(row, "measuring under load: " + describeWait(plan, st), st.peer);
    return;
  }
  float pullMs = 0;
  ANYR_CUDA_CHECK(cudaEventElapsedTime(&pullMs, ev[0], ev[1]));
  if (pullMs > 0) {
    row->ringCopyGBps = static_cast<double>(ring) * kRingCopyPulls / (pullMs * 1e6);  // bytes/ns
  }
  const FabricTimes* t = &plan.h.times[kLoadSlot];
  const uint64_t allBytes = static_cast<uint64_t>(n - 1) * a2a;
  row->allToAllGBps = std::max(gbps(t[0], allBytes), gbps(t[1], allBytes));
  row->ringGBps = std::max(gbps(t[2], ring), gbps(t[3], ring));
  row->syncUs = usPer(t[4], plan.rounds.timed, 1.0);
  row->hopUs = usPer(t[5], plan.rounds.timed, 1.0);
  if (plan.islands) {
    const uint64_t islandBytes = plan.islandPeers.size() * a2a;
    row->islandGBps =
        plan.islandPeers.empty() ? 0.0 : std::max(gbps(t[6], islandBytes), gbps(t[7], islandBytes));
  }
}

// Every rank at once through the host segment: after a barrier through it, this rank's copy
// engines copy device-to-host into its own copy area and host-to-device out of the previous
// rank's, at once (as host-copy runs them), kHostCopies times each, timed by events; then the
// synchronisation rounds through the host memory. A wait that failed is recorded in `row`: as
// the host step's own failure where `alone` is false (the peer figures stand), else as the row's.
void measureHost(CommContext& ctx, HostTransport& host, Plan& plan, FabricRow* row, bool alone,
                 bool* hung) {
  const HostLayout& l = host.layout();
  HostTransport::HostCopyResources& c = host.copy();
  const int n = plan.n;
  const int me = plan.me;
  const uint64_t bytes = std::min(kHostCopyBytes, l.copyBytes - kHostFlagBytes) / 4096 * 4096;
  auto area = [&](int r) {
    return host.memory()->host() + static_cast<uint64_t>(r) * l.rankBytes + l.copyOffset +
           kHostFlagBytes;
  };
  const TimingEvents ev(5);
  // ev[0]: the barrier passed; ev[1], ev[2]: the device-to-host copies; ev[3], ev[4]: the
  // host-to-device copies.
  ANYR_CUDA_CHECK(launchFabricBarrier(plan.hostPeers, 1, &plan.d->status, plan.s));
  ANYR_CUDA_CHECK(cudaEventRecord(ev[0], plan.s));
  ANYR_CUDA_CHECK(cudaStreamWaitEvent(c.d2h, ev[0], 0));
  ANYR_CUDA_CHECK(cudaStreamWaitEvent(c.h2d, ev[0], 0));
  ANYR_CUDA_CHECK(cudaEventRecord(ev[1], c.d2h));
  ANYR_CUDA_CHECK(cudaEventRecord(ev[3], c.h2d));
  for (int k = 0; k < kHostCopies; ++k) {
    ANYR_CUDA_CHECK(cudaMemcpyAsync(area(me), c.sendStage, bytes, cudaMemcpyDeviceToHost, c.d2h));
    ANYR_CUDA_CHECK(
        cudaMemcpyAsync(c.recvStage, area((me + n - 1) % n), bytes, cudaMemcpyHostToDevice, c.h2d));
  }
  ANYR_CUDA_CHECK(cudaEventRecord(ev[2], c.d2h));
  ANYR_CUDA_CHECK(cudaEventRecord(ev[4], c.h2d));
  ANYR_CUDA_CHECK(cudaStreamWaitEvent(plan.s, ev[2], 0));
  ANYR_CUDA_CHECK(cudaStreamWaitEvent(plan.s, ev[4], 0));
  ANYR_CUDA_CHECK(launchFabricSyncRounds(plan.hostPeers, plan.rounds.warm, plan.rounds.timed,
                                         &plan.d->times[kHostSlot], &plan.d->status, plan.s));
  drainAndRead(ctx, plan, "the transfers through host memory", hung);
  const FabricStatus& st = plan.h.status;
  if (st.code != kFabricOk) {
    const std::string why = "measuring through host memory: " + describeWait(plan, st);
    if (alone) {
      failFabricRow(row, why, st.peer);
    } else {
      failFabricHost(row, why, st.peer);
    }
    return;
  }
  float d2hMs = 0, h2dMs = 0;
  ANYR_CUDA_CHECK(cudaEventElapsedTime(&d2hMs, ev[1], ev[2]));
  ANYR_CUDA_CHECK(cudaEventElapsedTime(&h2dMs, ev[3], ev[4]));
  const double moved = static_cast<double>(bytes) * kHostCopies;
  if (d2hMs > 0 && h2dMs > 0) {
    row->hostGBps = std::min(moved / (d2hMs * 1e6), moved / (h2dMs * 1e6));  // bytes/ns
  }
  row->hostStepUs = usPer(plan.h.times[kHostSlot], plan.rounds.timed, 1.0);
}

}  // namespace

void Fabric::atInit() {
  record_ = FabricRecord{};
  // Rank 0's tests-only switch, asked on every rank alike (a broadcast).
  testApply_ = ctx_.testValueOfRank0("ANYR_TEST_FABRIC_APPLY", 1) == 1;
  if (ctx_.cfg.fabric == FabricMode::Off) {
    record_.state = FabricRecord::State::Off;
    ANYR_LOG(Info, ctx_.rank, "fabric: " << fabricSummary(record_));
    return;
  }
  if (!ctx_.facts.peerMemory && !ctx_.facts.hostMemory) {
    record_.reason = "not measured: no peer workspace (" + ctx_.facts.peerMemoryReason +
                     ") and no host segment (" + ctx_.facts.hostMemoryReason + ")";
    return;
  }
  FabricRecord cached;
  std::string why;
  if (loadCached(&cached, &why)) {
    install(cached, nullptr);
    if (ctx_.rank == 0) ANYR_LOG(Info, ctx_.rank, "fabric: " << fabricSummary(record_));
    return;
  }
  if (ctx_.cfg.fabric == FabricMode::Cached) {
    FabricRecord none;
    none.reason = "not measured: ANYR_FABRIC=cached and " +
                  (why.empty() ? std::string("no tuning file (ANYR_TUNING_FILE)") : why);
    install(none, nullptr);
    if (ctx_.rank == 0) ANYR_LOG(Warn, ctx_.rank, "fabric: " << fabricSummary(record_));
    return;
  }
  FabricRecord m = measure("measured at init");
  failedBefore_ = !m.hasFigures();
  if (!why.empty()) {
    m.reason +=
        (m.reason.empty() ? "" : "; ") + std::string("the cached record was not used: ") + why;
  }
  install(m, nullptr);
  if (ctx_.rank == 0) {
    if (failedBefore_) {
      ANYR_LOG(Warn, ctx_.rank, "fabric: " << fabricSummary(record_));
    } else {
      ANYR_LOG(Info, ctx_.rank, "fabric: " << fabricSummary(record_));
    }
  }
}

bool Fabric::refreshForTuning(std::mutex& topoMu) {
  if (ctx_.cfg.fabric != FabricMode::Measure ||
      (!ctx_.facts.peerMemory && !ctx_.facts.hostMemory) || failedBefore_ ||
      record_.state == FabricRecord::State::Measured) {
    return false;
  }
  // No kernel of this rank's last call may still use the staging the measurement writes into;
  // measure() starts with an exchange, so no rank's is in flight once it copies.
  if (ctx_.haveLastWork) (void)ctx_.eventDoneWithin(ctx_.lastWork, ctx_.cfg.timeoutMs);
  FabricRecord m = measure("measured by anyrCommTune");
  if (!m.hasFigures()) {
    failedBefore_ = true;
    std::lock_guard<std::mutex> lock(topoMu);
    record_.reason += (record_.reason.empty() ? "" : "; ") +
                      std::string("measuring again for anyrCommTune failed: ") + m.reason;
    if (ctx_.rank == 0) ANYR_LOG(Warn, ctx_.rank, "fabric: " << fabricSummary(record_));
    return false;
  }
  install(m, &topoMu);
  if (ctx_.rank == 0) ANYR_LOG(Info, ctx_.rank, "fabric: " << fabricSummary(record_));
  return true;
}

void Fabric::install(FabricRecord r, std::mutex* topoMu) {
  r.applied = r.hasFigures() && (ctx_.facts.distinctDevices || testApply_);
  if (r.hasFigures() && !r.applied) {
    r.reason =
        "not applied: ranks share a GPU (the figures are that GPU's own memory, not a "
        "fabric's)" +
        (r.reason.empty() ? std::string() : "; " + r.reason);
  }
  // Every rank combined the same rows (or parsed rank 0's text): a rank that holds another
  // record would choose differently, so it is named here rather than left to diverge.
  const std::vector<uint64_t> hashes = ctx_.bs->allGatherValue(fabricHash(r));
  for (int q = 0; q < ctx_.nranks; ++q) {
    if (hashes[static_cast<size_t>(q)] != hashes[0]) {
      throwError(anyrInternalError, "fabric: rank " + std::to_string(q) +
                                        " holds another fabric record than rank 0 (" +
                                        fabricSummary(r) + " here, on rank " +
                                        std::to_string(ctx_.rank) + ")");
    }
  }
  std::unique_lock<std::mutex> lock;
  if (topoMu != nullptr) lock = std::unique_lock<std::mutex>(*topoMu);
  clearFabricFigures(&ctx_.topo);
  applyFabric(r, &ctx_.topo);
  record_ = std::move(r);
}

bool Fabric::loadCached(FabricRecord* out, std::string* why) {
  struct Head {
    int32_t ok;
    int32_t pad;
    uint64_t len;
  };
  Head h{0, 0, 0};
  std::string text;
  if (ctx_.rank == 0 && !ctx_.cfg.tuningFile.empty()) {
    FabricRecord r;
    std::string whyNot;
    if (loadFabricFor(ctx_.cfg.tuningFile, fingerprintOf(ctx_.topo, ctx_.nranks), &r, &whyNot)) {
      h.ok = 1;
      text = fabricToJson(r, -1);
    } else {
      text = whyNot;
    }
  }
  h.len = text.size();
  ctx_.bs->broadcast(&h, sizeof(h), 0);
  text.resize(static_cast<size_t>(h.len));
  if (h.len > 0) ctx_.bs->broadcast(text.data(), text.size(), 0);
  if (h.ok == 0) {
    *why = text;
    if (ctx_.rank == 0 && !text.empty()) ANYR_LOG(Info, ctx_.rank, "fabric: " << text);
    return false;
  }
  *out = fabricFromJson(text);
  return true;
}

FabricRecord Fabric::measure(const std::string& what) {
  const auto t0 = Clock::now();
  const int n = ctx_.nranks;
  const int me = ctx_.rank;
  FabricRow row = emptyFabricRow();
  // A step of this rank: its failure is recorded in the row and the rank goes on taking part.
  auto local = [&](const char* step, auto&& fn) {
    if (row.status != FabricRow::kOk) return;
    try {
      fn();
    } catch (const Error& e) {
      failFabricRow(&row, std::string(step) + ": " + e.what());
      (void)cudaGetLastError();
    }
  };
  // After each exchange every rank knows whether any failed: later device steps are skipped
  // on every rank alike.
  bool skip = false;
  auto exchange = [&] {
    for (int32_t st : ctx_.bs->allGatherValue(row.status)) skip = skip || st != FabricRow::kOk;
  };
  Plan plan;
  // The islands of the two-level all-reduce, as dispatch derives them (the agreed topology and
  // configuration, whose ANYR_ISLANDS init checked: the same on every rank).
  const Islands islands = islandsOf(ctx_.topo, ctx_.cfg.islands, n);
  if (ctx_.facts.peerMemory && islands.count() >= 2) {
    plan.islands = true;
    for (const std::vector<int>& members : islands.members) {
      if (std::find(members.begin(), members.end(), me) == members.end()) continue;
      for (int q : members) {
        if (q != me) plan.islandPeers.push_back(q);
      }
    }
  }
  if (hung_) failFabricRow(&row, "an earlier measurement's kernels had not finished");
  local("preparing", [&] {
    plan.n = n;
    plan.me = me;
    plan.s = ctx_.internalStream;
    plan.waitMs = std::max(1, std::min(kMaxWaitMs, ctx_.cfg.timeoutMs / 4));
    plan.drainMs = plan.waitMs + std::max(1, std::min(2000, ctx_.cfg.timeoutMs / 4));
    plan.blocks = 2 * std::max(1, ctx_.topo.gpus[static_cast<size_t>(me)].smCount);
    plan.rounds = ctx_.facts.distinctDevices ? kDistinctRepeats : kSharedRepeats;
    FabricPeers& fp = plan.peers;
    fp.rank = me;
    fp.nranks = n;
    fp.timeoutNs = static_cast<unsigned long long>(plan.waitMs) * 1000000ull;
    plan.hostPeers = fp;
    if (ctx_.facts.peerMemory) {
      const WorkspaceLayout& l = ws_.layout();
      plan.regionBytes = (l.tsOffset - l.stagingOffset) / 4096 * 4096;
      for (int r = 0; r < n; ++r) {
        char* base = r == me ? ws_.memory()->local() : ws_.memory()->peer(r);
        if (base == nullptr) continue;
        fp.flags[r] =
            reinterpret_cast<uint32_t*>(base + l.checkOffset + offsetof(CheckArea, fabric));
        fp.region[r] = base + l.stagingOffset;
      }
      fp.slotBytes = plan.regionBytes / static_cast<uint64_t>(n) / 4096 * 4096;
    }
    if (ctx_.facts.hostMemory) {
      const HostLayout& hl = host_.layout();
      FabricPeers& hp = plan.hostPeers;
      for (int r = 0; r < n; ++r) {
        char* area =
            host_.memory()->device() + static_cast<uint64_t>(r) * hl.rankBytes + hl.copyOffset;
        hp.flags[r] = reinterpret_cast<uint32_t*>(area);
        hp.region[r] = area + kHostFlagBytes;
      }
      hp.slotBytes = (hl.copyBytes - kHostFlagBytes) / static_cast<uint64_t>(n) / 16 * 16;
    }
    // The timing slots, and this rank's flags zeroed before any peer writes them (the exchange
    // below comes after the stream drained).
    ANYR_CUDA_CHECK(preloadFabricKernels());
    std::memset(&plan.h, 0, sizeof(plan.h));
    for (FabricTimes& t : plan.h.times) t = {~0ull, 0ull};
    ANYR_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&plan.d), sizeof(Results), plan.s));
    ANYR_CUDA_CHECK(
        cudaMemcpyAsync(plan.d, &plan.h, sizeof(Results), cudaMemcpyHostToDevice, plan.s));
    if (ctx_.facts.peerMemory) {
      ANYR_CUDA_CHECK(cudaMemsetAsync(fp.flags[me], 0, sizeof(CheckArea::fabric), plan.s));
    }
    if (ctx_.facts.hostMemory) {
      ANYR_CUDA_CHECK(cudaMemsetAsync(plan.hostPeers.flags[me], 0, kHostFlagBytes, plan.s));
    }
    if (!ctx_.streamIdleWithin(plan.s, plan.drainMs)) {
      hung_ = true;
      throwError(anyrTimeout, "the communicator's stream did not drain within " +
                                  std::to_string(plan.drainMs) + " ms");
    }
  });
  exchange();
  // The pairs: one rank at a time, the others idle.
  const bool peers = ctx_.facts.peerMemory;
  for (int t = 0; peers && t < n; ++t) {
    if (t == me && !skip)
      local("measuring its pairs", [&] { measurePairs(ctx_, plan, &row, &hung_); });
    exchange();
  }
  // The fabric under load needs every ordered pair: the same answer on every rank (the
  // transfer checks' results were gathered).
  std::string pairNote;
  for (int s = 0; peers && s < n && pairNote.empty(); ++s) {
    for (int d = 0; d < n && pairNote.empty(); ++d) {
      const PairInfo& p = ctx_.topo.pair(s, d);
      if (s != d && !(p.peerWriteOk && p.peerReadOk)) {
        pairNote = "rank " + std::to_string(s) + " -> rank " + std::to_string(d) +
                   " failed its transfer check";
      }
    }
  }
  const FaultInjection fault = parseFaultInjection(env::getString("ANYR_FAULT_INJECT"));
  if (peers && !skip && pairNote.empty()) {
    if (fault.kind == FaultInjection::FabricFails && fault.rank == me) {
      // Silently: the peers' device waits for this rank must run out on their own.
      failFabricRow(&row, "measuring under load: failed by ANYR_FAULT_INJECT=fabric-fail:" +
                              std::to_string(me));
    } else {
      local("measuring under load", [&] { measureLoad(ctx_, plan, &row, &hung_); });
    }
  }
  exchange();
  // Through the host memory. Where the peers were measured too, a failure of this step leaves
  // only its own figures unmeasured; alone, it is the measurement's failure.
  if (ctx_.facts.hostMemory && !skip && !hung_) {
    if (!peers) {
      local("measuring through host memory",
            [&] { measureHost(ctx_, host_, plan, &row, true, &hung_); });
    } else {
      try {
        measureHost(ctx_, host_, plan, &row, false, &hung_);
      } catch (const Error& e) {
        failFabricHost(&row, std::string("measuring through host memory: ") + e.what());
        (void)cudaGetLastError();
      }
    }
  }
  if (fault.kind == FaultInjection::FabricSlowWrites && fault.rank == me) {
    for (double& w : row.writeGBps) {
      if (w > 0) w /= kInjectedSlowWrites;
    }
  }
  row.elapsedMs = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  const std::vector<FabricRow> rows = ctx_.bs->allGatherValue(row);
  // Every rank's kernels are done (or gave up): the results go, unless this rank's stream
  // never drained (a kernel may still write them).
  if (plan.d != nullptr && !hung_) {
    (void)cudaFreeAsync(plan.d, ctx_.internalStream);
    (void)cudaGetLastError();
  }
  FabricRecord r = combineFabric(rows, what + " (" + std::to_string(n) + " ranks)",
                                 plan.islands ? islands.text() : std::string());
  auto note = [&](const std::string& text) {
    r.reason = text + (r.reason.empty() ? "" : "; " + r.reason);
  };
  if (r.hasFigures() && !pairNote.empty()) note("under load not measured: " + pairNote);
  if (r.hasFigures() && !peers) {
    note("pairs and peer transfers not measured: no peer workspace (" +
         ctx_.facts.peerMemoryReason + ")");
  }
  return r;
}

}  // namespace anyr
