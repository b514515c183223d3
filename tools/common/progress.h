// Progress of long work (bench, tune, doctor) on one line of a terminal: what is being measured,
// how far the work is, and an estimate of the time left. Shown only where a person watches:
// stderr a terminal and no --json (progressWanted); elsewhere the line is never drawn, so logs
// and pipes stay clean. The clock and the output are injectable, so the line's content and its
// pacing are tested without a terminal or real time (the CPU tests).
#pragma once

#include <functional>
#include <string>

namespace anyr {
namespace tool {

// "45s", "3m05s", "1h02m" (whole seconds, rounded up; "0s" for nothing left).
std::string formatDuration(double seconds);

// The line for `task` ("bench"), `done` of `total` units of work, after `elapsedS` seconds,
// measuring `what`, cut to at most `width` characters:
//   "bench  12/76  16%  64K bfloat16 oneshot-push  about 1m05s left"
// The time left is elapsed * (total - done) / done, shown from the first unit done and the
// first second elapsed ("estimating" before).
std::string formatProgress(const std::string& task, double done, double total, double elapsedS,
                           const std::string& what, int width);

// Whether progress is drawn: stderr is a terminal (not "dumb") and the command has no --json.
bool progressWanted(bool jsonGiven);

class ProgressLine {
 public:
  using Clock = std::function<double()>;                 // seconds, monotonic
  using Sink = std::function<void(const std::string&)>;  // writes and flushes

  // Disabled: every call does nothing. Defaults: the steady clock, stderr, the terminal's width
  // (80 when unknown).
  ProgressLine(std::string task, double total, bool enabled, Clock clock = nullptr,
               Sink sink = nullptr, int width = 0);
  ~ProgressLine();  // clears the line
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  // `done` units finished, now measuring `what`. Redraws at most every kMinRedrawS seconds
  // (a change of `what` waits too), except the first call and the last unit (done >= total).
  void update(double done, const std::string& what);
  // Erases the line; the next update draws it again. Call before writing to the terminal.
  void clear();
  void setTotal(double total) { total_ = total; }
  bool enabled() const { return enabled_; }

  static constexpr double kMinRedrawS = 0.1;

 private:
  void draw(const std::string& line);
  std::string task_;
  double total_;
  bool enabled_;
  Clock clock_;
  Sink sink_;
  int width_;
  double start_ = 0;
  double lastDraw_ = -1;
  size_t shown_ = 0;  // characters on the line now
};

}  // namespace tool
}  // namespace anyr
