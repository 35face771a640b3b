// quant_kernels.inc compiled for each ISA level (target attributes, whatever -march the build
// uses), and the run-time choice among them.
#include "quant/quant_kernels.h"

// GCC 12 reports its own _mm512_undefined_*() placeholders inside AVX-512 intrinsics as "may be
// used uninitialized" when they are inlined into target-attribute functions (a false positive).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "core/isa_target.h"
#include "quant/ggml_math.h"
#include "quant/ggml_types.h"
#include "quant/nf4_math.h"

namespace qlft {
namespace {

namespace isa_baseline {
#define QLFT_KISA 0
#define QLFT_KT
#include "quant/quant_kernels.inc"
#undef QLFT_KISA
#undef QLFT_KT
}  // namespace isa_baseline

namespace isa_avx2 {
#define QLFT_KISA 1
#define QLFT_KT QLFT_TARGET_AVX2
#include "quant/quant_kernels.inc"
#undef QLFT_KISA
#undef QLFT_KT
}  // namespace isa_avx2

namespace isa_avx512 {
#define QLFT_KISA 2
#define QLFT_KT QLFT_TARGET_AVX512
#include "quant/quant_kernels.inc"
#undef QLFT_KISA
#undef QLFT_KT
}  // namespace isa_avx512

#define QLFT_KERNEL_SET(level, ns)                                                        \
  QuantKernels {                                                                          \
    level, ns::nf4_quantize_block, ns::nf4_dequantize_scaled, ns::ggml_dequantize_blocks, \
        ns::int8_dequantize_rows                                                          \
  }
const QuantKernels kSets[] = {QLFT_KERNEL_SET(CpuIsa::Baseline, isa_baseline),
                              QLFT_KERNEL_SET(CpuIsa::Avx2, isa_avx2),
                              QLFT_KERNEL_SET(CpuIsa::Avx512, isa_avx512)};
#undef QLFT_KERNEL_SET

}  // namespace

const QuantKernels& quant_kernels() {
  static const QuantKernels& k = kernel_set_for_cpu(kSets);
  return k;
}

const QuantKernels* quant_kernels_at(CpuIsa isa) {
  return kernel_set_at(kSets, isa);
}

}  // namespace qlft
