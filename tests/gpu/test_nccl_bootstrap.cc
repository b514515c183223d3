// anyrCommInitFromNccl: a communicator whose setup exchange runs through an existing NCCL
// communicator (NcclBootstrap), here of one rank, so that it runs on any GPU machine (two ranks
// of NCCL cannot share one GPU). The exchange's staging grows with the largest message of the
// setup (the topology, the agreed configuration); then calls on it must be exact, the NCCL
// communicator must be the one given, and destroying ours must leave NCCL's usable.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <string>

#include "anyreduce/anyreduce.h"
#include "common/data.h"
#include "gpu/gpu_test_util.h"

namespace anyr {
namespace {

#define R_NCCL(expr)                                                                            \
  do {                                                                                          \
    ncclResult_t n_ = (expr);                                                                   \
    if (n_ != ncclSuccess) throw RankError(std::string(#expr) + ": " + ncclGetErrorString(n_)); \
  } while (0)

TEST(NcclBootstrapGpu, CommunicatorFromAnNcclCommunicatorOfOneRank) {
  REQUIRE_GPU();
  auto results = runRanksCatching(1, 120, [&](int, int, const anyrUniqueId&, const Report& report) {
    R_CUDA(cudaSetDevice(0));
    ncclUniqueId nid;
    R_NCCL(ncclGetUniqueId(&nid));
    ncclComm_t nccl = nullptr;
    R_NCCL(ncclCommInitRank(&nccl, 1, nid, 0));
    anyrConfig_t cfg = ANYR_CONFIG_INITIALIZER;
    cfg.timeoutMs = 10000;
    anyrComm_t comm = nullptr;
    R_ANYR(anyrCommInitFromNccl(&comm, nccl, &cfg), nullptr);
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

    cudaStream_t s;
    R_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const uint64_t n = (1u << 20) + 3;
    void *in = nullptr, *out = nullptr;
    unsigned long long* scratch = nullptr;
    R_CUDA(cudaMalloc(&in, n * 2));
    R_CUDA(cudaMalloc(&out, n * 2));
    R_CUDA(cudaMalloc(&scratch, sizeof(*scratch)));
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

    // NCCL's communicator outlives ours, and still works.
    R_CUDA(data::fillInput(anyrBfloat16, in, n, 0, 9, data::kSmallInts, s));
    R_NCCL(ncclAllReduce(in, out, n, ncclBfloat16, ncclSum, nccl, s));
    unsigned long long wrong = ~0ull;
    R_CUDA(data::mismatchesNow(anyrBfloat16, out, n, 1, 9, data::kSmallInts, scratch, s, &wrong));
    expect(wrong == 0, "NCCL after anyrCommDestroy: " + std::to_string(wrong) + " wrong elements");
    R_NCCL(ncclCommDestroy(nccl));
    for (void* p : {in, out, static_cast<void*>(scratch)}) R_CUDA(cudaFree(p));
    R_CUDA(cudaStreamDestroy(s));
    report("CHECKED 4 calls\n");
    return failures ? 4 : 0;
  });
  expectRanksPassed(results);
}

}  // namespace
}  // namespace anyr
