#include "base/log.h"

#include <unistd.h>

#include <cstdio>
#include <mutex>

#include "base/env.h"

namespace anyr {

LogLevel logLevel() {
  static const LogLevel level = [] {
    std::string v = env::getString("ANYR_DEBUG");
    if (v == "NONE") return LogLevel::None;
    if (v == "INFO") return LogLevel::Info;
    if (v == "TRACE") return LogLevel::Trace;
    return LogLevel::Warn;
  }();
  return level;
}

void logLine(LogLevel level, int rank, const std::string& msg) {
  static std::mutex mu;
  const char* tag = level == LogLevel::Warn ? "WARN" : level == LogLevel::Info ? "INFO" : "TRACE";
  std::lock_guard<std::mutex> lock(mu);
  if (rank >= 0) {
    std::fprintf(stderr, "anyreduce[pid %d rank %d] %s %s\n", static_cast<int>(getpid()), rank, tag,
                 msg.c_str());
  } else {
    std::fprintf(stderr, "anyreduce[pid %d] %s %s\n", static_cast<int>(getpid()), tag, msg.c_str());
  }
}

}  // namespace anyr
