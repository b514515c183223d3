// Command-line flags for communicator config fields (anyrConfig_t) that otherwise only the
// environment sets, checked with the library's own rules (anyrConfigCheckField).
#pragma once

#include <CLI/CLI.hpp>

#include "common/comm_flags.h"

namespace anyr {
namespace tool {

// Adds to `cmd`, into *flags:
//   --max-blocks N          config.maxBlocks (overrides ANYR_MAX_BLOCKS)
//   --fused-cluster 0|1|2|4|8  config.fusedCluster (overrides ANYR_FUSED_CLUSTER)
//   --peer-memory none|auto|cuda-ipc|vmm  config.peerMemory (overrides ANYR_PEER_MEMORY)
// Each is left as it was (-1: the environment decides) unless given. A bad value fails parsing
// with the flag, the field's rule and the value, e.g. "--fused-cluster: must be 0 (automatic),
// 1 (off), 2, 4 or 8 (got '3')".
void addConfigFlags(CLI::App* cmd, CommFlags* flags);

}  // namespace tool
}  // namespace anyr
