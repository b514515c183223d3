// Size arithmetic shared by the host control plane and the kernels' launchers.
#pragma once

#include <cstdint>

namespace anyr {

// x rounded up to a multiple of a (workspace and host-segment layouts).
inline constexpr uint64_t roundUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

}  // namespace anyr
