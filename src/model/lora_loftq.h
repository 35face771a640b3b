// LoftQ initialisation of a LoRA adapter on a quantized base (PEFT's replace_lora_weights_loftq,
// peft/utils/loftq_utils.py _loftq_init_new): the base stays as loaded, and each targeted
// projection's A and B become the rank-r SVD of its quantization error W - dequant(Q(W)), W read
// again from the model's file, so that the adapted layer starts at about W instead of Q(W).
//
// PEFT sets lora_B = U sqrt(S), lora_A = sqrt(S) Vh and leaves out the scale s = alpha / r (so its
// adapter adds s times the error); here both are divided by sqrt(s), so s B A is the rank-r error
// for every alpha. At alpha = r (s = 1) the two are the same.
#pragma once

#include <cstdint>
#include <vector>

#include "model/lora.h"
#include "model/model.h"

namespace qlft {

// The leading r singular triplets of the row-major [m, n] matrix x (computed in double): u [m, r]
// (column j the j-th left singular vector), s [r] descending, vt [r, n]. r <= min(m, n). From the
// Gram matrix of the short side: all its eigenpairs by Jacobi when min(m, n) <= 256 (exact), else
// the leading ones by subspace iteration with Rayleigh-Ritz steps until the leading r eigenvalues
// stop changing.
void truncated_svd(const float* x, int64_t m, int64_t n, int r, std::vector<double>* u,
                   std::vector<double>* s, std::vector<double>* vt);

// One projection: A [r, in] and B [out, r] with s B A the rank-r SVD of w - wq (both [out, in]).
void loftq_factors(const float* w, const float* wq, int64_t out, int64_t in, int r, float scale,
                   float* A, float* B);

// Sets every targeted slot's A and B of `a` from the model's quantized projections and their
// source weights (for_each_source_projection). Refuses a base that is not quantized (quant.type
// keep: there is no quantization error to cancel), naming lora.init.
void loftq_init(LoraAdapter& a, const Model& m, MemoryTracker* tracker);

}  // namespace qlft
