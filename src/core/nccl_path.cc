#include "core/nccl_path.h"

#include <cstdio>
#include <cstring>
#include <vector>

#include "core/context.h"
#include "core/failure_state.h"

namespace anyr {

void NcclPath::init(ncclComm_t externalNccl) {
  std::string why;
  ncclComm_t comm = nullptr;
  if (externalNccl != nullptr) {
    comm = externalNccl;
  } else if (!ctx_.cfg.useNccl) {
    why = "disabled by configuration (ANYR_USE_NCCL=0)";
  } else if (!ctx_.facts.distinctDevices) {
    why = "ranks share a GPU (NCCL needs one rank per GPU)";
  } else {
    comm = createNcclComm(*ctx_.bs, ctx_.cfg.timeoutMs, &why);
  }
  // NCCL is usable only if it is usable on every rank.
  struct Vote {
    int32_t ok;
    char why[124];
  };
  Vote mine{};
  mine.ok = comm != nullptr;
  std::snprintf(mine.why, sizeof(mine.why), "%s", why.c_str());
  std::vector<Vote> votes;
  try {
    votes = ctx_.bs->allGatherValue(mine);
  } catch (...) {
    // Init fails here (a peer gone): the communicator NCCL made is not kept, so release it.
    if (comm != nullptr && externalNccl == nullptr) releaseNcclComm(comm, false);
    throw;
  }
  ctx_.facts.ncclAvailable = true;
  for (int r = 0; r < ctx_.nranks; ++r) {
    if (!votes[static_cast<size_t>(r)].ok) {
      ctx_.facts.ncclAvailable = false;
      ctx_.facts.ncclReason =
          "rank " + std::to_string(r) + ": " +
          std::string(votes[static_cast<size_t>(r)].why,
                      strnlen(votes[static_cast<size_t>(r)].why, sizeof(mine.why)));
      break;
    }
  }
  if (ctx_.facts.ncclAvailable) {
    nccl_.adopt(
        comm, externalNccl == nullptr, ctx_.rank, ctx_.device,
        [this](anyrResult_t code, const std::string& msg) { failure_.setFailed(code, msg); });
  } else if (comm != nullptr && externalNccl == nullptr) {
    releaseNcclComm(comm, true);
  }
}

}  // namespace anyr
