// JSON text for every document the library hands out or saves. Strings in them come from outside
// the library (environment variables, file paths, host and device names) and need not be UTF-8,
// which nlohmann::json's plain dump() refuses with an exception: here such bytes become U+FFFD,
// so a stray byte in a path is not reported as an internal error.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace anyr {

// indent < 0: one line; otherwise that many spaces a level.
inline std::string jsonText(const nlohmann::json& j, int indent = -1) {
  return j.dump(indent < 0 ? -1 : indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace anyr
