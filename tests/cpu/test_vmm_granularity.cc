// The granularity the ranks' vmm regions are sized with: the least common multiple of every
// rank's, so that GPUs of different models (different recommended granularities) still export
// regions of one size; refused, naming the rank, where there is none up to 1 GiB.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "transport/peer_memory.h"

namespace anyr {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

TEST(VmmGranularity, TheRanksAgreeOnTheLeastCommonMultiple) {
  std::string why = "stale";
  EXPECT_EQ(vmmCommonGranularity({2 * kMiB, 2 * kMiB}, &why), 2 * kMiB);
  EXPECT_EQ(why, "");
  EXPECT_EQ(vmmCommonGranularity({2 * kMiB, 64 * kMiB, 4 * kMiB}, &why), 64 * kMiB);
  EXPECT_EQ(vmmCommonGranularity({2 * kMiB, 3 * kMiB}, &why), 6 * kMiB);
  EXPECT_EQ(vmmCommonGranularity({4096, 2 * kMiB, 65536}, &why), 2 * kMiB);
  EXPECT_EQ(vmmCommonGranularity({kVmmMaxGranularity, kVmmMaxGranularity}, &why),
            kVmmMaxGranularity);
  EXPECT_EQ(vmmCommonGranularity({2 * kMiB}, &why), 2 * kMiB);
}

TEST(VmmGranularity, NoCommonGranularityIsRefusedNamingTheRank) {
  std::string why;
  EXPECT_EQ(vmmCommonGranularity({2 * kMiB, 0}, &why), 0u);
  EXPECT_NE(why.find("rank 1's allocation granularity 0"), std::string::npos) << why;
  // 2^29 and 3 x 2^20: their multiple 3 x 2^29 is above 1 GiB.
  EXPECT_EQ(vmmCommonGranularity({512 * kMiB, 3 * kMiB}, &why), 0u);
  EXPECT_NE(why.find("rank 1's allocation granularity 3145728 leaves no common granularity"),
            std::string::npos)
      << why;
  EXPECT_EQ(vmmCommonGranularity({2 * kMiB, 2 * kVmmMaxGranularity}, &why), 0u);
  EXPECT_NE(why.find("rank 1's"), std::string::npos) << why;
  // A granularity whose product with the running multiple would pass 64 bits is refused too.
  EXPECT_EQ(vmmCommonGranularity({3 * kMiB, ~uint64_t{0}}, &why), 0u);
  EXPECT_NE(why.find("in 1..1073741824 bytes"), std::string::npos) << why;
}

}  // namespace
}  // namespace anyr
