// The communicator's dispatch: the per-call lookup, forced paths, the tuning table loaded at
// init, and the measuring behind `anyreduce tune` / anyrCommTune / init-time tuning. The
// choices themselves are pure functions in src/select (dispatch.h, tuning.h, explain.h).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>

#include "base/error.h"
#include "base/log.h"
#include "core/comm.h"
#include "fused/fused.h"
#include "fused/fused_algo.h"
#include "select/explain.h"

namespace anyr {

namespace {

constexpr int kForcedSet = 1 << 16;
// Bits 0-7 the algorithm, bit 8 the fused kernel, bits 9-12 the cluster size (0..8).
int encodePath(Path p) {
  return kForcedSet | static_cast<int>(p.algo) | (p.fusedKernel ? 256 : 0) | (p.cluster << 9);
}
Path decodePath(int v) {
  return Path{static_cast<anyrAlgo_t>(v & 255), (v & 256) != 0, (v >> 9) & 15};
}

// Candidates measured at one point: every admitted one (an operation has at most 2 + 8: the
// two fused kernels and the composition with each all-reduce algorithm; 8 cut off the last two
// host compositions).
constexpr int kMaxCands = 16;
static_assert(kMaxCands >= 2 + (anyrNumAlgos - 1), "every admitted candidate is measured");

// One rank's measurements of one point, exchanged through the bootstrap.
struct PointSample {
  double us[kMaxCands];
  double elapsedMs;  // since tuning began (rank 0's decides when the budget is spent)
};

}  // namespace

Path Communicator::pathFor(Op op, uint64_t bytes, int hidden) const {
  const int fp = forcedPath_[static_cast<size_t>(op)].load(std::memory_order_relaxed);
  if (fp != 0) return decodePath(fp);
  const anyrAlgo_t forced = static_cast<anyrAlgo_t>(forced_.load(std::memory_order_relaxed));
  if (forced != anyrAlgoAuto) return forcedPath(op, forced);
  Path p = dispatch_.lookup(op, bytes);
  // A measured cluster size holds for the row width it was measured at (the table's hidden);
  // other widths take the automatic rule. hidden 0: the caller does not launch (queries).
  if (p.cluster != 0 && hidden != 0 && hidden != tunedClusterHidden_) p.cluster = 0;
  return p;
}

void Communicator::forcePath(Op op, Path p) {
  if (p.cluster != 0) {
    if (!p.fusedKernel || !pathClusterValid(p.cluster)) {
      throwError(anyrInvalidArgument, std::string(opName(op)) + " path " + pathName(op, p) +
                                          ": a cluster size (1, 2, 4 or 8) needs a fused kernel");
    }
    if (p.cluster > 1 && !clusterOn_) {
      throwError(anyrUnsupported,
                 std::string(opName(op)) + " path " + pathName(op, p) +
                     " needs thread-block clusters, which are off here: " + clusterReason_);
    }
  }
  for (const Candidate& c : candidatesOf(op)) {
    if (c.path.sameKernel(p)) {
      if (!c.admitted && nranks_ > 1) {
        throwError(anyrUnsupported, std::string(opName(op)) + " path " + pathName(op, p) +
                                        " is not admitted on this communicator: " + c.reason);
      }
      forcedPath_[static_cast<size_t>(op)].store(encodePath(p));
      return;
    }
  }
  throwError(anyrInvalidArgument,
             std::string(opName(op)) + " has no path " + pathName(op, p) + " to force");
}

void Communicator::clearForcedPath(Op op) { forcedPath_[static_cast<size_t>(op)].store(0); }

std::string Communicator::explainText() const {
  std::lock_guard<std::mutex> lock(tableMu_);
  return explainTextLocked();
}

std::string Communicator::explainTextLocked() const {
  ExplainInput in;
  in.topo = &topo_;
  in.adm = &admission_;
  in.cfg = &cfg_;
  in.nranks = nranks_;
  in.table = &dispatch_;
  in.tuned = tuned_.get();
  in.forced = static_cast<anyrAlgo_t>(forced_.load());
  in.tuningNote = tuningNote_;
  if (nranks_ > 1) in.launchNotes.push_back("peer memory: " + peerMemoryText());
  in.launchNotes.push_back(
      std::string("programmatic launch: ") + (pdlOn_ ? "on" : "off") + " (" + pdlReason_ + ")" +
      (argsTemplate_.releaseEarly != 0 ? "; kernels release the next launch early (ANYR_PDL_EARLY)"
                                       : ""));
  std::string clusters = std::string("fused kernels in thread-block clusters: ") +
                         (clusterOn_ ? "on" : "off") + " (" + clusterReason_ + ")";
  if (clusterOn_) {
    clusters += "; setting " + std::to_string(cfg_.fusedCluster) +
                " (0 automatic); clusters at two blocks per SM up to " +
                std::to_string(clusterPairBlocks_) +
                " blocks (0: not admitted), blocks of at most " + clusterPairThreadsJson() +
                " threads" + "; cluster size by rows of hidden " +
                std::to_string(kClusterSampleHidden) + " (1: a block per row)";
    const char* sep = ": ";
    for (const auto& [rows, size] : clusterSizeSamples()) {
      clusters += sep + std::to_string(rows) + " -> " + std::to_string(size);
      sep = ", ";
    }
    if (tuned_ != nullptr) {
      clusters += "; sizes the table measured (\"/cN\" below) hold for rows of hidden " +
                  std::to_string(tunedClusterHidden_) + ", other widths take the rule";
    }
  }
  in.launchNotes.push_back(clusters);
  in.launchNotes.push_back(std::string("NVFP4 output encoded ") +
                           (nvfp4Instruction_ ? "by instruction" : "in software") + " (" +
                           nvfp4Reason_ + "; the same bits either way)");
  return explainDispatch(in);
}

void Communicator::installTuning(const TuningTable& table, const char* what,
                                 const std::string& note) {
  std::vector<std::string> warnings;
  {
    std::lock_guard<std::mutex> lock(tableMu_);
    applyTuning(table, candidates_, clusterOn_, &dispatch_, &warnings);
    tuned_ = std::make_unique<TuningTable>(table);
    tunedClusterHidden_ = table.hidden;
    tuningNote_ = note;
  }
  for (const std::string& w : warnings) ANYR_LOG(Warn, rank_, what << ": " << w);
}

std::vector<std::string> Communicator::tuningSettings() const {
  return {"maxBlocks " + std::to_string(maxBlocks_) + " peer " + std::to_string(peerBlocks_),
          "fusedCluster " + std::to_string(cfg_.fusedCluster) + (clusterOn_ ? " on" : " off") +
              " pairs " + std::to_string(clusterPairBlocks_) + " at " + clusterPairThreadsJson(),
          std::string("programmaticLaunch ") + (pdlOn_ ? "on" : "off") +
              (argsTemplate_.releaseEarly != 0 ? " early" : ""),
          std::string("wire ") + wireName(cfg_.wire),
          "chunkBytes " + std::to_string(cfg_.chunkBytes) + " oneShotMaxBytes " +
              std::to_string(cfg_.oneShotMaxBytes) + " twoShotMaxBytes " +
              std::to_string(cfg_.twoShotMaxBytes),
          "hostLaunchBytes " + std::to_string(cfg_.hostLaunchBytes) + " copyChunk " +
              std::to_string(cfg_.hostCopyChunkBytes),
          "hostLowLatencyBytes " + std::to_string(cfg_.hostLowLatencyBytes) + " eager " +
              std::to_string(cfg_.hostLowLatencyEagerBytes)};
}

void Communicator::loadOrTuneAtInit() {
  // Only rank 0 reads the file; it sends its verdict and the table (or the reason it was not
  // used) to everyone, so every rank installs the same table.
  struct Head {
    int32_t ok;
    int32_t budgetMs;
    uint64_t len;
  };
  Head h{0, cfg_.tuneBudgetMs, 0};
  std::string text;
  if (rank_ == 0 && !cfg_.tuningFile.empty()) {
    TuningTable t;
    std::string why;
    if (loadTuningFor(cfg_.tuningFile, fingerprintOf(topo_, nranks_, tuningSettings()), &t, &why)) {
      h.ok = 1;
      text = tuningToJson(t);
    } else {
      text = why;
    }
  }
  h.len = text.size();
  bs_->broadcast(&h, sizeof(h), 0);
  text.resize(static_cast<size_t>(h.len));
  if (h.len > 0) bs_->broadcast(text.data(), text.size(), 0);
  if (h.ok) {
    installTuning(tuningFromJson(text), "tuning table", "loaded (fingerprint matches)");
    ANYR_LOG(Info, rank_, "dispatch: tuning table loaded; measured choices in use");
    return;
  }
  if (h.len > 0) {
    tuningNote_ = "ignored: " + text;
    if (rank_ == 0) ANYR_LOG(Warn, rank_, "tuning table ignored, using the seed: " << text);
  } else {
    tuningNote_ = "none (seed choices)";
  }
  if (h.budgetMs > 0 && nranks_ > 1) {
    TuneOptions o;
    o.budgetMs = h.budgetMs;
    TuningTable t;
    try {
      t = tune(o, nullptr);
    } catch (const Error& e) {
      // Every rank ends here (a rank that fails stops taking part, and the others' bounded
      // exchanges then fail too); tune() installs nothing unless it completed, so every rank
      // keeps the seed.
      ANYR_LOG(Warn, rank_, "tuning at init failed, using the seed: " << e.what());
      tuningNote_ += "; tuning at init failed: " + std::string(e.what());
      return;
    }
    if (rank_ == 0 && !cfg_.tuningFile.empty()) {
      try {
        saveTuningFile(t, cfg_.tuningFile);
        tuningNote_ += "; tuned at init, saved to " + cfg_.tuningFile;
      } catch (const Error& e) {
        ANYR_LOG(Warn, rank_, "could not save the tuning table: " << e.what());
      }
    }
  }
}

double Communicator::timePath(Op op, uint64_t bytes, int tokens, int hidden, void* const* bufs,
                              int calls, int samples, cudaStream_t s) {
  anyrFusedOptions_t fo = ANYR_FUSED_OPTIONS_INITIALIZER;
  if (op == Op::AddRmsNormQuant) {
    fo.quant = anyrQuantFp8;
    fo.scale = static_cast<const float*>(bufs[7]);
    fo.quantOut = bufs[6];
  }
  auto once = [&] {
    if (op == Op::AllReduce) {
      allReduce(bufs[0], bufs[1], bytes / 2, anyrBfloat16, anyrSum, s);
    } else {
      allReduceAddRmsNorm(bufs[2], bufs[3], bufs[3], bufs[4], 1e-6f, bufs[5],
                          static_cast<size_t>(tokens), static_cast<size_t>(hidden), anyrBfloat16,
                          &fo, s);
    }
  };
  cudaGraph_t g = nullptr;
  cudaGraphExec_t exec = nullptr;
  ANYR_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  try {
    for (int i = 0; i < calls; ++i) once();
  } catch (...) {
    (void)cudaStreamEndCapture(s, &g);
    if (g != nullptr) (void)cudaGraphDestroy(g);
    (void)cudaGetLastError();
    throw;
  }
  ANYR_CUDA_CHECK(cudaStreamEndCapture(s, &g));
  cudaError_t ie = cudaGraphInstantiate(&exec, g, 0);
  (void)cudaGraphDestroy(g);
  ANYR_CUDA_CHECK(ie);
  // Samples are replayed back to back and read after one wait: a host wait between samples
  // would let the ranks start each sample at a different time, and the first calls of every
  // sample would then time the other rank's lateness, not the path.
  std::vector<cudaEvent_t> ev(static_cast<size_t>(samples) + 1, nullptr);
  auto destroyEvents = [&] {
    for (cudaEvent_t e : ev) {
      if (e != nullptr) (void)cudaEventDestroy(e);
    }
  };
  std::vector<float> ms;
  try {
    for (cudaEvent_t& e : ev) ANYR_CUDA_CHECK(cudaEventCreate(&e));
    ANYR_CUDA_CHECK(cudaGraphLaunch(exec, s));  // warm-up
    ANYR_CUDA_CHECK(cudaGraphLaunch(exec, s));
    ANYR_CUDA_CHECK(cudaEventRecord(ev[0], s));
    for (int i = 0; i < samples; ++i) {
      ANYR_CUDA_CHECK(cudaGraphLaunch(exec, s));
      ANYR_CUDA_CHECK(cudaEventRecord(ev[static_cast<size_t>(i) + 1], s));
    }
    waitStreamIdle(s, "a tuning measurement", kTeardownGraceMs);
    for (int i = 0; i < samples; ++i) {
      float t = 0;
      ANYR_CUDA_CHECK(
          cudaEventElapsedTime(&t, ev[static_cast<size_t>(i)], ev[static_cast<size_t>(i) + 1]));
      ms.push_back(t);
    }
  } catch (...) {
    destroyEvents();
    (void)cudaGraphExecDestroy(exec);
    throw;
  }
  destroyEvents();
  (void)cudaGraphExecDestroy(exec);
  throwIfFailed();
  std::sort(ms.begin(), ms.end());
  return 1000.0 * ms[ms.size() / 2] / calls;
}

std::vector<int> Communicator::clusterSizesToMeasure(anyrAlgo_t algo, int tokens, int hidden,
                                                     int quant) const {
  std::vector<int> sizes;
  // Only where the sizes are this communicator's to choose: clusters admitted, the configured
  // size automatic, rows that clusters take (fused_algo.h), and the fused kernel itself.
  if (!clusterOn_ || cfg_.fusedCluster != 0 || !fusedClusterFits(hidden) ||
      !fusedRowFitsRegisters(hidden)) {
    return sizes;
  }
  const uint64_t rowBytes = static_cast<uint64_t>(hidden) * 2;
  const uint64_t perLaunch = fusedRowsPerLaunch(algo, rowBytes);
  if (perLaunch == 0) return sizes;
  const int rows = static_cast<int>(std::min<uint64_t>(static_cast<uint64_t>(tokens), perLaunch));
  const int rule = fusedClusterSize(rows, hidden, maxBlocks_, 0,
                                    clusterGridCap(hidden, 2, 0, algo, anyrBfloat16, quant));
  for (int c : {1, 2, 4, 8}) {
    if (c != rule) sizes.push_back(c);
  }
  return sizes;
}

void Communicator::tuneClusterSize(Op op, Path chosen, int tokens, const TuneOptions& o,
                                   void* const* bufs, cudaStream_t s, TunedPoint* tp, int* done,
                                   int* total, const TuneProgress& progress) {
  // The chosen fused kernel again under the automatic cluster rule (slot 0, the baseline, in
  // the same round as the others) and at every other cluster size. Every rank computes the
  // same list from agreed inputs; the slowest rank's times decide, and a size is taken only
  // when it beats the rule by more than kClusterMargin.
  constexpr double kClusterMargin = 0.02;
  // The quantized operation is measured with FP8 output (as timePath runs it).
  const std::vector<int> sizes = clusterSizesToMeasure(
      chosen.algo, tokens, o.hidden, op == Op::AddRmsNormQuant ? anyrQuantFp8 : anyrQuantNone);
  if (sizes.empty()) return;
  const uint64_t bytes = static_cast<uint64_t>(tokens) * static_cast<uint64_t>(o.hidden) * 2;
  *total += static_cast<int>(sizes.size()) + 1;
  PointSample mine{};
  std::vector<int> measured = {0};
  measured.insert(measured.end(), sizes.begin(), sizes.end());
  for (size_t k = 0; k < measured.size(); ++k) {
    Path v = chosen;
    v.cluster = measured[k];
    forcePath(op, v);
    mine.us[k] = timePath(op, bytes, tokens, o.hidden, bufs, o.calls, o.samples, s);
    clearForcedPath(op);
    ++*done;
    if (progress && rank_ == 0) {
      progress(*done, *total,
               std::string(opName(op)) + " " + std::to_string(bytes) + " B " + pathName(op, v) +
                   (v.cluster == 0 ? " (cluster rule)" : ""));
    }
  }
  std::vector<PointSample> all = bs_->allGatherValue(mine);
  std::vector<std::vector<double>> perRank;
  for (const PointSample& r : all) perRank.emplace_back(r.us, r.us + measured.size());
  std::vector<double> slowest;
  int32_t pick = agreeOverBaseline(perRank, kClusterMargin, &slowest);
  bs_->broadcast(&pick, sizeof(pick), 0);
  // The rule's time of this round (the baseline the sizes were compared with) as "<path>/rule",
  // then every size's.
  tp->times.emplace_back(pathName(op, chosen) + "/rule", slowest[0]);
  for (size_t k = 1; k < measured.size(); ++k) {
    Path v = chosen;
    v.cluster = measured[k];
    tp->times.emplace_back(pathName(op, v), slowest[k]);
  }
  if (pick > 0) {
    Path v = chosen;
    v.cluster = measured[static_cast<size_t>(pick)];
    tp->choice = pathName(op, v);
  }
}

TuningTable Communicator::tune(const TuneOptions& local, const TuneProgress& progress) {
  // One call from start to end: its measurements, forced paths and new table are not to
  // interleave with another thread's calls, nor to outlive an anyrCommDestroy. Collective: a
  // rank that refuses it or fails in it stops the communicator on every rank (collectiveCall).
  TuningTable result;
  collectiveCall("anyrCommTune", [&](bool& settled) {
    ANYR_REQUIRE_ARG(local.budgetMs >= 0, "budgetMs", "must be >= 0 (0 = no limit)");
    // Every rank refuses a single-rank communicator alike.
    settled = nranks_ <= 1;
    ANYR_REQUIRE_ARG(nranks_ > 1, "comm", "tuning needs 2 ranks or more");
    requireHealthy(settled);
    result = tuneHealthy(local, progress);
  });
  return result;
}

TuningTable Communicator::tuneHealthy(const TuneOptions& local, const TuneProgress& progress) {
  // Rank 0's options are everyone's.
  TuneOptions o = local;
  bs_->broadcast(&o, sizeof(o), 0);
  ANYR_REQUIRE_ARG(o.minBytes >= 2 && o.minBytes <= o.maxBytes && o.maxBytes <= (4ull << 30),
                   "tune.minBytes/maxBytes", "must satisfy 2 <= min <= max <= 4 GiB");
  ANYR_REQUIRE_ARG(fusedHiddenValid(static_cast<uint64_t>(o.hidden)), "tune.hidden",
                   "must be a multiple of " + std::to_string(kFusedHiddenMultiple) + " in " +
                       std::to_string(kFusedMinHidden) + ".." + std::to_string(kFusedMaxHidden));
  ANYR_REQUIRE_ARG(o.maxTokens >= 1 && o.maxTokens <= 65536, "tune.maxTokens",
                   "must be in 1..65536");
  ANYR_REQUIRE_ARG(o.calls >= 1 && o.samples >= 1, "tune.calls/samples", "must be >= 1");

  // The plan: (operation, bucket, tokens) points, each with its admitted candidates.
  struct Point {
    Op op;
    int bucket;
    int tokens;
  };
  std::vector<Point> plan;
  for (int b = bucketOf(o.minBytes); b <= bucketOf(o.maxBytes); ++b) {
    plan.push_back({Op::AllReduce, b, 0});
  }
  for (Op op : {Op::AddRmsNorm, Op::AddRmsNormQuant}) {
    int last = -1;
    for (int t = 1; t <= o.maxTokens; t *= 2) {
      const int b = bucketOf(static_cast<uint64_t>(t) * static_cast<uint64_t>(o.hidden) * 2);
      if (b != last) plan.push_back({op, b, t});
      last = b;
    }
  }
  int total = 0;
  for (const Point& p : plan) {
    for (const Candidate& c : candidatesOf(p.op)) total += c.admitted ? 1 : 0;
  }

  // Buffers: all-reduce in/out; fused partial, residual, weight, output, FP8 output, scale.
  const uint64_t arBytes = bucketBytes(bucketOf(o.maxBytes));
  const uint64_t fusedBytes =
      static_cast<uint64_t>(o.maxTokens) * static_cast<uint64_t>(o.hidden) * 2;
  const uint64_t sizes[8] = {arBytes,
                             arBytes,
                             fusedBytes,
                             fusedBytes,
                             static_cast<uint64_t>(o.hidden) * 2,
                             fusedBytes,
                             fusedBytes / 2 + 16,
                             sizeof(float)};
  void* bufs[8] = {};
  cudaStream_t s = nullptr;
  auto release = [&] {
    // Bounded: after a failed measurement NCCL's kernels may still wait for a peer. Buffers
    // that work may still use are left allocated (cudaFree would wait for it), and the
    // communicator is failed, so that its destruction aborts NCCL.
    bool idle = true;
    if (s != nullptr) {
      try {
        idle = streamIdleWithin(s, cfg_.timeoutMs + kTeardownGraceMs);
      } catch (const Error&) {
        // the stream's error is the measurement's, already being reported
      }
      (void)cudaGetLastError();
    }
    if (!idle) {
      setFailed(anyrTimeout, "rank " + std::to_string(rank_) +
                                 ": tuning's last measurement did not finish within " +
                                 std::to_string(cfg_.timeoutMs + kTeardownGraceMs) + " ms");
    }
    for (void*& p : bufs) {
      if (p != nullptr && idle) (void)cudaFree(p);
      p = nullptr;
    }
    if (s != nullptr) (void)cudaStreamDestroy(s);
    s = nullptr;
    for (int i = 0; i < kNumOps; ++i) clearForcedPath(static_cast<Op>(i));
  };
  TuningTable table;
  try {
    ANYR_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (int i = 0; i < 8; ++i) {
      ANYR_CUDA_CHECK(cudaMalloc(&bufs[i], sizes[i]));
      // 0x3c3c as bf16 is 0.0115: finite small values (the timing does not depend on them).
      ANYR_CUDA_CHECK(cudaMemsetAsync(bufs[i], 0x3c, sizes[i], s));
    }
    // Bounded waits (a pageable copy would wait for the memsets without a bound of ours).
    waitStreamIdle(s, "preparing the tuning buffers");
    const float one = 1.0f;
    ANYR_CUDA_CHECK(cudaMemcpyAsync(bufs[7], &one, sizeof(one), cudaMemcpyHostToDevice, s));
    waitStreamIdle(s, "preparing the tuning buffers");

    table.fingerprint = fingerprintOf(topo_, nranks_, tuningSettings());
    table.hidden = o.hidden;
    table.method = "cuda-graph replay of " + std::to_string(o.calls) + " calls, median of " +
                   std::to_string(o.samples) + " samples, bf16, slowest rank";
    const auto t0 = std::chrono::steady_clock::now();
    int done = 0;
    for (const Point& p : plan) {
      const std::vector<Candidate>& cands = candidatesOf(p.op);
      const uint64_t bytes = p.op == Op::AllReduce ? bucketBytes(p.bucket)
                                                   : static_cast<uint64_t>(p.tokens) * o.hidden * 2;
      PointSample mine{};
      std::vector<int> index;  // candidate indices measured at this point
      for (size_t c = 0; c < cands.size() && index.size() < kMaxCands; ++c) {
        if (!cands[c].admitted) continue;
        const int slot = static_cast<int>(index.size());
        index.push_back(static_cast<int>(c));
        forcePath(p.op, cands[c].path);
        mine.us[slot] = timePath(p.op, bytes, p.tokens, o.hidden, bufs, o.calls, o.samples, s);
        clearForcedPath(p.op);
        ++done;
        if (progress && rank_ == 0) {
          progress(done, total,
                   std::string(opName(p.op)) + " " + std::to_string(bytes) + " B " +
                       pathName(p.op, cands[c].path));
        }
      }
      mine.elapsedMs =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      std::vector<PointSample> all = bs_->allGatherValue(mine);
      std::vector<std::vector<double>> perRank;
      for (const PointSample& r : all) {
        perRank.emplace_back(r.us, r.us + index.size());
      }
      // Every rank can compute this; rank 0's answer is the one used (broadcast).
      std::vector<double> slowest;
      int32_t choice = agreeChoice(perRank, &slowest);
      bs_->broadcast(&choice, sizeof(choice), 0);
      if (choice >= 0) {
        TunedPoint tp;
        tp.bucket = p.bucket;
        const Path chosen = cands[static_cast<size_t>(index[static_cast<size_t>(choice)])].path;
        tp.choice = pathName(p.op, chosen);
        for (size_t k = 0; k < index.size(); ++k) {
          tp.times.emplace_back(pathName(p.op, cands[static_cast<size_t>(index[k])].path),
                                slowest[k]);
        }
        if (chosen.fusedKernel) {
          tuneClusterSize(p.op, chosen, p.tokens, o, bufs, s, &tp, &done, &total, progress);
        }
        table.points[static_cast<size_t>(p.op)].push_back(tp);
      }
      if (o.budgetMs > 0 && all[0].elapsedMs > o.budgetMs) {
        ANYR_LOG(Warn, rank_,
                 "tuning stopped by its budget of "
                     << o.budgetMs << " ms after " << done << " of " << total
                     << " measurements; other sizes take the nearest measured choice");
        break;
      }
    }
  } catch (...) {
    release();
    throw;
  }
  release();
  {
    std::lock_guard<std::mutex> lock(tableMu_);
    dispatch_ = seedTable(topo_, admission_, cfg_, nranks_);  // drop an earlier table's choices
  }
  installTuning(table, "tuning", "measured by this communicator");
  return table;
}

}  // namespace anyr
