// The fabric a communicator runs on, measured live (ANYR_FABRIC, config.fabric): at init, after
// the peer workspace is mapped and its transfer checks passed and the host transport is set up,
// and before admission, every rank measures, over the workspace where there is one,
//   - its own ordered pairs, one rank at a time (no other rank moves data meanwhile): the
//     bandwidth of its kernel storing into each peer's staging and loading from it, and half a
//     flag round trip to the peer's memory (the idle one-way latency);
//   - then, every rank at once: storing into every peer (all-to-all, per GPU), into its ring
//     neighbour only, synchronisation rounds (1 KB and a flag to every peer, then a wait for
//     all of theirs: a small one-shot push), and one-partner rounds (1 KB and a flag to the next
//     rank, then a wait for the previous one's: a round of the staged and doubling pushes);
//   - where the host transport is set up (with or without the peer workspace), every rank at
//     once through the host memory: the copy engines both ways at once (a device-to-host copy
//     into its own region beside a host-to-device copy out of the previous rank's) and
//     synchronisation rounds through it (a step of the host algorithms);
// the rows are gathered through the bootstrap and combined on every rank alike
// (topology/fabric.h, combineFabric: the worst rank counts), and the record fills the
// topology's pair figures and Topology::load, which admission's slow-write rule and the seed
// cost model read; every rank checks that the others hold the same record. A record cached with
// the tuning table (ANYR_TUNING_FILE, the same fingerprint of machine, topology and world) is
// used instead of measuring; anyrCommTune (`anyreduce tune`) measures afresh and the table it
// saves carries the record.
//
// Bounded and never fatal: every device wait is bounded (min(5 s, timeout / 4)) and a rank that
// gives up tells its peers through their flags; a step that fails on a rank (a CUDA error, a
// wait that ran out) is recorded in that rank's row and the rank goes on taking part in the
// exchanges, so every rank ends with the same record: "not measured: rank R: why", nominal
// figures and the seed. Only a bootstrap exchange that runs out throws (naming the rank), as
// every collective step of init does. Ranks that share a GPU measure (the protocol runs and
// agrees) with the fewest rounds, and do not apply the figures: they are that GPU's own memory,
// not a fabric's.
#pragma once

#include <mutex>
#include <string>

#include "core/comm_part.h"
#include "topology/fabric.h"

namespace anyr {

struct CommContext;
class PeerWorkspace;
class HostTransport;

class Fabric : private CommPart {
 public:
  Fabric(CommContext& ctx, const PeerWorkspace& workspace, HostTransport& host)
      : CommPart(ctx), ws_(workspace), host_(host) {}

  // Collective, at init after the transport check and before admission: the record by the
  // agreed config.fabric (cached, measured, or neither), applied to the context's topology where
  // it applies. Logs the cost on rank 0.
  void atInit();
  // Collective (anyrCommTune, before it measures): in mode "measure", measures again unless the
  // record is this communicator's own measurement (or a measurement of this communicator
  // failed: it does not try again); `topoMu` guards the topology against explain while the new
  // record is applied. True when the topology's figures changed.
  bool refreshForTuning(std::mutex& topoMu);
  const FabricRecord& record() const { return record_; }

 private:
  // Collective: measures and combines (`what` names it: "measured at init").
  FabricRecord measure(const std::string& what);
  // Collective: rank 0 reads the record cached in config.tuningFile; true with *out where it
  // matches this communicator, else false with *why.
  bool loadCached(FabricRecord* out, std::string* why);
  // Sets whether `r` applies here (and why not), checks that every rank holds the same record,
  // then makes it this communicator's and applies it to the topology (under `topoMu` if given).
  void install(FabricRecord r, std::mutex* topoMu);

  const PeerWorkspace& ws_;
  HostTransport& host_;  // its segment's copy area and copy streams, at init and before tuning
  FabricRecord record_;
  bool failedBefore_ = false;  // a measurement failed (agreed: from its combined record)
  bool hung_ = false;          // this rank's kernels did not drain: nothing more is launched
  bool testApply_ = false;     // ANYR_TEST_FABRIC_APPLY (rank 0's)
};

}  // namespace anyr
