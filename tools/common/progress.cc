#include "common/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace anyr {
namespace tool {

std::string formatDuration(double seconds) {
  const long s = seconds > 0 ? static_cast<long>(std::ceil(seconds)) : 0;
  char b[32];
  if (s < 60) {
    std::snprintf(b, sizeof(b), "%lds", s);
  } else if (s < 3600) {
    std::snprintf(b, sizeof(b), "%ldm%02lds", s / 60, s % 60);
  } else {
    std::snprintf(b, sizeof(b), "%ldh%02ldm", s / 3600, (s % 3600) / 60);
  }
  return b;
}

std::string formatProgress(const std::string& task, double done, double total, double elapsedS,
                           const std::string& what, int width) {
  if (total < 1) total = 1;
  if (done < 0) done = 0;
  if (done > total) done = total;
  char count[96];
  std::snprintf(count, sizeof(count), "%s %4.0f/%.0f %3d%%", task.c_str(), std::floor(done), total,
                static_cast<int>(100 * done / total));
  std::string left;
  if (done >= total) {
    left = "done";
  } else if (done > 0 && elapsedS >= 1) {
    left = "about " + formatDuration(elapsedS * (total - done) / done) + " left";
  } else {
    left = "estimating";
  }
  // The description gives way first: the count and the time left always fit in 40 columns.
  const int fixed = static_cast<int>(std::strlen(count) + left.size()) + 4;
  std::string w = what;
  const int room = width - fixed;
  if (room < static_cast<int>(w.size())) {
    w = room > 3 ? w.substr(0, static_cast<size_t>(room - 3)) + "..." : "";
  }
  std::string line = std::string(count) + "  " + w + (w.empty() ? "" : "  ") + left;
  if (width > 0 && static_cast<int>(line.size()) > width) line.resize(static_cast<size_t>(width));
  return line;
}

bool progressWanted(bool jsonGiven) {
  if (jsonGiven || isatty(fileno(stderr)) == 0) return false;
  const char* term = std::getenv("TERM");
  return term == nullptr || std::strcmp(term, "dumb") != 0;
}

namespace {

double steadySeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int terminalWidth() {
  winsize ws{};
  if (ioctl(fileno(stderr), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  return 80;
}

}  // namespace

ProgressLine::ProgressLine(std::string task, double total, bool enabled, Clock clock, Sink sink,
                           int width)
    : task_(std::move(task)), total_(total), enabled_(enabled) {
  if (!enabled_) return;
  clock_ = clock ? std::move(clock) : Clock(steadySeconds);
  sink_ = sink ? std::move(sink) : Sink([](const std::string& text) {
    std::fputs(text.c_str(), stderr);
    std::fflush(stderr);
  });
  // One column short of the terminal: a line as wide as the terminal wraps on some of them,
  // and "\r" then returns to the wrong line.
  width_ = (width > 0 ? width : terminalWidth()) - 1;
  start_ = clock_();
}

ProgressLine::~ProgressLine() { clear(); }

void ProgressLine::update(double done, const std::string& what) {
  if (!enabled_) return;
  const double now = clock_();
  const bool last = done >= total_;
  if (!last && lastDraw_ >= 0 && shown_ > 0 && now - lastDraw_ < kMinRedrawS) return;
  lastDraw_ = now;
  draw(formatProgress(task_, done, total_, now - start_, what, width_));
}

void ProgressLine::clear() {
  if (!enabled_ || shown_ == 0) return;
  sink_("\r" + std::string(shown_, ' ') + "\r");
  shown_ = 0;
}

void ProgressLine::draw(const std::string& line) {
  // Overwrites the previous line in place; blanks what a longer previous line left.
  std::string text = "\r" + line;
  if (line.size() < shown_) text += std::string(shown_ - line.size(), ' ');
  sink_(text);
  shown_ = line.size();
}

}  // namespace tool
}  // namespace anyr
