// C boundary of the queries and controls for tools (anyreduce.h, "Queries and controls for
// tools"): argument checks, handle and result conversion; the work is the library's own.
#include <cstring>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "anyreduce/anyreduce.h"
#include "api/boundary.h"
#include "base/config.h"
#include "base/env.h"
#include "base/error.h"
#include "base/json_text.h"
#include "core/capabilities.h"
#include "core/comm.h"
#include "fused/fused.h"
#include "select/dispatch.h"
#include "select/explain_topology.h"
#include "select/tuning.h"
#include "topology/probe.h"
#include "topology/topology.h"

static_assert(ANYR_FUSED_MIN_HIDDEN == anyr::kFusedMinHidden, "public row-width rule");
static_assert(ANYR_FUSED_MAX_HIDDEN == anyr::kFusedMaxHidden, "public row-width rule");
static_assert(ANYR_FUSED_HIDDEN_MULTIPLE == anyr::kFusedHiddenMultiple, "public row-width rule");
static_assert(ANYR_FUSED_NVFP4_HIDDEN_MULTIPLE == anyr::fusedHiddenMultiple(anyrQuantNvfp4),
              "public row-width rule");

namespace anyr {
namespace {

std::string opNames() {
  std::string s;
  for (int o = 0; o < kNumOps; ++o) s += std::string(o ? ", " : "") + opName(static_cast<Op>(o));
  return s;
}

Op requireOp(const char* op) {
  ANYR_REQUIRE_ARG(op != nullptr, "op", "must not be NULL");
  Op out = Op::AllReduce;
  ANYR_REQUIRE_ARG(parseOp(op, &out), "op",
                   "must be one of " + opNames() + " (got '" + std::string(op) + "')");
  return out;
}

// The topology description of anyrProbeTopology / anyrDescribeTopology.
std::string describeJson(const Topology& t) {
  std::ostringstream text;
  printTopology(t, text);
  nlohmann::json j = {{"gpus", t.size()}, {"source", t.source}, {"text", text.str()}};
  return anyr::jsonText(j);
}

}  // namespace
}  // namespace anyr

extern "C" {

anyrResult_t anyrCheckDevices(int* count) {
  return anyr::guarded(nullptr, "anyrCheckDevices", [&] {
    if (count != nullptr) *count = 0;
    const int n = anyr::requireDriverAndGpu();
    if (count != nullptr) *count = n;
    int current = 0;
    ANYR_CUDA_CHECK(cudaGetDevice(&current));
    // Back to the caller's device however the loop ends.
    struct Restore {
      int device;
      ~Restore() { (void)cudaSetDevice(device); }
    } restore{current};
    for (int d = 0; d < n; ++d) {
      ANYR_CUDA_CHECK(cudaSetDevice(d));
      anyr::requireKernelsFor(d);
    }
  });
}

const char* anyrPeerMemoryName(anyrPeerMemory_t kind) {
  if (kind < 0 || kind >= anyrNumPeerMemories) return nullptr;
  return anyr::peerMemoryName(kind);
}

anyrResult_t anyrParseSize(const char* text, size_t* bytes) {
  return anyr::guarded(nullptr, "anyrParseSize", [&] {
    ANYR_REQUIRE_ARG(text != nullptr, "text", "must not be NULL");
    ANYR_REQUIRE_ARG(bytes != nullptr, "bytes", "must not be NULL");
    uint64_t v = 0;
    ANYR_REQUIRE_ARG(anyr::env::parseSize(text, &v) && v <= std::numeric_limits<size_t>::max(),
                     "text", "'" + std::string(text) + "' is not a size (e.g. 1024, 64K, 8M, 1G)");
    *bytes = static_cast<size_t>(v);
  });
}

anyrResult_t anyrConfigCheckField(const char* field, long long value, int* valid,
                                  const char** rule) {
  return anyr::guarded(nullptr, "anyrConfigCheckField", [&] {
    ANYR_REQUIRE_ARG(field != nullptr, "field", "must not be NULL");
    ANYR_REQUIRE_ARG(valid != nullptr, "valid", "must not be NULL");
    const std::string f = field;
    bool (*check)(int64_t) = nullptr;
    const char* text = nullptr;
    if (f == "maxBlocks") {
      check = anyr::maxBlocksValid;
      text = anyr::kMaxBlocksRule;
    } else if (f == "fusedCluster") {
      check = anyr::fusedClusterValid;
      text = anyr::kFusedClusterRule;
    }
    ANYR_REQUIRE_ARG(check != nullptr, "field",
                     "must be maxBlocks or fusedCluster (got '" + f + "')");
    *valid = check(static_cast<int64_t>(value)) ? 1 : 0;
    if (rule != nullptr) *rule = text;
  });
}

anyrResult_t anyrGetEnvParams(char* buf, size_t len, size_t* needed) {
  return anyr::guarded(nullptr, "anyrGetEnvParams", [&] {
    nlohmann::json j = nlohmann::json::array();
    for (const anyr::env::Param& p : anyr::env::params()) {
      nlohmann::json e = {{"name", p.name}, {"default", p.defaultValue}, {"meaning", p.meaning}};
      if (anyr::env::isSet(p.name)) e["value"] = anyr::env::getString(p.name);
      j.push_back(e);
    }
    anyr::copyText(anyr::jsonText(j), buf, len, needed);
  });
}

anyrResult_t anyrProbeTopology(int measure, const char* savePath, char* buf, size_t len,
                               size_t* needed) {
  return anyr::guarded(nullptr, "anyrProbeTopology", [&] {
    ANYR_REQUIRE_ARG(buf != nullptr || len == 0, "buf", "must not be NULL when len > 0");
    anyr::ProbeOptions po;
    po.measure = measure != 0;
    anyr::Topology t = anyr::probeLocal(po);
    if (savePath != nullptr) anyr::saveTopologyFile(t, savePath);
    anyr::copyText(anyr::describeJson(t), buf, len, needed);
  });
}

anyrResult_t anyrDescribeTopology(const char* path, char* buf, size_t len, size_t* needed) {
  return anyr::guarded(nullptr, "anyrDescribeTopology", [&] {
    ANYR_REQUIRE_ARG(path != nullptr, "path", "must not be NULL");
    ANYR_REQUIRE_ARG(buf != nullptr || len == 0, "buf", "must not be NULL when len > 0");
    anyr::copyText(anyr::describeJson(anyr::loadTopologyFile(path)), buf, len, needed);
  });
}

anyrResult_t anyrExplainTopology(const char* path, int nranks, int ncclAvailable,
                                 const char* tuningFile, const anyrConfig_t* config, char* buf,
                                 size_t len, size_t* needed) {
  return anyr::guarded(nullptr, "anyrExplainTopology", [&] {
    ANYR_REQUIRE_ARG(path != nullptr, "path", "must not be NULL");
    ANYR_REQUIRE_ARG(nranks >= 0, "nranks", "must be >= 0 (0: every GPU of the topology)");
    ANYR_REQUIRE_ARG(buf != nullptr || len == 0, "buf", "must not be NULL when len > 0");
    anyr::TopologyExplainOptions o;
    o.path = path;
    o.nranks = nranks;
    o.ncclAvailable = ncclAvailable != 0;
    if (tuningFile != nullptr) o.tuningFile = tuningFile;
    anyr::copyText(anyr::explainTopologyJson(o, config), buf, len, needed);
  });
}

anyrResult_t anyrCommDescribePaths(const anyrComm_t comm, char* buf, size_t len, size_t* needed) {
  return anyr::guarded(comm, "anyrCommDescribePaths", [&] {
    ANYR_REQUIRE_ARG(buf != nullptr || len == 0, "buf", "must not be NULL when len > 0");
    const anyr::Communicator& c = anyr::liveComm(comm);
    std::lock_guard<std::mutex> lock(c.selector().tableMu());  // anyrCommTune may install one
    nlohmann::json ops = nlohmann::json::array();
    for (int i = 0; i < anyr::kNumOps; ++i) {
      const anyr::Op op = static_cast<anyr::Op>(i);
      nlohmann::json cands = nlohmann::json::array();
      for (const anyr::Candidate& k : c.selector().candidatesOf(op)) {
        cands.push_back({{"path", anyr::pathName(op, k.path)},
                         {"algo", anyrAlgoName(k.path.algo)},
                         {"fusedKernel", k.path.fusedKernel},
                         {"admitted", k.admitted},
                         {"reason", k.reason}});
      }
      ops.push_back({{"op", anyr::opName(op)}, {"candidates", cands}});
    }
    nlohmann::json j = {{"tuned", c.selector().tuned() != nullptr}, {"ops", ops}};
    anyr::copyText(anyr::jsonText(j), buf, len, needed);
  });
}

anyrResult_t anyrCommForcePath(anyrComm_t comm, const char* op, const char* path) {
  return anyr::guarded(comm, "anyrCommForcePath", [&] {
    const auto judge = [&] {
      anyr::Communicator::ForcedPath f;
      f.op = anyr::requireOp(op);
      f.clear = path == nullptr || *path == '\0';
      ANYR_REQUIRE_ARG(
          f.clear || anyr::parsePath(f.op, path, &f.path), "path",
          "'" + std::string(f.clear ? "" : path) + "' is not a path of " + anyr::opName(f.op));
      return f;
    };
    // The names are judged before the communicator, and on a communicator inside the
    // collective call, so that a rank that refuses them stops its peers
    // (Communicator::forcePath).
    if (comm == nullptr) judge();
    anyr::liveComm(comm).forcePath(judge);
  });
}

anyrResult_t anyrCommQueryPath(const anyrComm_t comm, const char* op, size_t bytes, char* buf,
                               size_t len, size_t* needed) {
  return anyr::guarded(comm, "anyrCommQueryPath", [&] {
    const anyr::Op o = anyr::requireOp(op);
    ANYR_REQUIRE_ARG(buf != nullptr || len == 0, "buf", "must not be NULL when len > 0");
    const anyr::Communicator& c = anyr::liveComm(comm);
    std::lock_guard<std::mutex> lock(c.selector().tableMu());  // anyrCommTune may install one
    anyr::copyText(anyr::pathName(o, c.selector().pathFor(o, bytes)), buf, len, needed);
  });
}

anyrResult_t anyrCommTuneWithOptions(anyrComm_t comm, const anyrTuneOptions_t* options,
                                     const char* savePath) {
  return anyr::guarded(comm, "anyrCommTuneWithOptions", [&] {
    // The options are judged before the communicator, and on a communicator inside the
    // collective call, so that a rank that refuses them stops its peers (Communicator::tune).
    const auto judge = [&](anyr::Communicator::TuneProgress* progress) {
      anyr::Communicator::TuneOptions o;
      if (options == nullptr) return o;
      ANYR_REQUIRE_ARG(options->size == sizeof(anyrTuneOptions_t), "options",
                       "size must be sizeof(anyrTuneOptions_t)");
      ANYR_REQUIRE_ARG(options->magic == ANYR_TUNE_MAGIC, "options",
                       "magic must be ANYR_TUNE_MAGIC (initialize with "
                       "ANYR_TUNE_OPTIONS_INITIALIZER)");
      o.minBytes = options->minBytes;
      o.maxBytes = options->maxBytes;
      o.hidden = options->hidden;
      o.maxTokens = options->maxTokens;
      o.budgetMs = options->budgetMs;
      o.calls = options->calls;
      o.samples = options->samples;
      if (options->progress != nullptr) {
        const anyrTuneProgress_t fn = options->progress;
        void* const arg = options->progressArg;
        *progress = [fn, arg](int done, int total, const std::string& what) {
          fn(done, total, what.c_str(), arg);
        };
      }
      return o;
    };
    if (comm == nullptr) {
      anyr::Communicator::TuneProgress unused;
      judge(&unused);
    }
    anyr::Communicator& c = anyr::liveComm(comm);
    anyr::TuningTable t = c.tune(judge);
    if (savePath != nullptr && c.rank() == 0) anyr::saveTuningFile(t, savePath);
  });
}

}  // extern "C"
