// The Llama-family forward and explicit backward pass (llama, mistral, qwen2) with LoRA,
// written once against the Backend interface.
//
// Per layer: rmsnorm -> q/k/v (LoRA, qwen2 biases) -> RoPE (the source's row convention) ->
// causal GQA attention -> o_proj -> residual -> rmsnorm -> gate/up -> SwiGLU -> down -> residual.
// Then the final norm and a fused linear + cross-entropy: loss = mean over targets != -100.
// Gemma 2 (ModelConfig::gemma) adds: embeddings times sqrt(dim), a norm on the attention and on
// the MLP output before each residual add, GeGLU instead of SwiGLU, the scores' own scale and
// soft-cap (AttnShape), and the final logits soft-capped (Backend::softcap and
// linear_cross_entropy_capped); its (1 + w) norms are held as 1 + w from load.
//
// Backward produces gradients for the LoRA A and B only (accumulated, so micro-batches add up);
// base weights are frozen and the embedding gets no gradient.
//
// Activation memory: a layer either stores everything its backward needs (MemCategory::
// Activations), or, when checkpointed, stores only its input and recomputes its forward into a
// shared scratch set during backward (same dropout masks: they are functions of a seed).
// With 16-bit activation storage (set_activation_dtype, train.precision bf16 / fp16, as torch
// autocast keeps them) a stored layer keeps the matmul inputs and outputs (norm outputs, q, k,
// v, attention output, gate, up, SwiGLU output, LoRA xa) in bf16 / f16 and only the residual
// x_mid and the norm / softmax statistics in fp32: the kernels still see fp32, since each layer
// is computed in the fp32 scratch set and packed after its forward, and unpacked into the
// scratch before its backward.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
#include "model/lora.h"
#include "model/lora_extras.h"
#include "model/lora_grad_sink.h"
#include "model/model.h"

namespace qlft {

class CheckpointOffload;

constexpr int32_t kIgnoreIndex = -100;

// Refuses (QLFT_ERR_UNSUPPORTED) a Gemma model (ModelConfig::gemma, soft-caps) on a backend
// without Gemma's ops (Backend::gemma_ops), naming the backend and what it lacks; the runner and
// generation ask it before computing anything.
void require_gemma_ops(const ModelConfig& c, const Backend& be);
// Gemma's embedding multiplier sqrt(dim), rounded to the activations' dtype t as transformers
// casts its normalizer to the embeddings' dtype (fp32: sqrt(dim) itself).
float gemma_embedding_scale(const ModelConfig& c, DType t);

// How train.precision stores the activations backward keeps: DType::F32, DType::BF16 or
// DType::F16. The trainer and the memory planner both ask here.
DType activation_dtype(Precision precision);

// A batch of token rows: row = b * seq + t.
struct TokenBatch {
  int batch = 1, seq = 0;
  const int32_t* tokens = nullptr;     // [batch * seq]
  const int32_t* targets = nullptr;    // [batch * seq] next-token ids or kIgnoreIndex; may be
                                       // nullptr for logits only
  const int32_t* positions = nullptr;  // optional RoPE positions (packing); default t
  const int32_t* doc_ids = nullptr;    // optional document ids: attention stays inside a doc
  // optional, host [batch * seq]: 0 marks a padding slot, as transformers' attention_mask; only
  // the MoE load-balancing loss reads it (it weighs real tokens only); attention is doc_ids'
  const uint8_t* attention_mask = nullptr;
  int64_t rows() const { return static_cast<int64_t>(batch) * seq; }
};

struct LossResult {
  double loss_sum = 0;  // sum of token cross-entropies over counted targets
  int64_t count = 0;    // targets != kIgnoreIndex
  // A training forward with the MoE load-balancing loss (LlamaRunner::set_moe_aux_loss): coef x
  // that loss, in loss_sum as count x it (the step's token mean of it weighs each forward by its
  // trained tokens, as the cross-entropy's), and trained with it.
  double moe_aux = 0;
  double mean() const { return count ? loss_sum / static_cast<double>(count) : 0.0; }
};

// What a LlamaRunner allocates for a batch of `rows` token rows, in bytes as the tracker counts
// them (each buffer rounded up to 64). The memory planner (train/planner.h) predicts from these
// and the runner allocates with the same element counts, so the two cannot drift.
struct RunnerFootprint {
  uint64_t layer_acts = 0;      // one layer's fp32 activation set (the shared scratch; a stored
                                // layer with fp32 storage)
  uint64_t layer_store = 0;     // one stored layer (layer_acts, or less with 16-bit storage)
  bool scratch_always = false;  // 16-bit storage: stored layers run in the scratch set too
  uint64_t stream = 0;          // residual stream, final norm, positions, targets, doc ids, and
                                // d(final norm) when training (activations)
  uint64_t backward_ws = 0;     // backward temporaries with buffers of their own, held through
                                // backward() (workspace; the others live in dead tensors)
  uint64_t recompute_ws = 0;    // a checkpointed layer's recomputed output (workspace; 0: it is
                                // written into a dead tensor)
  // Every mixture-of-experts layer's routing and gathered expert rows (moe_saved_bytes), kept
  // for each such layer whether it is checkpointed or not (the backend's memory).
  uint64_t moe_saved = 0;

  // Activations of a training step with `stored` layers keeping their activations and `ckpt`
  // checkpointed ones.
  uint64_t activations(int stored, int ckpt) const {
    const bool scratch = ckpt > 0 || (scratch_always && stored > 0);
    return stream + static_cast<uint64_t>(stored) * layer_store + (scratch ? layer_acts : 0) +
           moe_saved;
  }
};

// A loss over whole sequences (the preference objectives, train/preference.h): with one set
// (LlamaRunner::set_seq_objective) every forward with targets also measures each batch row's
// token cross-entropy alone (LlamaRunner::seq_losses: row i's sum and count), and a training
// forward gives row i's summed cross-entropy the gradient scale weigh() returns for it in
// place of the one grad_scale: the objective's d loss / d (row i's sum), known only once every
// row's sum is. aux_targets (optional, [rows], host): a second target set over the same rows,
// measured (aux_losses) and weighed likewise (ORPO's NLL also trains the prompt tokens).
struct SeqObjective {
  const int32_t* aux_targets = nullptr;
  std::function<void(const std::vector<LossResult>& main, const std::vector<LossResult>& aux,
                     std::vector<float>& main_scale, std::vector<float>& aux_scale)>
      weigh;
};

// The MLP row tile a batch of `rows` runs with under a tile setting of `tile` rows
// (LlamaRunner::set_mlp_tile_rows; 0: whole): tiles only when every layer is checkpointed (their
// MLP tensors live in the one scratch set and backward recomputes them tile by tile), the batch
// is longer than one tile, and the model has no norm after the MLP (gemma's post-norm reads the
// whole down output first). The runner and the memory planner both ask here.
inline int64_t mlp_tile_for(const ModelShapes& s, int64_t tile, int64_t rows,
                            bool every_layer_checkpointed) {
  return tile > 0 && tile < rows && every_layer_checkpointed && !s.post_norm() ? tile : 0;
}

// train.mlp_tile_rows as rows: the setting itself, or for auto (-1) the rows whose [rows x
// intermediate] fp32 tensor is 256 MiB (the CUDA cross-entropy's logits chunk, cuda_sizes.h), at
// least 256. The trainer and the memory planner both ask here.
inline int64_t mlp_tile_rows_of(const ModelShapes& s, int64_t setting) {
  if (setting >= 0) return setting;
  const int64_t per_row = 4 * std::max<int64_t>(1, s.ffn_dim);
  return std::max<int64_t>(256, (int64_t(256) << 20) / per_row);
}

class LlamaRunner {
 public:
  // lora_projs: LoRA-targeted projections per layer, each keeping rows x lora_r of xa.
  // acts: the activation storage type (activation_dtype(precision)).
  // round: the bytes the backend's allocator holds for a buffer of n bytes (already rounded to
  // 64 as Buffer does); nullptr: host memory (64-byte rounding only).
  // mlp_tile: the MLP row tile (mlp_tile_for; 0: whole).
  // lora: the adapter's configuration where it adapts MoE layers (their saved LoRA inputs).
  static RunnerFootprint footprint(const ModelShapes& c, int lora_r, int lora_projs, int64_t rows,
                                   bool training, bool doc_ids, DType acts,
                                   uint64_t (*round)(uint64_t) = nullptr, int64_t mlp_tile = 0,
                                   const LoraConfig* lora = nullptr);

  // lora may be nullptr (base model only). Neither model nor lora is owned.
  LlamaRunner(const Model& model, Backend& backend, LoraAdapter* lora);
  ~LlamaRunner();
  LlamaRunner(const LlamaRunner&) = delete;
  LlamaRunner& operator=(const LlamaRunner&) = delete;

  // Gradient checkpointing per layer (true: keep only the layer input, recompute in backward).
  void set_checkpoint(int layer, bool on);
  void set_checkpoint_all(bool on);
  bool checkpointed(int layer) const { return ckpt_[layer]; }
  // Offloaded checkpoints (model/checkpoint_offload.h): a checkpointed layer's saved input goes
  // to pinned host memory during forward and comes back one layer ahead in backward; the
  // backend's memory keeps CheckpointOffload::slots() entries instead of one per such layer.
  void set_offload_checkpoints(bool on);
  bool offload_checkpoints() const { return offload_on_; }

  // Storage type of the activations stored layers keep for backward: DType::F32 (default),
  // BF16 or F16. With a 16-bit type, the gate and up projection outputs are rounded to it in
  // every forward (as autocast's matmul outputs are), and every layer's backward, checkpointed
  // or not, sees the 16-bit values of the stored tensors. Frees the stored activations.
  void set_activation_dtype(DType t);
  DType activation_dtype() const { return act_dtype_; }

  // The MLP tiled along the sequence (model/llama_mlp_tiles.cpp, train.mlp_tile_rows): with
  // every layer checkpointed and a batch of more than `rows` rows, gate / up -> SwiGLU -> down
  // run over row tiles of `rows` in forward, and backward recomputes each tile's gate, up and
  // activation before its backward, so no [rows x intermediate] tensor is whole. The LoRA
  // gradients add up over the tiles; the losses and gradients are those of the whole MLP. 0 (the
  // default): whole. Not with DoRA / a frozen start or a gradient sink (ZeRO-2): whole there.
  void set_mlp_tile_rows(int64_t rows);
  // The tile the last batch ran with (0: whole).
  int64_t mlp_tile() const { return tile_; }

  // Mixture-of-experts models: every training forward adds coef x transformers'
  // load_balancing_loss_func over its MoE layers (model/moe.h moe_aux_loss; rows as
  // TokenBatch::attention_mask weighs them) to the loss (LossResult::moe_aux) and its gradient;
  // 0 (the default): none. Not with a SeqObjective.
  void set_moe_aux_loss(float coef);
  float moe_aux_loss_coef() const { return moe_aux_coef_; }

  // Training forward: runs the model, keeps what backward() needs, and returns the loss sum
  // and count. grad_scale multiplies d(loss_sum) in backward; 0 means 1 / count (the gradient
  // of this batch's mean loss). dropout_seed selects the LoRA dropout masks of this step.
  LossResult forward(const TokenBatch& b, float grad_scale = 0.f, uint64_t dropout_seed = 0);
  // Accumulates LoRA gradients (adds into LoraAdapter dA/dB) for the last forward().
  void backward();

  // Inference forward without LoRA dropout: logits [rows, vocab] into out, and the loss if
  // b.targets is set (returned; count 0 otherwise). Keeps nothing for backward.
  LossResult logits(const TokenBatch& b, MatF out);
  // Loss only (no logits materialized), inference mode.
  LossResult eval_loss(const TokenBatch& b);

  // Frees the stored activations and scratch (they are re-made on the next call).
  void release();

  // Diagnostic for train.on_nonfinite=stop: reruns the training forward and backward of b with
  // every layer's activations kept, and names the first tensor in computation order that holds
  // a NaN or inf (e.g. "layer 3 mlp down_proj output (forward)"); "" when all are finite.
  // Overwrites the LoRA gradients and frees the activations: use it on a discarded step only.
  std::string locate_nonfinite(const TokenBatch& b, float grad_scale, uint64_t dropout_seed);

  // Preference objectives: the per-sequence losses above (nullptr: the token-mean loss; not
  // owned), and the adapter switched off (false: forward runs the frozen base alone, the
  // reference policy; inference forwards only).
  void set_seq_objective(const SeqObjective* obj) { seq_obj_ = obj; }
  const std::vector<LossResult>& seq_losses() const { return seq_main_; }
  const std::vector<LossResult>& aux_losses() const { return seq_aux_; }
  void set_lora_enabled(bool on) { lora_on_ = on; }

  const Model& model() const { return model_; }
  Backend& backend() { return be_; }
  LoraAdapter* lora() { return lora_; }

  // Device backends: keep the adapter in device memory between steps (the device optimizer
  // updates it there). The device copy becomes the newest one: it is copied in again only after
  // host writes (LoraAdapter::host_writes), gradients stay on the device, and the adapter's host
  // buffers are refreshed from it when read (LoraAdapter::set_host_stale). Off (the default):
  // A and B are copied in at every forward and the gradients added into the host ones after
  // every backward.
  void keep_lora_on_device();
  // The device copies (n floats each, A and B of every targeted projection back to back in
  // (layer, projection) order); nullptr without a device backend.
  float* lora_device_weights() { return lora_w_.empty() ? nullptr : lora_w_.as<float>(); }
  float* lora_device_grads() { return lora_g_.empty() ? nullptr : lora_g_.as<float>(); }
  int64_t lora_device_count() const { return static_cast<int64_t>(lora_w_.size() / 4); }
  // The bf16 copy of the device copy (LoraRef::A16 / B16, what the LoRA GEMMs read), kept where
  // the backend keeps LoRA in bf16 (takes_xa_16 at precision bf16), else nullptr. Whoever
  // writes lora_device_weights() on the device says so after (the trainer, after its optimizer
  // step and gathers): wrote16 when the same kernels wrote this copy too (the device AdamW),
  // else the next forward converts it again. Host writes reach both through the upload.
  uint16_t* lora_device_weights16() {
    return lora_w16_.empty() ? nullptr : lora_w16_.as<uint16_t>();
  }
  void lora_device_written(bool wrote16) { lora16_current_ = wrote16 && !lora_w16_.empty(); }
  // Zeroes the LoRA gradients where they accumulate (the device copy or the adapter).
  void zero_lora_grads();

  // Host backends: backward puts each projection's LoRA gradients where sink says
  // (model/lora_grad_sink.h) instead of the adapter's dA / dB; nullptr (the default) restores
  // the adapter. Not owned. ZeRO-2's sharded gradients (dist/zero2_grads.h) use it.
  void set_grad_sink(LoraGradSink* sink);
  LoraGradSink* grad_sink() const { return sink_; }

 private:
  struct LayerActs;
  struct Grads;

  void prepare(const TokenBatch& b, bool training);
  // The residual stream's entry i (layer i's input; n_layers: the last layer's output) where it
  // lives now: its buffer, or its offload slot. x_to_write: before the entry is written;
  // x_written: after (a training pass copies an offloaded one out); x_restored: in backward,
  // an offloaded one back in its slot (llama.cpp).
  float* x_at(int i);
  float* x_to_write(int i);
  void x_written(int i, bool training);
  float* x_restored(int i);
  LayerActs& acts_for(int layer, bool store);
  LayerActs& scratch();
  // st: the stored 16-bit layer whose GEMM inputs and gate / up the ops write directly (and
  // the backward reads directly) when the backend takes_input_16 (direct16()); else nullptr.
  void layer_fwd(int l, LayerActs& a, const float* x_in, float* x_out, LayerActs* st = nullptr);
  bool direct16() const;
  // direct16() with LoRA's xa kept in 16 bits by the backend's GEMMs (Backend::next_xa_16).
  bool xa16_direct() const;
  // lora_w16_ made current (converted from lora_w_) where it is kept and stale.
  void lora16_refresh();
  void pack(LayerActs& from, LayerActs& to, bool direct = false);
  void unpack(LayerActs& from, LayerActs& to, bool direct = false);
  void round_stored(LayerActs& a);
  void layer_bwd(int l, LayerActs& a, const float* x_in, bool need_dx, LayerActs* st = nullptr);
  // Whether backward() runs layer l on its stored 16-bit layer (layer_bwd's st).
  bool bwd_direct(int l) const;
  // The tiled MLP (tile_ > 0, model/llama_mlp_tiles.cpp): forward from a.xn2 into x_out (before
  // the residual add), and backward from d_down (d of the down projection's output) into
  // d(xn2) in dxn, its LoRA gradients through lin_bwd(p, x, dy, dx, row0).
  using TileLinBwd = std::function<void(Proj, CMatF, CMatF, MatF, int64_t)>;
  void mlp_fwd_tiles(int l, LayerActs& a, float* x_out);
  void mlp_bwd_tiles(int l, LayerActs& a, CMatF d_down, Buffer& dxn, const TileLinBwd& lin_bwd);
  // One tile's forward: rows [r0, r0 + n) of a.xn2 through gate / up (xa written), the
  // activation, and down into out ([n, dim]).
  void mlp_tile_fwd(int l, LayerActs& a, int64_t r0, int64_t n, float* out);
  int64_t engaged_tile(int64_t rows) const;
  LossResult run_forward(const TokenBatch& b, bool training, float grad_scale, MatF logits);
  // The MoE layers' row weights set before the layers (TokenBatch::attention_mask), and their
  // load-balancing loss after them with its gradient at grad_scale x count (coef x the loss).
  void moe_aux_begin(const TokenBatch& b);
  double moe_aux_end(float grad_scale, int64_t count);
  // The fused cross-entropy (Backend::linear_cross_entropy) over a head ws hands out in row
  // slices (WeightStream::rows_sharded). Host memory.
  // The loss and gradient of the head per batch row (a SeqObjective); the loss sum.
  double seq_cross_entropy(const int32_t* targets, bool training, MatF dh, int64_t* count);
  double cross_entropy_by_slices(WeightStream& ws, const int32_t* targets, float grad_scale,
                                 MatF dh, int64_t* count);
  LoraRef lora_ref(int l, Proj p, bool* has) const;
  // Layer l's expert / router LoRA for moe_fwd / moe_bwd over the adapter's host buffers, or
  // on a device backend over the device copy (moe_off_) (gradients: where backward
  // accumulates); false when it has none or the adapter is off. Refused with a gradient sink
  // (ZeRO-2 sharded gradients), which does not carry them.
  bool moe_lora_of(int l, bool gradients, MoeLora* out) const;
  // DoRA / a frozen start around the kernels' LoRA of (l, p) (model/lora_extras.h): nullptr
  // when the adapter has neither, or while it is switched off (set_lora_enabled(false)).
  LoraExtras* extras() const { return extras_ && lora_on_ ? extras_.get() : nullptr; }
  // A frozen fp32 vector of the model (norm weight, bias) where the backend computes: the host
  // array itself, or its device copy (made once per runner).
  const float* frozen(const Buffer& host);
  // Device backends: the adapter's A and B copied into device memory at each forward (one copy),
  // its gradients accumulated there and added into the adapter's dA / dB after each backward
  // (one copy). Host backends use the adapter's buffers directly.
  void lora_to_device();
  void lora_grads_to_host();
  void lora_device_to_host();  // keep_lora_on_device: the adapter's host refresh
  // f(slot, {A's offset, B's offset}) for every targeted projection, in device-copy order.
  template <class F>
  void each_lora_slot(const F& f);
  template <class F>
  void each_moe_slot(const F& f);  // (layer, part) of every adapted MoE part with moe_off_

  const Model& model_;
  Backend& be_;
  LoraAdapter* lora_;
  std::vector<bool> ckpt_;
  DType act_dtype_ = DType::F32;
  int64_t mlp_tile_rows_ = 0;  // set_mlp_tile_rows
  int64_t tile_ = 0;           // the tile the scratch set and Grads are made for (0: whole)
  bool recompute_ = false;     // backward's recompute of a checkpointed layer (its tiles skipped)

  // Shape of the current batch.
  int64_t rows_ = 0;
  AttnShape shape_;
  Buffer pos_, docs_, targets_, tokens_;
  std::vector<int32_t> pos_host_;  // what pos_ holds
  RopeFreqs rope_;                 // the batch's RoPE table: rope_freqs(cfg, largest position + 1)
  RopeFreqs rope_local_;           // the sliding layers' own (ModelConfig::rope_local_theta)
  // Layer l's RoPE table: rope_local_ on a sliding layer of a model with its own local base.
  const RopeFreqs& rope_of(int l) const {
    return model_.cfg.rope_local_theta > 0 && model_.shapes.layers[size_t(l)].window > 0
               ? rope_local_
               : rope_;
  }
  std::unordered_map<const void*, Buffer> frozen_;
  Buffer lora_w_, lora_g_;  // device copies of every A and B, and of every dA and dB
  bool lora_resident_ = false;
  uint64_t lora_copied_at_ = ~0ull;  // LoraAdapter::host_writes() when lora_w_ was copied in
  Buffer lora_w16_;                  // lora_w_ in bf16 (lora_device_weights16)
  bool lora16_current_ = false;      // lora_w16_ holds lora_w_'s values rounded
  std::vector<std::array<int64_t, 2>> lora_off_;  // per layer * kProjCount + p: A's offset, B's
  // The MoE layers' expert / router factors after the projections' in lora_w_ / lora_g_: per
  // layer * kMoePartCount + part, A's offset and B's (-1: not adapted).
  std::vector<std::array<int64_t, 2>> moe_off_;
  std::vector<Buffer> resid_;  // [n_layers + 1] residual stream, rows x dim each (an offloaded
                               // entry's is empty: it lives in offload_)
  bool offload_on_ = false;
  std::unique_ptr<CheckpointOffload> offload_;
  std::vector<bool> offload_layout_;  // the entries offload_ was made for
  std::vector<std::unique_ptr<LayerActs>> stored_;
  std::unique_ptr<LayerActs> scratch_;
  // Per layer, what an MoE layer's forward keeps for its backward (model/moe.h; the backend's
  // memory, rewritten by a checkpointed layer's recomputation); empty for dense layers.
  std::vector<MoeSaved> moe_saved_;
  float moe_aux_coef_ = 0.f;           // set_moe_aux_loss
  std::vector<float> moe_row_weight_;  // the batch's attention mask as MoeSaved::aux's weights
  Buffer xnf_, rstdf_, dxnf_;          // final norm output, its rstd, and d(loss)/d(xnf)
  std::unique_ptr<Grads> grads_;
  LoraGradSink* sink_ = nullptr;
  std::unique_ptr<LoraExtras> extras_;
  const SeqObjective* seq_obj_ = nullptr;
  std::vector<LossResult> seq_main_, seq_aux_;
  bool lora_on_ = true;
  bool have_forward_ = false;
  bool training_ = false;
  uint64_t dropout_seed_ = 0;
};

}  // namespace qlft
