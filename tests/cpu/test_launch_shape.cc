// Launch shapes of the peer all-reduce kernels (algo/algo.h, peerLaunchShape): one block per SM
// first, a second block per SM only for messages that give every thread of the wider grid two
// vectors. Every rank computes the same shape from agreed inputs; these are those inputs.
#include <gtest/gtest.h>

#include "algo/algo.h"

namespace anyr {
namespace {

TEST(PeerLaunchShape, SecondBlockPerSmOnlyForLargeMessages) {
  struct Case {
    const char* what;
    uint64_t work, perSm, peer;
    int blocks, threads;
  } cases[] = {
      {"1 KiB bf16, one-shot", 64, 132, 256, 1, 128},
      {"1 MiB bf16, one-shot: as with one block per SM", 65536, 132, 256, 128, 512},
      {"4 MiB bf16, two-shot on 2 ranks: as with one block per SM", 131072, 132, 256, 132, 512},
      {"just under two vectors a thread of 256 blocks", 262143, 132, 256, 132, 512},
      {"8 MiB bf16, two-shot on 2 ranks: 256 blocks", 262144, 132, 256, 256, 512},
      {"256 MiB bf16, two-shot on 2 ranks: 256 blocks", 8388608, 132, 256, 256, 512},
      {"occupancy allows one block per SM", 8388608, 132, 132, 132, 512},
      {"config.maxBlocks 8 caps both", 8388608, 8, 8, 8, 512},
      {"a cap below one per SM (host paths)", 8388608, 132, 66, 66, 512},
  };
  for (const Case& c : cases) {
    const LaunchShape s = peerLaunchShape(c.work, c.perSm, c.peer);
    EXPECT_EQ(s.blocks, c.blocks) << c.what;
    EXPECT_EQ(s.threads, c.threads) << c.what;
    EXPECT_LE(static_cast<uint64_t>(s.blocks), c.peer) << c.what;
  }
}

}  // namespace
}  // namespace anyr
