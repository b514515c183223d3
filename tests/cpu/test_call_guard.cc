// The per-communicator call discipline (src/core/call_guard.h): the validation-mode verdict
// over every rank's call signature, the exchange around a local argument check, the
// one-call-at-a-time guard, and ANYR_VALIDATE_CALLS. The multi-process versions run on GPUs
// (tests/gpu/test_reliability_calls.cc).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/config.h"
#include "base/error.h"
#include "bootstrap/bootstrap.h"
#include "core/call_guard.h"
#include "cpu/expect_error.h"

namespace anyr {
namespace {

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

CallVote vote(const CallSignature& sig, uint64_t seq, anyrResult_t code = anyrSuccess,
              const char* reason = "") {
  CallVote v;
  v.sig = sig;
  v.sig.seq = seq;
  v.code = code;
  std::snprintf(v.reason, sizeof(v.reason), "%s", reason);
  return v;
}

TEST(CallSignature, DescribesEachKind) {
  CallSignature a = CallSignature::allReduce(1024, anyrBfloat16, anyrSum);
  a.seq = 7;
  EXPECT_EQ(a.describe(), "call #7 anyrAllReduce(count=1024, datatype=bfloat16, op=sum)");
  CallSignature f = CallSignature::fused(3, 4096, anyrFloat16, anyrQuantNvfp4);
  f.seq = 1;
  EXPECT_EQ(
      f.describe(),
      "call #1 anyrAllReduceAddRmsNorm(tokens=3, hidden=4096, datatype=float16, quant=nvfp4)");
  CallSignature s = CallSignature::setAlgorithm(anyrAlgoTwoShot);
  s.seq = 2;
  EXPECT_EQ(s.describe(), "call #2 anyrCommSetAlgorithm(twoshot)");
  CallSignature bad =
      CallSignature::allReduce(1, static_cast<anyrDataType_t>(9), static_cast<anyrRedOp_t>(3));
  EXPECT_TRUE(contains(bad.describe(), "datatype=invalid(9), op=invalid(3)")) << bad.describe();
}

TEST(JudgeVotes, EqualSignaturesPass) {
  const CallSignature a = CallSignature::allReduce(1024, anyrFloat32, anyrSum);
  std::vector<CallVote> votes = {vote(a, 5), vote(a, 5), vote(a, 5), vote(a, 5)};
  for (int r = 0; r < 4; ++r) {
    std::string msg = "stale";
    EXPECT_EQ(judgeVotes(votes, r, &msg), anyrSuccess);
    EXPECT_EQ(msg, "");
  }
}

TEST(JudgeVotes, DifferentCountIsNamedIdenticallyOnEveryRank) {
  const CallSignature a = CallSignature::allReduce(1024, anyrBfloat16, anyrSum);
  const CallSignature b = CallSignature::allReduce(2048, anyrBfloat16, anyrSum);
  std::vector<CallVote> votes = {vote(a, 3), vote(b, 3)};
  std::string m0, m1;
  EXPECT_EQ(judgeVotes(votes, 0, &m0), anyrInvalidUsage);
  EXPECT_EQ(judgeVotes(votes, 1, &m1), anyrInvalidUsage);
  EXPECT_EQ(m0, m1);
  EXPECT_EQ(m0,
            "call signatures differ across ranks (ANYR_VALIDATE_CALLS; nothing was launched): rank "
            "0 made call #3 anyrAllReduce(count=1024, datatype=bfloat16, op=sum); rank 1 made call "
            "#3 anyrAllReduce(count=2048, datatype=bfloat16, op=sum)");
}

TEST(JudgeVotes, EveryFieldTakesPart) {
  const CallSignature base = CallSignature::allReduce(64, anyrFloat16, anyrSum);
  std::vector<CallSignature> others = {
      CallSignature::allReduce(64, anyrBfloat16, anyrSum),                     // dtype
      CallSignature::allReduce(64, anyrFloat16, static_cast<anyrRedOp_t>(1)),  // op
      CallSignature::fused(64, 128, anyrFloat16, 0),                           // kind
      CallSignature::setAlgorithm(anyrAlgoNccl),                               // kind
  };
  for (const CallSignature& o : others) {
    std::vector<CallVote> votes = {vote(base, 1), vote(base, 1), vote(o, 1)};
    std::string msg;
    EXPECT_EQ(judgeVotes(votes, 1, &msg), anyrInvalidUsage) << o.describe();
    EXPECT_TRUE(contains(msg, "rank 2 made " + vote(o, 1).sig.describe())) << msg;
    EXPECT_FALSE(contains(msg, "rank 1 made")) << msg;
  }
  // Only the call number differs: a rank skipped a call.
  std::vector<CallVote> votes = {vote(base, 9), vote(base, 8)};
  std::string msg;
  EXPECT_EQ(judgeVotes(votes, 0, &msg), anyrInvalidUsage);
  EXPECT_TRUE(contains(msg, "rank 0 made call #9") && contains(msg, "rank 1 made call #8")) << msg;
  // Fused shape and quantization.
  const CallSignature f = CallSignature::fused(8, 4096, anyrBfloat16, 0);
  for (const CallSignature& o : {CallSignature::fused(8, 2048, anyrBfloat16, 0),
                                 CallSignature::fused(8, 4096, anyrBfloat16, 1),
                                 CallSignature::fused(9, 4096, anyrBfloat16, 0)}) {
    std::vector<CallVote> v2 = {vote(f, 1), vote(o, 1)};
    EXPECT_EQ(judgeVotes(v2, 0, &msg), anyrInvalidUsage) << o.describe();
  }
}

TEST(JudgeVotes, ManyMismatchesAreSummarized) {
  const CallSignature a = CallSignature::allReduce(1, anyrFloat32, anyrSum);
  std::vector<CallVote> votes = {vote(a, 1)};
  for (int r = 1; r < 8; ++r)
    votes.push_back(vote(CallSignature::allReduce(r + 1, anyrFloat32, anyrSum), 1));
  std::string msg;
  EXPECT_EQ(judgeVotes(votes, 0, &msg), anyrInvalidUsage);
  EXPECT_TRUE(contains(msg, "rank 4 made") && !contains(msg, "rank 5 made")) << msg;
  EXPECT_TRUE(contains(msg, "and 3 more rank(s)")) << msg;
}

TEST(JudgeVotes, ARefusingRankFailsEveryRank) {
  const CallSignature a = CallSignature::allReduce(256, anyrFloat32, anyrSum);
  std::vector<CallVote> votes = {
      vote(a, 4), vote(a, 4, anyrInvalidArgument, "argument 'sendbuff': must not be NULL"),
      vote(CallSignature::allReduce(512, anyrFloat32, anyrSum), 4)};
  std::string msg;
  // The refusing rank reports its own error.
  EXPECT_EQ(judgeVotes(votes, 1, &msg), anyrInvalidArgument);
  EXPECT_EQ(msg, "argument 'sendbuff': must not be NULL");
  // The others name it (the refusal wins over the count mismatch of rank 2).
  for (int r : {0, 2}) {
    EXPECT_EQ(judgeVotes(votes, r, &msg), anyrRemoteError);
    EXPECT_EQ(msg,
              "rank 1 refused call #4 anyrAllReduce(count=256, datatype=float32, op=sum): argument "
              "'sendbuff': must not be NULL (ANYR_VALIDATE_CALLS: no rank launched it)");
  }
}

// A bootstrap whose allGather hands out this rank's contribution and canned ones for the others.
class CannedBootstrap : public Bootstrap {
 public:
  CannedBootstrap(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void allGather(const void* in, void* out, size_t bytes) override {
    ++gathers;
    if (failWith != anyrSuccess) throwError(failWith, "bootstrap: rank(s) 1 of 2 did not arrive");
    for (int r = 0; r < size_; ++r) {
      const void* src =
          r == rank_ ? in : (r < static_cast<int>(canned.size()) ? canned[r].data() : in);
      std::memcpy(static_cast<char*>(out) + bytes * r, src, bytes);
    }
  }
  void barrier() override {}
  std::vector<std::vector<char>> canned;  // by rank; empty: a copy of this rank's
  int gathers = 0;
  anyrResult_t failWith = anyrSuccess;

 private:
  int rank_, size_;
};

std::vector<char> bytesOf(const CallVote& v) {
  const char* p = reinterpret_cast<const char*>(&v);
  return std::vector<char>(p, p + sizeof(v));
}

TEST(CallGuard, WithoutValidationOnlyTheLocalCheckRuns) {
  CannedBootstrap bs(0, 2);
  CallGuard g;
  g.init(bs, false);
  EXPECT_FALSE(g.validating());
  bs.gathers = 0;
  int checks = 0;
  bool settled = false;
  g.checked(
      bs, 0, CallSignature::allReduce(1, anyrFloat32, anyrSum), [&] { ++checks; }, settled);
  EXPECT_EQ(checks, 1);
  EXPECT_EQ(bs.gathers, 0) << "validation off must not touch the bootstrap";
  EXPECT_THROW(g.checked(
                   bs, 0, CallSignature::allReduce(1, anyrFloat32, anyrSum),
                   [] { throwError(anyrInvalidArgument, "argument 'x': bad"); }, settled),
               Error);
  // A local refusal without validation mode is this rank's alone: the peers may have made the
  // call, so it is not settled (the communicator must repair it).
  EXPECT_FALSE(settled);
}

TEST(CallGuard, ValidationIsOnWhenAnyRankAsks) {
  CannedBootstrap bs(0, 2);
  int32_t yes = 1;
  bs.canned = {{},
               std::vector<char>(reinterpret_cast<char*>(&yes), reinterpret_cast<char*>(&yes) + 4)};
  CallGuard g;
  g.init(bs, false);
  EXPECT_TRUE(g.validating());
}

TEST(CallGuard, ValidationReportsMismatchAndPeerRefusal) {
  CannedBootstrap bs(0, 2);
  CallGuard g;
  g.init(bs, true);
  ASSERT_TRUE(g.validating());
  const CallSignature mine = CallSignature::allReduce(100, anyrFloat16, anyrSum);
  // Call #1: the peer agrees.
  bs.canned = {{}, bytesOf(vote(mine, 1))};
  bool settled = false;
  g.checked(
      bs, 0, mine, [] {}, settled);
  EXPECT_TRUE(settled);
  // Call #2: the peer passes another count.
  bs.canned = {{}, bytesOf(vote(CallSignature::allReduce(200, anyrFloat16, anyrSum), 2))};
  settled = false;
  expectError(
      [&] {
        g.checked(
            bs, 0, mine, [] {}, settled);
      },
      anyrInvalidUsage,
      {"rank 0 made call #2 anyrAllReduce(count=100",
       "rank 1 made call #2 anyrAllReduce(count=200"},
      "expected a mismatch");
  EXPECT_TRUE(settled) << "every rank saw the mismatch: nothing to repair";
  // Call #3: the peer refused its arguments.
  bs.canned = {{}, bytesOf(vote(mine, 3, anyrInvalidArgument, "argument 'recvbuff': bad"))};
  settled = false;
  expectError(
      [&] {
        g.checked(
            bs, 0, mine, [] {}, settled);
      },
      anyrRemoteError, {"rank 1 refused call #3", "argument 'recvbuff': bad"},
      "expected the peer's refusal");
  EXPECT_TRUE(settled);
  // Call #4: this rank refuses; its own full message comes back even though the peer agreed.
  std::string longRule(300, 'x');
  bs.canned = {{}, bytesOf(vote(mine, 4))};
  try {
    settled = false;
    g.checked(
        bs, 0, mine, [&] { throwError(anyrInvalidArgument, "argument 'count': " + longRule); },
        settled);
    FAIL() << "expected the local refusal";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), anyrInvalidArgument);
    EXPECT_EQ(std::string(e.what()), "argument 'count': " + longRule);
    EXPECT_TRUE(settled) << "every rank learned of the refusal: nothing was launched";
  }
}

TEST(CallGuard, ExchangeFailureIsNotSettled) {
  CannedBootstrap bs(0, 2);
  CallGuard g;
  g.init(bs, true);
  bs.failWith = anyrTimeout;
  bool settled = false;
  expectError(
      [&] {
        g.checked(
            bs, 0, CallSignature::allReduce(8, anyrFloat32, anyrSum), [] {}, settled);
      },
      anyrTimeout, {"rank(s) 1 of 2 did not arrive", "exchanging the signature of call #1"},
      "expected a timeout");
  EXPECT_FALSE(settled) << "a failed exchange is not an agreement: the communicator repairs it";
}

TEST(CallGuard, ASecondThreadIsRefusedNotBlocked) {
  CallGuard g;
  std::mutex m;
  std::condition_variable cv;
  bool entered = false, release = false;
  std::thread holder([&] {
    CallGuard::Scope s(g, "anyrAllReduce");
    std::unique_lock<std::mutex> lk(m);
    entered = true;
    cv.notify_all();
    cv.wait(lk, [&] { return release; });
  });
  {
    std::unique_lock<std::mutex> lk(m);
    cv.wait(lk, [&] { return entered; });
  }
  try {
    CallGuard::Scope s(g, "anyrAllReduceAddRmsNorm");
    FAIL() << "a concurrent call must be refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), anyrInvalidUsage);
    EXPECT_TRUE(contains(e.what(), "communicator in use by another thread (inside anyrAllReduce)"))
        << e.what();
  }
  {
    std::lock_guard<std::mutex> lk(m);
    release = true;
  }
  cv.notify_all();
  holder.join();
  // Free again: this thread gets it, repeatedly.
  for (int i = 0; i < 3; ++i) CallGuard::Scope s(g, "anyrAllReduce");
}

// anyrCommTune holds the guard for the whole tuning and makes its measuring calls inside it:
// the same thread's nested Scope holds nothing more, and releasing it releases nothing.
TEST(CallGuard, TheHoldingThreadNestsAndOthersStayRefused) {
  CallGuard g;
  auto refusedElsewhere = [&] {
    bool refused = false;
    std::thread other([&] {
      try {
        CallGuard::Scope s(g, "anyrAllReduce");
      } catch (const Error& e) {
        refused = e.code() == anyrInvalidUsage && contains(e.what(), "inside anyrCommTune");
      }
    });
    other.join();
    return refused;
  };
  {
    CallGuard::Scope tune(g, "anyrCommTune");
    {
      CallGuard::Scope inner(g, "anyrAllReduce");
      EXPECT_TRUE(refusedElsewhere());
    }
    EXPECT_TRUE(refusedElsewhere()) << "the nested Scope's end released the guard";
  }
  std::thread after([&] { CallGuard::Scope s(g, "anyrAllReduce"); });  // free again
  after.join();
}

// anyrCommTune's progress callback runs on the holding thread: a call it makes is refused, not
// nested (a destroy would free the communicator under the tuning; a collective would run on
// this rank alone); once the callback returned, the tuning's own calls nest again.
TEST(CallGuard, TheProgressCallbackCannotCallIn) {
  CallGuard g;
  CallGuard::Scope tune(g, "anyrCommTune");
  {
    CallGuard::CallbackScope callback(g);
    for (const char* fn : {"anyrAllReduce", "anyrCommDestroy"}) {
      try {
        CallGuard::Scope s(g, fn);
        ADD_FAILURE() << fn << " from the progress callback was let in";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), anyrInvalidUsage);
        EXPECT_TRUE(contains(
            e.what(), std::string(fn) + " called from the progress callback of anyrCommTune"))
            << e.what();
      }
    }
  }
  CallGuard::Scope inner(g, "anyrAllReduce");  // nested again
}

TEST(CallGuard, EnvironmentSwitch) {
  unsetenv("ANYR_VALIDATE_CALLS");
  EXPECT_FALSE(validateCallsFromEnv());
  setenv("ANYR_VALIDATE_CALLS", "1", 1);
  EXPECT_TRUE(validateCallsFromEnv());
  for (const char* bad : {"2", "yes"}) {
    setenv("ANYR_VALIDATE_CALLS", bad, 1);
    expectError([] { validateCallsFromEnv(); }, anyrInvalidArgument, "ANYR_VALIDATE_CALLS", bad);
  }
  unsetenv("ANYR_VALIDATE_CALLS");
}

TEST(Config, MaxBlocksIsRangeCheckedBeforeNarrowing) {
  setenv("ANYR_MAX_BLOCKS", "4294967297", 1);  // 2^32 + 1: would read as 1 after an int cast
  expectError([] { resolveConfig(nullptr); }, anyrInvalidArgument, "ANYR_MAX_BLOCKS",
              "expected ANYR_MAX_BLOCKS=4294967297 to be refused");
  unsetenv("ANYR_MAX_BLOCKS");
}

TEST(Config, TimeoutFieldHasTheEnvironmentsRange) {
  for (int bad : {0, -5, 86400001, 2147483647}) {
    anyrConfig_t cfg = ANYR_CONFIG_INITIALIZER;
    cfg.timeoutMs = bad;
    expectError([&] { resolveConfig(&cfg); }, anyrInvalidArgument,
                "argument 'config.timeoutMs': must be in 1..86400000",
                "timeoutMs " + std::to_string(bad) + " accepted");
  }
  anyrConfig_t ok = ANYR_CONFIG_INITIALIZER;
  ok.timeoutMs = 86400000;
  EXPECT_EQ(resolveConfig(&ok).timeoutMs, 86400000);
}

}  // namespace
}  // namespace anyr
