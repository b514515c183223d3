// Multi-process GPU tests of anyrAllReduce: every algorithm x dtype x count x in/out of place
// x eager/graph replay x input mode. Inputs are pure functions of (rank, index, seed), so each
// rank computes the exact expected bits on the CPU. Outputs are poisoned before every call;
// inputs must come back untouched; every rank reports a hash of every output and the parent
// checks that all ranks agree bit for bit.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <initializer_list>
#include <iomanip>
#include <map>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "anyreduce/anyreduce.h"
#include "common/data.h"
#include "common/launcher.h"
#include "gpu/gpu_test_util.h"

namespace anyr {
namespace {

anyrComm_t initComm(int rank, int n, const anyrUniqueId& id, int timeoutMs) {
  return initRankComm(rank, n, id, timeoutMs);
}

struct Case {
  anyrAlgo_t algo;
  anyrDataType_t dtype;
  uint64_t count;
  bool inPlace;
  bool graph;
  int mode;
  std::string key() const {
    std::ostringstream os;
    os << anyrAlgoName(algo) << "/" << data::dtypeName(dtype) << "/n=" << count
       << (inPlace ? "/inplace" : "/outofplace") << (graph ? "/graph" : "/eager")
       << (mode == data::kSmallInts ? "/ints" : "/random");
    return os.str();
  }
};

// One rank's sweep. Reports "HASH <key> <replay> <hash>" per checked output and "FAIL ..." per
// problem; returns the number of failures.
const std::vector<anyrAlgo_t> kEveryAlgo = {
    anyrAlgoOneShotPush, anyrAlgoOneShotPull, anyrAlgoTwoShot,     anyrAlgoTwoShotPush,
    anyrAlgoNccl,        anyrAlgoAuto,        anyrAlgoHostOneShot, anyrAlgoHostTwoShot,
    anyrAlgoHostCopy,    anyrAlgoStagedPush,  anyrAlgoStagedPull,  anyrAlgoDoublingPush};

int sweepRank(int rank, int n, const anyrUniqueId& id, const Report& report,
              const std::vector<uint64_t>& counts, bool allDtypes,
              const std::vector<anyrAlgo_t>& algos = kEveryAlgo) {
  anyrComm_t comm = initComm(rank, n, id, 20000);
  cudaStream_t s = nonBlockingStream();
  uint64_t maxCount = 0;
  for (uint64_t c : counts) maxCount = std::max(maxCount, c);
  // +16 bytes so a misaligned (by one element) view of the buffers still fits.
  char* in = deviceAlloc<char>(maxCount * 4 + 64);
  char* out = deviceAlloc<char>(maxCount * 4 + 64);
  std::vector<unsigned char> host(maxCount * 4), hostIn(maxCount * 4);
  int failures = 0;
  uint32_t seed = 1000;
  std::vector<anyrDataType_t> dtypes = {anyrBfloat16};
  if (allDtypes) dtypes = {anyrBfloat16, anyrFloat16, anyrFloat32};
  for (anyrAlgo_t algo : algos) {
    if (!forceOrSkip(comm, algo, report)) continue;
    for (anyrDataType_t dt : dtypes) {
      const size_t es = data::dtypeBytes(dt);
      for (uint64_t count : counts) {
        for (int inPlace = 0; inPlace < 2; ++inPlace) {
          for (int graph = 0; graph < 2; ++graph) {
            for (int mode = 0; mode < 2; ++mode) {
              // NCCL's summation order is its own: exact (small-integer) inputs only.
              if (algo == anyrAlgoNccl && mode == data::kRandom) continue;
              Case c{algo, dt, count, inPlace != 0, graph != 0, mode};
              // Odd element offset for one count, so the unaligned path runs too.
              const size_t shift = (count % 2 == 1) ? es : 0;
              char* src = in + shift;
              char* dst = inPlace ? src : out + shift;
              cudaGraphExec_t exec =
                  graph ? captureAllReduce(src, dst, count, dt, comm, s) : nullptr;
              const int replays = graph ? 3 : 2;
              for (int rep = 0; rep < replays; ++rep) {
                ++seed;
                R_CUDA(data::fillInput(dt, src, count, rank, seed, mode, s));
                if (!inPlace) R_CUDA(cudaMemsetAsync(dst, 0xff, count * es, s));
                allReduceOrReplay(exec, src, dst, count, dt, comm, s);
                R_CUDA(cudaMemcpyAsync(host.data(), dst, count * es, cudaMemcpyDeviceToHost, s));
                R_CUDA(cudaMemcpyAsync(hostIn.data(), src, count * es, cudaMemcpyDeviceToHost, s));
                R_CUDA(cudaStreamSynchronize(s));
                std::vector<unsigned char> want = data::hostExpected(dt, count, n, seed, mode);
                uint64_t wrong = 0, firstWrong = count;
                for (uint64_t i = 0; i < count; ++i) {
                  if (std::memcmp(host.data() + i * es, want.data() + i * es, es) != 0) {
                    if (wrong == 0) firstWrong = i;
                    ++wrong;
                  }
                }
                if (wrong) {
                  ++failures;
                  report("FAIL " + c.key() + " replay " + std::to_string(rep) + ": " +
                         std::to_string(wrong) + " wrong elements, first at " +
                         std::to_string(firstWrong) + "\n");
                }
                if (!inPlace) {
                  // The input must be untouched: regenerate what it was.
                  std::vector<unsigned char> orig(count * es);
                  R_CUDA(data::fillInput(dt, out, count, rank, seed, mode, s));  // scratch copy
                  R_CUDA(cudaMemcpyAsync(orig.data(), out, count * es, cudaMemcpyDeviceToHost, s));
                  R_CUDA(cudaStreamSynchronize(s));
                  if (std::memcmp(orig.data(), hostIn.data(), count * es) != 0) {
                    ++failures;
                    report("FAIL " + c.key() + ": input modified\n");
                  }
                }
                report("HASH " + c.key() + " " + std::to_string(rep) + " " +
                       std::to_string(data::fnv1a(host.data(), count * es)) + "\n");
              }
              if (exec) R_CUDA(cudaGraphExecDestroy(exec));
            }
          }
        }
      }
    }
  }
  return finishRank(comm, s, {in, out}, failures, report);
}

TEST(AllReduceGpu, EveryAlgorithmDtypeCountOneRankPerGpu) {
  REQUIRE_GPU();
  const int n = std::max(2, gpuCount());
  if (gpuCount() < 2) GTEST_SKIP() << "needs 2 GPUs (the shared-GPU test covers 1)";
  const std::vector<uint64_t> counts = {1, 7, 1023, 65536 + 5, (1u << 20) + 3};
  auto results = runRanksWith(n, 600, sweepRank, counts, true, kEveryAlgo);
  expectRanksPassedWithEqualHashes(results, n);
}

TEST(AllReduceGpu, OddWorldSizeSharingGpus) {
  REQUIRE_GPU();
  // 3 ranks on the visible GPUs: contexts time-slice, so this is a correctness run of the
  // protocols at an odd world size, not a speed run.
  const int n = 3;
  const std::vector<uint64_t> counts = {1, 1023, 65536 + 5};
  auto results = runRanksWith(n, 600, sweepRank, counts, false, kEveryAlgo);
  expectRanksPassedWithEqualHashes(results, n);
}

// sweepRank on two ranks with a tests-only variable set (the ranks' processes inherit it):
// `algos`, exact and bit-identical on both ranks. Returns the results, for the caller's subject
// check (SKIP_UNLESS_EVERY_SUBJECT_RAN).
std::vector<launch::RankResult> sweepTwoRanksWith(const char* name, const char* value,
                                                  const std::vector<anyrAlgo_t>& algos) {
  const std::vector<uint64_t> counts = {1, 1023, 65536 + 5};
  setenv(name, value, 1);
  auto results = runRanksWith(2, 600, sweepRank, counts, false, algos);
  unsetenv(name);
  expectRanksPassedWithEqualHashes(results, 2);
  return results;
}

// The push algorithms' launch count wraps (at 3 x 2^30, a multiple of their three buffer
// phases) without a seam: two ranks start 4 launches before it (ANYR_TEST_PUSH_EPOCH, inherited
// by the ranks' processes), and every call across it, of every algorithm, is exact and
// bit-identical. (With a count wrapping at 2^32, two consecutive launches took one phase.)
TEST(AllReduceGpu, PushEpochWrapIsSeamless) {
  REQUIRE_GPU();
  const auto results = sweepTwoRanksWith("ANYR_TEST_PUSH_EPOCH", "3221225468", kEveryAlgo);
  SKIP_UNLESS_EVERY_SUBJECT_RAN(results, {anyrAlgoOneShotPush, anyrAlgoTwoShotPush});
}

// The flag algorithms' flags after a long time unused: the family's epoch starts 2^31 + 5
// launches past the flags the self-test left (ANYR_TEST_SYNC_EPOCH), as if the blocks had sat
// unused that long. Flags carry per-block (host-copy: per-chunk and per-launch) use counts, so
// they still read as not raised until the peers raise them: every call exact and
// bit-identical.
TEST(AllReduceGpu, FlagsLongUnusedAreNotTakenAsRaised) {
  REQUIRE_GPU();
  const std::vector<anyrAlgo_t> subjects = {anyrAlgoOneShotPull, anyrAlgoTwoShot,
                                            anyrAlgoHostTwoShot, anyrAlgoHostCopy,
                                            anyrAlgoStagedPull};
  const auto results = sweepTwoRanksWith("ANYR_TEST_SYNC_EPOCH", "2147483653", subjects);
  SKIP_UNLESS_EVERY_SUBJECT_RAN(results, subjects);
}

// The peer algorithms over the virtual-memory workspace (ANYR_PEER_MEMORY=vmm: cuMemCreate
// allocations whose POSIX file descriptors pass over a Unix-domain socket): every peer
// algorithm exact and bit-identical on both ranks, as over legacy CUDA IPC.
const std::vector<anyrAlgo_t> kPeerAlgos = {
    anyrAlgoOneShotPush, anyrAlgoOneShotPull, anyrAlgoTwoShot,      anyrAlgoTwoShotPush,
    anyrAlgoStagedPush,  anyrAlgoStagedPull,  anyrAlgoDoublingPush, anyrAlgoRingCopy};
TEST(AllReduceGpu, VmmPeerMemoryCarriesEveryPeerAlgorithm) {
  REQUIRE_GPU();
  const auto results = sweepTwoRanksWith("ANYR_PEER_MEMORY", "vmm", kPeerAlgos);
  SKIP_UNLESS_EVERY_SUBJECT_RAN(results, kPeerAlgos);
}

// Where legacy CUDA IPC fails (every cudaIpcOpenMemHandle of rank 1, ANYR_FAULT_INJECT=
// ipc-open:1, as reported between containers without a shared PID namespace), the automatic choice
// maps the workspace with vmm (test_peer_memory.cc checks that explain says so): every peer
// algorithm exact and bit-identical.
TEST(AllReduceGpu, AutoPeerMemoryWhereLegacyIpcFailsCarriesEveryPeerAlgorithm) {
  REQUIRE_GPU();
  const auto results = sweepTwoRanksWith("ANYR_FAULT_INJECT", "ipc-open:1", kPeerAlgos);
  SKIP_UNLESS_EVERY_SUBJECT_RAN(results, kPeerAlgos);
}

// World sizes 4, 5 and 8 (up to the widest this library takes on one host) on the visible GPUs,
// ranks sharing them where there are fewer: every algorithm's protocol at those widths (peer
// lists of 3 to 7, two-shot partitions into 5 and 8 parts, the host transport's slots), exact and
// bit-identical on every rank. On a shared GPU the contexts time-slice: a correctness run only.
TEST(AllReduceGpu, WiderWorldSizesSharingGpus) {
  REQUIRE_GPU();
  const std::vector<uint64_t> counts = {1, 1023, 65536 + 5};
  for (int n : {4, 5, 8}) {
    SCOPED_TRACE("world size " + std::to_string(n));
    auto results = runRanksWith(n, 600, sweepRank, counts, false, kEveryAlgo);
    expectRanksPassedWithEqualHashes(results, n);
  }
}

// The staged schedules (staged-push, staged-pull: in round k rank r talks to rank r + k only;
// doubling-push: one partner a round, relaying what earlier rounds brought) at world sizes 2 to
// 8, the ranks sharing the visible GPUs (on one GPU, all of them): exact
// against the rank-order reference and bit-identical on every rank, outputs poisoned, inputs
// untouched, eager and graph replays, odd counts and an unaligned view, and messages of up to 9
// launches (the push slot and the staging chunk are 64 KiB here: ANYR_ONESHOT_MAX_BYTES,
// ANYR_CHUNK_BYTES), so the phases and flags rotate within a call too. Every dtype at an odd
// and at the widest world size. On a shared GPU the contexts time-slice: correctness only.
void sweepStaged(int from, int to) {
  const std::vector<anyrAlgo_t> staged = {anyrAlgoStagedPush, anyrAlgoStagedPull,
                                          anyrAlgoDoublingPush};
  const std::vector<uint64_t> counts = {1, 7, 1023, 65536 + 5, (1u << 17) + 3};
  setenv("ANYR_ONESHOT_MAX_BYTES", "65536", 1);
  setenv("ANYR_CHUNK_BYTES", "65536", 1);
  std::vector<launch::RankResult> results;
  for (int n = from; n <= to; ++n) {
    SCOPED_TRACE("world size " + std::to_string(n));
    results = runRanksWith(n, 600, sweepRank, counts, n == 3 || n == 8, staged);
    expectRanksPassedWithEqualHashes(results, n);
  }
  unsetenv("ANYR_ONESHOT_MAX_BYTES");
  unsetenv("ANYR_CHUNK_BYTES");
  SKIP_UNLESS_EVERY_SUBJECT_RAN(results, staged);
}

TEST(AllReduceGpu, StagedSchedulesTwoToFourRanksSharingGpus) {
  REQUIRE_GPU();
  sweepStaged(2, 4);
}

TEST(AllReduceGpu, StagedSchedulesFiveToEightRanksSharingGpus) {
  REQUIRE_GPU();
  sweepStaged(5, 8);
}

// Rank 0 reports one "INFO" line per size: the graph-replay time of each of `algos` (the mean
// of 20 replays after 3, every rank replaying), bf16, in place.
int timeRank(int rank, int n, const anyrUniqueId& id, const Report& report,
             const std::vector<anyrAlgo_t>& algos, const std::vector<uint64_t>& sizes) {
  constexpr int kReps = 20;
  anyrComm_t comm = initComm(rank, n, id, 60000);
  cudaStream_t s = nonBlockingStream();
  const uint64_t most = *std::max_element(sizes.begin(), sizes.end());
  char* buf = deviceAlloc<char>(most);
  R_CUDA(cudaMemsetAsync(buf, 0, most, s));
  cudaEvent_t t0, t1;
  R_CUDA(cudaEventCreate(&t0));
  R_CUDA(cudaEventCreate(&t1));
  for (uint64_t bytes : sizes) {
    std::ostringstream line;
    line << "INFO " << n << " ranks, " << bytes << " B, graph replay, us:";
    for (anyrAlgo_t algo : algos) {
      if (!forceOrSkip(comm, algo, report)) continue;
      cudaGraphExec_t exec = captureAllReduce(buf, buf, bytes / 2, anyrBfloat16, comm, s);
      for (int i = 0; i < 3; ++i) R_CUDA(cudaGraphLaunch(exec, s));
      R_CUDA(cudaEventRecord(t0, s));
      for (int i = 0; i < kReps; ++i) R_CUDA(cudaGraphLaunch(exec, s));
      R_CUDA(cudaEventRecord(t1, s));
      R_CUDA(cudaEventSynchronize(t1));
      float ms = 0;
      R_CUDA(cudaEventElapsedTime(&ms, t0, t1));
      line << " " << anyrAlgoName(algo) << " " << std::fixed << std::setprecision(1)
           << 1000.0 * ms / kReps;
      R_CUDA(cudaGraphExecDestroy(exec));
    }
    if (rank == 0) report(line.str() + "\n");
  }
  R_CUDA(cudaEventDestroy(t0));
  R_CUDA(cudaEventDestroy(t1));
  return finishRank(comm, s, {buf}, 0, report);
}

// The staged forms' times beside the all-to-all forms' at 2, 4 and 8 ranks, printed (the
// issue's record of a correctness run; on a shared GPU the contexts time-slice, so these are not
// the fabric's times).
TEST(AllReduceGpu, StagedSchedulesTimedBesideTheAllToAllForms) {
  REQUIRE_GPU();
  const std::vector<anyrAlgo_t> algos = {anyrAlgoOneShotPush, anyrAlgoStagedPush,
                                         anyrAlgoOneShotPull, anyrAlgoStagedPull,
                                         anyrAlgoDoublingPush};
  for (int n : {2, 4, 8}) {
    auto results = runRanksWith(n, 300, timeRank, algos, std::vector<uint64_t>{16384, 262144});
    expectRanksPassed(results);
    printSkipNotes(results);
    for (const auto& r : results) {
      std::istringstream is(r.message);
      for (std::string line; r.rank == 0 && std::getline(is, line);) {
        if (line.rfind("INFO", 0) == 0) std::printf("[ info ] %s\n", line.c_str());
      }
    }
  }
}

// Calls alternating the algorithms of `turns` (call c forces turns[c % 3]), 30 of them over
// `counts` (call c: counts[c % counts.size()]), bf16 random data, out of place into a poisoned
// output or in place, each checked against the rank-order fp32 sum and reported as a hash.
int rotationRankOf(int rank, int n, const anyrUniqueId& id, const Report& report,
                   const anyrAlgo_t (&turns)[3],
                   const std::vector<uint64_t>& counts = {65536 + 5, 1, 40000 + 3, 1023,
                                                          300000 + 1},
                   bool inPlace = false) {
  anyrComm_t comm = initComm(rank, n, id, 20000);
  cudaStream_t s = nonBlockingStream();
  const uint64_t maxCount = *std::max_element(counts.begin(), counts.end());
  char* in = deviceAlloc<char>(maxCount * 2 + 64);
  char* out = inPlace ? in : deviceAlloc<char>(maxCount * 2 + 64);
  std::vector<unsigned char> host(maxCount * 2);
  int failures = 0;
  for (int call = 0; call < 30; ++call) {
    const anyrAlgo_t algo = turns[call % 3];
    const uint64_t count = counts[static_cast<size_t>(call) % counts.size()];
    if (!forceOrSkip(comm, algo, report)) continue;
    const uint32_t seed = 500 + static_cast<uint32_t>(call);
    R_CUDA(data::fillInput(anyrBfloat16, in, count, rank, seed, data::kRandom, s));
    if (!inPlace) R_CUDA(cudaMemsetAsync(out, 0xff, count * 2, s));
    R_ANYR(anyrAllReduce(in, out, count, anyrBfloat16, anyrSum, comm, s), comm);
    R_CUDA(cudaMemcpyAsync(host.data(), out, count * 2, cudaMemcpyDeviceToHost, s));
    R_CUDA(cudaStreamSynchronize(s));
    const std::vector<unsigned char> want =
        data::hostExpected(anyrBfloat16, count, n, seed, data::kRandom);
    if (std::memcmp(host.data(), want.data(), count * 2) != 0) {
      ++failures;
      report("FAIL call " + std::to_string(call) + " (" + anyrAlgoName(algo) + ", " +
             std::to_string(count) + " elements) is not the rank-order sum\n");
    }
    report("HASH rotation " + std::to_string(call) + " " +
           std::to_string(data::fnv1a(host.data(), count * 2)) + "\n");
  }
  if (inPlace) return finishRank(comm, s, {in}, failures, report);
  return finishRank(comm, s, {in, out}, failures, report);
}

// ---- the ring ---------------------------------------------------------------------------------

// The ring (algo/ring.cu) forced at world sizes `sizes` on the visible GPUs, ranks sharing them
// where there are fewer (contexts time-slice on a shared GPU: a correctness run only), through
// sweepRank: in and out of place, eager and graph replays, small integers and random data,
// poisoned outputs, inputs untouched, odd element offsets for odd counts, every rank's bits
// equal and the rank-order fp32 sum's. Counts: one element, a partial vector, one chunk less
// one vector (1023 fp32 vectors), several chunks with a partial last one, and enough chunks for
// every stream (65536 + 5). Every dtype at sizes 2 and 3, bf16 beyond.
void sweepRing(const std::vector<int>& sizes, const std::vector<uint64_t>& counts,
               anyrAlgo_t algo = anyrAlgoRing) {
  for (int n : sizes) {
    SCOPED_TRACE("world size " + std::to_string(n));
    auto results = runRanksWith(n, 600, sweepRank, counts, n <= 3, std::vector<anyrAlgo_t>{algo});
    expectRanksPassedWithEqualHashes(results, n);
    // Not admitted because the startup self-test failed it is a failure, not a skip.
    const std::string notRun = subjectsNotRun(results, {algo});
    EXPECT_EQ(notRun.find("self-test"), std::string::npos) << notRun;
    SKIP_UNLESS_EVERY_SUBJECT_RAN(results, {algo});
  }
}
const std::vector<uint64_t> kRingCounts = {1, 7, 4095, 4096 * 5 + 3, 65536 + 5};

TEST(AllReduceGpu, RingWorldSizes2And3SharingGpus) {
  REQUIRE_GPU();
  sweepRing({2, 3}, kRingCounts);
}
TEST(AllReduceGpu, RingWorldSizes4And5SharingGpus) {
  REQUIRE_GPU();
  sweepRing({4, 5}, kRingCounts);
}
TEST(AllReduceGpu, RingWorldSizes6And7SharingGpus) {
  REQUIRE_GPU();
  sweepRing({6, 7}, kRingCounts);
}
TEST(AllReduceGpu, RingWorldSize8SharingGpus) {
  REQUIRE_GPU();
  sweepRing({8}, kRingCounts);
}

// Messages of several launches: with ANYR_CHUNK_BYTES at its smallest (64 KiB, inherited by the
// ranks' processes), 300001 bf16 elements take 10 launches, each continuing the streams' chunk
// counts where the last left off; at world sizes 2, 3, 5 and 8.
TEST(AllReduceGpu, RingMessagesOfSeveralLaunches) {
  REQUIRE_GPU();
  setenv("ANYR_CHUNK_BYTES", "65536", 1);
  const std::vector<uint64_t> counts = {65536 + 3, 300001};
  for (int n : {2, 3, 5, 8}) {
    SCOPED_TRACE("world size " + std::to_string(n));
    auto results =
        runRanksWith(n, 600, sweepRank, counts, false, std::vector<anyrAlgo_t>{anyrAlgoRing});
    expectRanksPassedWithEqualHashes(results, n);
  }
  unsetenv("ANYR_CHUNK_BYTES");
}

// The ring's chunk counts wrap at 2^32 without a seam: every stream's count and flags start 6
// chunks before it (ANYR_TEST_RING_USE, inherited by the ranks' processes), and every call
// across it is exact and bit-identical.
TEST(AllReduceGpu, RingChunkCountWrapIsSeamless) {
  REQUIRE_GPU();
  const auto results = sweepTwoRanksWith("ANYR_TEST_RING_USE", "4294967290", {anyrAlgoRing});
  SKIP_UNLESS_EVERY_SUBJECT_RAN(results, {anyrAlgoRing});
}

// ---- ring-copy ----------------------------------------------------------------------------------

// ring-copy (algo/ring_copy.cu) forced at world sizes 2..8, ranks sharing the GPU, through
// sweepRing's checks. Counts: one element, a partial vector, one chunk less one element (bf16:
// 262143), three chunks with a partial last one (both pipelines), and eight chunks (four a
// pipeline: each slot filled twice in one launch, and, over the sweep's calls, the first chunks'
// wait for every earlier chunk's pull).
const std::vector<uint64_t> kRingCopyCounts = {1, 7, (1u << 18) - 1, 2 * (1u << 18) + 5,
                                               7 * (1u << 18) + 3};

TEST(AllReduceGpu, RingCopyWorldSizes2And3SharingGpus) {
  REQUIRE_GPU();
  sweepRing({2, 3}, kRingCopyCounts, anyrAlgoRingCopy);
}
TEST(AllReduceGpu, RingCopyWorldSizes4And5SharingGpus) {
  REQUIRE_GPU();
  sweepRing({4, 5}, kRingCopyCounts, anyrAlgoRingCopy);
}
TEST(AllReduceGpu, RingCopyWorldSizes6To8SharingGpus) {
  REQUIRE_GPU();
  sweepRing({6, 7, 8}, {1, 2 * (1u << 18) + 5, 5 * (1u << 18) + 3}, anyrAlgoRingCopy);
}

// The ring and ring-copy share their flags and chunk counts: in-place calls alternating between
// them (rotationRankOf; several launches of the ring, ANYR_CHUNK_BYTES at 64 KiB; ring-copy in
// up to four chunks) stay exact and bit-identical, at world sizes 3 and 4.
TEST(AllReduceGpu, RingAndRingCopyContinueEachOthersCounts) {
  REQUIRE_GPU();
  setenv("ANYR_CHUNK_BYTES", "65536", 1);
  std::vector<launch::RankResult> last;
  for (int n : {3, 4}) {
    SCOPED_TRACE("world size " + std::to_string(n));
    auto results =
        runRanksCatching(n, 600, [](int rank, int nr, const anyrUniqueId& id, const Report& rep) {
          return rotationRankOf(
              rank, nr, id, rep, {anyrAlgoRingCopy, anyrAlgoRing, anyrAlgoRingCopy},
              {3 * (1u << 18) + 1, 300001, 1u << 18, 5, 2 * (1u << 18) + 9}, true);
        });
    expectRanksPassedWithEqualHashes(results, n);
    last = results;
  }
  unsetenv("ANYR_CHUNK_BYTES");
  SKIP_UNLESS_EVERY_SUBJECT_RAN(last, {anyrAlgoRing, anyrAlgoRingCopy});
}

// ring-copy's chunk counts wrap at 2^32 without a seam (ANYR_TEST_RING_USE, as the ring's).
TEST(AllReduceGpu, RingCopyChunkCountWrapIsSeamless) {
  REQUIRE_GPU();
  const auto results = sweepTwoRanksWith("ANYR_TEST_RING_USE", "4294967290", {anyrAlgoRingCopy});
  SKIP_UNLESS_EVERY_SUBJECT_RAN(results, {anyrAlgoRingCopy});
}

// Two ranks with `algo` forced, rank 1 skipping a call of 2^18 bf16 elements: rank 0 gives up
// within the bound and names rank 1 and the ring's wait (missingPeerRank).
void expectRingMissingPeerNamed(anyrAlgo_t algo) {
  auto results =
      runRanksCatching(2, 120, [&](int rank, int n, const anyrUniqueId& id, const Report& report) {
        return missingPeerRank(rank, n, id, report, algo, 1u << 18, anyrAlgoName(algo), "ring",
                               1.5 + 5.0);
      });
  expectRanksExitedZero(results);
  std::printf("[ info ] %s", results[0].message.c_str());
}

// A rank that skips a ring-copy call: rank 0's wait kernels give up after the timeout and name
// rank 1 and the ring's wait; the side streams end and the caller's stream finishes.
TEST(AllReduceGpu, RingCopyMissingPeerGivesTimeoutNamingIt) {
  REQUIRE_GPU();
  expectRingMissingPeerNamed(anyrAlgoRingCopy);
}

// A rank that skips a ring call: rank 0's blocks wait for rank 1's chunks and for slots it frees,
// give up after the timeout and name rank 1 and the ring's wait.
TEST(AllReduceGpu, RingMissingPeerGivesTimeoutNamingIt) {
  REQUIRE_GPU();
  expectRingMissingPeerNamed(anyrAlgoRing);
}

// ---- bad input --------------------------------------------------------------------------------

void expectArgError(anyrResult_t r, anyrComm_t comm, const std::string& arg, const Report& report,
                    int* failures) {
  std::string msg = anyrGetLastError(comm);
  if (r != anyrInvalidArgument || msg.find("'" + arg + "'") == std::string::npos) {
    ++*failures;
    report("FAIL expected anyrInvalidArgument naming '" + arg + "', got " + anyrGetErrorString(r) +
           ": " + msg + "\n");
  }
}

TEST(AllReduceGpu, BadInputGivesClearErrorsAndNoHang) {
  REQUIRE_GPU();
  auto results =
      runRanksCatching(2, 300, [&](int rank, int n, const anyrUniqueId& id, const Report& report) {
        anyrComm_t comm = initComm(rank, n, id, 5000);
        int failures = 0;
        char* buf = deviceAlloc<char>(4096);
        cudaStream_t s;
        R_CUDA(cudaStreamCreate(&s));
        if (anyrAllReduce(buf, buf, 0, anyrBfloat16, anyrSum, comm, s) != anyrSuccess) {
          ++failures;
          report("FAIL count 0 must be a no-op\n");
        }
        // Each bad call is refused with an error naming the argument (arguments are judged
        // first, also once the first refusal has stopped the communicator).
        expectArgError(anyrAllReduce(nullptr, buf, 16, anyrBfloat16, anyrSum, comm, s), comm,
                       "sendbuff", report, &failures);
        expectArgError(anyrAllReduce(buf, nullptr, 16, anyrBfloat16, anyrSum, comm, s), comm,
                       "recvbuff", report, &failures);
        expectArgError(anyrAllReduce(buf + 1, buf + 1, 16, anyrBfloat16, anyrSum, comm, s), comm,
                       "sendbuff", report, &failures);
        expectArgError(anyrAllReduce(buf, buf + 2, 16, anyrFloat32, anyrSum, comm, s), comm,
                       "recvbuff", report, &failures);
        expectArgError(anyrAllReduce(buf, buf + 8, 16, anyrBfloat16, anyrSum, comm, s), comm,
                       "recvbuff", report,
                       &failures);  // partial overlap
        expectArgError(
            anyrAllReduce(buf, buf, 16, static_cast<anyrDataType_t>(9), anyrSum, comm, s), comm,
            "datatype", report, &failures);
        expectArgError(
            anyrAllReduce(buf, buf, 16, anyrBfloat16, static_cast<anyrRedOp_t>(3), comm, s), comm,
            "op", report, &failures);
        std::vector<char> hostBuf(4096);
        expectArgError(anyrAllReduce(hostBuf.data(), buf, 16, anyrBfloat16, anyrSum, comm, s), comm,
                       "sendbuff", report, &failures);
        int ngpus = 0;
        R_CUDA(cudaGetDeviceCount(&ngpus));
        if (ngpus > 1) {
          int me = 0;
          R_CUDA(cudaGetDevice(&me));
          int other = (me + 1) % ngpus;
          char* far = nullptr;
          cudaStream_t farStream;
          R_CUDA(cudaSetDevice(other));
          R_CUDA(cudaMalloc(&far, 4096));
          R_CUDA(cudaStreamCreate(&farStream));
          R_CUDA(cudaSetDevice(me));
          expectArgError(anyrAllReduce(far, buf, 16, anyrBfloat16, anyrSum, comm, s), comm,
                         "sendbuff", report, &failures);
          expectArgError(anyrAllReduce(buf, buf, 16, anyrBfloat16, anyrSum, comm, farStream), comm,
                         "stream", report, &failures);
          R_CUDA(cudaFree(far));
          R_CUDA(cudaStreamDestroy(farStream));
        }
        if (anyrCommSetAlgorithm(comm, static_cast<anyrAlgo_t>(42)) != anyrInvalidArgument) {
          ++failures;
          report("FAIL anyrCommSetAlgorithm(42) accepted\n");
        }
        // A refused call may have been made by the peers, so the first refusal stopped the
        // communicator on every rank: a good call is refused too, naming the refusal, and no
        // call can pair with a peer's pending one.
        R_CUDA(data::fillInput(anyrBfloat16, buf, 1000, rank, 7, data::kSmallInts, s));
        const anyrResult_t good = anyrAllReduce(buf, buf, 1000, anyrBfloat16, anyrSum, comm, s);
        const std::string goodMsg = anyrGetLastError(comm);
        if (good != anyrInvalidUsage ||
            goodMsg.find("communicator has failed") == std::string::npos ||
            goodMsg.find("rank " + std::to_string(rank) + " refused its call #2") ==
                std::string::npos) {
          ++failures;
          report(std::string("FAIL a call after the refusals: ") + anyrGetErrorString(good) + ": " +
                 goodMsg + "\n");
        }
        return releaseRank(comm, nullptr, {buf}, failures);
      });
  expectRanksExitedZero(results);
}

TEST(AllReduceGpu, InitRejectsBadRanksAndSizes) {
  REQUIRE_GPU();
  // No processes needed: argument checks happen before any rendezvous.
  auto results =
      runRanksCatching(1, 60, [&](int, int, const anyrUniqueId& id, const Report& report) {
        anyrComm_t comm = nullptr;
        int failures = 0;
        if (anyrCommInitRank(&comm, 0, id, 0) != anyrInvalidArgument ||
            std::string(anyrGetLastError(nullptr)).find("'nranks'") == std::string::npos) {
          ++failures;
          report(std::string("FAIL nranks 0: ") + anyrGetLastError(nullptr) + "\n");
        }
        if (anyrCommInitRank(&comm, 2, id, 2) != anyrInvalidArgument ||
            std::string(anyrGetLastError(nullptr)).find("'rank'") == std::string::npos) {
          ++failures;
          report(std::string("FAIL rank 2 of 2: ") + anyrGetLastError(nullptr) + "\n");
        }
        anyrUniqueId garbage;
        std::memset(&garbage, 0x5a, sizeof(garbage));
        if (anyrCommInitRank(&comm, 2, garbage, 1) != anyrInvalidArgument) {
          ++failures;
          report(std::string("FAIL garbage unique id: ") + anyrGetLastError(nullptr) + "\n");
        }
        return failures ? 4 : 0;
      });
  expectRanksExitedZero(results);
}

// ---- bounded waits ----------------------------------------------------------------------------

TEST(AllReduceGpu, MissingPeerGivesTimeoutNamingIt) {
  REQUIRE_GPU();
  // Rank 1 skips the second call. Rank 0's kernel must give up after the timeout, and the
  // next call and the async-error query must name rank 1.
  auto results =
      runRanksCatching(2, 120, [&](int rank, int n, const anyrUniqueId& id, const Report& report) {
        return missingPeerRank(
            rank, n, id, report, anyrAlgoOneShotPush, 4096, "one-shot push", "", 1.5 + 5.0,
            [&](anyrComm_t comm, char* buf, cudaStream_t s) {
              anyrResult_t next = anyrAllReduce(buf, buf, 4096, anyrBfloat16, anyrSum, comm, s);
              if (next != anyrTimeout ||
                  std::string(anyrGetLastError(comm)).find("rank 1") == std::string::npos) {
                report(std::string("FAIL next call: ") + anyrGetErrorString(next) + ": " +
                       anyrGetLastError(comm) + "\n");
                return 1;
              }
              return 0;
            });
      });
  expectRanksExitedZero(results);
  std::printf("[ info ] %s", results[0].message.c_str());
}

TEST(AllReduceGpu, AbortFromAnotherThreadReleasesTheKernel) {
  REQUIRE_GPU();
  // A long timeout: only the abort can end the wait.
  auto results =
      runRanksCatching(2, 120, [&](int rank, int n, const anyrUniqueId& id, const Report& report) {
        return peerFaultRank(rank, n, id, 60000, anyrAlgoTwoShot, 0, 1500,
                             [&](anyrComm_t comm, char* buf, cudaStream_t s) {
                               return abortAWaitingAllReduce(comm, buf, s, report);
                             });
      });
  expectRanksExitedZero(results);
}

TEST(AllReduceGpu, ChoiceAndExplain) {
  REQUIRE_GPU();
  if (gpuCount() < 2) GTEST_SKIP() << "needs 2 GPUs";
  auto results =
      runRanksCatching(2, 120, [&](int rank, int n, const anyrUniqueId& id, const Report& report) {
        anyrComm_t comm = initComm(rank, n, id, 10000);
        int failures = 0;
        failures +=
            expectChoice(comm, 512, "1 KiB", {anyrAlgoOneShotPush, anyrAlgoOneShotPull}, report);
        // 256 MiB: NCCL, or the two-shot push where the fabric measured at init (applied on GPUs
        // of their own) puts its all-to-all near NCCL's ring (on 2 x H200 the two-shot push
        // ran at 1.03x NCCL's speed there: docs/DESIGN.md, "Co-residency").
        failures +=
            expectChoice(comm, 128u << 20, "256 MiB", {anyrAlgoNccl, anyrAlgoTwoShotPush}, report);
        const std::string text = explainText(comm);
        for (const char* must : {"\"admission\"", "oneshot-push", "\"topology\"", "peerWriteOk"}) {
          if (text.find(must) == std::string::npos) {
            ++failures;
            report(std::string("FAIL explain lacks ") + must + "\n");
          }
        }
        if (rank == 0) report("EXPLAIN " + text.substr(0, 400) + "\n");
        return releaseRank(comm, nullptr, {}, failures);
      });
  expectRanksExitedZero(results);
}

// Grid caps (explain's "blocks"): the fused and host kernels one block per SM of the smaller
// GPU; the peer all-reduce kernels as many per SM as their occupancy allows, 1 or 2 (their
// launch bounds promise 2 on any GPU with 64 K registers and 1024 threads an SM), within 256;
// the fused two-shot's dense form 1 or 2 per SM likewise; config.maxBlocks caps them all.
// Each peer algorithm is exact on a message that takes the widest grid (with the cap: the
// capped one).
TEST(AllReduceGpu, GridCapsFollowOccupancyAndConfig) {
  REQUIRE_GPU();
  for (int cap : {0, 8}) {
    auto results = runRanksCatching(
        2, 120, [&](int rank, int n, const anyrUniqueId& id, const Report& report) {
          int failures = 0;
          const std::string tag = "maxBlocks " + std::to_string(cap) + ": ";
          auto expectEq = [&](const std::string& what, long got, long want) {
            if (got != want) {
              ++failures;
              report("FAIL " + tag + what + " " + std::to_string(got) + ", expected " +
                     std::to_string(want) + "\n");
            }
          };
          anyrComm_t comm =
              initRankComm(rank, n, id, 10000, [&](anyrConfig_t& c) { c.maxBlocks = cap; });
          const nlohmann::json j = explainJson(comm);
          long sm = 1 << 30;
          for (const auto& g : j.at("topology").at("gpus")) {
            sm = std::min(sm, g.at("smCount").get<long>());
          }
          const nlohmann::json& b = j.at("blocks");
          const long perSm = b.at("peerPerSm").get<long>();
          if (perSm < 1 || perSm > 2) {
            ++failures;
            report("FAIL " + tag + "peerPerSm " + std::to_string(perSm) + " outside 1..2\n");
          }
          const long fused = std::min(sm, 256L), peer = std::min(sm * perSm, 256L);
          expectEq("fusedAndHost", b.at("fusedAndHost").get<long>(),
                   cap > 0 ? std::min<long>(fused, cap) : fused);
          expectEq("peer", b.at("peer").get<long>(), cap > 0 ? std::min<long>(peer, cap) : peer);
          // The fused two-shot's dense form: one block per SM (not admitted) or two, within 256.
          const long dense = b.at("fusedTwoShotDense").get<long>();
          if (cap > 0) {
            expectEq("fusedTwoShotDense", dense, std::min<long>(fused, cap));
          } else if (dense != fused && dense != std::min(2 * sm, 256L)) {
            ++failures;
            report("FAIL " + tag + "fusedTwoShotDense " + std::to_string(dense) + ", expected " +
                   std::to_string(fused) + " or " + std::to_string(std::min(2 * sm, 256L)) + "\n");
          }
          // The fused cluster forms at two blocks per SM: within two per SM and 256, not above
          // a cap of one per SM or less, nor where the two ranks share a GPU; per kernel
          // variant the largest block that fits two per SM, a multiple of 32 in 0..512.
          expectEq("fusedClusterPairs", b.at("fusedClusterPairs").get<long>(),
                   cap > 0 || std::min(2 * sm, 256L) <= fused || gpuCount() < 2
                       ? 0
                       : std::min(2 * sm, 256L));
          int variants = 0;
          for (const auto& [form, byType] : b.at("fusedClusterPairThreads").items()) {
            for (const auto& [type, byQuant] : byType.items()) {
              for (const auto& [quant, t] : byQuant.items()) {
                ++variants;
                const long threads = t.get<long>();
                if (threads < 0 || threads > 512 || threads % 32 != 0) {
                  ++failures;
                  report("FAIL " + tag + "fusedClusterPairThreads " + form + " " + type + " " +
                         quant + ": " + std::to_string(threads) + "\n");
                }
              }
            }
          }
          expectEq("fusedClusterPairThreads variants", variants, 12);
          if (rank == 0) std::printf("[ info ] %s%s\n", tag.c_str(), b.dump().c_str());
          // A message large enough for the widest grid (every thread two vectors or more),
          // exact on every peer algorithm.
          const uint64_t count = (5u << 20) + 3;
          void *in = nullptr, *out = nullptr;
          unsigned long long* dWrong = nullptr;
          cudaStream_t s;
          R_CUDA(cudaStreamCreate(&s));
          R_CUDA(cudaMalloc(&in, count * 2));
          R_CUDA(cudaMalloc(&out, count * 2));
          R_CUDA(cudaMalloc(&dWrong, sizeof(*dWrong)));
          R_CUDA(data::fillInput(anyrBfloat16, in, count, rank, 77, data::kSmallInts, s));
          for (anyrAlgo_t a :
               {anyrAlgoOneShotPush, anyrAlgoOneShotPull, anyrAlgoTwoShot, anyrAlgoTwoShotPush}) {
            const anyrResult_t set = anyrCommSetAlgorithm(comm, a);
            if (set == anyrUnsupported) {  // not admitted on this machine (its reason is shown)
              if (rank == 0) {
                report(std::string("SKIP ") + anyrAlgoName(a) + ": " + anyrGetLastError(comm) +
                       "\n");
              }
              continue;
            }
            R_ANYR(set, comm);
            R_CUDA(cudaMemsetAsync(out, 0xff, count * 2, s));
            R_ANYR(anyrAllReduce(in, out, count, anyrBfloat16, anyrSum, comm, s), comm);
            unsigned long long wrong = 0;
            R_CUDA(data::mismatchesNow(anyrBfloat16, out, count, n, 77, data::kSmallInts, dWrong, s,
                                       &wrong));
            expectEq(std::string(anyrAlgoName(a)) + " mismatches", static_cast<long>(wrong), 0);
          }
          return finishRank(comm, s, {in, out, dWrong}, failures, report);
        });
    expectRanksPassed(results);
    printSkipNotes(results);
  }
}

// ---- islands: the two-level all-reduce ------------------------------------------------------

// Sets environment variables for the ranks a test forks (they inherit them), and unsets them
// when it ends.
struct RankEnv {
  std::vector<std::string> names;
  RankEnv(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const auto& [name, value] : vars) {
      if (value == nullptr) continue;
      setenv(name, value, 1);
      names.emplace_back(name);
    }
  }
  ~RankEnv() {
    for (const std::string& n : names) unsetenv(n.c_str());
  }
};

// sweepRank of "islands" alone on n ranks with ANYR_ISLANDS = layout (and ANYR_CHUNK_BYTES =
// chunk where not null: 64K cuts 65536 + 5 elements into several launches, the 4 + 4 layout's in
// launches of 32 KB, the 3 + 3 + 2 layout's of 16,320 bytes): exact on every rank, bit-identical
// across them, and run (a forced layout admits it where the ranks share one GPU).
void sweepIslands(int n, const char* layout, const char* chunk, bool allDtypes) {
  SCOPED_TRACE(std::to_string(n) + " ranks, ANYR_ISLANDS=" + layout +
               (chunk ? std::string(", ANYR_CHUNK_BYTES=") + chunk : std::string()));
  const std::vector<uint64_t> counts = {1, 7, 1023, 65536 + 5};
  const RankEnv env({{"ANYR_ISLANDS", layout}, {"ANYR_CHUNK_BYTES", chunk}});
  auto results =
      runRanksWith(n, 600, sweepRank, counts, allDtypes, std::vector<anyrAlgo_t>{anyrAlgoIslands});
  expectRanksPassedWithEqualHashes(results, n);
  EXPECT_EQ(subjectsNotRun(results, {anyrAlgoIslands}), "");
}

// Islands of one rank (the exchange alone), uneven islands (2 + 1), two of two in rank order and
// interleaved; every dtype on three layouts; one layout at the default launch size too.
TEST(AllReduceGpu, IslandsForcedLayoutsOfTwoToFourRanksSharingGpus) {
  REQUIRE_GPU();
  sweepIslands(2, "0,1", "64K", true);
  sweepIslands(3, "0-1,2", "64K", true);
  sweepIslands(4, "0-1,2-3", nullptr, true);
  sweepIslands(4, "0-1,2-3", "64K", false);
  sweepIslands(4, "0+2,1+3", "64K", false);
}

// 3 + 2 (six slices: the island of two owns three), two islands of three, three of two.
TEST(AllReduceGpu, IslandsForcedLayoutsOfFiveAndSixRanksSharingGpus) {
  REQUIRE_GPU();
  sweepIslands(5, "0-2,3-4", "64K", false);
  sweepIslands(6, "0-2,3-5", "64K", false);
  sweepIslands(6, "0-1,2-3,4-5", "64K", false);
}

// 4 + 3 (twelve slices), 4 + 4 (the socket and switch layout), 3 + 3 + 2 (six slices, the
// island of two owning three).
TEST(AllReduceGpu, IslandsForcedLayoutsOfSevenAndEightRanksSharingGpus) {
  REQUIRE_GPU();
  sweepIslands(7, "0-3,4-6", "64K", false);
  sweepIslands(8, "0-3,4-7", "64K", false);
  sweepIslands(8, "0-2,3-5,6-7", "64K", false);
}

// The doubling push's partner orders that islands give a power-of-two world
// (algo/doubling_schedule.h): the crossing bit first (0-3 | 4-7: rank ^ 4, ^ 1, ^ 2), two crossing
// bits first (four islands of two: ^ 2, ^ 4, ^ 1), and at four ranks (0-1 | 2-3: ^ 2, ^ 1), with
// messages of several launches (ANYR_ONESHOT_MAX_BYTES=64K): exact on every rank, bit-identical
// across them. The default order (no islands) runs in the staged sweeps.
TEST(AllReduceGpu, DoublingPushOrdersFromIslandsSharingGpus) {
  REQUIRE_GPU();
  const std::vector<uint64_t> counts = {1, 7, 1023, 65536 + 5};
  const std::vector<anyrAlgo_t> subject = {anyrAlgoDoublingPush};
  for (const auto& [n, layout] : {std::pair<int, const char*>{8, "0-3,4-7"},
                                  std::pair<int, const char*>{8, "0-1,2-3,4-5,6-7"},
                                  std::pair<int, const char*>{4, "0-1,2-3"}}) {
    SCOPED_TRACE(std::to_string(n) + " ranks, ANYR_ISLANDS=" + layout);
    const RankEnv env({{"ANYR_ISLANDS", layout}, {"ANYR_ONESHOT_MAX_BYTES", "65536"}});
    auto results = runRanksWith(n, 600, sweepRank, counts, n == 4, subject);
    expectRanksPassedWithEqualHashes(results, n);
    EXPECT_EQ(subjectsNotRun(results, subject), "");
  }
}

// The islands kernel shares the two-shot push's buffers and their rotation (algo/islands.cu):
// calls alternating islands, the two-shot push and the one-shot push, at sizes whose slots'
// extents differ from call to call and in several launches, each exact on every rank. A
// member of the family that cleared less than the one before it wrote would leave vectors that
// read as arrived.
int rotationRank(int rank, int n, const anyrUniqueId& id, const Report& report) {
  return rotationRankOf(rank, n, id, report,
                        {anyrAlgoIslands, anyrAlgoTwoShotPush, anyrAlgoOneShotPush});
}

// The push orders share the one-shot push's buffers and phases (algo/oneshot_push.cuh): calls
// alternating the doubling, all-to-all and staged orders, in several launches (64 KiB slots),
// each exact on every rank; at five ranks (Bruck's shifts) and four (recursive doubling).
TEST(AllReduceGpu, PushOrdersShareOneBufferRotation) {
  REQUIRE_GPU();
  const RankEnv env({{"ANYR_ONESHOT_MAX_BYTES", "65536"}});
  for (int n : {5, 4}) {
    SCOPED_TRACE("world size " + std::to_string(n));
    auto results =
        runRanksCatching(n, 600, [](int rank, int nr, const anyrUniqueId& id, const Report& rep) {
          return rotationRankOf(rank, nr, id, rep,
                                {anyrAlgoDoublingPush, anyrAlgoOneShotPush, anyrAlgoStagedPush});
        });
    expectRanksPassedWithEqualHashes(results, n);
    SKIP_UNLESS_EVERY_SUBJECT_RAN(results, {anyrAlgoDoublingPush, anyrAlgoStagedPush});
  }
}

// A rank that skips a call: the doubling push's waits give up after the timeout and name the
// rank that stores into the slot waited on (at two ranks, the peer).
TEST(AllReduceGpu, DoublingPushMissingPeerGivesTimeoutNamingIt) {
  REQUIRE_GPU();
  auto results =
      runRanksCatching(2, 120, [&](int rank, int n, const anyrUniqueId& id, const Report& report) {
        return missingPeerRank(rank, n, id, report, anyrAlgoDoublingPush, 4096, "doubling-push", "",
                               1.5 + 5.0);
      });
  expectRanksExitedZero(results);
  std::printf("[ info ] %s", results[0].message.c_str());
}

// With more than two ranks the staged and doubling push send their later rounds only after
// waits of their own (the doubling push relays what earlier rounds brought), islands relay
// values across islands and send results after their own waits, and the ring is one chain of
// waits (its later waits give up later: ring.cu, kRingChainGraceNs), and the two-shot family's
// all-gather waits for owners that send once their own reduce-scatter waits are done. When the
// last rank skips a call, every other rank's error names it (the rank that waits for its data
// first hand times out first and stops the rest; a wait for a later round or an all-gather is
// second hand), never a healthy rank held up by it: the plain kernels, the fused doubling and
// two-shot kernels, islands with the missing rank in an island of four or alone in its island,
// and the ring, bounded.
TEST(AllReduceGpu, LaterRoundWaitsNameTheMissingRankNotAHealthyOneHeldUp) {
  REQUIRE_GPU();
  constexpr size_t kHidden = 2048;
  struct Form {
    anyrAlgo_t algo;
    bool fused;
    const char* islands;  // ANYR_ISLANDS at 4 and 8 ranks, or none
    const char* islands8;
  };
  for (int n : {4, 8}) {
    for (const Form f : {Form{anyrAlgoDoublingPush, false, nullptr, nullptr},
                         Form{anyrAlgoDoublingPush, true, nullptr, nullptr},
                         Form{anyrAlgoStagedPush, false, nullptr, nullptr},
                         Form{anyrAlgoIslands, false, "0-2,3", "0-3,4-7"},
                         Form{anyrAlgoRing, false, nullptr, nullptr},
                         Form{anyrAlgoRingCopy, false, nullptr, nullptr},
                         Form{anyrAlgoTwoShot, false, nullptr, nullptr},
                         Form{anyrAlgoTwoShot, true, nullptr, nullptr},
                         Form{anyrAlgoTwoShotPush, false, nullptr, nullptr},
                         Form{anyrAlgoTwoShotPush, true, nullptr, nullptr}}) {
      const bool fused = f.fused;
      const int missing = n - 1;
      const char* layout = n == 4 ? f.islands : f.islands8;
      SCOPED_TRACE(std::to_string(n) + " ranks, " + anyrAlgoName(f.algo) +
                   (fused ? ", fused" : "") + (layout ? std::string(", ") + layout : ""));
      const RankEnv env({{"ANYR_ISLANDS", layout}});
      auto results = runRanksCatching(
          n, 180, [&](int rank, int nranks, const anyrUniqueId& id, const Report& report) {
            anyrComm_t comm = initRankComm(rank, nranks, id, 1500);
            R_ANYR(anyrCommSetAlgorithm(comm, f.algo), comm);
            void *partial = nullptr, *residual = nullptr, *weight = nullptr, *norm = nullptr;
            for (void** q : {&partial, &residual, &norm, &weight}) {
              R_CUDA(cudaMalloc(q, kHidden * 2));
              R_CUDA(cudaMemset(*q, 0, kHidden * 2));
            }
            cudaStream_t s;
            R_CUDA(cudaStreamCreate(&s));
            auto call = [&] {
              return fused
                         ? anyrAllReduceAddRmsNorm(partial, residual, residual, weight, 1e-6f, norm,
                                                   1, kHidden, anyrBfloat16, nullptr, comm, s)
                         : anyrAllReduce(partial, partial, kHidden, anyrBfloat16, anyrSum, comm, s);
            };
            R_ANYR(call(), comm);
            R_CUDA(cudaStreamSynchronize(s));
            int failures = 0;
            if (rank == missing) {
              // Stay until the others have given up (1.5 s, and the relays' grace), then leave.
              std::this_thread::sleep_for(std::chrono::milliseconds(6000));
            } else {
              const auto t0 = std::chrono::steady_clock::now();
              R_ANYR(call(), comm);
              const cudaError_t e = waitStream(s, 30);
              const double sec =
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
              anyrResult_t async = anyrSuccess;
              R_ANYR(anyrCommGetAsyncError(comm, &async), comm);
              const std::string msg = anyrGetLastError(comm);
              const std::string named = "waiting for rank " + std::to_string(missing);
              if (e != cudaSuccess || (async != anyrTimeout && async != anyrRemoteError) ||
                  msg.find(named) == std::string::npos) {
                ++failures;
                report("FAIL expected an error naming rank " + std::to_string(missing) +
                       " as the one waited for, got " + anyrGetErrorString(async) + ": " + msg +
                       (e != cudaSuccess ? std::string(" (stream: ") + cudaGetErrorString(e) + ")"
                                         : std::string()) +
                       "\n");
              }
              if (sec > 1.5 + 5.0) {
                ++failures;
                report("FAIL the wait took " + std::to_string(sec) + " s\n");
              }
              report("NOTE rank " + std::to_string(rank) + ": " + msg + "\n");
            }
            anyrCommDestroy(comm);
            return failures ? 4 : 0;
          });
      const std::string failures = launch::describeFailures(results);
      EXPECT_TRUE(failures.empty()) << failures.substr(0, 8000);
      for (const auto& r : results) std::printf("[ info ] %s", r.message.c_str());
    }
  }
}

TEST(AllReduceGpu, IslandsAndTheTwoShotPushShareOneBufferRotation) {
  REQUIRE_GPU();
  const RankEnv env({{"ANYR_ISLANDS", "0-1,2-3"}, {"ANYR_CHUNK_BYTES", "64K"}});
  auto results = runRanksCatching(4, 600, rotationRank);
  expectRanksPassedWithEqualHashes(results, 4);
  SKIP_UNLESS_EVERY_SUBJECT_RAN(results, {anyrAlgoIslands, anyrAlgoTwoShotPush});
}

// Across the push family's launch count wrap (see PushEpochWrapIsSeamless), islands and the
// two-shot push on four ranks in two islands.
TEST(AllReduceGpu, IslandsPushEpochWrapIsSeamless) {
  REQUIRE_GPU();
  const RankEnv env({{"ANYR_ISLANDS", "0-1,2-3"}, {"ANYR_TEST_PUSH_EPOCH", "3221225468"}});
  const std::vector<uint64_t> counts = {1, 1023, 65536 + 5};
  auto results = runRanksWith(4, 600, sweepRank, counts, false,
                              std::vector<anyrAlgo_t>{anyrAlgoIslands, anyrAlgoTwoShotPush});
  expectRanksPassedWithEqualHashes(results, 4);
  EXPECT_EQ(subjectsNotRun(results, {anyrAlgoIslands}), "");
}

// A rank that skips a call: the islands kernel's waits give up after the timeout and name it.
TEST(AllReduceGpu, IslandsMissingPeerGivesTimeoutNamingIt) {
  REQUIRE_GPU();
  const RankEnv env({{"ANYR_ISLANDS", "0,1"}});
  auto results =
      runRanksCatching(2, 120, [&](int rank, int n, const anyrUniqueId& id, const Report& report) {
        return missingPeerRank(rank, n, id, report, anyrAlgoIslands, 4096, "islands", "",
                               1.5 + 5.0);
      });
  expectRanksExitedZero(results);
  std::printf("[ info ] %s", results[0].message.c_str());
}

// Where the islands come from: without ANYR_ISLANDS the topology's (ranks sharing one GPU are
// one island: not admitted, forcing it names why); with it the configured ones (explain says
// so); and a layout that does not fit the world size fails creation on every rank, naming the
// variable and the rule.
TEST(AllReduceGpu, IslandsComeFromTheTopologyOrTheConfiguration) {
  REQUIRE_GPU();
  for (const char* layout : {static_cast<const char*>(nullptr), "0,1"}) {
    SCOPED_TRACE(layout ? layout : "unset");
    const RankEnv env({{"ANYR_ISLANDS", layout}});
    auto results = runRanksCatching(
        2, 120, [&](int rank, int n, const anyrUniqueId& id, const Report& report) {
          anyrComm_t comm = initComm(rank, n, id, 10000);
          int failures = 0;
          const nlohmann::json is = explainJson(comm).at("islands");
          const nlohmann::json adm = explainJson(comm).at("admission").at("islands");
          const std::string source = is.at("source").get<std::string>();
          const bool several = is.at("members").size() >= 2;
          if (rank == 0) report("INFO islands " + is.dump() + ": " + adm.dump() + "\n");
          if (layout != nullptr && (source != "ANYR_ISLANDS=0,1" || !is.at("configured"))) {
            ++failures;
            report("FAIL explain's islands with ANYR_ISLANDS=0,1: " + is.dump() + "\n");
          }
          if (layout == nullptr && source.rfind("topology: ", 0) != 0) {
            ++failures;
            report("FAIL explain's islands without ANYR_ISLANDS: " + is.dump() + "\n");
          }
          const anyrResult_t set = anyrCommSetAlgorithm(comm, anyrAlgoIslands);
          const std::string why = anyrGetLastError(comm);
          if (several != (set == anyrSuccess) || adm.at("admitted").get<bool>() != several ||
              (!several && why.find("one island") == std::string::npos)) {
            ++failures;
            report("FAIL islands " + is.dump() + " but forcing gave " + anyrGetErrorString(set) +
                   ": " + why + "\n");
          }
          return releaseRank(comm, nullptr, {}, failures);
        });
    expectRanksPassed(results);
  }
  const RankEnv env({{"ANYR_ISLANDS", "0-3,4-7"}});
  auto results =
      runRanksCatching(2, 120, [&](int rank, int n, const anyrUniqueId& id, const Report& report) {
        useRankGpu(rank);
        anyrConfig_t cfg = ANYR_CONFIG_INITIALIZER;
        cfg.timeoutMs = 10000;
        anyrComm_t comm = nullptr;
        const anyrResult_t r = anyrCommInitRankConfig(&comm, n, id, rank, &cfg);
        const std::string msg = anyrGetLastError(nullptr);
        if (r != anyrInvalidArgument || msg.find("ANYR_ISLANDS='0-3,4-7'") == std::string::npos ||
            msg.find("rank 2 is named, but the communicator has 2 ranks") == std::string::npos) {
          report(std::string("FAIL creation with ANYR_ISLANDS=0-3,4-7 on 2 ranks: ") +
                 anyrGetErrorString(r) + ": " + msg + "\n");
          if (r == anyrSuccess) anyrCommDestroy(comm);
          return 4;
        }
        return 0;
      });
  expectRanksPassed(results);
}

}  // namespace
}  // namespace anyr
