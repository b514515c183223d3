// How the ranks map each other's workspace (config.peerMemory / ANYR_PEER_MEMORY): legacy CUDA
// IPC, virtual-memory allocations whose POSIX file descriptors pass over a Unix-domain socket
// (vmm), none, and the automatic choice, including where legacy IPC fails on one rank
// (ANYR_FAULT_INJECT=ipc-open:1) and where one rank's vmm granularity is coarser
// (vmm-granularity:1). For each: the kind explain reports and its reason, the
// admission of the peer algorithms, and an automatic all-reduce exact on every rank. Then user
// buffers from virtual-memory allocations (as PyTorch's expandable segments make them): every
// algorithm takes them and is exact.
#include <cuda.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>
#include <vector>

#include "anyreduce/anyreduce.h"
#include "common/data.h"
#include "common/launcher.h"
#include "gpu/gpu_test_util.h"
#include "transport/cu_driver.h"

namespace anyr {
namespace {

struct KindCase {
  const char* name;
  int setting;        // config.peerMemory, or ANYR_CONFIG_UNDEF_INT (the default: auto)
  const char* fault;  // ANYR_FAULT_INJECT for the ranks, or nullptr
  const char* kind;   // explain's peerMemory.kind
  std::vector<std::string> reasonHas;
  bool peerAdmitted;  // oneshot-push admitted
};

const std::vector<KindCase>& kindCases() {
  static const std::vector<KindCase> cases = {
      {"default",
       ANYR_CONFIG_UNDEF_INT,
       nullptr,
       "cuda-ipc",
       {"cuda-ipc (auto): 2 of 2 ordered pairs mapped"},
       true},
      {"cuda-ipc",
       anyrPeerMemoryCudaIpc,
       nullptr,
       "cuda-ipc",
       {"cuda-ipc (forced by config.peerMemory / ANYR_PEER_MEMORY): 2 of 2 ordered pairs mapped"},
       true},
      {"vmm",
       anyrPeerMemoryVmm,
       nullptr,
       "vmm",
       {"vmm (forced by config.peerMemory / ANYR_PEER_MEMORY): 2 of 2 ordered pairs mapped"},
       true},
      {"none", anyrPeerMemoryNone, nullptr, "none", {"disabled by config.peerMemory"}, false},
      // Rank 1 reports a granularity above the workspace's size (as a GPU of another model may
      // report a larger one): the ranks agree on one, so both regions have one size and map.
      {"vmm, rank 1 with a coarser granularity",
       anyrPeerMemoryVmm,
       "vmm-granularity:1",
       "vmm",
       {"vmm (forced by config.peerMemory / ANYR_PEER_MEMORY): 2 of 2 ordered pairs mapped"},
       true},
      {"auto, IPC failing on rank 1",
       anyrPeerMemoryAuto,
       "ipc-open:1",
       "vmm",
       {"vmm (auto): 2 of 2 ordered pairs mapped", "cuda-ipc 1 of 2 ordered pairs mapped",
        "rank 1 cannot map rank 0's workspace: cudaIpcOpenMemHandle: failed by "
        "ANYR_FAULT_INJECT=ipc-open:1"},
       true},
      {"cuda-ipc forced, failing on rank 1",
       anyrPeerMemoryCudaIpc,
       "ipc-open:1",
       "cuda-ipc",
       {"1 of 2 ordered pairs mapped", "rank 1 cannot map rank 0's workspace"},
       false},
  };
  return cases;
}

// One case's two ranks: explain's kind and reason, oneshot-push's admission, and automatic
// all-reduces of 1, 4096 and 65541 bf16 small integers, exact.
int kindCaseRank(const KindCase& k, int rank, int n, const anyrUniqueId& id, const Report& report) {
  int failures = 0;
  auto fail = [&](const std::string& what) {
    ++failures;
    report("FAIL " + std::string(k.name) + ": " + what + "\n");
  };
  anyrComm_t comm =
      initRankComm(rank, n, id, 20000, [&](anyrConfig_t& c) { c.peerMemory = k.setting; });
  const nlohmann::json j = explainJson(comm);
  const std::string kind = j["peerMemory"]["kind"];
  const std::string reason = j["peerMemory"]["reason"];
  if (kind != k.kind) fail("kind " + kind + ", expected " + k.kind);
  for (const std::string& must : k.reasonHas) {
    if (reason.find(must) == std::string::npos) fail("reason lacks '" + must + "': " + reason);
  }
  const std::string text = j["dispatchText"];
  if (text.find("peer memory: " + reason) == std::string::npos) {
    fail("the dispatch text lacks the peer memory line");
  }
  const bool admitted = j["admission"]["oneshot-push"]["admitted"];
  if (admitted != k.peerAdmitted) {
    fail("oneshot-push admitted " + std::to_string(admitted) + ": " +
         j["admission"]["oneshot-push"]["reason"].get<std::string>());
  }
  if (rank == 0) report("INFO " + std::string(k.name) + ": " + reason + "\n");
  const uint64_t count = 65536 + 5;
  cudaStream_t s = nonBlockingStream();
  void* in = nullptr;
  void* out = nullptr;
  unsigned long long* dWrong = nullptr;
  R_CUDA(cudaMalloc(&in, count * 2));
  R_CUDA(cudaMalloc(&out, count * 2));
  R_CUDA(cudaMalloc(reinterpret_cast<void**>(&dWrong), sizeof(*dWrong)));
  uint32_t seed = 500;
  // Whatever maps the workspace (or nothing), the automatic choice is exact.
  for (uint64_t c : {uint64_t{1}, uint64_t{4096}, count}) {
    ++seed;
    R_CUDA(data::fillInput(anyrBfloat16, in, c, rank, seed, data::kSmallInts, s));
    R_CUDA(cudaMemsetAsync(out, 0xff, c * 2, s));
    R_ANYR(anyrAllReduce(in, out, c, anyrBfloat16, anyrSum, comm, s), comm);
    unsigned long long wrong = 0;
    R_CUDA(data::mismatchesNow(anyrBfloat16, out, c, n, seed, data::kSmallInts, dWrong, s, &wrong));
    if (wrong != 0) fail("n=" + std::to_string(c) + ": " + std::to_string(wrong) + " wrong");
  }
  return finishRank(comm, s, {in, out, dWrong}, failures, report);
}

TEST(PeerMemoryGpu, ExplainNamesTheKindAndWhyAndTheAutomaticAllReduceIsExact) {
  REQUIRE_GPU();
  for (const KindCase& k : kindCases()) {
    SCOPED_TRACE(k.name);
    if (k.fault != nullptr) setenv("ANYR_FAULT_INJECT", k.fault, 1);  // the ranks inherit it
    auto results =
        runRanksCatching(2, 120, [&](int rank, int n, const anyrUniqueId& id, const Report& rep) {
          return kindCaseRank(k, rank, n, id, rep);
        });
    unsetenv("ANYR_FAULT_INJECT");
    expectRanksPassed(results);
    for (const auto& r : results) {
      if (r.rank == 0) std::printf("[ info ] %s", r.message.c_str());
    }
  }
}

// A device buffer from the virtual-memory calls (cuMemCreate, cuMemMap), as PyTorch's
// expandable segments allocate tensors; released with the object.
class VmmBuffer {
 public:
  VmmBuffer(const CuDriver& d, int device, size_t bytes) : d_(d) {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    size_t gran = 0;
    check(d_.memGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
          "cuMemGetAllocationGranularity");
    bytes_ = (bytes + gran - 1) / gran * gran;
    check(d_.memCreate(&handle_, bytes_, &prop, 0), "cuMemCreate");
    check(d_.memAddressReserve(&va_, bytes_, gran, 0, 0), "cuMemAddressReserve");
    check(d_.memMap(va_, bytes_, 0, handle_, 0), "cuMemMap");
    CUmemAccessDesc access{};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    check(d_.memSetAccess(va_, bytes_, &access, 1), "cuMemSetAccess");
  }
  ~VmmBuffer() {
    if (va_ != 0) {
      (void)d_.memUnmap(va_, bytes_);
      (void)d_.memAddressFree(va_, bytes_);
    }
    if (handle_ != 0) (void)d_.memRelease(handle_);
  }
  VmmBuffer(const VmmBuffer&) = delete;
  VmmBuffer& operator=(const VmmBuffer&) = delete;
  void* get() const { return reinterpret_cast<void*>(va_); }

 private:
  void check(CUresult r, const char* call) {
    if (r != CUDA_SUCCESS) throw RankError(d_.text(call, r));
  }
  const CuDriver& d_;
  size_t bytes_ = 0;
  CUmemGenericAllocationHandle handle_ = 0;
  CUdeviceptr va_ = 0;
};

// User buffers from virtual-memory allocations: every admitted algorithm takes them (the
// argument checks see device memory of the communicator's device) and is exact, in and out of
// place, the input untouched.
TEST(PeerMemoryGpu, BuffersFromVirtualMemoryAllocationsAreAccepted) {
  REQUIRE_GPU();
  const std::vector<anyrAlgo_t> algos = {
      anyrAlgoOneShotPush, anyrAlgoOneShotPull, anyrAlgoTwoShot,
      anyrAlgoTwoShotPush, anyrAlgoNccl,        anyrAlgoAuto,
      anyrAlgoHostOneShot, anyrAlgoHostTwoShot, anyrAlgoHostCopy};
  auto results =
      runRanksCatching(2, 300, [&](int rank, int n, const anyrUniqueId& id, const Report& report) {
        int failures = 0;
        anyrComm_t comm = initRankComm(rank, n, id, 20000);
        int device = 0;
        R_CUDA(cudaGetDevice(&device));
        std::string why;
        const CuDriver* d = cuDriver(&why);
        if (d == nullptr) throw RankError("driver entry points: " + why);
        const uint64_t count = 65536 + 5;
        VmmBuffer in(*d, device, count * 2), out(*d, device, count * 2);
        unsigned long long* dWrong = nullptr;
        R_CUDA(cudaMalloc(reinterpret_cast<void**>(&dWrong), sizeof(*dWrong)));
        cudaStream_t s = nonBlockingStream();
        uint32_t seed = 900;
        int ran = 0;
        for (anyrAlgo_t a : algos) {
          if (!forceOrSkip(comm, a, report)) continue;
          for (int inPlace = 0; inPlace < 2; ++inPlace) {
            ++seed;
            void* dst = inPlace ? in.get() : out.get();
            R_CUDA(data::fillInput(anyrBfloat16, in.get(), count, rank, seed, data::kSmallInts, s));
            if (!inPlace) R_CUDA(cudaMemsetAsync(dst, 0xff, count * 2, s));
            R_ANYR(anyrAllReduce(in.get(), dst, count, anyrBfloat16, anyrSum, comm, s), comm);
            unsigned long long wrong = 0;
            R_CUDA(data::mismatchesNow(anyrBfloat16, dst, count, n, seed, data::kSmallInts, dWrong,
                                       s, &wrong));
            unsigned long long changed = 0;
            if (!inPlace) {
              R_CUDA(cudaMemsetAsync(dWrong, 0, sizeof(*dWrong), s));
              R_CUDA(data::countInputChanges(anyrBfloat16, in.get(), count, rank, seed,
                                             data::kSmallInts, dWrong, s));
              R_CUDA(cudaMemcpyAsync(&changed, dWrong, sizeof(changed), cudaMemcpyDeviceToHost, s));
              R_CUDA(cudaStreamSynchronize(s));
            }
            if (wrong != 0 || changed != 0) {
              ++failures;
              report(std::string("FAIL ") + anyrAlgoName(a) + (inPlace ? " in place" : "") + ": " +
                     std::to_string(wrong) + " wrong elements, " + std::to_string(changed) +
                     " input elements changed\n");
            }
          }
          ++ran;
        }
        if (ran == 0) {
          ++failures;
          report("FAIL no algorithm could be forced\n");
        }
        return finishRank(comm, s, {dWrong}, failures, report);
      });
  expectRanksPassed(results);
  printSkipNotes(results);
}

}  // namespace
}  // namespace anyr
