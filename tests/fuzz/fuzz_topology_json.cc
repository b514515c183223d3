// libFuzzer target: the topology JSON loader (probe dumps loaded with ANYR_TOPO_FILE / `anyreduce
// explain --topology`, and the one-GPU descriptions ranks exchange at init). Properties checked
// beyond "no crash, no sanitizer report":
//  - bad input is refused with anyr::Error(anyrInvalidArgument) and a message, never another
//    exception type (a raw nlohmann exception would reach the C boundary as an internal error);
//  - an accepted document has n*n pairs and dumps to JSON that loads back to the same dump.
// Build and run: scripts/fuzz.sh (tests/fuzz/corpus/topology_json holds the fixtures as seeds).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include "core/error.h"
#include "topology/topology.h"

namespace {

void require(bool cond, const char* what, const std::string& detail = "") {
  if (!cond) {
    std::fprintf(stderr, "fuzz_topology_json: property violated: %s %s\n", what, detail.c_str());
    std::abort();  // the fuzzer's way to report a finding (test harness, not the library)
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace anyr;
  const std::string text(reinterpret_cast<const char*>(data), size);
  Topology t;
  try {
    t = topologyFromJson(text);
  } catch (const Error& e) {
    require(e.code() == anyrInvalidArgument, "error code", e.what());
    require(std::strlen(e.what()) > 0, "error text");
    return 0;
  } catch (const std::exception& e) {
    require(false, "non-anyr exception escaped topologyFromJson:", e.what());
  }
  require(t.pairs.size() == t.gpus.size() * t.gpus.size(), "pairs size");
  const std::string dump = topologyToJson(t, -1);
  Topology again;
  try {
    again = topologyFromJson(dump);
  } catch (const std::exception& e) {
    require(false, "a dump of an accepted topology does not load back:", e.what());
  }
  require(topologyToJson(again, -1) == dump, "dump -> load -> dump is not stable");
  return 0;
}
