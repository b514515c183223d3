// Launches of the unfused all-reduce algorithms (src/algo) on the communicator's transports:
// the peer algorithms on the peer workspace, the host algorithms on the host segment, a
// message cut into launches of at most one transport's capacity, each with the launch shape
// every rank computes alike from agreed values.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "algo/algo.h"
#include "anyreduce/anyreduce.h"

namespace anyr {

struct CommContext;
class Capabilities;
class PeerWorkspace;
class HostTransport;

// The size of one element of `t` (0 for a type the library does not reduce).
size_t dtypeSize(anyrDataType_t t);

class Launcher {
 public:
  Launcher(const CommContext& ctx, const Capabilities& caps, const PeerWorkspace& workspace,
           HostTransport& host)
      : ctx_(ctx), caps_(caps), workspace_(workspace), host_(host) {}
  Launcher(const Launcher&) = delete;
  Launcher& operator=(const Launcher&) = delete;

  // One all-reduce of `count` elements by `algo` (a peer or host algorithm, not NCCL) on
  // `stream`; a launch error throws, naming the algorithm.
  void launchPeerAlgo(anyrAlgo_t algo, const void* in, void* out, size_t count,
                      anyrDataType_t dtype, cudaStream_t stream) const;
  void launchHostAlgo(anyrAlgo_t algo, const void* in, void* out, size_t count,
                      anyrDataType_t dtype, cudaStream_t stream) const;
  LaunchShape shapeFor(anyrAlgo_t algo, uint64_t numVecs) const;

 private:
  // Runs a message as launches of at most capacityBytes each (piece boundaries are multiples of
  // 16 bytes, so alignment is kept): launch(args, shape) per piece, where args is `tmpl`
  // (AllReduceArgs or HostArgs) with the piece's input, output, count and 16-byte vectors; a
  // launch error throws, naming the algorithm. Shared by the peer and host paths. A template,
  // not a std::function: the callers' lambdas capture more than std::function stores inline,
  // and this runs on every eager call.
  template <typename Args, typename Launch>
  void launchInPieces(anyrAlgo_t algo, const Args& tmpl, const void* in, void* out, size_t count,
                      anyrDataType_t dtype, uint64_t capacityBytes, Launch&& launch) const;
  [[noreturn]] static void throwLaunchFailed(anyrAlgo_t algo, cudaError_t e);

  const CommContext& ctx_;
  const Capabilities& caps_;
  const PeerWorkspace& workspace_;
  HostTransport& host_;  // host-copy's streams and events
};

template <typename Args, typename Launch>
void Launcher::launchInPieces(anyrAlgo_t algo, const Args& tmpl, const void* in, void* out,
                              size_t count, anyrDataType_t dtype, uint64_t capacityBytes,
                              Launch&& launch) const {
  const size_t es = dtypeSize(dtype);
  const size_t perLaunch = static_cast<size_t>(capacityBytes / es);
  const bool aligned =
      reinterpret_cast<uintptr_t>(in) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0;
  for (size_t off = 0; off < count; off += perLaunch) {
    Args a = tmpl;
    a.input = static_cast<const char*>(in) + off * es;
    a.output = static_cast<char*>(out) + off * es;
    a.count = perLaunch < count - off ? perLaunch : count - off;
    a.numVecs = (a.count * es + 15) / 16;
    LaunchShape shape = shapeFor(algo, a.numVecs);
    shape.aligned = aligned;
    const cudaError_t e = launch(a, shape);
    if (e != cudaSuccess) throwLaunchFailed(algo, e);
  }
}

}  // namespace anyr
