#include "transport/numa_placement.h"

#include <numa.h>
#include <numaif.h>
#include <unistd.h>

#include <cerrno>
#include <climits>

namespace anyr {
namespace {

constexpr size_t kWordBits = sizeof(unsigned long) * CHAR_BIT;

// The kernel takes node masks of at most a page's bits (get_nodes in mm/mempolicy.c).
size_t pageBytes() {
  const long page = sysconf(_SC_PAGESIZE);
  return page > 0 ? static_cast<size_t>(page) : 4096;
}

size_t roundUpTo(size_t v, size_t unit) { return (v + unit - 1) / unit * unit; }

}  // namespace

std::string numaPlacementRefusal() {
  if (numa_available() < 0) {
    return "libnuma reports no NUMA support here (numa_available() < 0), no placement";
  }
  if (numa_num_configured_nodes() <= 1) return "one NUMA node on this host, no placement";
  return "";
}

RegionPlacement placeRegions(void* base, size_t rankBytes, const std::vector<int>& nodes) {
  RegionPlacement out;
  out.placed.assign(nodes.size(), -1);
  out.error.assign(nodes.size(), 0);
  const size_t page = pageBytes();
  char* const start = static_cast<char*>(base);
  for (size_t r = 0; r < nodes.size(); ++r) {
    const int node = nodes[r];
    if (node < 0) continue;
    const size_t begin = roundUpTo(r * rankBytes, page);
    const size_t end = roundUpTo((r + 1) * rankBytes, page);
    if (end <= begin) continue;  // a region smaller than a page has no page of its own
    if (static_cast<size_t>(node) >= page * CHAR_BIT) {
      out.error[r] = EINVAL;  // beyond any node mask the kernel accepts
      continue;
    }
    // A mask wide enough for `node`; maxnode counts one more bit than the mask holds (the
    // kernel reads maxnode - 1 bits, as libnuma passes them).
    std::vector<unsigned long> mask(static_cast<size_t>(node) / kWordBits + 1, 0);
    mask[static_cast<size_t>(node) / kWordBits] = 1ul << (static_cast<size_t>(node) % kWordBits);
    if (mbind(start + begin, end - begin, MPOL_PREFERRED, mask.data(), mask.size() * kWordBits + 1,
              0) != 0) {
      out.error[r] = errno != 0 ? errno : EINVAL;
      continue;
    }
    out.placed[r] = node;
  }
  return out;
}

int nodeOfPage(const void* addr) {
  int node = -1;
  if (get_mempolicy(&node, nullptr, 0, const_cast<void*>(addr), MPOL_F_NODE | MPOL_F_ADDR) != 0) {
    return -1;
  }
  return node;
}

int preferredNodeAt(const void* addr) {
  // A mask of a page's bits: whatever node the policy names fits.
  std::vector<unsigned long> mask(pageBytes() * CHAR_BIT / kWordBits, 0);
  int mode = -1;
  if (get_mempolicy(&mode, mask.data(), mask.size() * kWordBits, const_cast<void*>(addr),
                    MPOL_F_ADDR) != 0 ||
      mode != MPOL_PREFERRED) {
    return -1;
  }
  for (size_t w = 0; w < mask.size(); ++w) {
    for (size_t b = 0; b < kWordBits; ++b) {
      if ((mask[w] >> b) & 1ul) return static_cast<int>(w * kWordBits + b);
    }
  }
  return -1;  // MPOL_PREFERRED with no node: "local" allocation
}

}  // namespace anyr
