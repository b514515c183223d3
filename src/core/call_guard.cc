#include "core/call_guard.h"

#include <cstdio>
#include <cstring>
#include <exception>

#include "base/env.h"
#include "base/log.h"
#include "base/names.h"
#include "bootstrap/bootstrap.h"

namespace anyr {

namespace {

std::string dtypeText(int32_t t) {
  static constexpr Named<int32_t> kNames[] = {
      {anyrFloat32, "float32"}, {anyrFloat16, "float16"}, {anyrBfloat16, "bfloat16"}};
  const char* n = nameOf(kNames, t, nullptr);
  return n != nullptr ? n : "invalid(" + std::to_string(t) + ")";
}

std::string opText(int32_t op) {
  return op == anyrSum ? "sum" : "invalid(" + std::to_string(op) + ")";
}

}  // namespace

CallSignature CallSignature::allReduce(size_t count, anyrDataType_t dtype, anyrRedOp_t op) {
  CallSignature s;
  s.kind = static_cast<uint32_t>(SignatureKind::kAllReduce);
  s.count = count;
  s.dtype = static_cast<int32_t>(dtype);
  s.op = static_cast<int32_t>(op);
  return s;
}

CallSignature CallSignature::fused(size_t tokens, size_t hidden, anyrDataType_t dtype, int quant) {
  CallSignature s;
  s.kind = static_cast<uint32_t>(SignatureKind::kAllReduceAddRmsNorm);
  s.count = tokens;
  s.hidden = hidden;
  s.dtype = static_cast<int32_t>(dtype);
  s.op = anyrSum;
  s.extra = quant;
  return s;
}

CallSignature CallSignature::setAlgorithm(anyrAlgo_t algo) {
  CallSignature s;
  s.kind = static_cast<uint32_t>(SignatureKind::kSetAlgorithm);
  s.extra = static_cast<int32_t>(algo);
  return s;
}

bool CallSignature::operator==(const CallSignature& o) const {
  return kind == o.kind && dtype == o.dtype && op == o.op && extra == o.extra && count == o.count &&
         hidden == o.hidden && seq == o.seq;
}

std::string CallSignature::describe() const {
  std::string s = "call #" + std::to_string(seq) + " ";
  switch (static_cast<SignatureKind>(kind)) {
    case SignatureKind::kAllReduce:
      return s + "anyrAllReduce(count=" + std::to_string(count) + ", datatype=" + dtypeText(dtype) +
             ", op=" + opText(op) + ")";
    case SignatureKind::kAllReduceAddRmsNorm: {
      const char* qn = quantName(extra);
      const std::string q = qn != nullptr ? qn : std::to_string(extra);
      return s + "anyrAllReduceAddRmsNorm(tokens=" + std::to_string(count) +
             ", hidden=" + std::to_string(hidden) + ", datatype=" + dtypeText(dtype) +
             ", quant=" + q + ")";
    }
    case SignatureKind::kSetAlgorithm: {
      const char* n = anyrAlgoName(static_cast<anyrAlgo_t>(extra));
      return s + "anyrCommSetAlgorithm(" + (n != nullptr ? n : std::to_string(extra)) + ")";
    }
  }
  return s + "unknown call kind " + std::to_string(kind);
}

anyrResult_t judgeVotes(const std::vector<CallVote>& votes, int myRank, std::string* msg) {
  msg->clear();
  if (votes.empty()) return anyrSuccess;
  // 1. A rank refused its arguments: every rank fails the call; this rank reports its own
  // refusal, the others name the first refusing rank.
  const auto reasonOf = [](const CallVote& v) {
    return std::string(v.reason, strnlen(v.reason, sizeof(v.reason)));
  };
  if (myRank >= 0 && static_cast<size_t>(myRank) < votes.size() &&
      votes[static_cast<size_t>(myRank)].code != anyrSuccess) {
    *msg = reasonOf(votes[static_cast<size_t>(myRank)]);
    return static_cast<anyrResult_t>(votes[static_cast<size_t>(myRank)].code);
  }
  for (size_t r = 0; r < votes.size(); ++r) {
    if (votes[r].code == anyrSuccess) continue;
    *msg = "rank " + std::to_string(r) + " refused " + votes[r].sig.describe() + ": " +
           reasonOf(votes[r]) + " (ANYR_VALIDATE_CALLS: no rank launched it)";
    return anyrRemoteError;
  }
  // 2. Every signature must equal rank 0's.
  const CallSignature& ref = votes[0].sig;
  std::string diff;
  int mismatches = 0;
  for (size_t r = 1; r < votes.size(); ++r) {
    if (votes[r].sig == ref) continue;
    if (mismatches++ < 4) {
      diff += (diff.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + " made " +
              votes[r].sig.describe();
    }
  }
  if (mismatches == 0) return anyrSuccess;
  if (mismatches > 4) diff += "; and " + std::to_string(mismatches - 4) + " more rank(s)";
  *msg =
      "call signatures differ across ranks (ANYR_VALIDATE_CALLS; nothing was launched): "
      "rank 0 made " +
      ref.describe() + "; " + diff;
  return anyrInvalidUsage;
}

bool validateCallsFromEnv() {
  const int64_t v = env::getInt("ANYR_VALIDATE_CALLS");
  if (v != 0 && v != 1) {
    throwError(anyrInvalidArgument, "environment variable ANYR_VALIDATE_CALLS=" +
                                        std::to_string(v) + ": must be 0 or 1");
  }
  return v == 1;
}

void CallGuard::init(Bootstrap& bs, bool wantValidation) {
  const int32_t mine = wantValidation ? 1 : 0;
  std::vector<int32_t> all = bs.allGatherValue(mine);
  validating_ = false;
  for (int32_t a : all) validating_ = validating_ || a != 0;
  if (validating_ && !wantValidation) {
    ANYR_LOG(Warn, bs.rank(),
             "ANYR_VALIDATE_CALLS is set on another rank: validating calls on this one too");
  }
}

CallGuard::Scope::Scope(CallGuard& g, const char* fn) : g_(g) {
  if (g.owner_.load() == std::this_thread::get_id()) {
    if (g.inCallback_.load()) {
      const char* holder = g.holder_.load();
      throwError(anyrInvalidUsage,
                 std::string(fn) + " called from the progress callback of " +
                     (holder != nullptr ? holder : "a call") +
                     " on the same communicator; the callback may report progress, not make "
                     "calls on the communicator that is calling it");
    }
    nested_ = true;
    return;
  }
  if (!g.mu_.try_lock()) {
    const char* other = g.holder_.load();
    throwError(anyrInvalidUsage,
               std::string("communicator in use by another thread (inside ") +
                   (other != nullptr ? other : "a call") +
                   "); one communicator takes one call at a time: serialize the calls, or use "
                   "one communicator per thread");
  }
  g.holder_.store(fn);
  g.owner_.store(std::this_thread::get_id());
}

CallGuard::Scope::~Scope() {
  if (nested_) return;
  g_.owner_.store(std::thread::id());
  g_.holder_.store(nullptr);
  g_.mu_.unlock();
}

void CallGuard::exchange(Bootstrap& bs, int rank, CallSignature sig,
                         const std::function<void()>& check, bool& settled) {
  sig.seq = ++seq_;
  CallVote mine;
  mine.sig = sig;
  std::exception_ptr refusal;
  try {
    check();
  } catch (const Error& e) {
    mine.code = e.code();
    std::snprintf(mine.reason, sizeof(mine.reason), "%s", e.what());
    refusal = std::current_exception();
  }
  std::vector<CallVote> votes;
  try {
    votes = bs.allGatherValue(mine);
  } catch (const Error& e) {
    rethrowWithContext(e,
                       "exchanging the signature of " + sig.describe() + " (ANYR_VALIDATE_CALLS)");
  }
  settled = true;
  std::string msg;
  anyrResult_t r = judgeVotes(votes, rank, &msg);
  if (r != anyrSuccess) {
    // This rank's own refusal keeps its full message (the vote carries a truncated copy).
    if (refusal) std::rethrow_exception(refusal);
    throwError(r, msg);
  }
}

}  // namespace anyr
