// The communicator's NCCL path: the NCCL communicator (made here, or the caller's), whether every
// rank can use it (facts.ncclAvailable), and how teardown releases it (destroyed after a clean
// teardown, aborted otherwise).
#pragma once

#include <nccl.h>

#include <string>

#include "anyreduce/anyreduce.h"
#include "transport/nccl_comm.h"

namespace anyr {

struct CommContext;
class FailureState;

class NcclPath {
 public:
  NcclPath(CommContext& ctx, FailureState& failure) : ctx_(ctx), failure_(failure) {}
  NcclPath(const NcclPath&) = delete;
  NcclPath& operator=(const NcclPath&) = delete;

  // Collective: `externalNccl` (may be null) is used instead of creating one. NCCL is usable
  // only if it is usable on every rank (facts.ncclAvailable, facts.ncclReason).
  void init(ncclComm_t externalNccl);
  ncclComm_t get() const { return nccl_.get(); }
  void allReduceSum(const void* in, void* out, size_t count, anyrDataType_t dtype,
                    cudaStream_t stream, int timeoutMs) {
    nccl_.allReduceSum(in, out, count, dtype, stream, timeoutMs);
  }
  ncclResult_t asyncError() const { return nccl_.asyncError(); }
  void release(bool ok) { nccl_.release(ok); }
  // A refusal: the caller's NCCL communicator stopped (NcclHandle::stopCallers).
  std::string stopCallers(anyrResult_t code, const std::string& msg) {
    return nccl_.stopCallers(code, msg);
  }

  // destroy() found this rank's work unfinished at its deadline, or the peers not at teardown:
  // the NCCL communicator is then aborted, not destroyed (ncclCommDestroy would wait for it).
  bool teardownClean() const { return teardownClean_; }
  void markTeardownUnclean() { teardownClean_ = false; }

 private:
  CommContext& ctx_;
  FailureState& failure_;
  NcclHandle nccl_;
  bool teardownClean_ = true;
};

}  // namespace anyr
