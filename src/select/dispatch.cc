#include "select/dispatch.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

#include "algo/doubling_schedule.h"
#include "base/names.h"
#include "device/host_handles.h"
#include "topology/islands.h"

namespace anyr {

namespace {

constexpr Named<Op> kOpNames[] = {{Op::AllReduce, "allreduce"},
                                  {Op::AddRmsNorm, "add-rmsnorm"},
                                  {Op::AddRmsNormQuant, "add-rmsnorm-quant"}};

constexpr Named<Source> kSourceNames[] = {{Source::Seed, "seed"},
                                          {Source::Thresholds, "thresholds"},
                                          {Source::Measured, "measured"},
                                          {Source::NearestMeasured, "nearest"}};

}  // namespace

const char* opName(Op op) { return nameOf(kOpNames, op, "?"); }

bool parseOp(const std::string& name, Op* out) { return parseName(kOpNames, name, out); }

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

std::string kb(double bytes) {
  std::ostringstream os;
  os << static_cast<long long>(std::lround(bytes / 1024.0)) << " KB";
  return os.str();
}

}  // namespace

std::vector<Candidate> candidates(Op op, const Topology& t, const Admission& adm) {
  std::vector<Candidate> out;
  // "" if every GPU gives a block the shared memory the fused kernel `f` needs, else why not.
  auto smemWhyFor = [&](const FusedVariant& f) -> std::string {
    const size_t need = f.smemBytes;
    for (const GpuInfo& g : t.gpus) {
      if (g.sharedMemPerBlockOptin < static_cast<int64_t>(need)) {
        return "needs " + kb(static_cast<double>(need)) + " shared memory per block, GPU " +
               std::to_string(g.index) + " has " +
               kb(static_cast<double>(g.sharedMemPerBlockOptin));
      }
    }
    return "";
  };
  // The registry's order (it breaks ties, so every rank must use the same one); an algorithm's
  // fused kernel, where it has one, comes just before its composition.
  for (const AlgoInfo& r : algoRegistry()) {
    const anyrAlgo_t a = r.algo;
    const AlgoAdmission& x = adm[a];
    if (op != Op::AllReduce && r.fused != nullptr) {
      const std::string smemWhy = smemWhyFor(*r.fused);
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

// The model's constants and per-algorithm terms are in algo/cost.h and algo/cost.cc; here the
// inputs they take are derived from the topology.

// The link's generation and width under load: the maximum where known (an idle GPU trains its
// link down, to Gen1 on some workstation boards), else the current one.
int pcieGenOf(const GpuInfo& g) { return g.pcieMaxGen > 0 ? g.pcieMaxGen : g.pcieGen; }
int pcieWidthOf(const GpuInfo& g) { return g.pcieMaxWidth > 0 ? g.pcieMaxWidth : g.pcieWidth; }

double pcieNominalGBps(const GpuInfo& g) {
  static const double perLane[] = {0, 0.25, 0.5, 0.985, 1.97, 3.94, 7.56};
  const int gen = pcieGenOf(g), width = pcieWidthOf(g);
  if (gen >= 1 && gen <= 6 && width > 0) return perLane[gen] * width * 0.8;
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
  in.groupOf.resize(static_cast<size_t>(n));
  for (int s = 0; s < n; ++s) in.groupOf[static_cast<size_t>(s)] = root(s);
  double w = 1e30, r = 1e30, ring = 1e30, cw = 1e30, cr = 1e30, lat = 0, neighbour = 1e30;
  bool anyPair = false, anyCross = false, anyPeerPcie = false;
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
      if (d == (s + 1) % n || s == (d + 1) % n) neighbour = std::min(neighbour, pw);
      if (p.link == LinkType::PCIe) anyPeerPcie = true;
      const double nominalLat = p.link == LinkType::NVLink ? kNvlinkLatencyUs : kPcieLatencyUs;
      lat = std::max(lat, p.latencyUs > 0 ? p.latencyUs : nominalLat);
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
  in.ringWriteGBps = anyPair ? neighbour * kEffRing : 0;
  in.latencyUs = anyPair ? lat : kNvlinkLatencyUs;
  in.crossWriteGBps = anyCross ? cw : 0;
  in.crossReadGBps = anyCross ? cr : 0;
  // Under load: the measured figures where they hold for this world size, else the idle ones
  // and a per-peer term of the slowest link type.
  const bool viaPcie = anyPeerPcie || in.ncclViaHost;
  in.syncUs = in.latencyUs +
              (viaPcie ? kLoadedPerPeerPcieUs : kLoadedPerPeerNvlinkUs) * std::max(0, nranks - 1);
  in.ringHopUs = in.ncclViaHost ? kNcclHopHostUs : anyPeerPcie ? kNcclHopPcieUs : kNcclHopNvlinkUs;
  const FabricLoad& load = t.load;
  const bool loadHere = load.known() && load.ranks == nranks;  // figures for this world size
  if (loadHere) {
    if (load.syncUs > 0) in.syncUs = load.syncUs;
    if (load.ringHopUs > 0 && !in.ncclViaHost) in.ringHopUs = load.ringHopUs;
    if (load.hopUs > 0) {
      in.hopUs = load.hopUs;
      in.hopMeasured = true;
    }
    if (load.allToAllGBps > 0 && w > 0) in.allToAllGBps = load.allToAllGBps;
    if (load.ringGBps > 0 && !in.ncclViaHost) in.ringGBps = load.ringGBps;
    // Measured with every GPU storing to its ring neighbour: the ring algorithm's own pattern.
    if (load.ringGBps > 0 && in.ringWriteGBps > 0) in.ringWriteGBps = load.ringGBps;
    // ring-copy's own pattern: every GPU's copy engine pulling from its ring neighbour.
    if (load.ringCopyGBps > 0 && r > 0) in.ringCopyGBps = load.ringCopyGBps;
    in.loadMeasured = true;
  }
  // Our one-partner round where none was measured: NCCL's hop on the link. Measured or not, a
  // round is never charged less than the slowest pair's idle one-way latency.
  in.hopUs = std::max(in.hopMeasured ? in.hopUs : in.ringHopUs, in.latencyUs);
  // The two-level all-reduce's islands (forced, or the topology's) and their pairs' writes.
  Islands islands;
  if (islandsCoverError(cfg.islands, nranks).empty() && n == nranks) {
    islands = islandsOf(t, cfg.islands, nranks);
  }
  // The doubling push's partners: the kernel's order from the same islands (device/handles.h,
  // AllReduceArgs::islands), and each round's slowest partner pair (none beyond kMaxLocalRanks
  // ranks, where doubling::rounds gives no schedule).
  in.doublingOrder = doubling::doublingOrder(islandMapOf(islands), nranks);
  if (n == nranks) {
    for (int j = 0; j < doubling::rounds(n); ++j) {
      double slowest = 1e30;
      for (int s = 0; s < n; ++s) {
        const int to = doubling::round(n, in.doublingOrder, s, j).to;
        slowest = std::min(slowest, pairGBps(t, t.pair(s, to), true));
      }
      in.doublingRoundGBps.push_back(slowest < 1e30 && slowest > 0 ? slowest : 0.0);
    }
  }
  if (islands.count() >= 2) {
    std::vector<int> islandOf(static_cast<size_t>(n), -1);
    for (int c = 0; c < islands.count(); ++c) {
      for (int rk : islands.members[static_cast<size_t>(c)]) islandOf[static_cast<size_t>(rk)] = c;
    }
    double inside = 1e30, between = 1e30;
    for (int s = 0; s < n; ++s) {
      for (int d = 0; d < n; ++d) {
        if (s == d) continue;
        double& slowest =
            islandOf[static_cast<size_t>(s)] == islandOf[static_cast<size_t>(d)] ? inside : between;
        slowest = std::min(slowest, pairGBps(t, t.pair(s, d), true));
      }
    }
    in.islandCount = islands.count();
    in.islandMin = islands.smallest();
    in.islandMax = islands.largest();
    in.islandCrossPeers = islandCrossPeers(islands);
    in.islandWriteGBps = inside < 1e30 ? inside : 0;
    in.islandCrossWriteGBps = between < 1e30 ? between : 0;
    // A figure measured over other islands (ANYR_ISLANDS changed since it was cached) is not
    // these islands'.
    if (loadHere && load.islandGBps > 0 &&
        (load.islands.empty() || load.islands == islands.text())) {
      in.islandLoadGBps = load.islandGBps;
    }
    // Slots of the two-shot push area: a chunk's n-th (the workspace rounds it up to a page).
    in.islandLaunchBytes = islandLaunchBytes(islandMapOf(islands), cfg.chunkBytes / nranks);
  }
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
  // A step's flags in host memory queue like peer flags under load: beyond two ranks each
  // further rank adds the PCIe per-peer term.
  in.hostLatencyUs = kHostStepUs + kLoadedPerPeerPcieUs * std::max(0, nranks - 2);
  // Measured at this world size (the copy engines both ways at once, every rank; a
  // synchronisation round through the host memory): those replace the nominal link and step.
  const bool hostRate = loadHere && load.hostGBps > 0;
  const bool hostStep = loadHere && load.hostStepUs > 0;
  if (hostRate) in.hostGBps = load.hostGBps;
  if (hostStep) in.hostLatencyUs = load.hostStepUs;
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
     << in.latencyUs << " us; NCCL ring " << in.ringGBps << " GB/s, ring neighbours' stores "
     << in.ringWriteGBps << " GB/s";
  if (in.ringCopyGBps > 0) {
    os << ", the copy engines pulling from the ring neighbour " << in.ringCopyGBps << " GB/s";
  }
  const SlowWrites slow = slowestWrites(t);
  if (slow.ratio > kSlowWritesRatio) {
    os << "; writes " << std::lround(slow.ratio) << "x slower than reads on GPU" << slow.src
       << "->GPU" << slow.dst << " (pull)";
  }
  os << "; under load at " << nranks << " ranks: a synchronisation round " << in.syncUs
     << " us, one-partner round " << in.hopUs << " us" << (in.hopMeasured ? "" : " (NCCL's hop)")
     << ", NCCL hop " << in.ringHopUs << " us";
  if (in.allToAllGBps > 0) os << ", all-to-all " << in.allToAllGBps << " GB/s per GPU";
  os << " (" << (in.loadMeasured ? (load.source.empty() ? "measured" : load.source) : "seed")
     << ")";
  if (anyCross && anyPcie && in.largestGroup > 1) {
    os << "; PCIe switch groups of up to " << in.largestGroup << " GPUs, between groups write "
       << in.crossWriteGBps << " / read " << in.crossReadGBps << " GB/s";
  }
  if (in.islandCount >= 2) {
    os << "; islands " << islands.text() << " (" << islands.source << "), writes inside "
       << in.islandWriteGBps << " / between " << in.islandCrossWriteGBps << " GB/s";
    if (in.islandLoadGBps > 0) {
      os << ", inside each island under load " << in.islandLoadGBps << " GB/s per GPU";
    } else if (load.islandGBps > 0) {
      os << ", inside the islands under load not used (measured over " << load.islands << ")";
    }
  }
  if (slowGpu >= 0) {
    const GpuInfo& g = t.gpus[static_cast<size_t>(slowGpu)];
    os << "; host memory " << in.hostGBps << " GB/s per direction (";
    if (hostRate) {
      os << "measured: the copy engines of every GPU both ways at once";
    } else {
      os << "GPU " << g.index << " PCIe ";
      if (pcieGenOf(g) > 0 && pcieWidthOf(g) > 0) {
        os << "gen" << pcieGenOf(g) << " x" << pcieWidthOf(g);
      } else {
        os << "link unknown";
      }
    }
    os << "), " << in.hostLatencyUs << " us per step" << (hostStep ? " (measured)" : "");
  }
  in.summary = os.str();
  return in;
}

double seedTimeUs(Op op, Path p, uint64_t bytes, const CostInputs& in) {
  const double B = static_cast<double>(bytes);
  const AlgoInfo* r = findAlgo(p.algo);
  const double ar = r != nullptr ? r->seedUs(B, in) : -1;
  if (ar < 0 || op == Op::AllReduce) return ar;
  // Fused operation: the epilogue's local traffic (+ the quantized output).
  const double local = (op == Op::AddRmsNormQuant ? 4.5 : 4.0) * B / (kLocalGBps * 1e3);
  // Composition: the standalone kernel behind the all-reduce. Behind NCCL's kernel it waits
  // for a whole launch (NCCL's kernels do not release dependents early); behind ours less.
  if (!p.fusedKernel) {
    const double gap = r->kind == AlgoKind::Nccl ? kLaunchUs : kSecondKernelUs;
    return ar + gap + kEpilogueUs + local;
  }
  if (r->fused == nullptr) return -1;  // no such kernel
  return r->fused->seedUs(ar, local, B);
}

const char* sourceName(Source s) { return nameOf(kSourceNames, s, "?"); }

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
        // The ladder's own rule (admission.h): its one-shot push runs fused, nothing else.
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
  const AlgoInfo* r = findAlgo(forced);
  if (op != Op::AllReduce && r != nullptr && r->fused != nullptr) p.fusedKernel = true;
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
