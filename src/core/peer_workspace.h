// The peer workspace: this rank's workspace, mapped by its peers (cuda-ipc or vmm), its layout,
// its local protocol state and bounded-wait control, and the kernel argument template of the
// peer algorithms. Set up at init on single-host communicators of 2..8 ranks whose GPUs can
// map each other's memory; checked with real transfers over every mapped pair.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

#include "algo/algo.h"
#include "base/config.h"
#include "core/comm_part.h"
#include "device/handles.h"
#include "transport/peer_memory.h"

namespace anyr {

struct CommContext;

// Workspace layout for an agreed configuration.
WorkspaceLayout computeLayout(const Config& cfg, int nranks);

class PeerWorkspace : private CommPart {
 public:
  using CommPart::CommPart;

  // Collective. Sets up the workspace (facts.peerMemory, or facts.peerMemoryReason why not):
  // header, zeroed flags and check area, cleared push buffers, local state, wait control and the
  // argument template.
  void init();
  // Collective: real transfers over every mapped pair; records each pair's read, write and
  // atomic results in the topology.
  void checkTransport();
  // Fills the push receive areas of this rank's workspace with the clear pattern (at init, and
  // after a failed self-test).
  void clearPushAreas(cudaStream_t s);
  // Which kind maps the workspace and why, or "none (why not)" (explain).
  std::string peerMemoryText() const;

  bool mapped() const { return peers_ != nullptr; }
  const PeerMemory* memory() const { return peers_.get(); }
  const WorkspaceLayout& layout() const { return layout_; }
  const AllReduceArgs& args() const { return argsTemplate_; }
  LocalState* state() const { return dState_; }
  // ring-copy's side streams and events (algo/ring_copy.cu), made with the workspace.
  const RingCopyStreams& ringCopyStreams() const { return ringCopy_; }
  // Programmatic dependent launch: each peer and fused kernel releases the next launch right
  // after its own wait (Capabilities::releaseEarly).
  void setReleaseEarly(int32_t on) { argsTemplate_.releaseEarly = on; }

  // Teardown, in the communicator's order: the mapping first, the device state later.
  void releaseMapping() { peers_.reset(); }
  void freeState();

 private:
  friend class SelfTest;  // core/selftest.cc: fault injection and the reset after a failure
  // Part of init: sets peers_ by cfg.peerMemory (auto: cuda-ipc, else vmm where that maps more
  // pairs) and peerMemoryNote_; leaves peers_ null, with facts.peerMemoryReason, when no kind
  // could be set up. Collective; every rank takes the same kind.
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

  std::unique_ptr<PeerMemory> peers_;
  std::string peerMemoryNote_;  // with peers_: which kind maps the workspace, and why
  WorkspaceLayout layout_{};
  LocalState* dState_ = nullptr;
  WaitControl* dWait_ = nullptr;
  AllReduceArgs argsTemplate_{};
  RingCopyStreams ringCopy_{};
};

}  // namespace anyr
