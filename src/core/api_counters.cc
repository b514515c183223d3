// C boundary of anyrCommGetCounters / anyrCommResetCounters (see core/counters.h).
#include "anyreduce/anyreduce.h"
#include "bootstrap/bootstrap.h"
#include "core/boundary.h"
#include "core/comm.h"
#include "core/error.h"

namespace {

anyr::Communicator& liveComm(anyrComm_t comm) {
  ANYR_REQUIRE_ARG(comm != nullptr, "comm", "must not be NULL");
  if (comm->impl == nullptr) anyr::throwError(anyrInvalidUsage, "communicator was destroyed");
  return *comm->impl;
}

}  // namespace

extern "C" {

anyrResult_t anyrCommGetCounters(const anyrComm_t comm, anyrCounters_t* counters) {
  return anyr::guarded(comm, "anyrCommGetCounters", [&] {
    ANYR_REQUIRE_ARG(counters != nullptr, "counters", "must not be NULL");
    ANYR_REQUIRE_ARG(counters->size == sizeof(anyrCounters_t), "counters",
                     "size must be sizeof(anyrCounters_t)");
    ANYR_REQUIRE_ARG(counters->magic == ANYR_COUNTERS_MAGIC, "counters",
                     "magic must be ANYR_COUNTERS_MAGIC");
    liveComm(comm).counters().snapshot(counters);
  });
}

anyrResult_t anyrCommResetCounters(anyrComm_t comm) {
  return anyr::guarded(comm, "anyrCommResetCounters", [&] { liveComm(comm).counters().reset(); });
}

}  // extern "C"
