#include "select/explain.h"

#include <cstdio>
#include <sstream>

namespace anyr {

namespace {

std::string fmtSize(uint64_t b) {
  char buf[32];
  if (b >= (1ull << 30)) {
    std::snprintf(buf, sizeof(buf), "%lluG", static_cast<unsigned long long>(b >> 30));
  } else if (b >= (1ull << 20)) {
    std::snprintf(buf, sizeof(buf), "%lluM", static_cast<unsigned long long>(b >> 20));
  } else if (b >= 1024) {
    std::snprintf(buf, sizeof(buf), "%lluK", static_cast<unsigned long long>(b >> 10));
  } else {
    std::snprintf(buf, sizeof(buf), "%llu", static_cast<unsigned long long>(b));
  }
  return buf;
}

const TunedPoint* tunedAt(const TuningTable* t, Op op, int bucket) {
  if (t == nullptr) return nullptr;
  for (const TunedPoint& p : t->points[static_cast<size_t>(op)]) {
    if (p.bucket == bucket) return &p;
  }
  return nullptr;
}

}  // namespace

std::string explainDispatch(const ExplainInput& in) {
  std::ostringstream os;
  const CostInputs ci = costInputs(*in.topo, *in.cfg, in.nranks);
  os << "cost model inputs: " << ci.summary << "\n";
  if (!in.tuningNote.empty()) os << "tuning table: " << in.tuningNote << "\n";
  for (const std::string& note : in.launchNotes) os << note << "\n";
  if (in.forced != anyrAlgoAuto) {
    os << "FORCED: algorithm " << anyrAlgoName(in.forced)
       << " (configuration / ANYR_ALGO / anyrCommSetAlgorithm) overrides every choice below\n";
  }
  for (int o = 0; o < kNumOps; ++o) {
    const Op op = static_cast<Op>(o);
    const std::vector<Candidate> cands = candidates(op, *in.topo, *in.adm);
    os << "\n" << opName(op);
    if (op != Op::AllReduce) os << " (size = tokens x hidden x element size)";
    os << "\n  rejected:";
    bool anyRejected = false;
    for (const Candidate& c : cands) {
      if (c.admitted) continue;
      anyRejected = true;
      os << "\n    " << pathName(op, c.path) << ": " << c.reason;
    }
    if (!anyRejected) os << " none";
    bool hostAdmitted = false;
    for (const AlgoInfo& r : algoRegistry()) {
      if (r.kind == AlgoKind::HostMemory && (*in.adm)[r.algo].admitted) hostAdmitted = true;
    }
    if (peerPathAdmitted(*in.adm) && hostAdmitted) {
      os << "\n  host-memory candidates: admitted (tuning measures them, forcing works), never the "
            "seed while a peer path is admitted";
    }
    os << "\n  "
       << "size      chosen                 source     admitted candidates: "
       << (in.tuned ? "measured us (seed us)" : "seed us") << "\n";
    for (int b = bucketOf(in.minBytes); b <= bucketOf(in.maxBytes); ++b) {
      const Path chosen =
          in.forced != anyrAlgoAuto ? forcedPath(op, in.forced) : in.table->path[o][b];
      const Source src = in.table->source[static_cast<size_t>(o)][static_cast<size_t>(b)];
      char head[96];
      std::snprintf(head, sizeof(head), "  %-8s  %-21s  %-9s ", fmtSize(bucketBytes(b)).c_str(),
                    pathName(op, chosen).c_str(),
                    in.forced != anyrAlgoAuto ? "forced" : sourceName(src));
      os << head;
      const TunedPoint* tp = tunedAt(in.tuned, op, b);
      for (const Candidate& c : cands) {
        if (!c.admitted) continue;
        const std::string name = pathName(op, c.path);
        const double seed = seedTimeUs(op, c.path, bucketBytes(b), ci);
        char cell[96];
        double meas = -2;
        if (tp != nullptr) {
          for (const auto& [n, us] : tp->times) {
            if (n == name) meas = us;
          }
        }
        if (meas >= 0) {
          std::snprintf(cell, sizeof(cell), " %s %.1f (%.1f)", name.c_str(), meas, seed);
        } else if (meas == -2 && tp != nullptr) {
          std::snprintf(cell, sizeof(cell), " %s not measured (%.1f)", name.c_str(), seed);
        } else if (meas == -2) {
          std::snprintf(cell, sizeof(cell), " %s %.1f", name.c_str(), seed);
        } else {
          std::snprintf(cell, sizeof(cell), " %s failed", name.c_str());
        }
        os << cell;
      }
      // A fused kernel's cluster sizes, measured where that kernel won, and the automatic
      // rule's time in the same round ("/rule"; tune.cc).
      if (tp != nullptr) {
        for (const auto& [n, us] : tp->times) {
          if (n.find("/c") == std::string::npos && n.find("/rule") == std::string::npos) continue;
          char cell[96];
          if (us >= 0) {
            std::snprintf(cell, sizeof(cell), " %s %.1f", n.c_str(), us);
          } else {
            std::snprintf(cell, sizeof(cell), " %s failed", n.c_str());
          }
          os << cell;
        }
      }
      os << "\n";
    }
  }
  return os.str();
}

}  // namespace anyr
