// A mixture-of-experts FFN as Mixtral has it (transformers' MixtralSparseMoeBlock): a frozen
// router (a linear [n_experts, dim] without bias) scores each row, softmax over the experts, the
// top_k largest probabilities kept and renormalised to sum 1, and the row's output is the sum of
// those k experts' SwiGLU MLPs (w1 gate, w3 up, w2 down) weighted by them. The backward takes
// the gradient to the input through the experts and through the routing weights (softmax, top-k
// renormalisation, the router's linear); the router and the experts get none (frozen). With a
// MoeLora (model/moe_lora.h, PEFT's target_parameters on the experts and the router) the
// experts' and router's LoRA terms are added and their factors get gradients.
//
// The load-balancing auxiliary loss (transformers' load_balancing_loss_func, added with
// output_router_logits=True; qlft's moe.aux_loss): moe_fwd counts each layer's top-k assignments
// and sums its router probabilities per expert (MoeAux), moe_aux_loss makes the loss of a forward
// from every layer's counts and gives each layer the loss's gradient per probability, and moe_bwd
// adds it to the routing's gradient through the softmax into the router's input.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "core/memory.h"
#include "core/tensor.h"
#include "model/moe_lora.h"
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

// What moe_fwd keeps for moe_bwd, in the backend's memory (Backend::alloc, tracked: device
// memory on a device backend): the routing and the rows routed to the experts, packed expert by
// expert (rows * top_k of them: each row goes to top_k distinct experts).
struct MoeSaved {
  int64_t rows = 0, dim = 0, ffn = 0;
  int n_experts = 0, top_k = 0;
  std::vector<int64_t> offset;  // [n_experts + 1] each expert's first packed row (host)
  // 4-byte elements, moe_route_layout's: probs [rows, n_experts] (the router's softmax), weight
  // [rows, top_k] (the renormalised routing weights), g [rows * top_k] (moe_bwd's room: <dout,
  // y> per packed row), index [rows, top_k] (the chosen experts, by descending probability), pos
  // [rows, top_k] (the packed row of each choice), token [rows * top_k] (each packed row's row),
  // wpk [rows * top_k] (each packed row's weight).
  Buffer route;
  // The packed rows, moe_acts_layout's: x [n, dim] gathered input, gate / up [n, ffn] the w1 / w3
  // outputs, hact [n, ffn] SwiGLU, y [n, dim] the w2 output (n = rows * top_k).
  Buffer acts;
  // With a MoeLora: the LoRA inputs x A^T, moe_lora_layout's (empty without one).
  MoeLoraRanks ranks;
  Buffer lora;
  // The load-balancing loss's statistics of this layer (host; E values each).
  struct MoeAux {
    const float* row_weight = nullptr;  // in: each row's weight [rows] (the attention mask;
                                        // nullptr: every row 1), host, set before moe_fwd
    std::vector<double> count, prob;    // out of moe_fwd: per expert, the weighted top-k
                                        // assignments and the weighted router probabilities,
    double rows = 0;                    // and the rows' weights summed
    std::vector<double> dprob;          // in to moe_bwd: d loss / d probability of expert e for
                                        // a row of weight 1 (empty: no auxiliary loss)
  } aux;
};

// transformers' load_balancing_loss_func over the MoE layers of one forward (their MoeSaved,
// after moe_fwd): with T the weighted rows summed over layers, f_e = (count_e summed over layers)
// / T and P_e = (prob_e summed over layers) / T, the loss is E sum_e f_e P_e.
// Each layer's aux.dprob becomes scale E f_e / T (the assignments carry no gradient, as in
// torch): the gradient of scale x the loss. Returns the loss (0 without MoE layers or rows).
double moe_aux_loss(const std::vector<MoeSaved*>& layers, double scale);

// Offsets (in 4-byte elements) of MoeSaved::route's arrays and their total.
struct MoeRouteLayout {
  int64_t probs, weight, g, index, pos, token, wpk, total;
};
inline MoeRouteLayout moe_route_layout(int64_t rows, int n_experts, int top_k) {
  const int64_t n = rows * top_k;
  MoeRouteLayout l;
  l.probs = 0;
  l.weight = rows * n_experts;
  l.g = l.weight + n;
  l.index = l.g + n;
  l.pos = l.index + n;
  l.token = l.pos + n;
  l.wpk = l.token + n;
  l.total = l.wpk + n;
  return l;
}
// Offsets (in floats) of MoeSaved::acts's arrays and their total.
struct MoeActsLayout {
  int64_t x, gate, up, hact, y, total;
};
inline MoeActsLayout moe_acts_layout(int64_t rows, int64_t dim, int64_t ffn, int top_k) {
  const int64_t n = rows * top_k;
  MoeActsLayout l;
  l.x = 0;
  l.gate = n * dim;
  l.up = l.gate + n * ffn;
  l.hact = l.up + n * ffn;
  l.y = l.hact + n * ffn;
  l.total = l.y + n * dim;
  return l;
}

// A buffer of `bytes` as the tracker counts it (64-byte granules), then as round counts it (a
// device allocator's size classes; null: none).
inline uint64_t moe_counted(int64_t elems, uint64_t (*round)(uint64_t)) {
  const uint64_t b = (uint64_t(elems) * 4 + 63) / 64 * 64;
  return round ? round(b) : b;
}
// The bytes moe_fwd keeps in a MoeSaved for rows of dim through experts of ffn (n_experts,
// top_k each row): the planner's count of them (RunnerFootprint::moe_saved).
// ranks: the layer's MoeLora (its saved LoRA inputs).
inline uint64_t moe_saved_bytes(int64_t rows, int64_t dim, int64_t ffn, int n_experts, int top_k,
                                uint64_t (*round)(uint64_t) = nullptr,
                                const MoeLoraRanks& ranks = {}) {
  const int64_t lora = moe_lora_layout(rows, top_k, ranks).total;
  return moe_counted(moe_route_layout(rows, n_experts, top_k).total, round) +
         moe_counted(moe_acts_layout(rows, dim, ffn, top_k).total, round) +
         (lora ? moe_counted(lora, round) : 0);
}
// The workspace moe_bwd holds while it runs: dy and the experts' input gradients [rows * top_k,
// dim] each, and one expert's SwiGLU gradients, 3 x [rows, ffn] (an expert takes at most every
// row).
inline int64_t moe_bwd_elems(int64_t rows, int64_t dim, int64_t ffn, int top_k) {
  return 2 * rows * top_k * dim + 3 * rows * ffn;
}
inline uint64_t moe_bwd_bytes(int64_t rows, int64_t dim, int64_t ffn, int top_k,
                              uint64_t (*round)(uint64_t) = nullptr) {
  return moe_counted(moe_bwd_elems(rows, dim, ffn, top_k), round);
}

// moe_fwd's routing read back to the host (tests, inspection): the chosen experts [rows, top_k]
// by descending probability, and their weights.
std::vector<int32_t> moe_routed_experts(const MoeSaved& s);
std::vector<float> moe_routing_weights(const MoeSaved& s);

// out = MoE(x) ([rows, dim], overwritten); s receives what the backward needs. x and out lie in
// the backend's memory (or on the host for a host backend). The router's logits come to the host
// (rows x n_experts floats: one wait for a device), the routing is made there and goes back as
// s.route; the rows stay in the backend's memory (Backend::gather_rows / combine_rows).
// lora: the layer's LoRA (null: none).
void moe_fwd(Backend& be, const MoeWeights& w, CMatF x, MatF out, MoeSaved& s,
             const MoeLora* lora = nullptr);
// dx += d out / d x applied to dout, given moe_fwd's s and its x. The routing weights' gradient
// (Backend::row_dots) comes to the host with the routing (one wait for a device), the router's
// input gradient goes back through its linear_bwd.
// lora: moe_fwd's (its gradients accumulated).
void moe_bwd(Backend& be, const MoeWeights& w, const MoeSaved& s, CMatF x, CMatF dout, MatF dx,
             const MoeLora* lora = nullptr);

}  // namespace qlft
