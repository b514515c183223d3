// The communicator's lifecycle (create, init, destroy, abort) and its call path: each call is
// guarded (collectiveCall), checked, asks the selector for its path (select/decide.cc) and
// launches it through the NCCL path, the launcher (core/launch.cc) or the fused plan
// (core/fused_plan.cc).
#include "core/comm.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>
#include <vector>

#include "algo/algo.h"
#include "base/env.h"
#include "base/error.h"
#include "base/log.h"
#include "base/names.h"
#include "base/validate.h"
#include "core/explain.h"
#include "core/selftest.h"
#include "fused/fused.h"
#include "fused/fused_algo.h"
#include "transport/check.h"

namespace anyr {

namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

// ---------------------------------------------------------------------------------------------
// Creation
// ---------------------------------------------------------------------------------------------

std::unique_ptr<Communicator> Communicator::create(std::unique_ptr<Bootstrap> bs, const Config& cfg,
                                                   ncclComm_t externalNccl) {
  std::unique_ptr<Communicator> c(new Communicator());
  c->init(std::move(bs), cfg, externalNccl);
  return c;
}

void Communicator::init(std::unique_ptr<Bootstrap> bs, const Config& cfg, ncclComm_t externalNccl) {
  ctx_.bs = std::move(bs);
  ctx_.rank = ctx_.bs->rank();
  ctx_.nranks = ctx_.bs->size();
  if (ctx_.nranks > kMaxRanks) {  // an NCCL communicator's size (anyrCommInitRank checks its own)
    throwError(anyrInvalidArgument, "argument 'ncclComm': " + std::to_string(ctx_.nranks) +
                                        " ranks; a communicator takes at most " +
                                        std::to_string(kMaxRanks));
  }
  // First contact (core/capabilities.h): a machine without a driver or a GPU, or a GPU this
  // build has no kernels for, is told so in words with what to do, before any other CUDA call
  // can fail with a less telling error.
  requireDriverAndGpu();
  ANYR_CUDA_CHECK(cudaGetDevice(&ctx_.device));
  requireKernelsFor(ctx_.device);
  ANYR_CUDA_CHECK(cudaStreamCreateWithFlags(&ctx_.internalStream, cudaStreamNonBlocking));
  ANYR_CUDA_CHECK(cudaEventCreateWithFlags(&ctx_.lastWork, cudaEventDisableTiming));

  // Host-mapped failure record and abort word: kernels write/read them without any host
  // synchronization; the host reads them on every call.
  failure_.init();

  ctx_.agreeConfig(cfg);
  // Forced islands (rank 0's ANYR_ISLANDS) must put every rank in exactly one island: every rank
  // fails here alike.
  const std::string islands = islandsCoverError(ctx_.cfg.islands, ctx_.nranks);
  if (!islands.empty()) {
    throwError(anyrInvalidArgument, "environment variable ANYR_ISLANDS='" +
                                        islandsText(ctx_.cfg.islands) + "' (rank 0's): " + islands);
  }
  ctx_.facts.islands = ctx_.cfg.islands;
  calls_.init(*ctx_.bs, validateCallsFromEnv());
  // Scratch for the unfused composition of the fused op when normOut is NULL: at least 128
  // rows of the widest hidden size.
  scratchBytes_ = std::max<size_t>(ctx_.cfg.chunkBytes, 128ull * 16384 * 4);
  ANYR_CUDA_CHECK(cudaMalloc(&scratch_, scratchBytes_));
  ctx_.exchangeDeviceInfo();
  caps_.agreeGridCaps();
  nccl_.init(externalNccl);
  workspace_.init();
  workspace_.checkTransport();
  host_.init();
  // The fabric measured over the checked workspace and the host segment (or its cached record):
  // admission's slow-write rule and the seed cost model read its figures in decide().
  fabric_.atInit();
  caps_.probeProgrammaticLaunch();
  // Each peer, host and fused kernel then releases the next launch right after its own wait
  // (the fused two-shot's dense shape excepted: FusedPlan::launchFusedRows).
  workspace_.setReleaseEarly(caps_.releaseEarly());
  host_.setReleaseEarly(caps_.releaseEarly());
  caps_.probeClusters();
  caps_.probeNvfp4Encoder();
  decide();
  Tuner(*this).loadOrTuneAtInit();
  startEpochsForTests();
  ctx_.bs->barrier();
  // The application's calls are numbered from 1 (init made some of its own).
  failure_.resetCallCount();
  ANYR_LOG(Info, ctx_.rank,
           "communicator ready: " << ctx_.nranks << " ranks, device " << ctx_.device << ", "
                                  << ctx_.cfg.describe());
}

// ANYR_TEST_SYNC_EPOCH, ANYR_TEST_RING_USE and ANYR_TEST_PUSH_EPOCH (tests only): the flag
// algorithms' epoch
// (syncEpoch, device and host transport; flags left as they are), and the push families' epoch
// for the next launch, so that a test's calls run with flags 2^31 launches old or cross the
// push count's wrap. For the push epoch every phase of the push areas is cleared first, as a
// launch of any epoch expects of its current phase.
void Communicator::startEpochsForTests() {
  auto fill = [&](uint32_t* slots, int64_t value) {
    const std::vector<uint32_t> e(static_cast<size_t>(kMaxBlocks), static_cast<uint32_t>(value));
    ANYR_CUDA_CHECK(cudaMemcpyAsync(slots, e.data(), e.size() * sizeof(uint32_t),
                                    cudaMemcpyHostToDevice, ctx_.internalStream));
    ctx_.waitStreamIdle(ctx_.internalStream, "setting a test epoch");
  };
  const int64_t sync = ctx_.testValueOfRank0("ANYR_TEST_SYNC_EPOCH", UINT32_MAX);
  if (sync >= 0) {
    for (LocalState* st : {workspace_.state(), host_.state()}) {
      if (st != nullptr) fill(st->syncEpoch, sync);
    }
  }
  // ANYR_TEST_RING_USE: the ring's chunk counts (every stream, both roles) and this rank's ring
  // flags, which carry them, start at this value, so that a test's calls cross the counts' wrap
  // at 2^32. After a barrier: every rank's init kernels (the self-test's ring) have finished, so
  // no peer still writes these flags.
  const int64_t ring = ctx_.testValueOfRank0("ANYR_TEST_RING_USE", UINT32_MAX);
  if (ring >= 0 && ctx_.facts.peerMemory) {
    ctx_.bs->barrier();
    const std::vector<uint32_t> words(sizeof(RingFlags) / sizeof(uint32_t),
                                      static_cast<uint32_t>(ring));
    FlagArea* own = reinterpret_cast<FlagArea*>(workspace_.args().peerWorkspace[ctx_.rank] +
                                                workspace_.layout().flagsOffset);
    ANYR_CUDA_CHECK(cudaMemcpyAsync(&own->ring, words.data(), sizeof(RingFlags),
                                    cudaMemcpyHostToDevice, ctx_.internalStream));
    ANYR_CUDA_CHECK(cudaMemcpyAsync(workspace_.state()->ringUse, words.data(),
                                    sizeof(LocalState::ringUse), cudaMemcpyHostToDevice,
                                    ctx_.internalStream));
    ctx_.waitStreamIdle(ctx_.internalStream, "setting the ring's test counts");
    ANYR_LOG(Warn, ctx_.rank, "ANYR_TEST_RING_USE: the ring's chunk counts start at " << ring);
  }
  const int64_t push = ctx_.testValueOfRank0("ANYR_TEST_PUSH_EPOCH", kPushEpochPeriod - 1);
  if (push < 0 || !ctx_.facts.peerMemory) return;
  workspace_.clearPushAreas(ctx_.internalStream);
  fill(workspace_.state()->pushEpoch, push);
  fill(workspace_.state()->tsEpoch, push);
  ANYR_LOG(Warn, ctx_.rank, "ANYR_TEST_PUSH_EPOCH: push epochs start at " << push);
}

void Communicator::decide() {
  sel_.admit(ctx_.topo, ctx_.facts, ctx_.rank, ctx_.nranks);
  SelfTest(*this).run();  // may disable admitted paths, on every rank alike
  sel_.setThresholds(ctx_.topo, ctx_.cfg);
  if (ctx_.cfg.algorithm != anyrAlgoAuto) setAlgorithm(ctx_.cfg.algorithm);
  // Dispatch: candidates per operation and the seed table (select/dispatch.h); a tuning table
  // may replace the seed's choices in Tuner::loadOrTuneAtInit().
  sel_.seed(ctx_.topo, ctx_.cfg, caps_.clusterOn(), caps_.clusterReason());
  sel_.logAdmission();
}

void Communicator::abort() {
  failure_.raiseAbort();
  const bool byPeer = failure_.stoppedByPeer();
  failure_.setFailed(
      anyrAborted, "rank " + std::to_string(ctx_.rank) + ": communicator aborted by anyrCommAbort");
  // This rank's kernels still queued or in captured graphs must not pair with the peers'
  // calls, and the peers must not wait out their timeout for it (unless a peer's stop is what
  // failed this rank: the peers know, and the first stopper's note in their headers stays).
  failure_.stopEverywhere(kCauseAborted, "anyrCommAbort", false, !byPeer);
  nccl_.release(false);
}

// ---------------------------------------------------------------------------------------------
// All-reduce
// ---------------------------------------------------------------------------------------------

void Communicator::checkStream(cudaStream_t stream, bool capturing) const {
  // The stream's device can only be asked outside graph capture (the query is not permitted
  // on a capturing stream); a capture on another device's stream fails at instantiation.
  if (!capturing) checkStreamDevice(streamDevice(stream), ctx_.device);
}

void Communicator::validate(const void* sendbuff, void* recvbuff, size_t count,
                            anyrDataType_t dtype, anyrRedOp_t op, cudaStream_t stream,
                            bool capturing) const {
  checkDatatype(dtype);
  checkOp(op);
  checkStream(stream, capturing);
  if (count == 0) return;
  const size_t es = dtypeSize(dtype);
  checkCountFits(count, es, "count");
  for (auto [p, name] : {std::pair<const void*, const char*>{sendbuff, "sendbuff"},
                         std::pair<const void*, const char*>{recvbuff, "recvbuff"}}) {
    ANYR_REQUIRE_ARG(p != nullptr, name, "must not be NULL when count > 0");
    checkAligned(p, es, name);
    requireDevicePointer(p, name, ctx_.device);
  }
  const uintptr_t s = reinterpret_cast<uintptr_t>(sendbuff);
  const uintptr_t r = reinterpret_cast<uintptr_t>(recvbuff);
  const uintptr_t bytes = count * es;
  ANYR_REQUIRE_ARG(s == r || s + bytes <= r || r + bytes <= s, "recvbuff",
                   "overlaps sendbuff partially (must be the same pointer or disjoint)");
}

void Communicator::allReduce(const void* sendbuff, void* recvbuff, size_t count,
                             anyrDataType_t dtype, anyrRedOp_t op, cudaStream_t stream) {
  collectiveCall("anyrAllReduce", [&](bool& settled) {
    DeviceScope onDevice(ctx_.device);
    bool capturing = false;
    calls_.checked(
        *ctx_.bs, ctx_.rank, CallSignature::allReduce(count, dtype, op),
        [&] {
          capturing = streamCapturing(stream);
          validate(sendbuff, recvbuff, count, dtype, op, stream, capturing);
        },
        settled);
    failure_.requireHealthy(settled);
    if (count == 0) return;
    const size_t bytes = count * dtypeSize(dtype);
    if (ctx_.nranks == 1) {
      if (sendbuff != recvbuff) {
        ANYR_CUDA_CHECK(
            cudaMemcpyAsync(recvbuff, sendbuff, bytes, cudaMemcpyDeviceToDevice, stream));
      }
      return;
    }
    orderAfterLastWork(stream, capturing);
    const anyrAlgo_t algo = sel_.pathFor(Op::AllReduce, bytes).algo;
    counters_.note(algo, bytes, CallKind::AllReduce, sel_.algoForced(), capturing);
    if (algo == anyrAlgoNccl) {
      nccl_.allReduceSum(sendbuff, recvbuff, count, dtype, stream, ctx_.cfg.timeoutMs);
      noteWork(stream, capturing);
      return;
    }
    if (algo == anyrAlgoAuto) throwError(anyrUnsupported, "no all-reduce algorithm is admitted");
    launcher_.launchPeerAlgo(algo, sendbuff, recvbuff, count, dtype, stream);
    noteWork(stream, capturing);
  });
}

void Communicator::noteWork(cudaStream_t stream, bool capturing) {
  if (capturing) return;
  ANYR_CUDA_CHECK(cudaEventRecord(ctx_.lastWork, stream));
  ctx_.haveLastWork = true;
  ctx_.lastWorkStream = stream;
}

void Communicator::orderAfterLastWork(cudaStream_t stream, bool capturing) {
  // Calls on one communicator share its flags and epochs, so they must run one after the
  // other on the device even when the user alternates streams. During capture the graph's
  // position is the user's to order (an eager event cannot be waited on inside a capture).
  if (capturing || !ctx_.haveLastWork || stream == ctx_.lastWorkStream) return;
  ANYR_CUDA_CHECK(cudaStreamWaitEvent(stream, ctx_.lastWork, 0));
}

void Communicator::allReduceAddRmsNorm(const void* partial, const void* residualIn,
                                       void* residualOut, const void* weight, float epsilon,
                                       void* normOut, size_t tokens, size_t hidden,
                                       anyrDataType_t dtype, const anyrFusedOptions_t* options,
                                       cudaStream_t stream) {
  collectiveCall("anyrAllReduceAddRmsNorm", [&](bool& settled) {
    fusedCall(partial, residualIn, residualOut, weight, epsilon, normOut, tokens, hidden, dtype,
              options, stream, settled);
  });
}

void Communicator::fusedCall(const void* partial, const void* residualIn, void* residualOut,
                             const void* weight, float epsilon, void* normOut, size_t tokens,
                             size_t hidden, anyrDataType_t dtype, const anyrFusedOptions_t* options,
                             cudaStream_t stream, bool& settled) {
  DeviceScope onDevice(ctx_.device);
  bool capturing = false;
  FusedParams p{};
  auto check = [&] {
    capturing = streamCapturing(stream);
    checkStream(stream, capturing);
    p = makeFusedParams(partial, "partial", residualIn, residualOut, weight, epsilon, normOut,
                        tokens, hidden, dtype, options);
    if (tokens == 0) return;
    for (const FusedBuffer& b : fusedBuffers(partial, "partial", p)) {
      requireDevicePointer(b.ptr, b.name, ctx_.device);
    }
  };
  calls_.checked(*ctx_.bs, ctx_.rank,
                 CallSignature::fused(tokens, hidden, dtype, options ? options->quant : 0), check,
                 settled);
  failure_.requireHealthy(settled);
  if (tokens == 0) return;
  const size_t es = dtypeSize(dtype);
  const size_t rowBytes = hidden * es;
  const uint64_t bytes = static_cast<uint64_t>(tokens) * rowBytes;
  // The standalone epilogue on rows [rowBase, rowBase + rows) of the outputs, reading x (the
  // all-reduced rows, x row 0 = output row rowBase). rowBase is 0 or a multiple of 128, so the
  // swizzled NVFP4 scales shift by whole 128-row tiles.
  auto epilogueOn = [&](const void* x, int rowBase, int rows) {
    FusedParams q = p;
    const size_t r0 = static_cast<size_t>(rowBase);
    auto shift = [&](auto* ptr, size_t rowStride) {
      using P = decltype(ptr);
      return ptr == nullptr
                 ? ptr
                 : reinterpret_cast<P>(reinterpret_cast<uintptr_t>(ptr) + r0 * rowStride);
    };
    q.residualIn = shift(p.residualIn, rowBytes);
    q.residualOut = shift(p.residualOut, rowBytes);
    q.normOut = shift(p.normOut, rowBytes);
    q.quantOut = shift(p.quantOut, p.quant == anyrQuantNvfp4 ? hidden / 2 : hidden);
    q.blockScales = shift(p.blockScales, hidden / kNvfp4BlockElems);
    q.blockScalesSwizzled = shift(p.blockScalesSwizzled,
                                  static_cast<size_t>(swizzledPaddedCols(nvfp4ScaleCols(hidden))));
    q.tokens = rows;
    // The standalone kernel's automatic form; clusters where the communicator's probe passed.
    // It does not release the next launch early (docs/DESIGN.md, programmatic dependent launch).
    AddRmsNormLaunch l;
    l.clusters = caps_.clusterOn();
    l.pdl = caps_.pdlOn();
    l.hints = ctx_.cfg.epilogueHints;
    ANYR_CUDA_CHECK(launchAddRmsNormWith(dtype, x, q, stream, l));
  };
  if (ctx_.nranks == 1) {
    epilogueOn(partial, 0, static_cast<int>(tokens));
    noteWork(stream, capturing);
    return;
  }
  orderAfterLastWork(stream, capturing);
  // The path comes from the dispatch table (select/dispatch.h): the fused kernel or the
  // composition all-reduce + standalone epilogue, as seeded or measured per size bucket. The
  // fused kernel needs an admitted kernel that passed the startup self-test and at least one
  // row per launch's buffers (two-shot slots of a small ANYR_CHUNK_BYTES may not hold a wide
  // row); otherwise the composition, which chunks through the scratch buffer. Nothing here
  // depends on this rank's pointers (the kernels take any alignment): the fused kernel and
  // the composition cut a call into launches differently, so every rank must make the same
  // choice.
  const Path path = sel_.pathFor(p.quant != anyrQuantNone ? Op::AddRmsNormQuant : Op::AddRmsNorm,
                                 bytes, p.hidden);
  const anyrAlgo_t algo = path.algo;
  if (algo == anyrAlgoAuto) throwError(anyrUnsupported, "no all-reduce algorithm is admitted");
  const size_t maxRows = static_cast<size_t>(fused_.fusedRowsPerLaunch(algo, rowBytes));
  const bool fusedKernel = sel_.fusedKernelFor(path, maxRows, p.hidden);
  counters_.note(algo, bytes, fusedKernel ? CallKind::FusedKernel : CallKind::FusedComposed,
                 sel_.algoForced(), capturing);
  if (fusedKernel) {
    for (size_t row = 0; row < tokens; row += maxRows) {
      const int rows = static_cast<int>(std::min(maxRows, tokens - row));
      const int clusterBlocks =
          fused_.fusedClusterBlocks(rows, p.hidden, path.cluster, algo, dtype, p.quant);
      const cudaError_t e =
          fused_.launchFusedRows(algo, dtype, static_cast<const char*>(partial) + row * rowBytes, p,
                                 static_cast<int>(row), rows, clusterBlocks, stream);
      if (e != cudaSuccess) {
        throwError(anyrCudaError, std::string("launching fused ") + anyrAlgoName(algo) + ": " +
                                      cudaGetErrorString(e));
      }
      counters_.noteFusedLaunch(clusterBlocks);
    }
    noteWork(stream, capturing);
    return;
  }
  // Unfused composition: all-reduce into normOut (or, without it, the scratch buffer), then the
  // standalone epilogue kernel on it: NCCL, the pull and host algorithms, and what the table picks.
  // Chunks of the scratch buffer's rows either way: normOut may be NULL on one rank and not on
  // another (a quantized output alone), and the ranks' all-reduce launches must match.
  // normOut in place of residualIn would be overwritten by the all-reduce before the epilogue
  // reads the residual: the scratch buffer then.
  const size_t chunkRows = scratchBytes_ / rowBytes / 128 * 128;
  const bool intoNormOut = normOut != nullptr && normOut != residualIn;
  for (size_t row = 0; row < tokens; row += chunkRows) {
    const size_t rows = std::min(chunkRows, tokens - row);
    void* x = intoNormOut ? static_cast<char*>(normOut) + row * rowBytes : scratch_;
    const void* src = static_cast<const char*>(partial) + row * rowBytes;
    if (algo == anyrAlgoNccl) {
      nccl_.allReduceSum(src, x, rows * hidden, dtype, stream, ctx_.cfg.timeoutMs);
    } else {
      launcher_.launchPeerAlgo(algo, src, x, rows * hidden, dtype, stream);
    }
    epilogueOn(x, static_cast<int>(row), static_cast<int>(rows));
  }
  noteWork(stream, capturing);
}

void Communicator::setAlgorithm(anyrAlgo_t algo) {
  // Collective: the ranks' kernels must take the same algorithm, so a rank that refuses the
  // change while its peers make it would pair differently shaped launches.
  collectiveCall("anyrCommSetAlgorithm", [&](bool& settled) {
    auto check = [&] {
      ANYR_REQUIRE_ARG(
          algo >= 0 && algo < anyrNumAlgos, "algorithm",
          "must be one of " + algoNames() + " (0.." + std::to_string(anyrNumAlgos - 1) + ")");
      if (ctx_.nranks > 1) {
        const std::string err = overrideError(sel_.admission(), algo);
        // Admission is agreed at init: every rank refuses the same algorithm alike, and none
        // changes what it runs, so nothing can pair wrongly.
        settled = !err.empty();
        if (!err.empty()) throwError(anyrUnsupported, err);
      }
    };
    calls_.checked(*ctx_.bs, ctx_.rank, CallSignature::setAlgorithm(algo), check, settled);
    failure_.requireHealthy(settled);
    sel_.setForced(algo);
  });
}

void Communicator::forcePath(const std::function<ForcedPath()>& judge) {
  collectiveCall("anyrCommForcePath", [&](bool& settled) {
    const ForcedPath f = judge();
    failure_.requireHealthy(settled);
    if (f.clear) {
      sel_.clearForcedPath(f.op);
      return;
    }
    try {
      sel_.forcePath(f.op, f.path);
    } catch (const Error& e) {
      // Admission and the cluster probe are agreed at init: every rank refuses such a path
      // alike and none changes what it runs.
      settled = e.code() == anyrUnsupported;
      throw;
    }
  });
}

anyrAlgo_t Communicator::queryAlgorithm(size_t count, anyrDataType_t dtype) const {
  ANYR_REQUIRE_ARG(dtype >= 0 && dtype < anyrNumTypes, "datatype", "unsupported datatype");
  checkCountFits(count, dtypeSize(dtype), "count");
  if (ctx_.nranks == 1) return anyrAlgoAuto;
  std::lock_guard<std::mutex> lock(sel_.tableMu());  // anyrCommTune may be installing a table
  return sel_.pathFor(Op::AllReduce, count * dtypeSize(dtype)).algo;
}

std::string Communicator::explainJson() const {
  return Explainer(ctx_, sel_, caps_, workspace_, host_, fused_, fabric_, selfTestJson_)
      .explainJson();
}

TuningTable Communicator::tune(const TuneOptions& o, const TuneProgress& progress) {
  return tune([&](TuneProgress* p) {
    *p = progress;
    return o;
  });
}

TuningTable Communicator::tune(const std::function<TuneOptions(TuneProgress* progress)>& judge) {
  // One call from start to end: its measurements, forced paths and new table are not to
  // interleave with another thread's calls, nor to outlive an anyrCommDestroy. Collective: a
  // rank that refuses it or fails in it stops the communicator on every rank (collectiveCall).
  TuningTable result;
  collectiveCall("anyrCommTune", [&](bool& settled) {
    TuneProgress progress;
    const TuneOptions local = judge(&progress);
    ANYR_REQUIRE_ARG(local.budgetMs >= 0, "budgetMs", "must be >= 0 (0 = no limit)");
    // Every rank refuses a single-rank communicator alike.
    settled = ctx_.nranks <= 1;
    ANYR_REQUIRE_ARG(ctx_.nranks > 1, "comm", "tuning needs 2 ranks or more");
    failure_.requireHealthy(settled);
    TuneProgress report;
    if (progress) {
      report = [this, &progress](int done, int total, const std::string& what) {
        CallGuard::CallbackScope inCallback(calls_);
        progress(done, total, what);
      };
    }
    result = Tuner(*this).tuneHealthy(local, report);
  });
  return result;
}

// ---------------------------------------------------------------------------------------------
// Teardown
// ---------------------------------------------------------------------------------------------

void Communicator::destroy() {
  // Refused (anyrInvalidUsage, nothing freed) while another thread is inside a call.
  CallGuard::Scope busy(calls_, "anyrCommDestroy");
  // 1. This rank's launched work (bounded: our kernels give up at the timeout).
  if (ctx_.haveLastWork) {
    auto deadline = Clock::now() +
                    std::chrono::milliseconds(ctx_.cfg.timeoutMs + CommContext::kTeardownGraceMs);
    while (cudaEventQuery(ctx_.lastWork) == cudaErrorNotReady && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    if (cudaEventQuery(ctx_.lastWork) == cudaErrorNotReady) {
      // Only NCCL's kernels wait without a bound of ours (a peer gone mid-call).
      nccl_.markTeardownUnclean();
      ANYR_LOG(Warn, ctx_.rank,
               "destroy: this rank's last call had not finished after "
                   << ctx_.cfg.timeoutMs + CommContext::kTeardownGraceMs
                   << " ms; aborting NCCL instead of destroying it");
    }
    (void)cudaGetLastError();
  }
  // 2. Peers must stop reading this rank's memory before it is freed.
  if (!failure_.failed() && ctx_.bs) {
    try {
      ctx_.bs->barrier();
    } catch (const Error& e) {
      nccl_.markTeardownUnclean();
      ANYR_LOG(Warn, ctx_.rank, "destroy: peers did not all reach teardown: " << e.what());
    }
  }
  // A refusal by another thread that no call has applied yet (collectiveCall).
  failure_.applyPendingStop();
  // 3. The frees in the destructor wait for every kernel of this process's context. Where this
  // rank's work may still be queued or running -- a failed communicator, an unfinished last
  // call, graph replays (not tracked by ctx_.lastWork) -- stop it: its kernels that start now
  // return at once and those waiting give up at their next check, so the frees wait for
  // nothing of this communicator's beyond that, and the peers are told not to wait for it.
  (void)failure_.asyncError(
      nullptr);  // a failure a kernel recorded since the last call counts here
  if (failure_.failed() || !nccl_.teardownClean()) {
    failure_.raiseAbort();
    // A rank that a peer stopped tells nobody: the peers know, and the first stopper's note in
    // their headers stays (it names the cause their errors report).
    failure_.stopEverywhere(kCauseAborted, "anyrCommDestroy", false, !failure_.stoppedByPeer());
  }
}

Communicator::~Communicator() {
  // NCCL first: after a failure its kernels may still wait for a dead peer, and only
  // ncclCommAbort releases them; cudaFree below would otherwise wait for them forever.
  nccl_.release(!failure_.failed() && nccl_.teardownClean());
  // Then, in this order: the peer mapping; host-copy's resources, the host segment and the host
  // transport's device state; the peer workspace's device state.
  workspace_.releaseMapping();
  host_.release();
  workspace_.freeState();
  if (scratch_ != nullptr) (void)cudaFree(scratch_);
  if (ctx_.lastWork != nullptr) (void)cudaEventDestroy(ctx_.lastWork);
  if (ctx_.internalStream != nullptr) (void)cudaStreamDestroy(ctx_.internalStream);
  failure_.freeHostMapped();
  (void)cudaGetLastError();
}

}  // namespace anyr
