// vec_kernels.inc compiled for each ISA level (target attributes, whatever -march the build
// uses), and the run-time choice among them.
#include "backend/cpu/vec_kernels.h"

#include <algorithm>
#include <cmath>

#include "backend/activation_math.h"
#include "backend/dropout.h"
#include "backend/norm_math.h"
#include "backend/rope_math.h"
#include "backend/cpu/vec_math.h"
#include "core/dtype.h"
#include "core/half.h"
#include "core/isa_target.h"

namespace qlft::cpu {
namespace {

#define QLFT_KERNEL_SOURCE "backend/cpu/vec_kernels.inc"
#include "core/isa_sets.inc"

}  // namespace

#define QLFT_KERNEL_SET(level, ns)                                                        \
  VecKernels {                                                                            \
    level, ns::k_max_of, ns::k_sum_exp_shifted, ns::k_exp_sum_shifted, ns::k_exp_shifted, \
        ns::k_exp_shifted_bf16, ns::k_scale_to_bf16, ns::k_softmax_bwd_row,               \
        ns::k_softmax_bwd_row_bf16, ns::k_swiglu_fwd_row, ns::k_swiglu_bwd_row,           \
        ns::k_rmsnorm_fwd_row, ns::k_rmsnorm_bwd_row, ns::k_rope_row, ns::k_dropout_row,  \
        ns::k_dropout_bwd_row                                                             \
  }
QLFT_KERNEL_SETS(VecKernels, kVecKernelSets, QLFT_KERNEL_SET);
#undef QLFT_KERNEL_SET

}  // namespace qlft::cpu
