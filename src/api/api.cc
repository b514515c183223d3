// The C API boundary: the only place anyr::Error is caught and turned into a result code.
// Every function records the failure's message for anyrGetLastError (per thread, and per
// communicator when one is involved) and returns; nothing here exits or aborts.
#include <cstring>
#include <mutex>
#include <string>

#include "algo/registry.h"
#include "anyreduce/anyreduce.h"
#include "api/boundary.h"
#include "base/config.h"
#include "base/error.h"
#include "base/log.h"
#include "base/names.h"
#include "bootstrap/bootstrap.h"
#include "core/comm.h"

extern "C" {

anyrResult_t anyrGetVersion(int* version) {
  return anyr::guarded(nullptr, "anyrGetVersion", [&] {
    ANYR_REQUIRE_ARG(version != nullptr, "version", "must not be NULL");
    *version = ANYR_VERSION_CODE;
  });
}

anyrResult_t anyrGetUniqueId(anyrUniqueId* uniqueId) {
  return anyr::guarded(nullptr, "anyrGetUniqueId", [&] {
    ANYR_REQUIRE_ARG(uniqueId != nullptr, "uniqueId", "must not be NULL");
    anyr::createUniqueId(uniqueId);
  });
}

anyrResult_t anyrCommInitRankConfig(anyrComm_t* comm, int nranks, anyrUniqueId uniqueId, int rank,
                                    const anyrConfig_t* config) {
  return anyr::guarded(nullptr, "anyrCommInitRank", [&] {
    ANYR_REQUIRE_ARG(comm != nullptr, "comm", "must not be NULL");
    *comm = nullptr;
    ANYR_REQUIRE_ARG(nranks >= 1 && nranks <= anyr::kMaxRanks, "nranks",
                     "world size " + std::to_string(nranks) + " out of range 1.." +
                         std::to_string(anyr::kMaxRanks));
    ANYR_REQUIRE_ARG(
        rank >= 0 && rank < nranks, "rank",
        "rank " + std::to_string(rank) + " out of range 0.." + std::to_string(nranks - 1));
    anyr::Config cfg = anyr::resolveConfig(config);
    auto bs = anyr::createTcpBootstrap(uniqueId, rank, nranks, cfg.timeoutMs);
    auto handle = std::make_unique<anyrComm>();
    handle->impl = anyr::Communicator::create(std::move(bs), cfg, nullptr);
    *comm = handle.release();
  });
}

anyrResult_t anyrCommInitRank(anyrComm_t* comm, int nranks, anyrUniqueId uniqueId, int rank) {
  return anyrCommInitRankConfig(comm, nranks, uniqueId, rank, nullptr);
}

anyrResult_t anyrCommInitFromNccl(anyrComm_t* comm, void* ncclComm, const anyrConfig_t* config) {
  return anyr::guarded(nullptr, "anyrCommInitFromNccl", [&] {
    ANYR_REQUIRE_ARG(comm != nullptr, "comm", "must not be NULL");
    *comm = nullptr;
    ANYR_REQUIRE_ARG(ncclComm != nullptr, "ncclComm", "must not be NULL");
    anyr::Config cfg = anyr::resolveConfig(config);
    auto bs = anyr::createNcclBootstrap(ncclComm, cfg.timeoutMs);
    auto handle = std::make_unique<anyrComm>();
    handle->impl =
        anyr::Communicator::create(std::move(bs), cfg, static_cast<ncclComm_t>(ncclComm));
    *comm = handle.release();
  });
}

anyrResult_t anyrCommDestroy(anyrComm_t comm) {
  if (comm == nullptr) {
    anyr::record(nullptr, "anyrCommDestroy: argument 'comm': must not be NULL");
    return anyrInvalidArgument;
  }
  anyrResult_t r = anyr::guarded(nullptr, "anyrCommDestroy", [&] {
    if (comm->impl) comm->impl->destroy();
  });
  // Another thread is inside a call on it (the only anyrInvalidUsage destroy() raises): nothing
  // was freed, the communicator stays valid; the caller may retry once that call returned.
  if (r == anyrInvalidUsage) return r;
  comm->impl.reset();
  delete comm;
  return r;
}

anyrResult_t anyrCommAbort(anyrComm_t comm) {
  return anyr::guarded(comm, "anyrCommAbort", [&] { anyr::liveComm(comm).abort(); });
}

anyrResult_t anyrCommGetAsyncError(anyrComm_t comm, anyrResult_t* asyncError) {
  return anyr::guarded(comm, "anyrCommGetAsyncError", [&] {
    ANYR_REQUIRE_ARG(asyncError != nullptr, "asyncError", "must not be NULL");
    std::string msg;
    *asyncError = anyr::liveComm(comm).asyncError(&msg);
    if (*asyncError != anyrSuccess) anyr::record(comm, msg);
  });
}

anyrResult_t anyrCommCount(const anyrComm_t comm, int* count) {
  return anyr::guarded(comm, "anyrCommCount", [&] {
    ANYR_REQUIRE_ARG(count != nullptr, "count", "must not be NULL");
    *count = anyr::liveComm(comm).size();
  });
}

anyrResult_t anyrCommUserRank(const anyrComm_t comm, int* rank) {
  return anyr::guarded(comm, "anyrCommUserRank", [&] {
    ANYR_REQUIRE_ARG(rank != nullptr, "rank", "must not be NULL");
    *rank = anyr::liveComm(comm).rank();
  });
}

anyrResult_t anyrCommCuDevice(const anyrComm_t comm, int* device) {
  return anyr::guarded(comm, "anyrCommCuDevice", [&] {
    ANYR_REQUIRE_ARG(device != nullptr, "device", "must not be NULL");
    *device = anyr::liveComm(comm).device();
  });
}

anyrResult_t anyrCommGetNcclComm(const anyrComm_t comm, void** ncclComm) {
  return anyr::guarded(comm, "anyrCommGetNcclComm", [&] {
    ANYR_REQUIRE_ARG(ncclComm != nullptr, "ncclComm", "must not be NULL");
    *ncclComm = anyr::liveComm(comm).nccl();
  });
}

anyrResult_t anyrAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           anyrDataType_t datatype, anyrRedOp_t op, anyrComm_t comm,
                           cudaStream_t stream) {
  return anyr::guarded(comm, "anyrAllReduce", [&] {
    anyr::liveComm(comm).allReduce(sendbuff, recvbuff, count, datatype, op, stream);
  });
}

anyrResult_t anyrAllReduceAddRmsNorm(const void* partial, const void* residualIn, void* residualOut,
                                     const void* weight, float epsilon, void* normOut,
                                     size_t tokens, size_t hidden, anyrDataType_t datatype,
                                     const anyrFusedOptions_t* options, anyrComm_t comm,
                                     cudaStream_t stream) {
  return anyr::guarded(comm, "anyrAllReduceAddRmsNorm", [&] {
    anyr::liveComm(comm).allReduceAddRmsNorm(partial, residualIn, residualOut, weight, epsilon,
                                             normOut, tokens, hidden, datatype, options, stream);
  });
}

anyrResult_t anyrCommSetAlgorithm(anyrComm_t comm, anyrAlgo_t algorithm) {
  return anyr::guarded(comm, "anyrCommSetAlgorithm",
                       [&] { anyr::liveComm(comm).setAlgorithm(algorithm); });
}

anyrResult_t anyrCommQueryAlgorithm(const anyrComm_t comm, size_t count, anyrDataType_t datatype,
                                    anyrAlgo_t* algorithm) {
  return anyr::guarded(comm, "anyrCommQueryAlgorithm", [&] {
    ANYR_REQUIRE_ARG(algorithm != nullptr, "algorithm", "must not be NULL");
    *algorithm = anyr::liveComm(comm).queryAlgorithm(count, datatype);
  });
}

anyrResult_t anyrCommTune(anyrComm_t comm, int budgetMs, const char* savePath) {
  return anyr::guarded(comm, "anyrCommTune", [&] {
    anyr::Communicator& c = anyr::liveComm(comm);
    anyr::Communicator::TuneOptions o;
    o.budgetMs = budgetMs;
    anyr::TuningTable t = c.tune(o, nullptr);
    if (savePath != nullptr && c.rank() == 0) anyr::saveTuningFile(t, savePath);
  });
}

anyrResult_t anyrCommExplain(const anyrComm_t comm, char* buf, size_t len, size_t* needed) {
  return anyr::guarded(comm, "anyrCommExplain", [&] {
    ANYR_REQUIRE_ARG(buf != nullptr || len == 0, "buf", "must not be NULL when len > 0");
    anyr::copyText(anyr::liveComm(comm).explainJson(), buf, len, needed);
  });
}

const char* anyrAlgoName(anyrAlgo_t algorithm) { return anyr::algoName(algorithm); }

const char* anyrGetErrorString(anyrResult_t result) {
  static constexpr anyr::Named<anyrResult_t> kTexts[] = {
      {anyrSuccess, "no error"},
      {anyrCudaError, "CUDA call failed"},
      {anyrSystemError, "system call failed"},
      {anyrInternalError, "internal error (please report)"},
      {anyrInvalidArgument, "invalid argument"},
      {anyrInvalidUsage, "invalid usage"},
      {anyrRemoteError, "remote rank failed"},
      {anyrTimeout, "timed out"},
      {anyrAborted, "communicator aborted"},
      {anyrNcclError, "NCCL call failed"},
      {anyrUnsupported, "not supported on this hardware or build"}};
  return anyr::nameOf(kTexts, result, "unknown result code");
}

const char* anyrGetLastError(anyrComm_t comm) {
  if (comm != nullptr) {
    std::lock_guard<std::mutex> lock(comm->mu);
    thread_local std::string copy;
    copy = comm->lastError;
    return copy.c_str();
  }
  return anyr::threadLastError().c_str();
}

}  // extern "C"
