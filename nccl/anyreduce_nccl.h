/*
 * libanyreduce_nccl.so, the NCCL-compatible library: what it adds to the NCCL API it exports.
 * (docs/INTEGRATION.md, "The NCCL-compatible library".)
 */
#ifndef ANYREDUCE_NCCL_H_
#define ANYREDUCE_NCCL_H_

#include "anyreduce/anyreduce.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The anyreduce twin that serves ncclAllReduce on the NCCL communicator `ncclComm` (ncclComm_t
 * as void*), or NULL in *twin when none does (not decided yet, not eligible, refused, failed or
 * ended). The twin stays this library's: read it (anyrCommGetCounters, anyrCommExplain,
 * anyrCommQueryAlgorithm), never destroy it nor make collective calls on it.
 * anyrInvalidArgument when twin is NULL. */
ANYR_API anyrResult_t anyrNcclCommGetTwin(void* ncclComm, anyrComm_t* twin);

#ifdef __cplusplus
}
#endif

#endif /* ANYREDUCE_NCCL_H_ */
