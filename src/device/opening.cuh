// A kernel's opening lines, shared: the preamble (startKernel) and the names
// every body reads, handed to the body as parameters. Forced inline, and the body (a lambda)
// is called once at the end, so a kernel runs what a body written out in it would, in the same
// order: the preamble's loads and its stop test first (common.cuh), then the body.
#pragma once

#include "device/common.cuh"

namespace anyr {
namespace dev {

// A flag kernel's opening: startKernel on syncEpoch (flagEpochOf), then `body` with the call's
// input and output as T, this rank, the rank count, the rank's state, this launch's epoch and
// the stop test's answer. Nothing runs after `body`: a return in it ends the kernel.
template <typename T, typename Args, typename Body>
__device__ __forceinline__ void runFlagKernel(const Args& a, Body&& body) {
  const auto start = startKernel(a, &LocalState::syncEpoch, flagEpochOf);
  body(static_cast<const T*>(a.input), static_cast<T*>(a.output), a.rank, a.nranks, a.state,
       start.epoch, start.stopped);
}

}  // namespace dev
}  // namespace anyr
