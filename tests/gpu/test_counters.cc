// Per-communicator counters (anyrCommGetCounters): one count per host dispatch, by path and
// size bucket; graph replays not counted; fused calls split into fused kernel / composed.
#include <cuda_runtime_api.h>

#include <cstring>
#include <functional>

#include "gpu_test_util.h"

namespace anyr {
namespace {

anyrCounters_t countersOf(anyrComm_t comm) {
  anyrCounters_t c;
  std::memset(&c, 0xff, sizeof(c));  // poisoned: every field must be written
  c.size = sizeof(c);
  c.magic = ANYR_COUNTERS_MAGIC;
  R_ANYR(anyrCommGetCounters(comm, &c), comm);
  return c;
}

unsigned long long bucketCalls(const anyrCounters_t& c, int bucket) {
  unsigned long long n = 0;
  for (int a = 0; a < anyrNumAlgos; ++a) n += c.calls[a][bucket];
  return n;
}

unsigned long long allCalls(const anyrCounters_t& c) {
  unsigned long long n = 0;
  for (int b = 0; b < ANYR_COUNTER_BUCKETS; ++b) n += bucketCalls(c, b);
  return n;
}

int countersRank(int rank, int n, const anyrUniqueId& id, const Report& report) {
  anyrComm_t comm = initRankComm(rank, n, id, 20000);
  int fails = 0;
  auto expect = [&](bool ok, const std::string& what) {
    if (!ok) {
      ++fails;
      report("FAIL rank " + std::to_string(rank) + ": " + what + "\n");
    }
  };
  cudaStream_t s = nonBlockingStream();
  void *in, *out, *res, *w, *norm;
  for (void** p : {&in, &out, &res, &w, &norm}) R_CUDA(cudaMalloc(p, 1 << 20));
  R_CUDA(cudaMemsetAsync(in, 0, 1 << 20, s));
  R_CUDA(cudaMemsetAsync(res, 0, 1 << 20, s));
  R_CUDA(cudaMemsetAsync(w, 0, 1 << 20, s));
  R_ANYR(anyrCommResetCounters(comm), comm);
  anyrCounters_t c = countersOf(comm);
  auto clusterLaunches = [](const anyrCounters_t& k) {
    return k.fusedLaunchesByCluster[0] + k.fusedLaunchesByCluster[1] + k.fusedLaunchesByCluster[2] +
           k.fusedLaunchesByCluster[3];
  };
  expect(allCalls(c) == 0 && c.capturedCalls == 0 && c.fusedKernelCalls == 0 &&
             c.fusedComposedCalls == 0 && c.forcedCalls == 0 && clusterLaunches(c) == 0,
         "counters not zero after reset");

  // 3 eager calls of 1024 bf16 (2 KiB: bucket 0), on the algorithm the communicator chooses.
  anyrAlgo_t small = anyrAlgoAuto;
  R_ANYR(anyrCommQueryAlgorithm(comm, 1024, anyrBfloat16, &small), comm);
  for (int i = 0; i < 3; ++i) {
    R_ANYR(anyrAllReduce(in, out, 1024, anyrBfloat16, anyrSum, comm, s), comm);
  }
  R_CUDA(cudaStreamSynchronize(s));
  c = countersOf(comm);
  expect(c.calls[small][0] == 3, "3 eager calls in bucket 0 of the chosen algorithm");
  expect(c.bytes[small][0] == 3 * 2048, "bytes of 3 calls of 2 KiB");
  expect(allCalls(c) == 3 && c.capturedCalls == 0, "only those 3 calls, none captured");

  // 2 captured calls of 65536 bf16 (128 KiB: bucket 3), replayed 5 times: counted twice.
  cudaGraph_t g;
  cudaGraphExec_t exec;
  R_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < 2; ++i) {
    R_ANYR(anyrAllReduce(in, out, 65536, anyrBfloat16, anyrSum, comm, s), comm);
  }
  R_CUDA(cudaStreamEndCapture(s, &g));
  R_CUDA(cudaGraphInstantiate(&exec, g, 0));
  for (int i = 0; i < 5; ++i) R_CUDA(cudaGraphLaunch(exec, s));
  R_CUDA(cudaStreamSynchronize(s));
  c = countersOf(comm);
  expect(bucketCalls(c, 3) == 2, "2 captured calls in bucket 3 (replays not counted)");
  expect(c.capturedCalls == 2, "capturedCalls == 2");

  // A fused call (4 x 1024 bf16 = 8 KiB, bucket 1): either a fused kernel or composed.
  R_ANYR(anyrAllReduceAddRmsNorm(in, res, res, w, 1e-6f, norm, 4, 1024, anyrBfloat16, nullptr, comm,
                                 s),
         comm);
  c = countersOf(comm);
  expect(c.fusedKernelCalls + c.fusedComposedCalls == 1, "one fused call counted");
  // 4 rows take one launch: a fused-kernel call counts one launch at its cluster size.
  expect(clusterLaunches(c) == c.fusedKernelCalls, "one fused launch per fused-kernel call");
  expect(bucketCalls(c, 1) == 1, "the fused call in bucket 1");
  // Forced NCCL: the fused call is composed (all-reduce + separate kernel) and forced.
  R_ANYR(anyrCommSetAlgorithm(comm, anyrAlgoNccl), comm);
  const unsigned long long composed = c.fusedComposedCalls;
  R_ANYR(anyrAllReduceAddRmsNorm(in, res, res, w, 1e-6f, norm, 4, 1024, anyrBfloat16, nullptr, comm,
                                 s),
         comm);
  R_CUDA(cudaStreamSynchronize(s));
  c = countersOf(comm);
  expect(c.fusedComposedCalls == composed + 1, "forced NCCL fused call counted as composed");
  expect(c.forcedCalls == 1, "forcedCalls == 1");
  expect(c.calls[anyrAlgoNccl][1] >= 1, "NCCL call in bucket 1");
  R_ANYR(anyrCommSetAlgorithm(comm, anyrAlgoAuto), comm);

  // Bad arguments name the argument.
  anyrCounters_t bad;
  std::memset(&bad, 0, sizeof(bad));
  bad.size = sizeof(bad) - 8;
  bad.magic = ANYR_COUNTERS_MAGIC;
  expect(anyrCommGetCounters(comm, &bad) == anyrInvalidArgument &&
             std::string(anyrGetLastError(comm)).find("'counters'") != std::string::npos,
         "wrong size rejected naming 'counters'");
  expect(anyrCommGetCounters(comm, nullptr) == anyrInvalidArgument, "NULL rejected");

  R_ANYR(anyrCommResetCounters(comm), comm);
  c = countersOf(comm);
  expect(allCalls(c) == 0 && c.fusedComposedCalls == 0 && c.forcedCalls == 0 &&
             c.capturedCalls == 0 && c.fusedKernelCalls == 0 && clusterLaunches(c) == 0,
         "reset clears every counter");
  R_CUDA(cudaGraphExecDestroy(exec));
  R_CUDA(cudaGraphDestroy(g));
  for (void* p : {in, out, res, w, norm}) R_CUDA(cudaFree(p));
  R_ANYR(anyrCommDestroy(comm), nullptr);
  return fails ? 4 : 0;
}

TEST(CountersGpu, CountsDispatchesByPathBucketAndKind) {
  REQUIRE_GPU();
  if (gpuCount() < 2) GTEST_SKIP() << "needs 2 GPUs";
  auto results = runRanksCatching(2, 120, countersRank);
  EXPECT_EQ(launch::describeFailures(results), "");
}

}  // namespace
}  // namespace anyr
