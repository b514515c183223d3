// Multi-process GPU tests of host-copy (src/algo/host_copy.cu), the copy-engine host algorithm,
// beyond the suites every host algorithm runs (test_allreduce.cc's sweep, test_host_wire.cc's
// wires, alternation and missing-peer cases, test_fused_allreduce.cc's composition):
//  - small launches (ANYR_HOST_LAUNCH_BYTES 1 MiB) and chunks (ANYR_HOST_COPY_CHUNK_BYTES 256 KiB),
//    so messages take several launches of several chunks, with counts that are no multiple of
//    either (a short last chunk, a partial last vector, a chunk past the last vector's end);
//    every dtype, in place and out of place (poisoned output, input untouched), exact small
//    integers and random data (the rank-order fp32 sum, bit for bit), eager calls and a graph
//    replayed several times (the epoch and the launch barrier advance on the device);
//  - every rank reports a hash of every output; the parent checks all ranks agree;
//  - an invalid ANYR_HOST_COPY_CHUNK_BYTES or ANYR_HOST_LAUNCH_BYTES fails init with an error
//    naming it.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <sstream>
#include <string>
#include <vector>

#include "anyreduce/anyreduce.h"
#include "common/data.h"
#include "common/launcher.h"
#include "gpu/gpu_test_util.h"

namespace anyr {
namespace {

int piecesRank(int rank, int n, const anyrUniqueId& id, const Report& report) {
  setenv("ANYR_HOST_COPY_CHUNK_BYTES", "256K", 1);
  // The host launch size is its own knob (default 16 MiB): ANYR_CHUNK_BYTES stays at its default.
  setenv("ANYR_HOST_LAUNCH_BYTES", "1M", 1);
  anyrComm_t comm = initRankComm(rank, n, id, 20000);
  R_ANYR(anyrCommSetAlgorithm(comm, anyrAlgoHostCopy), comm);
  // The chunk in force must be the one asked for (rank 0's, agreed), or the test tests less.
  const nlohmann::json j = explainJson(comm);
  int failures = 0;
  if (!j.contains("hostTransport") || j["hostTransport"].value("copyChunkBytes", 0u) != 256u
                                                                                            << 10) {
    ++failures;
    report("FAIL explain's hostTransport.copyChunkBytes is not 262144: " + j.dump() + "\n");
  }
  if (!j.contains("hostTransport") || j["hostTransport"].value("launchBytes", 0u) != 1u << 20) {
    ++failures;
    report("FAIL explain's hostTransport.launchBytes is not 1048576: " + j.dump() + "\n");
  }
  cudaStream_t s = nonBlockingStream();
  // fp32 elements: 1 vector; 2 vectors (partial); 3 chunks, the last 20 bytes; a launch and a
  // half; 3.4 launches (the last launch itself cut into quarters).
  const std::vector<uint64_t> counts = {1, 7, 131072 + 5, 393216 + 9, 900001};
  const uint64_t maxCount = 900001;
  char* in = deviceAlloc<char>(maxCount * 4 + 64);
  char* out = deviceAlloc<char>(maxCount * 4 + 64);
  unsigned long long* bad = deviceAlloc<unsigned long long>();
  std::vector<unsigned char> host(maxCount * 4);
  uint32_t seed = 5000;
  for (anyrDataType_t dt : {anyrBfloat16, anyrFloat16, anyrFloat32}) {
    const size_t es = data::dtypeBytes(dt);
    for (uint64_t count : counts) {
      for (int inPlace = 0; inPlace < 2; ++inPlace) {
        for (int graph = 0; graph < 2; ++graph) {
          for (int mode : {data::kSmallInts, data::kRandom}) {
            // Odd counts start one element off: the unaligned path (and unaligned copies).
            const size_t shift = count % 2 == 1 ? es : 0;
            char* src = in + shift;
            char* dst = inPlace ? src : out + shift;
            std::ostringstream key;
            key << data::dtypeName(dt) << "/n=" << count << (inPlace ? "/inplace" : "/outofplace")
                << (graph ? "/graph" : "/eager")
                << (mode == data::kSmallInts ? "/ints" : "/random");
            cudaGraphExec_t exec = graph ? captureAllReduce(src, dst, count, dt, comm, s) : nullptr;
            for (int rep = 0; rep < (graph ? 3 : 2); ++rep) {
              ++seed;
              R_CUDA(data::fillInput(dt, src, count, rank, seed, mode, s));
              if (!inPlace) R_CUDA(cudaMemsetAsync(dst, 0xff, count * es, s));
              allReduceOrReplay(exec, src, dst, count, dt, comm, s);
              R_CUDA(cudaMemsetAsync(bad, 0, sizeof(*bad), s));
              R_CUDA(data::countMismatches(dt, dst, count, n, seed, mode, bad, s));
              unsigned long long wrong = 0;
              R_CUDA(cudaMemcpyAsync(&wrong, bad, sizeof(wrong), cudaMemcpyDeviceToHost, s));
              unsigned long long changed = 0;
              if (!inPlace) {
                R_CUDA(cudaMemsetAsync(bad, 0, sizeof(*bad), s));
                R_CUDA(data::countInputChanges(dt, src, count, rank, seed, mode, bad, s));
                R_CUDA(cudaMemcpyAsync(&changed, bad, sizeof(changed), cudaMemcpyDeviceToHost, s));
              }
              R_CUDA(cudaMemcpyAsync(host.data(), dst, count * es, cudaMemcpyDeviceToHost, s));
              R_CUDA(cudaStreamSynchronize(s));
              if (wrong != 0) {
                ++failures;
                report("FAIL " + key.str() + " replay " + std::to_string(rep) + ": " +
                       std::to_string(wrong) + " wrong elements\n");
              }
              if (changed != 0) {
                ++failures;
                report("FAIL " + key.str() + ": input modified in " + std::to_string(changed) +
                       " elements\n");
              }
              report("HASH " + key.str() + " " + std::to_string(rep) + " " +
                     std::to_string(data::fnv1a(host.data(), count * es)) + "\n");
            }
            if (exec) R_CUDA(cudaGraphExecDestroy(exec));
          }
        }
      }
    }
  }
  return finishRank(comm, s, {in, out, bad}, failures, report);
}

TEST(HostCopyGpu, PiecesAndChunksExactEveryDtypeGraphReplayBitIdentical) {
  REQUIRE_GPU();
  auto results = runRanksCatching(2, 600, piecesRank);
  expectRanksPassedWithEqualHashes(results, 2);
}

// Both ranks set `var` to `value` and must fail init with anyrInvalidArgument, the message
// naming the variable and containing `rule`.
void expectInitRefuses(const char* var, const char* value, const std::string& rule) {
  auto results =
      runRanksCatching(2, 120, [&](int rank, int n, const anyrUniqueId& id, const Report& report) {
        setenv(var, value, 1);
        useRankGpu(rank);
        anyrComm_t comm = nullptr;
        const anyrResult_t r = anyrCommInitRank(&comm, n, id, rank);
        const std::string msg = anyrGetLastError(nullptr);
        if (r != anyrInvalidArgument || msg.find(var) == std::string::npos ||
            msg.find(rule) == std::string::npos) {
          report(std::string("FAIL expected anyrInvalidArgument naming ") + var + ", got " +
                 anyrGetErrorString(r) + ": " + msg + "\n");
          if (r == anyrSuccess) anyrCommDestroy(comm);
          return 4;
        }
        return 0;
      });
  expectRanksExitedZero(results);
}

TEST(HostCopyGpu, InvalidChunkSizeFailsInitNamingIt) {
  REQUIRE_GPU();
  expectInitRefuses("ANYR_HOST_COPY_CHUNK_BYTES", "100000", "64 KiB");  // not a multiple of 64 KiB
}

TEST(HostCopyGpu, InvalidLaunchSizeFailsInitNamingIt) {
  REQUIRE_GPU();
  expectInitRefuses("ANYR_HOST_LAUNCH_BYTES", "100000", "multiple of 4096");  // not a multiple
}

}  // namespace
}  // namespace anyr
