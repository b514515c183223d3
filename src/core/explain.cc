// Explain (core/explain.h).
#include "core/explain.h"

#include <mutex>
#include <nlohmann/json.hpp>

#include "algo/algo.h"
#include "base/json_text.h"
#include "base/names.h"
#include "core/capabilities.h"
#include "core/context.h"
#include "core/fabric.h"
#include "core/fused_plan.h"
#include "core/host_transport.h"
#include "core/peer_workspace.h"
#include "fused/fused_algo.h"
#include "select/explain.h"
#include "select/selector.h"
#include "topology/islands.h"
#include "topology/topology.h"

namespace anyr {

std::string Explainer::explainJson() const {
  std::lock_guard<std::mutex> lock(sel_.tableMu());  // anyrCommTune may be installing a table
  nlohmann::json j;
  j["rank"] = ctx_.rank;
  j["nranks"] = ctx_.nranks;
  j["device"] = ctx_.device;
  j["config"] = ctx_.cfg.describe();
  j["forced"] = anyrAlgoName(sel_.forced());
  j["topology"] = nlohmann::json::parse(topologyToJson(ctx_.topo, -1));
  nlohmann::json adm = nlohmann::json::object();
  for (int a = 1; a < anyrNumAlgos; ++a) {
    adm[anyrAlgoName(static_cast<anyrAlgo_t>(a))] = {
        {"admitted", sel_.admission().algo[static_cast<size_t>(a)].admitted},
        {"reason", sel_.admission().algo[static_cast<size_t>(a)].reason}};
  }
  j["admission"] = adm;
  j["thresholds"] = {{"oneShot", anyrAlgoName(sel_.thresholds().oneShot)},
                     {"oneShotWhy", sel_.thresholds().oneShotWhy},
                     {"oneShotMaxBytes", sel_.thresholds().oneShotMaxBytes},
                     {"twoShot", anyrAlgoName(sel_.thresholds().twoShot)},
                     {"twoShotWhy", sel_.thresholds().twoShotWhy},
                     {"twoShotMaxBytes", sel_.thresholds().twoShotMaxBytes}};
  nlohmann::json choices = nlohmann::json::array();
  for (uint64_t b = 1024; b <= (256ull << 20); b *= 4) {
    choices.push_back(
        {{"bytes", b},
         {"choice", pathName(Op::AllReduce, sel_.pathFor(Op::AllReduce, b))},
         {"source",
          sel_.algoForced()
              ? "forced"
              : sourceName(sel_.dispatchTable().source[0][static_cast<size_t>(bucketOf(b))])}});
  }
  j["choices"] = choices;
  if (!selfTestJson_.empty()) j["selfTest"] = nlohmann::json::parse(selfTestJson_);
  j["dispatchText"] = explainTextLocked();
  j["tuning"] = sel_.tuningNote();
  j["programmaticLaunch"] = {{"enabled", caps_.pdlOn()},
                             {"reason", caps_.pdlReason()},
                             {"earlyRelease", caps_.releaseEarly() != 0}};
  // Grid caps: every block of a launch is resident at once on every rank.
  j["blocks"] = {
      {"fusedAndHost", caps_.maxBlocks()},
      {"peer", caps_.peerBlocks()},
      {"peerPerSm", caps_.peerPerSm()},
      {"fusedTwoShotDense", caps_.fusedDenseBlocks()},
      {"fusedClusterPairs", caps_.clusterPairBlocks()},
      {"fusedClusterPairThreads", nlohmann::json::parse(caps_.clusterPairThreadsJson())},
      {"reason",
       "fused and host kernels: one block per SM of the smallest GPU; peer "
       "all-reduce kernels: the fewest blocks per SM any of their variants "
       "holds on any rank, at most " +
           std::to_string(kPeerBlocksPerSm) + "; the fused two-shot's register form at " +
           std::to_string(kFusedDenseThreads) +
           " threads a block, for launches of more rows than fusedAndHost: likewise, "
           "at most " +
           std::to_string(kFusedDensePerSm) +
           " (dense above fusedAndHost); the fused cluster forms at two blocks per SM "
           "(fusedClusterPairs, 0: not admitted) for blocks of at most the "
           "fusedClusterPairThreads of the launch's kernel variant (form, dtype, "
           "quantization; aligned buffers), where every rank holds two such blocks per SM "
           "and no two ranks share a GPU; all capped by config.maxBlocks and at " +
           std::to_string(kMaxBlocks)}};
  // The fused kernels' cluster form: the size they take by rows (clusterSizeSamples).
  nlohmann::json sizes = nlohmann::json::object();
  for (const auto& [rows, size] : fused_.clusterSizeSamples()) sizes[std::to_string(rows)] = size;
  // Either encoder gives the same bits (fused/fused.h, e2m1Pack8).
  j["nvfp4Encoding"] = {{"instruction", caps_.nvfp4Instruction()}, {"reason", caps_.nvfp4Reason()}};
  j["fusedClusters"] = {{"enabled", caps_.clusterOn()},
                        {"reason", caps_.clusterReason()},
                        {"setting", ctx_.cfg.fusedCluster},
                        {"hidden", FusedPlan::kClusterSampleHidden},
                        {"sizeByRows", sizes}};
  if (workspace_.mapped()) {
    j["transport"] = workspace_.memory()->kind();
    j["workspaceBytes"] = workspace_.layout().totalBytes;
  }
  j["peerMemory"] = {{"kind", workspace_.mapped() ? workspace_.memory()->kind() : "none"},
                     {"setting", peerMemoryName(ctx_.cfg.peerMemory)},
                     {"reason", workspace_.peerMemoryText()}};
  // The two-level all-reduce's islands, and where they come from (ANYR_ISLANDS or the topology).
  const Islands is = islandsOf(ctx_.topo, ctx_.cfg.islands, ctx_.nranks);
  j["islands"] = {
      {"members", is.members},
      {"source", is.source},
      {"configured", is.configured},
      {"launchBytes", workspace_.mapped() ? islandLaunchBytes(workspace_.args().islands,
                                                              workspace_.layout().tsSlotBytes)
                                          : 0}};
  // The fabric's figures and where they came from (core/fabric.h); the topology above holds
  // them where they are applied.
  j["fabric"] = nlohmann::json::parse(fabricToJson(fabric_.record(), -1));
  j["fabric"]["mode"] = fabricModeName(ctx_.cfg.fabric);
  host_.explainHost(&j);
  return jsonText(j, 2);
}

std::string Explainer::explainText() const {
  std::lock_guard<std::mutex> lock(sel_.tableMu());
  return explainTextLocked();
}

std::string Explainer::explainTextLocked() const {
  ExplainInput in;
  in.topo = &ctx_.topo;
  in.adm = &sel_.admission();
  in.cfg = &ctx_.cfg;
  in.nranks = ctx_.nranks;
  in.table = &sel_.dispatchTable();
  in.tuned = sel_.tuned();
  in.forced = sel_.forced();
  in.tuningNote = sel_.tuningNote();
  if (ctx_.nranks > 1) in.launchNotes.push_back("peer memory: " + workspace_.peerMemoryText());
  if (ctx_.nranks > 1) in.launchNotes.push_back("fabric: " + fabricSummary(fabric_.record()));
  if (host_.present()) in.launchNotes.push_back("host segment: " + ctx_.facts.hostPlacement);
  in.launchNotes.push_back(std::string("programmatic launch: ") + (caps_.pdlOn() ? "on" : "off") +
                           " (" + caps_.pdlReason() + ")" +
                           (caps_.releaseEarly() != 0
                                ? "; kernels release the next launch early (ANYR_PDL_EARLY)"
                                : ""));
  std::string clusters = std::string("fused kernels in thread-block clusters: ") +
                         (caps_.clusterOn() ? "on" : "off") + " (" + caps_.clusterReason() + ")";
  if (caps_.clusterOn()) {
    clusters += "; setting " + std::to_string(ctx_.cfg.fusedCluster) +
                " (0 automatic); clusters at two blocks per SM up to " +
                std::to_string(caps_.clusterPairBlocks()) +
                " blocks (0: not admitted), blocks of at most " + caps_.clusterPairThreadsJson() +
                " threads" + "; cluster size by rows of hidden " +
                std::to_string(FusedPlan::kClusterSampleHidden) + " (1: a block per row)";
    const char* sep = ": ";
    for (const auto& [rows, size] : fused_.clusterSizeSamples()) {
      clusters += sep + std::to_string(rows) + " -> " + std::to_string(size);
      sep = ", ";
    }
    if (sel_.tuned() != nullptr) {
      clusters += "; sizes the table measured (\"/cN\" below) hold for rows of hidden " +
                  std::to_string(sel_.tunedClusterHidden()) + ", other widths take the rule";
    }
  }
  in.launchNotes.push_back(clusters);
  in.launchNotes.push_back(std::string("NVFP4 output encoded ") +
                           (caps_.nvfp4Instruction() ? "by instruction" : "in software") + " (" +
                           caps_.nvfp4Reason() + "; the same bits either way)");
  return explainDispatch(in);
}

}  // namespace anyr
