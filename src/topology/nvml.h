// NVML, loaded at run time. anyreduce does not link against libnvidia-ml: the library is opened
// with dlopen on first use, and every query degrades to "unknown" when the library, a function
// or an answer is missing (logged once at INFO; never an error). NVML only adds driver-reported
// facts (NVLink wiring, PCIe ancestry, P2P capability bits, PCIe link); every decision that
// matters is confirmed by real transfers in the probe.
//
// Thread safety: initialization is lazy and guarded by a mutex; NVML queries themselves are
// thread-safe. shutdown() must not race with other calls into this module.
#pragma once

#include <string>
#include <vector>

namespace anyr {
namespace nvml {

// True when libnvidia-ml.so.1 is loaded and nvmlInit_v2 succeeded (tried once, lazily).
bool available();

// Releases NVML (nvmlShutdown). Optional: NVML may stay initialized for the whole process. A
// later query initializes it again.
void shutdown();

// "dddd:bb:dd.f" in lower case (4-digit domain, 8 when it does not fit), from any of the
// spellings CUDA, NVML and sysfs use ("0000:1B:00.0", "00000000:1b:00.0", "1b:00.0").
// "" when `busId` is not a PCI address.
std::string normalizeBusId(const std::string& busId);

// Driver version ("580.95.05"), or "" when unknown.
std::string driverVersion();

// PCIe link of the GPU at `busId`: the current generation and width (an idle GPU may train
// down, to Gen1 on some workstation boards), and the maximum this GPU and this system support
// (what the link runs at under load). False (and 0s) when nothing is known; each value is 0
// when unknown.
struct PcieLink {
  int gen = 0, width = 0;        // current
  int maxGen = 0, maxWidth = 0;  // maximum of the device in this system
};
bool pcieLink(const std::string& busId, PcieLink* link);

// A capability answer that may be unknown.
enum class Tri { Unknown = -1, No = 0, Yes = 1 };

// nvmlDeviceGetP2PStatus between two GPUs, one field per capability index.
struct P2PStatus {
  Tri read = Tri::Unknown;
  Tri write = Tri::Unknown;
  Tri nvlink = Tri::Unknown;
  Tri atomics = Tri::Unknown;
};
P2PStatus p2pStatus(const std::string& busA, const std::string& busB);

// nvmlDeviceGetTopologyCommonAncestor, as the names PairInfo::pcieRelation uses:
// "board" (same board), "switch" (one PCIe switch), "switches" (several switches),
// "hostbridge" (one host bridge), "numa" (host bridges of one NUMA node), "system" (across
// NUMA nodes); "" when unknown.
std::string commonAncestor(const std::string& busA, const std::string& busB);

enum class RemoteType { Unknown, Gpu, Switch, Other };

// One active NVLink of a GPU.
struct NvLink {
  int link = -1;            // link index on this GPU
  std::string remoteBusId;  // normalized, "" if NVML did not say
  RemoteType remoteType = RemoteType::Unknown;
  unsigned version = 0;  // NVML nvmlNvlinkVersion_t value, 0 if unknown
};

// The active NVLinks of the GPU at `busId`. False when NVML cannot tell (no NVML, no handle);
// true with an empty list when the GPU has no active NVLink.
bool activeNvLinks(const std::string& busId, std::vector<NvLink>* links);

// Common speed of one active NVLink of the GPU at `busId` per direction in GB/s, from NVML's
// NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON field (26.5625 on 18-link parts of 478 GB/s); -1 when
// unknown.
double nvlinkSpeedGBps(const std::string& busId);

// Nominal bandwidth of one link per direction in GB/s for an NVML NVLink version value, or -1
// when the version is unknown: the fallback when nvlinkSpeedGBps is unknown. See nvml.cc.
double nvlinkGBpsPerLink(unsigned version);

}  // namespace nvml
}  // namespace anyr
