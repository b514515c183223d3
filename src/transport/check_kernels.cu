#include "transport/check.h"

namespace anyr {
namespace {

__global__ void fillWordsKernel(uint32_t* dst, uint64_t words, uint32_t value) {
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < words;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    dst[i] = value;
  }
}

__global__ void publishKernel(CheckArea* own, int me, uint32_t salt) {
  for (int i = threadIdx.x; i < kCheckWords; i += blockDim.x) {
    own->published[i] = checkPattern(me, -1, i, salt);
  }
}

__global__ void writeKernel(CheckArea* peer, int me, int peerRank, uint32_t salt) {
  for (int i = threadIdx.x; i < kCheckWords; i += blockDim.x) {
    peer->written[me][i] = checkPattern(me, peerRank, i, salt);
  }
}

__global__ void atomicsKernel(CheckArea* peer, int me) {
  for (int k = 0; k < kAtomicAddsPerThread; ++k) atomicAdd_system(&peer->atomics[me], 1u);
}

__global__ void readKernel(const CheckArea* peer, int peerRank, uint32_t salt,
                           uint32_t* mismatches) {
  uint32_t bad = 0;
  for (int i = threadIdx.x; i < kCheckWords; i += blockDim.x) {
    uint32_t v = *reinterpret_cast<const volatile uint32_t*>(&peer->published[i]);
    bad += (v != checkPattern(peerRank, -1, i, salt)) ? 1u : 0u;
  }
  atomicAdd(mismatches, bad);
}

__global__ void verifyKernel(const CheckArea* own, int from, int me, uint32_t salt,
                             uint32_t* mismatches) {
  uint32_t bad = 0;
  for (int i = threadIdx.x; i < kCheckWords; i += blockDim.x) {
    uint32_t v = *reinterpret_cast<const volatile uint32_t*>(&own->written[from][i]);
    bad += (v != checkPattern(from, me, i, salt)) ? 1u : 0u;
  }
  atomicAdd(mismatches, bad);
}

}  // namespace

cudaError_t launchFillWords(uint32_t* dst, uint64_t words, uint32_t value, cudaStream_t s) {
  fillWordsKernel<<<128, 256, 0, s>>>(dst, words, value);
  return cudaGetLastError();
}
cudaError_t launchCheckPublish(CheckArea* own, int me, uint32_t salt, cudaStream_t s) {
  publishKernel<<<1, 256, 0, s>>>(own, me, salt);
  return cudaGetLastError();
}
cudaError_t launchCheckWrite(CheckArea* peer, int me, int peerRank, uint32_t salt, cudaStream_t s) {
  writeKernel<<<1, 256, 0, s>>>(peer, me, peerRank, salt);
  return cudaGetLastError();
}
cudaError_t launchCheckAtomics(CheckArea* peer, int me, cudaStream_t s) {
  atomicsKernel<<<1, kAtomicThreads, 0, s>>>(peer, me);
  return cudaGetLastError();
}
cudaError_t launchCheckRead(const CheckArea* peer, int peerRank, uint32_t salt,
                            uint32_t* mismatches, cudaStream_t s) {
  readKernel<<<1, 256, 0, s>>>(peer, peerRank, salt, mismatches);
  return cudaGetLastError();
}
cudaError_t launchCheckVerify(const CheckArea* own, int from, int me, uint32_t salt,
                              uint32_t* mismatches, cudaStream_t s) {
  verifyKernel<<<1, 256, 0, s>>>(own, from, me, salt, mismatches);
  return cudaGetLastError();
}

}  // namespace anyr
