#include "model/generate.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/op_checks.h"
#include "core/error.h"
#include "model/llama.h"

namespace qlft {

namespace {
// n floats in the backend's memory (device memory on a device backend).
Buffer act(const Backend& be, int64_t floats, const char* what) {
  return be.alloc(MemCategory::Activations, static_cast<size_t>(floats) * 4, what);
}
}  // namespace

// A host tensor's copy in the device backend's memory (empty for an empty one).
Buffer Generator::device_copy(const Buffer& host, MemCategory c, const char* what) const {
  if (host.empty()) return Buffer();
  Buffer d = be_.alloc(c, host.size(), what, BufferInit::Uninit);
  d.copy_from_host(host.data(), host.size());
  return d;
}

Generator::Generator(const Model& model, Backend& backend, const LoraAdapter* lora, int max_len)
    : model_(model), be_(backend), lora_(lora) {
  if (model.stream) ws_ = model.stream->rank_local();
  if (!ws_) model.require_resident("generation");
  const ModelConfig& c = model.cfg;
  require_gemma_ops(c, backend);  // so Gemma's norms below are host arrays
  max_len_ = max_len > 0 ? max_len : rope_context_length(c);
  QLFT_CHECK_ARG(max_len_ > 0 && max_len_ <= (1 << 24), "generation length %d is out of range",
                 max_len_);
  if (lora) {
    QLFT_CHECK_ARG(lora->model_shapes() == model.shapes,
                   "the LoRA adapter was made for a model of another shape");
    // DoRA / a PiSSA or OLoRA start around the kernels' LoRA (host backends, resident weights).
    if (lora->config().use_dora || lora->has_start()) {
      QLFT_CHECK_ARG(!ws_, "DoRA and a PiSSA / OLoRA start generate from resident weights");
      extras_ = std::make_unique<LoraExtras>(backend, model, *lora);
    }
  }
  const int64_t kvd = model.shapes.kv_dim();
  for (int l = 0; l < c.n_layers; ++l) {
    kcache_.push_back(act(be_, max_len_ * kvd, "kv cache k"));
    vcache_.push_back(act(be_, max_len_ * kvd, "kv cache v"));
  }
  if (!be_.device_memory()) return;
  // A device backend: the norms, biases and adapter copied once, so a step moves none of them.
  // A streamed model's units get new bytes at every acquire: its norms and biases stay host
  // arrays, which the backend stages per call.
  dev_.resize(static_cast<size_t>(c.n_layers));
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& L = model.layers[static_cast<size_t>(l)];
    LayerCopy& d = dev_[static_cast<size_t>(l)];
    if (!ws_) {
      const MemCategory w = MemCategory::Weights;
      d.attn_norm = device_copy(L.attn_norm, w, "attn norm (generation's device copy)");
      d.ffn_norm = device_copy(L.ffn_norm, w, "ffn norm (generation's device copy)");
      d.q_norm = device_copy(L.q_norm, w, "q norm (generation's device copy)");
      d.k_norm = device_copy(L.k_norm, w, "k norm (generation's device copy)");
      for (int j = 0; j < 3; ++j) d.bias[j] = device_copy(L.bias[j], w, "bias (device copy)");
    }
    for (int p = 0; lora && p < kProjCount; ++p) {
      if (!lora->active(l, static_cast<Proj>(p))) continue;
      const LoraSlot& sl = lora->slot(l, static_cast<Proj>(p));
      d.A[p] = device_copy(sl.A, MemCategory::Adapter, "lora A (generation's device copy)");
      d.B[p] = device_copy(sl.B, MemCategory::Adapter, "lora B (generation's device copy)");
    }
    for (int p = 0; lora && p < kMoePartCount; ++p) {
      if (!lora->moe_active(l, MoePart(p))) continue;
      const MoeLoraSlot& sl = lora->moe_slot(l, MoePart(p));
      d.moe_A[p] = device_copy(sl.A, MemCategory::Adapter, "expert lora A (device copy)");
      d.moe_B[p] = device_copy(sl.B, MemCategory::Adapter, "expert lora B (device copy)");
    }
  }
  if (!ws_) out_norm_ = device_copy(model.output_norm, MemCategory::Weights, "output norm (copy)");
}

Generator::~Generator() = default;

void Generator::ensure_rows(int n) {
  if (n <= rows_cap_) return;
  const ModelConfig& c = model_.cfg;
  const int64_t qd = model_.shapes.q_dim(), kvd = model_.shapes.kv_dim();
  x_ = act(be_, n * c.dim, "decode x");
  xn_ = act(be_, n * c.dim, "decode norm");
  q_ = act(be_, n * qd, "decode q");
  k_ = act(be_, n * kvd, "decode k");
  v_ = act(be_, n * kvd, "decode v");
  att_ = act(be_, n * qd, "decode attention");
  mid_ = act(be_, n * c.dim, "decode mid");
  gate_ = act(be_, n * c.ffn_dim, "decode gate");
  up_ = act(be_, n * c.ffn_dim, "decode up");
  h_ = act(be_, n * c.ffn_dim, "decode swiglu");
  tok_ = be_.alloc(MemCategory::Activations, size_t(n) * 4, "decode token ids");
  pos_ = be_.alloc(MemCategory::Activations, size_t(n) * 4, "decode positions");
  logits_ = act(be_, static_cast<int64_t>(n) * c.vocab, "decode logits");
  rows_cap_ = n;
}

void Generator::feed(const int32_t* tokens, int n, float* logits, bool last_only) {
  run(tokens, n);
  if (!logits) return;
  const int rows = last_only ? 1 : n;
  head(n, rows);
  logits_.copy_to_host(logits, size_t(rows) * size_t(model_.cfg.vocab) * 4);
}

int32_t Generator::feed_greedy(const int32_t* tokens, int n) {
  run(tokens, n);
  head(n, 1);
  return be_.argmax(logits_.as<float>(), model_.cfg.vocab);
}

// logits_ rows [0, rows) = the head over the last `rows` of the n positions just fed.
void Generator::head(int n, int rows) {
  const ModelConfig& c = model_.cfg;
  UnitUse use(ws_.get(), head_unit(c.n_layers), kNoUnit);
  MatF x(x_.as<float>(), n, c.dim), xn(xn_.as<float>(), n, c.dim);
  const float* w = out_norm_.empty() ? model_.output_norm.as<float>() : out_norm_.as<float>();
  be_.rmsnorm_fwd(x.as_const().row_slice(n - rows, rows), w, c.rms_eps, xn.row_slice(0, rows),
                  nullptr);
  be_.head_logits(model_.head(), xn.as_const().row_slice(0, rows),
                  MatF(logits_.as<float>(), rows, c.vocab));
  if (c.final_softcap > 0) be_.softcap(MatF(logits_.as<float>(), rows, c.vocab), c.final_softcap);
}

void Generator::run(const int32_t* tokens, int n) {
  QLFT_CHECK_ARG(n > 0 && tokens, "feed: no tokens");
  QLFT_CHECK_ARG(len_ + n <= max_len_, "context full: %d + %d tokens exceed the limit of %d", len_,
                 n, max_len_);
  const ModelConfig& c = model_.cfg;
  // Checked here: ids in the backend's memory are taken as checked (CudaBackend::embedding_fwd).
  op_checks::token_ids(tokens, n, c.vocab);
  ensure_rows(n);
  const int64_t qd = model_.shapes.q_dim(), kvd = model_.shapes.kv_dim();
  tok_.copy_from_host(tokens, size_t(n) * 4);  // a decode step's one id in
  int32_t* pos = pos_.as<int32_t>();
  be_.positions(pos, n, len_);
  // Keys already cached keep the rotation they were stored with; with dynamic NTK the new rows
  // take this call's length, as transformers' generate does.
  const RopeFreqs rope = rope_freqs(c, int64_t(len_) + n);
  const RopeFreqs rope_local =  // gemma3's sliding layers (LlamaRunner::rope_of)
      c.rope_local_theta > 0 ? RopeFreqs::plain(c.rope_local_theta, c.head_dim) : RopeFreqs();
  MatF x(x_.as<float>(), n, c.dim), xn(xn_.as<float>(), n, c.dim), mid(mid_.as<float>(), n, c.dim);
  MatF q(q_.as<float>(), n, qd), k(k_.as<float>(), n, kvd), v(v_.as<float>(), n, kvd);
  MatF att(att_.as<float>(), n, qd);
  MatF gate(gate_.as<float>(), n, c.ffn_dim), up(up_.as<float>(), n, c.ffn_dim),
      h(h_.as<float>(), n, c.ffn_dim);
  WeightStream* ws = ws_.get();
  {
    UnitUse use(ws, kEmbeddingUnit, layer_unit(0));
    be_.embedding_fwd(model_.tok_embd, tok_.as<int32_t>(), x);
    if (c.gemma) be_.scale(x.data, int64_t(n) * c.dim, gemma_embedding_scale(c, DType::F32));
  }
  // Gemma (LlamaRunner's deltas): the scores' scale and soft-cap, and the post-block norms,
  // whose inputs go to xn (free once q / k / v and gate / up are made).
  const float att_scale = c.attn_scalar > 0 ? 1.f / std::sqrt(c.attn_scalar) : 0.f;
  const bool post = model_.shapes.post_norm();

  for (int l = 0; l < c.n_layers; ++l) {
    UnitUse use(ws, layer_unit(l), l + 1 < c.n_layers ? layer_unit(l + 1) : head_unit(c.n_layers));
    const LayerWeights& L = model_.layers[l];
    const LayerCopy* D = dev_.empty() ? nullptr : &dev_[static_cast<size_t>(l)];
    LoraRef refs[kProjCount];
    const LoraRef* rp[kProjCount] = {};
    for (int p = 0; p < kProjCount; ++p)
      if (lora_ && lora_->active(l, static_cast<Proj>(p))) {
        refs[p] = lora_->ref(l, static_cast<Proj>(p), 0);
        refs[p].dropout_p = 0.f;
        if (D && !D->A[p].empty()) {  // the device copies: no adapter bytes move per step
          refs[p].A = D->A[p].as<float>();
          refs[p].B = D->B[p].as<float>();
        }
        rp[p] = &refs[p];
      }
    if (extras_) extras_->prepare_layer(l);
    // A norm weight or bias: its device copy where there is one, else the model's host array.
    auto w = [&](Buffer LayerCopy::*copy, const Buffer& host) -> const float* {
      if (D && !(D->*copy).empty()) return (D->*copy).as<float>();
      return host.empty() ? nullptr : host.as<float>();
    };
    auto bias = [&](int j) -> const float* {
      if (D && !D->bias[j].empty()) return D->bias[j].as<float>();
      return L.bias[j].empty() ? nullptr : L.bias[j].as<float>();
    };
    be_.rmsnorm_fwd(x.as_const(), w(&LayerCopy::attn_norm, L.attn_norm), c.rms_eps, xn, nullptr);
    be_.linear_fwd(L.proj[0], bias(0), rp[0], xn.as_const(), q, nullptr);
    if (extras_ && rp[0]) extras_->after_fwd(l, Proj(0), xn.as_const(), q, bias(0));
    be_.linear_fwd(L.proj[1], bias(1), rp[1], xn.as_const(), k, nullptr);
    if (extras_ && rp[1]) extras_->after_fwd(l, Proj(1), xn.as_const(), k, bias(1));
    be_.linear_fwd(L.proj[2], bias(2), rp[2], xn.as_const(), v, nullptr);
    if (extras_ && rp[2]) extras_->after_fwd(l, Proj(2), xn.as_const(), v, bias(2));
    if (model_.shapes.qk_norm()) {  // per-head q / k norms (qwen3), in place
      const int hd = c.head_dim;
      MatF qh(q.data, int64_t(n) * c.n_heads, hd), kh(k.data, int64_t(n) * c.n_kv_heads, hd);
      be_.rmsnorm_fwd(qh.as_const(), w(&LayerCopy::q_norm, L.q_norm), c.rms_eps, qh, nullptr);
      be_.rmsnorm_fwd(kh.as_const(), w(&LayerCopy::k_norm, L.k_norm), c.rms_eps, kh, nullptr);
    }
    const RopeFreqs& rf =
        c.rope_local_theta > 0 && model_.shapes.layers[size_t(l)].window > 0 ? rope_local : rope;
    be_.rope(q, pos, c.n_heads, c.head_dim, rf, c.rope_adjacent, false);
    be_.rope(k, pos, c.n_kv_heads, c.head_dim, rf, c.rope_adjacent, false);
    // This feed's keys / values into cache rows [len_, len_ + n), then attention over the cache.
    be_.copy(kcache_[l].as<float>() + static_cast<int64_t>(len_) * kvd, k.data, n * kvd);
    be_.copy(vcache_[l].as<float>() + static_cast<int64_t>(len_) * kvd, v.data, n * kvd);
    be_.attention_decode_capped(model_.shapes, model_.shapes.layers[static_cast<size_t>(l)].window,
                                att_scale, c.attn_softcap, len_, q.as_const(),
                                kcache_[l].as<float>(), vcache_[l].as<float>(), att);
    be_.linear_fwd(L.proj[3], nullptr, rp[3], att.as_const(), post ? xn : mid, nullptr);
    if (extras_ && rp[3]) extras_->after_fwd(l, Proj(3), att.as_const(), post ? xn : mid, nullptr);
    if (post) be_.rmsnorm_fwd(xn.as_const(), L.post_attn_norm.as<float>(), c.rms_eps, mid, nullptr);
    be_.add(mid.data, x.data, n * static_cast<int64_t>(c.dim));
    be_.rmsnorm_fwd(mid.as_const(), w(&LayerCopy::ffn_norm, L.ffn_norm), c.rms_eps, xn, nullptr);
    if (model_.shapes.layers[static_cast<size_t>(l)].moe()) {  // the experts (moe_fwd: any backend)
      MoeSaved routed;
      MoeLora ml;  // the experts' / router's LoRA: the host's, or on a device its copies
      const bool has_ml = lora_ && lora_->has_moe();
      if (has_ml) ml = lora_->moe_lora(l, false);
      MoeLoraPart* parts[kMoePartCount] = {&ml.gate_up, &ml.down, &ml.router};
      for (int p = 0; D && has_ml && p < kMoePartCount; ++p)
        if (!D->moe_A[p].empty()) {
          parts[p]->A = D->moe_A[p].as<float>();
          parts[p]->B = D->moe_B[p].as<float>();
        }
      moe_fwd(be_, L.moe, xn.as_const(), x, routed, has_ml ? &ml : nullptr);
      be_.add(x.data, mid.data, n * static_cast<int64_t>(c.dim));
      continue;
    }
    be_.linear_fwd(L.proj[4], nullptr, rp[4], xn.as_const(), gate, nullptr);
    if (extras_ && rp[4]) extras_->after_fwd(l, Proj(4), xn.as_const(), gate, nullptr);
    be_.linear_fwd(L.proj[5], nullptr, rp[5], xn.as_const(), up, nullptr);
    if (extras_ && rp[5]) extras_->after_fwd(l, Proj(5), xn.as_const(), up, nullptr);
    if (c.gemma)
      be_.geglu_fwd(gate.as_const(), up.as_const(), h);
    else
      be_.swiglu_fwd(gate.as_const(), up.as_const(), h);
    be_.linear_fwd(L.proj[6], nullptr, rp[6], h.as_const(), post ? xn : x, nullptr);
    if (extras_ && rp[6]) extras_->after_fwd(l, Proj(6), h.as_const(), post ? xn : x, nullptr);
    if (post) be_.rmsnorm_fwd(xn.as_const(), L.post_ffn_norm.as<float>(), c.rms_eps, x, nullptr);
    be_.add(x.data, mid.data, n * static_cast<int64_t>(c.dim));
  }
  len_ += n;
}

std::vector<int32_t> Generator::generate(const std::vector<int32_t>& prompt,
                                         const GenerateOptions& opt,
                                         const std::function<bool(int32_t)>& on_token) {
  TokenStream stream(*this, prompt, opt);
  std::vector<int32_t> out;
  for (int32_t id = stream.next(); id >= 0; id = stream.next()) {
    out.push_back(id);
    if (on_token && !on_token(id)) break;
  }
  return out;
}

TokenStream::TokenStream(Generator& gen, std::vector<int32_t> prompt, const GenerateOptions& opt)
    : gen_(gen), prompt_(std::move(prompt)), opt_(opt), sampler_(opt.sampler) {
  QLFT_CHECK_ARG(!prompt_.empty(), "generate: the prompt must hold at least one token (BOS)");
  QLFT_CHECK_ARG(opt.max_tokens >= 0, "max_tokens must be >= 0, got %d", opt.max_tokens);
  gen_.reset();
  if (opt.max_tokens == 0) {
    end_ = End::Length;
    return;
  }
  QLFT_CHECK_ARG(static_cast<int>(prompt_.size()) < gen_.max_length(),
                 "the prompt (%zu tokens) does not fit the context of %d", prompt_.size(),
                 gen_.max_length());
}

int32_t TokenStream::next() {
  if (end_ != End::None) return -1;
  const int vocab = gen_.model_vocab();
  // The prompt first, then the previous id.
  const int32_t* ids = produced_ == 0 ? prompt_.data() : &last_;
  const int n = produced_ == 0 ? static_cast<int>(prompt_.size()) : 1;
  if (opt_.sampler.temperature <= 0.f) {  // greedy (Sampler's argmax), chosen where logits are
    last_ = gen_.feed_greedy(ids, n);
  } else {
    logits_.resize(vocab);
    gen_.feed(ids, n, logits_.data(), true);
    last_ = sampler_.sample(logits_.data(), vocab);
  }
  ++produced_;
  if (last_ == opt_.eos_id)
    end_ = End::Eos;
  else if (produced_ >= opt_.max_tokens || gen_.length() >= gen_.max_length())
    end_ = End::Length;
  return last_;
}

}  // namespace qlft
