// Logging: one line per message on stderr, prefixed with "anyreduce" and, where known, the
// rank. The level comes from ANYR_DEBUG (NONE, WARN, INFO, TRACE; default WARN).
#pragma once

#include <sstream>
#include <string>

namespace anyr {

enum class LogLevel { None = 0, Warn = 1, Info = 2, Trace = 3 };

LogLevel logLevel();
void logLine(LogLevel level, int rank, const std::string& msg);

}  // namespace anyr

#define ANYR_LOG(level, rank, expr)                                     \
  do {                                                                  \
    if (::anyr::logLevel() >= ::anyr::LogLevel::level) {                \
      std::ostringstream anyr_os_;                                      \
      anyr_os_ << expr;                                                 \
      ::anyr::logLine(::anyr::LogLevel::level, (rank), anyr_os_.str()); \
    }                                                                   \
  } while (0)
