// LlamaRunner: one layer's backward (recomputing checkpointed layers), the whole backward,
// and the diagnosis of a non-finite loss or gradient.
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
#include "model/llama_internal.h"

namespace qlft {

using namespace runner_detail;

namespace {
// direct16(): the residual gradient's 16-bit copy, the dy of the down / o projections'
// linear_bwd (next_dy_16), written by the norm's backward just before (rmsnorm_bwd_16). It
// lives in dgate's room (nullptr where that is too small), dead from the gate / up
// projections' backward to the next layer's SwiGLU backward: both windows (ffn norm -> o;
// attention or final norm -> the next layer's down) fall in there.
uint16_t* residual16_room(Buffer& dgate, int64_t n) {
  return dgate.size() >= static_cast<size_t>(n) * 2 ? dgate.as<uint16_t>() : nullptr;
}
}  // namespace

bool LlamaRunner::bwd_direct(int l) const {
  return direct16() && !ckpt_[static_cast<size_t>(l)] && stored_[static_cast<size_t>(l)] &&
         stored_[static_cast<size_t>(l)]->half;
}

void LlamaRunner::layer_bwd(int l, LayerActs& a, const float* x_in, bool need_dx, LayerActs* st) {
  const ModelConfig& c = model_.cfg;
  const LayerWeights& L = model_.layers[l];
  const int64_t R = rows_, qd = model_.shapes.q_dim(), kvd = model_.shapes.kv_dim();
  Grads& g = *grads_;
  {  // dq, dk, dv in this layer's xn2 and x_mid, dead by the time they are written
    const std::array<bool, 9> owned = grads_owned(model_.shapes);
    const size_t qb = size_t(R * qd) * 4, kb = size_t(R * kvd) * 4;
    if (!owned[3]) g.dq = Buffer::view_of(a.xn2, 0, qb);
    if (!owned[4]) g.dk = Buffer::view_of(a.x_mid, 0, kb);
    if (!owned[5]) g.dv = Buffer::view_of(a.x_mid, kb, kb);
  }
  const int32_t* pos = pos_.as<int32_t>();
  MatF G = mat(g.G, R, c.dim);
  // G's 16-bit copy (residual16_room), written by the norm backward before each linear_bwd
  // that takes G as its dy: this layer's down (the layer above's attention norm or the final
  // norm, where it ran bwd_direct(l)) and o (the ffn norm).
  uint16_t* const G16 = residual16_room(g.dgate, R * c.dim);
  const View2<uint16_t> G16v(st ? G16 : nullptr, R, c.dim, c.dim);
  // This layer's sliding window (0: none).
  shape_.window = model_.shapes.layers[static_cast<size_t>(l)].window;

  // dy16: dy's bf16 copy for the backend (Backend::next_dy_16), handed over right before the
  // linear_bwd that takes it.
  // row0: x's first row in the batch (an MLP tile's; xa and the dropout mask from there).
  auto lin_bwd = [&](Proj p, CMatF x, CMatF dy, MatF dx, View2<uint16_t> dy16 = {},
                     int64_t row0 = 0) {
    const int pi = static_cast<int>(p);
    bool has;
    LoraRef ref = lora_ref(l, p, &has);
    ref.dropout_row0 = row0;
    float *dA = nullptr, *dB = nullptr;
    if (has && sink_) {  // (host backends only: set_grad_sink)
      const LoraGradTarget t = sink_->begin(l, p);
      dA = t.dA;
      dB = t.dB;
    } else if (has && !lora_g_.empty()) {  // the device copies (see lora_grads_to_host)
      const std::array<int64_t, 2>& o = lora_off_[static_cast<size_t>(l * kProjCount + pi)];
      dA = lora_g_.as<float>() + o[0];
      dB = lora_g_.as<float>() + o[1];
    } else if (has) {
      dA = lora_->slot(l, p).dA.as<float>();
      dB = lora_->slot(l, p).dB.as<float>();
    }
    // DoRA hands the kernels c * dy (and adds dM); a frozen start adds its dx term after.
    LoraExtras* ex = has ? extras() : nullptr;
    const CMatF dy_k =
        ex ? ex->before_bwd(l, p, &ref, x, dy, lora_->slot(l, p).dM.as<float>()) : dy;
    if (dy16.data) be_.next_dy_16(act_dtype_, dy16);
    if (has && st && xa16_direct()) be_.next_xa_16(act_dtype_, st->xa[pi].as<uint16_t>());
    be_.linear_bwd(L.proj[pi], has ? &ref : nullptr, x,
                   has ? a.xa[pi].as<float>() + row0 * ref.r : nullptr, dy_k, dx, dA, dB);
    if (ex) ex->after_bwd(l, p, dy, dx);
    if (has && sink_) sink_->end(l, p);
  };

  // The projections' backward runs in kBackwardProjOrder (model/lora_grad_sink.h).
  // FFN branch: G is d(loss)/d(x_out) = d/d(x_mid) through the residual, plus the branch.
  const DType t16 = act_dtype_;
  auto h16 = [st](Buffer& b) -> const uint16_t* { return st ? b.as<uint16_t>() : nullptr; };
  // The first linear_bwd into each dx buffer may overwrite it instead (Backend::defer_zero).
  auto zero_dx = [&](Buffer& b, int64_t n) {
    if (!be_.defer_zero(b.as<float>(), n)) zero(b);
  };
  // Post-block norms (gemma): the dy of a branch's output projection is d(pre), G through the
  // norm after the branch, written into dxn (free until that branch's input projections' dx);
  // without them it is G itself (the residual's).
  const bool post = model_.shapes.post_norm();
  auto post_norm_bwd = [&](const Buffer& pre, const Buffer& norm, const Buffer& rstd) -> CMatF {
    if (!post) return G.as_const();
    zero(g.dxn);
    be_.rmsnorm_bwd(cmat(pre, R, c.dim), frozen(norm), rstd.as<float>(), G.as_const(),
                    mat(g.dxn, R, c.dim));
    return cmat(g.dxn, R, c.dim);
  };
  const CMatF d_down = post_norm_bwd(a.fpre, L.post_ffn_norm, a.rstd4);
  // A mixture-of-experts layer (never with st): its backward into dxn instead of the MLP's.
  const bool moe = model_.shapes.layers[static_cast<size_t>(l)].moe();
  if (moe) {
    zero(g.dxn);
    MoeLora ml;
    const bool has_ml = moe_lora_of(l, true, &ml);
    moe_bwd(be_, L.moe, moe_saved_[size_t(l)], cmat(a.xn2, R, c.dim), G.as_const(),
            mat(g.dxn, R, c.dim), has_ml ? &ml : nullptr);
  }
  // With st (direct16()): the gradients that only enter linear_bwd as its dy (dgate, dup, dq,
  // dk, dv) are written in 16 bits into their fp32 buffers' memory (Backend::next_dy_16), at
  // the row stride the backend asks for (it fits: at most twice the columns).
  auto dy16 = [&](Proj p, Buffer& b, int64_t cols) {
    bool has;
    const LoraRef ref = lora_ref(l, p, &has);
    int64_t ld = be_.grad_16_stride(L.proj[static_cast<int>(p)], has ? &ref : nullptr);
    if (ld < cols || ld > 2 * cols) ld = cols;
    return View2<uint16_t>(b.as<uint16_t>(), R, cols, ld);
  };
  auto lin_bwd16 = [&](Proj p, CMatF x, View2<uint16_t> d16, Buffer& dfp, MatF dx) {
    lin_bwd(p, x, cmat(dfp, R, d16.cols), dx, st ? d16 : View2<uint16_t>());
  };
  const bool tiled = tile_ && !st && !moe;  // the MLP in row tiles (model/llama_mlp_tiles.cpp)
  if (tiled)
    mlp_bwd_tiles(l, a, d_down, g.dxn, [&](Proj p, CMatF x, CMatF dy, MatF dx, int64_t row0) {
      lin_bwd(p, x, dy, dx, View2<uint16_t>(), row0);
    });
  if (!tiled && !moe) {
    zero_dx(g.dh, R * c.ffn_dim);
    {
      SharedInput shared(be_, cmat(a.hact, R, c.ffn_dim), t16, st ? h16(st->hact) : nullptr);
      lin_bwd(Proj::Down, cmat(a.hact, R, c.ffn_dim), d_down, mat(g.dh, R, c.ffn_dim),
              post ? View2<uint16_t>() : G16v);
    }
    View2<uint16_t> dgate16, dup16;
    if (st) {
      dgate16 = dy16(Proj::Gate, g.dgate, c.ffn_dim);
      dup16 = dy16(Proj::Up, g.dup, c.ffn_dim);
      be_.swiglu_bwd_to_16(t16, st->gate.as<uint16_t>(), st->up.as<uint16_t>(),
                           cmat(g.dh, R, c.ffn_dim), dgate16, dup16);
    } else {
      if (c.gemma)  // never with st (direct16)
        be_.geglu_bwd(cmat(a.gate, R, c.ffn_dim), cmat(a.up, R, c.ffn_dim),
                      cmat(g.dh, R, c.ffn_dim), mat(g.dgate, R, c.ffn_dim),
                      mat(g.dup, R, c.ffn_dim));
      else
        be_.swiglu_bwd(cmat(a.gate, R, c.ffn_dim), cmat(a.up, R, c.ffn_dim),
                       cmat(g.dh, R, c.ffn_dim), mat(g.dgate, R, c.ffn_dim),
                       mat(g.dup, R, c.ffn_dim));
      dgate16 = dup16 = View2<uint16_t>(nullptr, R, c.ffn_dim);
    }
    zero_dx(g.dxn, R * c.dim);
    {
      SharedInput shared(be_, cmat(a.xn2, R, c.dim), t16, st ? h16(st->xn2) : nullptr);
      lin_bwd16(Proj::Gate, cmat(a.xn2, R, c.dim), dgate16, g.dgate, mat(g.dxn, R, c.dim));
      lin_bwd16(Proj::Up, cmat(a.xn2, R, c.dim), dup16, g.dup, mat(g.dxn, R, c.dim));
    }
  }
  if (G16v.data && !post)
    be_.rmsnorm_bwd_16(cmat(a.x_mid, R, c.dim), frozen(L.ffn_norm), a.rstd2.as<float>(),
                       cmat(g.dxn, R, c.dim), G, t16, G16);
  else
    be_.rmsnorm_bwd(cmat(a.x_mid, R, c.dim), frozen(L.ffn_norm), a.rstd2.as<float>(),
                    cmat(g.dxn, R, c.dim), G);

  // Attention branch: G is now d/d(x_mid). With st, datt may come rounded into its buffer's
  // memory from the o projection's dx GEMM (Backend::next_dx_16), for attention to take as is.
  const CMatF d_o = post_norm_bwd(a.opre, L.post_attn_norm, a.rstd3);
  zero_dx(g.datt, R * qd);
  const uint16_t* datt16 = nullptr;
  {
    SharedInput shared(be_, cmat(a.att, R, qd), t16, st ? h16(st->att) : nullptr);
    bool has;
    const LoraRef ref = lora_ref(l, Proj::O, &has);
    if (st && be_.next_dx_16(t16, g.datt.as<uint16_t>(), L.proj[static_cast<int>(Proj::O)],
                             has ? &ref : nullptr))
      datt16 = g.datt.as<uint16_t>();
    lin_bwd(Proj::O, cmat(a.att, R, qd), d_o, mat(g.datt, R, qd), post ? View2<uint16_t>() : G16v);
  }
  View2<uint16_t> dq16(nullptr, R, qd), dk16(nullptr, R, kvd), dv16(nullptr, R, kvd);
  if (st) {  // q, k, v and the output are not unpacked: attention reads the stored ones
    be_.attention_inputs_16(t16, st->q.as<uint16_t>(), st->k.as<uint16_t>(), st->v.as<uint16_t>());
    be_.attention_out_16(t16, st->att.as<uint16_t>(), datt16);
    dq16 = dy16(Proj::Q, g.dq, qd);
    dk16 = dy16(Proj::K, g.dk, kvd);
    dv16 = dy16(Proj::V, g.dv, kvd);
    RopeArgs ra;
    ra.pos = pos;
    ra.freqs = &rope_of(l);
    ra.adjacent = c.rope_adjacent;
    be_.attention_bwd_16(shape_, cmat(a.q, R, qd), cmat(a.k, R, kvd), cmat(a.v, R, kvd),
                         cmat(a.att, R, qd), a.lse.as<float>(), cmat(g.datt, R, qd), ra, t16, dq16,
                         dk16, dv16);
  } else {
    zero(g.dq);
    zero(g.dk);
    zero(g.dv);
    be_.attention_bwd(shape_, cmat(a.q, R, qd), cmat(a.k, R, kvd), cmat(a.v, R, kvd),
                      cmat(a.att, R, qd), a.lse.as<float>(), cmat(g.datt, R, qd), mat(g.dq, R, qd),
                      mat(g.dk, R, kvd), mat(g.dv, R, kvd));
    be_.rope(mat(g.dq, R, qd), pos, c.n_heads, c.head_dim, rope_of(l), c.rope_adjacent, true);
    be_.rope(mat(g.dk, R, kvd), pos, c.n_kv_heads, c.head_dim, rope_of(l), c.rope_adjacent, true);
  }
  // Per-head q / k norms (qwen3; never direct16(), so dq / dk are fp32 here): their backward
  // into buffers free by now, datt for q and dq's (wider) room for k.
  Buffer *dqb = &g.dq, *dkb = &g.dk;
  if (model_.shapes.qk_norm()) {
    const int64_t hd = c.head_dim, qr = R * c.n_heads, kr = R * c.n_kv_heads;
    zero(g.datt);
    be_.rmsnorm_bwd(cmat(a.qpre, qr, hd), frozen(L.q_norm), a.rstdq.as<float>(), cmat(g.dq, qr, hd),
                    mat(g.datt, qr, hd));
    dqb = &g.datt;
    zero(g.dq);
    be_.rmsnorm_bwd(cmat(a.kpre, kr, hd), frozen(L.k_norm), a.rstdk.as<float>(), cmat(g.dk, kr, hd),
                    mat(g.dq, kr, hd));
    dkb = &g.dq;
  }
  zero_dx(g.dxn, R * c.dim);
  {
    SharedInput shared(be_, cmat(a.xn1, R, c.dim), t16, st ? h16(st->xn1) : nullptr);
    lin_bwd16(Proj::Q, cmat(a.xn1, R, c.dim), dq16, *dqb, mat(g.dxn, R, c.dim));
    lin_bwd16(Proj::K, cmat(a.xn1, R, c.dim), dk16, *dkb, mat(g.dxn, R, c.dim));
    lin_bwd16(Proj::V, cmat(a.xn1, R, c.dim), dv16, g.dv, mat(g.dxn, R, c.dim));
  }
  if (need_dx && G16 && !post && bwd_direct(l - 1))  // the next layer's down takes it
    be_.rmsnorm_bwd_16(CMatF(x_in, R, c.dim), frozen(L.attn_norm), a.rstd1.as<float>(),
                       cmat(g.dxn, R, c.dim), G, t16, G16);
  else if (need_dx)
    be_.rmsnorm_bwd(CMatF(x_in, R, c.dim), frozen(L.attn_norm), a.rstd1.as<float>(),
                    cmat(g.dxn, R, c.dim), G);
}

void LlamaRunner::backward() {
  QLFT_CHECK_ARG(have_forward_, "backward() needs a training forward() first");
  // Copies in: a backward that threw may have left partial sums (resident ones are zeroed by
  // zero_lora_grads at the step's start).
  if (!lora_resident_ && !lora_g_.empty()) lora_g_.zero();
  be_.tracker()->set_phase("backward");
  const ModelConfig& c = model_.cfg;
  const int64_t R = rows_;
  const std::array<int64_t, 9> n = grad_counts(model_.shapes, R, tile_);
  const std::array<bool, 9> owned = grads_owned(model_.shapes);
  if (!grads_) {
    static const char* const kWhat[9] = {"d residual",   "d norm out", "d attention out",
                                         "dq",           "dk",         "dv",
                                         "d swiglu out", "d gate",     "d up"};
    auto g = std::make_unique<Grads>();
    for (size_t i = 0; i < n.size(); ++i)
      if (owned[i]) g->own[i] = make(be_, MemCategory::Workspace, n[i], kWhat[i]);
    grads_ = std::move(g);
  }
  {  // each temporary where it lives (grads_owned); dq, dk, dv of a dead tensor: per layer
    Grads& g = *grads_;
    Buffer* t[9] = {&g.G, &g.dxn, &g.datt, &g.dq, &g.dk, &g.dv, &g.dh, &g.dgate, &g.dup};
    for (size_t i = 0; i < n.size(); ++i)
      if (owned[i]) *t[i] = Buffer::view_of(g.own[i]);
    g.G = Buffer::view_of(xnf_, 0, size_t(n[0]) * 4);
    g.dxn = Buffer::view_of(dxnf_, 0, size_t(n[1]) * 4);
    if (!owned[2]) g.datt = Buffer::view_of(resid_[size_t(c.n_layers)], 0, size_t(n[2]) * 4);
  }
  zero(grads_->G);
  WeightStream* ws = model_.stream.get();
  {
    UnitUse use(ws, head_unit(c.n_layers), layer_unit(c.n_layers - 1));
    // The last layer's down takes G in 16 bits where it runs on its stored layer (layer_bwd).
    uint16_t* G16 = residual16_room(grads_->dgate, R * c.dim);
    if (G16 && !model_.shapes.post_norm() && bwd_direct(c.n_layers - 1))
      be_.rmsnorm_bwd_16(cmat(resid_[c.n_layers], R, c.dim), frozen(model_.output_norm),
                         rstdf_.as<float>(), cmat(dxnf_, R, c.dim), mat(grads_->G, R, c.dim),
                         act_dtype_, G16);
    else
      be_.rmsnorm_bwd(cmat(resid_[c.n_layers], R, c.dim), frozen(model_.output_norm),
                      rstdf_.as<float>(), cmat(dxnf_, R, c.dim), mat(grads_->G, R, c.dim));
  }
  for (int l = c.n_layers - 1; l >= 0; --l) {
    UnitUse use(ws, layer_unit(l), l > 0 ? layer_unit(l - 1) : kNoUnit);
    const float* x_in = x_restored(l);  // an offloaded input back from the host (llama.cpp)
    if (ckpt_[l]) {
      // Recompute this layer's activations from its saved input (same dropout masks).
      LayerActs& a = acts_for(l, true);
      // Its output is not read: written into dxn (free until layer_bwd; grads_owned).
      recompute_ = true;  // (MLP tiles skipped: mlp_bwd_tiles makes them; prepare resets it)
      layer_fwd(l, a, x_in, grads_->dxn.as<float>());
      recompute_ = false;
      if (act_dtype_ != DType::F32) round_stored(a);
      layer_bwd(l, a, x_in, l > 0);
    } else if (stored_[l]->half) {
      LayerActs& s = scratch();
      LendFulls lend(stored_[l]->fulls(), s.fulls());
      const bool direct = direct16();
      unpack(*stored_[l], s, direct);
      layer_bwd(l, s, x_in, l > 0, direct ? stored_[l].get() : nullptr);
    } else {
      layer_bwd(l, *stored_[l], x_in, l > 0);
    }
  }
  lora_grads_to_host();
  have_forward_ = false;
}

// ---- non-finite diagnosis ----------------------------------------------------------------------

namespace {
bool has_nonfinite(const float* p, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(p[i])) return true;
  return false;
}
// A host copy of a buffer's elements wherever it lives (the diagnosis reads every tensor).
template <class T>
std::vector<T> host_values(const Buffer& b) {
  std::vector<T> v(b.size() / sizeof(T));
  b.copy_to_host(v.data(), v.size() * sizeof(T));
  return v;
}
bool has_nonfinite(const Buffer& b) {
  const std::vector<float> v = host_values<float>(b);
  return has_nonfinite(v.data(), static_cast<int64_t>(v.size()));
}
// A 16-bit buffer: all exponent bits set is inf or NaN.
bool has_nonfinite16(const Buffer& b, DType t) {
  const uint16_t mask = t == DType::BF16 ? 0x7f80 : 0x7c00;
  for (uint16_t x : host_values<uint16_t>(b))
    if ((x & mask) == mask) return true;
  return false;
}
}  // namespace

std::string LlamaRunner::locate_nonfinite(const TokenBatch& b, float grad_scale,
                                          uint64_t dropout_seed) {
  const ModelConfig& c = model_.cfg;
  const std::vector<bool> saved_ckpt = ckpt_;
  auto restore = [&] {
    release();
    ckpt_ = saved_ckpt;
  };
  std::string where;
  try {
    // Every layer stores its activations, so each can be inspected after one plain forward:
    // each tensor is computed from earlier ones, so the first non-finite one in computation
    // order is where the value appeared.
    for (int l = 0; l < c.n_layers; ++l) ckpt_[l] = false;
    stored_.clear();
    zero_lora_grads();
    dropout_seed_ = dropout_seed;
    LossResult res = run_forward(b, true, grad_scale, MatF());
    auto fwd = [&]() -> std::string {
      if (has_nonfinite(resid_[0])) return "token embedding output (forward)";
      for (int l = 0; l < c.n_layers; ++l) {
        LayerActs& a = *stored_[l];
        auto halves = a.halves();
        auto nonfinite = [&](const Buffer* b) {
          const bool half = a.half && std::find(halves.begin(), halves.end(), b) != halves.end();
          return half ? has_nonfinite16(*b, act_dtype_) : has_nonfinite(*b);
        };
        const std::pair<const Buffer*, const char*> order[] = {
            {&a.xn1, "input_layernorm output"},
            {&a.q, "self_attn q_proj output"},
            {&a.k, "self_attn k_proj output"},
            {&a.v, "self_attn v_proj output"},
            {&a.att, "self_attn attention output"},
            {&a.x_mid, "self_attn o_proj output (after the residual add)"},
            {&a.xn2, "post_attention_layernorm output"},
            {&a.gate, "mlp gate_proj output"},
            {&a.up, "mlp up_proj output"},
            {&a.hact, "mlp SwiGLU output"},
            {&resid_[l + 1], "mlp down_proj output (after the residual add)"}};
        for (const auto& [buf, name] : order)
          if (nonfinite(buf)) return strf("layer %d %s (forward)", l, name);
      }
      if (has_nonfinite(xnf_)) return "final norm output (forward)";
      if (!std::isfinite(res.loss_sum)) return "cross-entropy loss of the output head";
      if (has_nonfinite(dxnf_)) return "loss gradient at the output head (backward)";
      return "";
    };
    where = fwd();
    if (where.empty() && lora_) {
      backward();
      // Backward runs from the last layer down and a non-finite gradient spreads to every
      // earlier layer, so the highest layer with one is where it appeared; inside a layer the
      // projections' gradients are computed down, gate, up, o, then q, k, v.
      const Proj order[] = {Proj::Down, Proj::Gate, Proj::Up, Proj::O, Proj::Q, Proj::K, Proj::V};
      for (int l = c.n_layers - 1; l >= 0 && where.empty(); --l)
        for (Proj p : order) {
          const LoraSlot& s = lora_->slot(l, p);
          if (!s.active()) continue;
          const char* group = static_cast<int>(p) < 4 ? "self_attn" : "mlp";
          const char* part = has_nonfinite(s.dB) ? "lora_B" : has_nonfinite(s.dA) ? "lora_A" : "";
          if (*part) {
            where =
                strf("layer %d %s %s %s gradient (backward)", l, group, proj_peft_name(p), part);
            break;
          }
        }
    }
  } catch (...) {
    restore();
    throw;
  }
  restore();
  return where;
}

}  // namespace qlft
