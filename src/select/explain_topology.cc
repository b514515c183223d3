#include "select/explain_topology.h"

#include <array>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "base/error.h"
#include "base/json_text.h"
#include "device/handles.h"
#include "select/admission.h"
#include "select/dispatch.h"
#include "select/explain.h"
#include "select/tuning.h"
#include "topology/topology.h"

namespace anyr {

std::string explainTopologyJson(const TopologyExplainOptions& o, const anyrConfig_t* config) {
  Topology t = loadTopologyFile(o.path);
  ANYR_REQUIRE_ARG(t.size() > 0, "path", "the topology file '" + o.path + "' lists no GPU");
  ANYR_REQUIRE_ARG(o.nranks >= 0, "nranks", "must be >= 0 (0: every GPU of the topology)");
  ANYR_REQUIRE_ARG(
      o.nranks <= t.size(), "nranks",
      std::to_string(o.nranks) + " but the topology has " + std::to_string(t.size()) + " GPUs");
  if (o.nranks > 0 && o.nranks != t.size()) {
    t = firstGpus(t, o.nranks);  // as a communicator of N ranks over them would see them
  }
  CommFacts f;
  f.nranks = t.size();
  f.sameHost = true;
  for (const GpuInfo& g : t.gpus) f.sameHost = f.sameHost && g.hostHash == t.gpus[0].hostHash;
  f.ncclAvailable = o.ncclAvailable;
  f.ncclReason = o.ncclAvailable ? "" : "disabled (--no-nccl)";
  // One rank, as a live communicator of one: no transport, every call local (core/comm.cc).
  const bool oneRank = f.nranks < 2;
  f.peerMemory = !oneRank;
  f.peerMemoryReason = oneRank ? "a single rank needs no peer memory" : "";
  f.hostMemory = !oneRank && f.sameHost && f.nranks <= kMaxLocalRanks;
  f.hostMemoryReason = oneRank        ? "a single rank needs no transport"
                       : f.hostMemory ? ""
                                      : "ranks on several hosts or more than 8 ranks";
  const Config cfg = resolveConfig(config);
  // Forced islands must fit this world size, as at communicator creation.
  const std::string islands = islandsCoverError(cfg.islands, t.size());
  if (!islands.empty()) {
    throwError(anyrInvalidArgument,
               "environment variable ANYR_ISLANDS='" + islandsText(cfg.islands) + "': " + islands);
  }
  f.islands = cfg.islands;
  // A fabric record cached in the tuning file for this machine and world replaces the
  // topology's measured figures where it measured them, as it would in a live communicator
  // (core/fabric.h); a stale one is named, an absent one is not.
  std::string fabricNote;
  if (!o.tuningFile.empty() && cfg.fabric != FabricMode::Off) {
    FabricRecord fabric;
    std::string why;
    bool present = false;
    if (loadFabricFor(o.tuningFile, fingerprintOf(t, t.size()), &fabric, &why, &present)) {
      fabric.applied = true;
      applyFabric(fabric, &t);
      fabricNote = "fabric: " + fabricSummary(fabric);
    } else if (present) {
      fabricNote = "fabric: the cached record was not used: " + why;
    }
  }
  Admission adm = admit(t, f);
  nlohmann::json j;
  j["gpus"] = t.size();
  j["source"] = t.source;
  nlohmann::json admission = nlohmann::json::array();
  for (int a = 1; a < anyrNumAlgos; ++a) {
    const AlgoAdmission& x = adm.algo[static_cast<size_t>(a)];
    admission.push_back({{"algo", anyrAlgoName(static_cast<anyrAlgo_t>(a))},
                         {"admitted", x.admitted},
                         {"reason", x.reason}});
  }
  j["admission"] = admission;
  DispatchTable table = seedTable(t, adm, cfg, t.size());
  ExplainInput in;
  in.topo = &t;
  in.adm = &adm;
  in.cfg = &cfg;
  in.nranks = t.size();
  in.table = &table;
  in.forced = cfg.algorithm;
  if (!fabricNote.empty()) in.launchNotes.push_back(fabricNote);
  TuningTable tuned;
  std::vector<std::string> warnings;
  if (!o.tuningFile.empty()) {
    std::string why;
    // The settings a communicator measured under (block caps, cluster and programmatic-launch
    // probes, sizes) are not in a topology file: taken as the table's own here; the topology,
    // world size, library and driver are compared. A live communicator compares its own.
    std::vector<std::string> settings;
    try {
      std::ifstream file(o.tuningFile);
      std::stringstream text;
      text << file.rdbuf();
      settings = tuningFromJson(text.str()).fingerprint.settings;
    } catch (const Error&) {
      // malformed: loadTuningFor below says why
    }
    if (loadTuningFor(o.tuningFile, fingerprintOf(t, t.size(), settings), &tuned, &why)) {
      std::array<std::vector<Candidate>, kNumOps> cands;
      for (int op = 0; op < kNumOps; ++op)
        cands[static_cast<size_t>(op)] = candidates(static_cast<Op>(op), t, adm);
      // No GPU to probe clusters here: the table's sizes are shown as
      // a configuration that does not turn clusters off would take them.
      applyTuning(tuned, cands, cfg.fusedCluster != 1, &table, &warnings);
      in.tuned = &tuned;
      in.tuningNote = "loaded from " + o.tuningFile + " (its measured settings assumed)";
    } else {
      in.tuningNote = "ignored: " + why;
    }
  }
  j["warnings"] = warnings;
  const std::string forcedError =
      cfg.algorithm != anyrAlgoAuto ? overrideError(adm, cfg.algorithm) : "";
  j["forcedError"] = forcedError;
  j["dispatchText"] =
      !forcedError.empty() ? ""
      : oneRank ? "one rank: anyrAllReduce is a copy of sendbuff into recvbuff (nothing in place) "
                  "and anyrAllReduceAddRmsNorm the standalone add + RMSNorm; no algorithm is "
                  "chosen\n"
                : explainDispatch(in);
  return jsonText(j);
}

}  // namespace anyr
