// Shared by the CPU tests of admission and dispatch: the recorded topologies under
// tests/fixtures, and the facts a communicator over them would report.
#pragma once

#include <string>

#include "select/admission.h"
#include "topology/topology.h"

namespace anyr {
namespace testfix {

inline Topology fixture(const std::string& name) {
  return loadTopologyFile(std::string(ANYR_FIXTURE_DIR) + "/" + name + ".json");
}

// One host, one GPU per rank, the peer workspace mapped; NCCL as `nccl` says (missing: "disabled
// for the test"); the shared host segment as `hostMemory` says, with `hostReason`.
inline CommFacts facts(const Topology& t, bool nccl, bool hostMemory,
                       const std::string& hostReason) {
  CommFacts f;
  f.nranks = t.size();
  f.sameHost = true;
  f.distinctDevices = true;
  f.ncclAvailable = nccl;
  f.ncclReason = nccl ? "" : "disabled for the test";
  f.peerMemory = true;
  f.hostMemory = hostMemory;
  f.hostMemoryReason = hostReason;
  return f;
}

}  // namespace testfix
}  // namespace anyr
