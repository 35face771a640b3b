// The attention mask both CUDA attention paths apply (k_attention.cu, k_attention_tc.cu):
// query qi of batch element `base / seq` sees key kj iff kj <= qi, both inside the sequence,
// and, with packed documents, both in one document (AttnShape::doc_ids), and with a sliding
// window kj > qi - window (AttnShape::window). And the scores both paths give the softmax: the
// product q.k times the scale, soft-capped (Gemma 2), with the cap's derivative for dS.
#pragma once

#include "kernels.h"

namespace qlft::cu {

__device__ __forceinline__ bool attends(const AttnArgs& a, int64_t base, int qi, int kj) {
  if (kj > qi || qi >= a.seq || kj >= a.seq) return false;
  if (a.window > 0 && kj <= qi - a.window) return false;  // sliding window (AttnShape::window)
  return !a.doc || a.doc[base + kj] == a.doc[base + qi];
}

// The scores' scale: AttnShape::scale (Gemma's query_pre_attn_scalar^-0.5) or head_dim^-0.5.
__device__ __forceinline__ float attn_scale(const AttnArgs& a) {
  return a.scale > 0.f ? a.scale : rsqrtf(float(a.head_dim));
}

// The softmax's input from a scaled score s: softcap * tanh(s / softcap), or s without a cap.
__device__ __forceinline__ float attn_cap(const AttnArgs& a, float s) {
  return a.softcap > 0.f ? a.softcap * tanhf(s / a.softcap) : s;
}

// d attn_cap / d s at the capped score c: 1 - tanh^2 = 1 - (c / softcap)^2 (1 without a cap);
// dS is multiplied by it after the softmax backward, before any rounding, as on the CPU.
__device__ __forceinline__ float attn_cap_grad(const AttnArgs& a, float c) {
  if (!(a.softcap > 0.f)) return 1.f;
  const float t = c / a.softcap;
  return 1.f - t * t;
}

}  // namespace qlft::cu
