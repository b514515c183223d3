// Every environment variable anyreduce reads is declared once, in the table in env.cc, with
// its default and meaning; `anyreduce env` prints that table. Nothing else calls getenv().
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace anyr {
namespace env {

struct Param {
  const char* name;
  const char* defaultValue;  // as text; "" means unset
  const char* meaning;
};

// The registry, in documentation order.
const std::vector<Param>& params();

// Raw value, or the registered default when unset. Throws anyrInternalError for a name that is
// not registered (a bug: every variable must be declared).
std::string getString(const char* name);
bool isSet(const char* name);

// Parsed values. Sizes accept K/M/G suffixes (powers of 1024). A malformed value throws
// anyrInvalidArgument naming the variable and the rule it broke.
int64_t getInt(const char* name);
// getInt of a variable held in 32 bits: a value outside int32_t's range is an error naming it
// (never narrowed into range).
int32_t getInt32(const char* name);
uint64_t getSize(const char* name);

// Shared parser for sizes such as "64K", "1M", "4096" (also used by the command line).
// Returns false when `text` is not a size.
bool parseSize(const std::string& text, uint64_t* out);

}  // namespace env
}  // namespace anyr
