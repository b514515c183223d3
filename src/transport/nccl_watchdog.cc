#include "transport/nccl_watchdog.h"

#include <utility>

namespace anyr {

Watchdog::Watchdog(Hooks hooks, std::chrono::milliseconds poll)
    : hooks_(std::move(hooks)), poll_(poll) {}

Watchdog::~Watchdog() { stop(); }

bool Watchdog::watch(void* begin, void* end, int timeoutMs, const std::string& what) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_ && !stopped_ && !fired_.load()) {
      Item item;
      item.begin = begin;
      item.end = end;
      item.timeoutMs = timeoutMs;
      item.what = what;
      incoming_.push_back(std::move(item));
      if (!started_) {
        started_ = true;
        thread_ = std::thread([this] { run(); });
      } else if (idle_) {
        cv_.notify_one();
      }
      return true;
    }
  }
  hooks_.release(begin);
  hooks_.release(end);
  return false;
}

size_t Watchdog::stop() {
  std::lock_guard<std::mutex> serial(stopMu_);  // two threads stopping: one joins
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return 0;
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) {
    // From a hook on the watchdog thread itself (a misuse) joining would deadlock; the loop
    // ends after that hook returns.
    if (thread_.get_id() == std::this_thread::get_id()) {
      thread_.detach();
    } else {
      thread_.join();
    }
  }
  std::vector<Item> left;
  size_t pending = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    left.swap(incoming_);
    pending = pendingAtExit_;
    pendingAtExit_ = 0;
    stopped_ = true;
  }
  return pending + releaseAll(left, true);
}

bool Watchdog::started() const {
  std::lock_guard<std::mutex> lock(mu_);
  return started_;
}

size_t Watchdog::outstanding() const {
  std::lock_guard<std::mutex> lock(mu_);
  return incoming_.size() + held_;
}

size_t Watchdog::releaseAll(std::vector<Item>& items, bool countPending) {
  size_t pending = 0;
  for (Item& it : items) {
    if (countPending && hooks_.query(it.end) != Progress::kDone) ++pending;
    hooks_.release(it.begin);
    hooks_.release(it.end);
  }
  items.clear();
  return pending;
}

void Watchdog::run() {
  if (hooks_.threadStart) hooks_.threadStart();
  std::vector<Item> items;  // owned by this thread
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (items.empty() && incoming_.empty()) {
        idle_ = true;
        cv_.wait(lock, [&] { return stopping_ || !incoming_.empty(); });
        idle_ = false;
      } else if (!items.empty()) {
        cv_.wait_for(lock, poll_, [&] { return stopping_; });
      }
      if (stopping_) break;
      for (Item& it : incoming_) items.push_back(std::move(it));
      incoming_.clear();
      held_ = items.size();
    }

    anyrResult_t code = anyrSuccess;
    std::string msg;
    bool fire = hooks_.failed && hooks_.failed(&code, &msg);
    if (!fire) {
      const Clock::time_point t = now();
      for (size_t i = 0; i < items.size();) {
        Item& it = items[i];
        if (hooks_.query(it.end) == Progress::kDone) {
          hooks_.release(it.begin);
          hooks_.release(it.end);
          if (i + 1 != items.size()) it = std::move(items.back());
          items.pop_back();
          continue;
        }
        if (!it.begun && hooks_.query(it.begin) == Progress::kDone) {
          it.begun = true;
          it.deadline = t + std::chrono::milliseconds(it.timeoutMs);
        }
        if (it.begun && t >= it.deadline && !fire) {
          fire = true;
          code = anyrTimeout;
          msg = it.what + " did not complete within " + std::to_string(it.timeoutMs) + " ms";
        }
        ++i;
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      held_ = items.size();
      if (fire) fired_.store(true);  // under the lock: watch() refuses from here on
    }
    if (fire) {
      hooks_.expire(code, msg);
      break;
    }
  }
  std::vector<Item> rest;
  {
    std::lock_guard<std::mutex> lock(mu_);
    rest.swap(incoming_);
  }
  const size_t pending = releaseAll(items, true) + releaseAll(rest, true);
  std::lock_guard<std::mutex> lock(mu_);
  held_ = 0;
  pendingAtExit_ = pending;
}

}  // namespace anyr
