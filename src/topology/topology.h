// The capability model every decision is made from. Filled by the live probe (probe.h), by
// a communicator's init-time checks, or loaded from a JSON file, so that every decision can
// be tested on a machine without GPUs. Nothing here names an architecture: only capabilities
// and measurements.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace anyr {

enum class LinkType {
  Unknown = 0,
  Self,    // the same GPU (several ranks on one device, or the diagonal)
  NVLink,  // direct NVLink between the two GPUs
  PCIe,    // peer-to-peer over PCIe
  None,    // no peer-to-peer path: traffic would go through host memory
};
const char* linkTypeName(LinkType t);
bool parseLinkType(const std::string& s, LinkType* out);

struct GpuInfo {
  int index = -1;        // CUDA device ordinal in the probing process, or rank
  std::string name;      // as the driver reports it (informational only)
  std::string pciBusId;  // "0000:19:00.0"
  std::string uuid;
  uint64_t hostHash = 0;         // equal for GPUs of one host
  int ccMajor = 0, ccMinor = 0;  // informational; never used to decide
  int smCount = 0;
  int64_t sharedMemPerBlockOptin = 0;  // bytes a block can opt in to
  int64_t sharedMemPerSm = 0;
  bool clusterLaunch = false;  // thread-block clusters supported
  bool hostNativeAtomics = false;
  int64_t totalMemBytes = 0;
  int numaNode = -1;               // -1: unknown
  int pcieGen = 0, pcieWidth = 0;  // current link, 0 if unknown
  // The link's maximum in this system (0 if unknown): what it trains to under load. Nominal
  // bandwidths come from these, not from the current link (an idle GPU may sit at Gen1).
  int pcieMaxGen = 0, pcieMaxWidth = 0;
};

// What one ordered pair (src -> dst) can do. "Confirmed" fields come from real transfers;
// "driver" fields from what the driver/NVML report. Measurements are < 0 when not measured.
struct PairInfo {
  int src = -1, dst = -1;
  LinkType link = LinkType::Unknown;
  int nvlinkCount = 0;            // links between the two GPUs
  double linkGBps = -1;           // nominal per direction (links x per-link speed)
  std::string pcieRelation;       // NVML common ancestor: "board","switch","switches",
                                  // "hostbridge","numa","system" or ""
  bool driverPeerAccess = false;  // cudaDeviceCanAccessPeer
  bool driverAtomics = false;     // driver reports native peer atomics
  bool peerWriteOk = false;       // src wrote into dst's memory and dst saw it
  bool peerReadOk = false;        // src read dst's memory and got the right data
  bool peerAtomicOk = false;      // src's atomics on dst's memory gave the right result
  double writeGBps = -1;          // src kernel storing into dst memory
  double readGBps = -1;           // src kernel loading from dst memory
  double latencyUs = -1;          // one-way flag latency src -> dst
};

// The fabric under load: figures of every rank moving data at once, which a pair's idle
// figures do not give (PCIe switches and host bridges share uplinks; flags queue behind data).
// Measured by a communicator at init, or given by a fixture from published measurements. Each
// figure is < 0 when not known; `ranks` is the world size they hold for (0: none known).
struct FabricLoad {
  int ranks = 0;
  double allToAllGBps = -1;  // per GPU: storing into every peer at once, every rank
  double ringGBps = -1;      // per GPU: storing into the ring neighbour only, every rank
  double islandGBps = -1;    // per GPU: storing into every peer of its own island, every rank
  double ringCopyGBps = -1;  // per GPU: its copy engine pulling from the ring neighbour, every rank
  double syncUs = -1;        // one round: every rank raises a flag at every peer, waits for all
  double ringHopUs = -1;     // NCCL's ring hop (a fixture's figure; no measurement takes it)
  // One round with one partner, every rank at once: 1 KB and a flag to the ring neighbour, then
  // a wait for the other neighbour's (the round of the staged and doubling pushes, the ring's
  // hand-off).
  double hopUs = -1;
  // The islands islandGBps was measured over (Islands::text(), "0-3 | 4-7"); "" where a fixture
  // gives it for the topology's own islands. A figure measured over other islands than the ones
  // in use is not applied to them (select/dispatch.cc).
  std::string islands;
  // Through the shared host memory (the host transport), every rank at once: the copy engines'
  // rate per GPU and direction, both directions at once (a device-to-host copy into the own
  // region beside a host-to-device copy out of a peer's), and one synchronisation round through
  // it (1 KB and a flag into every peer's region, then a wait for all of theirs: a step of the
  // host algorithms).
  double hostGBps = -1;
  double hostStepUs = -1;
  std::string source;  // "measured", "record", or a fixture's citation
  bool known() const { return ranks > 0; }
};

struct Topology {
  static constexpr int kFormatVersion = 1;
  std::string source;  // "probe", "communicator", "fixture:<name>", ...
  std::string hostName;
  std::string driverVersion;  // e.g. "580.159.04", "" if unknown
  int cudaDriverVersion = 0;  // cudaDriverGetVersion
  int cudaRuntimeVersion = 0;
  std::vector<GpuInfo> gpus;    // index i = device i (probe) or rank i (communicator)
  std::vector<PairInfo> pairs;  // n*n, row-major by src then dst (diagonal included)
  FabricLoad load;              // optional in the file ("load")
  // Where a fixture's figures come from (publication, author, date); optional in the file.
  std::vector<std::string> sources;

  int size() const { return static_cast<int>(gpus.size()); }
  const PairInfo& pair(int src, int dst) const;
  PairInfo& pair(int src, int dst);
  // Sizes pairs to n*n with src/dst filled in and the diagonal marked Self.
  void resizePairs();
};

// JSON round trip. fromJson throws anyrInvalidArgument with the JSON path of the first bad
// field ("gpus[2].smCount: must be an integer >= 0"); it never crashes on bad input.
std::string topologyToJson(const Topology& t, int indent = 2);
Topology topologyFromJson(const std::string& text);
Topology loadTopologyFile(const std::string& path);

// The first n GPUs of `t` (n <= t.size()) and their pairs, as a communicator of n ranks over
// them sees them.
Topology firstGpus(const Topology& t, int n);
void saveTopologyFile(const Topology& t, const std::string& path);

// Human-readable tables (GPUs, then the pair matrix for each property).
void printTopology(const Topology& t, std::ostream& os);

}  // namespace anyr
