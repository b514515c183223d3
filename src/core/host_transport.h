// The host-memory transport: the shared pinned host segment (host-oneshot/-twoshot/-copy), its
// layout, local protocol state and bounded-wait control, the kernel argument template of the
// host algorithms, and host-copy's device staging, streams and events. Set up on every
// single-host communicator of 2..8 ranks (unless ANYR_HOST_MEMORY=0), whether or not the GPUs
// have peer access: admission decides when it is the default, and tests can force it anywhere.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "core/comm_part.h"
#include "device/handles.h"
#include "device/host_handles.h"
#include "transport/host_layout.h"
#include "transport/host_memory.h"

namespace anyr {

struct CommContext;

class HostTransport : private CommPart {
 public:
  using CommPart::CommPart;

  // Collective. Sets up the segment (facts.hostMemory, or facts.hostMemoryReason why not), each
  // rank's region placed on its GPU's NUMA node where it can be (facts.hostRegionNodes and
  // facts.hostPlacement), and writes the agreed host settings into the configuration.
  void init();
  void explainHost(void* json) const;  // nlohmann::json*

  // host-copy (host_copy.cu): its device staging, streams and events, made with the transport.
  struct HostCopyResources {
    char* sendStage = nullptr;  // device: the own compressed chunks of one launch
    char* recvStage = nullptr;  // device: (nranks - 1) peers' chunks of one launch
    cudaStream_t d2h = nullptr, sig = nullptr, poll = nullptr, h2d = nullptr;
    cudaEvent_t fork = nullptr, signaled = nullptr;
    std::vector<cudaEvent_t> copied, arrived, recv, packed;  // one per chunk of a launch
  };

  bool present() const { return host_ != nullptr; }
  HostMemory* memory() const { return host_.get(); }
  const HostLayout& layout() const { return hostLayout_; }
  const HostArgs& args() const { return hostTemplate_; }
  HostCopyResources& copy() { return copy_; }  // the launches use its streams and events
  LocalState* state() const { return dHostState_; }
  // Programmatic dependent launch: each host kernel releases the next launch right after its
  // own wait (Capabilities::releaseEarly).
  void setReleaseEarly(int32_t on) { hostTemplate_.releaseEarly = on; }

  // Teardown: host-copy's resources, the segment, then the device state.
  void release();

 private:
  friend class SelfTest;  // core/selftest.cc: the native wire for its runs, the reset after a
                          // failure
  void initHostCopy();
  void freeHostCopy();

  std::unique_ptr<HostMemory> host_;  // shared pinned host segment
  HostLayout hostLayout_{};
  LocalState* dHostState_ = nullptr;  // the host transport's own epochs and fail claim
  WaitControl* dHostWait_ = nullptr;
  HostArgs hostTemplate_{};
  HostCopyResources copy_;
};

}  // namespace anyr
