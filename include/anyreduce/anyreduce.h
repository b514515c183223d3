/*
 * anyreduce: all-reduce for tensor-parallel inference on any NVIDIA GPU and link.
 *
 * Public C API. Shaped like NCCL's: an opaque communicator, result codes, an error string,
 * a last-error message, a unique id + init-rank rendezvous, and abort.
 *
 * General contracts (they hold for every call below unless the call says otherwise):
 *  - No call ever terminates the process. Failures come back as anyrResult_t; the message of
 *    the most recent failure is available from anyrGetLastError().
 *  - Collective calls (anyrCommInitRank*, anyrCommInitFromNccl, anyrAllReduce,
 *    anyrAllReduceAddRmsNorm, anyrCommSetAlgorithm, anyrCommTune, anyrCommDestroy) must be made
 *    by every rank of the communicator, in the same order, with the same count, datatype, op
 *    and algorithm (fused: the same tokens, hidden, datatype and quantization).
 *  - Every wait, on the host and on the device, is bounded by the communicator's timeout
 *    (ANYR_TIMEOUT_MS, default 30000 ms). An expired wait names the rank waited for.
 *  - Results are bit-identical on every rank: every anyreduce algorithm accumulates in fp32
 *    in ascending rank order. (The NCCL path gives NCCL's own guarantees.)
 *  - One call at a time per communicator: a collective call or anyrCommDestroy made while
 *    another thread is inside a call on the same communicator returns anyrInvalidUsage at once
 *    (nothing queued, nothing freed). Calls on different streams run in call order on the
 *    device. ANYR_VALIDATE_CALLS=1 makes every anyrAllReduce, anyrAllReduceAddRmsNorm and
 *    anyrCommSetAlgorithm call compare its signature across ranks first and fail on a mismatch
 *    instead of hanging (docs/RELIABILITY.md); the other collective calls are not checked.
 *  - A collective call that one rank refuses (a bad argument, another thread inside a call, a
 *    launch that failed) may have been made by its peers, so outside validation mode it stops
 *    the communicator on every rank: the refusing rank returns the refusal's error and then
 *    anyrInvalidUsage ("communicator has failed") for every later call; the peers' matching
 *    call fails with anyrRemoteError naming the rank and what it refused. No later result on
 *    any rank is a wrong value. Destroy it and create a new one (docs/RELIABILITY.md, 3c).
 *
 * Alignment rule: send and receive buffers must be aligned to the size of one element
 * (2 bytes for fp16/bf16, 4 for fp32). 16-byte alignment is faster; any element count works.
 */
#ifndef ANYREDUCE_ANYREDUCE_H_
#define ANYREDUCE_ANYREDUCE_H_

#include <cuda_runtime_api.h>
#include <stddef.h>

#define ANYR_MAJOR 0
#define ANYR_MINOR 1
#define ANYR_PATCH 0
#define ANYR_VERSION_CODE (ANYR_MAJOR * 10000 + ANYR_MINOR * 100 + ANYR_PATCH)

#if defined(__GNUC__)
#define ANYR_API __attribute__((visibility("default")))
#else
#define ANYR_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Opaque communicator. */
typedef struct anyrComm* anyrComm_t;

typedef enum {
  anyrSuccess = 0,
  anyrCudaError = 1,       /* a CUDA runtime call failed */
  anyrSystemError = 2,     /* an operating-system call failed (socket, fork, memory) */
  anyrInternalError = 3,   /* a bug in anyreduce: please report it */
  anyrInvalidArgument = 4, /* an argument broke a documented rule; the message names it */
  anyrInvalidUsage = 5,    /* the call is not allowed in this state */
  anyrRemoteError = 6,     /* another rank failed or sent something invalid */
  anyrTimeout = 7,         /* a bounded wait expired; the message names the rank */
  anyrAborted = 8,         /* the communicator was aborted */
  anyrNcclError = 9,       /* an NCCL call failed */
  anyrUnsupported = 10,    /* this hardware or build cannot do what was asked */
  anyrNumResults = 11
} anyrResult_t;

typedef enum {
  anyrFloat32 = 0,
  anyrFloat16 = 1,
  anyrBfloat16 = 2,
  anyrNumTypes = 3
} anyrDataType_t;

typedef enum { anyrSum = 0, anyrNumOps = 1 } anyrRedOp_t;

/* Algorithms. anyrAlgoAuto lets the communicator choose (see anyrCommExplain). Each value's
 * comment starts with its short name (anyrAlgoName; ANYR_ALGO and the tools accept it). */
typedef enum {
  anyrAlgoAuto = 0,        /* "auto" */
  anyrAlgoOneShotPush = 1, /* "oneshot-push": each rank writes its data into every rank's buffer */
  anyrAlgoOneShotPull = 2, /* "oneshot-pull": each rank reads every peer's buffer after a flag
                              handshake */
  anyrAlgoTwoShot = 3,     /* "twoshot": reduce-scatter, then all-gather, by peer reads */
  anyrAlgoNccl = 4,        /* "nccl": ncclAllReduce on the communicator's NCCL communicator */
  anyrAlgoTwoShotPush = 5, /* "twoshot-push": reduce-scatter and all-gather by peer writes, no
                              barriers */
  anyrAlgoHostOneShot = 6, /* "host-oneshot": through pinned shared host memory: no peer access
                              needed */
  anyrAlgoHostTwoShot = 7, /* "host-twoshot": reduce-scatter + all-gather through pinned shared
                              host memory */
  anyrAlgoHostCopy = 8,    /* "host-copy": one-shot through pinned shared host memory, moved by
                              copy engines */
  anyrAlgoStagedPush = 9,  /* "staged-push": the one-shot push in rounds: in round k each rank
                              writes to rank + k only */
  anyrAlgoStagedPull = 10, /* "staged-pull": the one-shot pull in rounds: in round k each rank
                              reads rank + k only */
  anyrAlgoIslands = 11,    /* "islands": two-level: gather in each island (GPUs under one PCIe
                              switch or socket, or ANYR_ISLANDS), exchange pairwise across
                              islands, all-gather in each island; peer writes */
  anyrAlgoRing = 12,       /* "ring": partial sums passed along the ring 0 -> 1 -> ... -> n-1 in
                              pipelined chunks, the result sent back around it (neighbour writes
                              only; for large messages over PCIe) */
  anyrAlgoDoublingPush = 13, /* "doubling-push": the one-shot push relayed in ceil(log2 n)
                                rounds, each rank writing to one partner a round (peer writes;
                                few hops for small messages where all-to-all rounds queue) */
  anyrAlgoRingCopy = 14,     /* "ring-copy": the ring's chain with its bytes pulled from the ring
                                neighbours by the copy engines (for large messages over PCIe) */
  anyrNumAlgos = 15
} anyrAlgo_t;

/* Wire format of the data the host-memory algorithms and one-shot pull exchange (opt-in; never
 * the default; the other algorithms ignore it).
 * Compressed formats quantize every rank's contribution (its own included) to 8 bits with a
 * power-of-two fp32 scale per block of 16 vectors (128 16-bit or 64 fp32 elements) and
 * accumulate the dequantized values in fp32 in rank order: results stay bit-identical on all
 * ranks but are approximate (error bound in docs/WIRE.md). A non-finite input element (inf or
 * NaN) travels as a code that decodes to NaN, so the output element there is NaN (the native
 * wire gives +-inf or NaN). */
typedef enum {
  anyrWireNative = 0, /* the data type itself: exact */
  anyrWireFp8 = 1,    /* e4m3 + per-block power-of-two scale */
  anyrWireInt8 = 2,   /* int8 + per-block power-of-two scale */
  anyrNumWires = 3
} anyrWire_t;

/* How the ranks of one host map each other's device memory (the peer algorithms' workspace).
 * Auto tries legacy CUDA IPC and, where it leaves a pair of ranks unmapped (as reported between
 * containers that do not share a PID namespace), the virtual-memory kind; anyrCommExplain says
 * which kind is in use and why. */
typedef enum {
  anyrPeerMemoryNone = 0,    /* no peer-mapped workspace, as on GPUs without peer access */
  anyrPeerMemoryAuto = 1,    /* cuda-ipc, else vmm where that maps more pairs */
  anyrPeerMemoryCudaIpc = 2, /* cudaIpcGetMemHandle / cudaIpcOpenMemHandle */
  anyrPeerMemoryVmm = 3,     /* cuMemCreate allocations exported as POSIX file descriptors,
                                passed over an owner-only Unix-domain path socket (in
                                ANYR_IPC_SOCKET_DIR, default /tmp; ANYR_IPC_SOCKET=abstract for
                                abstract names); needs no shared PID namespace */
  anyrNumPeerMemories = 4
} anyrPeerMemory_t;

#define ANYR_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[ANYR_UNIQUE_ID_BYTES];
} anyrUniqueId;

/* Communicator configuration. Initialize with ANYR_CONFIG_INITIALIZER; every field left at
 * its "undefined" value takes the environment variable named in its comment, and failing that
 * the documented default. Explicit fields win over the environment. */
#define ANYR_CONFIG_UNDEF_INT (-2147483647 - 1)
#define ANYR_CONFIG_UNDEF_SIZE ((size_t)-1)
typedef struct {
  size_t size;            /* sizeof(anyrConfig_t) */
  unsigned int magic;     /* ANYR_CONFIG_MAGIC */
  unsigned int version;   /* ANYR_VERSION_CODE */
  int algorithm;          /* anyrAlgo_t to force; ANYR_ALGO; default anyrAlgoAuto */
  int timeoutMs;          /* bound on every wait; ANYR_TIMEOUT_MS; default 30000 */
  size_t oneShotMaxBytes; /* largest one-shot message; ANYR_ONESHOT_MAX_BYTES; 0 = default
                             (1 MiB at 2 ranks, else 512 KiB / (nranks - 1), at least 64 KiB) */
  size_t twoShotMaxBytes; /* largest message the auto choice gives two-shot;
                             ANYR_TWOSHOT_MAX_BYTES; 0 = default (32 MiB). Either nonzero:
                             fixed thresholds replace the seed cost model */
  size_t chunkBytes;      /* staging size per rank for pull/two-shot; ANYR_CHUNK_BYTES; 8 MiB */
  int useNccl;            /* 1: create/keep an NCCL communicator; ANYR_USE_NCCL; default 1 */
  int maxBlocks;          /* cap on thread blocks per kernel; ANYR_MAX_BLOCKS; 0 = automatic */
  const char* tuningFile; /* tuning table loaded at init if its fingerprint matches (rank 0
                             reads it); ANYR_TUNING_FILE; default none */
  int tuneBudgetMs;       /* 0..3600000 ms; > 0: with no matching table, tune at init within
                             this budget and save to tuningFile if set; ANYR_TUNE_BUDGET_MS;
                             default 0 (no tuning at init) */
  int wire; /* anyrWire_t (0..2): host-memory algorithms and one-shot pull; ANYR_WIRE; native */
  int fusedCluster; /* thread-block cluster size of the fused all-reduce + RMSNorm kernels
                       (one-shot, two-shot): 1 = off, 2, 4 or 8; ANYR_FUSED_CLUSTER; 0 = auto */
  int peerMemory;   /* anyrPeerMemory_t (0..3); ANYR_PEER_MEMORY; default anyrPeerMemoryAuto */
} anyrConfig_t;
#define ANYR_CONFIG_MAGIC 0x414e5952u
#define ANYR_CONFIG_INITIALIZER                                                                    \
  {                                                                                                \
    sizeof(anyrConfig_t), ANYR_CONFIG_MAGIC, ANYR_VERSION_CODE, ANYR_CONFIG_UNDEF_INT,             \
        ANYR_CONFIG_UNDEF_INT, ANYR_CONFIG_UNDEF_SIZE, ANYR_CONFIG_UNDEF_SIZE,                     \
        ANYR_CONFIG_UNDEF_SIZE, ANYR_CONFIG_UNDEF_INT, ANYR_CONFIG_UNDEF_INT, NULL,                \
        ANYR_CONFIG_UNDEF_INT, ANYR_CONFIG_UNDEF_INT, ANYR_CONFIG_UNDEF_INT, ANYR_CONFIG_UNDEF_INT \
  }

/* Library version as ANYR_VERSION_CODE. */
ANYR_API anyrResult_t anyrGetVersion(int* version);

/* Creates a unique id for a new communicator: rank 0's bootstrap address (loopback unless
 * ANYR_SOCKET_ADDR or ANYR_SOCKET_IFNAME choose otherwise), a port, and a random secret that
 * every rank must present. Call it in the process that will be rank 0 (it then keeps the
 * listening socket); any other process works too, and rank 0 then binds the port itself.
 * Distribute the id to the other ranks by any means. */
ANYR_API anyrResult_t anyrGetUniqueId(anyrUniqueId* uniqueId);

/* Creates the communicator of rank `rank` in `nranks` (1..1024). World size 1 needs no transport:
 * anyrAllReduce is then a local copy. The peer and host-memory algorithms need 2..8 ranks on one
 * host; a larger world, or ranks on several hosts, goes through NCCL. Uses the current CUDA
 * device. Blocks until every rank arrived or the timeout expired; the
 * error then names the ranks that never arrived. config may be NULL. */
ANYR_API anyrResult_t anyrCommInitRank(anyrComm_t* comm, int nranks, anyrUniqueId uniqueId,
                                       int rank);
ANYR_API anyrResult_t anyrCommInitRankConfig(anyrComm_t* comm, int nranks, anyrUniqueId uniqueId,
                                             int rank, const anyrConfig_t* config);

/* Creates the communicator from an existing NCCL communicator (ncclComm_t passed as void*):
 * the setup exchange runs through it, and the NCCL path uses it. The NCCL communicator must
 * outlive this communicator and is not destroyed with it. Collective over its ranks. A rank
 * that does not call it within the timeout is named (exactly with two ranks; a set containing
 * it with more), and since an enqueued NCCL all-gather cannot be withdrawn, the NCCL
 * communicator is then stopped: revoked (ncclCommRevoke, NCCL 2.28.7 and newer: destroy it
 * yourself) or, with an older NCCL, aborted and freed (do not use or destroy it); the message
 * says which. The same holds when the NCCL path's watchdog stops a call on it, and when this
 * rank refuses a collective call (the peers' matching call may be an NCCL all-reduce, which the
 * application's next collective on the NCCL communicator would otherwise join). The bounds hold
 * for a non-blocking NCCL communicator, or a blocking one whose connections already exist. */
ANYR_API anyrResult_t anyrCommInitFromNccl(anyrComm_t* comm, void* ncclComm,
                                           const anyrConfig_t* config);

/* Frees every resource. Waits (bounded) for work the communicator launched to finish. */
ANYR_API anyrResult_t anyrCommDestroy(anyrComm_t comm);

/* Releases every kernel of this communicator that is still waiting and puts the communicator
 * in the aborted state; only anyrCommDestroy is allowed afterwards. Safe from any thread. */
ANYR_API anyrResult_t anyrCommAbort(anyrComm_t comm);

/* Error state of the communicator's device work without synchronizing: anyrSuccess, or the
 * failure (a timeout naming a rank, an abort). Non-blocking. */
ANYR_API anyrResult_t anyrCommGetAsyncError(anyrComm_t comm, anyrResult_t* asyncError);

ANYR_API anyrResult_t anyrCommCount(const anyrComm_t comm, int* count);
ANYR_API anyrResult_t anyrCommUserRank(const anyrComm_t comm, int* rank);
ANYR_API anyrResult_t anyrCommCuDevice(const anyrComm_t comm, int* device);

/* The communicator's NCCL communicator (ncclComm_t as void*), or NULL when it has none. */
ANYR_API anyrResult_t anyrCommGetNcclComm(const anyrComm_t comm, void** ncclComm);

/* Sum all-reduce of `count` elements. sendbuff == recvbuff is in place. Asynchronous on
 * `stream` (which must belong to the communicator's device); never synchronizes the host;
 * capturable in CUDA graphs. Any device pointers: no registration step. */
ANYR_API anyrResult_t anyrAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                    anyrDataType_t datatype, anyrRedOp_t op, anyrComm_t comm,
                                    cudaStream_t stream);

/* ---- Fused all-reduce + residual add + RMSNorm (+ quantization) -------------------------
 *
 * For `tokens` rows of `hidden` elements (row-major, contiguous):
 *   x        = allreduce_sum(partial)                       (fp32 accumulation, rank order)
 *   r        = x + residualIn          (or r = x when residualIn is NULL)
 *   residualOut = r                    (rounded to the dtype; may alias residualIn; may be NULL
 *                                       when residualIn is NULL and the caller wants only y)
 *   y        = r / sqrt(mean(r^2) + epsilon) * w,  w = weight or (1 + weight) (weightPlusOne)
 *   normOut  = y                       (rounded to the dtype)
 * and, when quant != anyrQuantNone, y quantized (see anyrFusedOptions_t). The mean is taken
 * in fp32 over the rounded r, so normOut and residualOut match a separate add+RMSNorm kernel
 * run on the all-reduced tensor. dtype: anyrBfloat16 or anyrFloat16; weight has the same
 * dtype. hidden: a multiple of 8 in 128..16384 (of 16 with NVFP4 output); tokens: any (0 is a
 * no-op). */
typedef enum {
  anyrQuantNone = 0,
  anyrQuantFp8 = 1,
  anyrQuantNvfp4 = 2,
  anyrNumQuants = 3
} anyrQuant_t;

typedef struct {
  size_t size;        /* sizeof(anyrFusedOptions_t) */
  unsigned int magic; /* ANYR_FUSED_MAGIC */
  int weightPlusOne;  /* 1: y = r/rms * (1 + weight) (Gemma/Qwen); 0: r/rms * weight */
  int quant;          /* anyrQuant_t */
  /* FP8 (e4m3fn): q = e4m3(y * (1 / scale[0])), scale a device pointer to one fp32
   * (per-tensor); the conversion rounds to nearest even, saturates at +-448, gives 0x7F for
   * NaN and keeps the sign of zero (-0.0 -> 0x80). NVFP4: scale[0] is the fp32 global scale
   * g, the dequantization side: g = 1 / SFScaleVal = amax_tensor / (448 * 6) in TensorRT-LLM's
   * and FlashInfer's terms; each 16-element block b gets an e4m3 block scale
   * s_b = e4m3(amax_b * (1 / (6 * g))) and elements q = e2m1(y * (1 / (s_b * g))); dequantized
   * y ~ q * s_b * g. Every operation is one IEEE fp32 operation (the reciprocals correctly
   * rounded); docs/FUSED.md gives the exact rules. */
  const float* scale;
  void* quantOut;            /* FP8: tokens x hidden bytes. NVFP4: tokens x hidden/2 bytes, two
                                e2m1 values per byte, element 2i in the low nibble. */
  void* blockScales;         /* NVFP4: e4m3 block scales, row-major tokens x hidden/16 (may be NULL
                                if blockScalesSwizzled is given) */
  void* blockScalesSwizzled; /* NVFP4: the same scales in the 128x4 swizzled layout NVFP4
                           GEMMs read (docs/FUSED.md); rows padded to 128, scale columns to 4;
                           the padding is never written (docs/FUSED.md); may be NULL */
} anyrFusedOptions_t;
#define ANYR_FUSED_MAGIC 0x414e5946u
#define ANYR_FUSED_OPTIONS_INITIALIZER \
  { sizeof(anyrFusedOptions_t), ANYR_FUSED_MAGIC, 0, anyrQuantNone, NULL, NULL, NULL, NULL }

ANYR_API anyrResult_t anyrAllReduceAddRmsNorm(const void* partial, const void* residualIn,
                                              void* residualOut, const void* weight, float epsilon,
                                              void* normOut, size_t tokens, size_t hidden,
                                              anyrDataType_t datatype,
                                              const anyrFusedOptions_t* options, anyrComm_t comm,
                                              cudaStream_t stream);

/* The same add + RMSNorm (+ quantization) as a standalone kernel on an already all-reduced
 * tensor `x` (no communication): what an unfused pipeline runs after its all-reduce. Same
 * arguments and rules as anyrAllReduceAddRmsNorm (x in place of partial). Aliasing, for both:
 * partial/x may be normOut or residualOut, residualIn may be residualOut or normOut, as the
 * same buffer, never a partial overlap; the quantized outputs overlap nothing. Launched with
 * programmatic dependent launch where a probe launch, run once per process and device on the
 * first call whose stream is not capturing a graph, works (ANYR_PDL=0: never): the kernel waits
 * for the work before it on the stream ahead of any memory access, so only timing changes. */
ANYR_API anyrResult_t anyrAddRmsNorm(const void* x, const void* residualIn, void* residualOut,
                                     const void* weight, float epsilon, void* normOut,
                                     size_t tokens, size_t hidden, anyrDataType_t datatype,
                                     const anyrFusedOptions_t* options, cudaStream_t stream);

/* Forces one algorithm for later calls (anyrAlgoAuto restores the choice). Collective: every
 * rank must set the same value. Fails with anyrUnsupported, naming why, for an algorithm this
 * communicator's hardware does not admit. */
ANYR_API anyrResult_t anyrCommSetAlgorithm(anyrComm_t comm, anyrAlgo_t algorithm);

/* Measures every admitted path of every operation per size bucket (all-reduce 1 KB..256 MB;
 * the fused operation at hidden 6144, 1..2048 tokens, with and without FP8 output), takes each
 * path's slowest rank's time, and lets rank 0 choose the fastest per bucket and broadcast it:
 * later calls dispatch by the result. budgetMs > 0 stops measuring after that long (unmeasured
 * sizes keep their seed choice). savePath (may be NULL; used on rank 0) receives the table as
 * JSON, for ANYR_TUNING_FILE, with the fabric's figures (measured afresh first unless this
 * communicator measured them at init, and unless ANYR_FABRIC is cached or off), which later
 * communicators then use without measuring. Collective; allocates and frees temporary device
 * buffers. */
ANYR_API anyrResult_t anyrCommTune(anyrComm_t comm, int budgetMs, const char* savePath);

/* The algorithm anyrAllReduce would use for this message, without running it; anyrAlgoAuto on a
 * communicator of one rank (where anyrAllReduce is a local copy). */
ANYR_API anyrResult_t anyrCommQueryAlgorithm(const anyrComm_t comm, size_t count,
                                             anyrDataType_t datatype, anyrAlgo_t* algorithm);

/* Writes a JSON document describing the communicator: topology, admission of every
 * algorithm with its reason, and the size thresholds in use. Writes at most `len` bytes
 * (NUL-terminated); *needed receives the full length + 1. The document can grow between two
 * calls (anyrCommTune on another thread installs a table): a caller whose `len` is below the
 * *needed of the same call got a truncated prefix and asks again. */
ANYR_API anyrResult_t anyrCommExplain(const anyrComm_t comm, char* buf, size_t len, size_t* needed);

/* The short name quoted at the start of the algorithm's comment in anyrAlgo_t ("auto",
 * "oneshot-push", ...); NULL if invalid. */
ANYR_API const char* anyrAlgoName(anyrAlgo_t algorithm);

ANYR_API const char* anyrGetErrorString(anyrResult_t result);

/* Message of the last failure: of `comm` when non-NULL, else of the calling thread. */
ANYR_API const char* anyrGetLastError(anyrComm_t comm);

/* ---- Per-communicator counters ----------------------------------------------------------
 *
 * Counted on the host, once per dispatch: an eager call counts once per call; a call captured
 * into a CUDA graph counts once, at capture (graph replays are not seen by the host and are not
 * counted; capturedCalls says how many of the calls were captured). Time spent waiting for
 * peers is not counted: it would need a device-side clock read in every wait loop of every
 * kernel, which is not free on the latency-bound path; measure it from outside instead
 * (`anyreduce doctor` reports the exposed communication time of a decode step). */
#define ANYR_COUNTER_BUCKETS 8 /* message bytes: <4K, <16K, <64K, <256K, <1M, <4M, <16M, >=16M */
typedef struct {
  size_t size;        /* sizeof(anyrCounters_t), set by the caller */
  unsigned int magic; /* ANYR_COUNTERS_MAGIC, set by the caller */
  /* anyrAllReduce and anyrAllReduceAddRmsNorm calls and their message bytes, by the algorithm
   * that ran (index anyrAlgo_t; anyrAlgoAuto unused) and size bucket. */
  unsigned long long calls[anyrNumAlgos][ANYR_COUNTER_BUCKETS];
  unsigned long long bytes[anyrNumAlgos][ANYR_COUNTER_BUCKETS];
  unsigned long long fusedKernelCalls;   /* fused calls run as one fused kernel */
  unsigned long long fusedComposedCalls; /* fused calls run as all-reduce + separate epilogue
                                            kernel (NCCL, pull algorithms, unaligned input) */
  unsigned long long forcedCalls;        /* calls made while an algorithm was forced */
  unsigned long long capturedCalls;      /* calls dispatched during CUDA-graph capture */
  /* Fused-kernel launches by thread-block cluster size (a call of many rows may take several
   * launches): [0] a block per row (no clusters), [1] clusters of 2 blocks, [2] of 4, [3] of 8. */
  unsigned long long fusedLaunchesByCluster[4];
} anyrCounters_t;
#define ANYR_COUNTERS_MAGIC 0x414e5943u

/* Copies the communicator's counters into *counters (size and magic set by the caller). */
ANYR_API anyrResult_t anyrCommGetCounters(const anyrComm_t comm, anyrCounters_t* counters);
/* Sets every counter of the communicator to zero. */
ANYR_API anyrResult_t anyrCommResetCounters(anyrComm_t comm);

/* ---- Queries and controls for tools ----------------------------------------------------
 *
 * What the `anyreduce` command and its doctor need beyond the calls above, for any program that
 * wants the same: the rules of the fused operation's row width, the library's own parsers and
 * configuration rules, the environment variables it reads, topology probing and offline
 * explain, and per-operation path control for benchmarks. Text results follow anyrCommExplain:
 * at most `len` bytes are written (NUL-terminated; `buf` may be NULL with `len` 0), and
 * *needed (may be NULL) receives the full length + 1. JSON documents are UTF-8 objects. */

/* The fused operations' row width (hidden): a multiple of ANYR_FUSED_HIDDEN_MULTIPLE (of
 * ANYR_FUSED_NVFP4_HIDDEN_MULTIPLE with NVFP4 output) in ANYR_FUSED_MIN_HIDDEN..
 * ANYR_FUSED_MAX_HIDDEN. */
#define ANYR_FUSED_MIN_HIDDEN 128
#define ANYR_FUSED_MAX_HIDDEN 16384
#define ANYR_FUSED_HIDDEN_MULTIPLE 8
#define ANYR_FUSED_NVFP4_HIDDEN_MULTIPLE 16

/* Short names of anyrPeerMemory_t, as ANYR_PEER_MEMORY takes them: "none", "auto", "cuda-ipc",
 * "vmm"; NULL if invalid. */
ANYR_API const char* anyrPeerMemoryName(anyrPeerMemory_t kind);

/* Parses a size as the size environment variables take it: a decimal count with an optional
 * suffix B, K (k, KB, KiB), M (MB, MiB) or G (GB, GiB), powers of 1024: "4096", "64K", "8M".
 * anyrInvalidArgument, naming the text, for anything else or a value that does not fit. */
ANYR_API anyrResult_t anyrParseSize(const char* text, size_t* bytes);

/* Checks `value` against the rule of the anyrConfig_t field named `field` ("maxBlocks" or
 * "fusedCluster"), the rule the communicator applies to it and to its environment variable:
 * *valid receives 1 or 0, *rule (may be NULL) the rule's text, e.g. "must be in 0..256
 * (0 = automatic)" (static storage). anyrInvalidArgument for another field name. */
ANYR_API anyrResult_t anyrConfigCheckField(const char* field, long long value, int* valid,
                                           const char** rule);

/* The environment variables the library reads, in documentation order, as a JSON array of
 * {"name", "default" ("" when none), "meaning", "value" (only when set in this process)}. */
ANYR_API anyrResult_t anyrGetEnvParams(char* buf, size_t len, size_t* needed);

/* Whether this process can run anyreduce: asks CUDA for the driver and the visible GPUs, then,
 * on each GPU, loads one of the library's kernels to learn whether this build carries code it
 * runs (the check communicator init makes for its own device). *count (may be NULL) receives
 * the number of visible GPUs (0 without a driver or a GPU). anyrSuccess when there is a GPU
 * and every visible one can run the kernels; otherwise anyrGetLastError(NULL) says, in words,
 * what is missing and what to do: anyrCudaError when no NVIDIA driver was found, the driver is
 * older than the CUDA runtime the library was built with, or no GPU is visible;
 * anyrUnsupported for a GPU this build has no kernels for (with the CMake setting to rebuild
 * with). Initializes CUDA in this process (a context on every visible GPU); the current
 * device is left as it was. */
ANYR_API anyrResult_t anyrCheckDevices(int* count);

/* Probes every GPU visible to this process and every ordered pair (capabilities, transfers
 * confirmed by real copies, and with measure != 0 bandwidth and latency), writes the topology
 * as JSON to savePath (may be NULL: not saved; the format anyrDescribeTopology and
 * anyrExplainTopology read), and describes it as
 * anyrDescribeTopology does. A buffer too short for the description gets it truncated: the
 * probe is not kept, so asking again probes again. Initializes CUDA in this process. */
ANYR_API anyrResult_t anyrProbeTopology(int measure, const char* savePath, char* buf, size_t len,
                                        size_t* needed);

/* Reads the topology JSON file at `path` and describes it: a JSON object {"gpus" (count),
 * "source" (how it was made), "text" (the GPU and pair tables, as `anyreduce probe` prints
 * them)}. No GPU needed. */
ANYR_API anyrResult_t anyrDescribeTopology(const char* path, char* buf, size_t len, size_t* needed);

/* What a communicator over the GPUs of the topology file at `path` would admit and dispatch,
 * computed without GPUs: nranks (0 = all) takes the file's first nranks GPUs; ncclAvailable
 * says whether NCCL is assumed available; tuningFile (may be NULL) is applied where its
 * fingerprint matches the topology (the settings it was measured under are assumed); config
 * (may be NULL) as anyrCommInitRankConfig resolves it, environment included (its algorithm is
 * the forced one). Writes a JSON object {"gpus", "source", "admission": [{"algo", "admitted",
 * "reason"}] (every algorithm but auto, in enum order), "warnings": [text], "forcedError" (""
 * or why the forced algorithm is not admitted, as anyrCommSetAlgorithm would refuse it),
 * "dispatchText" (the choice per operation and size, as anyrCommExplain's; "" with a
 * forcedError)}; with one rank, as a communicator of one, no peer or host algorithm is
 * admitted and dispatchText says that every call is local. anyrInvalidArgument for nranks < 0
 * or above the file's GPU count, or a file without GPUs. */
ANYR_API anyrResult_t anyrExplainTopology(const char* path, int nranks, int ncclAvailable,
                                          const char* tuningFile, const anyrConfig_t* config,
                                          char* buf, size_t len, size_t* needed);

/* The operations a communicator dispatches separately, by name: "allreduce" (anyrAllReduce),
 * "add-rmsnorm" (anyrAllReduceAddRmsNorm without quantization or with NVFP4), and
 * "add-rmsnorm-quant" (with FP8 output). A path names how one call runs: for "allreduce" the
 * algorithm (anyrAlgoName); for the fused operations "fused:<algorithm>" (its fused kernel;
 * "/c1", "/c2", "/c4" or "/c8" may follow: a block per row, or thread-block clusters of that
 * size) or "<algorithm>+epilogue" (the all-reduce, then the standalone add+RMSNorm kernel). */

/* Every operation with its candidate paths, as a JSON object {"tuned" (whether a measured
 * tuning table is installed), "ops": [{"op", "candidates": [{"path", "algo", "fusedKernel",
 * "admitted", "reason"}]}]} (operations and candidates in the communicator's fixed order). */
ANYR_API anyrResult_t anyrCommDescribePaths(const anyrComm_t comm, char* buf, size_t len,
                                            size_t* needed);

/* Forces `path` for every later call of operation `op` on this communicator (path NULL or ""
 * restores dispatch for it); for benchmarks that time each candidate. Collective like
 * anyrCommSetAlgorithm: every rank must force the same path. anyrInvalidArgument for an
 * unknown operation or path, anyrUnsupported, naming why, for a path the communicator does not
 * admit. */
ANYR_API anyrResult_t anyrCommForcePath(anyrComm_t comm, const char* op, const char* path);

/* The path a call of operation `op` with a message of `bytes` bytes would take now (a forced
 * path, else a forced algorithm, else the dispatch table), without running it; as
 * anyrCommQueryAlgorithm for every operation. */
ANYR_API anyrResult_t anyrCommQueryPath(const anyrComm_t comm, const char* op, size_t bytes,
                                        char* buf, size_t len, size_t* needed);

/* anyrCommTune with its measurement chosen: all-reduce sizes minBytes..maxBytes (powers of
 * two, 2 B..4 GiB), the fused operation at `hidden` (its row-width rule) for 1, 2, 4 ..
 * maxTokens (1..65536) tokens, `calls` calls per timed sample and the median of `samples`
 * samples (both >= 1), budgetMs as anyrCommTune's. Rank 0's options hold for every
 * rank. progress (may be NULL) is called on rank 0 after every measured point with the points
 * done, their total, a short description and progressArg. It may not call in: a collective call
 * it makes on the communicator being tuned is refused (anyrInvalidUsage) and stops the
 * communicator like any refused call; anyrCommDestroy from it is refused and frees nothing.
 * Initialize with ANYR_TUNE_OPTIONS_INITIALIZER (anyrCommTune's defaults). */
typedef void (*anyrTuneProgress_t)(int done, int total, const char* what, void* progressArg);
typedef struct {
  size_t size;                 /* sizeof(anyrTuneOptions_t) */
  unsigned int magic;          /* ANYR_TUNE_MAGIC */
  size_t minBytes;             /* smallest all-reduce size measured; default 1024 */
  size_t maxBytes;             /* largest; default 256 MiB */
  int hidden;                  /* fused operation's row width; default 6144 */
  int maxTokens;               /* fused operation: 1, 2, 4 .. this many rows; default 2048 */
  int budgetMs;                /* > 0: stop measuring after this long; 0 = no limit */
  int calls;                   /* calls per timed sample (one graph); default 20 */
  int samples;                 /* timed samples, median used; default 9 */
  anyrTuneProgress_t progress; /* may be NULL */
  void* progressArg;
} anyrTuneOptions_t;
#define ANYR_TUNE_MAGIC 0x414e5954u
#define ANYR_TUNE_OPTIONS_INITIALIZER                                                          \
  {                                                                                            \
    sizeof(anyrTuneOptions_t), ANYR_TUNE_MAGIC, 1024, (size_t)256 << 20, 6144, 2048, 0, 20, 9, \
        NULL, NULL                                                                             \
  }

/* Measures and installs like anyrCommTune, with `options` (NULL: anyrCommTune's); savePath as
 * anyrCommTune's. Collective. */
ANYR_API anyrResult_t anyrCommTuneWithOptions(anyrComm_t comm, const anyrTuneOptions_t* options,
                                              const char* savePath);

#ifdef __cplusplus
}
#endif

#endif /* ANYREDUCE_ANYREDUCE_H_ */
