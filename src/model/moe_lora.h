// LoRA on a mixture-of-experts layer as PEFT 0.21 adapts it: transformers 5 holds the experts
// fused (MixtralExperts / Qwen3MoeExperts: gate_up_proj [E, 2 ffn, dim], down_proj [E, dim,
// ffn]) and PEFT's LoraConfig(target_parameters=["mlp.experts.gate_up_proj",
// "mlp.experts.down_proj", "mlp.gate.weight"]) wraps each parameter in a ParamWrapper:
//  - gate_up_proj: ONE LoRA per expert over the fused [2 ffn, dim] matrix (an A shared by gate and
//    up, B over gate's rows then up's), lora_A [r E, dim], lora_B [2 ffn, r E];
//  - down_proj: lora_A [r E, ffn], lora_B [dim, r E];
//  - the router (gate.weight [E, dim], a 2-D parameter): a plain LoRA, lora_A [r, dim],
//    lora_B [E, r].
// PEFT's get_delta_weight reads lora_A as (E, r, in) (expert e's A: rows e r .. e r + r - 1, as
// qlft holds it) and lora_B as (out, r, E): expert e's B [out, r] is lora_B's columns j E + e.
// qlft holds B expert by expert ([E, out, r], each expert's B contiguous: the kernels' LoraRef);
// moe_lora_b_from_peft / moe_lora_b_to_peft convert. PEFT refuses dropout, DoRA and lora_bias
// on a ParamWrapper: these factors have none.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"

namespace qlft {

// One adapted parameter of every expert (or the router: experts 1). Pointers in the backend's
// memory; the gradients are accumulated into (+=), null where not wanted.
struct MoeLoraPart {
  const float* A = nullptr;  // [E r, in]
  const float* B = nullptr;  // [E, out, r]
  float* dA = nullptr;       // as A
  float* dB = nullptr;       // as B
  int r = 0;                 // 0: not adapted
  float scale = 1.f;         // alpha / r (alpha / sqrt(r) with rsLoRA)
  bool active() const { return r > 0; }
  // Expert e's factors for the kernels, B's rows [row0, row0 + rows) of its out.
  LoraRef ref(int e, int64_t in, int64_t out, int64_t row0 = 0) const {
    LoraRef l;
    l.A = A + int64_t(e) * r * in;
    l.B = B + (int64_t(e) * out + row0) * r;
    l.r = r;
    l.scale = scale;
    return l;
  }
  float* d_a(int e, int64_t in) const { return dA ? dA + int64_t(e) * r * in : nullptr; }
  float* d_b(int e, int64_t out, int64_t row0 = 0) const {
    return dB ? dB + (int64_t(e) * out + row0) * r : nullptr;
  }
};

// A layer's LoRA: gate_up (in dim, out 2 ffn: gate's rows, then up's), down (in ffn, out dim),
// router (in dim, out n_experts; one "expert").
struct MoeLora {
  MoeLoraPart gate_up, down, router;
};

// The ranks of a layer's LoRA (0: not adapted): what moe_fwd keeps for it (MoeSaved::lora).
struct MoeLoraRanks {
  int gate_up = 0, down = 0, router = 0;
};
inline MoeLoraRanks moe_lora_ranks(const MoeLora* l) {
  MoeLoraRanks k;
  if (l) k.gate_up = l->gate_up.r, k.down = l->down.r, k.router = l->router.r;
  return k;
}

// Offsets (in floats) of MoeSaved::lora's arrays: the LoRA inputs x A^T of the packed rows
// (gate_up [rows top_k, r], down [rows top_k, r]) and of the router's rows ([rows, r]).
struct MoeLoraLayout {
  int64_t gate_up, down, router, total;
};
inline MoeLoraLayout moe_lora_layout(int64_t rows, int top_k, const MoeLoraRanks& k) {
  MoeLoraLayout l;
  l.gate_up = 0;
  l.down = rows * top_k * k.gate_up;
  l.router = l.down + rows * top_k * k.down;
  l.total = l.router + rows * k.router;
  return l;
}

// PEFT's lora_B [out, r E] (expert e at columns j E + e) -> qlft's [E, out, r], and back.
std::vector<float> moe_lora_b_from_peft(const float* b, int64_t out, int r, int n_experts);
std::vector<float> moe_lora_b_to_peft(const float* b, int64_t out, int r, int n_experts);

}  // namespace qlft
