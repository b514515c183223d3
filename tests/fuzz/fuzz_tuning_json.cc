// libFuzzer target: the tuning-table loader (files written by `anyreduce tune`, read at init
// through ANYR_TUNING_FILE). Properties checked beyond "no crash, no sanitizer report":
//  - bad input is refused with anyr::Error(anyrInvalidArgument) and a message naming a field,
//    never another exception type (a corrupt, truncated or foreign file must become a warning
//    and the seeded defaults, not an internal error);
//  - an accepted table dumps to JSON that loads back to the same dump.
// Build and run: scripts/fuzz.sh (tests/fuzz/corpus/tuning_json holds the seeds).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include "core/error.h"
#include "select/tuning.h"

namespace {

void require(bool cond, const char* what, const std::string& detail = "") {
  if (!cond) {
    std::fprintf(stderr, "fuzz_tuning_json: property violated: %s %s\n", what, detail.c_str());
    std::abort();  // the fuzzer's way to report a finding (test harness, not the library)
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace anyr;
  const std::string text(reinterpret_cast<const char*>(data), size);
  TuningTable t;
  try {
    t = tuningFromJson(text);
  } catch (const Error& e) {
    require(e.code() == anyrInvalidArgument, "error code", e.what());
    require(std::strlen(e.what()) > 0, "error text");
    return 0;
  } catch (const std::exception& e) {
    require(false, "non-anyr exception escaped tuningFromJson:", e.what());
  }
  const std::string dump = tuningToJson(t);
  TuningTable again;
  try {
    again = tuningFromJson(dump);
  } catch (const std::exception& e) {
    require(false, "an accepted table's dump does not load:", e.what());
  }
  require(tuningToJson(again) == dump, "round trip changed the table", dump);
  return 0;
}
