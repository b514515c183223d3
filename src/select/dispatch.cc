#include "select/dispatch.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

#include "device/host_handles.h"
#include "fused/fused.h"

namespace anyr {

const char* opName(Op op) {
  switch (op) {
    case Op::AllReduce:
      return "allreduce";
    case Op::AddRmsNorm:
      return "add-rmsnorm";
    case Op::AddRmsNormQuant:
      return "add-rmsnorm-quant";
  }
  return "?";
}

bool parseOp(const std::string& name, Op* out) {
  for (int i = 0; i < kNumOps; ++i) {
    if (name == opName(static_cast<Op>(i))) {
      *out = static_cast<Op>(i);
      return true;
    }
  }
  return false;
}

bool pathClusterValid(int cluster) {
  return cluster == 1 || cluster == 2 || cluster == 4 || cluster == 8;
}

std::string pathName(Op op, Path p) {
  if (op == Op::AllReduce) return anyrAlgoName(p.algo);
  if (!p.fusedKernel) return std::string(anyrAlgoName(p.algo)) + "+epilogue";
  std::string name = std::string("fused:") + anyrAlgoName(p.algo);
  if (p.cluster != 0) name += "/c" + std::to_string(p.cluster);
  return name;
}

bool parsePath(Op op, const std::string& name, Path* out) {
  // A fused kernel's name may end in "/cN", a cluster size (pathClusterValid).
  std::string base = name;
  int cluster = 0;
  const size_t slash = name.rfind("/c");
  if (op != Op::AllReduce && slash != std::string::npos && slash + 3 == name.size()) {
    const char d = name[slash + 2];
    if (d < '0' || d > '9' || !pathClusterValid(d - '0')) return false;
    cluster = d - '0';
    base = name.substr(0, slash);
  }
  for (int a = 1; a < anyrNumAlgos; ++a) {
    for (bool k : {false, true}) {
      if (op == Op::AllReduce && k) continue;
      if (cluster != 0 && !k) continue;
      Path p{static_cast<anyrAlgo_t>(a), k};
      if (pathName(op, p) == base) {
        p.cluster = cluster;
        *out = p;
        return true;
      }
    }
  }
  return false;
}

namespace {

// Fixed candidate order (it breaks ties, so every rank must use the same one). The host-memory
// algorithms come last: they have no fused kernel, so the fused operations get them only as
// composition ("host-oneshot+epilogue").
const anyrAlgo_t kAlgoOrder[] = {anyrAlgoOneShotPush, anyrAlgoOneShotPull, anyrAlgoTwoShotPush,
                                 anyrAlgoTwoShot,     anyrAlgoNccl,        anyrAlgoHostOneShot,
                                 anyrAlgoHostTwoShot, anyrAlgoHostCopy};

bool hasFusedKernel(anyrAlgo_t a) { return a == anyrAlgoOneShotPush || a == anyrAlgoTwoShotPush; }

// Shared memory a block of `a`'s fused kernel needs, bytes. The fused one-shot push kernel
// holds its row in registers: only the reduction scratch, static (4,112 bytes, under
// the 48 KB every block gets without opting in). The fused two-shot push kernel stages the fp32
// row in dynamic shared memory, sized for the widest supported row (69,648 bytes), which a
// block must opt in to.
size_t fusedKernelSmemBytes(anyrAlgo_t a) {
  if (a == anyrAlgoTwoShotPush) return fusedSharedBytes(kFusedMaxHidden);
  return kFusedRedFloats * sizeof(float);
}

std::string kb(double bytes) {
  std::ostringstream os;
  os << static_cast<long long>(std::lround(bytes / 1024.0)) << " KB";
  return os.str();
}

}  // namespace

std::vector<Candidate> candidates(Op op, const Topology& t, const Admission& adm) {
  std::vector<Candidate> out;
  // "" if every GPU gives a block the shared memory `a`'s fused kernel needs, else why not.
  auto smemWhyFor = [&](anyrAlgo_t a) -> std::string {
    const size_t need = fusedKernelSmemBytes(a);
    for (const GpuInfo& g : t.gpus) {
      if (g.sharedMemPerBlockOptin < static_cast<int64_t>(need)) {
        return "needs " + kb(static_cast<double>(need)) + " shared memory per block, GPU " +
               std::to_string(g.index) + " has " +
               kb(static_cast<double>(g.sharedMemPerBlockOptin));
      }
    }
    return "";
  };
  for (anyrAlgo_t a : kAlgoOrder) {
    const AlgoAdmission& x = adm[a];
    if (op != Op::AllReduce && hasFusedKernel(a)) {
      const std::string smemWhy = smemWhyFor(a);
      Candidate k;
      k.path = {a, true};
      const std::string& failed = adm.fusedKernelFailure[static_cast<size_t>(a)];
      k.admitted = x.admitted && smemWhy.empty() && failed.empty();
      k.reason = !x.admitted        ? x.reason
                 : !smemWhy.empty() ? smemWhy
                 : !failed.empty()  ? failed
                                    : x.reason;
      out.push_back(k);
    }
    Candidate c;
    c.path = {a, false};
    c.admitted = x.admitted;
    c.reason = x.reason;
    out.push_back(c);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Seed cost model
// ---------------------------------------------------------------------------------------------

namespace {

// Model constants. They are a seed, not a measurement: tuning replaces every choice they make.
// Efficiencies are the fraction of a link's measured one-pair bandwidth an algorithm reaches
// when every rank moves data at once (one-shot: every rank stores its whole message into
// every peer while peers read theirs; two-shot: half the traffic per phase; NCCL: pipelined
// ring, the best at large sizes). Latencies: a kernel launch inside a graph, and NCCL's fixed
// per-call cost on top of its ring's hops.
constexpr double kLaunchUs = 2.0;
constexpr double kEffOneShot = 0.5;
constexpr double kEffTwoShot = 0.8;
constexpr double kEffNccl = 0.85;
constexpr double kNcclBaseUs = 10.0;
constexpr double kNcclViaHostLargeBaseUs = 24.0;
constexpr double kNcclViaHostSmallBytes = 64.0 * 1024;
// The fused epilogue reads x, the residual and writes residual and output: 4 bytes of local
// memory traffic per byte of message. The topology records no local memory bandwidth, so a
// nominal one is used; it weighs only fused kernel against composition.
constexpr double kLocalGBps = 3000.0;
// Largest message for which the seed expects the fused two-shot kernel to beat the composition.
constexpr double kFusedTwoShotMaxBytes = 16.0 * (1 << 20);
// Host-memory algorithms move their bytes the way NCCL's ring does where there is no peer path
// (SM stores into, and loads from, pinned host memory over each GPU's PCIe link), so they are
// charged on the same terms: each byte crosses the link twice (written up, read down by a
// peer), the two crossings one after the other (the one-shot's overlap of writes and reads is
// not credited), at NCCL's efficiency. What separates them is latency: no NCCL per-call base
// and fewer steps for small messages, but one more launch (and its steps) per launch buffer
// (ANYR_HOST_LAUNCH_BYTES) for large ones. A step is a PCIe round trip plus a flag in host memory
// (one-shot: publish, then poll and read; two-shot: two such steps).
// Calibrated on 2 x H200 (PCIe Gen5 x16) with ANYR_PEER_MEMORY=0 against NCCL with
// NCCL_P2P_DISABLE=1 (docs/PERFORMANCE.md, "Cost model"): the one-shot's writes and reads do not
// overlap and its small rounds reach a fifth of the link (host-oneshot 1 KB 6.9 us, 64 KB
// 19.4 us, 1 MB 97 us); the two-shot overlaps its reduce-scatter and all-gather traffic
// (charged on the larger direction) at about 0.6 of the link (1 MB 58 us, 16 MB 553 us).
constexpr double kEffHost = kEffNccl;  // the link as NCCL's ring through host memory sees it
constexpr double kEffHostOneShot = 0.2 / kEffHost;
constexpr double kEffHostTwoShot = 0.6 / kEffHost;
constexpr double kHostStepUs = 3.0;
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

double pcieNominalGBps(const GpuInfo& g) {
  static const double perLane[] = {0, 0.25, 0.5, 0.985, 1.97, 3.94, 7.56};
  if (g.pcieGen >= 1 && g.pcieGen <= 6 && g.pcieWidth > 0)
    return perLane[g.pcieGen] * g.pcieWidth * 0.8;
  return 12.0;  // unknown link: a conservative PCIe figure
}

// Bandwidth of one pair for stores (write) or loads (read): measured, else nominal.
double pairGBps(const Topology& t, const PairInfo& p, bool write) {
  const bool ok = write ? p.peerWriteOk : p.peerReadOk;
  const double measured = write ? p.writeGBps : p.readGBps;
  if (!ok && measured <= 0) return 0;
  if (measured > 0) return measured;
  if (p.linkGBps > 0) return 0.75 * p.linkGBps;
  return std::min(pcieNominalGBps(t.gpus[static_cast<size_t>(p.src)]),
                  pcieNominalGBps(t.gpus[static_cast<size_t>(p.dst)]));
}

}  // namespace

CostInputs costInputs(const Topology& t, const Config& cfg, int nranks) {
  CostInputs in;
  in.nranks = nranks;
  in.pushSlotBytes = cfg.oneShotMaxBytes ? cfg.oneShotMaxBytes : defaultOneShotMaxBytes(nranks);
  in.pushSlotBytes = std::max<uint64_t>(in.pushSlotBytes, 64u << 10);
  in.chunkBytes = cfg.chunkBytes;
  const int n = t.size();
  // Switch groups: PCIe pairs that meet at a board or a switch share that switch's uplink.
  std::vector<int> group(static_cast<size_t>(n));
  std::iota(group.begin(), group.end(), 0);
  auto root = [&](int x) {
    while (group[static_cast<size_t>(x)] != x) x = group[static_cast<size_t>(x)];
    return x;
  };
  bool anyPcie = false;
  for (int s = 0; s < n; ++s) {
    for (int d = 0; d < n; ++d) {
      if (s == d) continue;
      const PairInfo& p = t.pair(s, d);
      if (p.link == LinkType::PCIe) anyPcie = true;
      if (p.link != LinkType::PCIe || p.pcieRelation == "board" || p.pcieRelation == "switch") {
        group[static_cast<size_t>(root(s))] = root(d);
      }
    }
  }
  std::vector<int> groupSize(static_cast<size_t>(n), 0);
  for (int s = 0; s < n; ++s) ++groupSize[static_cast<size_t>(root(s))];
  in.largestGroup = n ? *std::max_element(groupSize.begin(), groupSize.end()) : 0;
  double w = 1e30, r = 1e30, ring = 1e30, cw = 1e30, cr = 1e30, lat = 0;
  bool anyPair = false, anyCross = false;
  for (int s = 0; s < n; ++s) {
    for (int d = 0; d < n; ++d) {
      if (s == d) continue;
      anyPair = true;
      const PairInfo& p = t.pair(s, d);
      const double pw = pairGBps(t, p, true), pr = pairGBps(t, p, false);
      w = std::min(w, pw);
      r = std::min(r, pr);
      // NCCL uses whichever direction works best, or host memory when there is no peer path
      // (two PCIe crossings).
      double best = std::max(pw, pr);
      if (best <= 0) {
        best = 0.5 * std::min(pcieNominalGBps(t.gpus[static_cast<size_t>(s)]),
                              pcieNominalGBps(t.gpus[static_cast<size_t>(d)]));
        in.ncclViaHost = true;
      }
      ring = std::min(ring, best);
      lat = std::max(lat, p.latencyUs > 0 ? p.latencyUs : 2.0);
      if (root(s) != root(d)) {
        anyCross = true;
        cw = std::min(cw, pw);
        cr = std::min(cr, pr);
      }
    }
  }
  if (!anyPair) w = r = ring = 0;
  in.writeGBps = w;
  in.readGBps = r;
  in.ringGBps = ring;
  in.latencyUs = anyPair ? lat : 2.0;
  in.crossWriteGBps = anyCross ? cw : 0;
  in.crossReadGBps = anyCross ? cr : 0;
  // Host memory: the slowest GPU's link to the host bounds every rank's step.
  int slowGpu = -1;
  for (int g = 0; g < n; ++g) {
    const double bw = pcieNominalGBps(t.gpus[static_cast<size_t>(g)]);
    if (slowGpu < 0 || bw < in.hostGBps) {
      slowGpu = g;
      in.hostGBps = bw;
    }
  }
  in.hostGBps *= kEffHost;
  in.hostLatencyUs = kHostStepUs;
  // The host transport's own launch size (ANYR_HOST_LAUNCH_BYTES, not ANYR_CHUNK_BYTES): the
  // agreed value once the transport set it, else the registered default.
  in.hostLaunchBytes = cfg.hostLaunchBytes != 0 ? cfg.hostLaunchBytes : kHostDefaultLaunchBytes;
  in.hostLowLatencyBytes = cfg.wire == anyrWireNative ? cfg.hostLowLatencyBytes : 0;
  // Before the transport set it (or without one): the registered default of
  // ANYR_HOST_COPY_CHUNK_BYTES, so the model has a number wherever host-copy could be admitted.
  in.hostCopyChunkBytes =
      cfg.hostCopyChunkBytes != 0 ? cfg.hostCopyChunkBytes : kHostCopyDefaultChunkBytes;
  std::ostringstream os;
  os.precision(3);
  os << "slowest pair: write " << in.writeGBps << " GB/s, read " << in.readGBps << " GB/s, latency "
     << in.latencyUs << " us; NCCL ring " << in.ringGBps << " GB/s";
  if (anyCross && anyPcie && in.largestGroup > 1) {
    os << "; PCIe switch groups of up to " << in.largestGroup << " GPUs, between groups write "
       << in.crossWriteGBps << " / read " << in.crossReadGBps << " GB/s";
  }
  if (slowGpu >= 0) {
    const GpuInfo& g = t.gpus[static_cast<size_t>(slowGpu)];
    os << "; host memory " << in.hostGBps << " GB/s per direction (GPU " << g.index << " PCIe ";
    if (g.pcieGen > 0 && g.pcieWidth > 0) {
      os << "gen" << g.pcieGen << " x" << g.pcieWidth;
    } else {
      os << "link unknown";
    }
    os << "), " << in.hostLatencyUs << " us per step";
  }
  in.summary = os.str();
  return in;
}

namespace {

// Time for the all-to-all traffic of one call, in microseconds: `perFlowBytes` from every rank
// to every other rank, at efficiency `eff`; each GPU's own link carries (n-1) flows, and each
// switch uplink carries g x (n - g) of them.
double allToAllUs(const CostInputs& in, double perFlowBytes, bool write, double eff) {
  const int n = in.nranks;
  const double bw = write ? in.writeGBps : in.readGBps;
  if (bw <= 0) return -1;
  double t = (n - 1) * perFlowBytes / (bw * eff * 1e3);
  const double cross = write ? in.crossWriteGBps : in.crossReadGBps;
  if (cross > 0) {
    const int g = in.largestGroup;
    t = std::max(t, g * (n - g) * perFlowBytes / (cross * eff * 1e3));
  }
  return t;
}

double allReduceUs(anyrAlgo_t a, double B, const CostInputs& in) {
  const int n = in.nranks;
  const double lat = in.latencyUs;
  switch (a) {
    case anyrAlgoOneShotPush:
    case anyrAlgoOneShotPull: {
      // Every rank sends its whole message to every peer; larger messages than a push slot
      // (or staging chunk) run as several calls, each paying the latency again.
      const bool push = a == anyrAlgoOneShotPush;
      const double slot = static_cast<double>(push ? in.pushSlotBytes : in.chunkBytes);
      const double calls = std::max(1.0, std::ceil(B / slot));
      const double data = allToAllUs(in, B, push, kEffOneShot);
      if (data < 0) return -1;
      // pull: flag handshake, then the reads: one latency more than push
      return calls * (kLaunchUs + (push ? 1 : 2) * lat) + data;
    }
    case anyrAlgoTwoShotPush:
    case anyrAlgoTwoShot: {
      // Reduce-scatter then all-gather: each phase moves B/n per pair. Pull adds barriers
      // around each phase (two more latencies).
      const bool push = a == anyrAlgoTwoShotPush;
      const double data = allToAllUs(in, 2.0 * B / n, push, kEffTwoShot);
      if (data < 0) return -1;
      return kLaunchUs + (push ? 2 : 4) * lat + data;
    }
    case anyrAlgoHostOneShot:
    case anyrAlgoHostTwoShot: {
      // One-shot: write the own B, read the (n-1) peers' B each. Two-shot: reduce-scatter and
      // all-gather, each writing and reading (n-1)/n of B (2 B (n-1)/n each way in all). A
      // message larger than a launch's buffers runs as several launches.
      if (in.hostGBps <= 0) return -1;
      const bool one = a == anyrAlgoHostOneShot;
      const double calls =
          in.hostLaunchBytes > 0
              ? std::max(1.0, std::ceil(B / static_cast<double>(in.hostLaunchBytes)))
              : 1.0;
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
    case anyrAlgoHostCopy: {
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
    case anyrAlgoNccl: {
      if (in.ringGBps <= 0) return -1;
      // Through host memory NCCL's per-hop flags are in its base cost (measured: 10 us at 1 KB
      // on 2 x H200 with NCCL_P2P_DISABLE=1, about its cost with peer access); above 64 KB of
      // ring traffic its base there is 24 us (same machine: 35.7 us at 256 KB,
      // 62.4 at 1 MB, 168 at 4 MB, where 10 us + the bytes gave 20, 49 and 166).
      const double hop = in.ncclViaHost ? 0.0 : lat;
      const double ringBytes = 2.0 * (n - 1) / n * B;
      const double base = in.ncclViaHost && ringBytes > kNcclViaHostSmallBytes
                              ? kNcclViaHostLargeBaseUs
                              : kNcclBaseUs;
      return base + 2.0 * (n - 1) * hop + ringBytes / (in.ringGBps * kEffNccl * 1e3);
    }
    default:
      return -1;
  }
}

}  // namespace

double seedTimeUs(Op op, Path p, uint64_t bytes, const CostInputs& in) {
  const double B = static_cast<double>(bytes);
  const double ar = allReduceUs(p.algo, B, in);
  if (ar < 0 || op == Op::AllReduce) return ar;
  // Fused operation: the epilogue's local traffic (+ the quantized output).
  const double local = (op == Op::AddRmsNormQuant ? 4.5 : 4.0) * B / (kLocalGBps * 1e3);
  if (!p.fusedKernel) return ar + kLaunchUs + local;  // composition: a second kernel
  if (p.algo == anyrAlgoOneShotPush) {
    // One kernel: no second launch, and x never goes through memory (half the traffic).
    return ar + 0.5 * local;
  }
  // The fused two-shot kernel (its register form; wider rows compose, see
  // Communicator::allReduceAddRmsNorm) saves the second launch but reads x back from the
  // gather buffers: measured on 2 x H200 (docs/PERFORMANCE.md, "Cost model") 0.8-2.0 us faster
  // than the composition from 64 to 512 tokens of hidden 6144 and 7168 (0.8 to 7.3 MB); with
  // the dense shape (two blocks per SM from 133 rows) 6.9-7.0 us faster at 1024 tokens (12.6
  // and 14.7 MB) and even at 2048 (25 MB, 118.6 against 118.1 us at 6144), where one block per
  // SM was 8.5 us slower: beyond 16 MB modelled as three times the epilogue's traffic time.
  if (B <= kFusedTwoShotMaxBytes) return ar + local + 0.5 * kLaunchUs;
  return ar + 3.0 * local;
}

const char* sourceName(Source s) {
  switch (s) {
    case Source::Seed:
      return "seed";
    case Source::Thresholds:
      return "thresholds";
    case Source::Measured:
      return "measured";
    case Source::NearestMeasured:
      return "nearest";
  }
  return "?";
}

DispatchTable seedTable(const Topology& t, const Admission& adm, const Config& cfg, int nranks) {
  DispatchTable tab;
  const bool ladder = cfg.oneShotMaxBytes != 0 || cfg.twoShotMaxBytes != 0;
  const CostInputs in = costInputs(t, cfg, nranks);
  const Thresholds th = defaultThresholds(t, adm, cfg, nranks);
  // Host-memory algorithms are seeded only where no peer path is admitted.
  const bool skipHost = peerPathAdmitted(adm);
  for (int o = 0; o < kNumOps; ++o) {
    const Op op = static_cast<Op>(o);
    const std::vector<Candidate> cands = candidates(op, t, adm);
    for (int b = 0; b < kNumBuckets; ++b) {
      const uint64_t bytes = bucketBytes(b);
      Path best{anyrAlgoAuto, false};
      if (ladder) {
        best.algo = chooseAlgo(adm, th, bytes, anyrAlgoAuto);
        if (op != Op::AllReduce && best.algo == anyrAlgoOneShotPush) {
          for (const Candidate& c : cands) {
            if (c.path == Path{anyrAlgoOneShotPush, true} && c.admitted) best.fusedKernel = true;
          }
        }
      } else {
        double bestUs = 0;
        for (const Candidate& c : cands) {
          if (!c.admitted || (skipHost && isHostAlgo(c.path.algo))) continue;
          const double us = seedTimeUs(op, c.path, bytes, in);
          if (us >= 0 && (best.algo == anyrAlgoAuto || us < bestUs)) {
            best = c.path;
            bestUs = us;
          }
        }
        if (best.algo == anyrAlgoAuto) {  // admitted, but no model number: first admitted
          for (const Candidate& c : cands) {
            if (c.admitted) {
              best = c.path;
              break;
            }
          }
        }
      }
      tab.path[static_cast<size_t>(o)][static_cast<size_t>(b)] = best;
      tab.source[static_cast<size_t>(o)][static_cast<size_t>(b)] =
          ladder ? Source::Thresholds : Source::Seed;
    }
  }
  return tab;
}

Path forcedPath(Op op, anyrAlgo_t forced) {
  Path p{forced, false};
  if (op != Op::AllReduce && hasFusedKernel(forced)) p.fusedKernel = true;
  return p;
}

std::string overrideError(const Admission& adm, anyrAlgo_t algo) {
  if (algo < 0 || algo >= anyrNumAlgos) {
    return "algorithm " + std::to_string(static_cast<int>(algo)) + " is not one of " + algoNames();
  }
  if (algo == anyrAlgoAuto || adm[algo].admitted) return "";
  return std::string("algorithm ") + anyrAlgoName(algo) +
         " is not admitted on this communicator: " + adm[algo].reason;
}

int agreeChoice(const std::vector<std::vector<double>>& perRank, std::vector<double>* slowest) {
  size_t nc = 0;
  for (const auto& r : perRank) nc = std::max(nc, r.size());
  std::vector<double> worst(nc, 0.0);
  for (size_t c = 0; c < nc; ++c) {
    for (const auto& r : perRank) {
      const double v = c < r.size() ? r[c] : -1.0;
      if (!(v >= 0) || worst[c] < 0) {  // failed, missing or NaN on some rank: out
        worst[c] = -1.0;
      } else {
        worst[c] = std::max(worst[c], v);
      }
    }
  }
  if (perRank.empty()) std::fill(worst.begin(), worst.end(), -1.0);
  int best = -1;
  for (size_t c = 0; c < nc; ++c) {
    if (worst[c] >= 0 && (best < 0 || worst[c] < worst[static_cast<size_t>(best)])) {
      best = static_cast<int>(c);
    }
  }
  if (slowest != nullptr) *slowest = worst;
  return best;
}

int agreeOverBaseline(const std::vector<std::vector<double>>& perRank, double margin,
                      std::vector<double>* slowest) {
  std::vector<double> worst;
  const int best = agreeChoice(perRank, &worst);
  if (slowest != nullptr) *slowest = worst;
  if (best <= 0 || worst.empty() || worst[0] < 0) return best;
  return worst[static_cast<size_t>(best)] < worst[0] * (1.0 - margin) ? best : 0;
}

}  // namespace anyr
