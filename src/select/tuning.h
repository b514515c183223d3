// The tuning table: measured choices per operation and size bucket, saved as JSON and keyed
// by a fingerprint of the machine (GPU models, driver, link matrix, world size, library
// version). Loaded at communicator init when the fingerprint matches; a mismatch is reported
// and ignored; a corrupt, truncated or foreign file gives a warning and the seed, never a
// crash. Pure host code: the measuring lives in src/core/tune.cc.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "select/dispatch.h"
#include "topology/fabric.h"
#include "topology/topology.h"

namespace anyr {

struct Fingerprint {
  std::string library;  // library version
  int worldSize = 0;
  std::vector<std::string> gpus;   // model names, rank order
  std::string driver;              // driver version text and CUDA driver API version
  std::vector<std::string> links;  // "0->1 nvlink x18 numa write+ read+" per ordered pair
  // The communicator settings that shape kernels and so the times ("maxBlocks 132", "wire
  // native", ...; Tuner::tuningSettings). Empty in tables written before they were
  // recorded: those are compared on the machine alone.
  std::vector<std::string> settings;
  bool operator==(const Fingerprint& o) const;
  // "" if equal, else the first difference ("worldSize: file 8, this machine 2").
  std::string firstDifference(const Fingerprint& mine) const;
};
Fingerprint fingerprintOf(const Topology& rankTopo, int nranks,
                          std::vector<std::string> settings = {});

struct TunedPoint {
  int bucket = 0;
  // pathName of the chosen candidate; for a fused kernel with a measured cluster size, the
  // name ends in "/cN". Where the sizes were measured, `times` holds each ("<path>/cN") and the
  // automatic rule's time of the same round ("<path>/rule"), the baseline they were compared
  // with.
  std::string choice;
  std::vector<std::pair<std::string, double>> times;  // candidate -> slowest rank's us (<0 failed)
};

struct TuningTable {
  static constexpr int kFormatVersion = 1;
  Fingerprint fingerprint;
  int hidden = 6144;   // row width the fused operations were measured at
  std::string method;  // how the times were taken ("cuda-graph replay, ...")
  std::array<std::vector<TunedPoint>, kNumOps> points;
  // The fabric the communicator measured (core/fabric.h), cached for later inits on the same
  // machine, topology and world ("fabric" in the file; absent where nothing was measured). It
  // holds whatever the tuning settings: loadFabricFor compares the machine alone.
  bool hasFabric = false;
  FabricRecord fabric;
};

std::string tuningToJson(const TuningTable& t);
// Throws anyrInvalidArgument naming the first bad field ("ops.allreduce[3].bucket: ...").
TuningTable tuningFromJson(const std::string& text);
void saveTuningFile(const TuningTable& t, const std::string& path);

// The table in `path` if it can be used for `mine`; otherwise false with *why: unreadable,
// not JSON, not a tuning file, truncated, or made for another machine (first difference).
bool loadTuningFor(const std::string& path, const Fingerprint& mine, TuningTable* out,
                   std::string* why);

// The fabric record cached in the tuning file `path` if it holds one for `mine` (compared on the
// machine alone: library version, world size, GPUs, driver, links; not the tuning settings);
// otherwise false with *why: unreadable, not a tuning file, no fabric record, or one made for
// another machine or world ("stale": the first difference). The record's state is Cached, its
// cachedIn `path`. *present (may be null): the file is a tuning table that holds a record.
bool loadFabricFor(const std::string& path, const Fingerprint& mine, FabricRecord* out,
                   std::string* why, bool* present = nullptr);

// Measured choices onto `table`: each measured bucket takes its choice, every other bucket
// the choice of the nearest measured one. A choice this communicator does not admit (or an
// unknown name) is skipped and reported in *warnings. A choice's cluster size ("/c2") needs
// `clustersOn` (thread-block clusters admitted) when above 1; without, the choice is kept
// with the automatic cluster rule, and *warnings says so.
void applyTuning(const TuningTable& t, const std::array<std::vector<Candidate>, kNumOps>& cands,
                 bool clustersOn, DispatchTable* table, std::vector<std::string>* warnings);

}  // namespace anyr
