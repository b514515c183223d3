// Names of small enumerations, as data: a table of {value, name} rows read by nameOf (value ->
// name) and parseName (name -> value), instead of one switch statement per enumeration. Also the
// short names of data types and quantization modes, as explain, the self-test report and the
// call signatures print them (the tools' own --dtype / --quant values).
#pragma once

#include <cstddef>
#include <string>

#include "anyreduce/anyreduce.h"

namespace anyr {

// One row of a name table.
template <typename E>
struct Named {
  E value;
  const char* name;
};

// The name `table` gives `v`; `fallback` when no row lists it (the first row wins on repeats).
template <typename E, std::size_t N>
const char* nameOf(const Named<E> (&table)[N], E v, const char* fallback) {
  for (const Named<E>& row : table) {
    if (row.value == v) return row.name;
  }
  return fallback;
}

// The value whose row in `table` is named exactly `name`; false (and *out untouched) when none.
template <typename E, std::size_t N>
bool parseName(const Named<E> (&table)[N], const std::string& name, E* out) {
  for (const Named<E>& row : table) {
    if (name == row.name) {
      *out = row.value;
      return true;
    }
  }
  return false;
}

// "fp32", "fp16", "bf16"; NULL for another value.
inline const char* dtypeShortName(int t) {
  static constexpr Named<int> kNames[] = {
      {anyrFloat32, "fp32"}, {anyrFloat16, "fp16"}, {anyrBfloat16, "bf16"}};
  return nameOf(kNames, t, nullptr);
}

// "none", "fp8", "nvfp4" (anyrQuantNone, anyrQuantFp8, anyrQuantNvfp4); NULL for another value.
inline const char* quantName(int q) {
  static constexpr Named<int> kNames[] = {
      {anyrQuantNone, "none"}, {anyrQuantFp8, "fp8"}, {anyrQuantNvfp4, "nvfp4"}};
  return nameOf(kNames, q, nullptr);
}

}  // namespace anyr
