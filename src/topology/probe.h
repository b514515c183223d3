// The live probe: what the GPUs of this process are and what each ordered pair can really do.
// Driver and NVML answers are recorded as such ("driver" fields); every peer capability that
// matters is confirmed by real transfers, because PCIe peers may report P2P that does not
// work, work in one direction only, lack atomics, or write far slower than they read.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "topology/topology.h"

namespace anyr {

// The identity ranks compare to know they share a host: a hash of `hostId` (ANYR_HOST_ID) when
// it is not empty, else of the host name and the kernel's boot id. Containers of one host whose
// host names differ (their own UTS namespaces) set the same ANYR_HOST_ID to be seen as one host
// (peer and host-memory transports); two hosts never share a boot id.
uint64_t hostHashOf(const std::string& hostId, const std::string& hostName,
                    const std::string& bootId);

// Facts about one CUDA device of this process (no transfers): driver properties, NUMA node
// from sysfs, PCIe link from NVML (0 when unknown), and hostHashOf this host.
// Throws anyrInvalidArgument for a device ordinal out of range, anyrCudaError on CUDA failure.
GpuInfo probeGpu(int cudaDevice);

// What the driver and NVML report for the ordered pair me -> peer, without transfers:
//  - link: Self for the same bus id on the same host; NVLink when NVML shows active links
//    whose remote is the peer (nvlinkCount = their number), or NVSwitch links on both GPUs
//    with NVML's NVLink P2P status OK (count = the smaller number of switch links);
//    linkGBps = count x per-link speed (NVML's common NVLink speed field, else the NVLink
//    version table in nvml.cc; -1 when unknown). Else PCIe when the driver reports peer
//    access; else None (Unknown when nothing can tell).
//  - pcieRelation: NVML's common ancestor.
//  - driverPeerAccess / driverAtomics: cudaDeviceCanAccessPeer and the native-atomics P2P
//    attribute when the peer is visible in this process; otherwise NVML's P2P read+write and
//    atomics status (a peer hidden by CUDA_VISIBLE_DEVICES can still be reached through IPC).
// myCudaDevice is the CUDA ordinal of `me`; me.index / peer.index become src / dst.
PairInfo describePair(int myCudaDevice, const GpuInfo& me, const GpuInfo& peer);

// The verdict on probekernels::launchDependentPair (`launched`: its launch's error, `word`: what
// it left): whether programmatic dependent launch works for this build's kernels on the GPU,
// and why (a sentence, into *reason).
bool dependentLaunchWorks(cudaError_t launched, int word, std::string* reason);

// Programmatic dependent launch for kernels launched without a communicator (anyrAddRmsNorm) on
// CUDA device `device`: probed once per process and device (launchDependentPair on a stream of
// its own; every wait bounded by ANYR_TIMEOUT_MS, past which the probe counts as failed), then
// remembered. With
// mayProbe false (the caller's stream is capturing a graph, where the probe cannot wait) an
// unprobed device answers probed = false, works = false, and stays unprobed.
struct DependentLaunch {
  bool probed = false;
  bool works = false;
  std::string reason;
};
DependentLaunch dependentLaunchOn(int device, bool mayProbe);

struct ProbeOptions {
  bool measure = true;                // false: confirmations only, no bandwidth or latency
  size_t bandwidthBytes = 256 << 20;  // largest transfer per bandwidth iteration
  int iterations = 20;                // timed iterations; the median is reported
};

// Probes every GPU visible to this process: probeGpu for each, describePair for each ordered
// pair, then for each ordered pair with driver peer access: enables peer access, confirms
// writes, reads and (where the driver reports native atomics) atomics with real transfers,
// measures write and read bandwidth and one-way flag latency (when options.measure), and
// disables peer access again (unless it was already enabled). With no GPU (or no driver) it
// returns an empty topology. A pair whose peer access cannot be enabled, or whose transfers
// fail without poisoning the CUDA context, keeps its failed confirmations and the probe goes
// on; a wait that exceeds ANYR_TIMEOUT_MS throws anyrTimeout (peer memory hung).
Topology probeLocal(const ProbeOptions& options = ProbeOptions());

}  // namespace anyr
