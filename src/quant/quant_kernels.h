// The hot (de)quantization kernels of src/quant, one set per ISA level, chosen at run time.
//
// quant_kernels.cpp compiles the one source of these kernels (quant_kernels.inc) three times:
// for the build's baseline, for AVX2 + FMA + F16C and for AVX-512 F/BW/VL/DQ (target attributes,
// core/isa_target.h). Every set does the same float operations in the same order (src/quant
// builds with -ffp-contract=off), so all of them give the same bits: the bitsandbytes / ggml
// arithmetic the oracle tests hold the scalar code to (test_quant_isa compares the sets).
#pragma once

#include <cstdint>

#include "core/isa_target.h"

namespace qlft {

struct QuantKernels {
  CpuIsa isa;  // the level this set was compiled for (Baseline, Avx2 or Avx512)
  // One NF4 block of len elements (bitsandbytes quantize_4bit): absmax, codes of
  // x * (1 / absmax) (or x / absmax when partial), packed two per byte, high nibble first.
  void (*nf4_quantize_block)(const float* x, int64_t len, bool partial, uint8_t* packed,
                             float* absmax_out);
  // count NF4 elements from element e0 on, block b's absmax at absmax[b - first_block].
  void (*nf4_dequantize_scaled)(const uint8_t* packed, int64_t blocksize, int64_t e0, int64_t count,
                                const float* absmax, int64_t first_block, float* out);
  // n elements of a GGUF block type (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K); false for any other
  // type (the caller handles the plain float types). n is a multiple of the block size.
  bool (*ggml_dequantize_blocks)(uint32_t ggml_type, const void* src, int64_t n, float* dst);
  // LLM.int8 rows [r0, r0 + n) of a [*, cols] code matrix with row scales scb.
  void (*int8_dequantize_rows)(const int8_t* codes, const float* scb, int64_t r0, int64_t n,
                               int64_t cols, float* out);
};

// The three sets, in kernel_set_index's order (quant_kernels.cpp).
extern const QuantKernels kQuantKernelSets[3];

// The set for cpu_isa() (the CPU's level capped by QLFT_CPU_ISA), chosen once per process.
inline const QuantKernels& quant_kernels() {
  return kernel_set_for_cpu(kQuantKernelSets);
}

// The set for ISA level `isa` (the best one at or below it), for tests comparing the paths; null
// when this CPU (with the QLFT_CPU_ISA cap) cannot run that level.
inline const QuantKernels* quant_kernels_at(CpuIsa isa) {
  return kernel_set_at(kQuantKernelSets, isa);
}

}  // namespace qlft
