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

namespace isa_baseline {
#define QLFT_KT
#include "backend/cpu/vec_kernels.inc"
#undef QLFT_KT
}  // namespace isa_baseline

namespace isa_avx2 {
#define QLFT_KT QLFT_TARGET_AVX2
#include "backend/cpu/vec_kernels.inc"
#undef QLFT_KT
}  // namespace isa_avx2

namespace isa_avx512 {
#define QLFT_KT QLFT_TARGET_AVX512
#include "backend/cpu/vec_kernels.inc"
#undef QLFT_KT
}  // namespace isa_avx512

#define QLFT_KERNEL_SET(level, ns)                                                        \
  VecKernels {                                                                            \
    level, ns::k_max_of, ns::k_sum_exp_shifted, ns::k_exp_sum_shifted, ns::k_exp_shifted, \
        ns::k_exp_shifted_bf16, ns::k_scale_to_bf16, ns::k_softmax_bwd_row,               \
        ns::k_softmax_bwd_row_bf16, ns::k_swiglu_fwd_row, ns::k_swiglu_bwd_row,           \
        ns::k_rmsnorm_fwd_row, ns::k_rmsnorm_bwd_row, ns::k_rope_row, ns::k_dropout_row,  \
        ns::k_dropout_bwd_row                                                             \
  }
const VecKernels kSets[] = {QLFT_KERNEL_SET(CpuIsa::Baseline, isa_baseline),
                            QLFT_KERNEL_SET(CpuIsa::Avx2, isa_avx2),
                            QLFT_KERNEL_SET(CpuIsa::Avx512, isa_avx512)};
#undef QLFT_KERNEL_SET

}  // namespace

const VecKernels& vec_kernels() {
  static const VecKernels& k = kernel_set_for_cpu(kSets);
  return k;
}

const VecKernels* vec_kernels_at(CpuIsa isa) {
  return kernel_set_at(kSets, isa);
}

}  // namespace qlft::cpu
