// The standalone kernel's Rows form (fused/add_rmsnorm_rows.cuh): its kernels, one per dtype,
// vectors a thread holds and quantization mode for aligned buffers, one general kernel per dtype
// and vectors for the others.
#include "fused/add_rmsnorm_rows.cuh"

namespace anyr {

cudaError_t launchAddRmsNormRows(anyrDataType_t dtype, const void* x, const FusedParams& p,
                                 cudaStream_t stream, const AddRmsNormTarget& t,
                                 AddRmsNormShape* shape) {
  return rowsform::launch(dtype, x, p, stream, t, shape);
}

}  // namespace anyr
