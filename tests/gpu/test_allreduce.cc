// Multi-process GPU tests of anyrAllReduce: every algorithm x dtype x count x in/out of place
// x eager/graph replay x input mode. Inputs are pure functions of (rank, index, seed), so each
// rank computes the exact expected bits on the CPU. Outputs are poisoned before every call;
// inputs must come back untouched; every rank reports a hash of every output and the parent
// checks that all ranks agree bit for bit.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <sstream>
#include <thread>
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
    anyrAlgoOneShotPush, anyrAlgoOneShotPull, anyrAlgoTwoShot,
    anyrAlgoTwoShotPush, anyrAlgoNccl,        anyrAlgoAuto,
    anyrAlgoHostOneShot, anyrAlgoHostTwoShot, anyrAlgoHostCopy};

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
                                            anyrAlgoHostTwoShot, anyrAlgoHostCopy};
  const auto results = sweepTwoRanksWith("ANYR_TEST_SYNC_EPOCH", "2147483653", subjects);
  SKIP_UNLESS_EVERY_SUBJECT_RAN(results, subjects);
}

// The peer algorithms over the virtual-memory workspace (ANYR_PEER_MEMORY=vmm: cuMemCreate
// allocations whose POSIX file descriptors pass over a Unix-domain socket): every peer
// algorithm exact and bit-identical on both ranks, as over legacy CUDA IPC.
const std::vector<anyrAlgo_t> kPeerAlgos = {anyrAlgoOneShotPush, anyrAlgoOneShotPull,
                                            anyrAlgoTwoShot, anyrAlgoTwoShotPush};
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

}  // namespace
}  // namespace anyr
