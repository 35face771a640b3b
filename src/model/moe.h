// A mixture-of-experts FFN as Mixtral has it (transformers' MixtralSparseMoeBlock): a frozen
// router (a linear [n_experts, dim] without bias) scores each row, softmax over the experts, the
// top_k largest probabilities kept and renormalised to sum 1, and the row's output is the sum of
// those k experts' SwiGLU MLPs (w1 gate, w3 up, w2 down) weighted by them. The backward takes
// the gradient to the input through the experts and through the routing weights (softmax, top-k
// renormalisation, the router's linear); the router and the experts get none (frozen).
//
// The load-balancing auxiliary loss is not computed: transformers adds it only when called with
// output_router_logits=True, and MixtralConfig's default is False (training a LoRA adapter with
// the default config adds no aux loss), which is what this follows.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "core/tensor.h"
#include "quant/qweight.h"

namespace qlft {

// One MoE layer's frozen weights. The experts' projections are quantized like any projection
// (NF4 / INT8 / kept); the router is whatever the loader made it (kept in f32 by the HF loader,
// as bitsandbytes' QLoRA leaves small routers alike in effect: it is never trained).
struct MoeWeights {
  QWeight router;                   // [n_experts, dim]
  std::vector<QWeight> w1, w3, w2;  // per expert: gate [ffn, dim], up [ffn, dim], down [dim, ffn]
  int top_k = 2;                    // num_experts_per_tok
  bool norm_topk = true;            // the top k weights renormalised to sum 1 (Mixtral's)
  int n_experts() const { return static_cast<int>(w1.size()); }
};

// What moe_fwd keeps for moe_bwd: the routing, and per expert its gathered rows and their
// activations. Host vectors, not tracked Buffers; the planner counts them (moe_saved_bytes).
struct MoeSaved {
  int64_t rows = 0, dim = 0, ffn = 0;
  int n_experts = 0, top_k = 0;
  std::vector<float> probs;    // [rows, n_experts] the router's softmax
  std::vector<int32_t> index;  // [rows, top_k] the chosen experts, by descending probability
  std::vector<float> weight;   // [rows, top_k] their renormalised weights
  struct Expert {
    std::vector<int32_t> token, slot;         // the rows routed here and their top-k slot
    std::vector<float> x, gate, up, hact, y;  // gathered input, w1 / w3 outputs, SwiGLU, w2 output
  };
  std::vector<Expert> experts;
};

// The bytes moe_fwd keeps in a MoeSaved for rows of dim through experts of ffn (n_experts,
// top_k each row): the planner's count of them.
inline uint64_t moe_saved_bytes(int64_t rows, int64_t dim, int64_t ffn, int n_experts, int top_k) {
  const uint64_t routed = uint64_t(rows) * uint64_t(top_k);  // (row, expert) pairs
  return 4 * (uint64_t(rows) * uint64_t(n_experts) + 2 * routed +
              routed * (2 + 2 * uint64_t(dim) + 3 * uint64_t(ffn)));
}

// out = MoE(x) ([rows, dim], overwritten); s receives what the backward needs.
void moe_fwd(Backend& be, const MoeWeights& w, CMatF x, MatF out, MoeSaved& s);
// dx += d out / d x applied to dout, given moe_fwd's s and its x.
void moe_bwd(Backend& be, const MoeWeights& w, const MoeSaved& s, CMatF x, CMatF dout, MatF dx);

}  // namespace qlft
