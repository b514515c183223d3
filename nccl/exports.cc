// Every function of the nccl.h this library is built against, exported under its own name, and
// its profiling twin (pnccl*) as an alias of it, as NCCL exports both. The compiler checks each
// definition against the header's prototype. Most forward to the real NCCL as they are
// (ANYRN_FN_PLAIN, generated from the header); the hooked ones are written out below.
#include "anyreduce_nccl.h"
#include "shim.h"

#define ANYRN_EXPORT __attribute__((visibility("default")))

#define ANYRN_FN_PLAIN(ret, name, params, args)                       \
  extern "C" ANYRN_EXPORT ret name params {                           \
    using Fn = ret(*) params;                                         \
    const Fn fn = ::anyrn::realFn<Fn>(::anyrn::kSlot_##name);         \
    if (fn == nullptr) return ::anyrn::missing<ret>(#name);           \
    return ::anyrn::forwarded<ret>([&]() -> ret { return fn args; }); \
  }
#include "nccl_api.inc"

extern "C" {

ANYRN_EXPORT ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                        ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                        cudaStream_t stream) {
  return anyrn::allReduce(sendbuff, recvbuff, count, datatype, op, comm, stream,
                          __builtin_return_address(0));
}

ANYRN_EXPORT ncclResult_t ncclGroupStart() { return anyrn::groupStart(); }

ANYRN_EXPORT ncclResult_t ncclGroupEnd() { return anyrn::groupEnd(); }

#ifdef ANYRN_HAS_ncclCommFinalize
ANYRN_EXPORT ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  return anyrn::endComm(comm, anyrn::Ending::kFinalize, 0);
}
#endif

ANYRN_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  return anyrn::endComm(comm, anyrn::Ending::kDestroy, 0);
}

ANYRN_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
  return anyrn::endComm(comm, anyrn::Ending::kAbort, 0);
}

#ifdef ANYRN_HAS_ncclCommRevoke
ANYRN_EXPORT ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  return anyrn::endComm(comm, anyrn::Ending::kRevoke, revokeFlags);
}
#endif

ANYRN_EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  return anyrn::commGetAsyncError(comm, asyncError, __builtin_return_address(0));
}

#ifdef ANYRN_HAS_ncclGetLastError
ANYRN_EXPORT const char* ncclGetLastError(ncclComm_t comm) {
  return anyrn::getLastError(comm, __builtin_return_address(0));
}
#endif

anyrResult_t anyrNcclCommGetTwin(void* ncclComm, anyrComm_t* twin) {
  return anyrn::commGetTwin(ncclComm, twin);
}

}  // extern "C"

#define ANYRN_FN_ALIAS(ret, twin, name, params) \
  extern "C" ANYRN_EXPORT ret twin params __attribute__((alias(#name)));
#include "nccl_api.inc"
