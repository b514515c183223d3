#include "transport/host_memory.h"

#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "base/log.h"
#include "bootstrap/bootstrap.h"
#include "transport/numa_placement.h"

namespace anyr {
namespace {

// One rank's outcome of a step; gathered so that every rank sees every failure.
struct Status {
  int32_t ok;
  char why[124];
};
static_assert(sizeof(Status) == 128, "Status layout");

Status okStatus() {
  Status s{};
  s.ok = 1;
  return s;
}
Status failStatus(const std::string& what) {
  Status s{};
  s.ok = 0;
  std::snprintf(s.why, sizeof(s.why), "%s", what.c_str());
  return s;
}

// Gathers every rank's status; "" when all succeeded, else the first failure with its rank.
std::string agree(Bootstrap& bs, const Status& mine) {
  std::vector<Status> all = bs.allGatherValue(mine);
  for (size_t r = 0; r < all.size(); ++r) {
    if (!all[r].ok) {
      return "rank " + std::to_string(r) + ": " +
             std::string(all[r].why, strnlen(all[r].why, sizeof(all[r].why)));
    }
  }
  return "";
}

std::string errnoText(const char* call) { return std::string(call) + ": " + std::strerror(errno); }

// Rank 0, before the pages are reserved: the regions' policies as `p` asks (placeRegions on a
// mapping of its own, dropped after: the policy is the shmem object's, not the mapping's).
void placeSegment(int fd, size_t bytes, HostPlacement* p) {
  const size_t n = p->wanted.size();
  p->placed.assign(n, -1);
  p->error.assign(n, 0);
  if (!p->refusal.empty()) return;  // turned off by the caller
  p->refusal = numaPlacementRefusal();
  if (!p->refusal.empty()) return;
  bool anyKnown = false;
  for (int node : p->wanted) anyKnown = anyKnown || node >= 0;
  if (!anyKnown) {
    p->refusal = "no rank's GPU has a known NUMA node, no placement";
    return;
  }
  if (p->rankBytes == 0 || p->rankBytes * n > bytes) {
    p->refusal = "the rank regions (" + std::to_string(n) + " x " + std::to_string(p->rankBytes) +
                 " bytes) do not fit the segment (" + std::to_string(bytes) +
                 " bytes), no placement";
    ANYR_LOG(Warn, 0, "host segment: " << p->refusal);
    return;
  }
  void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) {
    p->refusal = errnoText("mmap") + " (to place the regions), no placement";
    ANYR_LOG(Warn, 0, "host segment: " << p->refusal << "; the segment works without it");
    return;
  }
  const RegionPlacement r = placeRegions(m, static_cast<size_t>(p->rankBytes), p->wanted);
  munmap(m, bytes);
  p->placed = r.placed;
  p->error = r.error;
  for (size_t i = 0; i < n; ++i) {
    if (r.error[i] == 0) continue;
    ANYR_LOG(Warn, 0,
             "host segment: rank " << i << "'s region could not be placed on NUMA node "
                                   << p->wanted[i] << " (mbind: " << std::strerror(r.error[i])
                                   << "); its pages come from rank 0's own policy, the "
                                      "segment works without it");
  }
}

// Rank 0's placement record, sent to every rank: per rank the wanted node, the placed node and
// the error, then the refusal.
constexpr size_t kRefusalWire = 160;

void shareHostPlacement(Bootstrap& bs, HostPlacement* p) {
  const size_t n = static_cast<size_t>(bs.size());
  std::vector<int32_t> ints(3 * n, -1);
  char refusal[kRefusalWire] = {};
  if (bs.rank() == 0 && p != nullptr) {
    for (size_t i = 0; i < n; ++i) {
      ints[i] = i < p->wanted.size() ? p->wanted[i] : -1;
      ints[n + i] = i < p->placed.size() ? p->placed[i] : -1;
      ints[2 * n + i] = i < p->error.size() ? p->error[i] : 0;
    }
    std::snprintf(refusal, sizeof(refusal), "%s", p->refusal.c_str());
  } else if (bs.rank() == 0) {
    std::snprintf(refusal, sizeof(refusal), "no placement asked");
  }
  std::vector<char> wire(ints.size() * sizeof(int32_t) + sizeof(refusal));
  std::memcpy(wire.data(), ints.data(), ints.size() * sizeof(int32_t));
  std::memcpy(wire.data() + ints.size() * sizeof(int32_t), refusal, sizeof(refusal));
  bs.broadcast(wire.data(), wire.size(), 0);
  if (p == nullptr) return;
  std::memcpy(ints.data(), wire.data(), ints.size() * sizeof(int32_t));
  const char* text = wire.data() + ints.size() * sizeof(int32_t);
  p->wanted.assign(ints.begin(), ints.begin() + static_cast<std::ptrdiff_t>(n));
  p->placed.assign(ints.begin() + static_cast<std::ptrdiff_t>(n),
                   ints.begin() + static_cast<std::ptrdiff_t>(2 * n));
  p->error.assign(ints.begin() + static_cast<std::ptrdiff_t>(2 * n), ints.end());
  p->refusal = std::string(text, strnlen(text, kRefusalWire));
}

class ShmHostMemory final : public HostMemory {
 public:
  ~ShmHostMemory() override {
    if (registered_) (void)cudaHostUnregister(host_);
    (void)cudaGetLastError();
    if (host_ != nullptr) munmap(host_, bytes_);
    if (fd_ >= 0) close(fd_);
    if (!name_.empty() && owner_) shm_unlink(name_.c_str());
  }
  char* host() const override { return static_cast<char*>(host_); }
  char* device() const override { return static_cast<char*>(device_); }
  size_t bytes() const override { return bytes_; }

  // Returns "" or why this rank failed the step it was in. Collective steps are separated by
  // agree(), which every rank reaches whatever happened before.
  std::string init(Bootstrap& bs, size_t bytes, HostPlacement* placement) {
    bytes_ = bytes;
    const int me = bs.rank();
    uint64_t nonce[2] = {0, 0};
    if (me == 0) {
      std::random_device rd;
      nonce[0] = (static_cast<uint64_t>(rd()) << 32) ^ rd();
      nonce[1] = static_cast<uint64_t>(getpid());
    }
    bs.broadcast(nonce, sizeof(nonce), 0);
    char name[64];
    std::snprintf(name, sizeof(name), "/anyreduce-%llu-%016llx",
                  static_cast<unsigned long long>(nonce[1]),
                  static_cast<unsigned long long>(nonce[0]));
    name_ = name;

    // 1. Rank 0 creates and sizes the segment.
    Status st = okStatus();
    if (me == 0) {
      owner_ = true;
      fd_ = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
      if (fd_ < 0) {
        owner_ = false;
        st = failStatus(errnoText("shm_open(create)"));
      } else if (std::string err = reserveSegment(fd_, bytes, placement); !err.empty()) {
        st = failStatus(err);
      }
    }
    std::string why = agree(bs, st);
    if (!why.empty()) return why;
    shareHostPlacement(bs, placement);

    // 2. The others open it. Once every rank holds it open, the name is no longer needed:
    // removed at once, so that a rank killed from here on (no destructor runs) leaves nothing
    // in /dev/shm; the pages live as long as a descriptor or a mapping does.
    st = okStatus();
    if (me != 0) {
      fd_ = shm_open(name, O_RDWR, 0600);
      if (fd_ < 0) st = failStatus(errnoText("shm_open(open)"));
    }
    why = agree(bs, st);
    if (owner_) {
      shm_unlink(name);
      owner_ = false;
    }
    if (!why.empty()) {
      if (fd_ >= 0) {
        close(fd_);
        fd_ = -1;
      }
      return why;
    }
    // 3. Everyone maps and registers it.
    if (st.ok) {
      void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
      if (p == MAP_FAILED) {
        st = failStatus(errnoText("mmap"));
      } else {
        host_ = p;
      }
    }
    if (st.ok) {
      cudaError_t e =
          cudaHostRegister(host_, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
      if (e != cudaSuccess) {
        (void)cudaGetLastError();
        st = failStatus(std::string("cudaHostRegister: ") + cudaGetErrorString(e));
      } else {
        registered_ = true;
        e = cudaHostGetDevicePointer(&device_, host_, 0);
        if (e != cudaSuccess) {
          (void)cudaGetLastError();
          st = failStatus(std::string("cudaHostGetDevicePointer: ") + cudaGetErrorString(e));
        }
      }
    }
    why = agree(bs, st);
    if (fd_ >= 0) {
      close(fd_);
      fd_ = -1;
    }
    return why;
  }

 private:
  size_t bytes_ = 0;
  std::string name_;
  bool owner_ = false;
  int fd_ = -1;
  void* host_ = nullptr;
  void* device_ = nullptr;
  bool registered_ = false;
};

}  // namespace

std::string reserveSegment(int fd, size_t bytes, HostPlacement* placement) {
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    return errnoText("ftruncate") + " (" + std::to_string(bytes) + " bytes)";
  }
  // Placed before any page exists: the pages below are allocated where each region prefers.
  if (placement != nullptr) placeSegment(fd, bytes, placement);
  if (int err = posix_fallocate(fd, 0, static_cast<off_t>(bytes)); err != 0) {
    // Reserve the pages now: a tmpfs that runs out later would kill the process with
    // SIGBUS on first touch instead of failing here.
    return std::string("posix_fallocate: ") + std::strerror(err) + " (" + std::to_string(bytes) +
           " bytes; is /dev/shm large enough?)";
  }
  return "";
}

std::string describeHostPlacement(const HostPlacement& p) {
  if (!p.refusal.empty()) return p.refusal;
  std::string nodes, alone;
  bool anyPlaced = false;
  for (size_t r = 0; r < p.placed.size(); ++r) {
    if (r > 0) nodes += ",";
    if (p.placed[r] >= 0) {
      nodes += std::to_string(p.placed[r]);
      anyPlaced = true;
      continue;
    }
    nodes += "-";
    const int wanted = r < p.wanted.size() ? p.wanted[r] : -1;
    const int err = r < p.error.size() ? p.error[r] : 0;
    alone += alone.empty() ? "" : ", ";
    alone += "rank " + std::to_string(r);
    if (wanted < 0) {
      alone += " (its GPU's node unknown)";
    } else if (err != 0) {
      alone += " (node " + std::to_string(wanted) + ": mbind: " + std::strerror(err) + ")";
    } else {
      alone += " (node " + std::to_string(wanted) + ": its region has no whole page)";
    }
  }
  if (!anyPlaced) return "no rank region placed, each left to rank 0's own policy: " + alone;
  std::string text = "rank regions on NUMA nodes " + nodes + " (each rank's GPU's node";
  if (!alone.empty()) text += "; -: left to rank 0's own policy: " + alone;
  return text + ")";
}

std::unique_ptr<HostMemory> createHostMemory(Bootstrap& bs, size_t bytes, HostPlacement* placement,
                                             std::string* why) {
  std::unique_ptr<ShmHostMemory> m(new ShmHostMemory());
  std::string err = m->init(bs, bytes, placement);
  if (!err.empty()) {
    if (why != nullptr) *why = err;
    return nullptr;
  }
  return m;
}

}  // namespace anyr
