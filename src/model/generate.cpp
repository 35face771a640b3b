#include "model/generate.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/threads.h"

namespace qlft {

namespace {
Buffer act(MemoryTracker* t, int64_t floats, const char* what) {
  return Buffer(t, MemCategory::Activations, static_cast<size_t>(floats) * 4, what);
}
}  // namespace

Generator::Generator(const Model& model, Backend& backend, const LoraAdapter* lora, int max_len)
    : model_(model), be_(backend), lora_(lora) {
  if (model.stream) ws_ = model.stream->rank_local();
  if (!ws_) model.require_resident("generation");
  const ModelConfig& c = model.cfg;
  max_len_ = max_len > 0 ? max_len : rope_context_length(c);
  QLFT_CHECK_ARG(max_len_ > 0 && max_len_ <= (1 << 24), "generation length %d is out of range",
                 max_len_);
  if (lora) {
    QLFT_CHECK_ARG(lora->model_shapes() == model.shapes,
                   "the LoRA adapter was made for a model of another shape");
  }
  const int64_t kvd = model.shapes.kv_dim();
  for (int l = 0; l < c.n_layers; ++l) {
    kcache_.push_back(act(be_.tracker(), max_len_ * kvd, "kv cache k"));
    vcache_.push_back(act(be_.tracker(), max_len_ * kvd, "kv cache v"));
  }
}

Generator::~Generator() = default;

void Generator::ensure_rows(int n) {
  if (n <= rows_cap_) return;
  const ModelConfig& c = model_.cfg;
  const int64_t qd = model_.shapes.q_dim(), kvd = model_.shapes.kv_dim();
  MemoryTracker* t = be_.tracker();
  x_ = act(t, n * c.dim, "decode x");
  xn_ = act(t, n * c.dim, "decode norm");
  q_ = act(t, n * qd, "decode q");
  k_ = act(t, n * kvd, "decode k");
  v_ = act(t, n * kvd, "decode v");
  att_ = act(t, n * qd, "decode attention");
  mid_ = act(t, n * c.dim, "decode mid");
  gate_ = act(t, n * c.ffn_dim, "decode gate");
  up_ = act(t, n * c.ffn_dim, "decode up");
  h_ = act(t, n * c.ffn_dim, "decode swiglu");
  pos_ = Buffer(t, MemCategory::Activations, n * 4, "decode positions");
  logits_ = act(t, static_cast<int64_t>(n) * c.vocab, "decode logits");
  rows_cap_ = n;
}

// att[i] = softmax(q_i K^T / sqrt(d)) V over cache positions [0, len_ + i], per head (GQA).
void Generator::attend(int layer, int n) {
  const ModelConfig& c = model_.cfg;
  const int hd = c.head_dim, group = model_.shapes.group();
  const int64_t qd = model_.shapes.q_dim(), kvd = model_.shapes.kv_dim();
  const float* K = kcache_[layer].as<float>();
  const float* V = vcache_[layer].as<float>();
  const float scale = 1.f / std::sqrt(static_cast<float>(hd));
  const int total = len_ + n;
  const int window = model_.shapes.layers[static_cast<size_t>(layer)].window;
  // Threads only when there is enough work: a parallel region costs more than one token's
  // attention on a small model.
  const bool par = static_cast<int64_t>(n) * c.n_heads * total * hd >= (1 << 16);
#pragma omp parallel for num_threads(qlft::num_threads()) schedule(static) collapse(2) if (par)
  for (int i = 0; i < n; ++i)
    for (int h = 0; h < c.n_heads; ++h) {
      std::vector<float> s(total);
      const float* q = q_.as<float>() + i * qd + static_cast<int64_t>(h) * hd;
      const int64_t koff = static_cast<int64_t>(h / group) * hd;
      const int upto = len_ + i + 1;
      // Sliding window: keys j > position - window only (AttnShape::window).
      const int from = window > 0 ? std::max(0, upto - window) : 0;
      float mx = -INFINITY;
      for (int j = from; j < upto; ++j) {
        const float* kr = K + j * kvd + koff;
        float d = 0;
        for (int e = 0; e < hd; ++e) d += q[e] * kr[e];
        s[j] = d * scale;
        mx = std::max(mx, s[j]);
      }
      double sum = 0;
      for (int j = from; j < upto; ++j) {
        s[j] = std::exp(s[j] - mx);
        sum += s[j];
      }
      float* o = att_.as<float>() + i * qd + static_cast<int64_t>(h) * hd;
      std::fill(o, o + hd, 0.f);
      const float inv = static_cast<float>(1.0 / sum);
      for (int j = from; j < upto; ++j) {
        const float* vr = V + j * kvd + koff;
        const float w = s[j] * inv;
        for (int e = 0; e < hd; ++e) o[e] += w * vr[e];
      }
    }
}

void Generator::feed(const int32_t* tokens, int n, float* logits, bool last_only) {
  QLFT_CHECK_ARG(n > 0 && tokens, "feed: no tokens");
  QLFT_CHECK_ARG(len_ + n <= max_len_, "context full: %d + %d tokens exceed the limit of %d", len_,
                 n, max_len_);
  const ModelConfig& c = model_.cfg;
  ensure_rows(n);
  const int64_t qd = model_.shapes.q_dim(), kvd = model_.shapes.kv_dim();
  int32_t* pos = pos_.as<int32_t>();
  for (int i = 0; i < n; ++i) pos[i] = len_ + i;
  // Keys already cached keep the rotation they were stored with; with dynamic NTK the new rows
  // take this call's length, as transformers' generate does.
  const RopeFreqs rope = rope_freqs(c, int64_t(len_) + n);
  MatF x(x_.as<float>(), n, c.dim), xn(xn_.as<float>(), n, c.dim), mid(mid_.as<float>(), n, c.dim);
  MatF q(q_.as<float>(), n, qd), k(k_.as<float>(), n, kvd), v(v_.as<float>(), n, kvd);
  MatF att(att_.as<float>(), n, qd);
  MatF gate(gate_.as<float>(), n, c.ffn_dim), up(up_.as<float>(), n, c.ffn_dim),
      h(h_.as<float>(), n, c.ffn_dim);
  WeightStream* ws = ws_.get();
  {
    UnitUse use(ws, kEmbeddingUnit, layer_unit(0));
    be_.embedding_fwd(model_.tok_embd, tokens, x);
  }

  for (int l = 0; l < c.n_layers; ++l) {
    UnitUse use(ws, layer_unit(l), l + 1 < c.n_layers ? layer_unit(l + 1) : head_unit(c.n_layers));
    const LayerWeights& L = model_.layers[l];
    LoraRef refs[kProjCount];
    const LoraRef* rp[kProjCount] = {};
    for (int p = 0; p < kProjCount; ++p)
      if (lora_ && lora_->slot(l, static_cast<Proj>(p)).active()) {
        refs[p] = lora_->ref(l, static_cast<Proj>(p), 0);
        refs[p].dropout_p = 0.f;
        rp[p] = &refs[p];
      }
    auto bias = [&](int j) { return L.bias[j].empty() ? nullptr : L.bias[j].as<float>(); };
    be_.rmsnorm_fwd(x.as_const(), L.attn_norm.as<float>(), c.rms_eps, xn, nullptr);
    be_.linear_fwd(L.proj[0], bias(0), rp[0], xn.as_const(), q, nullptr);
    be_.linear_fwd(L.proj[1], bias(1), rp[1], xn.as_const(), k, nullptr);
    be_.linear_fwd(L.proj[2], bias(2), rp[2], xn.as_const(), v, nullptr);
    if (model_.shapes.qk_norm()) {  // per-head q / k norms (qwen3), in place
      const int hd = c.head_dim;
      MatF qh(q.data, int64_t(n) * c.n_heads, hd), kh(k.data, int64_t(n) * c.n_kv_heads, hd);
      be_.rmsnorm_fwd(qh.as_const(), L.q_norm.as<float>(), c.rms_eps, qh, nullptr);
      be_.rmsnorm_fwd(kh.as_const(), L.k_norm.as<float>(), c.rms_eps, kh, nullptr);
    }
    be_.rope(q, pos, c.n_heads, c.head_dim, rope, c.rope_adjacent, false);
    be_.rope(k, pos, c.n_kv_heads, c.head_dim, rope, c.rope_adjacent, false);
    std::memcpy(kcache_[l].as<float>() + static_cast<int64_t>(len_) * kvd, k.data, n * kvd * 4);
    std::memcpy(vcache_[l].as<float>() + static_cast<int64_t>(len_) * kvd, v.data, n * kvd * 4);
    attend(l, n);
    be_.linear_fwd(L.proj[3], nullptr, rp[3], att.as_const(), mid, nullptr);
    for (int64_t i = 0; i < n * static_cast<int64_t>(c.dim); ++i) mid.data[i] += x.data[i];
    be_.rmsnorm_fwd(mid.as_const(), L.ffn_norm.as<float>(), c.rms_eps, xn, nullptr);
    be_.linear_fwd(L.proj[4], nullptr, rp[4], xn.as_const(), gate, nullptr);
    be_.linear_fwd(L.proj[5], nullptr, rp[5], xn.as_const(), up, nullptr);
    be_.swiglu_fwd(gate.as_const(), up.as_const(), h);
    be_.linear_fwd(L.proj[6], nullptr, rp[6], h.as_const(), x, nullptr);
    for (int64_t i = 0; i < n * static_cast<int64_t>(c.dim); ++i) x.data[i] += mid.data[i];
  }
  len_ += n;
  if (!logits) return;
  UnitUse use(ws, head_unit(c.n_layers), kNoUnit);
  be_.rmsnorm_fwd(x.as_const(), model_.output_norm.as<float>(), c.rms_eps, xn, nullptr);
  if (last_only) {
    be_.head_logits(model_.head(), xn.as_const().row_slice(n - 1, 1), MatF(logits, 1, c.vocab));
  } else {
    be_.head_logits(model_.head(), xn.as_const(), MatF(logits, n, c.vocab));
  }
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
  if (produced_ == 0) {
    logits_.resize(vocab);
    gen_.feed(prompt_.data(), static_cast<int>(prompt_.size()), logits_.data(), true);
  } else {
    gen_.feed(&last_, 1, logits_.data(), true);
  }
  last_ = sampler_.sample(logits_.data(), vocab);
  ++produced_;
  if (last_ == opt_.eos_id)
    end_ = End::Eos;
  else if (produced_ >= opt_.max_tokens || gen_.length() >= gen_.max_length())
    end_ = End::Length;
  return last_;
}

}  // namespace qlft
