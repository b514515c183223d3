// The communicator: host control plane. Owns the bootstrap, the agreed topology and
// configuration, the peer-mapped workspace, the NCCL communicator, the admission and
// thresholds, and the failure state. Launches the device algorithms (src/algo).
#pragma once

#include <nccl.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "algo/algo.h"
#include "anyreduce/anyreduce.h"
#include "base/config.h"
#include "bootstrap/bootstrap.h"
#include "core/call_guard.h"
#include "core/counters.h"
#include "device/handles.h"
#include "device/vectors.h"
#include "select/admission.h"
#include "select/dispatch.h"
#include "select/tuning.h"
#include "topology/topology.h"
#include "transport/host_layout.h"
#include "transport/host_memory.h"
#include "transport/nccl_comm.h"
#include "transport/peer_memory.h"

namespace anyr {

struct FusedParams;

// The most ranks a communicator takes: it keeps every pair's link facts (nranks^2 records).
constexpr int kMaxRanks = 1024;

class Communicator {
 public:
  // Collective: every rank of `bs` calls it. `externalNccl` (may be null) is used instead of
  // creating an NCCL communicator, and is not destroyed with this one.
  static std::unique_ptr<Communicator> create(std::unique_ptr<Bootstrap> bs, const Config& cfg,
                                              ncclComm_t externalNccl);
  ~Communicator();

  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // Collective teardown: waits (bounded) for this rank's launched work, then for every peer
  // to stop using this rank's memory, then frees. Errors are logged, not thrown.
  void destroy();
  void abort();

  void allReduce(const void* sendbuff, void* recvbuff, size_t count, anyrDataType_t dtype,
                 anyrRedOp_t op, cudaStream_t stream);
  void allReduceAddRmsNorm(const void* partial, const void* residualIn, void* residualOut,
                           const void* weight, float epsilon, void* normOut, size_t tokens,
                           size_t hidden, anyrDataType_t dtype, const anyrFusedOptions_t* options,
                           cudaStream_t stream);
  void setAlgorithm(anyrAlgo_t algo);
  // allReduceAddRmsNorm's body, under collectiveCall.
  void fusedCall(const void* partial, const void* residualIn, void* residualOut, const void* weight,
                 float epsilon, void* normOut, size_t tokens, size_t hidden, anyrDataType_t dtype,
                 const anyrFusedOptions_t* options, cudaStream_t stream, bool& settled);
  anyrAlgo_t queryAlgorithm(size_t count, anyrDataType_t dtype) const;
  std::string explainJson() const;

  // ---- Dispatch (select/dispatch.h; measuring in core/tune.cc) ----
  // The path a call of `op` with `bytes` takes: a forced path, else a forced algorithm, else
  // the table. O(1); no synchronization. `hidden`: the row width of a fused call, which keeps
  // a measured cluster size only at the width the table was measured at (0: keep it).
  Path pathFor(Op op, uint64_t bytes, int hidden = 0) const;
  // Internal (tuning, `bench --check-dispatch`): force one path of one operation; `clear`
  // restores dispatch. Collective like setAlgorithm. Throws for a path not admitted.
  void forcePath(Op op, Path p);
  void clearForcedPath(Op op);
  const std::vector<Candidate>& candidatesOf(Op op) const {
    return candidates_[static_cast<size_t>(op)];
  }
  const DispatchTable& dispatchTable() const { return dispatch_; }
  const TuningTable* tuned() const { return tuned_.get(); }
  std::string explainText() const;        // takes tableMu_
  std::string explainTextLocked() const;  // with tableMu_ held
  struct TuneOptions {
    uint64_t minBytes = 1024, maxBytes = 256ull << 20;  // all-reduce sizes, powers of two
    int hidden = 6144, maxTokens = 2048;                // fused: 1, 2, 4 .. maxTokens tokens
    int budgetMs = 0;                                   // 0: no limit
    int calls = 20, samples = 9;                        // per sample (one graph), median
  };
  using TuneProgress = std::function<void(int done, int total, const std::string& what)>;
  // Collective. Measures, agrees (slowest rank counts, rank 0 decides and broadcasts), and
  // installs the result; returns it. `progress` is called on rank 0 only.
  TuningTable tune(const TuneOptions& o, const TuneProgress& progress);
  TuningTable tuneHealthy(const TuneOptions& o, const TuneProgress& progress);  // tune's body
  // The cluster sizes tuning measures besides the automatic rule's for `tokens` rows of
  // `hidden` (bf16, quantization `quant`) in fused kernel `algo` (none where clusters are off,
  // configured, or not taken).
  std::vector<int> clusterSizesToMeasure(anyrAlgo_t algo, int tokens, int hidden, int quant) const;

  // anyrSuccess, or the failure recorded by device waits / abort; *msg receives the text.
  anyrResult_t asyncError(std::string* msg);

  // Runs one collective call (all-reduce, fused, setAlgorithm, tune) under the call guard:
  // body(settled). A call this rank refuses -- bad arguments, another thread inside a call, a
  // launch that failed -- may already have been made by its peers, whose kernels then wait for
  // this rank's part; were this rank to go on, its next call would pair with their pending one
  // and every later sum would be wrong. So a refusal fails the communicator here (refuse):
  // later calls are refused, this rank's queued and graph-captured kernels do nothing, and the
  // peers are stopped, so their matching call fails at once naming this rank and what it
  // refused. Nothing is repaired where nothing can pair wrongly: a communicator that had
  // already failed, and a call every rank refused together in validation mode (the body sets
  // `settled` once the ranks agreed on the call). The refusal's own error is rethrown as is.
  template <typename Body>
  void collectiveCall(const char* fn, Body&& body);

  int rank() const { return rank_; }
  int size() const { return nranks_; }
  int device() const { return device_; }
  ncclComm_t nccl() const { return nccl_.get(); }
  CommCounters& counters() { return counters_; }

 private:
  friend class SelfTest;  // core/selftest.cc: runs the startup self-test on the internals
  Communicator() = default;
  void init(std::unique_ptr<Bootstrap> bs, const Config& cfg, ncclComm_t externalNccl);
  void exchangeDeviceInfo();
  void agreeConfig(const Config& local);
  void initNccl(ncclComm_t externalNccl);
  void initTransport();
  // Part of initTransport: sets peers_ by cfg_.peerMemory (auto: cuda-ipc, else vmm where that
  // maps more pairs) and peerMemoryNote_; leaves peers_ null, with facts_.peerMemoryReason, when
  // no kind could be set up. Collective; every rank takes the same kind.
  void mapPeerMemory();
  // Collective: what `m` maps, the same on every rank. `mapped`: ordered pairs (r, p) where rank
  // r mapped rank p's workspace; `reachableUnmapped`: unmapped pairs whose devices reach each
  // other (the driver's peer access, or one GPU); `text`: "M of P ordered pairs mapped", and the
  // first rank's first unmapped peer with its reason.
  struct MapSummary {
    int mapped = 0;
    int reachableUnmapped = 0;
    std::string text;
  };
  MapSummary summarize(const PeerMemory& m);
  // Which kind maps the workspace and why, or "none (why not)" (explain).
  std::string peerMemoryText() const;
  void checkTransport();
  void decide();
  void loadOrTuneAtInit();
  // Applies a tuning table (agreed by every rank) over the current dispatch table and keeps it
  // for explain; `what` prefixes its warnings in the log.
  void installTuning(const TuningTable& table, const char* what, const std::string& note);
  double timePath(Op op, uint64_t bytes, int tokens, int hidden, void* const* bufs, int calls,
                  int samples, cudaStream_t s);
  // Tuning, after a fused kernel won a point: its cluster sizes measured against the
  // automatic rule (clusterSizesToMeasure); a size that wins goes into tp->choice ("/cN").
  void tuneClusterSize(Op op, Path chosen, int tokens, const TuneOptions& o, void* const* bufs,
                       cudaStream_t s, TunedPoint* tp, int* done, int* total,
                       const TuneProgress& progress);
  void throwIfFailed();
  // Whether this rank failed because a peer told it to stop (its ErrorRecord says so): such a
  // rank does not tell the peers again at abort or destroy.
  bool stoppedByPeer() const;
  void noteWork(cudaStream_t stream, bool capturing);
  void checkStream(cudaStream_t stream, bool capturing) const;
  void validate(const void* sendbuff, void* recvbuff, size_t count, anyrDataType_t dtype,
                anyrRedOp_t op, cudaStream_t stream, bool capturing) const;
  void launchPeerAlgo(anyrAlgo_t algo, const void* in, void* out, size_t count,
                      anyrDataType_t dtype, cudaStream_t stream);
  LaunchShape shapeFor(anyrAlgo_t algo, uint64_t numVecs) const;
  // Fills the push receive areas of this rank's workspace with the clear pattern (at init, and
  // after a failed self-test).
  void clearPushAreas(cudaStream_t s);
  // This rank's workspace header (peer workspace, or its region of the host segment).
  WorkspaceHeader headerOfThisRank(uint64_t layoutHash) const;
  // A device copy of the bounded-wait control of one transport: its local state, this rank's
  // header and its peers' (nranks_ entries), the communicator's abort word, error record and
  // timeout.
  WaitControl* newWaitControl(LocalState* state, WorkspaceHeader* ownHeader,
                              WorkspaceHeader* const* peerHeaders);
  // Rows of rowBytes one fused-kernel launch of `algo` carries: a one-shot push slot's worth,
  // or a two-shot segment slot's worth per rank (rows are 16-byte vectors; 0: not one row).
  uint64_t fusedRowsPerLaunch(anyrAlgo_t algo, uint64_t rowBytes) const;
  // One launch of the fused kernel of `algo` (one-shot or two-shot push) on `rows` rows of
  // p.hidden elements starting at `rowsIn` (output rows rowBase..), with the communicator's
  // grid (fused/fused_algo.h), in thread-block clusters of `clusterBlocks` blocks (1: a block
  // per row; from fusedClusterBlocks). Calls and the startup self-test both launch through here.
  cudaError_t launchFusedRows(anyrAlgo_t algo, anyrDataType_t dtype, const void* rowsIn,
                              const FusedParams& p, int rowBase, int rows, int clusterBlocks,
                              cudaStream_t stream);
  // The cluster size a fused launch of `rows` rows of `hidden` takes (1: a block per row): the
  // configured setting (config.fusedCluster), else pathCluster (the dispatch path's measured
  // size, Path::cluster; 0: none), else the automatic rule (fused_algo.h); 1 where clusters
  // are off.
  int fusedClusterBlocks(int rows, int hidden, int pathCluster, anyrAlgo_t algo,
                         anyrDataType_t dtype, int quant) const;
  // Runs a message as launches of at most capacityBytes each (piece boundaries are multiples of
  // 16 bytes, so alignment is kept): launch(args, shape) per piece, where args is `tmpl`
  // (AllReduceArgs or HostArgs) with the piece's input, output, count and 16-byte vectors; a
  // launch error throws, naming the algorithm. Shared by the peer and host paths. A template,
  // not a std::function: the callers' lambdas capture more than std::function stores inline,
  // and this runs on every eager call.
  template <typename Args, typename Launch>
  void launchInPieces(anyrAlgo_t algo, const Args& tmpl, const void* in, void* out, size_t count,
                      anyrDataType_t dtype, uint64_t capacityBytes, Launch&& launch);
  [[noreturn]] static void throwLaunchFailed(anyrAlgo_t algo, cudaError_t e);
  // Host-memory transport (comm_host.cc).
  void initHostTransport();
  // Programmatic dependent launch: unless ANYR_PDL=0, probed once (topology/probe_kernels.h)
  // and, where the probe works, used for every kernel the communicator launches on the caller's
  // stream (algorithms, fused kernels, the epilogue). Timing only: ranks need not agree on it.
  int64_t testValueOfRank0(const char* name, int64_t max);
  void startEpochsForTests();
  cudaError_t probeOnStream(const char* what, size_t bytes, void* hostOut,
                            const std::function<cudaError_t(void*, cudaStream_t)>& launch);
  void probeProgrammaticLaunch();
  // Thread-block clusters for the fused one-shot (fused_algo.h): admitted where every rank's
  // probe launch worked and the agreed config does not turn them off.
  void probeClusters();
  void probeNvfp4Encoder();
  // The cluster size the fused kernels take for a few row counts of hidden kClusterSampleHidden
  // (1: a block per row, and always 1 where clusters are off): what explain reports, in its
  // JSON and its text alike.
  static constexpr int kClusterSampleHidden = 6144;
  std::vector<std::pair<int, int>> clusterSizeSamples() const;
  // The settings a tuning table records beside the machine (select/tuning.h): the agreed ones
  // that shape kernels, hence the times a table holds.
  std::vector<std::string> tuningSettings() const;
  void launchHostAlgo(anyrAlgo_t algo, const void* in, void* out, size_t count,
                      anyrDataType_t dtype, cudaStream_t stream);
  void explainHost(void* json) const;  // nlohmann::json*
  // host-copy (host_copy.cu): its device staging, streams and events, made with the transport.
  void initHostCopy();
  void freeHostCopy();
  // Waits until `s` is idle, at most the timeout plus graceMs (graceMs: for work whose own
  // waits, bounded by the timeout, start after this wait does, so that their failure, which
  // names the rank waited for, is reported rather than this wait's).
  // Whether `s` became idle within `ms` (a CUDA error other than not-ready throws).
  bool streamIdleWithin(cudaStream_t s, int ms);
  bool eventDoneWithin(cudaEvent_t e, int ms);  // likewise for an event
  template <typename Query>
  bool doneWithin(Query&& query, int ms);
  void waitStreamIdle(cudaStream_t s, const char* what, int graceMs = 0);
  // The grace past the timeout of host waits for work whose own waits may have started later
  // (teardown, tuning's measurements).
  static constexpr int kTeardownGraceMs = 5000;

  int rank_ = -1;
  int nranks_ = 0;
  int device_ = -1;
  Config cfg_;
  std::unique_ptr<Bootstrap> bs_;
  Topology topo_;  // rank-indexed: gpus[r] is rank r's GPU, pairs confirmed at init
  CommFacts facts_;
  Admission admission_;
  Thresholds thresholds_;
  std::atomic<int> forced_{anyrAlgoAuto};
  CommCounters counters_;  // one note() per dispatch
  DispatchTable dispatch_{};
  std::array<std::vector<Candidate>, kNumOps> candidates_;
  std::array<std::atomic<int>, kNumOps> forcedPath_{};  // -1: none; else algo | kernel << 8
  std::array<bool, anyrNumAlgos> fusedKernelOk_{};      // fused kernel of this algorithm admitted
  // The dispatch table and what tuning installed in it (dispatch_, tuned_, tunedClusterHidden_,
  // tuningNote_) are rewritten by anyrCommTune under the call guard, and read by the calls under
  // the same guard; explain and the algorithm query take no guard (they must not be refused
  // while a call runs), so they and tune's writes take tableMu_.
  mutable std::mutex tableMu_;
  std::unique_ptr<TuningTable> tuned_;
  int tunedClusterHidden_ = 0;  // the installed table's hidden (its cluster sizes hold there)
  std::string tuningNote_;

  NcclHandle nccl_;
  // destroy() found this rank's work unfinished at its deadline, or the peers not at teardown:
  // the NCCL communicator is then aborted, not destroyed (ncclCommDestroy would wait for it).
  bool teardownClean_ = true;

  std::unique_ptr<PeerMemory> peers_;
  std::string peerMemoryNote_;  // with peers_: which kind maps the workspace, and why
  WorkspaceLayout layout_{};
  LocalState* dState_ = nullptr;
  WaitControl* dWait_ = nullptr;
  std::unique_ptr<HostMemory> host_;  // shared pinned host segment (host-oneshot/-twoshot)
  HostLayout hostLayout_{};
  LocalState* dHostState_ = nullptr;  // the host transport's own epochs and fail claim
  WaitControl* dHostWait_ = nullptr;
  HostArgs hostTemplate_{};
  struct HostCopyResources {
    char* sendStage = nullptr;  // device: the own compressed chunks of one launch
    char* recvStage = nullptr;  // device: (nranks - 1) peers' chunks of one launch
    cudaStream_t d2h = nullptr, sig = nullptr, poll = nullptr, h2d = nullptr;
    cudaEvent_t fork = nullptr, signaled = nullptr;
    std::vector<cudaEvent_t> copied, arrived, recv, packed;  // one per chunk of a launch
  };
  HostCopyResources copy_;
  void* scratch_ = nullptr;  // all-reduce target of the unfused fused-op path
  size_t scratchBytes_ = 0;
  void* hostMapped_ = nullptr;  // ErrorRecord followed by the abort word
  ErrorRecord* hError_ = nullptr;
  volatile int32_t* hAbort_ = nullptr;
  ErrorRecord* dError_ = nullptr;
  const int32_t* dAbort_ = nullptr;
  AllReduceArgs argsTemplate_{};
  int maxBlocks_ = 1;   // fused and host kernels: one block per SM of the smallest GPU
  int peerBlocks_ = 1;  // peer all-reduce kernels: up to kPeerBlocksPerSm per SM (occupancy)
  int peerPerSm_ = 1;   // the agreed blocks per SM of the peer kernels
  // The fused two-shot register form's grid cap at kFusedDenseThreads threads a block
  // (fusedTwoShotShape): above maxBlocks_ where every rank holds two such blocks per SM.
  int fusedDenseBlocks_ = 1;
  // The fused cluster forms at two blocks per SM (fused/fused_algo.h, fusedClusterPairBlocks):
  // per kernel variant (one-shot / two-shot x fp16 / bf16 x none / FP8 / NVFP4, aligned
  // buffers) the largest block size at which every rank holds two of its blocks per SM (0:
  // none), and the grid cap there (two per SM of the smallest GPU, within config.maxBlocks and
  // kMaxBlocks; 0 where not admitted).
  static constexpr int kClusterPairVariants = 12;
  std::array<int, kClusterPairVariants> clusterPairThreads_{};
  int clusterPairBlocks_ = 0;
  // The index of the (algo: one-shot push, else two-shot push; dtype; quant) variant in
  // clusterPairThreads_, -1 for a dtype or mode without a cluster kernel.
  static int clusterPairVariant(anyrAlgo_t algo, anyrDataType_t dtype, int quant);
  int clusterPairThreads(anyrAlgo_t algo, anyrDataType_t dtype, int quant) const;
  std::string clusterPairThreadsJson() const;  // JSON text, by form, dtype and quantization
  // The grid cap of a cluster-form launch of `rows` rows (0: any) of `hidden` in clusters of
  // `clusterBlocks` of the (algo, dtype, quant) variant: maxBlocks_ where the rows fit one block
  // per SM, else two per SM where that variant's blocks fit it.
  int clusterGridCap(int hidden, int clusterBlocks, int rows, anyrAlgo_t algo, anyrDataType_t dtype,
                     int quant) const;
  cudaStream_t internalStream_ = nullptr;
  cudaEvent_t lastWork_ = nullptr;  // recorded after eager launches (not during capture)
  bool haveLastWork_ = false;
  // Concurrency and validation mode (core/call_guard.h): one call at a time; a call on another
  // stream than the previous eager call's first waits for lastWork_, so calls stay sequential.
  CallGuard calls_;
  cudaStream_t lastWorkStream_ = nullptr;
  void orderAfterLastWork(cudaStream_t stream, bool capturing);

  // Startup self-test (core/selftest.cc) report (JSON). What it disabled is in admission_.
  std::string selfTestJson_;
  bool pdlOn_ = false;  // asked for (ANYR_PDL) and the probe launch worked
  std::string pdlReason_;
  bool clusterOn_ = false;  // every rank's cluster probe passed and config.fusedCluster != 1
  std::string clusterReason_;
  bool nvfp4Instruction_ = false;  // the NVFP4 encoder uses the e2m1 conversion instruction
  std::string nvfp4Reason_;

  std::mutex failMu_;
  std::atomic<int> failCode_{anyrSuccess};
  std::string failMsg_;
  void setFailed(anyrResult_t code, const std::string& msg);

  // Refusals (collectiveCall). callCount_: collective calls entered on this rank since init
  // (the number a refusal names). A refusal by a thread that found another inside a call is
  // applied (the communicator failed, the kernels and the peers stopped) when the holder's call
  // is launched, or at the next call's entry (stopPending_), so the holder's own call, which
  // the peers have matched, is neither refused nor cut short.
  uint64_t callCount_ = 0;
  std::atomic<bool> stopPending_{false};
  std::atomic<bool> stopped_{false};  // stopEverywhere ran (it runs once)
  std::string stopWhat_;              // under failMu_: what to write in the peers' headers
  std::string pendingFailMsg_;        // under failMu_: the refusal's message, until applied
  std::mutex stopNoteMu_;             // stopNote's use of the pinned read-back staging
  void refuse(const char* fn, const Error& e, bool holdingGuard);
  // Pinned staging of stopEverywhere's copies and stopNote's read-back, in hostMapped_ after
  // the ErrorRecord and the abort word (asynchronous copies need a pinned source).
  struct StopStaging {
    int32_t one;
    int32_t cause;
    int32_t by;
    uint32_t call;
    char what[28];
    int32_t pad[7];
    WorkspaceHeader readBack;
  };
  static constexpr size_t kStopStagingOffset = 64;
  static constexpr size_t kHostMappedBytes = kStopStagingOffset + sizeof(StopStaging);
  StopStaging* stopStaging() {
    return reinterpret_cast<StopStaging*>(static_cast<char*>(hostMapped_) + kStopStagingOffset);
  }
  void applyPendingStop();
  // In every collective call after its argument check (arguments are judged first, also on a
  // failed communicator): throws the communicator's failure, which is `settled` (nothing new
  // to repair); else clears `settled`, since from here on a failure is this rank's alone.
  void requireHealthy(bool& settled);
  // Sets this rank's failClaim in each transport's state (its kernels that start afterwards
  // make nothing visible to a peer: dev::stopRequested) and writes {stopCall, stopWhat, abortCause
  // = cause, abortedBy = this rank} into every peer's headers, so that their waits stop.
  // Waits for this rank's last eager work first when `afterOwnWork` (bounded by the timeout);
  // without `tellPeers`, stops this rank's kernels only. Best effort and bounded: failures are
  // logged.
  void stopEverywhere(int32_t cause, const std::string& what, bool afterOwnWork,
                      bool tellPeers = true);
  // What a peer that stopped this rank from its host wrote in this rank's headers:
  // "call #N: WHAT", or empty.
  std::string stopNote();
};

// Workspace layout for an agreed configuration.
WorkspaceLayout computeLayout(const Config& cfg, int nranks);

size_t dtypeSize(anyrDataType_t t);

template <typename Body>
void Communicator::collectiveCall(const char* fn, Body&& body) {
  bool settled = false;
  bool holding = false;
  try {
    CallGuard::Scope busy(calls_, fn);
    holding = true;
    ++callCount_;
    applyPendingStop();
    body(settled);
    applyPendingStop();
  } catch (const Error& e) {
    if (!settled) refuse(fn, e, holding);
    throw;
  }
}

template <typename Args, typename Launch>
void Communicator::launchInPieces(anyrAlgo_t algo, const Args& tmpl, const void* in, void* out,
                                  size_t count, anyrDataType_t dtype, uint64_t capacityBytes,
                                  Launch&& launch) {
  const size_t es = dtypeSize(dtype);
  const size_t perLaunch = static_cast<size_t>(capacityBytes / es);
  const bool aligned =
      reinterpret_cast<uintptr_t>(in) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0;
  for (size_t off = 0; off < count; off += perLaunch) {
    Args a = tmpl;
    a.input = static_cast<const char*>(in) + off * es;
    a.output = static_cast<char*>(out) + off * es;
    a.count = perLaunch < count - off ? perLaunch : count - off;
    a.numVecs = (a.count * es + 15) / 16;
    LaunchShape shape = shapeFor(algo, a.numVecs);
    shape.aligned = aligned;
    const cudaError_t e = launch(a, shape);
    if (e != cudaSuccess) throwLaunchFailed(algo, e);
  }
}

}  // namespace anyr
