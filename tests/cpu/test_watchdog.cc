// The deadline watchdog that bounds NCCL's calls (src/transport/nccl_watchdog.h), with fake markers
// and a fake clock in place of CUDA events and time. The same watchdog on the GPU, around real NCCL
// calls: tests/gpu/test_nccl_watchdog.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "transport/nccl_watchdog.h"

namespace anyr {
namespace {

using Clock = Watchdog::Clock;
using std::chrono::milliseconds;

// Work whose completion the test decides; each piece has a begin and an end marker.
struct Marker {
  std::atomic<bool> done{false};
  std::atomic<int> released{0};
};

// A watchdog over Markers with a clock the test advances by hand, recording what it did.
class Harness {
 public:
  explicit Harness(milliseconds poll = milliseconds(2)) {
    Watchdog::Hooks h;
    h.threadStart = [this] { threadStarts.fetch_add(1); };
    h.query = [](void* m) {
      return static_cast<Marker*>(m)->done.load() ? Watchdog::Progress::kDone
                                                  : Watchdog::Progress::kPending;
    };
    h.release = [](void* m) { static_cast<Marker*>(m)->released.fetch_add(1); };
    h.failed = [this](anyrResult_t* code, std::string* msg) {
      polls.fetch_add(1);  // once per poll while calls are outstanding
      if (failCode.load() == anyrSuccess) return false;
      *code = failCode.load();
      *msg = "NCCL reported an error";
      return true;
    };
    h.expire = [this](anyrResult_t code, const std::string& msg) {
      std::lock_guard<std::mutex> lock(mu);
      expiries.push_back({code, msg});
      if (expireSleepMs > 0) std::this_thread::sleep_for(milliseconds(expireSleepMs));
    };
    h.now = [this] { return Clock::time_point(milliseconds(nowMs.load())); };
    dog = std::make_unique<Watchdog>(std::move(h), poll);
  }

  // A new piece of work; begin (and end) already complete when asked.
  std::pair<Marker*, Marker*> work(bool begun = true, bool done = false) {
    std::lock_guard<std::mutex> lock(mu);
    markers.push_back(std::make_unique<Marker>());
    markers.push_back(std::make_unique<Marker>());
    Marker* b = markers[markers.size() - 2].get();
    Marker* e = markers.back().get();
    b->done = begun;
    e->done = done;
    return {b, e};
  }

  size_t expiryCount() {
    std::lock_guard<std::mutex> lock(mu);
    return expiries.size();
  }

  // Waits (real time, bounded) until `pred` holds.
  template <typename Pred>
  static bool eventually(Pred pred, milliseconds bound = milliseconds(5000)) {
    const auto until = std::chrono::steady_clock::now() + bound;
    while (!pred()) {
      if (std::chrono::steady_clock::now() > until) return false;
      std::this_thread::sleep_for(milliseconds(1));
    }
    return true;
  }

  // Lets the thread run several polls (for checks that nothing happens: a slow thread only
  // makes them weaker, never wrong).
  static void somePolls() { std::this_thread::sleep_for(milliseconds(30)); }

  // Waits until the thread completed two more polls of outstanding calls, so that it has seen
  // every change the test made before.
  void settle() {
    const int start = polls.load();
    ASSERT_TRUE(eventually([&] { return polls.load() >= start + 2; }))
        << "the thread does not poll";
  }

  struct Expiry {
    anyrResult_t code;
    std::string msg;
  };
  std::mutex mu;
  std::vector<Expiry> expiries;
  std::vector<std::unique_ptr<Marker>> markers;
  std::atomic<long long> nowMs{1000};
  std::atomic<int> threadStarts{0};
  std::atomic<int> polls{0};
  std::atomic<anyrResult_t> failCode{anyrSuccess};
  int expireSleepMs = 0;
  std::unique_ptr<Watchdog> dog;
};

TEST(Watchdog, StartsItsThreadAtTheFirstWatch) {
  Harness h;
  Harness::somePolls();
  EXPECT_FALSE(h.dog->started());
  EXPECT_EQ(h.threadStarts.load(), 0);
  auto [b, e] = h.work();
  ASSERT_TRUE(h.dog->watch(b, e, 100, "call"));
  EXPECT_TRUE(h.dog->started());
  EXPECT_TRUE(Harness::eventually([&] { return h.threadStarts.load() == 1; }));
  e->done = true;
  EXPECT_TRUE(Harness::eventually([&] { return h.dog->outstanding() == 0; }));
}

TEST(Watchdog, AnExpiredDeadlineFiresExactlyOnceWithAMessage) {
  Harness h;
  auto [b, e] = h.work();
  auto [b2, e2] = h.work();
  ASSERT_TRUE(h.dog->watch(b, e, 100, "rank 0: NCCL all-reduce"));
  ASSERT_TRUE(h.dog->watch(b2, e2, 100, "rank 0: NCCL all-reduce"));
  h.settle();  // the thread saw both begin and set their deadlines at t = 1000
  h.nowMs += 99;
  h.settle();
  EXPECT_EQ(h.expiryCount(), 0u) << "fired before the deadline";
  h.nowMs += 2;
  ASSERT_TRUE(Harness::eventually([&] { return h.expiryCount() == 1; }));
  EXPECT_TRUE(h.dog->fired());
  h.nowMs += 10000;  // far past every deadline: still once
  Harness::somePolls();
  {
    std::lock_guard<std::mutex> lock(h.mu);
    ASSERT_EQ(h.expiries.size(), 1u);
    EXPECT_EQ(h.expiries[0].code, anyrTimeout);
    EXPECT_EQ(h.expiries[0].msg, "rank 0: NCCL all-reduce did not complete within 100 ms");
  }
  // After firing, every marker is released once and new work is refused (and released).
  EXPECT_TRUE(Harness::eventually([&] { return e2->released.load() == 1; }));
  for (Marker* m : {b, e, b2, e2}) EXPECT_EQ(m->released.load(), 1);
  auto [b3, e3] = h.work();
  EXPECT_FALSE(h.dog->watch(b3, e3, 100, "late call"));
  EXPECT_EQ(b3->released.load(), 1);
  EXPECT_EQ(e3->released.load(), 1);
  EXPECT_EQ(h.dog->stop(), 2u) << "two watched calls never completed";
  EXPECT_EQ(h.expiryCount(), 1u);
}

TEST(Watchdog, WorkCompletingInTimeTriggersNothing) {
  Harness h;
  std::vector<std::pair<Marker*, Marker*>> calls;
  for (int i = 0; i < 10; ++i) {
    calls.push_back(h.work());
    ASSERT_TRUE(h.dog->watch(calls.back().first, calls.back().second, 100, "call"));
  }
  h.settle();
  h.nowMs += 50;
  for (auto& c : calls) c.second->done = true;
  ASSERT_TRUE(Harness::eventually([&] { return h.dog->outstanding() == 0; }));
  h.nowMs += 100000;  // far past the deadlines of calls that completed: nothing
  Harness::somePolls();
  EXPECT_EQ(h.expiryCount(), 0u);
  EXPECT_FALSE(h.dog->fired());
  for (auto& c : calls) {
    EXPECT_EQ(c.first->released.load(), 1);
    EXPECT_EQ(c.second->released.load(), 1);
  }
  EXPECT_EQ(h.dog->stop(), 0u);
}

TEST(Watchdog, TheDeadlineStartsWhenTheCallCouldStart) {
  // Work queued before the call on its stream is not the call's time.
  Harness h;
  auto [b, e] = h.work(/*begun=*/false);
  ASSERT_TRUE(h.dog->watch(b, e, 100, "call"));
  h.settle();
  h.nowMs += 5000;
  h.settle();
  EXPECT_EQ(h.expiryCount(), 0u) << "fired while the call could not start";
  b->done = true;
  h.settle();  // begin seen at t = 6000
  h.nowMs += 60;
  h.settle();
  EXPECT_EQ(h.expiryCount(), 0u) << "the deadline did not start at begin";
  h.nowMs += 50;
  ASSERT_TRUE(Harness::eventually([&] { return h.expiryCount() == 1; }));
}

TEST(Watchdog, AFailureTheOwnerReportsFiresWithItsCode) {
  Harness h;
  auto [b, e] = h.work();
  ASSERT_TRUE(h.dog->watch(b, e, 100000, "call"));
  h.settle();
  EXPECT_EQ(h.expiryCount(), 0u);
  h.failCode = anyrRemoteError;
  ASSERT_TRUE(Harness::eventually([&] { return h.expiryCount() == 1; }));
  std::lock_guard<std::mutex> lock(h.mu);
  EXPECT_EQ(h.expiries[0].code, anyrRemoteError);
  EXPECT_EQ(h.expiries[0].msg, "NCCL reported an error");
}

TEST(Watchdog, NoFailureIsAskedForWhileNothingIsOutstanding) {
  // The owner's failure query (NCCL's asynchronous error, under its mutex) runs only while a
  // watched call is outstanding.
  Harness h;
  auto [b, e] = h.work(true, true);
  ASSERT_TRUE(h.dog->watch(b, e, 100, "call"));
  ASSERT_TRUE(Harness::eventually([&] { return h.dog->outstanding() == 0; }));
  h.failCode = anyrRemoteError;
  Harness::somePolls();
  EXPECT_EQ(h.expiryCount(), 0u);
}

TEST(Watchdog, StopJoinsTheThreadWithinABoundAndReleasesEverything) {
  Harness h(milliseconds(5));
  std::vector<std::pair<Marker*, Marker*>> calls;
  for (int i = 0; i < 5; ++i) {
    calls.push_back(h.work());
    ASSERT_TRUE(h.dog->watch(calls.back().first, calls.back().second, 1000000, "call"));
  }
  calls[0].second->done = true;
  h.settle();
  const auto t0 = std::chrono::steady_clock::now();
  const size_t pending = h.dog->stop();
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_LT(took, milliseconds(500)) << "stop() is bounded by one poll interval";
  EXPECT_EQ(pending, 4u);
  for (auto& c : calls) {
    EXPECT_EQ(c.first->released.load(), 1);
    EXPECT_EQ(c.second->released.load(), 1);
  }
  EXPECT_EQ(h.expiryCount(), 0u);
  auto [b, e] = h.work();
  EXPECT_FALSE(h.dog->watch(b, e, 100, "after stop"));
  EXPECT_EQ(b->released.load(), 1);
  EXPECT_EQ(h.dog->stop(), 0u) << "idempotent";
}

TEST(Watchdog, TwoThreadsStoppingAtOnce) {
  // anyrCommAbort from one thread while the communicator is being released on another.
  Harness h(milliseconds(5));
  auto [b, e] = h.work();
  ASSERT_TRUE(h.dog->watch(b, e, 1000000, "call"));
  h.settle();
  std::atomic<size_t> pending{0};
  std::thread other([&] { pending += h.dog->stop(); });
  pending += h.dog->stop();
  other.join();
  EXPECT_EQ(pending.load(), 1u) << "the pending call is counted once";
  EXPECT_EQ(b->released.load(), 1);
  EXPECT_EQ(e->released.load(), 1);
}

TEST(Watchdog, StopWithoutWorkIsImmediateAndStopWaitsForAnExpiryInProgress) {
  {
    Harness h;
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(h.dog->stop(), 0u);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(100));
  }
  // The expiry action (ncclCommAbort) takes a while: stop() returns after it, not during it.
  Harness h;
  h.expireSleepMs = 100;
  auto [b, e] = h.work();
  ASSERT_TRUE(h.dog->watch(b, e, 10, "call"));
  h.settle();
  h.nowMs += 20;
  ASSERT_TRUE(Harness::eventually([&] { return h.expiryCount() == 1; }));
  const auto t0 = std::chrono::steady_clock::now();
  h.dog->stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(1000));
  EXPECT_EQ(b->released.load(), 1);
  EXPECT_EQ(e->released.load(), 1);
}

TEST(Watchdog, ManyOutstandingCallsFromSeveralThreads) {
  Harness h(milliseconds(1));
  constexpr int kThreads = 4, kPerThread = 500;
  std::vector<std::pair<Marker*, Marker*>> calls;
  for (int i = 0; i < kThreads * kPerThread; ++i) calls.push_back(h.work());
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        auto& c = calls[static_cast<size_t>(t * kPerThread + i)];
        h.dog->watch(c.first, c.second, 1000, "call");
      }
    });
  }
  for (auto& t : threads) t.join();
  // Complete them in random order while time passes, each within its timeout.
  std::vector<size_t> order(calls.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), std::mt19937(7));
  for (size_t i = 0; i < order.size(); ++i) {
    calls[order[i]].second->done = true;
    if (i % 200 == 0) h.nowMs += 50;
  }
  ASSERT_TRUE(Harness::eventually([&] { return h.dog->outstanding() == 0; }));
  EXPECT_EQ(h.expiryCount(), 0u);
  for (auto& c : calls) {
    ASSERT_EQ(c.first->released.load(), 1);
    ASSERT_EQ(c.second->released.load(), 1);
  }
  // One more that never completes fires once among many that do.
  auto [sb, se] = h.work();
  ASSERT_TRUE(h.dog->watch(sb, se, 1000, "the stuck one"));
  for (int i = 0; i < 100; ++i) {
    auto [b, e] = h.work(true, true);
    h.dog->watch(b, e, 1000, "call");
  }
  h.settle();
  h.nowMs += 1001;
  ASSERT_TRUE(Harness::eventually([&] { return h.expiryCount() == 1; }));
  std::lock_guard<std::mutex> lock(h.mu);
  EXPECT_EQ(h.expiries[0].msg, "the stuck one did not complete within 1000 ms");
}

TEST(Watchdog, DestroyingItJoinsTheThread) {
  auto* marker = new Marker;
  std::atomic<bool> ran{false};
  {
    Watchdog::Hooks hooks;
    hooks.query = [&](void*) {
      ran = true;
      return Watchdog::Progress::kPending;
    };
    hooks.release = [](void* m) { static_cast<Marker*>(m)->released.fetch_add(1); };
    hooks.expire = [](anyrResult_t, const std::string&) {};
    Watchdog dog(std::move(hooks), milliseconds(5));
    dog.watch(marker, marker, 1000000, "call");
    ASSERT_TRUE(Harness::eventually([&] { return ran.load(); }));
  }  // the destructor stops and joins; the thread must not touch the marker afterwards
  EXPECT_EQ(marker->released.load(), 2);
  delete marker;
}

}  // namespace
}  // namespace anyr
