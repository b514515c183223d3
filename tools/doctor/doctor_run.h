#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "anyreduce/anyreduce.h"
#include "doctor.h"
#include "nvml_sampler.h"

namespace anyr {
namespace doctor {

// One rank of the GPU run; writes its figures to rankFile. Throws on failure.
int doctorRank(const RunOptions& o, int rank, int nranks, const anyrUniqueId& id, int ngpus,
               double t0, const std::string& rankFile);

// One GPU's NVML samples as the measurement file stores them (doctor.h, "samples"):
// {gpu, t[], powerW[], smMHz[], util[]}.
nlohmann::json samplesJson(const nlohmann::json& gpu, const std::vector<Sample>& samples);

}  // namespace doctor
}  // namespace anyr
