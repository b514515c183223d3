// anyrCommInitFromNccl: a communicator whose setup exchange runs through an existing NCCL
// communicator (NcclBootstrap).
//
// One rank, so that it runs on any GPU machine (two ranks of NCCL cannot share one GPU): the
// exchange's staging grows with the largest message of the setup (the topology, the agreed
// configuration); then calls on it must be exact, the NCCL communicator must be the one given,
// and destroying ours must leave NCCL's usable.
//
// Two ranks on two GPUs (skipped with fewer): the exchanges work on blocking and non-blocking
// NCCL communicators; a rank that never calls anyrCommInitFromNccl is named by the other one
// within timeout + 5 s, and the NCCL communicator the caller passed is stopped (revoked, or
// aborted where NCCL has no revoke), so that nothing anyreduce queued on it pairs with the
// application's next collective.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <chrono>
#include <string>
#include <thread>

#include "anyreduce/anyreduce.h"
#include "common/data.h"
#include "gpu/gpu_test_util.h"
#include "gpu/nccl_test_util.h"
#include "transport/nccl_comm.h"

namespace anyr {
namespace {

using namespace nccltest;  // the helpers this file shares with the other NCCL tests

// ncclAllReduce on `nccl` (non-blocking or not), then the stream; throws past 30 s.
void ncclAllReduceNow(const void* in, void* out, size_t n, ncclComm_t nccl, cudaStream_t s) {
  const ncclResult_t r = ncclAllReduce(in, out, n, ncclBfloat16, ncclSum, nccl, s);
  if (r == ncclInProgress) {
    settleNccl(nccl, "ncclAllReduce");
  } else if (r != ncclSuccess) {
    throw RankError(std::string("ncclAllReduce: ") + ncclGetErrorString(r));
  }
  R_CUDA(waitStream(s, 30));
}

// The end of a rank whose communicator over `nccl` is destroyed: NCCL's communicator outlives
// ours, and still works (an ncclAllReduceNow of `count` small integers made with `seed`, from
// `in` into `out`, over `nranks`); then it, the buffers and the stream are released. Returns the
// wrong elements.
unsigned long long ncclStillWorksThenRelease(ncclComm_t nccl, int rank, int nranks, void* in,
                                             void* out, unsigned long long* scratch, uint64_t count,
                                             uint32_t seed, cudaStream_t s) {
  R_CUDA(data::fillInput(anyrBfloat16, in, count, rank, seed, data::kSmallInts, s));
  ncclAllReduceNow(in, out, count, nccl, s);
  unsigned long long wrong = ~0ull;
  R_CUDA(data::mismatchesNow(anyrBfloat16, out, count, nranks, seed, data::kSmallInts, scratch, s,
                             &wrong));
  R_NCCL(ncclCommDestroy(nccl));
  for (void* p : {in, out, static_cast<void*>(scratch)}) R_CUDA(cudaFree(p));
  R_CUDA(cudaStreamDestroy(s));
  return wrong;
}

TEST(NcclBootstrapGpu, CommunicatorFromAnNcclCommunicatorOfOneRank) {
  REQUIRE_GPU();
  auto results = runRanksCatching(1, 120, [&](int, int, const anyrUniqueId&, const Report& report) {
    R_CUDA(cudaSetDevice(0));
    ncclUniqueId nid;
    R_NCCL(ncclGetUniqueId(&nid));
    ncclComm_t nccl = nullptr;
    R_NCCL(ncclCommInitRank(&nccl, 1, nid, 0));
    anyrComm_t comm = initFromNccl(nccl, 10000);
    int failures = 0;
    auto expect = [&](bool ok, const std::string& what) {
      if (!ok) {
        ++failures;
        report("FAIL " + what + "\n");
      }
    };
    int count = -1, rank = -1;
    void* got = nullptr;
    R_ANYR(anyrCommCount(comm, &count), comm);
    R_ANYR(anyrCommUserRank(comm, &rank), comm);
    R_ANYR(anyrCommGetNcclComm(comm, &got), comm);
    expect(count == 1 && rank == 0,
           "count " + std::to_string(count) + ", rank " + std::to_string(rank));
    expect(got == static_cast<void*>(nccl), "anyrCommGetNcclComm is not the communicator given");

    cudaStream_t s = nonBlockingStream();
    const uint64_t n = (1u << 20) + 3;
    void* in = deviceAlloc<void>(n * 2);
    void* out = deviceAlloc<void>(n * 2);
    unsigned long long* scratch = deviceAlloc<unsigned long long>();
    for (uint32_t seed = 5; seed < 8; ++seed) {  // a few calls, fresh inputs, poisoned output
      R_CUDA(data::fillInput(anyrBfloat16, in, n, 0, seed, data::kRandom, s));
      R_CUDA(cudaMemsetAsync(out, 0xff, n * 2, s));
      R_ANYR(anyrAllReduce(in, out, n, anyrBfloat16, anyrSum, comm, s), comm);
      unsigned long long wrong = ~0ull;
      R_CUDA(data::mismatchesNow(anyrBfloat16, out, n, 1, seed, data::kRandom, scratch, s, &wrong));
      expect(wrong == 0,
             "seed " + std::to_string(seed) + ": " + std::to_string(wrong) + " wrong elements");
    }
    failures += asyncErrorFailures(comm, report);
    R_ANYR(anyrCommDestroy(comm), nullptr);

    const unsigned long long wrong =
        ncclStillWorksThenRelease(nccl, 0, 1, in, out, scratch, n, 9, s);
    expect(wrong == 0, "NCCL after anyrCommDestroy: " + std::to_string(wrong) + " wrong elements");
    report("CHECKED 4 calls\n");
    return failures ? 4 : 0;
  });
  expectRanksPassed(results);
}

#define SKIP_UNLESS_TWO_GPUS()                                                               \
  do {                                                                                       \
    REQUIRE_GPU();                                                                           \
    if (gpuCount() < 2) {                                                                    \
      GTEST_SKIP() << "needs 2 GPUs: two ranks of one NCCL communicator cannot share a GPU " \
                      "(NCCL refuses duplicate GPUs)";                                       \
    }                                                                                        \
  } while (0)

// ncclAllGather of `bytes` per rank on `nccl`, then the stream; throws past 30 s.
void ncclAllGatherNow(const void* in, void* out, size_t bytes, ncclComm_t nccl, cudaStream_t s) {
  const ncclResult_t r = ncclAllGather(in, out, bytes, ncclUint8, nccl, s);
  if (r == ncclInProgress) {
    settleNccl(nccl, "ncclAllGather");
  } else if (r != ncclSuccess) {
    throw RankError(std::string("ncclAllGather: ") + ncclGetErrorString(r));
  }
  R_CUDA(waitStream(s, 30));
}

TEST(NcclBootstrapGpu, TwoGpusExactCallsOnBlockingAndNonBlockingCommunicators) {
  SKIP_UNLESS_TWO_GPUS();
  for (bool blocking : {true, false}) {
    resetShared();
    auto results =
        runRanksCatching(2, 180, [&](int rank, int n, const anyrUniqueId&, const Report& report) {
          useRankGpu(rank);
          ncclComm_t nccl = makeNcclComm(rank, n, blocking);
          anyrComm_t comm = initFromNccl(nccl, 10000);
          int failures = 0;
          auto expect = [&](bool ok, const std::string& what) {
            if (!ok) {
              ++failures;
              report("FAIL " + std::string(blocking ? "blocking: " : "non-blocking: ") + what +
                     "\n");
            }
          };
          int count = -1, me = -1;
          R_ANYR(anyrCommCount(comm, &count), comm);
          R_ANYR(anyrCommUserRank(comm, &me), comm);
          expect(count == n && me == rank,
                 "count " + std::to_string(count) + ", rank " + std::to_string(me));
          cudaStream_t s = nonBlockingStream();
          const uint64_t elems = (1u << 20) + 3;
          void* in = deviceAlloc<void>(elems * 2);
          void* out = deviceAlloc<void>(elems * 2);
          unsigned long long* scratch = deviceAlloc<unsigned long long>();
          uint32_t seed = 11;
          for (anyrAlgo_t algo : {anyrAlgoAuto, anyrAlgoNccl}) {
            R_ANYR(anyrCommSetAlgorithm(comm, algo), comm);
            for (uint64_t count2 : {uint64_t{1000}, elems}) {
              ++seed;
              R_CUDA(data::fillInput(anyrBfloat16, in, count2, rank, seed, data::kSmallInts, s));
              R_CUDA(cudaMemsetAsync(out, 0xff, count2 * 2, s));
              R_ANYR(anyrAllReduce(in, out, count2, anyrBfloat16, anyrSum, comm, s), comm);
              unsigned long long wrong = ~0ull;
              R_CUDA(data::mismatchesNow(anyrBfloat16, out, count2, n, seed, data::kSmallInts,
                                         scratch, s, &wrong));
              expect(wrong == 0, std::string(anyrAlgoName(algo)) + ", " + std::to_string(count2) +
                                     " elements: " + std::to_string(wrong) + " wrong");
            }
          }
          failures += asyncErrorFailures(comm, report);
          R_ANYR(anyrCommDestroy(comm), nullptr);
          const unsigned long long wrong =
              ncclStillWorksThenRelease(nccl, rank, n, in, out, scratch, elems, ++seed, s);
          expect(wrong == 0, "NCCL after anyrCommDestroy: " + std::to_string(wrong) + " wrong");
          report("CHECKED\n");
          return failures ? 4 : 0;
        });
    expectRanksPassed(results);
  }
}

TEST(NcclBootstrapGpu, TwoGpusAMissingRankIsNamedAndTheNcclCommunicatorIsStopped) {
  SKIP_UNLESS_TWO_GPUS();
  const int timeoutMs = 1500;
  for (int missing : {1, 0}) {
    resetShared();
    auto results =
        runRanksCatching(2, 180, [&](int rank, int n, const anyrUniqueId&, const Report& report) {
          useRankGpu(rank);
          int failures = 0;
          const std::string label = "rank " + std::to_string(missing) + " missing: ";
          auto expect = [&](bool ok, const std::string& what) {
            if (!ok) {
              ++failures;
              report("FAIL " + label + what + "\n");
            }
          };
          // A server's communicator: non-blocking (so that every wait is bounded), connected
          // by its first collectives (an all-gather among them: anyreduce's exchanges are
          // all-gathers, and a rank that never calls never completes a connection).
          ncclComm_t nccl = makeNcclComm(rank, n, /*blocking=*/false);
          cudaStream_t s = nonBlockingStream();
          void* buf = deviceAlloc<void>(1 << 20);
          R_CUDA(cudaMemset(buf, 0, 1 << 20));
          ncclAllReduceNow(buf, buf, 4096, nccl, s);
          ncclAllGatherNow(buf, static_cast<char*>(buf) + 4096, 16, nccl, s);
          if (rank != missing) {
            sharedArea()->flag.store(1);  // entering anyrCommInitFromNccl
            anyrConfig_t cfg = ANYR_CONFIG_INITIALIZER;
            cfg.timeoutMs = timeoutMs;
            anyrComm_t comm = nullptr;
            const auto t0 = Clock::now();
            const anyrResult_t r = anyrCommInitFromNccl(&comm, nccl, &cfg);
            const double sec = secondsSince(t0);
            const std::string msg = anyrGetLastError(nullptr);
            const std::string names = "rank " + std::to_string(missing) +
                                      " did not call anyrCommInitFromNccl within " +
                                      std::to_string(timeoutMs) + " ms";
            expect(r == anyrTimeout && comm == nullptr,
                   std::string("returned ") + anyrGetErrorString(r) + ": " + msg);
            expect(contains(msg, names), "the message does not say '" + names + "': " + msg);
            expect(sec <= timeoutMs / 1000.0 + 5.0, "returned after " + std::to_string(sec) + " s");
            const bool revoked = ncclHasRevoke();
            expect(
                contains(msg, revoked ? "the NCCL communicator you passed was revoked"
                                      : "the NCCL communicator you passed was aborted and freed"),
                "the message does not say what happened to the NCCL communicator: " + msg);
            if (revoked) {
              // Revoked: it refuses work, so nothing can pair with the peer's next collective;
              // still ours to release.
              waitRevokeSettled(nccl);
              const ncclResult_t again =
                  ncclAllReduce(buf, buf, 4096, ncclBfloat16, ncclSum, nccl, s);
              expect(again != ncclSuccess && again != ncclInProgress,
                     std::string("the revoked NCCL communicator took an all-reduce: ") +
                         ncclGetErrorString(again));
              (void)ncclCommAbort(nccl);
            }
            report("NOTE " + label + std::to_string(sec) + " s: " + msg + "\n");
            sharedArea()->flag.store(2);
          } else {
            // Never calls anyrCommInitFromNccl. Once the other rank returned its error, goes on
            // with its own next collective: nothing the other rank left on the NCCL
            // communicator may pair with it (before the fix, its queued all-gather did).
            expect(waitFlag(2, 60), "the other rank's anyrCommInitFromNccl did not return");
            const ncclResult_t r = ncclAllReduce(buf, buf, 4096, ncclBfloat16, ncclSum, nccl, s);
            expect(r == ncclSuccess || r == ncclInProgress,
                   std::string("the application's ncclAllReduce: ") + ncclGetErrorString(r));
            std::this_thread::sleep_for(std::chrono::milliseconds(1000));
            ncclResult_t st = ncclInProgress;
            (void)ncclCommGetAsyncError(nccl, &st);
            expect(!(st == ncclSuccess && cudaStreamQuery(s) == cudaSuccess),
                   "the application's next all-reduce completed: something the other rank left "
                   "queued on the NCCL communicator paired with it");
            (void)cudaGetLastError();
            (void)ncclCommAbort(nccl);  // its peer is gone: abort releases the waiting kernel
          }
          R_CUDA(waitStream(s, 30));
          R_CUDA(cudaFree(buf));
          R_CUDA(cudaStreamDestroy(s));
          return failures ? 4 : 0;
        });
    expectRanksPassed(results);
    for (const auto& r : results) std::printf("[ info ] rank %d: %s", r.rank, r.message.c_str());
  }
}

}  // namespace
}  // namespace anyr
