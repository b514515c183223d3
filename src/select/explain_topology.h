// Explain from a topology file: the admission and the dispatch that every rank of a communicator
// over those GPUs would compute, with no GPU and no communicator (`anyreduce explain --topology`,
// anyrExplainTopology).
#pragma once

#include <string>

#include "base/config.h"

namespace anyr {

struct TopologyExplainOptions {
  std::string path;           // topology JSON file
  int nranks = 0;             // the first nranks GPUs of the file; 0: all of them
  bool ncclAvailable = true;  // NCCL assumed available (its reason otherwise: "disabled")
  std::string tuningFile;     // applied where its fingerprint matches; "" none
};

// JSON text: {"gpus", "source", "admission": [{"algo", "admitted", "reason"}] (anyrAlgo_t order
// from 1), "warnings": [...], "forcedError": "" or why the forced algorithm (cfg.algorithm) is not
// admitted, "dispatchText": explainDispatch's text ("" with a forcedError)}. The configuration is
// resolveConfig(config): NULL takes the environment's. Throws anyrInvalidArgument when nranks is
// negative or more than the file's GPUs, and loadTopologyFile's errors.
std::string explainTopologyJson(const TopologyExplainOptions& o, const anyrConfig_t* config);

}  // namespace anyr
