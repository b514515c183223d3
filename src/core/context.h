// What every part of a communicator shares: who this rank is, what the ranks agreed at init
// (configuration, topology, facts), the bootstrap, the communicator's own stream with its bounded
// waits, and the last eager call's event. The parts (peer workspace, host transport,
// capabilities, failure state, launches, fused planning) hold a reference to their
// communicator's context; the Communicator owns it and its parts (core/comm.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "base/config.h"
#include "bootstrap/bootstrap.h"
#include "device/handles.h"
#include "select/admission.h"
#include "topology/topology.h"

namespace anyr {

class FailureState;

struct CommContext {
  int rank = -1;
  int nranks = 0;
  int device = -1;
  Config cfg;
  std::unique_ptr<Bootstrap> bs;
  Topology topo;  // rank-indexed: gpus[r] is rank r's GPU, pairs confirmed at init
  CommFacts facts;
  cudaStream_t internalStream = nullptr;
  // The last eager call's work (noteWork; not during capture), and the stream it ran on.
  cudaEvent_t lastWork = nullptr;
  bool haveLastWork = false;
  cudaStream_t lastWorkStream = nullptr;
  // The communicator's failure state: a bounded wait that runs out reports the failure a kernel
  // recorded (it names the rank waited for) before its own timeout.
  FailureState* failure = nullptr;

  // The grace past the timeout of host waits for work whose own waits may have started later
  // (teardown, tuning's measurements).
  static constexpr int kTeardownGraceMs = 5000;

  // Collective: rank 0's resolved configuration becomes cfg; a rank whose own differs is told.
  void agreeConfig(const Config& local);
  // Collective: every rank's GPU description and the driver's facts of every pair (topo, facts).
  void exchangeDeviceInfo();
  // A tests-only variable's value, rank 0's (-1 when unset there), checked on every rank.
  int64_t testValueOfRank0(const char* name, int64_t max);

  // Whether `s` became idle within `ms` (a CUDA error other than not-ready throws).
  bool streamIdleWithin(cudaStream_t s, int ms);
  bool eventDoneWithin(cudaEvent_t e, int ms);  // likewise for an event
  // Waits until `s` is idle, at most the timeout plus graceMs (graceMs: for work whose own
  // waits, bounded by the timeout, start after this wait does, so that their failure, which
  // names the rank waited for, is reported rather than this wait's).
  void waitStreamIdle(cudaStream_t s, const char* what, int graceMs = 0);

  // Why no node-local transport (peer memory, host memory) can serve this communicator: `single`
  // for one rank (nothing to transport), else more than kMaxLocalRanks ranks or ranks on several
  // hosts; NULL when one can.
  const char* localTransportRefusal(const char* single) const;

  // This rank's workspace header (peer workspace, or its region of the host segment).
  WorkspaceHeader headerOfThisRank(uint64_t layoutHash) const;
  // A device copy of the bounded-wait control of one transport: its local state, this rank's
  // header and its peers' (nranks entries), the communicator's abort word, error record and
  // timeout.
  WaitControl* newWaitControl(LocalState* state, WorkspaceHeader* ownHeader,
                              WorkspaceHeader* const* peerHeaders);

 private:
  template <typename Query>
  bool doneWithin(Query&& query, int ms);
};

}  // namespace anyr
