// GGUF models (llama.cpp's files): the configuration from the metadata, each tensor by its
// llama.cpp name, dequantized, quantized on load or kept as stored (quant.type=keep); a group
// kept as stored can be planned from the header alone (plan_group, ZeRO-3's ranged reads).
#include <cmath>
#include <cstring>
#include <unordered_map>

#include "arch/families.h"
#include "core/error.h"
#include "model/model_load_internal.h"
#include "quant/ggml_dequant.h"
#include "quant/ggml_types.h"

namespace qlft {

namespace {

const GgufTensorInfo& gguf_expect_shape(const GgufFile& g, const GgufTensorInfo& t, int64_t rows,
                                        int64_t cols) {
  bool ok = t.n_dims <= 2 && t.ne[0] == cols && (rows < 0 || t.ne[1] == rows);
  QLFT_CHECK_FORMAT(
      ok, "%s: tensor '%s' has shape [%lld, %lld], expected [%lld, %lld] (GGUF order)",
      g.path().c_str(), t.name.c_str(), static_cast<long long>(t.ne[0]),
      static_cast<long long>(t.ne[1]), static_cast<long long>(cols), static_cast<long long>(rows));
  return t;
}
const GgufTensorInfo& gguf_tensor(const GgufFile& g, const std::string& name, int64_t rows,
                                  int64_t cols) {
  const GgufTensorInfo* t = g.find_tensor(name);
  QLFT_CHECK_FORMAT(t, "%s: tensor '%s' is missing", g.path().c_str(), name.c_str());
  return gguf_expect_shape(g, *t, rows, cols);
}
// Throws unless t's type is one qlft dequantizes (float or quantized, not integer).
void gguf_check_float(const GgufFile& g, const GgufTensorInfo& t) {
  const GgmlTypeTraits* tr = ggml_type_traits(t.type);
  switch (static_cast<GgmlType>(t.type)) {
    case GgmlType::I8:
    case GgmlType::I16:
    case GgmlType::I32:
    case GgmlType::I64:
      throw_error(QLFT_ERR_FORMAT,
                  "%s: tensor '%s' has integer type %s, expected a float or "
                  "quantized type",
                  g.path().c_str(), t.name.c_str(), tr->name);
    default:
      break;
  }
  if (!tr->dequantizable)
    throw_error(QLFT_ERR_UNSUPPORTED, "%s: tensor '%s' has type %s, which qlft cannot dequantize",
                g.path().c_str(), t.name.c_str(), tr->name);
}
void gguf_to_f32(const GgufFile& g, const GgufTensorInfo& t, float* dst) {
  gguf_check_float(g, t);
  ggml_dequantize(t.type, t.data, t.numel(), dst);
}

// llama.cpp's experts (mixtral as "llama", qwen3moe): expert_count experts of
// expert_feed_forward_length rows (mixtral: feed_forward_length), expert_used_count per row,
// their weights renormalised unless expert_weights_norm is false (llama.cpp renormalises both
// families'), softmax routing. A layer is a mixture of experts where blk.N.ffn_gate_inp is
// present; one without it keeps a dense ffn_gate / ffn_up / ffn_down of feed_forward_length
// (Qwen3-MoE's mlp_only_layers, which llama.cpp's qwen3moe does not have).
void read_gguf_moe(const GgufFile& g, const std::string& a, int64_t experts, ModelConfig& c) {
  const std::string& path = g.path();
  ModelConfig::Moe& m = c.moe;
  QLFT_CHECK_FORMAT(experts > 0, "%s: '%sexpert_count' is missing (a mixture of experts)",
                    path.c_str(), a.c_str());
  m.n_experts = static_cast<int>(experts);
  m.top_k = static_cast<int>(g.get_int_in(a + "expert_used_count", 1, experts));
  m.expert_ffn = g.get_int_in(a + "expert_feed_forward_length", 1, kMaxDim, c.ffn_dim);
  m.norm_topk = g.get_bool(a + "expert_weights_norm", true);
  const int64_t gating = g.get_int(a + "expert_gating_func", 1);  // llama.cpp's 1: softmax
  if (gating != 1)
    throw_error(QLFT_ERR_UNSUPPORTED,
                "%s: '%sexpert_gating_func' is %lld; qlft routes with softmax (1)", path.c_str(),
                a.c_str(), static_cast<long long>(gating));
  for (const char* k : {"expert_shared_count", "expert_weights_scale"})
    if (g.find(a + k))
      throw_error(QLFT_ERR_UNSUPPORTED,
                  "%s: '%s%s' is set; qlft's experts have no shared expert or weight scale",
                  path.c_str(), a.c_str(), k);
  bool any = false, all = true;
  for (int l = 0; l < c.n_layers; ++l) {
    m.layers.push_back(g.find_tensor("blk." + std::to_string(l) + ".ffn_gate_inp.weight"));
    any = any || m.layers.back();
    all = all && m.layers.back();
  }
  QLFT_CHECK_FORMAT(any,
                    "%s: '%sexpert_count' is %lld but no layer has a router "
                    "(blk.N.ffn_gate_inp.weight)",
                    path.c_str(), a.c_str(), static_cast<long long>(experts));
  if (all) m.layers.clear();  // empty: every layer
}

}  // namespace

void check_gguf_vocabulary(const GgufFile& g, int64_t embedding_rows) {
  const GgufValue* t = g.find("tokenizer.ggml.tokens");
  if (!t || t->type != GgufType::ARRAY) return;  // no tokenizer: nothing to disagree with
  // llama.cpp's rule: one embedding row per token. Fewer tokens leave ids the model can emit
  // but no tokenizer can decode; more give ids with no embedding row.
  QLFT_CHECK_FORMAT(static_cast<int64_t>(t->count) == embedding_rows,
                    "%s: the vocabulary has %llu tokens (tokenizer.ggml.tokens) but tensor "
                    "'token_embd.weight' has %lld rows; they must be equal",
                    g.path().c_str(), static_cast<unsigned long long>(t->count),
                    static_cast<long long>(embedding_rows));
}

bool gguf_kept_as_stored(const GgufTensorInfo& t, bool linear, const LoadOptions& o) {
  if (static_cast<GgmlType>(t.type) == GgmlType::F32) return true;
  const GgmlTypeTraits* tr = ggml_type_traits(t.type);
  return linear && o.quant_type == QuantType::Keep && tr && tr->dequantizable;
}

// A per-pair divisor list of llama.cpp's RoPE scaling tensors (rope_freqs, rope_factors_long /
// _short): head_dim / 2 positive finite values.
static void read_gguf_divisors(const GgufFile& g, const char* name, int head_dim,
                               std::vector<float>& d) {
  const GgufTensorInfo* t = g.find_tensor(name);
  const int64_t n = head_dim / 2;
  QLFT_CHECK_FORMAT(t->numel() == n && t->ne[0] == n,
                    "%s: tensor '%s' has %lld elements, expected %lld (head_dim / 2)",
                    g.path().c_str(), name, static_cast<long long>(t->numel()),
                    static_cast<long long>(n));
  d.resize(static_cast<size_t>(n));
  gguf_to_f32(g, *t, d.data());
  for (size_t i = 0; i < d.size(); ++i)
    QLFT_CHECK_FORMAT(std::isfinite(d[i]) && d[i] > 0,
                      "%s: tensor '%s' holds %g at element %zu (divisors must be positive)",
                      g.path().c_str(), name, static_cast<double>(d[i]), i);
}

ModelConfig read_gguf_config(const GgufFile& g) {
  const std::string& path = g.path();
  ModelConfig c;
  const std::string arch = g.get_string("general.architecture");
  const ArchFamily* fam = find_family_gguf(arch);
  if (!fam)
    throw_error(QLFT_ERR_UNSUPPORTED, "%s: %s (general.architecture)", path.c_str(),
                unsupported_architecture("", arch).c_str());
  const std::string a = arch + ".";
  // llama.cpp writes Mixtral as "llama" with experts (expert_count, ffn_gate_inp / *_exps).
  const int64_t experts = g.get_int_in(a + "expert_count", 0, 4096, 0);
  if (arch == "llama" && experts > 0) fam = find_family("mixtral");
  c.arch = fam->name;
  if (!fam->moe && (experts > 0 || g.find_tensor("blk.0.ffn_gate_inp.weight")))
    throw_error(QLFT_ERR_UNSUPPORTED,
                "%s: mixture-of-experts layers (%sexpert_count %lld, tensors "
                "blk.N.ffn_gate_inp / ffn_gate_exps / ffn_up_exps / ffn_down_exps) are not "
                "supported for general.architecture '%s' (qlft trains experts of mixtral, as "
                "\"llama\", and qwen3moe)",
                path.c_str(), a.c_str(), static_cast<long long>(experts), arch.c_str());
  // Ranged getters: a hostile count must not wrap when narrowed to int.
  c.n_layers = static_cast<int>(g.get_int_in(a + "block_count", 1, kMaxLayers));
  c.dim = static_cast<int>(g.get_int_in(a + "embedding_length", 1, kMaxDim));
  c.ffn_dim = static_cast<int>(g.get_int_in(a + "feed_forward_length", 1, kMaxDim));
  c.n_heads = static_cast<int>(g.get_int_in(a + "attention.head_count", 1, kMaxHeads));
  c.n_kv_heads =
      static_cast<int>(g.get_int_in(a + "attention.head_count_kv", 1, kMaxHeads, c.n_heads));
  c.context_length = static_cast<int>(g.get_int_in(a + "context_length", 1, kMaxContext, 2048));
  c.rms_eps = static_cast<float>(g.get_float(a + "attention.layer_norm_rms_epsilon", 1e-5));
  c.rope_theta = static_cast<float>(g.get_float(a + "rope.freq_base", 10000.0));
  c.rope = rope_scaling_from_gguf(g, a);
  QLFT_CHECK_FORMAT(c.n_heads > 0 && c.dim % c.n_heads == 0,
                    "%s: embedding length %d is not a multiple of the head count %d", path.c_str(),
                    c.dim, c.n_heads);
  c.head_dim =
      static_cast<int>(g.get_int_in(a + "attention.key_length", 1, kMaxHeadDim, c.dim / c.n_heads));
  c.rope_adjacent = fam->gguf_qk_adjacent;
  c.qkv_bias = g.find_tensor("blk.0.attn_q.bias") != nullptr;
  c.qk_norm = fam->qk_norm;
  // llama.cpp's key for the window; on every layer.
  c.sliding_window =
      static_cast<int>(g.get_int_in(a + "attention.sliding_window", 0, kMaxContext, 0));
  if (fam->gemma) {
    // llama.cpp's gemma2: the window on even layers, the caps as metadata, the scores scaled
    // by head_dim^-0.5, or (hidden / heads)^-0.5 for the 46-layer 27B (its
    // query_pre_attn_scalar); attention.scale, when a file has it, is taken as the scale itself.
    // gemma3: layer i slides unless (i + 1) % pattern == 0 (llama.cpp fixes the pattern at 6;
    // attention.sliding_window_pattern, gguf-py's key, when a file has it), the sliding
    // layers' RoPE base plain 10000 (rope.freq_base_swa when present), the full layers'
    // rope.freq_base with rope.scaling; (hidden / heads)^-0.5 for the 62-layer 27B.
    c.gemma = true;
    const bool g3 = arch == "gemma3";
    const int64_t pattern =
        g3 ? g.get_int_in(a + "attention.sliding_window_pattern", 1, kMaxLayers, 6) : 2;
    if (c.sliding_window > 0)
      for (int i = 0; i < c.n_layers; ++i)
        c.sliding_layers.push_back(g3 ? i % pattern < pattern - 1 : i % 2 == 0);
    if (g3) c.rope_local_theta = static_cast<float>(g.get_float(a + "rope.freq_base_swa", 1e4));
    c.attn_softcap = static_cast<float>(g.get_float(a + "attn_logit_softcapping", 0.0));
    c.final_softcap = static_cast<float>(g.get_float(a + "final_logit_softcapping", 0.0));
    c.attn_scalar =
        static_cast<float>(c.n_layers == (g3 ? 62 : 46) ? c.dim / c.n_heads : c.head_dim);
    const double scale = g.get_float(a + "attention.scale", 0.0);
    QLFT_CHECK_FORMAT(scale >= 0 && std::isfinite(scale), "%s: %sattention.scale %g is invalid",
                      path.c_str(), a.c_str(), scale);
    if (scale > 0) c.attn_scalar = static_cast<float>(1.0 / (scale * scale));
  }
  if (fam->moe) read_gguf_moe(g, a, experts, c);
  check_model_config(c, path);
  // llama.cpp's converter writes llama3 RoPE scaling as per-pair divisors of the frequencies
  // (rope_freqs.weight), and Phi-3's LongRoPE as two such lists (convert_hf_to_gguf.py
  // Phi3MiniModel): rope_factors_short.weight up to rope.scaling.original_context_length
  // positions, rope_factors_long.weight past it, with rope.scaling.attn_factor and
  // context_length (max_position_embeddings) beside them and no rope.scaling.type.
  if (g.find_tensor("rope_freqs.weight"))
    read_gguf_divisors(g, "rope_freqs.weight", c.head_dim, c.rope.freq_divisors);
  const bool has_long = g.find_tensor("rope_factors_long.weight") != nullptr;
  if (has_long || g.find_tensor("rope_factors_short.weight")) {
    for (const char* n : {"rope_factors_long.weight", "rope_factors_short.weight"})
      QLFT_CHECK_FORMAT(g.find_tensor(n),
                        "%s: tensor '%s' is missing (LongRoPE needs rope_factors_long.weight and "
                        "rope_factors_short.weight)",
                        path.c_str(), n);
    QLFT_CHECK_FORMAT(c.rope.type == RopeType::Default && c.rope.freq_divisors.empty(),
                      "%s: tensors rope_factors_long / rope_factors_short (LongRoPE) come with "
                      "another RoPE scaling (%srope.scaling.type or rope_freqs.weight)",
                      path.c_str(), a.c_str());
    RopeScaling& s = c.rope;
    s.type = RopeType::LongRope;
    read_gguf_divisors(g, "rope_factors_long.weight", c.head_dim, s.long_factor);
    read_gguf_divisors(g, "rope_factors_short.weight", c.head_dim, s.short_factor);
    const std::string orig = a + "rope.scaling.original_context_length";
    QLFT_CHECK_FORMAT(g.find(orig), "%s: '%s' is missing (LongRoPE needs it)", path.c_str(),
                      orig.c_str());
    s.original_context = static_cast<int>(g.get_int_in(orig, 1, kMaxContext));
    s.factor = double(c.context_length) / s.original_context;  // transformers' rule for Phi-3
    const std::string attn = a + "rope.scaling.attn_factor";
    if (g.find(attn)) {
      s.attention_factor = g.get_float(attn, 1.0);
      QLFT_CHECK_FORMAT(std::isfinite(s.attention_factor) && s.attention_factor > 0,
                        "%s: '%s' = %g must be positive", path.c_str(), attn.c_str(),
                        s.attention_factor);
      s.has_attention_factor = true;
    }
  }
  const GgufTensorInfo& emb = gguf_tensor(g, "token_embd.weight", -1, c.dim);
  QLFT_CHECK_FORMAT(emb.ne[1] >= 1 && emb.ne[1] <= kMaxVocab,
                    "%s: tensor 'token_embd.weight' has %lld rows, not a vocabulary size",
                    path.c_str(), static_cast<long long>(emb.ne[1]));
  c.vocab = static_cast<int>(emb.ne[1]);
  check_gguf_vocabulary(g, emb.ne[1]);
  const GgufTensorInfo* out = g.find_tensor("output.weight");
  if (out) gguf_expect_shape(g, *out, c.vocab, c.dim);
  return tie_missing_head(c, out != nullptr, false, path, "output.weight");
}

namespace {

class GgufLoader final : public FormatLoader {
 public:
  using FormatLoader::FormatLoader;

  void read_config(const std::string& path) override {
    m_.gguf = GgufFile::open(path);
    m_.cfg = read_gguf_config(*m_.gguf);
  }

  void embedding(QWeight& w, bool head) override {
    const ModelConfig& c = m_.cfg;
    float_weight(w, tensor(head ? "output.weight" : "token_embd.weight", c.vocab, c.dim), c.vocab,
                 c.dim);
  }
  void norm(Buffer& dst, int l, NormRole r, int64_t n) override {
    if (r == NormRole::Final) return vector(dst, "output_norm.weight", n);
    const char* name = r == NormRole::Attn       ? "attn_norm.weight"
                       : r == NormRole::Ffn      ? "ffn_norm.weight"
                       : r == NormRole::PostAttn ? "post_attention_norm.weight"
                       : r == NormRole::PostFfn  ? "post_ffw_norm.weight"
                       : r == NormRole::Q        ? "attn_q_norm.weight"
                                                 : "attn_k_norm.weight";
    vector(dst, layer(l) + name, n);
  }
  void linear(QWeight& w, int l, Proj p, const ProjShape& s) override {
    if (fused_ && p != Proj::O && p != Proj::Down) return fused_rows(w, l, p, s);
    const GgufTensorInfo& t = tensor(layer(l) + proj_gguf_name(p) + ".weight", s.out, s.in);
    linear_weight(w, t, s.out, s.in);
  }
  void bias(Buffer& dst, int l, Proj p, int64_t n) override {
    vector(dst, layer(l) + proj_gguf_name(p) + ".bias", n);
  }
  // llama.cpp's MoE layer: the router ffn_gate_inp [n_experts, dim] and the experts stacked in
  // ffn_gate_exps / ffn_up_exps [n_experts, ffn, dim] and ffn_down_exps [n_experts, dim, ffn]
  // (GGUF order reversed), expert e the e-th block of rows.
  void moe(MoeWeights& w, int l, const LayerShapes& s) override {
    const ModelConfig& c = m_.cfg;
    float_weight(w.router, tensor(layer(l) + "ffn_gate_inp.weight", s.n_experts, s.norm),
                 s.n_experts, s.norm);
    const struct {
      const char* name;
      std::vector<QWeight>* dst;
      int64_t rows, cols;
    } parts[] = {{"ffn_gate_exps.weight", &w.w1, s.expert_ffn, s.norm},
                 {"ffn_up_exps.weight", &w.w3, s.expert_ffn, s.norm},
                 {"ffn_down_exps.weight", &w.w2, s.norm, s.expert_ffn}};
    for (const auto& p : parts) {
      const std::string name = layer(l) + p.name;
      const GgufTensorInfo* t = m_.gguf->find_tensor(name);
      QLFT_CHECK_FORMAT(t, "%s: tensor '%s' is missing (%s has %d experts on layer %d)",
                        m_.gguf->path().c_str(), name.c_str(), c.arch.c_str(), s.n_experts, l);
      QLFT_CHECK_FORMAT(
          t->n_dims == 3 && t->ne[0] == p.cols && t->ne[1] == p.rows && t->ne[2] == s.n_experts,
          "%s: tensor '%s' has shape [%lld, %lld, %lld], expected [%lld, %lld, %d] "
          "(GGUF order)",
          m_.gguf->path().c_str(), name.c_str(), static_cast<long long>(t->ne[0]),
          static_cast<long long>(t->ne[1]), static_cast<long long>(t->ne[2]),
          static_cast<long long>(p.cols), static_cast<long long>(p.rows), s.n_experts);
      const GgmlTypeTraits* tr = ggml_type_traits(t->type);
      QLFT_CHECK_FORMAT(tr && tr->block > 0 && p.cols % tr->block == 0,
                        "%s: tensor '%s' has a type qlft cannot split into experts",
                        m_.gguf->path().c_str(), name.c_str());
      const uint64_t bytes = uint64_t(p.rows) * uint64_t(p.cols / tr->block) * tr->bytes;
      for (int e = 0; e < s.n_experts; ++e)
        linear_weight((*p.dst)[size_t(e)], *t, p.rows, p.cols, t->data + uint64_t(e) * bytes);
    }
  }
  // load_group without reading a weight: the group's shapes and types set in the model and, for
  // each storage Buffer a load would fill, where its bytes lie in the map (span). False when a
  // Buffer of the group is made on load (gguf_kept_as_stored): then load_group it.
  bool plan_group(int g, bool with_head) override {
    plan_ = Plan{};
    plan_.on = true;
    try {
      load_weight_group(*this, m_, g, with_head);
    } catch (...) {
      plan_.on = false;
      throw;
    }
    plan_.on = false;
    return plan_.whole;
  }
  // Of the last plan_group: Buffer b's bytes in the map and their count (nullptr, 0: b stays
  // empty).
  std::pair<const uint8_t*, size_t> span(const Buffer* b) const override {
    auto it = plan_.at.find(b);
    return it == plan_.at.end() ? std::pair<const uint8_t*, size_t>{nullptr, 0} : it->second;
  }
  // The embedding (head: the untied head) as stored (WeightGroupSource::stored_rows), and its
  // rows [r0, r0 + n) in that format.
  QWeight stored_rows(bool head) override {
    const ModelConfig& c = m_.cfg;
    const GgufTensorInfo& t = tensor(head ? "output.weight" : "token_embd.weight", c.vocab, c.dim);
    QWeight w;
    w.rows = c.vocab;
    w.cols = c.dim;
    if (static_cast<GgmlType>(t.type) != GgmlType::F32) {
      w.kind = QuantKind::GGML;
      w.ggml_type = t.type;
    }
    if (stored_row_bytes(w) == 0 || !ggml_type_traits(t.type)->dequantizable)
      throw_error(QLFT_ERR_UNSUPPORTED, "%s: tensor '%s' has type %s, which qlft cannot use",
                  m_.gguf->path().c_str(), t.name.c_str(), ggml_type_traits(t.type)->name);
    return w;
  }
  void stored_row_bytes_of(bool head, int64_t r0, int64_t n, void* out) override {
    const ModelConfig& c = m_.cfg;
    const GgufTensorInfo& t = tensor(head ? "output.weight" : "token_embd.weight", c.vocab, c.dim);
    const uint64_t rb = stored_row_bytes(stored_rows(head));
    std::memcpy(out, t.data + uint64_t(r0) * rb, uint64_t(n) * rb);
  }

 private:
  static std::string layer(int l) { return "blk." + std::to_string(l) + "."; }
  const GgufTensorInfo& tensor(const std::string& name, int64_t rows, int64_t cols) {
    return gguf_tensor(*m_.gguf, name, rows, cols);
  }
  void expect_shape(const GgufTensorInfo& t, int64_t rows, int64_t cols) {
    gguf_expect_shape(*m_.gguf, t, rows, cols);
  }
  void to_f32(const GgufTensorInfo& t, float* dst) { gguf_to_f32(*m_.gguf, t, dst); }
  // plan_group: b's bytes are t's n from at (default: its first), or (kept false) b is made on
  // load.
  void note(Buffer& b, const GgufTensorInfo& t, uint64_t n, bool kept,
            const uint8_t* at = nullptr) {
    if (!kept) {
      plan_.whole = false;
      return;
    }
    if (!at) at = t.data;
    QLFT_CHECK_FORMAT(uint64_t(at - t.data) + n <= t.nbytes,
                      "%s: tensor '%s' holds %llu bytes, %llu expected", m_.gguf->path().c_str(),
                      t.name.c_str(), static_cast<unsigned long long>(t.nbytes),
                      static_cast<unsigned long long>(uint64_t(at - t.data) + n));
    plan_.at[&b] = {at, size_t(n)};
  }
  void vector(Buffer& dst, const std::string& name, int64_t n) {
    const GgufTensorInfo* t = m_.gguf->find_tensor(name);
    QLFT_CHECK_FORMAT(t, "%s: tensor '%s' is missing", m_.gguf->path().c_str(), name.c_str());
    QLFT_CHECK_FORMAT(t->numel() == n && t->ne[0] == n,
                      "%s: tensor '%s' has %lld elements, expected %lld", m_.gguf->path().c_str(),
                      name.c_str(), static_cast<long long>(t->numel()), static_cast<long long>(n));
    if (plan_.on) return note(dst, *t, uint64_t(n) * 4, gguf_kept_as_stored(*t, false, opt_));
    dst = Buffer(tracker_, MemCategory::Weights, n * 4, name.c_str());
    to_f32(*t, dst.as<float>());
  }
  // Dequantizes straight into the weight buffer: no staging copy, and an over-budget load fails
  // on the weights it was asked to hold.
  // at: the weight's first byte within t (an expert of a stacked tensor; default t's first).
  void float_weight(QWeight& w, const GgufTensorInfo& t, int64_t rows, int64_t cols,
                    const uint8_t* at = nullptr) {
    w = QWeight{};
    w.kind = QuantKind::F32;
    w.rows = rows;
    w.cols = cols;
    const uint64_t n = uint64_t(rows * cols) * 4;
    if (plan_.on) return note(w.data, t, n, gguf_kept_as_stored(t, false, opt_), at);
    w.data = Buffer(tracker_, MemCategory::Weights, n, t.name.c_str());
    slice_to_f32(t, at, rows * cols, w.data.as<float>());
  }
  void slice_to_f32(const GgufTensorInfo& t, const uint8_t* at, int64_t n, float* dst) {
    if (!at || (at == t.data && n == t.numel())) return to_f32(t, dst);
    gguf_check_float(*m_.gguf, t);
    ggml_dequantize(t.type, at, n, dst);
  }
  void linear_weight(QWeight& w, const GgufTensorInfo& t, int64_t rows, int64_t cols,
                     const uint8_t* at = nullptr) {
    if (opt_.quant_type == QuantType::Keep) {
      if (static_cast<GgmlType>(t.type) == GgmlType::F32) return float_weight(w, t, rows, cols, at);
      const GgmlTypeTraits* tr = ggml_type_traits(t.type);
      if (!tr->dequantizable)
        throw_error(QLFT_ERR_UNSUPPORTED, "%s: tensor '%s' has type %s, which qlft cannot use",
                    m_.gguf->path().c_str(), t.name.c_str(), tr->name);
      if (!plan_.on) {
        w = qweight_from_ggml(tracker_, t.type, at ? at : t.data, rows, cols);
        return;
      }
      uint64_t nb = 0;
      w = qweight_ggml_shape(t.type, rows, cols, &nb);
      return note(w.data, t, nb, gguf_kept_as_stored(t, true, opt_), at);
    }
    if (plan_.on) {
      plan_.whole = false;  // quantized on load
      return;
    }
    Buffer tmp(tracker_, MemCategory::Workspace, rows * cols * 4, "load staging");
    slice_to_f32(t, at, rows * cols, tmp.as<float>());
    require_finite(tmp.as<float>(), rows * cols, m_.gguf->path().c_str(), t.name);
    w = qweight_from_f32(tracker_, tmp.as<float>(), rows, cols, target_kind(opt_), opt_.blocksize,
                         opt_.double_quant);
  }

  // Phi-3: q / k / v are row blocks of attn_qkv, gate / up of ffn_up (gate first), each
  // dequantized from its rows and kept as f32 (quant.type=keep) or quantized (never a span of
  // the file: plan_group loads the group).
  void fused_rows(QWeight& w, int l, Proj p, const ProjShape& s) {
    const ModelShapes& sh = m_.shapes;
    const bool att = p <= Proj::V;
    const int64_t q = sh.proj(l, Proj::Q).out, k = sh.proj(l, Proj::K).out;
    const int64_t total = att ? q + k + sh.proj(l, Proj::V).out : 2 * s.out;
    const int64_t row0 = p == Proj::K ? q : p == Proj::V ? q + k : p == Proj::Up ? s.out : 0;
    const GgufTensorInfo& t =
        tensor(layer(l) + (att ? "attn_qkv.weight" : "ffn_up.weight"), total, s.in);
    if (plan_.on) {
      plan_.whole = false;
      return;
    }
    const GgmlTypeTraits* tr = ggml_type_traits(t.type);
    QLFT_CHECK_FORMAT(tr && tr->dequantizable && s.in % tr->block == 0,
                      "%s: tensor '%s' has a type qlft cannot split into rows",
                      m_.gguf->path().c_str(), t.name.c_str());
    const uint8_t* at = t.data + uint64_t(row0) * uint64_t(s.in / tr->block) * tr->bytes;
    const int64_t n = s.out * s.in;
    if (opt_.quant_type == QuantType::Keep) {
      w = QWeight{};
      w.kind = QuantKind::F32;
      w.rows = s.out;
      w.cols = s.in;
      w.data = Buffer(tracker_, MemCategory::Weights, n * 4, t.name.c_str());
      ggml_dequantize(t.type, at, n, w.data.as<float>());
      return;
    }
    Buffer tmp(tracker_, MemCategory::Workspace, n * 4, "load staging");
    ggml_dequantize(t.type, at, n, tmp.as<float>());
    require_finite(tmp.as<float>(), n, m_.gguf->path().c_str(), t.name);
    w = qweight_from_f32(tracker_, tmp.as<float>(), s.out, s.in, target_kind(opt_), opt_.blocksize,
                         opt_.double_quant);
  }

  // plan_group's state: on while it runs; whole while every Buffer so far is a span.
  struct Plan {
    bool on = false, whole = true;
    std::unordered_map<const Buffer*, std::pair<const uint8_t*, size_t>> at;
  };

  Plan plan_;
};

}  // namespace

std::unique_ptr<FormatLoader> make_gguf_loader(MemoryTracker* t, const LoadOptions& o, Model& m) {
  return std::make_unique<GgufLoader>(t, o, m);
}

}  // namespace qlft
