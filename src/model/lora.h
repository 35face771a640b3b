// LoRA adapters on the linear projections of a Llama-family model (PEFT semantics).
//
// Per layer and targeted projection: A [r, in] and B [out, r] in fp32 (MemCategory::Adapter)
// and their gradients dA, dB (MemCategory::Gradients). y += scale * dropout(x) A^T B^T with
// scale = alpha / r, or alpha / sqrt(r) with rsLoRA.
// Two variants add tensors to a slot (model/lora_dora.h runs them around the kernels' LoRA):
//  - DoRA (use_dora): a trained magnitude M [out] (and dM); the adapted output row o is scaled
//    by M[o] / ||W_o + scale (B A)_o||.
//  - a frozen start (PiSSA / OLoRA init): A0 [r, in], B0 [out, r], the initial factors, whose
//    product is subtracted again (y -= scale x A0^T B0^T): W x + scale (B A - B0 A0) x, which is
//    PEFT's W_res x + scale B A x without rewriting the shared base.
//
// Fused projections (ArchFamily::fused: phi3's qkv_proj and gate_up_proj, split into q / k / v
// and gate / up on load): PEFT adapts the fused module with ONE A [r, in] and one B over all
// its output rows. Here its parts keep their own slots, B split into the parts' row blocks, and
// the later parts' A and dA are views of the first part's (Q's, Gate's): one A, whose gradient
// is the sum of the parts' (the kernels accumulate into dA), one optimizer parameter.
//
// Row order: B's rows (and dB's) follow the base model's q/k row order, which is the source's
// RoPE convention (ModelShapes::qk_adjacent). PEFT files and the fixtures use Hugging Face
// (rotate-half) order; set_hf / get_hf convert q/k rows so callers never see the difference.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "config/run_spec.h"
#include "model/model.h"
#include "model/moe_lora.h"

namespace qlft {

// An adapter's configuration: the spec's hyperparameters (r, alpha, dropout, use_rslora, use_dora),
// the targeted projections as flags and the init seed.
struct LoraConfig : LoraHyperparams {
  bool targets[kProjCount] = {true, true, true, true, true, true, true};
  // An MoE layer's router (PEFT's "gate" -> gate.weight). On an MoE layer, gate / up / down
  // (Mixtral's w1 / w3 / w2, which set_targets reads as them) adapt the experts: PEFT's
  // experts.gate_up_proj (gate and up together, rank 2r, alpha 2 alpha) and experts.down_proj.
  bool router = false;
  uint64_t init_seed = 0;

  float scale() const;
  // "q_proj,v_proj" -> targets; throws QLFT_ERR_INVALID_ARGUMENT for an unknown name.
  // A fused family's module names count too: qkv_proj = q, k, v; gate_up_proj = gate, up;
  // and PEFT's MoE names: w1 = gate, w3 = up, w2 = down, gate = the router.
  void set_targets(const std::string& list);
  std::string targets_string() const;
};

// A fused family's LoRA modules (fused true): Q, K, V form qkv_proj and Gate, Up gate_up_proj;
// else each projection is its own module. first: the part holding the module's A; parts: its
// projections in output-row order; peft / gguf: the module's name in PEFT's and llama.cpp's keys.
struct LoraModule {
  Proj first;
  std::vector<Proj> parts;
  const char* peft;
  const char* gguf;
};
LoraModule lora_module(bool fused, Proj p);

// From lora.r, lora.alpha, lora.dropout, lora.target_modules, lora.use_rslora and seed
// (lora.init_from is the caller's: its adapter_config.json replaces all but the seed).
LoraConfig lora_config_from(const LoraSpec& s);
// Refuses (QLFT_ERR_INVALID_ARG) what PEFT refuses on m, naming it: the router on a model
// without MoE layers, an MoE layer's gate without up (w1 without w3) or up without gate; the
// adapter and the planner behind `estimate` alike.
void check_lora_targets(const ModelShapes& m, const LoraConfig& cfg);

// Rows of a q or k projection output: rotate-half (HF) order <-> adjacent-pair (GGUF) order,
// for a [n_heads * head_dim, cols] row-major matrix. This is llama.cpp's converter permutation.
void permute_rows_hf_to_adjacent(const float* src, float* dst, int n_heads, int head_dim,
                                 int64_t cols);
void permute_rows_adjacent_to_hf(const float* src, float* dst, int n_heads, int head_dim,
                                 int64_t cols);

struct LoraSlot {
  // Empty when the projection is not targeted. A and B may also be empty for a while on a
  // targeted projection: ZeRO-3 with a sharded adapter (dist/zero3_lora.h) keeps only this
  // rank's tensors and fills the others while their layer is in use.
  Buffer A, B, dA, dB;
  Buffer M, dM;                // DoRA's magnitude [out] and its gradient (empty without use_dora)
  Buffer A0, B0;               // a frozen start (PiSSA / OLoRA), else empty
  int in = 0, out = 0, r = 0;  // r = 0: not targeted
  bool shares_a = false;       // A, dA are views of the fused module's first part's (lora_module)
  bool active() const { return r > 0; }
  bool has_start() const { return !A0.empty(); }
  size_t a_bytes() const { return static_cast<size_t>(r) * in * 4; }
  size_t b_bytes() const { return static_cast<size_t>(out) * r * 4; }
  size_t m_bytes() const { return static_cast<size_t>(out) * 4; }
};

// One MoE layer's expert or router LoRA (PEFT's target_parameters), in model/moe_lora.h's
// layout: A [E r, in], B [E, out, r] expert by expert (the router: E = 1, out n_experts).
enum class MoePart : int { GateUp = 0, Down, Router };
constexpr int kMoePartCount = 3;
const char* moe_part_name(MoePart p);  // PEFT's parameter: "experts.gate_up_proj", ...
struct MoeLoraSlot {
  Buffer A, B, dA, dB;
  int64_t in = 0, out = 0;
  int r = 0, experts = 0;  // r = 0: not targeted
  float scale = 1.f;
  bool active() const { return r > 0; }
  int64_t a_n() const { return int64_t(experts) * r * in; }
  int64_t b_n() const { return int64_t(experts) * out * r; }
};

// Whether cfg adapts projection p of layer l as a module (LoraSlot). On a model with MoE layers
// gate / up / down name the experts' parameters alone, dense layers' included, as PEFT 0.21
// rewrites them into target_parameters (Qwen3-MoE's mlp_only_layers keep their MLP frozen).
bool lora_adapts(const ModelShapes& m, const LoraConfig& cfg, int layer, Proj p);
// Layer l's MoE part p under cfg, without buffers (r 0: not targeted): what the adapter
// allocates and the planner counts.
MoeLoraSlot moe_lora_shape(const ModelShapes& m, const LoraConfig& cfg, int layer, MoePart p);
// Layer l's MoE LoRA ranks under cfg (moe_fwd's saved inputs: moe_saved_bytes).
MoeLoraRanks moe_lora_ranks_of(const ModelShapes& m, const LoraConfig& cfg, int layer);

class LoraAdapter {
 public:
  // Allocates A, B (and, with gradients, dA and dB) for every targeted projection and applies
  // PEFT's init. Without gradients, allocate_gradients makes them later.
  // values false: no A / B yet (allocate_values makes them; ZeRO-3's sharded adapter makes only
  // this rank's, after the partition is known).
  LoraAdapter(MemoryTracker* tracker, const ModelShapes& model, const LoraConfig& cfg,
              bool gradients = true, bool values = true);
  // On an adapter made without values: allocates A and B of every targeted (layer, p) where
  // keep(layer, p, false) / keep(layer, p, true) holds and applies PEFT's init to them (the same
  // values as a whole adapter's: the draws are per tensor and index).
  void allocate_values(const std::function<bool(int layer, Proj p, bool b)>& keep);

  // Allocates (zeroed) dA of every targeted (layer, p) where keep(layer, p, false) holds and dB
  // where keep(layer, p, true) does; the others stay empty (ZeRO-2: this rank keeps only the
  // gradients of the tensors it owns). Only on an adapter made without gradients.
  void allocate_gradients(const std::function<bool(int layer, Proj p, bool b)>& keep);

  const LoraConfig& config() const { return cfg_; }
  const ModelShapes& model_shapes() const { return shapes_; }
  int n_layers() const { return static_cast<int>(slots_.size()); }
  bool targets(Proj p) const { return cfg_.targets[static_cast<int>(p)]; }
  // Whether the model fuses q / k / v and gate / up (ArchFamily::fused), and p's module.
  bool fused() const { return fused_; }
  LoraModule module(Proj p) const { return lora_module(fused_, p); }
  // Host access to a slot's buffers: brings them up to date first when a device holds newer
  // values (set_host_stale); the writable form counts as a host write.
  LoraSlot& slot(int layer, Proj p) {
    refresh();
    ++host_writes_;
    return slots_[layer][static_cast<int>(p)];
  }
  const LoraSlot& slot(int layer, Proj p) const {
    refresh();
    return slots_[layer][static_cast<int>(p)];
  }
  // Whether (layer, p) is targeted; touches no values.
  bool active(int layer, Proj p) const { return slots_[layer][static_cast<int>(p)].active(); }
  // Elements of A and of B of (layer, p); 0 when not targeted.
  int64_t a_size(int layer, Proj p) const {
    return static_cast<int64_t>(slots_[layer][static_cast<int>(p)].a_bytes() / 4);
  }
  int64_t b_size(int layer, Proj p) const {
    return static_cast<int64_t>(slots_[layer][static_cast<int>(p)].b_bytes() / 4);
  }

  // Device training (the CUDA trainer step): the newest A, B, dA and dB live in a runner's
  // device copies and the host buffers are stale until `refresh` has copied them back, which
  // every host access above and below does first. set_host_stale(nullptr) drops the hook.
  void set_host_stale(std::function<void()> refresh) const { refresh_ = std::move(refresh); }
  // Counts host writes through this class (init, set_hf, zero_grad, writable slot or params): a
  // device copy made at one count is current while the count stays the same.
  uint64_t host_writes() const { return host_writes_; }
  // Brings the host buffers up to date (for code holding raw pointers from params()).
  void sync_host() const { refresh(); }

  // PEFT init: A ~ kaiming_uniform(a = sqrt(5)) = U(-1/sqrt(in), 1/sqrt(in)), B = 0, drawn from
  // a counter-based stream of (seed, layer, projection, index): independent of threading.
  void init(uint64_t seed);
  void zero_grad();

  // The kernels' view of one adapter; dropout_seed varies per step and layer.
  LoraRef ref(int layer, Proj p, uint64_t dropout_seed) const;

  // A [r, in], B [out, r] in Hugging Face row order (converted for q/k when the model uses the
  // adjacent convention). Sizes are checked; throws QLFT_ERR_INVALID_ARGUMENT.
  void set_hf(int layer, Proj p, const float* A, int64_t a_n, const float* B, int64_t b_n);
  // Copies of A, B, dA or dB in Hugging Face row order (empty for a gradient this adapter does
  // not hold: allocate_gradients).
  enum class Part { A, B, dA, dB, M, dM, A0, B0 };
  std::vector<float> get_hf(int layer, Proj p, Part part) const;
  // A whole module's A, B (or dA, dB) in HF order as PEFT holds it (module(p).first == p): B's
  // rows are its parts' in order (qkv_proj: q, k, v). For an unfused projection, get_hf.
  std::vector<float> get_module_hf(int layer, Proj first, Part part) const;
  // Sets a module's A [r, in] and B [sum of the parts' out, r] (HF order); as set_hf.
  void set_module_hf(int layer, Proj first, const float* A, int64_t a_n, const float* B,
                     int64_t b_n);
  // DoRA's magnitude [out] in Hugging Face row order (use_dora only).
  void set_magnitude_hf(int layer, Proj p, const float* m, int64_t n);
  // Makes (layer, p) start at A0 = A, B0 = B (HF row order, sizes as set_hf): PiSSA / OLoRA.
  void set_start_hf(int layer, Proj p, const float* A, int64_t a_n, const float* B, int64_t b_n);
  // Whether any slot has a frozen start (set_start_hf).
  bool has_start() const;
  // The adapter as PEFT's converted form writes it (save_pretrained with
  // path_initial_model_for_weight_conversion): rank 2r, A' = [A; A0], B' = [B, -B0], alpha
  // doubled (times sqrt(2) with rsLoRA) so the scale stays; an adapter on the original base.
  // Only for an adapter with a frozen start.
  std::unique_ptr<LoraAdapter> folded_start(MemoryTracker* tracker) const;

  // MoE layers' expert / router LoRA (MoeLoraSlot). has_moe: any is targeted.
  bool has_moe() const;
  bool moe_active(int layer, MoePart p) const {
    return moe_slots_[size_t(layer)][size_t(p)].active();
  }
  const MoeLoraSlot& moe_slot(int layer, MoePart p) const {
    refresh();
    return moe_slots_[size_t(layer)][size_t(p)];
  }
  // Writable host access (counts as a host write, as slot()).
  MoeLoraSlot& moe_slot_rw(int layer, MoePart p) {
    refresh();
    ++host_writes_;
    return moe_slots_[size_t(layer)][size_t(p)];
  }
  // The kernels' view of a layer's expert / router LoRA over the host buffers (gradients: dA,
  // dB too); a part not targeted stays inactive.
  MoeLora moe_lora(int layer, bool gradients) const;
  // A part's A and B (or dA, dB) as PEFT holds them: lora_A [E r, in], lora_B [out, r E] with
  // expert e at columns j E + e (the router: [E, r]); set_moe_peft checks the sizes.
  std::vector<float> get_moe_peft(int layer, MoePart p, bool b, bool grad = false) const;
  void set_moe_peft(int layer, MoePart p, const float* A, int64_t a_n, const float* B, int64_t b_n);

  uint64_t n_params() const;
  // Every trainable tensor and its gradient, in a fixed order (layer, projection, A, B, then M
  // with DoRA; then each layer's MoE parts, A and B).
  struct Param {
    float* w;
    float* g;
    int64_t n;
  };
  std::vector<Param> params();

 private:
  void refresh() const {
    if (!refresh_) return;
    auto f = std::move(refresh_);
    refresh_ = nullptr;  // (the copy reads the buffers through this class)
    try {
      f();
    } catch (...) {
      refresh_ = std::move(f);  // still stale: the next access tries again
      throw;
    }
  }
  // allocate_values (gradients false) / allocate_gradients: every active slot's buffers of that
  // kind where keep says, after checking that no slot has them yet.
  void allocate_where(bool gradients, const std::function<bool(int, Proj, bool)>& keep);
  bool permuted(Proj p) const;
  bool shares_any_a() const;
  // model/lora_moe.cpp: the MoE layers' slots (after the projections'), their PEFT init.
  void make_moe_slots(bool gradients, bool values);
  void init_moe(uint64_t seed);
  int heads_of(Proj p) const;
  // The active slot (layer, p), its sizes checked: A [r, in] and B [out, r], or with A null a
  // magnitude of b_n = out values.
  LoraSlot& checked_slot(int layer, Proj p, const float* A, int64_t a_n, int64_t b_n);
  // dst's rows (of cols values) from src in HF order, permuted into the model's.
  void put_rows_hf(Proj p, const float* src, Buffer& dst, int64_t cols) const;

  LoraConfig cfg_;
  ModelShapes shapes_;
  bool fused_ = false;
  std::vector<std::vector<LoraSlot>> slots_;
  std::vector<std::vector<MoeLoraSlot>> moe_slots_;  // [layer][MoePart]
  MemoryTracker* tracker_;
  mutable std::function<void()> refresh_;
  uint64_t host_writes_ = 0;
};

}  // namespace qlft
