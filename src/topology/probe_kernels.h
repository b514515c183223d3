// Kernels of the topology probe, behind plain host launchers. Every pointer is a raw device
// pointer; a pointer into another GPU's memory (peer access enabled) is used exactly like a
// local one. Launchers return the launch error and never synchronize.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace anyr {
namespace probekernels {

// Status words the ping-pong kernels leave in *status (the host zeroes it before the launch,
// so 0 also means "never ran").
constexpr int kPingPongNotRun = 0;
constexpr int kPingPongOk = 1;
constexpr int kPingPongTimedOut = 2;        // this side's bounded wait expired
constexpr int kPingPongPartnerAborted = 3;  // the other side gave up and said so

// Whether the current device can run this library's kernels: cudaFuncGetAttributes on one of
// them (the pattern fill), which loads it. Every .cu file of the library is compiled for the
// same targets (CMAKE_CUDA_ARCHITECTURES and ANYR_CUDA_FAMILY_TARGETS), so one kernel's answer
// holds for all: cudaErrorNoKernelImageForDevice (or cudaErrorInvalidDeviceFunction) where the
// build carries neither machine code nor PTX the device runs, cudaErrorUnsupportedPtxVersion
// where the driver cannot compile the build's PTX. Needs a driver and a current device.
cudaError_t kernelImageStatus();

// Writes a pattern (a hash of the word index and `seed`, never 0) into n16 16-byte units of
// `dst` with 16-byte stores.
cudaError_t launchFillPattern(void* dst, size_t n16, uint32_t seed, int blocks,
                              cudaStream_t stream);

// Reads n16 16-byte units of `src` with 16-byte loads and adds the number of words that differ
// from the pattern to *mismatches (memory of the launching GPU).
cudaError_t launchCheckPattern(const void* src, size_t n16, uint32_t seed,
                               unsigned long long* mismatches, int blocks, cudaStream_t stream);

// blocks x threads threads; thread t adds 1 to counters[(t % numCounters) * counterStride],
// `repeats` times, with atomicAdd.
cudaError_t launchAtomicAdd(unsigned int* counters, int numCounters, int counterStride, int repeats,
                            int blocks, int threads, cudaStream_t stream);

// Copies n16 16-byte units from src to dst with 16-byte loads and stores over a grid-stride
// loop (the bandwidth kernel: one side is peer memory).
cudaError_t launchCopy16(void* dst, const void* src, size_t n16, int blocks, cudaStream_t stream);

// Flag ping-pong between two GPUs; both flags live in the responder's memory, so only the
// initiator needs peer access. The initiator stores ping = k (a remote store, release) and
// spins on pong == k (remote loads, acquire); the responder spins on ping == k in its own
// memory and answers pong = k. `batches` batches of `roundsPerBatch` round trips; the
// initiator writes the duration of each batch in ns (%globaltimer) to batchNs[b]. Every wait
// is bounded by timeoutNs: on expiry a side writes the abort value into the flag its partner
// watches, leaves kPingPongTimedOut in *status and returns, so neither kernel can hang.
cudaError_t launchPingPongInitiator(unsigned int* ping, const unsigned int* pong, int batches,
                                    int roundsPerBatch, unsigned long long timeoutNs,
                                    unsigned long long* batchNs, int* status, cudaStream_t stream);
cudaError_t launchPingPongResponder(const unsigned int* ping, unsigned int* pong, int totalRounds,
                                    unsigned long long timeoutNs, int* status, cudaStream_t stream);

// Programmatic dependent launch: a kernel that releases its dependents at once and writes
// *word = 1 after about 20 us, then one launched with programmatic stream serialization (so
// running during that delay) that waits for it and adds 1. The host zeroes *word first; 2
// after the stream completes means the launch attribute is accepted and the wait orders the
// second kernel's memory accesses after the first; 1, that it read before the write landed;
// kDependentNoWait, that this build's device code for the GPU has no wait instruction (PTX of
// a target below 9.0). Returns a launch error (cudaErrorNotSupported and the like where the GPU
// or driver has no such launch).
constexpr int kDependentNoWait = -1000;
cudaError_t launchDependentPair(int* word, cudaStream_t stream);

// Thread-block clusters with distributed shared memory: one cluster of two blocks; block b
// leaves 0x5100 + b in its shared memory, reads the other block's word through the cluster
// and writes it to out[b]; each block also stores the pair {0x5200 + b, 0x5300 + b} into the
// other block's shared memory with st.async, counted on that block's mbarrier (the fused
// cluster kernels' exchange), and writes the first word it received to out[2 + b]. The host
// zeroes out[0..3]; {0x5101, 0x5100, 0x5201, 0x5200} after the stream completes means cluster
// launch, the cluster barrier, distributed shared memory and asynchronous stores work.
// Returns a launch error (cudaErrorNotSupported and the like without clusters).
cudaError_t launchClusterExchange(unsigned int* out, cudaStream_t stream);

}  // namespace probekernels
}  // namespace anyr
