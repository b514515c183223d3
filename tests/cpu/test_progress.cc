// The progress line of bench, tune and doctor (tools/common/progress.h) with a fake clock and a
// captured output: its content, its pacing, its clearing, and its silence when disabled.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/progress.h"

using namespace anyr::tool;

TEST(Progress, Durations) {
  EXPECT_EQ(formatDuration(0), "0s");
  EXPECT_EQ(formatDuration(-3), "0s");
  EXPECT_EQ(formatDuration(44.2), "45s");
  EXPECT_EQ(formatDuration(59), "59s");
  EXPECT_EQ(formatDuration(60), "1m00s");
  EXPECT_EQ(formatDuration(185), "3m05s");
  EXPECT_EQ(formatDuration(3720), "1h02m");
}

TEST(Progress, LineSaysWhatHowFarAndTimeLeft) {
  // 12 of 76 done in 30 s: 64 left at 2.5 s each.
  EXPECT_EQ(formatProgress("bench", 12, 76, 30, "64K bfloat16 oneshot-push", 100),
            "bench   12/76  15%  64K bfloat16 oneshot-push  about 2m40s left");
  EXPECT_EQ(formatProgress("tune", 0, 10, 0, "allreduce 1K", 100),
            "tune    0/10   0%  allreduce 1K  estimating");
  // Under a second elapsed, the rate is not trusted yet.
  EXPECT_EQ(formatProgress("tune", 1, 10, 0.5, "x", 100), "tune    1/10  10%  x  estimating");
  EXPECT_EQ(formatProgress("doctor", 10, 10, 50, "", 100), "doctor   10/10 100%  done");
  // Fractional units (weighted work) print whole.
  EXPECT_EQ(formatProgress("bench", 2.5, 10, 5, "x", 100), "bench    2/10  25%  x  about 15s left");
}

TEST(Progress, LongDescriptionsGiveWayFirst) {
  const std::string what(200, 'w');
  const std::string line = formatProgress("bench", 5, 10, 10, what, 60);
  EXPECT_EQ(line.size(), 60u) << line;
  EXPECT_NE(line.find("..."), std::string::npos);
  EXPECT_EQ(line.substr(line.size() - 14), "about 10s left") << line;
}

namespace {

struct Fake {
  double now = 100;
  std::string out;
  ProgressLine::Clock clock() {
    return [this] { return now; };
  }
  ProgressLine::Sink sink() {
    return [this](const std::string& t) { out += t; };
  }
};

}  // namespace

TEST(Progress, RedrawsInPlaceAtMostTenTimesASecond) {
  Fake f;
  ProgressLine p("bench", 4, true, f.clock(), f.sink(), 81);
  p.update(0, "1K");
  EXPECT_EQ(f.out, "\rbench    0/4   0%  1K  estimating");
  f.out.clear();
  f.now += 0.05;  // too soon: nothing drawn
  p.update(1, "4K");
  EXPECT_EQ(f.out, "");
  f.now += 1.95;  // 2 s since the start, 1 of 4 done
  p.update(1, "4K");
  EXPECT_EQ(f.out, "\rbench    1/4  25%  4K  about 6s left");
  f.out.clear();
  f.now += 0.01;  // the last unit is always drawn; a shorter line blanks the rest of the old one
  p.update(4, "");
  EXPECT_EQ(f.out, "\rbench    4/4 100%  done" + std::string(13, ' '));
}

TEST(Progress, ClearErasesAndTheNextUpdateRedraws) {
  Fake f;
  {
    ProgressLine p("tune", 10, true, f.clock(), f.sink(), 81);
    p.update(1, "a");
    const size_t shown = std::string("tune    1/10  10%  a  estimating").size();
    f.out.clear();
    p.clear();  // before a row goes to the terminal
    EXPECT_EQ(f.out, "\r" + std::string(shown, ' ') + "\r");
    f.out.clear();
    p.clear();  // nothing shown: nothing written
    EXPECT_EQ(f.out, "");
    p.update(2, "b");  // at once, though within 0.1 s
    EXPECT_EQ(f.out, "\rtune    2/10  20%  b  estimating");
    f.out.clear();
  }
  // The destructor leaves a clean line.
  EXPECT_EQ(f.out,
            "\r" + std::string(std::string("tune    2/10  20%  b  estimating").size(), ' ') + "\r");
}

TEST(Progress, DisabledWritesNothing) {
  Fake f;
  {
    ProgressLine p("bench", 3, false, f.clock(), f.sink(), 81);
    p.update(0, "x");
    p.update(3, "y");
    p.clear();
  }
  EXPECT_EQ(f.out, "");
  // --json silences it whatever stderr is.
  EXPECT_FALSE(progressWanted(true));
}

TEST(Progress, WidthIsTheTerminalsLessOne) {
  Fake f;
  ProgressLine p("bench", 10, true, f.clock(), f.sink(), 40);
  p.update(1, std::string(100, 'w'));
  EXPECT_EQ(f.out.size(), 1u + 39u) << f.out;  // "\r" and 39 characters
}
