// Tuning's measurements (core/tune.h): the tuning table loaded or measured at init, and the
// measuring behind `anyreduce tune` / anyrCommTune. Every measurement is a call of the
// communicator's own (captured into a graph and replayed) with one path forced through the
// selector; the choices themselves are pure functions in src/select (dispatch.h, tuning.h).
#include "core/tune.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>

#include "base/error.h"
#include "base/log.h"
#include "base/names.h"
#include "core/comm.h"
#include "core/timing_events.h"
#include "fused/fused.h"
#include "fused/fused_algo.h"

namespace anyr {

namespace {

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

Tuner::Tuner(Communicator& c) : c_(c), ctx_(c.ctx_), sel_(c.sel_), caps_(c.caps_) {}

std::vector<std::string> Tuner::tuningSettings() const {
  return {"maxBlocks " + std::to_string(caps_.maxBlocks()) + " peer " +
              std::to_string(caps_.peerBlocks()),
          "fusedCluster " + std::to_string(ctx_.cfg.fusedCluster) +
              (caps_.clusterOn() ? " on" : " off") + " pairs " +
              std::to_string(caps_.clusterPairBlocks()) + " at " + caps_.clusterPairThreadsJson(),
          std::string("programmaticLaunch ") + (caps_.pdlOn() ? "on" : "off") +
              (caps_.releaseEarly() != 0 ? " early" : ""),
          std::string("wire ") + wireName(ctx_.cfg.wire),
          "chunkBytes " + std::to_string(ctx_.cfg.chunkBytes) + " oneShotMaxBytes " +
              std::to_string(ctx_.cfg.oneShotMaxBytes) + " twoShotMaxBytes " +
              std::to_string(ctx_.cfg.twoShotMaxBytes),
          "hostLaunchBytes " + std::to_string(ctx_.cfg.hostLaunchBytes) + " copyChunk " +
              std::to_string(ctx_.cfg.hostCopyChunkBytes),
          "hostLowLatencyBytes " + std::to_string(ctx_.cfg.hostLowLatencyBytes) + " eager " +
              std::to_string(ctx_.cfg.hostLowLatencyEagerBytes) +
              // Forced islands shape the two-level all-reduce (the topology's are in the link
              // matrix); named only where set, so tables measured without them still match.
              (ctx_.cfg.islands != 0 ? " islands " + islandsText(ctx_.cfg.islands) : "")};
}

void Tuner::loadOrTuneAtInit() {
  // Only rank 0 reads the file; it sends its verdict and the table (or the reason it was not
  // used) to everyone, so every rank installs the same table.
  struct Head {
    int32_t ok;
    int32_t budgetMs;
    uint64_t len;
  };
  Head h{0, ctx_.cfg.tuneBudgetMs, 0};
  std::string text;
  if (ctx_.rank == 0 && !ctx_.cfg.tuningFile.empty()) {
    TuningTable t;
    std::string why;
    if (loadTuningFor(ctx_.cfg.tuningFile, fingerprintOf(ctx_.topo, ctx_.nranks, tuningSettings()),
                      &t, &why)) {
      h.ok = 1;
      text = tuningToJson(t);
    } else {
      text = why;
    }
  }
  h.len = text.size();
  ctx_.bs->broadcast(&h, sizeof(h), 0);
  text.resize(static_cast<size_t>(h.len));
  if (h.len > 0) ctx_.bs->broadcast(text.data(), text.size(), 0);
  if (h.ok) {
    sel_.installTuning(tuningFromJson(text), "tuning table", "loaded (fingerprint matches)");
    ANYR_LOG(Info, ctx_.rank, "dispatch: tuning table loaded; measured choices in use");
    return;
  }
  if (h.len > 0) {
    sel_.setTuningNote("ignored: " + text);
    if (ctx_.rank == 0) ANYR_LOG(Warn, ctx_.rank, "tuning table ignored, using the seed: " << text);
  } else {
    sel_.setTuningNote("none (seed choices)");
  }
  if (h.budgetMs > 0 && ctx_.nranks > 1) {
    TuneOptions o;
    o.budgetMs = h.budgetMs;
    TuningTable t;
    try {
      t = c_.tune(o, nullptr);
    } catch (const Error& e) {
      // Every rank ends here (a rank that fails stops taking part, and the others' bounded
      // exchanges then fail too); tune() installs nothing unless it completed, so every rank
      // keeps the seed.
      ANYR_LOG(Warn, ctx_.rank, "tuning at init failed, using the seed: " << e.what());
      sel_.appendTuningNote("; tuning at init failed: " + std::string(e.what()));
      return;
    }
    if (ctx_.rank == 0 && !ctx_.cfg.tuningFile.empty()) {
      try {
        saveTuningFile(t, ctx_.cfg.tuningFile);
        sel_.appendTuningNote("; tuned at init, saved to " + ctx_.cfg.tuningFile);
      } catch (const Error& e) {
        ANYR_LOG(Warn, ctx_.rank, "could not save the tuning table: " << e.what());
      }
    }
  }
}

double Tuner::timePath(Op op, uint64_t bytes, int tokens, int hidden, void* const* bufs, int calls,
                       int samples, cudaStream_t s) {
  anyrFusedOptions_t fo = ANYR_FUSED_OPTIONS_INITIALIZER;
  if (op == Op::AddRmsNormQuant) {
    fo.quant = anyrQuantFp8;
    fo.scale = static_cast<const float*>(bufs[7]);
    fo.quantOut = bufs[6];
  }
  auto once = [&] {
    if (op == Op::AllReduce) {
      c_.allReduce(bufs[0], bufs[1], bytes / 2, anyrBfloat16, anyrSum, s);
    } else {
      c_.allReduceAddRmsNorm(bufs[2], bufs[3], bufs[3], bufs[4], 1e-6f, bufs[5],
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
  std::vector<float> ms;
  try {
    const TimingEvents ev(static_cast<size_t>(samples) + 1);
    ANYR_CUDA_CHECK(cudaGraphLaunch(exec, s));  // warm-up
    ANYR_CUDA_CHECK(cudaGraphLaunch(exec, s));
    ANYR_CUDA_CHECK(cudaEventRecord(ev[0], s));
    for (int i = 0; i < samples; ++i) {
      ANYR_CUDA_CHECK(cudaGraphLaunch(exec, s));
      ANYR_CUDA_CHECK(cudaEventRecord(ev[static_cast<size_t>(i) + 1], s));
    }
    ctx_.waitStreamIdle(s, "a tuning measurement", CommContext::kTeardownGraceMs);
    for (int i = 0; i < samples; ++i) {
      float t = 0;
      ANYR_CUDA_CHECK(
          cudaEventElapsedTime(&t, ev[static_cast<size_t>(i)], ev[static_cast<size_t>(i) + 1]));
      ms.push_back(t);
    }
  } catch (...) {
    (void)cudaGraphExecDestroy(exec);
    throw;
  }
  (void)cudaGraphExecDestroy(exec);
  c_.failure_.throwIfFailed();
  std::sort(ms.begin(), ms.end());
  return 1000.0 * ms[ms.size() / 2] / calls;
}

void Tuner::tuneClusterSize(Op op, Path chosen, int tokens, const TuneOptions& o, void* const* bufs,
                            cudaStream_t s, TunedPoint* tp, int* done, int* total,
                            const TuneProgress& progress) {
  // The chosen fused kernel again under the automatic cluster rule (slot 0, the baseline, in
  // the same round as the others) and at every other cluster size. Every rank computes the
  // same list from agreed inputs; the slowest rank's times decide, and a size is taken only
  // when it beats the rule by more than kClusterMargin.
  constexpr double kClusterMargin = 0.02;
  // The quantized operation is measured with FP8 output (as timePath runs it).
  const std::vector<int> sizes = c_.fused_.clusterSizesToMeasure(
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
    sel_.forcePath(op, v);
    mine.us[k] = timePath(op, bytes, tokens, o.hidden, bufs, o.calls, o.samples, s);
    sel_.clearForcedPath(op);
    ++*done;
    if (progress && ctx_.rank == 0) {
      progress(*done, *total,
               std::string(opName(op)) + " " + std::to_string(bytes) + " B " + pathName(op, v) +
                   (v.cluster == 0 ? " (cluster rule)" : ""));
    }
  }
  std::vector<PointSample> all = ctx_.bs->allGatherValue(mine);
  std::vector<std::vector<double>> perRank;
  for (const PointSample& r : all) perRank.emplace_back(r.us, r.us + measured.size());
  std::vector<double> slowest;
  int32_t pick = agreeOverBaseline(perRank, kClusterMargin, &slowest);
  ctx_.bs->broadcast(&pick, sizeof(pick), 0);
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

TuningTable Tuner::tuneHealthy(const TuneOptions& local, const TuneProgress& progress) {
  // Rank 0's options are everyone's.
  TuneOptions o = local;
  ctx_.bs->broadcast(&o, sizeof(o), 0);
  ANYR_REQUIRE_ARG(o.minBytes >= 2 && o.minBytes <= o.maxBytes && o.maxBytes <= (4ull << 30),
                   "tune.minBytes/maxBytes", "must satisfy 2 <= min <= max <= 4 GiB");
  ANYR_REQUIRE_ARG(fusedHiddenValid(static_cast<uint64_t>(o.hidden)), "tune.hidden",
                   "must be a multiple of " + std::to_string(kFusedHiddenMultiple) + " in " +
                       std::to_string(kFusedMinHidden) + ".." + std::to_string(kFusedMaxHidden));
  ANYR_REQUIRE_ARG(o.maxTokens >= 1 && o.maxTokens <= 65536, "tune.maxTokens",
                   "must be in 1..65536");
  ANYR_REQUIRE_ARG(o.calls >= 1 && o.samples >= 1, "tune.calls/samples", "must be >= 1");
  // The fabric measured afresh (unless this communicator's own measurement is current), so that
  // the table saved carries a current record; the seed follows the new figures.
  if (c_.fabric_.refreshForTuning(sel_.tableMu())) sel_.refit(ctx_.topo, ctx_.cfg);

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
    for (const Candidate& c : sel_.candidatesOf(p.op)) total += c.admitted ? 1 : 0;
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
        idle = ctx_.streamIdleWithin(s, ctx_.cfg.timeoutMs + CommContext::kTeardownGraceMs);
      } catch (const Error&) {
        // the stream's error is the measurement's, already being reported
      }
      (void)cudaGetLastError();
    }
    if (!idle) {
      c_.failure_.setFailed(anyrTimeout,
                            "rank " + std::to_string(ctx_.rank) +
                                ": tuning's last measurement did not finish within " +
                                std::to_string(ctx_.cfg.timeoutMs + CommContext::kTeardownGraceMs) +
                                " ms");
    }
    for (void*& p : bufs) {
      if (p != nullptr && idle) (void)cudaFree(p);
      p = nullptr;
    }
    if (s != nullptr) (void)cudaStreamDestroy(s);
    s = nullptr;
    for (int i = 0; i < kNumOps; ++i) sel_.clearForcedPath(static_cast<Op>(i));
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
    ctx_.waitStreamIdle(s, "preparing the tuning buffers");
    const float one = 1.0f;
    ANYR_CUDA_CHECK(cudaMemcpyAsync(bufs[7], &one, sizeof(one), cudaMemcpyHostToDevice, s));
    ctx_.waitStreamIdle(s, "preparing the tuning buffers");

    table.fingerprint = fingerprintOf(ctx_.topo, ctx_.nranks, tuningSettings());
    table.hidden = o.hidden;
    table.method = "cuda-graph replay of " + std::to_string(o.calls) + " calls, median of " +
                   std::to_string(o.samples) + " samples, bf16, slowest rank";
    const auto t0 = std::chrono::steady_clock::now();
    int done = 0;
    for (const Point& p : plan) {
      const std::vector<Candidate>& cands = sel_.candidatesOf(p.op);
      const uint64_t bytes = p.op == Op::AllReduce ? bucketBytes(p.bucket)
                                                   : static_cast<uint64_t>(p.tokens) * o.hidden * 2;
      PointSample mine{};
      std::vector<int> index;  // candidate indices measured at this point
      for (size_t c = 0; c < cands.size() && index.size() < kMaxCands; ++c) {
        if (!cands[c].admitted) continue;
        const int slot = static_cast<int>(index.size());
        index.push_back(static_cast<int>(c));
        sel_.forcePath(p.op, cands[c].path);
        mine.us[slot] = timePath(p.op, bytes, p.tokens, o.hidden, bufs, o.calls, o.samples, s);
        sel_.clearForcedPath(p.op);
        ++done;
        if (progress && ctx_.rank == 0) {
          progress(done, total,
                   std::string(opName(p.op)) + " " + std::to_string(bytes) + " B " +
                       pathName(p.op, cands[c].path));
        }
      }
      mine.elapsedMs =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      std::vector<PointSample> all = ctx_.bs->allGatherValue(mine);
      std::vector<std::vector<double>> perRank;
      for (const PointSample& r : all) {
        perRank.emplace_back(r.us, r.us + index.size());
      }
      // Every rank can compute this; rank 0's answer is the one used (broadcast).
      std::vector<double> slowest;
      int32_t choice = agreeChoice(perRank, &slowest);
      ctx_.bs->broadcast(&choice, sizeof(choice), 0);
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
        ANYR_LOG(Warn, ctx_.rank,
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
  if (c_.fabric_.record().hasFigures()) {
    table.hasFabric = true;
    table.fabric = c_.fabric_.record();
  }
  sel_.reseed(ctx_.topo, ctx_.cfg);  // drop an earlier table's choices
  sel_.installTuning(table, "tuning", "measured by this communicator");
  return table;
}

}  // namespace anyr
