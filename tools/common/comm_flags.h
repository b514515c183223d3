// Communicator config fields (anyrConfig_t) that the command line can set over the environment:
// each -1 means "not given" (the environment, then the library default, decides). The flags
// that fill them are added by addConfigFlags (tools/anyreduce/config_flags.h); openRankComm
// (common/api.h) puts them in a communicator's config. No CUDA header: the doctor's report
// library, which builds without CUDA, includes it.
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
