// The per-call decision (select/selector.h): the path of one call, forced paths, and whether a
// fused call runs its fused kernel. O(1) and lock-free: every call comes here.
#include <string>

#include "algo/registry.h"
#include "base/error.h"
#include "fused/fused_algo.h"
#include "select/selector.h"

namespace anyr {

namespace {

constexpr int kForcedSet = 1 << 16;
// Bits 0-7 the algorithm, bit 8 the fused kernel, bits 9-12 the cluster size (0..8).
int encodePath(Path p) {
  return kForcedSet | static_cast<int>(p.algo) | (p.fusedKernel ? 256 : 0) | (p.cluster << 9);
}
Path decodePath(int v) {
  return Path{static_cast<anyrAlgo_t>(v & 255), (v & 256) != 0, (v >> 9) & 15};
}

}  // namespace

Path Selector::pathFor(Op op, uint64_t bytes, int hidden) const {
  const int fp = forcedPath_[static_cast<size_t>(op)].load(std::memory_order_relaxed);
  if (fp != 0) return decodePath(fp);
  const anyrAlgo_t forced = static_cast<anyrAlgo_t>(forced_.load(std::memory_order_relaxed));
  if (forced != anyrAlgoAuto) return forcedPath(op, forced);
  Path p = dispatch_.lookup(op, bytes);
  // A measured cluster size holds for the row width it was measured at (the table's hidden);
  // other widths take the automatic rule. hidden 0: the caller does not launch (queries).
  if (p.cluster != 0 && hidden != 0 && hidden != tunedClusterHidden_) p.cluster = 0;
  return p;
}

bool Selector::fusedKernelFor(const Path& path, uint64_t maxRows, int hidden) const {
  const anyrAlgo_t algo = path.algo;
  // The fused kernels hold a row in registers up to two vectors per thread (hidden 8192).
  // Wider, the one-shot spills and the two-shot stages the row in shared memory, and both
  // measured slower than the composition (one-shot, hidden 16384, 1 token: 14.6 vs 9.9 us on
  // 2 x H200, docs/PERFORMANCE.md, "Fused shapes"), so there they run only when forced.
  return maxRows > 0 && path.fusedKernel && fusedKernelOk_[static_cast<size_t>(algo)] &&
         (fusedRowFitsRegisters(hidden) || forced_.load() == algo);
}

void Selector::forcePath(Op op, Path p) {
  if (p.cluster != 0) {
    if (!p.fusedKernel || !pathClusterValid(p.cluster)) {
      throwError(anyrInvalidArgument, std::string(opName(op)) + " path " + pathName(op, p) +
                                          ": a cluster size (1, 2, 4 or 8) needs a fused kernel");
    }
    const AlgoInfo* row = findAlgo(p.algo);
    if (p.cluster > 1 && row != nullptr && row->fused != nullptr && !row->fused->clusterForm) {
      throwError(anyrInvalidArgument, std::string(opName(op)) + " path " + pathName(op, p) +
                                          ": its fused kernel has no thread-block cluster form");
    }
    if (p.cluster > 1 && !clusterOn_) {
      throwError(anyrUnsupported,
                 std::string(opName(op)) + " path " + pathName(op, p) +
                     " needs thread-block clusters, which are off here: " + clusterReason_);
    }
  }
  for (const Candidate& c : candidatesOf(op)) {
    if (c.path.sameKernel(p)) {
      if (!c.admitted && nranks_ > 1) {
        throwError(anyrUnsupported, std::string(opName(op)) + " path " + pathName(op, p) +
                                        " is not admitted on this communicator: " + c.reason);
      }
      forcedPath_[static_cast<size_t>(op)].store(encodePath(p));
      return;
    }
  }
  throwError(anyrInvalidArgument,
             std::string(opName(op)) + " has no path " + pathName(op, p) + " to force");
}

void Selector::clearForcedPath(Op op) { forcedPath_[static_cast<size_t>(op)].store(0); }

}  // namespace anyr
