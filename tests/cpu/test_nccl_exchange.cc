// How the bootstrap through an NCCL communicator names the ranks an exchange waited for
// (src/bootstrap/nccl_exchange.h): the headers that arrived, the messages of a timed-out
// exchange, and what a completed exchange refuses. The exchanges themselves run on two GPUs
// (tests/gpu/test_nccl_bootstrap.cc).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "bootstrap/nccl_exchange.h"

namespace anyr {
namespace {

using ncclexchange::Header;

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// The slots of an exchange `seq` of n ranks in which the ranks of `arrived` wrote their header.
std::vector<Header> slots(int n, uint32_t seq, const std::vector<int>& arrived) {
  std::vector<Header> h(static_cast<size_t>(n));  // zeroed: nothing arrived
  for (int r : arrived) {
    h[static_cast<size_t>(r)].magic = ncclexchange::kMagic;
    h[static_cast<size_t>(r)].rank = r;
    h[static_cast<size_t>(r)].seq = seq;
  }
  return h;
}

TEST(NcclExchange, TheRanksWhoseHeaderDidNotArriveAreNamed) {
  EXPECT_EQ(ncclexchange::notArrived(slots(2, 1, {0}), 1), (std::vector<int>{1}));
  EXPECT_EQ(ncclexchange::notArrived(slots(4, 3, {0, 1, 2, 3}), 3), (std::vector<int>{}));
  EXPECT_EQ(ncclexchange::notArrived(slots(8, 5, {0, 5, 6, 7}), 5), (std::vector<int>{1, 2, 3, 4}));
  // A header of an earlier exchange (the slot still holds it) is not this exchange's.
  EXPECT_EQ(ncclexchange::notArrived(slots(2, 4, {0, 1}), 5), (std::vector<int>{0, 1}));
  // Nor is another rank's header in a slot.
  std::vector<Header> h = slots(3, 1, {0, 1, 2});
  h[2].rank = 1;
  EXPECT_EQ(ncclexchange::notArrived(h, 1), (std::vector<int>{2}));
}

TEST(NcclExchange, ATimedOutFirstExchangeNamesTheRankThatDidNotCall) {
  const std::string one = ncclexchange::timeoutMessage(0, 2, 1500, 1, true, true, {1});
  EXPECT_TRUE(contains(one,
                       "anyrCommInitFromNccl: rank 1 did not call anyrCommInitFromNccl "
                       "within 1500 ms"))
      << one;
  EXPECT_TRUE(contains(one, "at rank 0 of 2")) << one;
  const std::string three = ncclexchange::timeoutMessage(5, 8, 1500, 1, true, true, {2, 3, 4});
  EXPECT_TRUE(contains(three,
                       "the contributions of ranks 2, 3 and 4 to the first exchange did "
                       "not arrive at rank 5 of 8 within 1500 ms: at least one of them "
                       "did not call anyrCommInitFromNccl"))
      << three;
}

TEST(NcclExchange, LaterExchangesAndWhatCannotBeKnownAreSaid) {
  const std::string later = ncclexchange::timeoutMessage(1, 2, 800, 7, true, true, {0});
  EXPECT_TRUE(contains(later,
                       "bootstrap through NCCL: rank 0 did not join exchange #7 within "
                       "800 ms"))
      << later;
  const std::string notStarted = ncclexchange::timeoutMessage(0, 4, 800, 1, false, false, {});
  EXPECT_TRUE(contains(notStarted, "the first exchange did not start within 800 ms")) << notStarted;
  EXPECT_TRUE(contains(notStarted, "NCCL does not say which rank")) << notStarted;
  const std::string unread = ncclexchange::timeoutMessage(0, 4, 800, 2, true, false, {});
  EXPECT_TRUE(contains(unread, "NCCL does not say which rank")) << unread;
  const std::string allArrived = ncclexchange::timeoutMessage(0, 4, 800, 2, true, true, {});
  EXPECT_TRUE(contains(allArrived, "although every rank's contribution arrived")) << allArrived;
}

TEST(NcclExchange, ACompletedExchangeRefusesSlotsThatAreNotItsOwn) {
  EXPECT_EQ(ncclexchange::checkHeaders(slots(4, 2, {0, 1, 2, 3}), 2), "");
  std::vector<Header> foreign = slots(4, 2, {0, 1, 2, 3});
  foreign[3] = Header{};
  const std::string m = ncclexchange::checkHeaders(foreign, 2);
  EXPECT_TRUE(contains(m, "the slot of rank 3 holds data that is not anyreduce's")) << m;
  EXPECT_TRUE(contains(m, "another operation on the NCCL communicator paired with the exchange"))
      << m;
  std::vector<Header> late = slots(2, 2, {0, 1});
  late[1].seq = 1;
  EXPECT_TRUE(contains(ncclexchange::checkHeaders(late, 2), "its contribution to exchange #1"));
  std::vector<Header> swapped = slots(2, 2, {0, 1});
  swapped[0].rank = 1;
  EXPECT_TRUE(contains(ncclexchange::checkHeaders(swapped, 2), "rank 1's contribution"));
}

}  // namespace
}  // namespace anyr
