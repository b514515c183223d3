// The standalone kernel's RowsAsync form (fused/add_rmsnorm_rows.cuh): its kernels, one per
// dtype, vectors a thread holds (1..3: four would need 128 KB of shared memory) and quantization
// mode, for aligned buffers only.
#include "fused/add_rmsnorm_rows.cuh"

namespace anyr {

// Dynamic shared memory of these kernels, at most (scripts/check-smem.py reads the line):
// anyr-dynamic-smem-max: 98304
static_assert(rowsform::asyncSmemBytes(rowsform::kMaxThreads, rowsform::kMaxAsyncVpt) == 98304,
              "update anyr-dynamic-smem-max");

cudaError_t launchAddRmsNormRowsAsync(anyrDataType_t dtype, const void* x, const FusedParams& p,
                                      cudaStream_t stream, const AddRmsNormTarget& t,
                                      AddRmsNormShape* shape) {
  return rowsform::launch<true>(dtype, x, p, stream, t, shape);
}

}  // namespace anyr
