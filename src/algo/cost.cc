#include "algo/cost.h"

#include <algorithm>
#include <cmath>

#include "algo/doubling_schedule.h"
#include "algo/ring_plan.h"
#include "device/host_handles.h"

namespace anyr {

namespace {

// Model constants. They are a seed, not a measurement: tuning replaces every choice they make.
// Efficiencies are the fraction of a link's measured one-pair bandwidth an algorithm reaches
// when every rank moves data at once (one-shot: every rank stores its whole message into
// every peer while peers read theirs; two-shot: half the traffic per phase; NCCL: pipelined
// ring, the best at large sizes, kEffNccl). Latencies: a kernel launch inside a graph
// (kLaunchUs), and NCCL's fixed per-call cost on top of its ring's hops.
constexpr double kEffOneShot = 0.5;
constexpr double kEffOneShotRead = 0.8;  // loads pipeline deeper than stores (2 x H200: 1-16 MB)
constexpr double kEffTwoShot = 0.8;
// The staged one-shots' one flow per link: a kernel's stores (or loads) to one peer at about 0.8
// of the pair's figure, which the sourced fixtures take from copy-engine tests
// (p2pBandwidthLatencyTest); on these boxes copy engines are ~24% faster than kernel writes
// (flashinfer#4393), and NCCL's pipelined ring reaches 0.7 (kEffNccl).
constexpr double kEffStaged = 0.8;
// NCCL's fixed per-call cost on top of its ring's hops, and what its LL128 / simple protocols
// add to it. Calibrated on 2 x H200 (docs/PERFORMANCE.md, "Cost model": 1 KB 5.9 us, 1 MB 14.0,
// 16 MB 77.5) and on published 8 x RTX PRO 6000 figures (24 us from 256 B to 64 KB, 28 us at
// 256 KB; tests/fixtures/rtxpro6000_8gpu_switches.json). The ring's hops overlap its data: a
// call costs the longer of the two.
constexpr double kNcclBaseUs = 4.0;
constexpr double kNcclLL128ExtraUs = 7.0;
// Through host memory (no peer path): 10 us at 1 KB on 2 x H200 with NCCL_P2P_DISABLE=1, a base
// of 24 us above 64 KB of ring traffic (35.7 us at 256 KB, 62.4 at 1 MB, 168 at 4 MB), and
// 42 us at 8 B on 8 x RTX 4090 (NVIDIA/nccl#1530).
constexpr double kNcclViaHostBaseUs = 5.4;
constexpr double kNcclViaHostLargeBaseUs = 19.4;
constexpr double kNcclViaHostSmallBytes = 64.0 * 1024;
// Largest message for which the seed expects the fused two-shot kernel to beat the composition.
constexpr double kFusedTwoShotMaxBytes = 16.0 * (1 << 20);
// Host-memory algorithms move their bytes the way NCCL's ring does where there is no peer path
// (SM stores into, and loads from, pinned host memory over each GPU's PCIe link), so they are
// charged on the same terms: each byte crosses the link twice (written up, read down by a
// peer), the two crossings one after the other (the one-shot's overlap of writes and reads is
// not credited), at NCCL's efficiency (kEffHost). What separates them is latency: no NCCL
// per-call base and fewer steps for small messages, but one more launch (and its steps) per
// launch buffer (ANYR_HOST_LAUNCH_BYTES) for large ones. A step (kHostStepUs) is a PCIe round
// trip plus a flag in host memory (one-shot: publish, then poll and read; two-shot: two such
// steps).
// Calibrated on 2 x H200 (PCIe Gen5 x16) with ANYR_PEER_MEMORY=0 against NCCL with
// NCCL_P2P_DISABLE=1 (docs/PERFORMANCE.md, "Cost model"): the one-shot's writes and reads do not
// overlap and its small rounds reach a fifth of the link (host-oneshot 1 KB 6.9 us, 64 KB
// 19.4 us, 1 MB 97 us); the two-shot overlaps its reduce-scatter and all-gather traffic
// (charged on the larger direction) at about 0.6 of the link (1 MB 58 us, 16 MB 553 us).
constexpr double kEffHostOneShot = 0.2 / kEffHost;
constexpr double kEffHostTwoShot = 0.6 / kEffHost;
// The one-shot's low-latency protocol (host_oneshot_ll.cu): one step, twice the bytes, writes
// and reads overlapping, in small launches spread over many SMs. Calibrated on the same machine
// (docs/PERFORMANCE.md, "Cost model", every thread polling its own lines): 1 KB 5.0-5.5 us, 16 KB
// 7.4-7.6, 32 KB 9.1-9.4, 64 KB 12.1 (NCCL 10.0, 11.3, 12.1, 15.6), i.e. about 0.47 of hostGBps.
constexpr double kEffHostLowLatency = 0.4 / kEffHost;
// host-copy (host_copy.cu): each GPU sends B up and receives (n-1) B down through its copy
// engines, writes and reads at once. Calibrated on 2 x H200 (docs/PERFORMANCE.md, "Cost model",
// NCCL_P2P_DISABLE=1): 34 us at 1 KB, 160 at 4 MB, 548 at 16 MB (two 8 MiB launches; 494 in
// one 16 MiB launch, ANYR_HOST_LAUNCH_BYTES's default since; 476 in 2 MiB copy chunks,
// ANYR_HOST_COPY_CHUNK_BYTES's default since), i.e. about 32 us per launch (the
// barrier, the fork and join, the first chunk's flag) and the link at 0.85 of hostGBps (42.8 there;
// the copy engines alone reach 43 GB/s each way), plus the wait and signal kernels per chunk.
constexpr double kEffHostCopy = 0.85;
constexpr double kHostCopyLaunchUs = 32.0;
constexpr double kHostCopyChunkUs = 2.0;

// Launches a message of `bytes` takes where one launch carries at most `capacity` bytes (0: no
// limit, one launch).
double launchesFor(double bytes, uint64_t capacity) {
  return capacity > 0 ? std::max(1.0, std::ceil(bytes / static_cast<double>(capacity))) : 1.0;
}

// Every rank sends its whole message to every peer; larger messages than a push slot (or
// staging chunk) run as several calls, each paying the launch and its rounds again. Push: one
// synchronisation round (the flags ride behind the data); pull: a handshake, then the reads.
double oneShotUs(double B, const CostInputs& in, bool push) {
  const double calls = launchesFor(B, push ? in.pushSlotBytes : in.chunkBytes);
  const double data = allToAllUs(in, B, push, push ? kEffOneShot : kEffOneShotRead);
  if (data < 0) return -1;
  // A load waits a round trip before its data arrives: pull pays the idle latency once more.
  return calls * (kLaunchUs + (push ? in.syncUs : 2 * in.syncUs + in.latencyUs)) + data;
}

// Reduce-scatter then all-gather: each phase moves B/n per pair, and each ends in a round.
// Pull adds barriers around each phase's reads. A message larger than a staging chunk runs as
// several launches.
double twoShotUsOf(double B, const CostInputs& in, bool push) {
  const double data = allToAllUs(in, 2.0 * B / in.nranks, push, kEffTwoShot);
  if (data < 0) return -1;
  const double calls = launchesFor(B, in.chunkBytes);
  return calls * (kLaunchUs + (push ? 2 * in.syncUs : 6 * in.syncUs + 2 * in.latencyUs)) + data;
}

// What a switch group's uplink carries, GB/s each way, for flows of one stream each: at least one
// flow's (the slowest cross pair's rate x kEffStaged), and where the fabric's all-to-all was
// measured, what that implies if the uplink was its bottleneck. 0: no uplink (one group).
double uplinkGBps(const CostInputs& in, bool write) {
  const int n = in.nranks;
  const double cross = write ? in.crossWriteGBps : in.crossReadGBps;
  const int g = in.largestGroup;
  if (cross <= 0 || g <= 1 || g >= n) return 0;
  double uplink = cross * kEffStaged;
  if (in.allToAllGBps > 0 && in.writeGBps > 0) {
    const double a2a = write ? in.allToAllGBps : in.allToAllGBps * in.readGBps / in.writeGBps;
    uplink = std::max(uplink, a2a * g * (n - g) / (n - 1));
  }
  return uplink;
}

// The staged one-shots (staged_push.cu, staged_pull.cu): the one-shot's bytes in n - 1 rounds,
// rank r to (or from) rank r + k in round k, so every GPU's link carries one flow each way at a
// time instead of n - 1.
//
// A round is a hop of the ring's shape: every rank passes data that doubles as the flag to one
// peer and waits for one. It is charged as in.hopUs: the fabric's measured one-partner round
// (1 KB and a flag to the next rank, a wait for the previous one's, every rank at once) where the
// load record has it, else NCCL's LL hop on that link type, 1.3 us over PCIe, what NCCL's 24 us
// at 8 ranks on the 8 x RTX PRO 6000 box leaves each of its 14 hops, never less than the slowest
// pair's idle one-way latency. Over PCIe that is also the model's own synchronisation round with
// one peer (0.45 idle + 0.85 loaded, kLoadedPerPeerPcieUs). Not the idle 0.36-0.45 us of the
// published figures: that is p2pBandwidthLatencyTest's, one GPU writing with nothing else moving,
// and the loaded 6-7 us it is set against is another tool's (p2pmark: remote reads with all 56
// flows at once; its README's 8-GPU example: 4.10 us for the best pair alone, 6.14 loaded). Within
// one tool the load costs 1.5x, not 15x, so staging does not trade a loaded round for idle hops. A
// pull round is a read's round trip: two hops.
//
// Bytes: each round moves B over each GPU's own link as one flow (the pair's rate x
// kEffStaged). A PCIe switch group's uplink still carries g (n - g) of the flows over the
// rounds: staging reorders the flows, not what crosses. Its rate: at least one flow's through
// it, and where the fabric's all-to-all was measured, what that implies if the uplink was its
// bottleneck (g (n - g) / (n - 1) x the all-to-all rate: 16/7 x 24 = 55 GB/s behind switches of
// 4 + 4, a Gen5 x16 link). The rounds run one after another and with groups of consecutive
// ranks each has some of the uplink's flows, so the time is the larger of the two totals.
// Behind switches that is the all-to-all's own time: there staging saves the loaded round, not
// bandwidth. Where there is no shared uplink (sockets, one switch) the collapse measured all to
// all is avoided.
//
// With two ranks the kernels are the one-shots' (one round), and so is the cost: the tie goes
// to the one-shot (the registry's order).
double stagedBytesUs(const CostInputs& in, double B, bool write) {
  const int n = in.nranks;
  const double pair = write ? in.writeGBps : in.readGBps;
  if (pair <= 0) return -1;
  double t = (n - 1) * B / (pair * kEffStaged * 1e3);
  const int g = in.largestGroup;
  const double uplink = uplinkGBps(in, write);
  if (uplink > 0) t = std::max(t, g * (n - g) * B / (uplink * 1e3));
  return t;
}

double stagedUs(double B, const CostInputs& in, bool push) {
  const int n = in.nranks;
  if (n <= 2) return oneShotUs(B, in, push);
  const double data = stagedBytesUs(in, B, push);
  if (data < 0) return -1;
  const double hop = in.hopUs;
  const double calls = launchesFor(B, push ? in.pushSlotBytes : in.chunkBytes);
  // Pull: the one-shot pull's handshake, then a read round trip per round.
  const double rounds = push ? (n - 1) * hop : 2 * in.syncUs + 2 * (n - 1) * hop;
  return calls * (kLaunchUs + rounds) + data;
}

// One-shot: write the own B, read the (n-1) peers' B each. Two-shot: reduce-scatter and
// all-gather, each writing and reading (n-1)/n of B (2 B (n-1)/n each way in all). A message
// larger than a launch's buffers runs as several launches.
double hostShotUs(double B, const CostInputs& in, bool one) {
  const int n = in.nranks;
  if (in.hostGBps <= 0) return -1;
  const double calls = launchesFor(B, in.hostLaunchBytes);
  const double wrote = one ? B : 2.0 * B * (n - 1) / n;
  const double read = one ? (n - 1) * B : 2.0 * B * (n - 1) / n;
  if (one && B <= static_cast<double>(in.hostLowLatencyBytes)) {
    // Low-latency protocol: one step (the flag rides in every line), twice the bytes,
    // writes and reads overlapping (kEffHostLowLatency).
    return kLaunchUs + in.hostLatencyUs +
           2.0 * std::max(wrote, read) / (in.hostGBps * kEffHostLowLatency * 1e3);
  }
  const double data = one ? (wrote + read) / (in.hostGBps * kEffHostOneShot * 1e3)
                          : std::max(wrote, read) / (in.hostGBps * kEffHostTwoShot * 1e3);
  return calls * (kLaunchUs + (one ? 2 : 4) * in.hostLatencyUs) + data;
}

}  // namespace

double allToAllUs(const CostInputs& in, double perFlowBytes, bool write, double eff) {
  const int n = in.nranks;
  const double bw = write ? in.writeGBps : in.readGBps;
  if (bw <= 0) return -1;
  // Measured all at once (stores): what every rank's egress reached, uplinks, switches and
  // sockets included. Loads scale by the slowest pair's read / write ratio.
  if (in.allToAllGBps > 0 && in.writeGBps > 0) {
    const double a2a = write ? in.allToAllGBps : in.allToAllGBps * in.readGBps / in.writeGBps;
    return (n - 1) * perFlowBytes / (a2a * 1e3);
  }
  double t = (n - 1) * perFlowBytes / (bw * eff * 1e3);
  const double cross = write ? in.crossWriteGBps : in.crossReadGBps;
  if (cross > 0) {
    const int g = in.largestGroup;
    t = std::max(t, g * (n - g) * perFlowBytes / (cross * eff * 1e3));
  }
  return t;
}

double oneShotPushUs(double B, const CostInputs& in) { return oneShotUs(B, in, true); }
double oneShotPullUs(double B, const CostInputs& in) { return oneShotUs(B, in, false); }
double twoShotPushUs(double B, const CostInputs& in) { return twoShotUsOf(B, in, true); }
double twoShotUs(double B, const CostInputs& in) { return twoShotUsOf(B, in, false); }
double stagedPushUs(double B, const CostInputs& in) { return stagedUs(B, in, true); }
double stagedPullUs(double B, const CostInputs& in) { return stagedUs(B, in, false); }
// The two-level all-reduce (islands.cu): per launch three dependent hops (gather inside the
// island, exchange between islands, all-gather inside), then the bytes, the phases charged one
// after the other (their overlap is not credited).
// - A hop under load costs the idle latency plus the queueing a loaded round shows per peer
//   (syncUs over the idle latency, per peer of the n - 1 it was taken with), for the peers the
//   hop talks to: the island's other members, or the other islands' owners of a rank's slices.
//   An island of one rank has no gather or all-gather.
// - Inside the island the gather and the all-gather each move (m - 1)/m of the message per
//   GPU, at the island's measured rate where known (islandGBps), else at its slowest pair's
//   writes at the two-shot's efficiency.
// - Between islands the values cross unreduced (the rank-order sum needs them): a GPU sends
//   (k - 1) x the message and receives (n - m)/m x it (most in the smallest island), at the
//   slowest cross pair's writes at the one-shot's efficiency (an owner stores its island's
//   values of its slices into its partners while they read theirs, as the one-shot does; with
//   islands of one rank this is the one-shot push, and costs the same); and the boundary of an
//   island of m ranks carries max(m (k - 1), n - m) x the message each way, charged at the larger
//   of the slowest cross pair's rate (the model's uplink, as in allToAllUs) and what the measured
//   all-to-all pushed across that boundary (every one of its m GPUs sending n - m of its n - 1
//   flows out: allToAllGBps x m (n - m)/(n - 1)), both of which the boundary has been seen to
//   carry.
double islandsUs(double B, const CostInputs& in) {
  const int n = in.nranks, k = in.islandCount;
  if (n < 2 || k < 2 || in.islandMin < 1 || in.islandCrossWriteGBps <= 0) return -1;
  if (in.islandMax > 1 && in.islandWriteGBps <= 0 && in.islandLoadGBps <= 0) return -1;
  const double calls = launchesFor(B, in.islandLaunchBytes);
  const double perPeer = std::max(0.0, in.syncUs - in.latencyUs) / (n - 1);
  const double gatherHop = in.latencyUs + perPeer * (in.islandMax - 1);
  const double crossHop = in.latencyUs + perPeer * in.islandCrossPeers;
  const double hops = (in.islandMax > 1 ? 2 * gatherHop : 0.0) + crossHop;
  double inside = 0;
  if (in.islandMax > 1) {
    const double rate =
        in.islandLoadGBps > 0 ? in.islandLoadGBps : in.islandWriteGBps * kEffTwoShot;
    const double m = in.islandMax;
    inside = 2.0 * (m - 1) / m * B / (rate * 1e3);
  }
  const double crossRate = in.islandCrossWriteGBps * kEffOneShot;
  const double perGpu =
      std::max<double>(k - 1, static_cast<double>(n - in.islandMin) / in.islandMin) * B /
      (crossRate * 1e3);
  double boundary = 0;
  for (const int m : {in.islandMin, in.islandMax}) {
    double uplink = crossRate;
    if (in.allToAllGBps > 0) {
      uplink = std::max(uplink, in.allToAllGBps * m * (n - m) / static_cast<double>(n - 1));
    }
    const double bytes = std::max<double>(m * (k - 1), n - m) * B;
    boundary = std::max(boundary, bytes / (uplink * 1e3));
  }
  return calls * (kLaunchUs + hops) + inside + std::max(perGpu, boundary);
}

// The doubling push (doubling_push.cu): ceil(log2 n) rounds, each a hop of the staged push's
// kind (one flow out and one in per GPU, every rank at once: the ring hop, never less than the
// idle latency), and its bytes: round j moves the vectors a rank holds (2^j of the message at
// most) over each GPU's link as one flow, at the slowest rate among that round's partner pairs
// (a round inside islands is not charged the rate between them), and over a switch group's
// uplink as many flows as the round's partners leave the group, at uplinkGBps. The rounds are
// charged one after the other, each the slower of its link and its uplink. With two ranks it is the
// one-shot push's kernel and costs the same (the tie goes to the one-shot, the registry's order).
double doublingPushUs(double B, const CostInputs& in) {
  const int n = in.nranks;
  if (n <= 2) return oneShotUs(B, in, true);
  if (in.writeGBps <= 0 || doubling::rounds(n) == 0) return -1;
  const double hop = in.hopUs;
  const double uplink = uplinkGBps(in, true);
  const bool groups = uplink > 0 && static_cast<int>(in.groupOf.size()) == n;
  const int R = doubling::rounds(n);
  double data = 0;
  for (int j = 0; j < R; ++j) {
    int vectors = 0, across = 0;
    std::vector<int> out(static_cast<size_t>(n), 0);
    for (int r = 0; r < n; ++r) {
      const doubling::Round rd = doubling::round(n, in.doublingOrder, r, j);
      vectors = std::max(vectors, __builtin_popcount(rd.send));
      if (groups && in.groupOf[static_cast<size_t>(r)] != in.groupOf[static_cast<size_t>(rd.to)]) {
        across = std::max(across, ++out[static_cast<size_t>(in.groupOf[static_cast<size_t>(r)])]);
      }
    }
    const double pair =
        j < static_cast<int>(in.doublingRoundGBps.size()) && in.doublingRoundGBps[j] > 0
            ? in.doublingRoundGBps[static_cast<size_t>(j)]
            : in.writeGBps;
    const double link = vectors * B / (pair * kEffStaged * 1e3);
    const double up = across > 0 ? across * vectors * B / (uplink * 1e3) : 0.0;
    data += std::max(link, up);
  }
  const double calls = launchesFor(B, in.pushSlotBytes);
  return calls * (kLaunchUs + R * hop) + data;
}

double hostOneShotUs(double B, const CostInputs& in) { return hostShotUs(B, in, true); }
double hostTwoShotUs(double B, const CostInputs& in) { return hostShotUs(B, in, false); }

double hostCopyUs(double B, const CostInputs& in) {
  const int n = in.nranks;
  if (in.hostGBps <= 0 || in.hostCopyChunkBytes == 0) return -1;
  const double launch = in.hostLaunchBytes > 0 ? static_cast<double>(in.hostLaunchBytes) : B;
  const double full = std::floor(B / launch);
  const double rest = B - full * launch;
  const double bw = in.hostGBps * kEffHostCopy * 1e3;  // bytes per us
  // One launch of b bytes (the full ones, then the remainder).
  auto launchUs = [&](double b) {
    const double chunk = static_cast<double>(
        hostCopyLaunchChunkBytes(static_cast<uint64_t>(b), in.hostCopyChunkBytes));
    const double chunks = std::max(1.0, std::ceil(b / chunk));
    return kHostCopyLaunchUs + chunks * kHostCopyChunkUs + std::max(1, n - 1) * b / bw;
  };
  return full * launchUs(launch) + (rest > 0 ? launchUs(rest) : 0.0);
}

double ringUs(double B, const CostInputs& in) {
  const int n = in.nranks;
  const double bw = in.ringWriteGBps * 1e3;  // bytes per us
  if (n < 2 || bw <= 0) return -1;
  // Per GPU and direction (algo/ring.cu): a rank between the ends receives the partial sums in
  // fp32 and the result, and sends as much; costed for 16-bit messages, where a partial is
  // 2 B per byte (3 B in all; for fp32 messages 2 B). Of two ranks, rank 1 receives only the
  // partials (2 B) and rank 0 only the result. NCCL's ring moves 2 (n-1)/n B (ncclUs).
  const double perGpu = (n == 2 ? 2.0 : 3.0) * B;
  // Each launch fills the pipeline: the first chunk crosses ringDepth(n) hops, each a handoff
  // (a flag to the neighbour under load: our one-partner round, hopUs) and the chunk's transfer
  // while the other streams' chunks share the link.
  const double calls = launchesFor(B, in.chunkBytes);
  const RingPlan plan =
      ringPlan(static_cast<uint64_t>(std::ceil(B / calls / 16.0)), 8, 2 * kRingMaxStreams);
  const double step =
      in.hopUs + static_cast<double>(plan.streams) * static_cast<double>(kRingSlotBytes) / bw;
  return calls * (kLaunchUs + ringDepth(n) * step) + perGpu / bw;
}

// ring-copy (ring_copy.cu): the ring's bytes per GPU, pulled by the copy engines. Its link rate:
// its own pattern measured under load where known (ringCopyGBps); else the slowest pair's
// peer-read figure, times the load the ring's own pattern costs a link (the ring figure over the
// slowest pair's stores, at most 1: measured neighbour stores under ring load, else their
// derated pair figure), times the copy engines' share of a link that host-copy was calibrated
// at (kEffHostCopy). Each launch fills the pipeline once: ringDepth(n) hops of a whole chunk
// (1 MiB of partial sums, less for a small message) plus the handoff, four stream operations a
// hop (the wait, the copy's start, the fold and the signal kernels), not yet calibrated on a
// PCIe machine.
constexpr double kRingCopyHopUs = 4 * kLaunchUs;

double ringCopyUs(double B, const CostInputs& in) {
  const int n = in.nranks;
  if (n < 2) return -1;
  double gbps = in.ringCopyGBps;
  if (gbps <= 0) {
    if (in.ringWriteGBps <= 0 || in.writeGBps <= 0 || in.readGBps <= 0) return -1;
    gbps = in.readGBps * std::min(1.0, in.ringWriteGBps / in.writeGBps) * kEffHostCopy;
  }
  const double bw = gbps * 1e3;  // bytes per us
  const double perGpu = (n == 2 ? 2.0 : 3.0) * B;
  const double calls = launchesFor(B, kRingCopyLaunchBytes);
  const double chunk = std::min(static_cast<double>(kRingCopySlotBytes), 2.0 * B / calls);
  const double step = in.hopUs + kRingCopyHopUs + chunk / bw;
  return calls * (kLaunchUs + ringDepth(n) * step) + perGpu / bw;
}

double ncclUs(double B, const CostInputs& in) {
  const int n = in.nranks;
  if (in.ringGBps <= 0) return -1;
  const double ringBytes = 2.0 * (n - 1) / n * B;
  const double hops = 2.0 * (n - 1) * in.ringHopUs;
  if (in.ncclViaHost) {
    // Through host memory the per-hop flags sit in host memory; larger messages pay a larger
    // base (the proxy's staging).
    const double base =
        ringBytes > kNcclViaHostSmallBytes ? kNcclViaHostLargeBaseUs : kNcclViaHostBaseUs;
    return base + hops + ringBytes / (in.ringGBps * kEffHost * 1e3);
  }
  // The cheaper of its LL protocol (half the bandwidth, no extra latency) and LL128 / simple.
  const double ll = kNcclBaseUs + std::max(hops, ringBytes / (in.ringGBps * kEffNcclLL * 1e3));
  const double ll128 =
      kNcclBaseUs + kNcclLL128ExtraUs + std::max(hops, ringBytes / (in.ringGBps * kEffNccl * 1e3));
  return std::min(ll, ll128);
}

double fusedOneShotPushUs(double ar, double local, double /*bytes*/) {
  // One kernel: no second launch, and x never goes through memory (half the traffic).
  return ar + kEpilogueUs + 0.5 * local;
}

double fusedTwoShotPushUs(double ar, double local, double B) {
  // The fused two-shot kernel (its register form; wider rows compose, see core/fused_plan.cc)
  // saves the second launch but reads x back from the gather buffers: measured on 2 x H200
  // (docs/PERFORMANCE.md, "Cost model") 0.8-2.0 us faster than the composition from 64 to 512
  // tokens of hidden 6144 and 7168 (0.8 to 7.3 MB), 6.9-7.0 us faster at 1024 tokens (12.6 and
  // 14.7 MB) and even at 2048 (25 MB, 118.6 against 118.1 us at 6144): beyond 16 MB modelled as
  // the composition and a little more, so that the composition keeps the large sizes.
  if (B <= kFusedTwoShotMaxBytes) return ar + kEpilogueUs + local;
  return ar + kSecondKernelUs + kEpilogueUs + local + 0.5;
}

// The fused pull kernels save the composition's second launch and the write and read back of
// x, but they read their rows across the link one after the other: a block takes a row (one
// block per SM), and its loads of the next row go out only after this row's epilogue, a round
// trip per row the model has no term for (the push kernels find their rows in local memory;
// the plain pull overlaps its loads over the whole message). So they are charged as the fused
// two-shot push, whose kernel reads x back: the second launch saved, the local traffic not,
// and beyond 16 MB (the push form's measured bound, not measured for the pull) the
// composition's time and a little more. Their all-reduce time already carries what pulling
// costs: the start round before any load, and a load's round trip before its data arrives
// (one idle latency more than the push, oneShotUs / twoShotUsOf).
double fusedOneShotPullUs(double ar, double local, double B) {
  return fusedTwoShotPushUs(ar, local, B);
}

double fusedTwoShotPullUs(double ar, double local, double B) {
  return fusedTwoShotPushUs(ar, local, B);
}

}  // namespace anyr
