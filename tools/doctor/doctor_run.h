#pragma once

#include <string>

#include "anyreduce/anyreduce.h"
#include "doctor.h"

namespace anyr {
namespace doctor {

// One rank of the GPU run; writes its figures to rankFile. Throws on failure.
int doctorRank(const RunOptions& o, int rank, int nranks, const anyrUniqueId& id, int ngpus,
               double t0, const std::string& rankFile);

}  // namespace doctor
}  // namespace anyr
