// A stand-in for libanyreduce as a caller: it exports anyrCommInitFromNccl (which is how
// libanyreduce_nccl.so recognizes any copy of libanyreduce) and makes an all-reduce through the
// function it is handed, as libanyreduce's NCCL path would.
#include <nccl.h>

#include "anyreduce/anyreduce.h"

extern "C" {

__attribute__((visibility("default"))) anyrResult_t anyrCommInitFromNccl(anyrComm_t*, void*,
                                                                         const anyrConfig_t*) {
  return anyrUnsupported;
}

// Calls `allReduce` from this library's code (not as a tail call, so that the call returns here).
__attribute__((visibility("default"))) ncclResult_t fakeAnyreduceAllReduce(
    decltype(&ncclAllReduce) allReduce, const void* send, void* recv, size_t count,
    ncclComm_t comm) {
  volatile int after = 0;
  const ncclResult_t r = allReduce(send, recv, count, ncclFloat, ncclSum, comm, nullptr);
  after = 1;
  return after == 1 ? r : ncclInternalError;
}

}  // extern "C"
