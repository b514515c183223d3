// Property checks shared by the libFuzzer targets (test harness code: a broken property aborts,
// which is how libFuzzer records a finding).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include "base/error.h"

namespace anyr {
namespace fuzz {

inline void require(const char* target, bool cond, const char* what,
                    const std::string& detail = "") {
  if (!cond) {
    std::fprintf(stderr, "%s: property violated: %s %s\n", target, what, detail.c_str());
    std::abort();
  }
}

// A JSON loader's contract: bad input is refused with anyr::Error(anyrInvalidArgument) and a
// message, never another exception type (a raw parser exception would reach the C boundary as
// an internal error); an accepted document dumps to JSON that loads back to the same dump.
// `accepted` runs further checks on an accepted value. Returns whether `text` was accepted.
template <typename Load, typename Dump, typename Accepted>
bool checkJsonLoader(const char* target, const std::string& text, Load load, Dump dump,
                     Accepted accepted) {
  decltype(load(text)) value;
  try {
    value = load(text);
  } catch (const Error& e) {
    require(target, e.code() == anyrInvalidArgument, "error code", e.what());
    require(target, std::strlen(e.what()) > 0, "error text");
    return false;
  } catch (const std::exception& e) {
    require(target, false, "a non-anyr exception escaped the loader:", e.what());
  }
  accepted(value);
  const std::string first = dump(value);
  decltype(load(text)) again;
  try {
    again = load(first);
  } catch (const std::exception& e) {
    require(target, false, "the dump of an accepted document does not load back:", e.what());
  }
  require(target, dump(again) == first, "dump -> load -> dump is not stable", first);
  return true;
}

}  // namespace fuzz
}  // namespace anyr
