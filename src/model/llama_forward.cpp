// LlamaRunner: one layer's forward, the whole forward with the fused head and cross-entropy,
// logits and evaluation loss.
#include "model/llama.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <optional>
#include <utility>

#include "backend/dropout.h"
#include "core/error.h"
#include "core/half.h"
#include "core/threads.h"
#include "model/checkpoint_offload.h"
#include "model/llama_internal.h"

namespace qlft {

using namespace runner_detail;

void LlamaRunner::layer_fwd(int l, LayerActs& a, const float* x_in, float* x_out, LayerActs* st) {
  const ModelConfig& c = model_.cfg;
  const LayerWeights& L = model_.layers[l];
  const int64_t R = rows_, qd = model_.shapes.q_dim(), kvd = model_.shapes.kv_dim();
  const int32_t* pos = pos_.as<int32_t>();
  CMatF xin(x_in, R, c.dim);
  const DType t16 = act_dtype_;
  // The stored 16-bit copy of a tensor the ops write directly (nullptr: none).
  auto h16 = [st](Buffer& b) { return st ? b.as<uint16_t>() : nullptr; };
  // With st, LoRA's xa is written in 16 bits by its GEMM where the backend keeps it so
  // (Backend::next_xa_16, handed over right before the linear_fwd of projection p).
  const bool xa16 = st && xa16_direct();
  auto xa_to_16 = [&](int p, bool has) {
    if (xa16 && has) be_.next_xa_16(t16, st->xa[p].as<uint16_t>());
  };

  // With st the fp32 norm outputs, the rounded gate / up and the SwiGLU output are not written:
  // the GEMMs take the 16-bit copies (Backend::takes_input_16).
  if (st)
    be_.rmsnorm_fwd_16(xin, frozen(L.attn_norm), c.rms_eps, MatF(nullptr, R, c.dim),
                       a.rstd1.as<float>(), t16, st->xn1.as<uint16_t>());
  else
    be_.rmsnorm_fwd(xin, frozen(L.attn_norm), c.rms_eps, mat(a.xn1, R, c.dim), a.rstd1.as<float>());
  // This layer's sliding window (0: none).
  shape_.window = model_.shapes.layers[static_cast<size_t>(l)].window;
  LoraExtras* ex = extras();  // DoRA / a frozen start after each adapted projection
  if (ex) ex->prepare_layer(l);
  // Per-head q / k norms (qwen3): the projections go to qpre / kpre, their norms into q / k.
  const bool qkn = model_.shapes.qk_norm();
  Buffer* outs[3] = {qkn ? &a.qpre : &a.q, qkn ? &a.kpre : &a.k, &a.v};
  const int64_t widths[3] = {qd, kvd, kvd};
  {
    SharedInput shared(be_, cmat(a.xn1, R, c.dim), t16, st ? h16(st->xn1) : nullptr);
    for (int j = 0; j < 3; ++j) {
      Proj p = static_cast<Proj>(j);
      bool has;
      LoraRef ref = lora_ref(l, p, &has);
      const float* bias = L.bias[j].empty() ? nullptr : frozen(L.bias[j]);
      xa_to_16(j, has);
      if (st && j == 2) {  // v only enters attention's 16-bit operands: written rounded into
                           // the stored layer (its fp32 values unwritten: nothing reads them)
        be_.linear_fwd_to_16(L.proj[j], bias, has ? &ref : nullptr, cmat(a.xn1, R, c.dim),
                             mat(a.v, R, kvd), has ? a.xa[j].as<float>() : nullptr, t16,
                             st->v.as<uint16_t>());
        continue;
      }
      be_.linear_fwd(L.proj[j], bias, has ? &ref : nullptr, cmat(a.xn1, R, c.dim),
                     mat(*outs[j], R, widths[j]), has ? a.xa[j].as<float>() : nullptr);
      if (has && ex) ex->after_fwd(l, p, cmat(a.xn1, R, c.dim), mat(*outs[j], R, widths[j]), bias);
    }
  }
  if (qkn) {  // each head's row of head_dim is one norm row
    const int64_t hd = c.head_dim;
    be_.rmsnorm_fwd(cmat(a.qpre, R * c.n_heads, hd), frozen(L.q_norm), c.rms_eps,
                    mat(a.q, R * c.n_heads, hd), a.rstdq.as<float>());
    be_.rmsnorm_fwd(cmat(a.kpre, R * c.n_kv_heads, hd), frozen(L.k_norm), c.rms_eps,
                    mat(a.k, R * c.n_kv_heads, hd), a.rstdk.as<float>());
  }
  if (st) {  // stored as they are (v by its GEMM above), and attention's GEMMs take them
             // (attention_inputs_16); the fp32 q and k are not rotated (nothing reads them)
    be_.rope_to_16(mat(a.q, R, qd), pos, c.n_heads, c.head_dim, rope_of(l), c.rope_adjacent, t16,
                   st->q.as<uint16_t>());
    be_.rope_to_16(mat(a.k, R, kvd), pos, c.n_kv_heads, c.head_dim, rope_of(l), c.rope_adjacent,
                   t16, st->k.as<uint16_t>());
    be_.attention_inputs_16(t16, st->q.as<uint16_t>(), st->k.as<uint16_t>(), st->v.as<uint16_t>());
  } else {
    be_.rope(mat(a.q, R, qd), pos, c.n_heads, c.head_dim, rope_of(l), c.rope_adjacent, false);
    be_.rope(mat(a.k, R, kvd), pos, c.n_kv_heads, c.head_dim, rope_of(l), c.rope_adjacent, false);
  }
  if (st)  // the output rounded into the stored layer (no fp32 copy: backward reads that one)
    be_.attention_fwd_to_16(shape_, cmat(a.q, R, qd), cmat(a.k, R, kvd), cmat(a.v, R, kvd),
                            mat(a.att, R, qd), a.lse.as<float>(), t16, st->att.as<uint16_t>());
  else
    be_.attention_fwd(shape_, cmat(a.q, R, qd), cmat(a.k, R, kvd), cmat(a.v, R, kvd),
                      mat(a.att, R, qd), a.lse.as<float>());
  // Post-block norms (gemma): the o and down projections write opre / fpre, normalized into
  // x_mid / x_out before the residual adds.
  const bool post = model_.shapes.post_norm();
  {
    SharedInput shared(be_, cmat(a.att, R, qd), t16, st ? h16(st->att) : nullptr);
    bool has;
    LoraRef ref = lora_ref(l, Proj::O, &has);
    const int o = static_cast<int>(Proj::O);
    Buffer& o_out = post ? a.opre : a.x_mid;
    xa_to_16(o, has);
    be_.linear_fwd(L.proj[o], nullptr, has ? &ref : nullptr, cmat(a.att, R, qd),
                   mat(o_out, R, c.dim), has ? a.xa[o].as<float>() : nullptr);
    if (has && ex) ex->after_fwd(l, Proj::O, cmat(a.att, R, qd), mat(o_out, R, c.dim), nullptr);
  }
  if (post)
    be_.rmsnorm_fwd(cmat(a.opre, R, c.dim), frozen(L.post_attn_norm), c.rms_eps,
                    mat(a.x_mid, R, c.dim), a.rstd3.as<float>());
  if (st) {  // the residual add and the norm in one pass
    be_.add_rmsnorm_fwd_16(mat(a.x_mid, R, c.dim), x_in, frozen(L.ffn_norm), c.rms_eps,
                           a.rstd2.as<float>(), t16, st->xn2.as<uint16_t>());
  } else {
    be_.add(a.x_mid.as<float>(), x_in, R * c.dim);
    be_.rmsnorm_fwd(cmat(a.x_mid, R, c.dim), frozen(L.ffn_norm), c.rms_eps, mat(a.xn2, R, c.dim),
                    a.rstd2.as<float>());
  }
  if (model_.shapes.layers[static_cast<size_t>(l)].moe()) {  // the experts (never with st)
    MoeLora ml;
    const bool has_ml = moe_lora_of(l, false, &ml);
    moe_fwd(be_, L.moe, cmat(a.xn2, R, c.dim), MatF(x_out, R, c.dim), moe_saved_[size_t(l)],
            has_ml ? &ml : nullptr);
    be_.add(x_out, a.x_mid.as<float>(), R * c.dim);
    return;
  }
  if (tile_ && !st) {        // the MLP in row tiles (model/llama_mlp_tiles.cpp)
    if (recompute_) return;  // backward's tiles make what it needs
    mlp_fwd_tiles(l, a, x_out);
    be_.add(x_out, a.x_mid.as<float>(), R * c.dim);
    return;
  }
  Buffer* ffn_outs[2] = {&a.gate, &a.up};
  {
    SharedInput shared(be_, cmat(a.xn2, R, c.dim), t16, st ? h16(st->xn2) : nullptr);
    for (int j = 0; j < 2; ++j) {
      const int p = static_cast<int>(Proj::Gate) + j;
      bool has;
      LoraRef ref = lora_ref(l, static_cast<Proj>(p), &has);
      // 16-bit storage keeps gate and up in 16 bits: SwiGLU's forward takes those values too
      // (autocast's matmul outputs), so forward and backward agree. With st they are written
      // rounded into the stored layer (linear_fwd_to_16: by the GEMM itself where it can).
      Buffer* st_out = st ? (j == 0 ? &st->gate : &st->up) : nullptr;
      if (st_out) {
        xa_to_16(p, has);
        be_.linear_fwd_to_16(L.proj[p], nullptr, has ? &ref : nullptr, cmat(a.xn2, R, c.dim),
                             mat(*ffn_outs[j], R, c.ffn_dim), has ? a.xa[p].as<float>() : nullptr,
                             t16, st_out->as<uint16_t>());
        continue;
      }
      be_.linear_fwd(L.proj[p], nullptr, has ? &ref : nullptr, cmat(a.xn2, R, c.dim),
                     mat(*ffn_outs[j], R, c.ffn_dim), has ? a.xa[p].as<float>() : nullptr);
      if (has && ex)
        ex->after_fwd(l, static_cast<Proj>(p), cmat(a.xn2, R, c.dim),
                      mat(*ffn_outs[j], R, c.ffn_dim), nullptr);
      if (act_dtype_ != DType::F32)
        be_.round_16(act_dtype_, ffn_outs[j]->as<float>(), R * c.ffn_dim);
    }
  }
  if (st)
    be_.swiglu_fwd_from_16(t16, st->gate.as<uint16_t>(), st->up.as<uint16_t>(),
                           st->hact.as<uint16_t>(), R, c.ffn_dim);
  else if (c.gemma)  // never with st (direct16)
    be_.geglu_fwd(cmat(a.gate, R, c.ffn_dim), cmat(a.up, R, c.ffn_dim), mat(a.hact, R, c.ffn_dim));
  else
    be_.swiglu_fwd(cmat(a.gate, R, c.ffn_dim), cmat(a.up, R, c.ffn_dim), mat(a.hact, R, c.ffn_dim));
  {
    SharedInput shared(be_, cmat(a.hact, R, c.ffn_dim), t16, st ? h16(st->hact) : nullptr);
    bool has;
    LoraRef ref = lora_ref(l, Proj::Down, &has);
    const int d = static_cast<int>(Proj::Down);
    const MatF d_out = post ? mat(a.fpre, R, c.dim) : MatF(x_out, R, c.dim);
    xa_to_16(d, has);
    be_.linear_fwd(L.proj[d], nullptr, has ? &ref : nullptr, cmat(a.hact, R, c.ffn_dim), d_out,
                   has ? a.xa[d].as<float>() : nullptr);
    if (has && ex) ex->after_fwd(l, Proj::Down, cmat(a.hact, R, c.ffn_dim), d_out, nullptr);
  }
  if (post)
    be_.rmsnorm_fwd(cmat(a.fpre, R, c.dim), frozen(L.post_ffn_norm), c.rms_eps,
                    MatF(x_out, R, c.dim), a.rstd4.as<float>());
  be_.add(x_out, a.x_mid.as<float>(), R * c.dim);
}

LossResult LlamaRunner::run_forward(const TokenBatch& b, bool training, float grad_scale,
                                    MatF logits) {
  const ModelConfig& c = model_.cfg;
  training_ = training;
  have_forward_ = false;
  prepare(b, training);
  if (offload_) offload_->begin_pass();
  lora_to_device();
  lora16_refresh();
  const int64_t R = rows_;
  moe_aux_begin(b);
  // Units in the order they are used (model/weight_stream.h); each one names the next.
  WeightStream* ws = model_.stream.get();
  {
    UnitUse use(ws, kEmbeddingUnit, layer_unit(0));
    float* x0 = x_to_write(0);     // (x_*: the entry's buffer or offload slot, llama.cpp)
    if (ws && ws->rows_sharded())  // host memory (a host backend)
      ws->lookup_rows(tokens_.as<int32_t>(), R, x0);
    else
      be_.embedding_fwd(model_.tok_embd, tokens_.as<int32_t>(), MatF(x0, R, c.dim));
    if (c.gemma) be_.scale(x0, R * c.dim, gemma_embedding_scale(c, act_dtype_));
    x_written(0, training);
  }
  for (int l = 0; l < c.n_layers; ++l) {
    UnitUse use(ws, layer_unit(l), l + 1 < c.n_layers ? layer_unit(l + 1) : head_unit(c.n_layers));
    LayerActs& a = acts_for(l, training);
    float* x_in = x_at(l);
    float* x_out = x_to_write(l + 1);  // may be x_in (checkpoint_offload.h: one fp32 slot), so
                                       // layer_fwd reads x_in for the last time before x_out
    if (!a.half) {
      layer_fwd(l, a, x_in, x_out);
      x_written(l + 1, training);
      continue;
    }
    // 16-bit storage: run in the fp32 scratch (with this layer's own fp32 tensors), then pack.
    LayerActs& s = scratch();
    LendFulls lend(a.fulls(), s.fulls());
    const bool direct = direct16();
    layer_fwd(l, s, x_in, x_out, direct ? &a : nullptr);
    pack(s, a, direct);
    x_written(l + 1, training);
  }
  // Training comes back to the head first in backward (for the final norm).
  UnitUse head_use(ws, head_unit(c.n_layers), training ? head_unit(c.n_layers) : kNoUnit);
  // direct16(): the final norm also writes its output rounded to the activation type, which the
  // head's GEMMs take as it is (Backend::begin_shared_input_16 over the head's calls). It lives
  // in the scratch set's attention-norm buffer: nothing holds that between the last layer's
  // forward and the backward, and the head is done with it before either.
  uint16_t* xnf16 = nullptr;
  if (direct16()) {
    Buffer& room = scratch().xn1;
    if (room.size() >= static_cast<size_t>(R * c.dim) * 2) xnf16 = room.as<uint16_t>();
  }
  if (xnf16)
    be_.rmsnorm_fwd_16(cmat(resid_[c.n_layers], R, c.dim), frozen(model_.output_norm), c.rms_eps,
                       mat(xnf_, R, c.dim), rstdf_.as<float>(), act_dtype_, xnf16);
  else
    be_.rmsnorm_fwd(cmat(resid_[c.n_layers], R, c.dim), frozen(model_.output_norm), c.rms_eps,
                    mat(xnf_, R, c.dim), rstdf_.as<float>());
  std::optional<SharedInput> head_in;
  if (xnf16) head_in.emplace(be_, cmat(xnf_, R, c.dim), act_dtype_, xnf16);
  const bool sliced = ws && ws->rows_sharded();
  if (logits.data && sliced)
    ws->each_head_slice([&](const QWeight& slice, int64_t row0) {
      Buffer part = make(be_, MemCategory::Workspace, R * slice.rows, "logits of a head slice");
      be_.head_logits(slice, cmat(xnf_, R, c.dim), mat(part, R, slice.rows));
      for (int64_t r = 0; r < R; ++r)
        std::copy_n(part.as<float>() + r * slice.rows, slice.rows, logits.row(r) + row0);
    });
  else if (logits.data)
    be_.head_logits(model_.head(), cmat(xnf_, R, c.dim), logits);
  if (logits.data && c.final_softcap > 0) be_.softcap(logits, c.final_softcap);

  LossResult res;
  if (!b.targets) return res;
  int64_t count = 0;
  for (int64_t r = 0; r < R; ++r) count += b.targets[r] != kIgnoreIndex;
  const int32_t* tg = targets_.as<int32_t>();
  MatF dh;
  if (training) {
    zero(dxnf_);
    dh = mat(dxnf_, R, c.dim);
    if (grad_scale == 0.f) grad_scale = count ? 1.f / static_cast<float>(count) : 0.f;
  }
  int64_t got = 0;
  if (c.final_softcap > 0) {  // gemma2: the two-walk loss over capped logits
    if (seq_obj_ || sliced)
      throw_error(QLFT_ERR_UNSUPPORTED,
                  "final logit soft-capping (%s) is not implemented for preference objectives "
                  "or a row-sharded ZeRO-3 head",
                  c.arch.c_str());
    res.loss_sum =
        be_.linear_cross_entropy_capped(model_.head(), cmat(xnf_, R, c.dim), tg, kIgnoreIndex,
                                        grad_scale, c.final_softcap, dh, &got);
  } else if (seq_obj_) {
    if (sliced)
      throw_error(QLFT_ERR_UNSUPPORTED,
                  "preference objectives need the whole head (not a row-sharded ZeRO-3 head)");
    res.loss_sum = seq_cross_entropy(tg, training, dh, &got);
  } else if (sliced)
    res.loss_sum = cross_entropy_by_slices(*ws, tg, grad_scale, dh, &got);
  else
    res.loss_sum = be_.linear_cross_entropy(model_.head(), cmat(xnf_, R, c.dim), tg, kIgnoreIndex,
                                            grad_scale, dh, &got);
  res.count = got;
  if (training && moe_aux_coef_ > 0.f) {
    if (seq_obj_)
      throw_error(QLFT_ERR_UNSUPPORTED,
                  "the MoE load-balancing loss (moe.aux_loss) is not implemented for preference "
                  "objectives; set moe.aux_loss=off");
    res.moe_aux = moe_aux_end(grad_scale, got);
    res.loss_sum += res.moe_aux * static_cast<double>(got);
  }
  have_forward_ = training;
  return res;
}

void LlamaRunner::set_moe_aux_loss(float coef) {
  QLFT_CHECK_ARG(coef >= 0.f && std::isfinite(coef),
                 "moe.aux_loss_coef must be a finite number >= 0, not %g", double(coef));
  QLFT_CHECK_ARG(coef == 0.f || model_.shapes.any_moe(),
                 "moe.aux_loss: the model (%s) has no mixture-of-experts layers",
                 model_.cfg.arch.c_str());
  moe_aux_coef_ = coef;
}

void LlamaRunner::moe_aux_begin(const TokenBatch& b) {
  moe_row_weight_.clear();
  if (b.attention_mask)
    for (int64_t r = 0; r < b.rows(); ++r)
      moe_row_weight_.push_back(b.attention_mask[r] ? 1.f : 0.f);
  for (MoeSaved& s : moe_saved_) {
    s.aux.row_weight = moe_row_weight_.empty() ? nullptr : moe_row_weight_.data();
    s.aux.dprob.clear();  // set again by moe_aux_end when this forward trains with the loss
  }
}

double LlamaRunner::moe_aux_end(float grad_scale, int64_t count) {
  std::vector<MoeSaved*> layers;
  for (int l = 0; l < model_.cfg.n_layers; ++l)
    if (model_.shapes.layers[size_t(l)].moe()) layers.push_back(&moe_saved_[size_t(l)]);
  const double coef = moe_aux_coef_;
  return coef * moe_aux_loss(layers, coef * double(grad_scale) * double(count));
}

double LlamaRunner::seq_cross_entropy(const int32_t* targets, bool training, MatF dh,
                                      int64_t* count) {
  // Each batch row (one sequence) is its own call of the fused head + cross-entropy: first
  // without dh to measure every row, then, training, again with the row's own gradient scale
  // (the objective needs all rows' sums before any scale is known). Twice the head's work.
  const int64_t S = shape_.seq, D = model_.cfg.dim;
  const int B = shape_.batch;
  const float* h = xnf_.as<float>();
  Buffer aux;
  const int32_t* aux_tg = nullptr;
  if (seq_obj_->aux_targets) {
    for (int64_t r = 0; r < rows_; ++r) {
      const int32_t v = seq_obj_->aux_targets[r];
      QLFT_CHECK_ARG(v == kIgnoreIndex || (v >= 0 && v < model_.cfg.vocab),
                     "aux target %d at row %lld is outside the vocabulary", v,
                     static_cast<long long>(r));
    }
    aux = be_.alloc(MemCategory::Activations, rows_ * 4, "aux targets", BufferInit::Uninit);
    aux.copy_from_host(seq_obj_->aux_targets, rows_ * 4);
    aux_tg = aux.as<int32_t>();
  }
  auto rows_ce = [&](const int32_t* tg, std::vector<LossResult>& out) {
    out.assign(static_cast<size_t>(B), LossResult{});
    for (int i = 0; i < B; ++i)
      out[i].loss_sum =
          be_.linear_cross_entropy(model_.head(), CMatF(h + i * S * D, S, D), tg + i * S,
                                   kIgnoreIndex, 0.f, MatF(), &out[i].count);
  };
  rows_ce(targets, seq_main_);
  if (aux_tg)
    rows_ce(aux_tg, seq_aux_);
  else
    seq_aux_.clear();
  double sum = 0;
  *count = 0;
  for (const LossResult& r : seq_main_) sum += r.loss_sum, *count += r.count;
  if (!training) return sum;
  std::vector<float> ms(static_cast<size_t>(B), 0.f), as(static_cast<size_t>(B), 0.f);
  seq_obj_->weigh(seq_main_, seq_aux_, ms, as);
  int64_t ignored = 0;
  for (int i = 0; i < B; ++i) {
    const CMatF hi(h + i * S * D, S, D);
    const MatF dhi(dh.data + i * S * D, S, D);
    if (ms[i] != 0.f)
      be_.linear_cross_entropy(model_.head(), hi, targets + i * S, kIgnoreIndex, ms[i], dhi,
                               &ignored);
    if (aux_tg && as[i] != 0.f)
      be_.linear_cross_entropy(model_.head(), hi, aux_tg + i * S, kIgnoreIndex, as[i], dhi,
                               &ignored);
  }
  return sum;
}

double LlamaRunner::cross_entropy_by_slices(WeightStream& ws, const int32_t* targets,
                                            float grad_scale, MatF dh, int64_t* count) {
  // The head's rows come a slice at a time (a row-sharded ZeRO-3 head): both passes walk them,
  // the per-row state of pass 1 and the log-sum-exp of every row held between them.
  const int64_t R = rows_, V = model_.cfg.vocab;
  const CMatF h = cmat(xnf_, R, model_.cfg.dim);
  Buffer state(be_.tracker(), MemCategory::Workspace, size_t(R) * sizeof(CrossEntropyRow),
               "cross-entropy row stats");
  Buffer lse(be_.tracker(), MemCategory::Workspace, size_t(R) * 4, "cross-entropy row lse");
  auto* st = state.as<CrossEntropyRow>();
  std::fill(st, st + R, CrossEntropyRow{});
  if (dh.data && be_.cross_entropy_walks() == 1) {
    // One walk: pass 1 and the dh accumulators together (Backend::cross_entropy_walk).
    Buffer acc(be_.tracker(), MemCategory::Workspace, size_t(R * h.cols) * 4,
               "cross-entropy dh accumulators");
    ws.each_head_slice([&](const QWeight& slice, int64_t row0) {
      be_.cross_entropy_walk(slice, row0, V, h, targets, kIgnoreIndex, grad_scale, st,
                             acc.as<float>(), dh);
    });
    cross_entropy_walk_end(st, targets, kIgnoreIndex, grad_scale, acc.as<float>(), dh);
    return cross_entropy_finish(st, targets, R, kIgnoreIndex, lse.as<float>(), count);
  }
  ws.each_head_slice([&](const QWeight& slice, int64_t row0) {
    be_.cross_entropy_stats(slice, row0, V, h, targets, kIgnoreIndex, st);
  });
  const double loss = cross_entropy_finish(st, targets, R, kIgnoreIndex, lse.as<float>(), count);
  if (dh.data)
    ws.each_head_slice([&](const QWeight& slice, int64_t row0) {
      be_.cross_entropy_grad(slice, row0, V, h, targets, kIgnoreIndex, lse.as<float>(), grad_scale,
                             dh);
    });
  return loss;
}

LossResult LlamaRunner::forward(const TokenBatch& b, float grad_scale, uint64_t dropout_seed) {
  QLFT_CHECK_ARG(b.targets, "forward for training needs targets");
  QLFT_CHECK_ARG(lora_on_, "forward for training with the adapter switched off");
  dropout_seed_ = dropout_seed;
  be_.tracker()->set_phase("forward");
  return run_forward(b, true, grad_scale, MatF());
}

LossResult LlamaRunner::logits(const TokenBatch& b, MatF out) {
  QLFT_CHECK_ARG(out.data && out.rows == b.rows() && out.cols == model_.cfg.vocab,
                 "logits: output must be [%lld, %d]", static_cast<long long>(b.rows()),
                 model_.cfg.vocab);
  return run_forward(b, false, 0.f, out);
}

LossResult LlamaRunner::eval_loss(const TokenBatch& b) {
  QLFT_CHECK_ARG(b.targets, "eval_loss needs targets");
  return run_forward(b, false, 0.f, MatF());
}

}  // namespace qlft
