// The NCCL algorithm: for large messages, for multi-host communicators, and as the universal
// fallback. Also owns creating an NCCL communicator with a bounded wait.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

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

// ncclAllReduce(sum). Waits (bounded) while a non-blocking communicator reports in progress.
void ncclAllReduceSum(ncclComm_t comm, const void* in, void* out, size_t count,
                      anyrDataType_t dtype, cudaStream_t stream, int timeoutMs);

// Throws anyrNcclError naming `what` when r is an error.
void checkNccl(ncclResult_t r, ncclComm_t comm, const char* what);

}  // namespace anyr
