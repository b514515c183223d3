#include "config_flags.h"

#include <string>

#include "common/api.h"

namespace anyr {
namespace tool {

namespace {

// The rule text of an anyrConfig_t field, as the library applies it (anyrConfigCheckField).
std::string fieldRule(const char* field) {
  int valid = 0;
  const char* rule = nullptr;
  check(anyrConfigCheckField(field, 0, &valid, &rule), nullptr, "anyrConfigCheckField");
  return rule;
}

// A CLI11 check for an int flag: the config field's own rule (anyrConfigCheckField), so the
// flag accepts exactly what the field does. The text is read as CLI11 will store it (into an
// int), so the value checked is the value used.
CLI::Validator configRule(const char* field) {
  const std::string rule = fieldRule(field);
  return CLI::Validator(
      [field, rule](std::string& text) {
        int v = 0;
        int valid = 0;
        if (CLI::detail::lexical_cast(text, v) &&
            anyrConfigCheckField(field, v, &valid, nullptr) == anyrSuccess && valid != 0) {
          return std::string();
        }
        return rule + " (got '" + text + "')";
      },
      "");
}

}  // namespace

void addConfigFlags(CLI::App* cmd, CommFlags* flags) {
  cmd->add_option("--max-blocks", flags->maxBlocks,
                  std::string("Cap on thread blocks per kernel (config.maxBlocks; overrides "
                              "ANYR_MAX_BLOCKS): ") +
                      fieldRule("maxBlocks"))
      ->check(configRule("maxBlocks"));
  cmd->add_option("--fused-cluster", flags->fusedCluster,
                  std::string("Thread-block cluster size of the fused all-reduce + RMSNorm "
                              "kernels (config.fusedCluster; overrides ANYR_FUSED_CLUSTER): ") +
                      fieldRule("fusedCluster"))
      ->check(configRule("fusedCluster"));
  // The names the library's ANYR_PEER_MEMORY takes (anyrPeerMemoryName), turned into the
  // field's value.
  cmd->add_option("--peer-memory", flags->peerMemory,
                  "How the ranks map each other's workspace (config.peerMemory; overrides "
                  "ANYR_PEER_MEMORY): none, auto, cuda-ipc or vmm")
      ->type_name("none|auto|cuda-ipc|vmm")  // words, though the field is an int
      ->transform(CLI::Validator(
          [](std::string& text) {
            anyrPeerMemory_t k = anyrPeerMemoryAuto;
            if (!parsePeerMemory(text, &k)) {
              return "must be none, auto, cuda-ipc or vmm (got '" + text + "')";
            }
            text = std::to_string(static_cast<int>(k));
            return std::string();
          },
          ""));
}

}  // namespace tool
}  // namespace anyr
