// The host one-shot's low-latency protocol (src/algo/host_oneshot_ll.cu): which tag a launch's
// lines carry, which buffer they go to and when and how a launch sweeps its buffer
// (hostLLBuffer, hostLLSweeps, hostLLSweepTag, device/host_handles.h), checked on a model of the
// lines over launch plans that run past 2^32 launches. A reader takes a line when it carries the
// launch's tag, so the protocol is safe only if no line a launch reads carries that tag before the
// launch wrote it (a stale line: a late peer's data would be taken from an earlier launch). Every
// rank makes the same launches, so one rank's lines stand for every rank's.
//
// The model keeps one tag per line of the two buffers. A plan's step is m launches of one size
// (w lines each: 2 per 16-byte vector) or m launches of other host algorithms; m runs to 2^33,
// so a step's launches after its first three are applied at once: each reads only lines its
// own step wrote two launches before, and only the last write of each line matters.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "device/host_handles.h"

namespace anyr {
namespace {

constexpr uint64_t kTwo32 = uint64_t{1} << 32;

enum class Rule {
  kLaunchCount,  // the protocol's own count as tag, hostLLBuffer and hostLLSweeps (today)
  kSharedEpoch,  // the host kernels' shared epoch as tag, its parity as buffer, no sweep (before)
};

class LowLatencyModel {
 public:
  LowLatencyModel(Rule rule, uint32_t lines) : rule_(rule), lines_(lines) {
    for (auto& b : tags_) b.assign(lines, 0u);
  }

  // The count (llUse, or syncEpoch for kSharedEpoch) starts at `count`; with tagLines, every
  // line carries it (what ANYR_TEST_HOST_LL_COUNT sets up), else the lines stay as they are.
  void start(uint32_t count, bool tagLines) {
    count_ = count;
    abs_ = count;
    if (tagLines) {
      for (auto& b : tags_) b.assign(lines_, count);
    }
  }

  // A self-test reset: the count back to 0, the lines cleared to tag 0 or left as they are.
  void reset(bool clearLines) { start(0, clearLines); }

  // m launches of other host algorithms: they advance only the shared epoch.
  void others(uint64_t m) {
    if (rule_ != Rule::kSharedEpoch) return;
    count_ = static_cast<uint32_t>(count_ + m);
    abs_ += m;
  }

  // m low-latency launches of w lines each. Returns false (and stops) at the first launch that
  // finds a line carrying its own tag before writing it, recorded in staleAt().
  bool launches(uint64_t m, uint32_t w) {
    const uint64_t explicitOnes = m < 3 ? m : 3;
    for (uint64_t i = 0; i < explicitOnes; ++i) {
      if (!launchOne(w)) return false;
    }
    const uint64_t rest = m - explicitOnes;
    if (rest == 0) return true;
    // Launches abs_+1 .. abs_+rest: each reads lines [0, w) of its buffer, which the launch two
    // before it (of this step) wrote, so none is stale. What stays: per buffer, lines [0, w)
    // carry the step's last tag of that buffer, and lines [w, lines) the tag the step's last
    // sweep of that buffer wrote (hostLLSweepTag), if it swept it.
    const uint64_t lo = abs_ + 1, hi = abs_ + rest;
    for (uint32_t b = 0; b < 2; ++b) {
      uint64_t last = hi;
      while (bufferOf(static_cast<uint32_t>(last)) != b) --last;
      for (uint32_t l = 0; l < w; ++l) tags_[b][l] = static_cast<uint32_t>(last);
      uint64_t sweep = 0;
      if (lastSweep(lo, hi, b, &sweep)) {
        const uint32_t swept = hostLLSweepTag(static_cast<uint32_t>(sweep));
        for (uint32_t l = w; l < lines_; ++l) tags_[b][l] = swept;
      }
    }
    abs_ = hi;
    count_ = static_cast<uint32_t>(hi);
    launched_ += rest;
    return true;
  }

  // Which launch of the plan (1 = the first low-latency launch) found a stale line, and which
  // line; 0 if none did.
  uint64_t staleAt() const { return staleAt_; }
  std::string describeStale() const {
    return "launch " + std::to_string(staleAt_) + " (tag " + std::to_string(staleTag_) +
           ") found line " + std::to_string(staleLine_) + " carrying its tag";
  }

 private:
  uint32_t bufferOf(uint32_t tag) const {
    return rule_ == Rule::kLaunchCount ? hostLLBuffer(tag) : (tag & 1u);
  }
  bool sweeps(uint32_t tag) const { return rule_ == Rule::kLaunchCount && hostLLSweeps(tag); }

  // The last launch in [lo, hi] (absolute) that sweeps buffer b. hostLLSweeps holds only at
  // the first two counts of each kHostLLSweepPeriod (HostLowLatencyTags.SweepsAreTheFirstTwo-
  // CountsOfEachPeriod), so only those are looked at.
  bool lastSweep(uint64_t lo, uint64_t hi, uint32_t b, uint64_t* out) const {
    if (rule_ != Rule::kLaunchCount) return false;
    const uint64_t p = kHostLLSweepPeriod;
    for (uint64_t base = hi / p * p;; base -= p) {
      for (uint64_t t = base + 1;; --t) {  // base + 1, then base
        if (t >= lo && t <= hi && sweeps(static_cast<uint32_t>(t)) &&
            bufferOf(static_cast<uint32_t>(t)) == b) {
          *out = t;
          return true;
        }
        if (t == base) break;
      }
      if (base < lo || base == 0) return false;
    }
  }

  bool launchOne(uint32_t w) {
    const uint32_t tag = count_ + 1;
    const uint32_t b = bufferOf(tag);
    ++launched_;
    for (uint32_t l = 0; l < w; ++l) {
      if (tags_[b][l] == tag) {
        staleAt_ = launched_;
        staleTag_ = tag;
        staleLine_ = l;
        return false;
      }
    }
    for (uint32_t l = 0; l < w; ++l) tags_[b][l] = tag;
    if (sweeps(tag)) {
      for (uint32_t l = w; l < lines_; ++l) tags_[b][l] = hostLLSweepTag(tag);
    }
    count_ = tag;
    ++abs_;
    return true;
  }

  Rule rule_;
  uint32_t lines_;
  std::vector<uint32_t> tags_[2];
  uint32_t count_ = 0;
  uint64_t abs_ = 0;  // the count without wrapping (for the steps' arithmetic)
  uint64_t launched_ = 0;
  uint64_t staleAt_ = 0;
  uint32_t staleTag_ = 0;
  uint32_t staleLine_ = 0;
};

constexpr uint32_t kLines = 64;  // 32 vectors, 512 bytes of payload

TEST(HostLowLatencyTags, SweepsAreTheFirstTwoCountsOfEachPeriod) {
  EXPECT_EQ(kHostLLSweepPeriod, 1u << 30);
  for (uint64_t base = 0; base < kTwo32; base += kHostLLSweepPeriod) {
    for (int64_t d = -3; d <= 3; ++d) {
      const uint32_t t = static_cast<uint32_t>(base + static_cast<uint64_t>(d));
      EXPECT_EQ(hostLLSweeps(t), d == 0 || d == 1) << t;
    }
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 100000; ++i) {
    const uint32_t t = static_cast<uint32_t>(rng());
    EXPECT_EQ(hostLLSweeps(t), t % kHostLLSweepPeriod < 2) << t;
    EXPECT_EQ(hostLLBuffer(t), t % 2) << t;
  }
  // Each buffer is swept once a period: count 0 and 2^30 sweep buffer 0, 1 and 2^30 + 1 buffer 1.
  EXPECT_EQ(hostLLBuffer(0), 0u);
  EXPECT_EQ(hostLLBuffer(1), 1u);
  // A sweep writes an older tag of the same buffer, never its own (a peer reading past the
  // launch's lines, which a correct caller never does, must not take the sweep's zeros).
  for (uint32_t t : {0u, 1u, kHostLLSweepPeriod, kHostLLSweepPeriod + 1, UINT32_MAX - 1}) {
    EXPECT_NE(hostLLSweepTag(t), t);
    EXPECT_EQ(hostLLBuffer(hostLLSweepTag(t)), hostLLBuffer(t));
  }
}

// A large launch, then only small ones until the count has come round 2^32, then large ones
// again: the large launch's lines past the small ones' are the stale ones. With the shared epoch
// as tag they matched at exactly 2^32 launches; with the protocol's count and its sweeps no
// launch ever finds one.
TEST(HostLowLatencyTags, LinesLeftFor2To32LaunchesAreNeverTaken) {
  LowLatencyModel old(Rule::kSharedEpoch, kLines);
  ASSERT_TRUE(old.launches(1, kLines));
  ASSERT_TRUE(old.launches(kTwo32 - 1, 2));
  EXPECT_FALSE(old.launches(1, kLines)) << "the shared-epoch rule should have found a stale line";
  EXPECT_EQ(old.staleAt(), kTwo32 + 1) << old.describeStale();

  for (uint64_t small : {kTwo32 - 1, kTwo32 - 2, kTwo32, kTwo32 + 1, 2 * kTwo32 - 1}) {
    LowLatencyModel m(Rule::kLaunchCount, kLines);
    ASSERT_TRUE(m.launches(1, kLines));
    ASSERT_TRUE(m.launches(small, 2)) << m.describeStale();
    EXPECT_TRUE(m.launches(4, kLines)) << small << ": " << m.describeStale();
  }
}

// A large low-latency launch, then 2^32 - 1 launches of other host algorithms, then a large one:
// the shared epoch came round to the first launch's tag; the protocol's count did not move.
TEST(HostLowLatencyTags, OtherAlgorithmsInBetweenChangeNothing) {
  LowLatencyModel old(Rule::kSharedEpoch, kLines);
  ASSERT_TRUE(old.launches(1, kLines));
  old.others(kTwo32 - 1);
  EXPECT_FALSE(old.launches(1, kLines));
  LowLatencyModel m(Rule::kLaunchCount, kLines);
  ASSERT_TRUE(m.launches(1, kLines));
  m.others(kTwo32 - 1);
  EXPECT_TRUE(m.launches(3, kLines)) << m.describeStale();
}

// The count near its wrap over zeroed lines: tag 0 comes round and every never-written line
// carries it (the shared epoch did this at its wrap, and with ANYR_TEST_SYNC_EPOCH=4294967295).
// ANYR_TEST_HOST_LL_COUNT therefore tags the lines with the start value; the model shows that
// this is needed, and enough.
TEST(HostLowLatencyTags, AStartNearTheWrapNeedsTheLinesTagged) {
  LowLatencyModel old(Rule::kSharedEpoch, kLines);
  old.start(UINT32_MAX, false);
  EXPECT_FALSE(old.launches(1, 8));
  EXPECT_EQ(old.staleAt(), 1u) << old.describeStale();

  LowLatencyModel untagged(Rule::kLaunchCount, kLines);
  untagged.start(UINT32_MAX - 4, false);
  ASSERT_TRUE(untagged.launches(4, 2));
  EXPECT_FALSE(untagged.launches(1, 8));  // tag 0: lines 2..7 of buffer 0 were never written
  EXPECT_EQ(untagged.staleAt(), 5u) << untagged.describeStale();

  for (uint32_t start : {UINT32_MAX, UINT32_MAX - 1, UINT32_MAX - 4, kHostLLSweepPeriod - 3,
                         kHostLLSweepPeriod + 1, 0u, 1u}) {
    LowLatencyModel m(Rule::kLaunchCount, kLines);
    m.start(start, true);
    ASSERT_TRUE(m.launches(5, 2)) << start << ": " << m.describeStale();
    ASSERT_TRUE(m.launches(1, kLines)) << start << ": " << m.describeStale();
    ASSERT_TRUE(m.launches(kTwo32 + 7, 4)) << start << ": " << m.describeStale();
    EXPECT_TRUE(m.launches(3, kLines)) << start << ": " << m.describeStale();
  }
}

// The self-test's reset of the protocol state: the count back to 0 with the lines as the
// self-test left them (tags 1, 2, 3 after its three small launches) made the next launches take
// the self-test's lines; resetProtocolState clears them to tag 0.
TEST(HostLowLatencyTags, AResetOfTheCountClearsTheLines) {
  // Launch 5 (tag 2) finds the lines launch 2 wrote.
  for (Rule rule : {Rule::kSharedEpoch, Rule::kLaunchCount}) {
    LowLatencyModel kept(rule, kLines);
    ASSERT_TRUE(kept.launches(3, kLines / 2));
    kept.reset(false);
    EXPECT_FALSE(kept.launches(3, kLines));
    EXPECT_EQ(kept.staleAt(), 5u) << kept.describeStale();
  }
  LowLatencyModel m(Rule::kLaunchCount, kLines);
  ASSERT_TRUE(m.launches(3, kLines / 2));
  m.reset(true);
  EXPECT_TRUE(m.launches(2 * kTwo32 + 3, kLines)) << m.describeStale();
}

// Random plans: steps of random sizes and lengths (up to 2^33 launches, so several wraps and
// sweeps), other algorithms in between; no launch ever finds a stale line.
TEST(HostLowLatencyTags, RandomPlansNeverTakeAStaleLine) {
  std::mt19937_64 rng(2024);
  for (int plan = 0; plan < 300; ++plan) {
    LowLatencyModel m(Rule::kLaunchCount, kLines);
    if (plan % 3 == 1) m.start(static_cast<uint32_t>(rng()), true);
    std::string steps;
    for (int step = 0; step < 40; ++step) {
      const uint32_t w = 2 * static_cast<uint32_t>(1 + rng() % (kLines / 2));
      uint64_t count = 0;
      switch (rng() % 4) {
        case 0:
          count = 1 + rng() % 4;
          break;
        case 1:
          count = 1 + rng() % (uint64_t{1} << 20);
          break;
        case 2:
          count = rng() % (uint64_t{1} << 33);
          break;
        default:
          count = kHostLLSweepPeriod - 2 + rng() % 5;
          break;
      }
      steps += " " + std::to_string(count) + "x" + std::to_string(w);
      if (rng() % 5 == 0) m.others(rng() % (uint64_t{1} << 33));
      ASSERT_TRUE(m.launches(count, w))
          << "plan " << plan << ":" << steps << ": " << m.describeStale();
    }
  }
}

}  // namespace
}  // namespace anyr
