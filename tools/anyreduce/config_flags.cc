#include "config_flags.h"

#include <string>

#include "base/config.h"

namespace anyr {
namespace tool {

namespace {

// A CLI11 check for an int flag: `valid` and `rule` are the config field's (base/config.h), so
// the flag accepts exactly what the field does. The text is read as CLI11 will store it (into
// an int), so the value checked is the value used.
CLI::Validator configRule(bool (*valid)(int64_t), const char* rule) {
  return CLI::Validator(
      [valid, rule](std::string& text) {
        int v = 0;
        if (CLI::detail::lexical_cast(text, v) && valid(v)) return std::string();
        return std::string(rule) + " (got '" + text + "')";
      },
      "");
}

}  // namespace

void addConfigFlags(CLI::App* cmd, CommFlags* flags) {
  cmd->add_option("--max-blocks", flags->maxBlocks,
                  std::string("Cap on thread blocks per kernel (config.maxBlocks; overrides "
                              "ANYR_MAX_BLOCKS): ") +
                      kMaxBlocksRule)
      ->check(configRule(maxBlocksValid, kMaxBlocksRule));
  cmd->add_option("--fused-cluster", flags->fusedCluster,
                  std::string("Thread-block cluster size of the fused all-reduce + RMSNorm "
                              "kernels (config.fusedCluster; overrides ANYR_FUSED_CLUSTER): ") +
                      kFusedClusterRule)
      ->check(configRule(fusedClusterValid, kFusedClusterRule));
  // The names the library's ANYR_PEER_MEMORY takes (base/config.h), turned into the field's value.
  cmd->add_option("--peer-memory", flags->peerMemory,
                  "How the ranks map each other's workspace (config.peerMemory; overrides "
                  "ANYR_PEER_MEMORY): none, auto, cuda-ipc or vmm")
      ->transform(CLI::Validator(
          [](std::string& text) {
            anyrPeerMemory_t k = anyrPeerMemoryAuto;
            if (text == "0" || text == "1" || !parsePeerMemory(text, &k)) {
              return "must be none, auto, cuda-ipc or vmm (got '" + text + "')";
            }
            text = std::to_string(static_cast<int>(k));
            return std::string();
          },
          ""));
}

}  // namespace tool
}  // namespace anyr
