// `anyreduce explain`: for every operation and size bucket, the chosen path and where the
// choice came from, the admitted alternatives with their seeded (and, when tuned, measured)
// times, and the rejected candidates with their reasons. Pure: works from a topology file on a
// machine without GPUs, and from a live communicator's agreed state.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/config.h"
#include "select/admission.h"
#include "select/dispatch.h"
#include "select/tuning.h"
#include "topology/topology.h"

namespace anyr {

struct ExplainInput {
  const Topology* topo = nullptr;
  const Admission* adm = nullptr;
  const Config* cfg = nullptr;
  int nranks = 0;
  const DispatchTable* table = nullptr;
  const TuningTable* tuned = nullptr;  // may be null
  anyrAlgo_t forced = anyrAlgoAuto;
  std::string tuningNote;  // "loaded from X", "ignored: ...", "" (none)
  // Launch features and why (programmatic launch, thread-block clusters): one line each.
  std::vector<std::string> launchNotes;
  uint64_t minBytes = 1024;
  uint64_t maxBytes = 256ull << 20;
};

std::string explainDispatch(const ExplainInput& in);

}  // namespace anyr
