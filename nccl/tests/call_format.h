// One NCCL call as text, "ncclAllGather(0x1000, 0x2000, 10, 7, 0x10001, 0x3000)": how the test
// double records a call and how the tests write the call they expect. Pointers (communicators
// and streams included) in hex, enums and integers in decimal, a unique id by its first 8 bytes.
#pragma once

#include <nccl.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <type_traits>

namespace anyrn_test {

template <typename T>
std::string formatArg(const T& v) {
  if constexpr (std::is_null_pointer_v<T>) {
    return "0x0";
  } else if constexpr (std::is_pointer_v<T>) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "0x%llx",
                  static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(v)));
    return buf;
  } else if constexpr (std::is_enum_v<T>) {
    return std::to_string(static_cast<long long>(v));
  } else if constexpr (std::is_integral_v<T>) {
    return std::to_string(v);
  } else if constexpr (std::is_same_v<T, ncclUniqueId>) {
    std::string s = "id:";
    char buf[4];
    for (int i = 0; i < 8; ++i) {
      std::snprintf(buf, sizeof(buf), "%02x", static_cast<unsigned char>(v.internal[i]));
      s += buf;
    }
    return s;
  } else {
    static_assert(std::is_floating_point_v<T>, "an argument type the double cannot record");
    return std::to_string(v);
  }
}

inline std::string formatArgs() { return ""; }

template <typename T, typename... Rest>
std::string formatArgs(const T& first, const Rest&... rest) {
  std::string s = formatArg(first);
  ((s += ", " + formatArg(rest)), ...);
  return s;
}

inline std::string formatCall(const char* name, const std::string& args) {
  return std::string(name) + "(" + args + ")";
}

}  // namespace anyrn_test
