// Shared by the CPU tests of admission and dispatch: the recorded topologies under
// tests/fixtures, and the facts a communicator over them would report.
#pragma once

#include <string>

#include "base/config.h"
#include "select/admission.h"
#include "select/dispatch.h"
#include "select/explain.h"
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

// A topology as a communicator over all its GPUs would seed it: its admission, seed table and
// cost model inputs.
struct Seeded {
  Topology t;
  Admission adm;
  DispatchTable table;
  CostInputs in;
};
inline Seeded seededTopology(const Topology& t, bool nccl = true, bool host = true,
                             const Config& cfg = Config()) {
  Seeded s;
  s.t = t;
  s.adm = admit(s.t, facts(s.t, nccl, host, host ? "" : "disabled for the test"));
  s.table = seedTable(s.t, s.adm, cfg, s.t.size());
  s.in = costInputs(s.t, cfg, s.t.size());
  return s;
}
// A fixture as a communicator of `ranks` over its first GPUs (0: all) would seed it.
inline Seeded seeded(const std::string& name, int ranks = 0, bool nccl = true, bool host = true,
                     const Config& cfg = Config()) {
  Topology t = fixture(name);
  if (ranks > 0) t = firstGpus(t, ranks);
  return seededTopology(t, nccl, host, cfg);
}

// What explain says of a seeded fixture's dispatch (the default configuration).
inline std::string explainOf(const Seeded& s) {
  ExplainInput in;
  in.topo = &s.t;
  in.adm = &s.adm;
  const Config cfg;
  in.cfg = &cfg;
  in.nranks = s.t.size();
  in.table = &s.table;
  return explainDispatch(in);
}

}  // namespace testfix
}  // namespace anyr
