// The NCCL algorithm: for large messages, for multi-host communicators, and as the universal
// fallback. Also owns creating an NCCL communicator with a bounded wait.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <mutex>
#include <string>

#include "anyreduce/anyreduce.h"

namespace anyr {

class Bootstrap;

// Creates an NCCL communicator over the bootstrap's ranks (non-blocking init polled until
// `timeoutMs`). Returns nullptr and sets *why on failure on this rank; the caller agrees
// across ranks whether NCCL is usable.
ncclComm_t createNcclComm(Bootstrap& bs, int timeoutMs, std::string* why);

// Destroys (ok == true) or aborts an NCCL communicator; never throws.
void releaseNcclComm(ncclComm_t comm, bool ok);

// A communicator's NCCL communicator, shared by the thread making a call and a thread calling
// anyrCommAbort or anyrCommGetAsyncError: NCCL takes one thread at a time on a communicator, so
// every use holds the mutex. The bounded wait for an enqueue still in progress drops it between
// polls, so an abort is not held up by that wait; the wait then ends with anyrAborted.
class NcclHandle {
 public:
  // Takes `comm` (NULL: none); `owned`: release() destroys or aborts it (else it is the
  // caller's, anyrCommInitFromNccl).
  void adopt(ncclComm_t comm, bool owned);
  // The handle (NULL once released), for anyrCommGetNcclComm.
  ncclComm_t get() const;
  bool present() const { return get() != nullptr; }
  // ncclAllReduce(sum), waiting (bounded by timeoutMs) while it reports in progress. Throws
  // anyrAborted after release(), anyrTimeout or anyrNcclError.
  void allReduceSum(const void* in, void* out, size_t count, anyrDataType_t dtype,
                    cudaStream_t stream, int timeoutMs);
  // NCCL's asynchronous error (ncclSuccess without a communicator).
  ncclResult_t asyncError() const;
  // Destroys (ok) or aborts an owned communicator, then forgets it; never throws.
  void release(bool ok);

 private:
  mutable std::mutex mu_;
  ncclComm_t comm_ = nullptr;
  bool owned_ = false;
};

// Throws anyrNcclError naming `what` when r is an error.
void checkNccl(ncclResult_t r, ncclComm_t comm, const char* what);

}  // namespace anyr
