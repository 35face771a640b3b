// The CPU backend's elementwise hot loops (softmax rows of attention and cross-entropy, SwiGLU,
// RMSNorm and RoPE rows),
// one set per ISA level, chosen at run time like quant/quant_kernels.h.
//
// vec_kernels.cpp compiles vec_kernels.inc for the build's baseline, for AVX2 + FMA + F16C and
// for AVX-512 (target attributes, core/isa_target.h); the loops are vec_math.h's, vectorized by
// the compiler for each level. Unlike src/quant this code may contract a*b+c into FMAs where the
// level has them (as the -march=native build did), so levels agree to rounding, not bit for bit;
// each level is deterministic and independent of the thread count.
#pragma once

#include <cstdint>

#include "core/isa_target.h"

namespace qlft::cpu {

struct VecKernels {
  CpuIsa isa;  // the level this set was compiled for (Baseline, Avx2 or Avx512)
  float (*max_of)(const float* x, int64_t n);                     // vec_math.h max_of
  double (*sum_exp_shifted)(const float* x, int64_t n, float m);  // vec_math.h
  // x[j] = exp(x[j] - m), returning sum_exp_shifted's sum (vec_math.h)
  double (*exp_sum_shifted)(float* x, int64_t n, float m);
  // x[j] = exp(x[j] - m) * scale (vec_math.h exp_approx_shifted)
  void (*exp_shifted)(float* x, int64_t n, float m, float scale);
  // exp_shifted with scale 1 that also writes x as bf16 bits (core/half.h rounding) into out
  void (*exp_shifted_bf16)(float* x, int64_t n, float m, uint16_t* out);
  // out[j] = bf16 bits of x[j] * s
  void (*scale_to_bf16)(const float* x, int64_t n, float s, uint16_t* out);
  // ds[j] = p[j] * (ds[j] - d): the softmax backward of one attention row
  void (*softmax_bwd_row)(float* ds, const float* p, float d, int64_t n);
  // out[j] = bf16 bits of p[j] * (dp[j] - d)
  void (*softmax_bwd_row_bf16)(const float* dp, const float* p, float d, int64_t n, uint16_t* out);
  // out = silu(gate) * up, and its gradients (activation_math.h's formulas, sigmoid from
  // exp_approx_in_range)
  void (*swiglu_fwd_row)(const float* g, const float* u, float* o, int64_t n);
  void (*swiglu_bwd_row)(const float* g, const float* u, const float* d, float* dg, float* du,
                         int64_t n);
  // One RMSNorm row of n (norm_math.h): y = x * rstd * w, *rstd_out = rstd (when not null);
  // backward dx += ... from the forward's rstd.
  void (*rmsnorm_fwd_row)(const float* x, const float* w, float eps, float* y, float* rstd_out,
                          int64_t n);
  void (*rmsnorm_bwd_row)(const float* x, const float* w, float rstd, const float* dy, float* dx,
                          int64_t n);
  // RoPE on one row of n_heads heads of head_dim (rope_math.h) with this position's cos / sin
  // tables of head_dim / 2; adjacent: llama.cpp's pair order, else rotate-half.
  void (*rope_row)(float* x, const float* cos, const float* sin, int n_heads, int head_dim,
                   bool adjacent);
  // LoRA dropout over one row of n (backend/dropout.h's mask in its integer form: element c kept
  // when lora_dropout_bits(seed, row_base, c) >= threshold). Forward: out = keep ? x * inv : 0.
  // Backward: xd = keep ? x * inv : 0 (when xd is not null) and dx += keep ? s * t : 0 (when dx
  // is not null). The hash's 64-bit products are native only with AVX-512 (vpmullq).
  void (*dropout_row)(const float* x, int64_t n, uint64_t seed, uint64_t row_base,
                      uint32_t threshold, float inv, float* out);
  void (*dropout_bwd_row)(const float* x, const float* t, int64_t n, uint64_t seed,
                          uint64_t row_base, uint32_t threshold, float inv, float s, float* xd,
                          float* dx);
};

// The three sets, in kernel_set_index's order (vec_kernels.cpp).
extern const VecKernels kVecKernelSets[3];

// The set for cpu_isa() (the CPU's level capped by QLFT_CPU_ISA), chosen once per process.
inline const VecKernels& vec_kernels() {
  return kernel_set_for_cpu(kVecKernelSets);
}

// The set for ISA level `isa` (the best one at or below it); null when this CPU (with the cap)
// cannot run that level.
inline const VecKernels* vec_kernels_at(CpuIsa isa) {
  return kernel_set_at(kVecKernelSets, isa);
}

}  // namespace qlft::cpu
