// libFuzzer target: the topology JSON loader (probe dumps loaded with ANYR_TOPO_FILE / `anyreduce
// explain --topology`, and the one-GPU descriptions ranks exchange at init). Properties checked
// beyond "no crash, no sanitizer report":
//  - bad input is refused with anyr::Error(anyrInvalidArgument) and a message, never another
//    exception type (a raw nlohmann exception would reach the C boundary as an internal error);
//  - an accepted document has n*n pairs and dumps to JSON that loads back to the same dump.
// Build and run: scripts/fuzz.sh (tests/fuzz/corpus/topology_json holds the fixtures as seeds).
#include <cstdint>
#include <string>

#include "fuzz/fuzz_util.h"
#include "topology/topology.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace anyr;
  const char* target = "fuzz_topology_json";
  fuzz::checkJsonLoader(
      target, std::string(reinterpret_cast<const char*>(data), size),
      [](const std::string& text) { return topologyFromJson(text); },
      [](const Topology& t) { return topologyToJson(t, -1); },
      [&](const Topology& t) {
        fuzz::require(target, t.pairs.size() == t.gpus.size() * t.gpus.size(), "pairs size");
      });
  return 0;
}
