// The host-memory transport's shared segment, across real processes: every rank sees the same
// outcome and rank 0's NUMA placement of the regions, and the segment's name never outlives the
// setup. On a machine with a GPU the ranks also check that they really share the bytes; without
// one, cudaHostRegister fails and every rank must report that failure (the transport then is
// not admitted, with that reason), and the test is reported skipped, since its main subject,
// the sharing, was not checked.
#include <cuda_runtime_api.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <string>
#include <vector>

#include "algo/algo.h"
#include "base/env.h"
#include "base/error.h"
#include "bootstrap/bootstrap.h"
#include "transport/host_layout.h"
#include "transport/host_memory.h"
#include "transport/numa_placement.h"

namespace anyr {
namespace {

constexpr int kShared = 0;      // segment set up and shared bytes checked
constexpr int kRegFailed = 10;  // set up failed at cudaHostRegister (no GPU here)
constexpr int kOtherFailure = 20;
constexpr int kRegFailedWithGpu = 30;  // registration failed although CUDA sees a GPU
constexpr int kPlacementDiffers = 40;  // the placement record is not rank 0's outcome

// Rank 0's outcome for its request {0, -1, 0}, which every rank on this host can work out: no
// placement, with the host's reason, or rank 0's and rank 2's regions on node 0 (every NUMA
// host has a node 0 with memory, as this test assumes), rank 1's left alone.
bool placementAsExpected(const HostPlacement& p) {
  const std::string refusal = numaPlacementRefusal();
  const bool ok =
      p.wanted == std::vector<int>{0, -1, 0} && p.error == std::vector<int>{0, 0, 0} &&
      p.refusal == refusal &&
      p.placed == (refusal.empty() ? std::vector<int>{0, -1, 0} : std::vector<int>{-1, -1, -1});
  if (!ok) std::fprintf(stderr, "placement: %s\n", describeHostPlacement(p).c_str());
  return ok;
}

int rankMain(const anyrUniqueId& id, int rank, int n) {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess) gpus = 0;
  auto bs = createTcpBootstrap(id, rank, n, 10000);
  std::string why;
  // Rank 0's placement request is the one carried out (rank 1 asks for others), and every
  // rank receives its outcome, whatever happens at registration.
  HostPlacement placement;
  placement.rankBytes = (1 << 20) / 4;
  placement.wanted = rank == 1 ? std::vector<int>{5, 5, 5} : std::vector<int>{0, -1, 0};
  auto mem = createHostMemory(*bs, 1 << 20, &placement, &why);
  if (!placementAsExpected(placement)) return kPlacementDiffers;
  if (!mem) {
    // Every rank names the same failing rank and call. Where CUDA sees a GPU, registration
    // must work: the sharing below is then required, not excused.
    const bool reg = why.find("cudaHostRegister") != std::string::npos ||
                     why.find("cudaHostGetDevicePointer") != std::string::npos;
    if (reg && gpus > 0) return kRegFailedWithGpu;
    return reg ? kRegFailed : kOtherFailure;
  }
  unsigned char* p = reinterpret_cast<unsigned char*>(mem->host());
  // Each rank writes its own quarter; after a barrier, every rank reads every quarter.
  const size_t quarter = mem->bytes() / 4;
  for (size_t i = 0; i < quarter; ++i) {
    p[static_cast<size_t>(rank) * quarter + i] = static_cast<unsigned char>(rank * 37 + i);
  }
  bs->barrier();
  int bad = 0;
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < quarter; ++i) {
      bad += p[static_cast<size_t>(r) * quarter + i] != static_cast<unsigned char>(r * 37 + i);
    }
  }
  bs->barrier();
  return bad == 0 ? kShared : kOtherFailure + 1;
}

std::vector<std::string> leftovers(const std::string& prefix) {
  std::vector<std::string> out;
  DIR* d = opendir("/dev/shm");
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    if (std::string(e->d_name).rfind(prefix, 0) == 0) out.push_back(e->d_name);
  }
  closedir(d);
  return out;
}

// A unique id on the loopback interface, whatever the environment says.
anyrUniqueId loopbackUniqueId() {
  setenv("ANYR_SOCKET_ADDR", "127.0.0.1", 1);
  unsetenv("ANYR_SOCKET_IFNAME");
  unsetenv("ANYR_SOCKET_PORT");
  anyrUniqueId id;
  createUniqueId(&id);
  unsetenv("ANYR_SOCKET_ADDR");
  return id;
}

TEST(HostMemory, SameOutcomeOnEveryRankAndNoNameLeftBehind) {
  const anyrUniqueId id = loopbackUniqueId();
  const int n = 3;
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    std::fflush(nullptr);
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      alarm(60);  // bounded even if something hangs
      int code = kOtherFailure + 2;
      try {
        code = rankMain(id, r, n);
      } catch (...) {
        code = kOtherFailure + 3;
      }
      _exit(code);
    }
    pids.push_back(pid);
  }
  std::vector<int> codes;
  for (pid_t pid : pids) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status));
  }
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(codes[static_cast<size_t>(r)] == kShared ||
                codes[static_cast<size_t>(r)] == kRegFailed)
        << "rank " << r << " exit code " << codes[static_cast<size_t>(r)];
    EXPECT_EQ(codes[static_cast<size_t>(r)], codes[0]) << "ranks disagree on the outcome";
  }
  // The name carries rank 0's pid; it must be gone whatever the outcome.
  const std::string prefix = "anyreduce-" + std::to_string(pids[0]) + "-";
  EXPECT_TRUE(leftovers(prefix).empty()) << "/dev/shm/" << leftovers(prefix)[0];
  // Without a GPU the agreement and the cleanup were checked, the sharing of bytes was not: the
  // test reports a skip (a failure above still fails it), not a pass.
  if (codes[0] == kRegFailed) {
    GTEST_SKIP() << "cudaHostRegister failed on every rank (no GPU visible to CUDA): the same "
                    "outcome on every rank and the cleanup were checked, the sharing of the "
                    "segment's bytes was not";
  }
  std::printf("[ info ] outcome: segment shared by every rank\n");
}

}  // namespace
}  // namespace anyr

namespace anyr {
namespace {

// The segment layout (computeHostLayout, transport/host_layout.cc): every rank computes it from
// agreed values, and kernels address peers' regions with it, so its areas must be page-aligned, in
// order, disjoint, and large enough for what the kernels write there.
TEST(HostLayout, AreasArePageAlignedDisjointAndLargeEnough) {
  const uint64_t page = 4096;
  for (uint64_t chunk :
       {uint64_t{64} << 10, uint64_t{1} << 20, uint64_t{8} << 20, kHostDefaultLaunchBytes}) {
    for (int n : {2, 3, 5, 8}) {
      for (uint64_t ll : {0ull, 16ull << 10, 64ull << 10, 1ull << 20}) {
        const HostLayout l = computeHostLayout(chunk, n, ll, 1u << 20);
        SCOPED_TRACE("chunk " + std::to_string(chunk) + " ranks " + std::to_string(n) + " ll " +
                     std::to_string(ll));
        for (uint64_t off :
             {l.flagsOffset, l.dataOffset, l.resultOffset, l.llOffset, l.copyOffset, l.rankBytes}) {
          EXPECT_EQ(off % page, 0u) << off;
        }
        EXPECT_GE(l.flagsOffset, l.headerOffset + sizeof(WorkspaceHeader));
        EXPECT_GE(l.dataOffset, l.flagsOffset + sizeof(HostFlags));
        EXPECT_GE(l.dataBytes, chunk);    // one launch's contribution per parity
        EXPECT_EQ(l.launchBytes, chunk);  // the agreed ANYR_HOST_LAUNCH_BYTES, as given
        EXPECT_GE(l.resultOffset, l.dataOffset + 2 * l.dataBytes);
        // The two-shot's reduced segment (host_twoshot.cu): a rank's share of one launch's
        // vectors, rounded up to whole block quanta.
        const uint64_t vecs = chunk / 16, q = kHostBlockQuantum;
        const uint64_t segVecs = ((vecs + n - 1) / n + q - 1) / q * q;
        EXPECT_GE(l.resultBytes, segVecs * 16);
        EXPECT_GE(l.llOffset, l.resultOffset + 2 * l.resultBytes);
        // The low-latency protocol carries at most one launch, in lines of twice its bytes.
        EXPECT_EQ(l.llMaxBytes, std::min(ll, chunk));
        EXPECT_GE(l.llBytes, 2 * l.llMaxBytes);
        EXPECT_GE(l.copyOffset, l.llOffset + 2 * l.llBytes);
        EXPECT_GE(l.rankBytes, l.copyOffset + l.copyBytes);
        EXPECT_EQ(l.totalBytes, l.rankBytes * static_cast<uint64_t>(n));
      }
    }
  }
}

// host-copy's chunking (host_handles.h, host_copy.cu): every launch a communicator can make is
// cut into at most kMaxCopyChunks chunks of whole 64 KiB units, which all fit in the copy buffer
// (and so in each staging slot), and a compressed chunk never needs more than its native slot.
TEST(HostLayout, HostCopyChunksFitTheCopyBufferAndTheFlags) {
  const uint64_t unit = 64u << 10;
  for (uint64_t launch : {64ull << 10, 192ull << 10, 320ull << 10, 1ull << 20, 8ull << 20,
                          100ull << 20, 1ull << 30}) {
    for (uint64_t knob : {64ull << 10, 256ull << 10, 1ull << 20, 3ull << 20, 64ull << 20}) {
      const HostLayout l = computeHostLayout(launch, 2, 0, knob);
      SCOPED_TRACE("launch " + std::to_string(launch) + " knob " + std::to_string(knob));
      EXPECT_EQ(l.copyChunkBytes % unit, 0u);
      EXPECT_LE(l.copyChunkBytes,
                std::max(knob, (launch + kMaxCopyChunks - 1) / kMaxCopyChunks + unit));
      EXPECT_GE(l.copyBytes, launch);
      for (uint64_t bytes :
           std::vector<uint64_t>{16, 4096, 65536 + 16, launch / 3 / 16 * 16 + 16, launch}) {
        if (bytes > launch) continue;
        const uint64_t chunk = hostCopyLaunchChunkBytes(bytes, l.copyChunkBytes);
        EXPECT_EQ(chunk % unit, 0u) << bytes;
        EXPECT_LE(chunk, l.copyChunkBytes) << bytes;
        const uint64_t chunks = (bytes + chunk - 1) / chunk;
        EXPECT_GE(chunks, 1u);
        EXPECT_LE(chunks, static_cast<uint64_t>(kMaxCopyChunks)) << bytes;
        EXPECT_LE(chunks, std::max<uint64_t>(4, (launch + l.copyChunkBytes - 1) / l.copyChunkBytes))
            << bytes << ": more chunks than the communicator has events for";
        EXPECT_LE(chunks * chunk, l.copyBytes) << bytes;
        const uint64_t vecs = (bytes + 15) / 16, chunkVecs = chunk / 16;
        const uint64_t lastVecs = hostCopyChunkVecs(chunkVecs, vecs, chunks - 1);
        EXPECT_GE(lastVecs, 1u);
        EXPECT_LE(lastVecs, chunkVecs);
        for (uint64_t e : {4ull, 8ull}) {
          EXPECT_LE(hostCopyWireBytes(chunkVecs, e), chunk);
          EXPECT_LE(hostCopyWireBytes(lastVecs, e), chunk);
        }
      }
    }
  }
  // A launch of less than four configured chunks is cut into about four (at least 256 KiB).
  EXPECT_EQ(hostCopyLaunchChunkBytes(16u << 20, 1u << 20), 1u << 20);
  EXPECT_EQ(hostCopyLaunchChunkBytes(2u << 20, 1u << 20), 512u << 10);
  EXPECT_EQ(hostCopyLaunchChunkBytes(256u << 10, 1u << 20), 256u << 10);
  EXPECT_EQ(hostCopyLaunchChunkBytes(16u << 20, 64u << 10), 64u << 10);
}

// ANYR_HOST_COPY_CHUNK_BYTES: whole 64 KiB units in 64 KiB..64 MiB, anything else named.
TEST(HostLayout, HostCopyChunkValidation) {
  EXPECT_EQ(hostCopyChunkError(64u << 10), "");
  EXPECT_EQ(hostCopyChunkError(1u << 20), "");
  EXPECT_EQ(hostCopyChunkError(64u << 20), "");
  for (uint64_t bad : {0ull, 4096ull, (64ull << 10) + 4096, 128ull << 20}) {
    EXPECT_NE(hostCopyChunkError(bad).find("multiple of 64 KiB"), std::string::npos) << bad;
  }
}

// ANYR_HOST_LAUNCH_BYTES: the host algorithms' own launch size, 16 MiB unless set, whatever
// ANYR_CHUNK_BYTES says; whole pages in 64 KiB..1 GiB, anything else named.
TEST(HostLayout, HostLaunchBytesDefaultAndValidation) {
  unsetenv("ANYR_HOST_LAUNCH_BYTES");
  EXPECT_EQ(kHostDefaultLaunchBytes, 16u << 20);
  EXPECT_EQ(env::getSize("ANYR_HOST_LAUNCH_BYTES"), kHostDefaultLaunchBytes)
      << "base/env.cc's registered default and kHostDefaultLaunchBytes disagree";
  setenv("ANYR_CHUNK_BYTES", "4M", 1);
  EXPECT_EQ(env::getSize("ANYR_HOST_LAUNCH_BYTES"), kHostDefaultLaunchBytes);
  unsetenv("ANYR_CHUNK_BYTES");
  setenv("ANYR_HOST_LAUNCH_BYTES", "4M", 1);
  EXPECT_EQ(env::getSize("ANYR_HOST_LAUNCH_BYTES"), 4u << 20);
  unsetenv("ANYR_HOST_LAUNCH_BYTES");
  for (uint64_t ok : {64ull << 10, (64ull << 10) + 4096, 16ull << 20, 1ull << 30}) {
    EXPECT_EQ(hostLaunchBytesError(ok), "") << ok;
  }
  for (uint64_t bad :
       {0ull, 4096ull, (64ull << 10) - 4096, (1ull << 20) + 16, (1ull << 30) + 4096, 1ull << 32}) {
    EXPECT_EQ(hostLaunchBytesError(bad), "must be a multiple of 4096 between 64 KiB and 1 GiB")
        << bad;
  }
}

// The buffers a 16 MiB launch implies (the figures in host_handles.h's comment on
// kHostDefaultLaunchBytes), with the default copy chunk (2 MiB) and low-latency limit (32 KiB).
TEST(HostLayout, DefaultLaunchSizesEveryBuffer) {
  const uint64_t launch = kHostDefaultLaunchBytes, MiB = 1u << 20, KiB = 1u << 10;
  EXPECT_EQ(kHostCopyDefaultChunkBytes, 2 * MiB);
  for (int n : {2, 8}) {
    SCOPED_TRACE("ranks " + std::to_string(n));
    const HostLayout l = computeHostLayout(launch, n, 32u << 10, kHostCopyDefaultChunkBytes);
    EXPECT_EQ(l.launchBytes, launch);
    EXPECT_EQ(l.dataBytes, launch);
    EXPECT_EQ(l.resultBytes, launch / static_cast<uint64_t>(n) + 64 * KiB);
    EXPECT_EQ(l.copyChunkBytes, 2 * MiB);
    EXPECT_EQ(l.copyBytes, launch + 2 * MiB);  // device staging: n slots of this (initHostCopy)
    EXPECT_EQ(l.dataOffset, 12 * KiB);         // header page + HostFlags
    // rankBytes: 12 KiB + 2 x 16 MiB + 2 x (16 MiB / n + 64 KiB) + 2 x 64 KiB + 18 MiB
    const uint64_t rank = 12 * KiB + 2 * launch +
                          2 * (launch / static_cast<uint64_t>(n) + 64 * KiB) + 2 * 64 * KiB +
                          18 * MiB;
    EXPECT_EQ(l.rankBytes, rank);
    EXPECT_EQ(l.rankBytes, n == 2 ? 66 * MiB + 268 * KiB : 54 * MiB + 268 * KiB);
    EXPECT_EQ(l.totalBytes, rank * static_cast<uint64_t>(n));
    // A launch of the default size is 8 chunks of 2 MiB (the communicator creates
    // max(4, launchBytes / copyChunkBytes) events of each kind).
    EXPECT_EQ(hostCopyLaunchChunkBytes(launch, l.copyChunkBytes), 2 * MiB);
    EXPECT_EQ(launch / l.copyChunkBytes, 8u);
  }
}

// agreeHostSettings across real processes: rank 0's values are every rank's, whatever the
// others set, in one bootstrap exchange; rank 0's bad value fails every rank with an error
// naming the variable, rank 0's value and the rule (never some ranks only: no one is left
// waiting), whether or not ANYR_HOST_MEMORY enables the transport.
constexpr int kAgreeBadValue = 30;

// Counts the bootstrap exchanges (each a round trip through rank 0).
class CountingBootstrap : public Bootstrap {
 public:
  explicit CountingBootstrap(Bootstrap& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  void allGather(const void* in, void* out, size_t bytes) override {
    ++exchanges;
    inner_.allGather(in, out, bytes);
  }
  void barrier() override {
    ++exchanges;
    inner_.barrier();
  }
  int exchanges = 0;

 private:
  Bootstrap& inner_;
};

// One rank's environment: variable -> value (nullptr: unset). Variables not named are unset.
using RankEnv = std::vector<std::pair<const char*, const char*>>;
const char* const kHostVars[] = {"ANYR_HOST_MEMORY",
                                 "ANYR_HOST_ROUND",
                                 "ANYR_HOST_LL_BYTES",
                                 "ANYR_HOST_LL_EAGER_BYTES",
                                 "ANYR_HOST_COPY_CHUNK_BYTES",
                                 "ANYR_HOST_LAUNCH_BYTES",
                                 "ANYR_HOST_NUMA"};

void setRankEnv(const RankEnv& env) {
  for (const char* v : kHostVars) unsetenv(v);
  for (const auto& [name, value] : env) {
    if (value != nullptr) setenv(name, value, 1);
  }
}

// Runs body(settings, exchanges) on each rank (one process each) after agreeHostSettings with
// that rank's environment; its result is the rank's exit code. An error from the agreement is
// kAgreeBadValue when it is anyrInvalidArgument naming `errorVar`, "(rank 0's)" and
// `errorRule`, else kAgreeBadValue + 1 (printed).
template <typename Body>
std::vector<int> runAgreement(const std::vector<RankEnv>& envs, const char* errorVar,
                              const char* errorRule, Body body) {
  const anyrUniqueId id = loopbackUniqueId();
  const int n = static_cast<int>(envs.size());
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    std::fflush(nullptr);
    pid_t pid = fork();
    if (pid < 0) return {};
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      alarm(60);  // bounded even if something hangs
      int code = 100;
      try {
        setRankEnv(envs[static_cast<size_t>(r)]);
        auto tcp = createTcpBootstrap(id, r, n, 10000);
        CountingBootstrap bs(*tcp);
        try {
          const HostSettings agreed = agreeHostSettings(bs, r);
          code = body(agreed, bs.exchanges);
        } catch (const Error& e) {
          const std::string what = e.what();
          const bool named = e.code() == anyrInvalidArgument && errorVar != nullptr &&
                             what.find(errorVar) != std::string::npos &&
                             what.find("(rank 0's)") != std::string::npos &&
                             what.find(errorRule) != std::string::npos && bs.exchanges == 1;
          if (!named) {
            std::fprintf(stderr, "rank %d: unexpected error (after %d exchanges): %s\n", r,
                         bs.exchanges, what.c_str());
          }
          code = named ? kAgreeBadValue : kAgreeBadValue + 1;
        }
      } catch (...) {
        code = 101;
      }
      _exit(code);
    }
    pids.push_back(pid);
  }
  std::vector<int> codes;
  for (pid_t pid : pids) {
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) return {};
    codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 200 + WTERMSIG(status));
  }
  return codes;
}

constexpr const char* kLaunchRule = "multiple of 4096 between 64 KiB and 1 GiB";

// The agreed launch size in MiB (the cases below are whole MiB, < 64), per rank, given each
// rank's ANYR_HOST_LAUNCH_BYTES (nullptr: unset).
std::vector<int> runAgree(const std::vector<const char*>& values) {
  std::vector<RankEnv> envs;
  for (const char* v : values) envs.push_back({{"ANYR_HOST_LAUNCH_BYTES", v}});
  return runAgreement(envs, "ANYR_HOST_LAUNCH_BYTES", kLaunchRule, [](const HostSettings& s, int) {
    return static_cast<int>(s.launchBytes >> 20);
  });
}

TEST(HostLayout, HostLaunchBytesIsRankZeros) {
  EXPECT_EQ(runAgree({nullptr, "4M", "1M"}), (std::vector<int>{16, 16, 16}));
  EXPECT_EQ(runAgree({"4M", "8M", nullptr}), (std::vector<int>{4, 4, 4}));
  EXPECT_EQ(runAgree({"2097152", "2M", "2M"}), (std::vector<int>{2, 2, 2}));
  // Rank 0's bad value fails every rank; another rank's is overruled (rank 0's is used).
  for (const char* bad : {"100000", "32K", "2G"}) {
    EXPECT_EQ(runAgree({bad, "4M", nullptr}),
              (std::vector<int>{kAgreeBadValue, kAgreeBadValue, kAgreeBadValue}))
        << bad;
  }
  EXPECT_EQ(runAgree({"8M", "100000", "32K"}), (std::vector<int>{8, 8, 8}));
}

// Every setting is rank 0's, and all of them cross in one bootstrap exchange (the launch size
// among them: it had a broadcast of its own, one more round trip at every init).
TEST(HostLayout, HostSettingsAreRankZerosInOneExchange) {
  const RankEnv rank0 = {{"ANYR_HOST_ROUND", "4"},
                         {"ANYR_HOST_LL_BYTES", "1024"},
                         {"ANYR_HOST_LL_EAGER_BYTES", "512"},
                         {"ANYR_HOST_COPY_CHUNK_BYTES", "1M"},
                         {"ANYR_HOST_LAUNCH_BYTES", "8M"},
                         {"ANYR_HOST_NUMA", "0"}};
  const RankEnv other = {{"ANYR_HOST_MEMORY", "0"},         {"ANYR_HOST_NUMA", "1"},
                         {"ANYR_HOST_ROUND", "8"},          {"ANYR_HOST_LL_BYTES", "2048"},
                         {"ANYR_HOST_LL_EAGER_BYTES", "0"}, {"ANYR_HOST_COPY_CHUNK_BYTES", "4M"},
                         {"ANYR_HOST_LAUNCH_BYTES", "2M"}};
  auto check = [](const HostSettings& s, int exchanges) {
    const bool ok = s.enabled && !s.numa && s.roundVecs == 4 && s.llBytes == 1024 &&
                    s.llEagerBytes == 512 && s.copyChunkBytes == (1u << 20) &&
                    s.launchBytes == (8u << 20) && exchanges == 1;
    if (!ok) {
      std::fprintf(stderr,
                   "agreed: enabled %d numa %d round %d ll %llu eager %llu chunk %llu launch "
                   "%llu, %d exchanges\n",
                   s.enabled ? 1 : 0, s.numa ? 1 : 0, s.roundVecs,
                   static_cast<unsigned long long>(s.llBytes),
                   static_cast<unsigned long long>(s.llEagerBytes),
                   static_cast<unsigned long long>(s.copyChunkBytes),
                   static_cast<unsigned long long>(s.launchBytes), exchanges);
    }
    return ok ? 0 : 1;
  };
  EXPECT_EQ(runAgreement({rank0, other, {}}, nullptr, "", check), (std::vector<int>{0, 0, 0}));
  // The defaults, with nothing set anywhere: 2, 65536, 65536, 2 MiB, 16 MiB, enabled, NUMA
  // placement on; one exchange.
  EXPECT_EQ(runAgreement({{}, {}}, nullptr, "",
                         [](const HostSettings& s, int exchanges) {
                           return s.enabled && s.numa && s.roundVecs == 2 && s.llBytes == 65536 &&
                                          s.llEagerBytes == 65536 &&
                                          s.copyChunkBytes == kHostCopyDefaultChunkBytes &&
                                          s.launchBytes == kHostDefaultLaunchBytes && exchanges == 1
                                      ? 0
                                      : 1;
                         }),
            (std::vector<int>{0, 0}));
}

// ANYR_HOST_MEMORY=0 (rank 0's) turns the transport off on every rank, and still every setting
// is checked: rank 0's bad launch size fails every rank, as with the transport on.
TEST(HostLayout, HostMemoryOffIsRankZerosAndStillValidates) {
  auto enabled = [](const HostSettings& s, int exchanges) {
    return exchanges == 1 ? (s.enabled ? 1 : 0) : 9;
  };
  EXPECT_EQ(runAgreement({{{"ANYR_HOST_MEMORY", "0"}}, {}, {{"ANYR_HOST_MEMORY", "1"}}}, nullptr,
                         "", enabled),
            (std::vector<int>{0, 0, 0}));
  EXPECT_EQ(runAgreement({{}, {{"ANYR_HOST_MEMORY", "0"}}}, nullptr, "", enabled),
            (std::vector<int>{1, 1}));
  EXPECT_EQ(runAgreement({{{"ANYR_HOST_MEMORY", "0"}, {"ANYR_HOST_LAUNCH_BYTES", "32K"}}, {}},
                         "ANYR_HOST_LAUNCH_BYTES=32768", kLaunchRule, enabled),
            (std::vector<int>{kAgreeBadValue, kAgreeBadValue}));
}

// Rank 0's bad value of each other setting fails every rank, naming it (a peer's is overruled).
TEST(HostLayout, HostSettingsBadValueFailsEveryRank) {
  struct Case {
    const char *var, *value, *named, *rule;
  };
  const Case cases[] = {
      {"ANYR_HOST_ROUND", "65", "ANYR_HOST_ROUND=65", "must be 1..64"},
      {"ANYR_HOST_ROUND", "0", "ANYR_HOST_ROUND=0", "must be 1..64"},
      {"ANYR_HOST_LL_BYTES", "100", "ANYR_HOST_LL_BYTES=100", "multiple of 16 in 0..1048576"},
      {"ANYR_HOST_LL_EAGER_BYTES", "2000000", "ANYR_HOST_LL_EAGER_BYTES=2000000",
       "multiple of 16 in 0..1048576"},
      {"ANYR_HOST_COPY_CHUNK_BYTES", "100K", "ANYR_HOST_COPY_CHUNK_BYTES=102400",
       "multiple of 64 KiB"},
  };
  auto none = [](const HostSettings&, int) { return 0; };
  for (const Case& c : cases) {
    EXPECT_EQ(runAgreement({{{c.var, c.value}}, {}, {}}, c.named, c.rule, none),
              (std::vector<int>{kAgreeBadValue, kAgreeBadValue, kAgreeBadValue}))
        << c.var << "=" << c.value;
    EXPECT_EQ(runAgreement({{}, {{c.var, c.value}}}, nullptr, "", none), (std::vector<int>{0, 0}))
        << "a peer's " << c.var << "=" << c.value << " is overruled";
  }
}
// The host one-shot's low-latency launches: one vector a thread over as many blocks as possible
// (at most 64 and the block cap), 32 threads a block or more, threads growing only past that;
// every shape covers the launch (the kernel's grid-stride loop would cover any rest anyway).
TEST(HostLaunchShape, LowLatencySpreadsOverManySmallBlocks) {
  struct Case {
    uint64_t vecs, cap;
    int blocks, threads;
  } cases[] = {
      {64, 132, 2, 32},        // 1 KiB
      {256, 132, 8, 32},       // 4 KiB
      {1024, 132, 32, 32},     // 16 KiB
      {2048, 132, 64, 32},     // 32 KiB
      {4096, 132, 64, 64},     // 64 KiB
      {4096, 16, 16, 256},     // 64 KiB under ANYR_MAX_BLOCKS-like caps
      {1, 132, 1, 32},         // one vector
      {100000, 132, 64, 512},  // more than one pass (the kernel strides)
      {64, 0, 1, 64},          // a cap of 0 counts as 1 (no division by zero)
  };
  for (const Case& c : cases) {
    const LaunchShape s = hostLowLatencyShape(c.vecs, c.cap);
    EXPECT_EQ(s.blocks, c.blocks) << c.vecs << " vectors, cap " << c.cap;
    EXPECT_EQ(s.threads, c.threads) << c.vecs << " vectors, cap " << c.cap;
    EXPECT_EQ(s.threads % 32, 0);
    EXPECT_TRUE(static_cast<uint64_t>(s.blocks) * s.threads >= c.vecs || s.threads == 512)
        << c.vecs;
  }
  // The general rule keeps its 128-thread floor.
  const LaunchShape g = spreadShape(64, 132);
  EXPECT_EQ(g.threads, 128);
  EXPECT_EQ(g.blocks, 1);
}

}  // namespace
}  // namespace anyr
