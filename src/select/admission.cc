#include "select/admission.h"

#include <sstream>

namespace anyr {

bool Admission::any() const {
  for (int a = 1; a < anyrNumAlgos; ++a) {
    if (algo[static_cast<size_t>(a)].admitted) return true;
  }
  return false;
}

namespace {

std::string fmtGBps(double x) {
  std::ostringstream os;
  os.precision(x < 10 ? 2 : 3);
  os << x << " GB/s";
  return os.str();
}

}  // namespace

Admission admit(const Topology& t, const CommFacts& f) {
  Admission adm;
  for (const AlgoInfo& r : algoRegistry()) adm.algo[static_cast<size_t>(r.algo)] = r.admit(t, f);
  adm.algo[anyrAlgoAuto].admitted = adm.any();
  adm.algo[anyrAlgoAuto].reason = "automatic choice by message size";
  return adm;
}

uint64_t defaultOneShotMaxBytes(int nranks) {
  // Two ranks: the one-shot sends and receives the message once per rank, as the two-shot does,
  // with one round trip less. Measured on 2 x H200 (docs/PERFORMANCE.md, "Cost model"): one-shot
  // push 5.90 us at 1 MiB against the two-shot push's 6.27, and the fused op at 64 tokens of
  // 6144 one launch of the one-shot (7.00 us) instead of the two-shot (7.97).
  if (nranks == 2) return 1ull << 20;
  const uint64_t peers = static_cast<uint64_t>(nranks > 1 ? nranks - 1 : 1);
  uint64_t derived = (512ull << 10) / peers;
  return derived < (64ull << 10) ? (64ull << 10) : derived;
}

SlowWrites slowestWrites(const Topology& t) {
  SlowWrites w;
  for (int s = 0; s < t.size(); ++s) {
    for (int d = 0; d < t.size(); ++d) {
      const PairInfo& p = t.pair(s, d);
      if (s == d || p.writeGBps <= 0 || p.readGBps <= 0) continue;
      if (p.readGBps / p.writeGBps > w.ratio)
        w = {s, d, p.writeGBps, p.readGBps, p.readGBps / p.writeGBps};
    }
  }
  return w;
}

Thresholds defaultThresholds(const Topology& t, const Admission& adm, const Config& cfg,
                             int nranks) {
  Thresholds th;
  // One-shot flavour: push unless reads are measurably much faster than writes on some pair
  // (some PCIe platforms write peers at a small fraction of their read bandwidth).
  th.oneShot = anyrAlgoOneShotPush;
  th.oneShotWhy = "push: one write per peer, no handshake";
  std::string slowWrites;
  const SlowWrites slow = slowestWrites(t);
  if (slow.ratio > kSlowWritesRatio) {
    th.oneShot = anyrAlgoOneShotPull;
    slowWrites = "peer write bandwidth " + fmtGBps(slow.writeGBps) + " < read " +
                 fmtGBps(slow.readGBps) + " / 4 on rank " + std::to_string(slow.src) + " -> rank " +
                 std::to_string(slow.dst);
    th.oneShotWhy = "pull: " + slowWrites;
  }
  if (!adm[th.oneShot].admitted) {
    anyrAlgo_t other =
        th.oneShot == anyrAlgoOneShotPush ? anyrAlgoOneShotPull : anyrAlgoOneShotPush;
    if (adm[other].admitted) {
      th.oneShot = other;
      th.oneShotWhy = std::string(other == anyrAlgoOneShotPush ? "push" : "pull") +
                      ": the other one-shot flavour is not admitted";
    }
  }
  // Two-shot flavour follows the same rule: writes (no barriers) unless reads are much faster.
  th.twoShot = th.oneShot == anyrAlgoOneShotPull ? anyrAlgoTwoShot : anyrAlgoTwoShotPush;
  th.twoShotWhy = slowWrites.empty() ? "push: no barriers, no staging copy" : "pull: " + slowWrites;
  if (!adm[th.twoShot].admitted) {
    anyrAlgo_t other = th.twoShot == anyrAlgoTwoShot ? anyrAlgoTwoShotPush : anyrAlgoTwoShot;
    if (adm[other].admitted) {
      th.twoShot = other;
      th.twoShotWhy = "the other two-shot flavour is not admitted";
    }
  }
  th.oneShotMaxBytes = cfg.oneShotMaxBytes ? cfg.oneShotMaxBytes : defaultOneShotMaxBytes(nranks);
  th.twoShotMaxBytes = cfg.twoShotMaxBytes ? cfg.twoShotMaxBytes : (32ull << 20);
  // Host memory (the threshold ladder's rung; without configured thresholds the dispatch
  // cost model seeds the choice): with 2 ranks both host algorithms move the same
  // bytes and one-shot has one round trip less, so one-shot throughout; with more ranks,
  // one-shot reads (n-1) x bytes, two-shot about 2 x bytes, so two-shot above the one-shot
  // limit. NCCL (through host memory itself on such machines) above the two-shot limit.
  th.hostOneShotMaxBytes = nranks <= 2 ? th.twoShotMaxBytes : th.oneShotMaxBytes;
  th.hostMaxBytes = th.twoShotMaxBytes;
  th.hostWhy = nranks <= 2 ? "2 ranks: host one-shot moves no more bytes than two-shot"
                           : "host two-shot above the one-shot limit reads fewer bytes";
  return th;
}

bool peerPathAdmitted(const Admission& adm) {
  for (const AlgoInfo& r : algoRegistry()) {
    if (r.kind == AlgoKind::PeerMemory && adm[r.algo].admitted) return true;
  }
  return false;
}

anyrAlgo_t chooseAlgo(const Admission& adm, const Thresholds& th, uint64_t bytes,
                      anyrAlgo_t forced) {
  if (forced != anyrAlgoAuto) return forced;
  const bool push = adm[anyrAlgoOneShotPush].admitted;
  const bool pull = adm[anyrAlgoOneShotPull].admitted;
  const bool two = adm[th.twoShot].admitted;
  const bool nccl = adm[anyrAlgoNccl].admitted;
  const bool anyPeer = peerPathAdmitted(adm);
  const bool host1 = adm[anyrAlgoHostOneShot].admitted;
  const bool host2 = adm[anyrAlgoHostTwoShot].admitted;
  if (!anyPeer && (host1 || host2) && (bytes <= th.hostMaxBytes || !nccl)) {
    if (host1 && (bytes <= th.hostOneShotMaxBytes || !host2)) return anyrAlgoHostOneShot;
    return anyrAlgoHostTwoShot;
  }
  if (bytes <= th.oneShotMaxBytes && adm[th.oneShot].admitted) return th.oneShot;
  if (bytes <= th.oneShotMaxBytes && (push || pull)) {
    return push ? anyrAlgoOneShotPush : anyrAlgoOneShotPull;
  }
  if (two && (bytes <= th.twoShotMaxBytes || !nccl)) return th.twoShot;
  if (nccl) return anyrAlgoNccl;
  if (push) return anyrAlgoOneShotPush;
  if (pull) return anyrAlgoOneShotPull;
  return anyrAlgoAuto;  // nothing admitted; the caller reports it
}

std::string explainChoice(const Admission& adm, const Thresholds& th, uint64_t bytes,
                          anyrAlgo_t forced) {
  anyrAlgo_t a = chooseAlgo(adm, th, bytes, forced);
  std::ostringstream os;
  os << anyrAlgoName(a) << ": ";
  if (forced != anyrAlgoAuto) {
    os << "forced by configuration";
  } else if (a == anyrAlgoAuto) {
    os << "no algorithm admitted";
  } else if (a == anyrAlgoOneShotPush || a == anyrAlgoOneShotPull) {
    os << bytes << " B <= one-shot limit " << th.oneShotMaxBytes << " B; " << th.oneShotWhy;
  } else if (a == anyrAlgoTwoShot || a == anyrAlgoTwoShotPush) {
    os << bytes << " B > one-shot limit " << th.oneShotMaxBytes << " B and ";
    if (bytes <= th.twoShotMaxBytes) {
      os << "<= two-shot limit " << th.twoShotMaxBytes << " B; " << th.twoShotWhy;
    } else {
      os << "NCCL is not admitted";
    }
  } else if (isHostAlgo(a)) {
    os << "no peer-memory algorithm is admitted; " << bytes << " B";
    if (bytes > th.hostMaxBytes) {
      os << " > host limit " << th.hostMaxBytes << " B but NCCL is not admitted";
    } else if (a == anyrAlgoHostOneShot) {
      os << " <= host one-shot limit " << th.hostOneShotMaxBytes << " B; " << th.hostWhy;
    } else {
      os << " > host one-shot limit " << th.hostOneShotMaxBytes << " B; " << th.hostWhy;
    }
  } else if (adm[anyrAlgoHostOneShot].admitted && !adm[th.twoShot].admitted &&
             !adm[th.oneShot].admitted) {
    os << bytes << " B > host limit " << th.hostMaxBytes << " B (no peer-memory algorithm)";
  } else {
    os << bytes << " B > two-shot limit " << th.twoShotMaxBytes << " B";
    if (!adm[th.twoShot].admitted) os << " or two-shot not admitted";
  }
  return os.str();
}

}  // namespace anyr
