// NUMA placement of the host segment's rank regions (transport/numa_placement.h and rank 0's
// reserveSegment in transport/host_memory.cc), on this machine's own nodes: a region's policy
// prefers the node asked for and its pages land there, also when the pages come later by
// fallocate through no mapping at all (the shmem object's shared policy, as in the segment's
// creation); a node that does not exist is a recorded error, not a failure, and leaves the
// region alone; regions of unknown nodes are left alone. Node 0 is the node asked for: every
// NUMA host has it. Where libnuma reports no NUMA support the tests that need it are skipped.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <numa.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "transport/host_memory.h"
#include "transport/numa_placement.h"

namespace anyr {
namespace {

size_t pageSize() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }

// The /proc/self/numa_maps line of the mapping that starts at `addr` ("" if none).
std::string numaMapsLine(const void* addr) {
  char head[32];
  std::snprintf(head, sizeof(head), "%lx ", reinterpret_cast<unsigned long>(addr));
  std::ifstream in("/proc/self/numa_maps");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(head, 0) == 0) return line;
  }
  return "";
}

// A shared-memory object like the segment (POSIX shared memory, its name removed at once).
int sharedMemoryFd() {
  char name[64];
  std::snprintf(name, sizeof(name), "/anyreduce-numa-test-%d", static_cast<int>(getpid()));
  const int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd >= 0) shm_unlink(name);
  return fd;
}

#define ANYR_NEED_NUMA()                                                                      \
  if (numa_available() < 0) {                                                                 \
    GTEST_SKIP() << "libnuma reports no NUMA support here (numa_available() < 0): placement " \
                    "not checked";                                                            \
  }

TEST(NumaPlacement, RegionsPreferTheirNodeAndTheirPagesLandThere) {
  ANYR_NEED_NUMA();
  const size_t rankBytes = 4 * pageSize();
  char* m = static_cast<char*>(
      mmap(nullptr, 3 * rankBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(m, MAP_FAILED);
  const RegionPlacement r = placeRegions(m, rankBytes, {0, -1, 0});
  EXPECT_EQ(r.placed, (std::vector<int>{0, -1, 0}));
  EXPECT_EQ(r.error, (std::vector<int>{0, 0, 0}));
  // The policy: region 0 and 2 prefer node 0 to their last page; region 1 keeps the default.
  for (size_t off : {size_t{0}, rankBytes - 1, 2 * rankBytes, 3 * rankBytes - 1}) {
    EXPECT_EQ(preferredNodeAt(m + off), 0) << "offset " << off;
  }
  EXPECT_EQ(preferredNodeAt(m + rankBytes), -1);
  EXPECT_EQ(preferredNodeAt(m + 2 * rankBytes - 1), -1);
  // As the kernel shows it: each region its own mapping, "prefer:0" or "default".
  EXPECT_NE(numaMapsLine(m).find(" prefer:0 "), std::string::npos) << numaMapsLine(m);
  EXPECT_NE(numaMapsLine(m + rankBytes).find(" default "), std::string::npos)
      << numaMapsLine(m + rankBytes);
  EXPECT_NE(numaMapsLine(m + 2 * rankBytes).find(" prefer:0 "), std::string::npos)
      << numaMapsLine(m + 2 * rankBytes);
  // Touched, the placed regions' pages are on node 0.
  std::memset(m, 1, 3 * rankBytes);
  for (size_t off = 0; off < 3 * rankBytes; off += pageSize()) {
    if (off / rankBytes == 1) continue;  // wherever this process's own policy puts them
    EXPECT_EQ(nodeOfPage(m + off), 0) << "offset " << off;
  }
  munmap(m, 3 * rankBytes);
}

TEST(NumaPlacement, ANodeThatDoesNotExistIsAnErrorOfItsRegionOnly) {
  ANYR_NEED_NUMA();
  const size_t rankBytes = 2 * pageSize();
  char* m = static_cast<char*>(
      mmap(nullptr, 3 * rankBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(m, MAP_FAILED);
  // One past the highest node the kernel knows; one past any node mask the kernel takes.
  const int missing = numa_max_node() + 1;
  const int huge = static_cast<int>(pageSize() * 8);
  const RegionPlacement r = placeRegions(m, rankBytes, {missing, 0, huge});
  EXPECT_EQ(r.placed, (std::vector<int>{-1, 0, -1}));
  EXPECT_NE(r.error[0], 0);
  EXPECT_EQ(r.error[1], 0);
  EXPECT_EQ(r.error[2], EINVAL);
  EXPECT_EQ(preferredNodeAt(m), -1);
  EXPECT_EQ(preferredNodeAt(m + rankBytes), 0);
  EXPECT_EQ(preferredNodeAt(m + 2 * rankBytes), -1);
  std::memset(m, 1, 3 * rankBytes);  // the memory works whatever failed
  EXPECT_EQ(nodeOfPage(m + rankBytes), 0);
  munmap(m, 3 * rankBytes);
}

// The creation's order: the object sized, a mapping placed and dropped, the pages reserved by
// posix_fallocate (through no mapping), then mapped again as every rank does. The policy is
// the object's: the new mapping shows it, and the reserved pages are on node 0.
TEST(NumaPlacement, TheObjectsPolicyHoldsForPagesReservedAfterTheMappingIsGone) {
  ANYR_NEED_NUMA();
  const size_t rankBytes = 8 * pageSize();
  const size_t bytes = 2 * rankBytes;
  const int fd = sharedMemoryFd();
  ASSERT_GE(fd, 0) << std::strerror(errno);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
  void* first = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_NE(first, MAP_FAILED);
  const RegionPlacement r = placeRegions(first, rankBytes, {-1, 0});
  EXPECT_EQ(r.placed, (std::vector<int>{-1, 0}));
  munmap(first, bytes);
  ASSERT_EQ(posix_fallocate(fd, 0, static_cast<off_t>(bytes)), 0);
  char* m = static_cast<char*>(mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  ASSERT_NE(m, MAP_FAILED);
  EXPECT_EQ(preferredNodeAt(m), -1);
  for (size_t off = rankBytes; off < bytes; off += pageSize()) {
    EXPECT_EQ(preferredNodeAt(m + off), 0) << "offset " << off;
    EXPECT_EQ(nodeOfPage(m + off), 0) << "offset " << off;
  }
  munmap(m, bytes);
  close(fd);
}

// reserveSegment, rank 0's part of the creation, decides as the host allows: on a host of one
// node (or without NUMA support) it places nothing and says why; on a host of several it
// places the known nodes' regions, and the reserved pages follow.
TEST(NumaPlacement, ReserveSegmentPlacesWhereTheHostHasAChoice) {
  const size_t rankBytes = 4 * pageSize();
  const size_t bytes = 3 * rankBytes;
  const int fd = sharedMemoryFd();
  ASSERT_GE(fd, 0) << std::strerror(errno);
  HostPlacement p;
  p.wanted = {0, -1, 0};
  p.rankBytes = rankBytes;
  ASSERT_EQ(reserveSegment(fd, bytes, &p), "");
  const std::string refusal = numaPlacementRefusal();
  EXPECT_EQ(p.refusal, refusal);
  EXPECT_EQ(p.error, (std::vector<int>{0, 0, 0}));
  char* m = static_cast<char*>(mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  ASSERT_NE(m, MAP_FAILED);
  if (refusal.empty()) {
    EXPECT_EQ(p.placed, (std::vector<int>{0, -1, 0}));
    EXPECT_EQ(preferredNodeAt(m), 0);
    EXPECT_EQ(nodeOfPage(m), 0);
    EXPECT_EQ(preferredNodeAt(m + 2 * rankBytes), 0);
  } else {
    EXPECT_EQ(p.placed, (std::vector<int>{-1, -1, -1}));
    if (numa_available() >= 0) {
      EXPECT_EQ(preferredNodeAt(m), -1);
    }
  }
  EXPECT_EQ(describeHostPlacement(p), refusal.empty()
                                          ? "rank regions on NUMA nodes 0,-,0 (each rank's GPU's "
                                            "node; -: left to rank 0's own policy: rank 1 (its "
                                            "GPU's node unknown))"
                                          : refusal);
  munmap(m, bytes);
  close(fd);
  // The refusal was checked above; the placement this test is named for needs a host with a
  // choice of NUMA nodes.
  if (!refusal.empty()) GTEST_SKIP() << refusal << ": reserveSegment's placement not exercised";
}

// Turned off by the caller, or no rank's node known: nothing is placed, the segment is made.
TEST(NumaPlacement, TurnedOffOrNoNodeKnownPlacesNothing) {
  const size_t rankBytes = 4 * pageSize();
  for (const bool off : {true, false}) {
    const int fd = sharedMemoryFd();
    ASSERT_GE(fd, 0) << std::strerror(errno);
    HostPlacement p;
    p.rankBytes = rankBytes;
    p.wanted = off ? std::vector<int>{0, 0} : std::vector<int>{-1, -1};
    if (off) p.refusal = "NUMA placement turned off (ANYR_HOST_NUMA=0)";
    ASSERT_EQ(reserveSegment(fd, 2 * rankBytes, &p), "");
    EXPECT_EQ(p.placed, (std::vector<int>{-1, -1}));
    EXPECT_EQ(p.error, (std::vector<int>{0, 0}));
    const std::string host = numaPlacementRefusal();
    EXPECT_EQ(p.refusal, off             ? "NUMA placement turned off (ANYR_HOST_NUMA=0)"
                         : !host.empty() ? host
                                         : "no rank's GPU has a known NUMA node, no placement");
    char* m =
        static_cast<char*>(mmap(nullptr, 2 * rankBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    ASSERT_NE(m, MAP_FAILED);
    if (numa_available() >= 0) {
      EXPECT_EQ(preferredNodeAt(m), -1);
    }
    munmap(m, 2 * rankBytes);
    close(fd);
  }
}

// The explain line: the nodes, the regions left alone and why, or the refusal as it is.
TEST(NumaPlacement, ExplainLine) {
  HostPlacement p;
  p.wanted = {0, 0, 1, 1};
  p.placed = {0, 0, 1, 1};
  p.error = {0, 0, 0, 0};
  EXPECT_EQ(describeHostPlacement(p),
            "rank regions on NUMA nodes 0,0,1,1 (each rank's GPU's node)");
  p.wanted = {0, -1, 1, 7};
  p.placed = {0, -1, 1, -1};
  p.error = {0, 0, 0, EINVAL};
  EXPECT_EQ(describeHostPlacement(p),
            "rank regions on NUMA nodes 0,-,1,- (each rank's GPU's node; -: left to rank 0's own "
            "policy: rank 1 (its GPU's node unknown), rank 3 (node 7: mbind: " +
                std::string(std::strerror(EINVAL)) + "))");
  p.wanted = {-1, 7};
  p.placed = {-1, -1};
  p.error = {0, EINVAL};
  EXPECT_EQ(describeHostPlacement(p),
            "no rank region placed, each left to rank 0's own policy: rank 0 (its GPU's node "
            "unknown), rank 1 (node 7: mbind: " +
                std::string(std::strerror(EINVAL)) + ")");
  p.refusal = "one NUMA node on this host, no placement";
  EXPECT_EQ(describeHostPlacement(p), "one NUMA node on this host, no placement");
}

}  // namespace
}  // namespace anyr
