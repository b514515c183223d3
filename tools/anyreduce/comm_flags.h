// Communicator config fields (anyrConfig_t) that the command line can set over the environment:
// each -1 means "not given" (the environment, then the library default, decides). The flags
// that fill them are added by addConfigFlags (config_flags.h).
#pragma once

namespace anyr {
namespace tool {

struct CommFlags {
  int maxBlocks = -1;     // config.maxBlocks (--max-blocks); ANYR_MAX_BLOCKS
  int fusedCluster = -1;  // config.fusedCluster (--fused-cluster); ANYR_FUSED_CLUSTER
  int peerMemory = -1;    // config.peerMemory (--peer-memory), anyrPeerMemory_t; ANYR_PEER_MEMORY
};

}  // namespace tool
}  // namespace anyr
