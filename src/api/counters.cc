// C boundary of anyrCommGetCounters / anyrCommResetCounters (see core/counters.h).
#include "anyreduce/anyreduce.h"
#include "api/boundary.h"
#include "base/error.h"
#include "bootstrap/bootstrap.h"
#include "core/comm.h"

extern "C" {

anyrResult_t anyrCommGetCounters(const anyrComm_t comm, anyrCounters_t* counters) {
  return anyr::guarded(comm, "anyrCommGetCounters", [&] {
    ANYR_REQUIRE_ARG(counters != nullptr, "counters", "must not be NULL");
    ANYR_REQUIRE_ARG(counters->size == sizeof(anyrCounters_t), "counters",
                     "size must be sizeof(anyrCounters_t)");
    ANYR_REQUIRE_ARG(counters->magic == ANYR_COUNTERS_MAGIC, "counters",
                     "magic must be ANYR_COUNTERS_MAGIC");
    anyr::liveComm(comm).counters().snapshot(counters);
  });
}

anyrResult_t anyrCommResetCounters(anyrComm_t comm) {
  return anyr::guarded(comm, "anyrCommResetCounters",
                       [&] { anyr::liveComm(comm).counters().reset(); });
}

}  // extern "C"
