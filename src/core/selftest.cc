// Startup self-test: see core/selftest.h. Runs on the communicator's internal stream with the
// communicator's own launch paths (launchPeerAlgo, launchHostAlgo, the fused launchers) and
// kernel arguments, so it tests exactly what later calls will run, mappings included.
#include "core/selftest.h"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "algo/registry.h"
#include "algo/selftest_kernels.h"
#include "base/env.h"
#include "base/error.h"
#include "base/json_text.h"
#include "base/log.h"
#include "base/names.h"
#include "core/comm.h"
#include "device/host_handles.h"
#include "fused/fused.h"
#include "transport/check.h"
#include "transport/host_memory.h"

namespace anyr {

namespace {

constexpr int kMaxRuns = 8;
// Three launches per size: the push kernels rotate through three buffer phases, so every
// phase runs once; the last launch of each size is in place.
constexpr int kReps = 3;
constexpr uint64_t kLargeBytes = 1ull << 20;
constexpr int kFusedHidden = 1024;
// Rows of the fused runs, at most: the two-shot's dense form runs kMaxBlocks + 1 rows.
constexpr int kFusedMaxRows = kMaxBlocks + 1;
static_assert(static_cast<uint64_t>(kFusedMaxRows) * kFusedHidden * 2 <= kLargeBytes,
              "the fused runs' rows must fit the self-test's buffers");

struct VoteWire {
  int32_t ok;
  int32_t code;  // FailCode of this rank's device wait, 0 if none
  char why[248];
};
static_assert(sizeof(VoteWire) == 256, "VoteWire layout");

// The self-test buffers, stream-ordered on the internal stream (cudaFree would synchronize the
// whole device, and so wait for whatever else the application runs there), freed on every exit
// path.
struct DeviceBuffers {
  cudaStream_t stream;
  std::vector<void*> ptrs;
  explicit DeviceBuffers(cudaStream_t s) : stream(s) {}
  void* alloc(size_t bytes) {
    void* p = nullptr;
    ANYR_CUDA_CHECK(cudaMallocAsync(&p, bytes, stream));
    ptrs.push_back(p);
    return p;
  }
  ~DeviceBuffers() {
    for (void* p : ptrs) (void)cudaFreeAsync(p, stream);
  }
};

}  // namespace

struct SelfTest::Outcome {
  bool ok = true;
  int32_t code = kFailNone;
  std::string why;
};

FaultInjection parseFaultInjection(const std::string& text) {
  FaultInjection f;
  if (text.empty()) return f;
  const std::pair<const char*, FaultInjection::Kind> forms[] = {
      {"corrupt-peer:", FaultInjection::CorruptPeer},
      {"ipc-open:", FaultInjection::IpcOpenFails},
      {"vmm-granularity:", FaultInjection::VmmGranularity},
      {"host-copy-selftest:", FaultInjection::HostCopySelfTest},
      {"fabric-fail:", FaultInjection::FabricFails},
      {"fabric-slow-writes:", FaultInjection::FabricSlowWrites}};
  for (const auto& [prefix, kind] : forms) {
    const size_t len = std::strlen(prefix);
    if (text.rfind(prefix, 0) != 0 || text.size() <= len) continue;
    const char* digits = text.c_str() + len;
    char* end = nullptr;
    const long r = std::strtol(digits, &end, 10);
    if (end != digits && *end == '\0' && r >= 0 && r < kMaxLocalRanks) {
      f.kind = kind;
      f.rank = static_cast<int>(r);
      return f;
    }
  }
  throwError(anyrInvalidArgument, "environment variable ANYR_FAULT_INJECT='" + text +
                                      "': must be empty, corrupt-peer:<rank>, ipc-open:<rank>, "
                                      "vmm-granularity:<rank>, host-copy-selftest:<rank>, "
                                      "fabric-fail:<rank> or fabric-slow-writes:<rank> "
                                      "with rank in 0.." +
                                      std::to_string(kMaxLocalRanks - 1) + " (tests only)");
}

void SelfTest::injectFaults() {
  fault_ = parseFaultInjection(env::getString("ANYR_FAULT_INJECT"));
  const FaultInjection& f = fault_;
  if (f.kind != FaultInjection::CorruptPeer || f.rank != c_.ctx_.rank || !c_.workspace_.mapped())
    return;
  // This rank's view of the next rank's workspace points at its own workspace instead: its
  // pushes and flags for that peer land in its own memory, and its reads of that peer read
  // itself. The peer's WaitControl headers are left alone, so failures still propagate.
  const int victim = (c_.ctx_.rank + 1) % c_.ctx_.nranks;
  c_.workspace_.argsTemplate_.peerWorkspace[victim] = c_.workspace_.peers_->local();
  ANYR_LOG(Warn, c_.ctx_.rank,
           "ANYR_FAULT_INJECT: this rank's mapping of rank "
               << victim << "'s workspace now points at its own workspace (tests only)");
}

void SelfTest::setWaitTimeoutMs(int ms) {
  const uint64_t ns = static_cast<uint64_t>(ms) * 1000000ull;
  for (WaitControl* w : {c_.workspace_.dWait_, c_.host_.dHostWait_}) {
    if (w == nullptr) continue;  // that transport is not set up
    ANYR_CUDA_CHECK(cudaMemcpyAsync(reinterpret_cast<char*>(w) + offsetof(WaitControl, timeoutNs),
                                    &ns, sizeof(ns), cudaMemcpyHostToDevice,
                                    c_.ctx_.internalStream));
  }
  c_.ctx_.waitStreamIdle(c_.ctx_.internalStream, "setting the self-test deadline");
}

void SelfTest::run() {
  Communicator& c = c_;
  if (c.ctx_.nranks < 2 || (!c.ctx_.facts.peerMemory && !c.host_.present())) return;
  injectFaults();
  // Rank 0's setting decides, so every rank runs the same collective sequence.
  int32_t on = env::getInt("ANYR_SELFTEST") != 0 ? 1 : 0;
  c.ctx_.bs->broadcast(&on, sizeof(on), 0);
  nlohmann::json rep;
  if (on == 0) {
    rep["ran"] = false;
    rep["why"] = "disabled by ANYR_SELFTEST=0 (rank 0's environment)";
    c.selfTestJson_ = jsonText(rep);
    ANYR_LOG(Info, c.ctx_.rank, "self-test skipped (ANYR_SELFTEST=0)");
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  DeviceBuffers bufs(c.ctx_.internalStream);
  maxBytes_ = kLargeBytes + 4096;
  in_ = bufs.alloc(maxBytes_);
  out_ = bufs.alloc(maxBytes_);
  norm_ = bufs.alloc(static_cast<size_t>(kFusedHidden) * 2 * kFusedMaxRows);
  weight_ = bufs.alloc(static_cast<size_t>(kFusedHidden) * 2);
  results_ = bufs.alloc(sizeof(SelfCheckResult) * kMaxRuns);
  ANYR_CUDA_CHECK(
      launchSelfTestFill(anyrBfloat16, weight_, kFusedHidden, -1, c.ctx_.internalStream));
  const int timeoutMs = std::min(c.ctx_.cfg.timeoutMs, kSelfTestTimeoutMs);
  setWaitTimeoutMs(timeoutMs);

  nlohmann::json results = nlohmann::json::object();
  // Every peer- and host-memory algorithm of the registry (NCCL runs no kernel of ours), in
  // enum order: every rank runs the same collective sequence.
  for (int a = 1; a < anyrNumAlgos; ++a) {
    const anyrAlgo_t algo = static_cast<anyrAlgo_t>(a);
    if (algoInfo(algo).kind == AlgoKind::Nccl) continue;
    AlgoAdmission& adm = c.sel_.admission().algo[static_cast<size_t>(algo)];
    if (!adm.admitted) {
      results[anyrAlgoName(algo)] = "not run (not admitted)";
      continue;
    }
    bool failed = false;
    const std::string why = vote(runAlgo(algo), &failed);
    if (failed) {
      adm.admitted = false;
      adm.reason = why;
      results[anyrAlgoName(algo)] = why;
      ANYR_LOG(Warn, c.ctx_.rank, anyrAlgoName(algo) << " disabled: " << why);
      resetProtocolState();
    } else {
      results[anyrAlgoName(algo)] = "passed";
    }
  }
  // The fused kernels of the registry's algorithms, in enum order.
  for (int a = 1; a < anyrNumAlgos; ++a) {
    const anyrAlgo_t algo = static_cast<anyrAlgo_t>(a);
    if (algoInfo(algo).fused == nullptr) continue;
    const std::string name = std::string("fused-") + anyrAlgoName(algo);
    if (!c.sel_.admission()[algo].admitted) {
      results[name] = std::string("not run (") + anyrAlgoName(algo) + " is not admitted)";
      continue;
    }
    bool failed = false;
    const std::string why = vote(runFused(algo), &failed);
    if (failed) {
      c.sel_.admission().fusedKernelFailure[static_cast<size_t>(algo)] = why;
      results[name] = why;
      ANYR_LOG(Warn, c.ctx_.rank,
               name << " disabled (the unfused composition is used instead): " << why);
      resetProtocolState();
    } else {
      results[name] = "passed";
    }
  }
  setWaitTimeoutMs(c.ctx_.cfg.timeoutMs);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  rep["ran"] = true;
  rep["timeoutMs"] = timeoutMs;
  rep["ms"] = ms;
  rep["results"] = results;
  c.selfTestJson_ = jsonText(rep);
  ANYR_LOG(Info, c.ctx_.rank, "self-test (" << ms << " ms): " << jsonText(results));
}

SelfCheckResult* SelfTest::clearResults() {
  std::vector<SelfCheckResult> init(kMaxRuns);
  for (SelfCheckResult& r : init) r = SelfCheckResult{0, ~0ull, 0.0f, 0.0f, 0};
  ANYR_CUDA_CHECK(cudaMemcpyAsync(results_, init.data(), sizeof(SelfCheckResult) * kMaxRuns,
                                  cudaMemcpyHostToDevice, c_.ctx_.internalStream));
  return static_cast<SelfCheckResult*>(results_);
}

SelfTest::Outcome SelfTest::runAlgo(int algoInt) {
  Communicator& c = c_;
  const anyrAlgo_t algo = static_cast<anyrAlgo_t>(algoInt);
  const AlgoInfo& row = algoInfo(algo);
  const bool host = row.kind == AlgoKind::HostMemory;
  // The host algorithms run with the native wire here: a compressed wire (opt-in, lossy by
  // design) rounds the pattern's partial sums, so the exact check could not pass. The test is
  // of the segment, its mappings and flags, which every wire shares.
  struct NativeWire {
    HostArgs& t;
    int32_t saved;
    explicit NativeWire(HostArgs& a) : t(a), saved(a.wire) { t.wire = kWireNative; }
    ~NativeWire() { t.wire = saved; }
  } native(c.host_.hostTemplate_);
  const uint64_t cap = host ? c.host_.hostLayout_.launchBytes
                       : row.capacity == LaunchCapacity::PushSlot
                           ? c.workspace_.layout_.pushSlotBytes
                           : c.workspace_.layout_.chunkBytes;
  // A small fp32 message (one partial vector at the end) and a large bf16 one (many blocks,
  // odd count: a partial last vector too).
  struct Size {
    anyrDataType_t dtype;
    uint64_t count;
  };
  const Size sizes[] = {{anyrFloat32, 3001}, {anyrBfloat16, std::min(cap, kLargeBytes) / 2 - 5}};
  SelfCheckResult* res = clearResults();
  std::vector<Run> runs;
  int launchFailures = 0;
  std::string launchWhy;
  // ANYR_FAULT_INJECT=host-copy-selftest:R: rank R contributes the constant 1 instead of its
  // pattern, so every rank's host-copy check fails.
  const bool wrongInput = algo == anyrAlgoHostCopy &&
                          fault_.kind == FaultInjection::HostCopySelfTest &&
                          fault_.rank == c.ctx_.rank;
  for (const Size& sz : sizes) {
    const size_t bytes = sz.count * dtypeSize(sz.dtype);
    for (int rep = 0; rep < kReps; ++rep) {
      const bool inPlace = rep == kReps - 1;
      void* out = inPlace ? in_ : out_;
      ANYR_CUDA_CHECK(launchSelfTestFill(sz.dtype, in_, sz.count, wrongInput ? -1 : c.ctx_.rank,
                                         c.ctx_.internalStream));
      if (!inPlace) ANYR_CUDA_CHECK(cudaMemsetAsync(out_, 0xff, bytes, c.ctx_.internalStream));
      try {
        if (host) {
          c.launcher_.launchHostAlgo(algo, in_, out, sz.count, sz.dtype, c.ctx_.internalStream);
        } else {
          c.launcher_.launchPeerAlgo(algo, in_, out, sz.count, sz.dtype, c.ctx_.internalStream);
        }
      } catch (const Error& e) {
        ++launchFailures;
        launchWhy = e.what();
      }
      ANYR_CUDA_CHECK(launchSelfTestCheck(sz.dtype, out, sz.count, c.ctx_.nranks, res + runs.size(),
                                          c.ctx_.internalStream));
      runs.push_back({std::string(anyrAlgoName(algo)) + " " + std::to_string(sz.count) + " x " +
                          dtypeShortName(sz.dtype) + (inPlace ? " in place" : ""),
                      sz.count});
    }
  }
  return finish(runs, launchFailures, launchWhy);
}

SelfTest::Outcome SelfTest::runFused(int algoInt) {
  Communicator& c = c_;
  const anyrAlgo_t algo = static_cast<anyrAlgo_t>(algoInt);
  const uint64_t maxRows =
      c.fused_.fusedRowsPerLaunch(algo, static_cast<uint64_t>(kFusedHidden) * 2);
  // Each launch shape with its repetitions: 3 rows, up to 48 rows, and the two-shot register
  // form's dense launch (fusedTwoShotShape) where it applies, more rows than one block per SM,
  // once (the results hold kMaxRuns runs). A rows value may repeat (48 = the dense rows on a
  // GPU of 47 SMs); each entry keeps its own repetitions.
  struct Shape {
    int rows, reps;
  };
  std::vector<Shape> shapes = {{3, kReps},
                               {static_cast<int>(std::min<uint64_t>(maxRows, 48)), kReps}};
  const int denseRows = c.caps_.maxBlocks() + 1;
  const bool dense = algoInfo(algo).fused->denseForm &&
                     c.caps_.fusedDenseBlocks() > c.caps_.maxBlocks() &&
                     static_cast<uint64_t>(denseRows) <= maxRows && denseRows <= kFusedMaxRows;
  SelfCheckResult* res = clearResults();
  std::vector<Run> runs;
  int launchFailures = 0;
  std::string launchWhy;
  if (dense) shapes.push_back({denseRows, 1});
  for (const Shape& shape : shapes) {
    const int rows = shape.rows;
    const uint64_t count = static_cast<uint64_t>(rows) * kFusedHidden;
    for (int rep = 0; rep < shape.reps; ++rep) {
      ANYR_CUDA_CHECK(
          launchSelfTestFill(anyrBfloat16, in_, count, c.ctx_.rank, c.ctx_.internalStream));
      ANYR_CUDA_CHECK(cudaMemsetAsync(out_, 0xff, count * 2, c.ctx_.internalStream));
      // residualIn NULL: residualOut = the all-reduced rows, exact; normOut is written too
      // but not checked (it rounds).
      FusedParams p{};
      p.residualIn = nullptr;
      p.residualOut = out_;
      p.weight = weight_;
      p.normOut = norm_;
      p.epsilon = 1e-6f;
      p.tokens = rows;
      p.hidden = kFusedHidden;
      p.weightPlusOne = 0;
      p.quant = anyrQuantNone;
      // The communicator's own launch (arguments and grid).
      const cudaError_t e = c.fused_.launchFusedRows(
          algo, anyrBfloat16, in_, p, 0, rows,
          c.fused_.fusedClusterBlocks(rows, kFusedHidden, 0, algo, anyrBfloat16, anyrQuantNone),
          c.ctx_.internalStream);
      if (e != cudaSuccess) {
        ++launchFailures;
        launchWhy = std::string("launch failed: ") + cudaGetErrorString(e);
        (void)cudaGetLastError();
      }
      ANYR_CUDA_CHECK(launchSelfTestCheck(anyrBfloat16, out_, count, c.ctx_.nranks,
                                          res + runs.size(), c.ctx_.internalStream));
      runs.push_back({std::string("fused ") + anyrAlgoName(algo) + " " + std::to_string(rows) +
                          " x " + std::to_string(kFusedHidden) + " bf16 (residualOut)",
                      count});
    }
  }
  return finish(runs, launchFailures, launchWhy);
}

SelfTest::Outcome SelfTest::finish(const std::vector<Run>& runs, int launchFailures,
                                   const std::string& launchWhy) {
  Communicator& c = c_;
  // Bounded: every kernel gives up at the self-test deadline.
  c.ctx_.waitStreamIdle(c.ctx_.internalStream, "the self-test");
  std::vector<SelfCheckResult> got(kMaxRuns);
  ANYR_CUDA_CHECK(cudaMemcpyAsync(got.data(), results_, sizeof(SelfCheckResult) * kMaxRuns,
                                  cudaMemcpyDeviceToHost, c.ctx_.internalStream));
  c.ctx_.waitStreamIdle(c.ctx_.internalStream, "copying the self-test results");
  Outcome o;
  const int32_t code = *reinterpret_cast<volatile int32_t*>(&c.failure_.hostError()->code);
  if (code != kFailNone) {
    const ErrorRecord e = *const_cast<const ErrorRecord*>(c.failure_.hostError());
    o.ok = false;
    o.code = code;
    if (code == kFailTimeout) {
      o.why = "timed out after " +
              std::to_string(std::min(c.ctx_.cfg.timeoutMs, kSelfTestTimeoutMs)) +
              " ms waiting for rank " + std::to_string(e.waitedRank) + " (" + waitWhatName(e.what) +
              ", block " + std::to_string(e.block) + ")";
    } else if (code == kFailPeerAborted) {
      o.why = "stopped by rank " + std::to_string(e.waitedRank) + ", which failed first" +
              (e.cause > 0 ? " (waiting for rank " + std::to_string(e.cause - 1) + ")" : "");
    } else {
      o.why = "aborted (anyrCommAbort) during the self-test";
    }
    return o;
  }
  if (launchFailures > 0) {
    o.ok = false;
    o.why = launchWhy;
    return o;
  }
  for (size_t i = 0; i < runs.size(); ++i) {
    if (got[i].wrong == 0) continue;
    char buf[160];
    std::snprintf(buf, sizeof(buf), "%llu of %llu elements wrong (element %llu: got %g, want %g)",
                  got[i].wrong, static_cast<unsigned long long>(runs[i].count), got[i].firstBad,
                  static_cast<double>(got[i].got), static_cast<double>(got[i].want));
    o.ok = false;
    o.why = runs[i].desc + ": " + buf;
    return o;
  }
  return o;
}

std::string SelfTest::vote(const Outcome& mine, bool* anyFailed) {
  VoteWire w{};
  w.ok = mine.ok ? 1 : 0;
  w.code = mine.code;
  std::snprintf(w.why, sizeof(w.why), "%s", mine.why.c_str());
  const std::vector<VoteWire> all = c_.ctx_.bs->allGatherValue(w);
  // Name the rank that failed first: one whose wait was not merely stopped by a peer.
  int pick = -1, failedRanks = 0;
  for (int r = 0; r < c_.ctx_.nranks; ++r) {
    const VoteWire& v = all[static_cast<size_t>(r)];
    if (v.ok) continue;
    ++failedRanks;
    if (pick < 0 ||
        (all[static_cast<size_t>(pick)].code == kFailPeerAborted && v.code != kFailPeerAborted)) {
      pick = r;
    }
  }
  *anyFailed = pick >= 0;
  if (pick < 0) return "";
  const VoteWire& v = all[static_cast<size_t>(pick)];
  std::string why = "self-test failed on rank " + std::to_string(pick) + ": " +
                    std::string(v.why, strnlen(v.why, sizeof(v.why)));
  if (failedRanks > 1) why += " (" + std::to_string(failedRanks - 1) + " other rank(s) failed too)";
  return why;
}

void SelfTest::resetProtocolState() {
  Communicator& c = c_;
  // Every rank has waited for its own self-test kernels (finish), so after this barrier no
  // kernel of this communicator runs anywhere. Restore the init-time protocol state: flags and
  // the check area zero, the abort words clear, push slots cleared, epochs zero, no error.
  c.ctx_.bs->barrier();
  cudaStream_t s = c.ctx_.internalStream;
  if (c.workspace_.mapped()) {
    char* base = c.workspace_.peers_->local();
    const WorkspaceLayout& l = c.workspace_.layout_;
    ANYR_CUDA_CHECK(cudaMemsetAsync(base + l.flagsOffset, 0, l.pushOffset - l.flagsOffset, s));
    ANYR_CUDA_CHECK(cudaMemsetAsync(base + l.headerOffset + offsetof(WorkspaceHeader, abortedBy), 0,
                                    2 * sizeof(int32_t), s));  // abortedBy, abortCause
    c.workspace_.clearPushAreas(s);
    ANYR_CUDA_CHECK(cudaMemsetAsync(c.workspace_.dState_, 0, sizeof(LocalState), s));
  }
  if (c.host_.present()) {
    // The own region of the shared host segment: its flags, its low-latency lines and its
    // header's abort words (this rank is their only writer besides peers' abortedBy, and no
    // peer kernel runs now). The lines go back to tag 0 with the protocol's launch count: left
    // as the self-test wrote them, they carried the tags the next launches reuse, and a late
    // peer's line would have been taken from the self-test (host_oneshot_ll.cu).
    char* mine = c.host_.memory()->host() +
                 static_cast<uint64_t>(c.ctx_.rank) * c.host_.hostLayout_.rankBytes;
    std::memset(mine + c.host_.hostLayout_.flagsOffset, 0, sizeof(HostFlags));
    std::memset(mine + c.host_.hostLayout_.llOffset, 0, 2 * c.host_.hostLayout_.llBytes);
    std::memset(mine + c.host_.hostLayout_.headerOffset + offsetof(WorkspaceHeader, abortedBy), 0,
                2 * sizeof(int32_t));
    ANYR_CUDA_CHECK(cudaMemsetAsync(c.host_.dHostState_, 0, sizeof(LocalState), s));
  }
  c.ctx_.waitStreamIdle(s, "resetting after a failed self-test");
  std::memset(c.failure_.hostError(), 0, sizeof(ErrorRecord));
  c.ctx_.bs->barrier();
}

}  // namespace anyr
