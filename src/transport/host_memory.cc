#include "transport/host_memory.h"

#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "base/log.h"
#include "bootstrap/bootstrap.h"

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
  std::string init(Bootstrap& bs, size_t bytes) {
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
      } else if (ftruncate(fd_, static_cast<off_t>(bytes)) != 0) {
        st = failStatus(errnoText("ftruncate") + " (" + std::to_string(bytes) + " bytes)");
      } else if (int err = posix_fallocate(fd_, 0, static_cast<off_t>(bytes)); err != 0) {
        // Reserve the pages now: a tmpfs that runs out later would kill the process with
        // SIGBUS on first touch instead of failing here.
        st = failStatus(std::string("posix_fallocate: ") + std::strerror(err) + " (" +
                        std::to_string(bytes) + " bytes; is /dev/shm large enough?)");
      }
    }
    std::string why = agree(bs, st);
    if (!why.empty()) return why;

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

std::unique_ptr<HostMemory> createHostMemory(Bootstrap& bs, size_t bytes, std::string* why) {
  std::unique_ptr<ShmHostMemory> m(new ShmHostMemory());
  std::string err = m->init(bs, bytes);
  if (!err.empty()) {
    if (why != nullptr) *why = err;
    return nullptr;
  }
  return m;
}

}  // namespace anyr
