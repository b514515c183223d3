// libFuzzer target: the tuning-table loader (files written by `anyreduce tune`, read at init
// through ANYR_TUNING_FILE). Properties checked beyond "no crash, no sanitizer report":
//  - bad input is refused with anyr::Error(anyrInvalidArgument) and a message naming a field,
//    never another exception type (a corrupt, truncated or foreign file must become a warning
//    and the seeded defaults, not an internal error);
//  - an accepted table dumps to JSON that loads back to the same dump.
// Build and run: scripts/fuzz.sh (tests/fuzz/corpus/tuning_json holds the seeds).
#include <cstdint>
#include <string>

#include "fuzz/fuzz_util.h"
#include "select/tuning.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace anyr;
  fuzz::checkJsonLoader(
      "fuzz_tuning_json", std::string(reinterpret_cast<const char*>(data), size),
      [](const std::string& text) { return tuningFromJson(text); },
      [](const TuningTable& t) { return tuningToJson(t); }, [](const TuningTable&) {});
  return 0;
}
