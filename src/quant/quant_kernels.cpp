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

#define QLFT_KERNEL_SOURCE "quant/quant_kernels.inc"
#include "core/isa_sets.inc"

}  // namespace

#define QLFT_KERNEL_SET(level, ns)                                                        \
  QuantKernels {                                                                          \
    level, ns::nf4_quantize_block, ns::nf4_dequantize_scaled, ns::ggml_dequantize_blocks, \
        ns::int8_dequantize_rows                                                          \
  }
QLFT_KERNEL_SETS(QuantKernels, kQuantKernelSets, QLFT_KERNEL_SET);
#undef QLFT_KERNEL_SET

}  // namespace qlft
