#include "model/llama.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <utility>

#include "backend/dropout.h"
#include "core/error.h"
#include "core/half.h"
#include "core/threads.h"

#include "model/checkpoint_offload.h"
#include "model/llama_internal.h"

namespace qlft {

using namespace runner_detail;

DType activation_dtype(Precision precision) {
  switch (precision) {
    case Precision::BF16:
      return DType::BF16;
    case Precision::FP16:
      return DType::F16;
    case Precision::FP32:
      break;
  }
  return DType::F32;
}

RunnerFootprint LlamaRunner::footprint(const ModelShapes& c, int lora_r, int lora_projs,
                                       int64_t rows, bool training, bool doc_ids, DType acts,
                                       uint64_t (*round)(uint64_t), int64_t mlp_tile,
                                       const LoraConfig* lora) {
  const int64_t R = rows;
  // A device allocator rounds each buffer further (size classes): per buffer, not per total.
  auto counted = [round](int64_t n, int64_t bytes = sizeof(float)) {
    const uint64_t b = runner_detail::counted(n, bytes);
    return round ? round(b) : b;
  };
  const int64_t es = acts == DType::F32 ? 4 : 2;  // bytes of a 16-bit-storable element
  RunnerFootprint f;
  // With MLP tiles every layer is checkpointed: no layer is stored, the scratch set is tiled.
  const std::array<int64_t, kLayerActs> n = layer_act_counts(c, R, mlp_tile);
  for (size_t i = 0; i < n.size(); ++i) {
    if (!n[i]) continue;  // not made for this model
    f.layer_acts += counted(n[i]);
    f.layer_store += counted(n[i], kActFp32[i] ? 4 : es);
  }
  f.layer_acts += static_cast<uint64_t>(lora_projs) * counted(R * lora_r);
  f.layer_store += static_cast<uint64_t>(lora_projs) * counted(R * lora_r, es);
  f.scratch_always = acts != DType::F32;
  // As prepare() allocates: tokens, positions, targets (and doc ids) of 4-byte ints, the
  // residual stream, the final norm output and rstd, and its gradient when training.
  f.stream = 3 * counted(R) + (doc_ids ? counted(R) : 0) +
             static_cast<uint64_t>(c.n_layers + 1) * counted(R * c.dim) + counted(R * c.dim) +
             counted(R) + (training ? counted(R * c.dim) : 0);
  // The backward temporaries with buffers of their own (the others live in dead tensors, and a
  // checkpointed layer's recomputed output in one of those: grads_owned).
  const std::array<int64_t, 9> g = grad_counts(c, R, mlp_tile);
  const std::array<bool, 9> owned = grads_owned(c);
  for (size_t i = 0; i < g.size(); ++i)
    if (owned[i]) f.backward_ws += counted(g[i]);
  if (mlp_tile > 0) f.backward_ws += counted(mlp_tile * c.dim);  // mlp_bwd_tiles' down output
  f.recompute_ws = 0;
  // Each MoE layer's saved routing and expert rows; its backward's workspace (one layer's at a
  // time) counted with the backward temporaries.
  uint64_t moe_ws = 0;
  for (int l = 0; l < c.n_layers; ++l)
    if (const LayerShapes& ls = c.layers[size_t(l)]; ls.moe()) {
      f.moe_saved += moe_saved_bytes(R, ls.norm, ls.expert_ffn, ls.n_experts, ls.top_k, round,
                                     lora ? moe_lora_ranks_of(c, *lora, l) : MoeLoraRanks{});
      if (training)
        moe_ws = std::max(moe_ws, moe_bwd_bytes(R, ls.norm, ls.expert_ffn, ls.top_k, round));
    }
  f.backward_ws += moe_ws;
  return f;
}

void require_gemma_ops(const ModelConfig& c, const Backend& be) {
  if ((c.gemma || c.attn_softcap > 0 || c.final_softcap > 0) && !be.gemma_ops())
    throw_error(QLFT_ERR_UNSUPPORTED,
                "%s (Gemma) is not supported on backend %s: it lacks soft-capping in its "
                "attention kernels and fused cross-entropy, GeGLU and the scores' "
                "query_pre_attn_scalar scale (use backend=cpu)",
                c.arch.c_str(), be.name());
}

float gemma_embedding_scale(const ModelConfig& c, DType t) {
  const float s = std::sqrt(static_cast<float>(c.dim));
  float r = s;
  if (t != DType::F32) round_through_n(t, &s, &r, 1);
  return r;
}

LlamaRunner::LlamaRunner(const Model& model, Backend& backend, LoraAdapter* lora)
    : model_(model), be_(backend), lora_(lora), ckpt_(model.cfg.n_layers, false) {
  require_gemma_ops(model.cfg, backend);
  // Mixture-of-experts layers run on any backend (model/moe.cpp: the routing on the host, the
  // rows in the backend's memory through its gather / combine ops).
  moe_saved_.resize(model.shapes.any_moe() ? size_t(model.cfg.n_layers) : 0);
  if (lora) {
    QLFT_CHECK_ARG(lora->model_shapes() == model.shapes,
                   "the LoRA adapter was made for a model of another shape");
    if (lora->config().use_dora || lora->has_start()) {
      QLFT_CHECK_ARG(!model.stream,
                     "DoRA and a PiSSA / OLoRA start need the base weights resident (not "
                     "streamed: ZeRO-3, offload.params)");
      extras_ = std::make_unique<LoraExtras>(backend, model, *lora);
    }
  }
}

LlamaRunner::~LlamaRunner() = default;

void LlamaRunner::set_checkpoint(int layer, bool on) {
  QLFT_CHECK_ARG(layer >= 0 && layer < model_.cfg.n_layers, "layer %d is out of range", layer);
  ckpt_[layer] = on;
  stored_.clear();
  have_forward_ = false;
}
void LlamaRunner::set_checkpoint_all(bool on) {
  for (int l = 0; l < model_.cfg.n_layers; ++l) ckpt_[l] = on;
  stored_.clear();
  have_forward_ = false;
}

void LlamaRunner::set_mlp_tile_rows(int64_t rows) {
  QLFT_CHECK_ARG(rows >= 0,
                 "train.mlp_tile_rows must be 0 (whole) or a positive row count, not %lld",
                 static_cast<long long>(rows));
  mlp_tile_rows_ = rows;
  have_forward_ = false;
}

int64_t LlamaRunner::engaged_tile(int64_t rows) const {
  // The tiles' backward calls a projection's LoRA backward once per tile: a gradient sink wants
  // one begin / end per projection, and DoRA / a frozen start act on whole outputs.
  const bool all = std::find(ckpt_.begin(), ckpt_.end(), false) == ckpt_.end();
  return sink_ || extras_ ? 0 : mlp_tile_for(model_.shapes, mlp_tile_rows_, rows, all);
}

void LlamaRunner::set_offload_checkpoints(bool on) {
  offload_on_ = on;
  have_forward_ = false;  // prepare() makes the residual stream again for the new layout
}

void LlamaRunner::set_activation_dtype(DType t) {
  QLFT_CHECK_ARG(t == DType::F32 || t == DType::BF16 || t == DType::F16,
                 "activations are stored as F32, BF16 or F16, not %s", dtype_name(t));
  act_dtype_ = t;
  stored_.clear();
  if (offload_) {  // its host copies' type follows the storage type
    offload_.reset();
    resid_.clear();
  }
  have_forward_ = false;
}

void LlamaRunner::release() {
  offload_.reset();
  offload_layout_.clear();
  stored_.clear();
  scratch_.reset();
  grads_.reset();
  resid_.clear();
  xnf_.reset();
  rstdf_.reset();
  dxnf_.reset();
  pos_.reset();
  docs_.reset();
  targets_.reset();
  tokens_.reset();
  pos_host_.clear();
  rows_ = 0;
  have_forward_ = false;
}

LlamaRunner::LayerActs& LlamaRunner::acts_for(int layer, bool store) {
  const ModelConfig& c = model_.cfg;
  std::unique_ptr<LayerActs>* slot;
  const bool stored = store && !ckpt_[layer];
  if (stored) {
    if (stored_.size() != static_cast<size_t>(c.n_layers)) stored_.resize(c.n_layers);
    slot = &stored_[layer];
  } else {
    slot = &scratch_;
  }
  if (*slot) return **slot;
  const MemCategory A = MemCategory::Activations;
  const int64_t R = rows_;
  // The scratch set's gate / up / activation hold one MLP tile (stored layers: no tiles).
  const std::array<int64_t, kLayerActs> n = layer_act_counts(model_.shapes, R, stored ? 0 : tile_);
  auto a = std::make_unique<LayerActs>();
  // A stored layer under 16-bit storage keeps its halves() in 2 bytes an element; the fp32
  // scratch set holds every layer while it runs.
  a->half = stored && act_dtype_ != DType::F32;
  const size_t es = a->half ? 2 : 4;
  auto make16 = [&](int64_t count, const char* what) {
    return be_.alloc(A, static_cast<size_t>(count) * es, what, BufferInit::Uninit);
  };
  a->xn1 = make16(n[0], "attn norm out");
  a->rstd1 = make(be_, A, n[1], "attn norm rstd");
  a->q = make16(n[2], "q");
  a->k = make16(n[3], "k");
  a->v = make16(n[4], "v");
  a->att = make16(n[5], "attention out");
  a->lse = make(be_, A, n[6], "attention lse");
  a->x_mid = make(be_, A, n[7], "residual mid");
  a->xn2 = make16(n[8], "ffn norm out");
  a->rstd2 = make(be_, A, n[9], "ffn norm rstd");
  a->gate = make16(n[10], "gate");
  a->up = make16(n[11], "up");
  a->hact = make16(n[12], "swiglu out");
  if (n[13]) {  // per-head q / k norms: their inputs and statistics, fp32 in every layer
    a->qpre = make(be_, A, n[13], "q before its norm");
    a->kpre = make(be_, A, n[14], "k before its norm");
    a->rstdq = make(be_, A, n[15], "q norm rstd");
    a->rstdk = make(be_, A, n[16], "k norm rstd");
  }
  if (n[17]) {  // post-block norms (gemma): their inputs and statistics, fp32 in every layer
    a->opre = make(be_, A, n[17], "o_proj out before its norm");
    a->rstd3 = make(be_, A, n[18], "post-attention norm rstd");
    a->fpre = make(be_, A, n[19], "down_proj out before its norm");
    a->rstd4 = make(be_, A, n[20], "post-feedforward norm rstd");
  }
  if (lora_)
    for (int p = 0; p < kProjCount; ++p)
      if (lora_->active(layer, static_cast<Proj>(p)))
        a->xa[p] = make16(R * lora_->config().r, "lora xa");
  *slot = std::move(a);
  return **slot;
}

LlamaRunner::LayerActs& LlamaRunner::scratch() {
  // Any layer index gives the same scratch shape (the LoRA targets are the same in every layer).
  return acts_for(0, false);
}

// halves() written by layer_fwd itself when direct16(): all but the LoRA xa; and those
// layer_bwd reads in 16 bits (GEMM inputs, attention_inputs_16, attention_out_16,
// swiglu_bwd_16): all but xa. The xa too where xa16_direct() (Backend::next_xa_16).
constexpr bool kHalfWrittenDirect[9] = {true, true, true, true, true, true, true, true, true};
constexpr bool kHalfReadDirect[9] = {true, true, true, true, true, true, true, true, true};

bool LlamaRunner::xa16_direct() const {
  return direct16() && be_.takes_xa_16(act_dtype_);
}

bool LlamaRunner::direct16() const {
  // LoRA dropout reads the fp32 input (its scaled values round differently). The q / k norms'
  // backward reads fp32 dq / dk, which the direct path's attention_bwd_16 does not write.
  // DoRA and a frozen start rescale / add to the fp32 projection outputs (lora_extras.h).
  return act_dtype_ != DType::F32 && be_.takes_input_16(act_dtype_) &&
         !(lora_ && training_ && lora_->config().dropout > 0.f) && !model_.shapes.qk_norm() &&
         !extras() && !model_.cfg.gemma &&  // GeGLU has no 16-bit forms
         !model_.shapes.any_moe();          // nor the experts (model/moe.cpp, fp32)
}

namespace {
// Calls f(fp32, stored, n) for each pair of halves() (w of the fp32 set, h of the stored layer)
// that pack / unpack convert: those the stored layer has (n 16-bit values), less, where skip is
// given, the first 9 it marks.
// skip_xa: the LoRA xa too (the backend writes and reads them in 16 bits: xa16_direct()).
template <class Halves, class F>
void each_converted_half(const Halves& w, const Halves& h, const bool* skip, bool skip_xa, F f) {
  for (size_t i = 0; i < h.size(); ++i)
    if (!h[i]->empty() && !(skip && i < 9 && skip[i]) && !(skip_xa && i >= 9))
      f(*w[i], *h[i], static_cast<int64_t>(h[i]->size() / 2));
}
}  // namespace

void LlamaRunner::pack(LayerActs& from, LayerActs& to, bool direct) {
  each_converted_half(from.halves(), to.halves(), direct ? kHalfWrittenDirect : nullptr,
                      direct && xa16_direct(), [&](Buffer& w, Buffer& h, int64_t n) {
                        be_.to_16(act_dtype_, w.as<float>(), h.as<uint16_t>(), n);
                      });
}

void LlamaRunner::unpack(LayerActs& from, LayerActs& to, bool direct) {
  each_converted_half(to.halves(), from.halves(), direct ? kHalfReadDirect : nullptr,
                      direct && xa16_direct(), [&](Buffer& w, Buffer& h, int64_t n) {
                        be_.from_16(act_dtype_, h.as<uint16_t>(), w.as<float>(), n);
                      });
}

// A checkpointed layer recomputed into the scratch: the same 16-bit values a stored layer's
// backward would unpack, so checkpointing does not change the arithmetic.
// With MLP tiles the tiles' backward makes and rounds the MLP's (xn2 after each tile's gate / up
// from the unrounded values; the tile's activation and the gate / up / down LoRA inputs).
void LlamaRunner::round_stored(LayerActs& a) {
  for (Buffer* b : a.halves()) {
    if (tile_ &&
        (b == &a.xn2 || b == &a.gate || b == &a.up || b == &a.hact || b == &a.xa[int(Proj::Gate)] ||
         b == &a.xa[int(Proj::Up)] || b == &a.xa[int(Proj::Down)]))
      continue;
    if (!b->empty()) be_.round_16(act_dtype_, b->as<float>(), static_cast<int64_t>(b->size() / 4));
  }
}

void LlamaRunner::prepare(const TokenBatch& b, bool training) {
  const ModelConfig& c = model_.cfg;
  QLFT_CHECK_ARG(b.batch > 0 && b.seq > 0 && b.tokens, "empty token batch (%d x %d)", b.batch,
                 b.seq);
  const int64_t R = b.rows();
  if (R != rows_) {
    release();
    rows_ = R;
  }
  recompute_ = false;                                   // (a backward that threw mid-recompute)
  if (const int64_t t = engaged_tile(R); t != tile_) {  // the MLP-sized buffers change size
    scratch_.reset();
    grads_.reset();
    tile_ = t;
  }
  // The batch is checked here, on the host (a device backend cannot check what it never sees),
  // and copied into the backend's memory: tokens and targets every time, positions when they
  // change (the same for every batch of one shape unless packing supplies them).
  const MemCategory A = MemCategory::Activations;
  if (pos_.empty()) {
    pos_ = be_.alloc(A, R * 4, "positions", BufferInit::Uninit);
    targets_ = be_.alloc(A, R * 4, "targets", BufferInit::Uninit);
    tokens_ = be_.alloc(A, R * 4, "tokens", BufferInit::Uninit);
  }
  for (int64_t r = 0; r < R; ++r)
    QLFT_CHECK_ARG(b.tokens[r] >= 0 && b.tokens[r] < c.vocab,
                   "token id %d at position %lld is outside the vocabulary of %d tokens",
                   b.tokens[r], static_cast<long long>(r), c.vocab);
  tokens_.copy_from_host(b.tokens, R * 4);
  std::vector<int32_t> pos(static_cast<size_t>(R));
  int32_t max_pos = 0;
  for (int64_t r = 0; r < R; ++r) {
    int32_t p = b.positions ? b.positions[r] : static_cast<int32_t>(r % b.seq);
    QLFT_CHECK_ARG(p >= 0, "position %d of row %lld is negative", p, static_cast<long long>(r));
    pos[static_cast<size_t>(r)] = p;
    max_pos = std::max(max_pos, p);
  }
  // As transformers: dynamic NTK takes its length from max(position_ids) + 1 of the batch.
  rope_ = rope_freqs(c, int64_t(max_pos) + 1);
  if (pos != pos_host_) {
    pos_.copy_from_host(pos.data(), R * 4);
    pos_host_ = std::move(pos);
  }
  if (b.doc_ids) {
    if (docs_.empty()) docs_ = be_.alloc(A, R * 4, "doc ids", BufferInit::Uninit);
    docs_.copy_from_host(b.doc_ids, R * 4);
  }
  if (c.rope_local_theta > 0) rope_local_ = RopeFreqs::plain(c.rope_local_theta, c.head_dim);
  if (b.targets) {
    for (int64_t r = 0; r < R; ++r) {
      int32_t v = b.targets[r];
      QLFT_CHECK_ARG(v == kIgnoreIndex || (v >= 0 && v < c.vocab),
                     "target %d at row %lld is outside the vocabulary (0..%d) and not %d", v,
                     static_cast<long long>(r), c.vocab - 1, kIgnoreIndex);
    }
    targets_.copy_from_host(b.targets, R * 4);
  }
  shape_.batch = b.batch;
  shape_.seq = b.seq;
  static_cast<HeadGeometry&>(shape_) = model_.shapes;
  shape_.doc_ids = b.doc_ids ? docs_.as<int32_t>() : nullptr;
  shape_.softcap = c.attn_softcap;  // gemma2's, with its scale of the scores
  shape_.scale = c.attn_scalar > 0 ? 1.f / std::sqrt(c.attn_scalar) : 0.f;
  // Offloaded checkpoints: the inputs of the checkpointed layers (model/checkpoint_offload.h).
  std::vector<bool> off;
  if (offload_on_ && std::find(ckpt_.begin(), ckpt_.end(), true) != ckpt_.end()) off = ckpt_;
  if (!resid_.empty() && off != offload_layout_) {
    offload_.reset();
    resid_.clear();
  }
  if (resid_.empty()) {
    resid_.resize(c.n_layers + 1);
    for (size_t i = 0; i < resid_.size(); ++i)
      if (i >= off.size() || !off[i]) resid_[i] = make(be_, A, R * c.dim, "residual");
    if (!off.empty())
      offload_ = std::make_unique<CheckpointOffload>(be_, off, R * c.dim, act_dtype_);
    offload_layout_ = off;
    xnf_ = make(be_, A, R * c.dim, "final norm out");
    rstdf_ = make(be_, A, R, "final norm rstd");
  }
  if (training && dxnf_.empty()) dxnf_ = make(be_, A, R * c.dim, "d final norm");
}

float* LlamaRunner::x_at(int i) {
  return offload_ && offload_->offloaded(i) ? offload_->at(i) : resid_[size_t(i)].as<float>();
}
float* LlamaRunner::x_to_write(int i) {
  if (offload_ && offload_->offloaded(i)) offload_->will_write(i);
  return x_at(i);
}
void LlamaRunner::x_written(int i, bool training) {
  if (training && offload_ && offload_->offloaded(i)) offload_->save(i);
}
float* LlamaRunner::x_restored(int i) {
  if (offload_ && offload_->offloaded(i)) offload_->restore(i);
  return x_at(i);
}

const float* LlamaRunner::frozen(const Buffer& host) {
  if (!be_.device_memory() || host.empty() || host.on_device()) return host.as<float>();
  // Keyed by the model's Buffer (one per norm / bias). Streamed weights (ZeRO-3 over MPI, NVMe
  // offload) get new bytes, possibly at a freed unit's old address, at every acquire: copied
  // again each time.
  auto it = frozen_.find(&host);
  if (it == frozen_.end() || it->second.size() != host.size()) {
    Buffer d = be_.alloc(MemCategory::Weights, host.size(), "norm weight / bias (device copy)",
                         BufferInit::Uninit);
    d.copy_from_host(host.data(), host.size());
    it = frozen_.insert_or_assign(&host, std::move(d)).first;
  } else if (model_.stream) {
    it->second.copy_from_host(host.data(), host.size());
  }
  return it->second.as<float>();
}

}  // namespace qlft
