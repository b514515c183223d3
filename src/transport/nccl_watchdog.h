// A deadline watchdog for work the host enqueued and cannot wait on without blocking: NCCL's
// kernels have no deadline of their own, so an NCCL call whose peer never joins would hang its
// stream forever. The owner (NcclHandle, src/transport/nccl_comm.cc) hands each eager call's two
// markers to watch(): `begin` completes when the call can start (everything before it on its
// stream is done), `end` when the call is done. One thread per watchdog, started at the first
// watch(), polls every outstanding call at most `poll` apart:
//
//  - the deadline of a call is its timeout counted from the first poll that saw `begin`
//    complete (not from the enqueue: work queued before it on the stream is not its time);
//  - a call whose `end` completed is forgotten (both markers released);
//  - the first call past its deadline, or a failure the owner reports through `failed`, fires
//    `expire` exactly once, from the watchdog thread; the thread then releases every marker
//    and ends, and later watch() calls are refused.
//
// Everything that touches the device is a hook (query a marker, release it, what the owner
// already knows failed, the action on expiry), and so is the clock, so that the logic runs on
// the CPU in tests (tests/cpu/test_watchdog.cc). The hooks run on the watchdog thread without
// the watchdog's lock held: they may take the owner's locks (the owner must not hold those while
// calling stop()). stop() waits for the thread: one poll interval plus the hook in progress.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "anyreduce/anyreduce.h"

namespace anyr {

class Watchdog {
 public:
  using Clock = std::chrono::steady_clock;
  enum class Progress { kPending, kDone };

  struct Hooks {
    // Optional: runs once on the watchdog thread before its first poll (device, capture mode).
    std::function<void()> threadStart;
    // Non-blocking: has the marker completed? (An error counts as done: the work is over.)
    std::function<Progress(void* marker)> query;
    // The marker is no longer watched (returned to the owner's pool).
    std::function<void(void* marker)> release;
    // Optional, polled while calls are outstanding: true (with a code and a message) when the
    // owner already knows the work failed (NCCL's asynchronous error).
    std::function<bool(anyrResult_t* code, std::string* msg)> failed;
    // Called at most once: a timeout (anyrTimeout, "<what> did not complete within N ms") or
    // what `failed` reported.
    std::function<void(anyrResult_t code, const std::string& msg)> expire;
    // Optional: the clock (tests); steady_clock otherwise.
    std::function<Clock::time_point()> now;
  };

  Watchdog(Hooks hooks, std::chrono::milliseconds poll);
  ~Watchdog();  // stop()
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Watches one call (`what` names it in the timeout message). Returns false, having released
  // both markers, once the watchdog fired or was stopped.
  bool watch(void* begin, void* end, int timeoutMs, const std::string& what);

  // Ends the thread (bounded: one poll interval plus a hook in progress) and releases every
  // marker. Returns how many watched calls had not completed. Idempotent (later calls: 0).
  size_t stop();

  bool fired() const { return fired_.load(); }
  bool started() const;  // the thread was created (stays true after stop())
  // Calls handed to watch() and not yet seen complete.
  size_t outstanding() const;

 private:
  struct Item {
    void* begin = nullptr;
    void* end = nullptr;
    int timeoutMs = 0;
    std::string what;
    bool begun = false;
    Clock::time_point deadline{};
  };

  void run();
  Clock::time_point now() const { return hooks_.now ? hooks_.now() : Clock::now(); }
  // Releases the items' markers; returns how many had not completed.
  size_t releaseAll(std::vector<Item>& items, bool countPending);

  Hooks hooks_;
  std::chrono::milliseconds poll_;
  std::mutex stopMu_;  // held by stop(), never by the thread
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Item> incoming_;  // handed to watch(), not yet taken by the thread
  size_t held_ = 0;             // items the thread holds
  size_t pendingAtExit_ = 0;    // items the thread released without seeing them complete
  bool started_ = false;        // the thread was created (at the first watch())
  bool idle_ = false;           // the thread waits for work (no poll timer running)
  bool stopping_ = false;
  bool stopped_ = false;
  std::atomic<bool> fired_{false};
  std::thread thread_;
};

}  // namespace anyr
