// The communicator: lifecycle (create, destroy, abort) and the call path of every collective
// call. What it owns is held by parts, each with its own state (core/*.h, select/selector.h):
//   context       who this rank is and what the ranks agreed at init; the own stream and waits
//   failure state the first failure, the host-mapped error record, refusals and the stop
//   NCCL path     the NCCL communicator and how teardown releases it
//   peer workspace / host transport   the two transports' memory, state and argument templates
//   fabric        the fabric measured over the peer workspace at init (or cached), agreed
//   capabilities  the agreed grid caps and the probes (programmatic launch, clusters, NVFP4)
//   launcher      launches of the unfused algorithms (src/algo) on either transport
//   fused plan    launches of the fused kernels (src/fused)
//   selector      admission, the dispatch table, forced paths, tuning tables; decides per call
// The startup self-test (core/selftest.cc), tuning's measurements (core/tune.cc) and explain
// (core/explain.cc) work on the parts.
#pragma once

#include <nccl.h>

#include <functional>
#include <memory>
#include <string>

#include "anyreduce/anyreduce.h"
#include "base/config.h"
#include "base/error.h"
#include "bootstrap/bootstrap.h"
#include "core/call_guard.h"
#include "core/capabilities.h"
#include "core/context.h"
#include "core/counters.h"
#include "core/fabric.h"
#include "core/failure_state.h"
#include "core/fused_plan.h"
#include "core/host_transport.h"
#include "core/launch.h"
#include "core/nccl_path.h"
#include "core/peer_workspace.h"
#include "core/tune.h"
#include "select/selector.h"

namespace anyr {

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
  // anyrCommForcePath's body: forces one path of one operation (`clear`: restores dispatch).
  // Collective like setAlgorithm, and under the same refusal rule: `judge` parses the caller's
  // names into `op` and `path` (throwing for a bad one) inside the call, so a rank that refuses
  // stops its peers instead of running a path they do not. A path that admission or the agreed
  // cluster probe rejects is rejected alike on every rank and leaves the communicator usable.
  struct ForcedPath {
    Op op = Op::AllReduce;
    bool clear = true;
    Path path;
  };
  void forcePath(const std::function<ForcedPath()>& judge);
  anyrAlgo_t queryAlgorithm(size_t count, anyrDataType_t dtype) const;
  std::string explainJson() const;

  // Collective. Measures, agrees (slowest rank counts, rank 0 decides and broadcasts), and
  // installs the result in the selector; returns it. `progress` is called on rank 0 only.
  using TuneOptions = anyr::TuneOptions;
  using TuneProgress = anyr::TuneProgress;
  TuningTable tune(const TuneOptions& o, const TuneProgress& progress);
  // The same with the caller's options judged inside the call (`judge` throws for a bad one and
  // fills *progress), so that a rank refusing them stops its peers, as any refused call does.
  TuningTable tune(const std::function<TuneOptions(TuneProgress* progress)>& judge);

  // anyrSuccess, or the failure recorded by device waits / abort; *msg receives the text.
  anyrResult_t asyncError(std::string* msg) { return failure_.asyncError(msg); }

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

  int rank() const { return ctx_.rank; }
  int size() const { return ctx_.nranks; }
  int device() const { return ctx_.device; }
  ncclComm_t nccl() const { return nccl_.get(); }
  CommCounters& counters() { return counters_; }
  // Internal (tuning, `bench --check-dispatch`, tests): the dispatch table, candidates, forced
  // paths and tuning table; the fused kernels' cluster sizes.
  Selector& selector() { return sel_; }
  const Selector& selector() const { return sel_; }
  const FusedPlan& fusedPlan() const { return fused_; }

 private:
  friend class SelfTest;  // core/selftest.cc: runs the startup self-test on the parts
  friend class Tuner;     // core/tune.cc: measures the communicator's own calls
  Communicator() { ctx_.failure = &failure_; }
  void init(std::unique_ptr<Bootstrap> bs, const Config& cfg, ncclComm_t externalNccl);
  // Admission, the self-test, thresholds, a configured algorithm, the seed table.
  void decide();
  void startEpochsForTests();
  // allReduceAddRmsNorm's body, under collectiveCall.
  void fusedCall(const void* partial, const void* residualIn, void* residualOut, const void* weight,
                 float epsilon, void* normOut, size_t tokens, size_t hidden, anyrDataType_t dtype,
                 const anyrFusedOptions_t* options, cudaStream_t stream, bool& settled);
  void checkStream(cudaStream_t stream, bool capturing) const;
  void validate(const void* sendbuff, void* recvbuff, size_t count, anyrDataType_t dtype,
                anyrRedOp_t op, cudaStream_t stream, bool capturing) const;
  // Calls on one communicator run one after the other on the device (ctx_.lastWork).
  void noteWork(cudaStream_t stream, bool capturing);
  void orderAfterLastWork(cudaStream_t stream, bool capturing);

  // Declared in dependency order: each part is made after, and destroyed before, the parts it
  // refers to (the failure state only refers to the transports and NCCL path at run time). The
  // destructor frees their resources explicitly, in the order teardown needs.
  CommContext ctx_;
  FailureState failure_{ctx_, workspace_, host_, nccl_};
  NcclPath nccl_{ctx_, failure_};
  PeerWorkspace workspace_{ctx_};
  HostTransport host_{ctx_};
  Fabric fabric_{ctx_, workspace_, host_};
  Capabilities caps_{ctx_};
  Launcher launcher_{ctx_, caps_, workspace_, host_};
  FusedPlan fused_{ctx_, caps_, workspace_};
  Selector sel_;
  CommCounters counters_;  // one note() per dispatch
  // Concurrency and validation mode (core/call_guard.h): one call at a time; a call on another
  // stream than the previous eager call's first waits for ctx_.lastWork, so calls stay
  // sequential.
  CallGuard calls_;
  void* scratch_ = nullptr;  // all-reduce target of the unfused fused-op path
  size_t scratchBytes_ = 0;
  // Startup self-test (core/selftest.cc) report (JSON). What it disabled is in the selector's
  // admission.
  std::string selfTestJson_;
};

template <typename Body>
void Communicator::collectiveCall(const char* fn, Body&& body) {
  bool settled = false;
  bool holding = false;
  try {
    CallGuard::Scope busy(calls_, fn);
    holding = true;
    failure_.noteCallEntered();
    failure_.applyPendingStop();
    body(settled);
    failure_.applyPendingStop();
  } catch (const Error& e) {
    if (!settled) failure_.refuse(fn, e, holding);
    throw;
  }
}

}  // namespace anyr
