// The initial LoRA factors of PEFT's PiSSA and OLoRA (init_lora_weights="pissa" / "olora",
// peft/tuners/lora/layer.py pissa_init, olora_init), from one projection's weight.
//
// PEFT writes W - s B0 A0 into the base and trains B, A from (B0, A0). Here the base stays as
// loaded (one copy shared by every trainer on a model), and the runtime adds s (B A - B0 A0) x with
// a frozen copy of the initial factors: at the start that is W x, and with an fp32 base it equals
// PEFT's residual-base forward. These functions compute only (A0, B0).
#pragma once

#include <cstdint>

namespace qlft {

// PiSSA: with w = U S Vh (w row-major [out, in], e.g. dequantized), A = diag(sqrt(S_r / scale))
// Vh_r [r, in] and B = U_r diag(sqrt(S_r / scale)) [out, r], so scale B A is the rank-r SVD part of
// w (scale = alpha / r, or alpha / sqrt(r) with rsLoRA). Singular vectors are unique up to a sign
// per component (for distinct singular values); the sign is fixed so that the largest-magnitude
// entry of each column of B (the first one on ties) is positive. PEFT's LAPACK SVD picks its own
// signs, so A and B match PEFT's after a per-component sign flip; s B A matches as is. A rank r
// above min(out, in) leaves A's extra rows and B's extra columns zero.
void pissa_factors(const float* w, int64_t out, int64_t in, int r, float scale, float* A, float* B);

// OLoRA: the reduced QR w = Q R (Q [out, k] orthonormal columns, R [k, in] upper trapezoidal,
// k = min(out, in)) by Householder reflections in double with LAPACK's conventions (dgeqrf's
// dlarfg: R's diagonal entry j is -sign(alpha_j) times the norm of the column below and at j; a
// column already zero below the diagonal is left unreflected), the QR that torch.linalg.qr returns.
// Then A = R[:r, :] [r, in] and B = Q[:, :r] [out, r], without the scale (PEFT subtracts s B A from
// the base). A rank r above k leaves A's extra rows and B's extra columns zero.
void olora_factors(const float* w, int64_t out, int64_t in, int r, float* A, float* B);

}  // namespace qlft
