// Hugging Face models: config.json beside one or more safetensors files (sharded, or
// bitsandbytes pre-quantized), each tensor by its transformers name, converted to f32,
// quantized on load or kept as f16 / bf16 (quant.type=keep).
#include <cstring>

#include <nlohmann/json.hpp>

#include "arch/families.h"
#include "core/dtype.h"
#include "core/error.h"
#include "formats/json_file.h"
#include "formats/safetensors.h"
#include "formats/safetensors_bnb.h"
#include "model/model_load_internal.h"

namespace qlft {

namespace {

// Sliding-window attention as transformers decides it: layer_types ("sliding_attention" /
// "full_attention") when config.json lists them; else Qwen's use_sliding_window from layer
// max_window_layers on; else (Mistral) every layer when sliding_window is set.
void read_hf_sliding_window(const JsonFile& cj, const ArchFamily& fam, ModelConfig& c) {
  const nlohmann::json& r = cj.root();
  if (!cj.has("sliding_window")) return;
  c.sliding_window = static_cast<int>(cj.get_int_in("sliding_window", 1, kMaxContext));
  const std::string name = fam.name;
  if (r.contains("layer_types") && r["layer_types"].is_array()) {
    const nlohmann::json& t = r["layer_types"];
    QLFT_CHECK_FORMAT(t.size() == size_t(c.n_layers),
                      "%s: layer_types lists %zu layers, num_hidden_layers is %d",
                      cj.path().c_str(), t.size(), c.n_layers);
    for (size_t i = 0; i < t.size(); ++i) {
      const std::string v = t[i].is_string() ? t[i].get<std::string>() : "?";
      QLFT_CHECK_FORMAT(v == "sliding_attention" || v == "full_attention",
                        "%s: layer_types[%zu] is '%s'; qlft trains sliding_attention and "
                        "full_attention layers",
                        cj.path().c_str(), i, v.c_str());
      c.sliding_layers.push_back(v == "sliding_attention");
    }
  } else if (fam.gemma) {  // without layer_types: sliding_window_pattern (transformers')
    const int64_t p =
        cj.get_int_in("sliding_window_pattern", 1, kMaxLayers, name == "gemma2" ? 2 : 6);
    for (int i = 0; i < c.n_layers; ++i) c.sliding_layers.push_back((i + 1) % p != 0);
  } else if (name == "qwen2" || name == "qwen3" || name == "qwen3_moe") {
    const bool on = cj.get_bool("use_sliding_window", false);
    const int64_t from = cj.get_int_in("max_window_layers", 0, kMaxLayers, c.n_layers);
    for (int i = 0; i < c.n_layers; ++i) c.sliding_layers.push_back(on && i >= from);
  }
  bool any = c.sliding_layers.empty(), all = true;
  for (bool b : c.sliding_layers) any = any || b, all = all && b;
  if (!any) c.sliding_window = 0;             // one no layer uses (Qwen's, use_sliding_window off)
  if (!any || all) c.sliding_layers.clear();  // empty: every layer when the window is set
}

// Gemma 3's RoPE: full layers rope_theta (1e6) with rope_scaling, sliding layers plain
// rope_local_base_freq (1e4); transformers 5 writes both under rope_parameters by layer type.
void read_hf_gemma3_rope(const JsonFile& cj, ModelConfig& c) {
  const nlohmann::json& r = cj.root();
  c.rope_theta = static_cast<float>(cj.get_float("rope_theta", 1000000.0));
  c.rope_local_theta = static_cast<float>(cj.get_float("rope_local_base_freq", 10000.0));
  const bool nested = r.contains("rope_parameters") && r["rope_parameters"].is_object() &&
                      r["rope_parameters"].contains("full_attention");
  if (!nested) return;  // rope_scaling (read with the other families') is the full layers'
  const nlohmann::json& rp = r["rope_parameters"];
  auto theta = [&](const char* type, float& dst) {
    if (!rp.contains(type)) return;
    const nlohmann::json& o = rp[type];
    QLFT_CHECK_FORMAT(o.is_object(), "%s: rope_parameters.%s is not an object", cj.path().c_str(),
                      type);
    if (o.contains("rope_theta")) {
      QLFT_CHECK_FORMAT(o["rope_theta"].is_number(),
                        "%s: rope_parameters.%s.rope_theta is not a number", cj.path().c_str(),
                        type);
      dst = o["rope_theta"].get<float>();
    }
  };
  theta("full_attention", c.rope_theta);
  theta("sliding_attention", c.rope_local_theta);
  c.rope = rope_scaling_from_hf(nlohmann::json{{"rope_parameters", rp["full_attention"]}},
                                cj.path() + " (rope_parameters.full_attention)", c.context_length);
  if (rp.contains("sliding_attention")) {
    const RopeScaling local =
        rope_scaling_from_hf(nlohmann::json{{"rope_parameters", rp["sliding_attention"]}},
                             cj.path() + " (rope_parameters.sliding_attention)", c.context_length);
    QLFT_CHECK_FORMAT(!local.scaled(),
                      "%s: rope_parameters.sliding_attention scales RoPE (%s); qlft rotates "
                      "Gemma 3's sliding layers with a plain base",
                      cj.path().c_str(), rope_type_name(local.type));
  }
}

// Gemma's keys: the scores' scale, the soft-caps (null: none) and the MLP's activation, which
// must be the tanh-approximated GELU the runner computes.
void read_hf_gemma(const JsonFile& cj, ModelConfig& c) {
  c.gemma = true;
  auto opt = [&cj](const char* key, double def) {
    return cj.root().contains(key) && cj.root()[key].is_null() ? 0.0 : cj.get_float(key, def);
  };
  c.attn_scalar = static_cast<float>(opt("query_pre_attn_scalar", 256.0));  // transformers'
  if (c.arch == "gemma3_text") read_hf_gemma3_rope(cj, c);
  c.attn_softcap = static_cast<float>(opt("attn_logit_softcapping", 0.0));
  c.final_softcap = static_cast<float>(opt("final_logit_softcapping", 0.0));
  for (const char* key : {"hidden_activation", "hidden_act"}) {
    if (!cj.has(key) || cj.root()[key].is_null()) continue;
    const std::string act = cj.get_string(key, "");
    QLFT_CHECK_FORMAT(act == "gelu_pytorch_tanh" || act == "gelu_tanh",
                      "%s: %s is '%s'; qlft computes Gemma's MLP with gelu_pytorch_tanh",
                      cj.path().c_str(), key, act.c_str());
    break;
  }
  check_model_config(c, cj.path());  // the caps and bases read here
}

// The experts (ModelConfig::moe) as transformers reads them. Mixtral: every layer's MLP is
// num_local_experts experts of intermediate_size, num_experts_per_tok per row, renormalised.
// Qwen3-MoE: num_experts (transformers 5 writes num_local_experts) of moe_intermediate_size,
// renormalised only with norm_topk_prob, on layer l unless l is in mlp_only_layers or
// (l + 1) % decoder_sparse_step != 0 (a dense MLP of intermediate_size there).
void read_hf_moe(const JsonFile& cj, ModelConfig& c) {
  ModelConfig::Moe& m = c.moe;
  const bool qwen = c.arch == "qwen3_moe";
  const char* count = qwen && cj.has("num_experts") ? "num_experts" : "num_local_experts";
  m.n_experts = static_cast<int>(cj.get_int_in(count, 1, 4096, qwen ? 128 : 8));
  m.top_k = static_cast<int>(cj.get_int_in("num_experts_per_tok", 1, m.n_experts, qwen ? 8 : 2));
  m.expert_ffn = qwen ? cj.get_int_in("moe_intermediate_size", 1, kMaxDim, 768) : c.ffn_dim;
  m.norm_topk = qwen ? cj.get_bool("norm_topk_prob", false) : true;
  m.aux_coef = static_cast<float>(cj.get_float("router_aux_loss_coef", 0.001));
  m.aux_loss = cj.get_bool("output_router_logits", false);
  if (qwen) {
    const int64_t step = cj.get_int_in("decoder_sparse_step", 1, kMaxLayers, 1);
    std::vector<bool> dense(size_t(c.n_layers), false);
    const nlohmann::json& r = cj.root();
    if (r.contains("mlp_only_layers") && !r["mlp_only_layers"].is_null()) {
      QLFT_CHECK_FORMAT(r["mlp_only_layers"].is_array(), "%s: mlp_only_layers is not a list",
                        cj.path().c_str());
      for (const nlohmann::json& v : r["mlp_only_layers"]) {
        QLFT_CHECK_FORMAT(
            v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < c.n_layers,
            "%s: mlp_only_layers holds %s, not a layer of %d", cj.path().c_str(), v.dump().c_str(),
            c.n_layers);
        dense[size_t(v.get<int64_t>())] = true;
      }
    }
    bool all = true;
    for (int l = 0; l < c.n_layers; ++l) {
      m.layers.push_back(!dense[size_t(l)] && (l + 1) % step == 0);
      all = all && m.layers.back();
    }
    if (all) m.layers.clear();  // empty: every layer
  }
  // Jitter multiplies the router's input by noise in training: a model trained with it would
  // not follow transformers' deterministic routing.
  const double jitter = cj.get_float("router_jitter_noise", 0.0);
  QLFT_CHECK_FORMAT(jitter == 0.0,
                    "%s: router_jitter_noise is %g; qlft routes without jitter (set it 0)",
                    cj.path().c_str(), jitter);
  check_model_config(c, cj.path());
}

// Gemma 3's image-text checkpoint (Gemma3ForConditionalGeneration, model_type gemma3): its
// text model's configuration is text_config with Gemma3TextConfig's defaults (transformers 5.23)
// for the keys it leaves out (google/gemma-3-12b-it lists eight); the head is tied unless the
// top level's tie_word_embeddings (Gemma3Config's, which transformers ties by) says otherwise.
JsonFile hf_text_config(const JsonFile& cj) {
  const nlohmann::json& r = cj.root();
  QLFT_CHECK_FORMAT(r.contains("text_config") && r["text_config"].is_object(),
                    "%s: Gemma3ForConditionalGeneration without a text_config object",
                    cj.path().c_str());
  nlohmann::json t = {{"vocab_size", 262208},      {"hidden_size", 2304},
                      {"intermediate_size", 9216}, {"num_hidden_layers", 26},
                      {"num_attention_heads", 8},  {"num_key_value_heads", 4},
                      {"head_dim", 256},           {"max_position_embeddings", 131072},
                      {"sliding_window", 4096}};
  for (const auto& [k, v] : r["text_config"].items()) t[k] = v;
  const std::string type = t.value("model_type", std::string("gemma3_text"));
  QLFT_CHECK_FORMAT(type == "gemma3_text", "%s: text_config.model_type is '%s', not gemma3_text",
                    cj.path().c_str(), type.c_str());
  t["architectures"] = {"Gemma3ForCausalLM"};
  t["model_type"] = "gemma3_text";
  t["tie_word_embeddings"] =
      r.contains("tie_word_embeddings") && r["tie_word_embeddings"].is_boolean()
          ? r["tie_word_embeddings"].get<bool>()
          : true;
  return JsonFile::parse(t.dump(), cj.path() + " (text_config)");
}

}  // namespace

std::string hf_moe_tensor(const ModelConfig& c, int l, int e, int which, bool weight) {
  // Mixtral: block_sparse_moe.gate, experts.{e}.w1 / w2 / w3 (transformers 5 writes its fused
  // in-memory experts back in this form); Qwen3-MoE: mlp.gate, experts.{e}.gate_proj /
  // down_proj / up_proj.
  const bool mixtral = c.arch == "mixtral";
  std::string n = "model.layers." + std::to_string(l) + (mixtral ? ".block_sparse_moe." : ".mlp.");
  if (e < 0) return n + "gate" + (weight ? ".weight" : "");
  static const char* const kMixtral[] = {"", "w1", "w2", "w3"};
  static const char* const kQwen[] = {"", "gate_proj", "down_proj", "up_proj"};
  n += "experts." + std::to_string(e) + "." + (mixtral ? kMixtral : kQwen)[which];
  return weight ? n + ".weight" : n;
}

namespace {

std::string hf_class_of(const JsonFile& cj) {
  const nlohmann::json& r = cj.root();
  if (r.contains("architectures") && r["architectures"].is_array() && !r["architectures"].empty() &&
      r["architectures"][0].is_string())
    return r["architectures"][0].get<std::string>();
  return "";
}

// What a text model's config.json states; tie_explicit: whether it names tie_word_embeddings.
ModelConfig read_hf_text_config(const JsonFile& cj, bool& tie_explicit) {
  ModelConfig c;
  const std::string arch_name = hf_class_of(cj);
  const std::string model_type = cj.get_string("model_type", "");
  const ArchFamily* fam = find_family_hf(arch_name, model_type);
  if (!fam)
    throw_error(QLFT_ERR_UNSUPPORTED, "%s: %s", cj.path().c_str(),
                unsupported_architecture(arch_name, model_type).c_str());
  c.arch = fam->name;
  c.dim = static_cast<int>(cj.get_int_in("hidden_size", 1, kMaxDim));
  c.ffn_dim = static_cast<int>(cj.get_int_in("intermediate_size", 1, kMaxDim));
  c.n_layers = static_cast<int>(cj.get_int_in("num_hidden_layers", 1, kMaxLayers));
  c.n_heads = static_cast<int>(cj.get_int_in("num_attention_heads", 1, kMaxHeads));
  c.n_kv_heads = static_cast<int>(cj.get_int_in("num_key_value_heads", 1, kMaxHeads, c.n_heads));
  c.vocab = static_cast<int>(cj.get_int_in("vocab_size", 1, kMaxVocab));
  c.context_length =
      static_cast<int>(cj.get_int_in("max_position_embeddings", 1, kMaxContext, 2048));
  c.rms_eps = static_cast<float>(cj.get_float("rms_norm_eps", 1e-6));
  c.rope_theta = static_cast<float>(cj.get_float("rope_theta", 10000.0));
  // transformers >= 5 writes {"rope_parameters": {"rope_theta": ...}} instead of rope_theta.
  if (!cj.has("rope_theta") && cj.root().contains("rope_parameters")) {
    const nlohmann::json& rp = cj.root()["rope_parameters"];
    if (rp.is_object() && rp.contains("rope_theta") && rp["rope_theta"].is_number())
      c.rope_theta = rp["rope_theta"].get<float>();
  }
  c.rope = rope_scaling_from_hf(cj.root(), cj.path(), c.context_length);
  QLFT_CHECK_FORMAT(c.n_heads > 0 && c.dim % c.n_heads == 0,
                    "%s: hidden_size %d is not a multiple of num_attention_heads %d",
                    cj.path().c_str(), c.dim, c.n_heads);
  c.head_dim = static_cast<int>(cj.get_int_in("head_dim", 1, kMaxHeadDim, c.dim / c.n_heads));
  QLFT_CHECK_FORMAT(
      c.rope.short_factor.empty() || c.rope.short_factor.size() == size_t(c.head_dim / 2),
      "%s: the longrope short_factor / long_factor lists have %zu values; head_dim "
      "%d needs %d",
      cj.path().c_str(), c.rope.short_factor.size(), c.head_dim, c.head_dim / 2);
  QLFT_CHECK_FORMAT(c.n_heads % c.n_kv_heads == 0,
                    "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d",
                    cj.path().c_str(), c.n_heads, c.n_kv_heads);
  QLFT_CHECK_FORMAT(c.rms_eps > 0 && c.rms_eps < 1, "%s: rms_norm_eps %g is out of range",
                    cj.path().c_str(), c.rms_eps);
  QLFT_CHECK_FORMAT(c.rope_theta > 0, "%s: rope_theta %g must be positive", cj.path().c_str(),
                    c.rope_theta);
  // transformers' default: Gemma's configs tie the head unless they say otherwise.
  c.tied_embeddings = cj.get_bool("tie_word_embeddings", fam->gemma);
  tie_explicit = cj.has("tie_word_embeddings");
  c.rope_adjacent = false;
  check_model_config(c, cj.path());
  QLFT_CHECK_FORMAT(c.vocab > 0, "%s: vocab_size must be positive", cj.path().c_str());

  // q/k/v biases: always for some families (qwen2); llama only with attention_bias (o_proj
  // bias unsupported).
  c.qkv_bias = fam->qkv_bias || cj.get_bool("attention_bias", false);
  c.qk_norm = fam->qk_norm;
  if (fam->gemma) read_hf_gemma(cj, c);
  read_hf_sliding_window(cj, *fam, c);
  if (fam->moe) read_hf_moe(cj, c);
  return c;
}

}  // namespace

ModelConfig read_hf_config(const JsonFile& cj, const std::string& weights,
                           std::unique_ptr<SafetensorsSet>* st_out) {
  // Gemma 3's image-text model trains as its text model (text_config); the vision tower and
  // the projector are not loaded.
  const bool image_text = cj.get_string("model_type", "") == "gemma3" ||
                          hf_class_of(cj) == "Gemma3ForConditionalGeneration";
  bool tie_explicit = false;
  ModelConfig c = read_hf_text_config(image_text ? hf_text_config(cj) : cj, tie_explicit);
  c.image_text = image_text;
  if (image_text) c.hf_prefix = "model.language_model.";
  if (!st_out) return c;  // config.json alone (planning without weights): it says all
  *st_out = SafetensorsSet::open(weights);
  const SafetensorsSet& st = **st_out;
  if (image_text && !st.find("model.language_model.embed_tokens.weight") &&
      st.find("language_model.model.embed_tokens.weight")) {
    c.hf_prefix = "language_model.model.";  // before transformers 5
    c.hf_head = "language_model.lm_head.weight";
  }
  c.qkv_bias = c.qkv_bias || st.find(c.hf_prefix + "layers.0.self_attn.q_proj.bias") != nullptr;
  return tie_missing_head(c, st.find(c.hf_head) != nullptr, tie_explicit, dirname_of(cj.path()),
                          c.hf_head);
}

namespace {

class HfLoader final : public FormatLoader {
 public:
  using FormatLoader::FormatLoader;

  void read_config(const std::string& path) override {
    const std::string dir = is_dir(path) ? path : dirname_of(path);
    m_.hf_dir = dir;
    JsonFile cj = JsonFile::load(dir + "/config.json");
    m_.cfg = read_hf_config(cj, is_dir(path) ? dir : path, &st_);
  }

  void embedding(QWeight& w, bool head) override {
    w = float_weight(head ? m_.cfg.hf_head : m_.cfg.hf_prefix + "embed_tokens.weight", m_.cfg.vocab,
                     m_.cfg.dim);
  }
  void norm(Buffer& dst, int l, NormRole r, int64_t n) override {
    if (r == NormRole::Final) {
      dst = vector(m_.cfg.hf_prefix + "norm.weight", n);
      if (m_.cfg.gemma) gemma_norm_weights(dst, n);
      return;
    }
    // Gemma's post_attention_layernorm is the norm after attention; its pre-MLP norm is
    // pre_feedforward_layernorm.
    const bool g = m_.cfg.gemma;
    const char* name = r == NormRole::Attn       ? "input_layernorm.weight"
                       : r == NormRole::Ffn      ? (g ? "pre_feedforward_layernorm.weight"
                                                      : "post_attention_layernorm.weight")
                       : r == NormRole::PostAttn ? "post_attention_layernorm.weight"
                       : r == NormRole::PostFfn  ? "post_feedforward_layernorm.weight"
                       : r == NormRole::Q        ? "self_attn.q_norm.weight"
                                                 : "self_attn.k_norm.weight";
    dst = vector(layer(l) + name, n);
    if (g) gemma_norm_weights(dst, n);
  }
  void linear(QWeight& w, int l, Proj p, const ProjShape& s) override {
    if (fused_ && p != Proj::O && p != Proj::Down) {
      // Phi-3: q / k / v are row blocks of self_attn.qkv_proj, gate / up of mlp.gate_up_proj.
      const ModelShapes& sh = m_.shapes;
      const bool att = p <= Proj::V;
      const int64_t q = sh.proj(l, Proj::Q).out, k = sh.proj(l, Proj::K).out;
      const int64_t total = att ? q + k + sh.proj(l, Proj::V).out : 2 * s.out;
      const int64_t row0 = p == Proj::K ? q : p == Proj::V ? q + k : p == Proj::Up ? s.out : 0;
      const std::string name = layer(l) + (att ? "self_attn.qkv_proj" : "mlp.gate_up_proj");
      const SafeTensorInfo& t = tensor(name + ".weight", total, s.in);
      w = stored_weight(t, t.data + row0 * s.in * int64_t(dtype_size(t.dtype)), s.out, s.in);
      return;
    }
    w = linear_weight(proj_prefix(l, p), s.out, s.in);
  }
  void bias(Buffer& dst, int l, Proj p, int64_t n) override {
    dst = vector(proj_prefix(l, p) + ".bias", n);
  }
  void moe(MoeWeights& w, int l, const LayerShapes& s) override {
    const ModelConfig& c = m_.cfg;
    w.router = float_weight(hf_moe_tensor(c, l, -1, 0), s.n_experts, s.norm);
    for (int e = 0; e < s.n_experts; ++e) {
      w.w1[size_t(e)] = linear_weight(hf_moe_tensor(c, l, e, 1, false), s.expert_ffn, s.norm);
      w.w3[size_t(e)] = linear_weight(hf_moe_tensor(c, l, e, 3, false), s.expert_ffn, s.norm);
      w.w2[size_t(e)] = linear_weight(hf_moe_tensor(c, l, e, 2, false), s.norm, s.expert_ffn);
    }
  }

  // The embedding (head: the untied head) as stored (WeightGroupSource::stored_rows), and its
  // rows [r0, r0 + n) in that format (f64 converted to f32).
  QWeight stored_rows(bool head) override {
    const ModelConfig& c = m_.cfg;
    const SafeTensorInfo& t =
        tensor(head ? c.hf_head : c.hf_prefix + "embed_tokens.weight", c.vocab, c.dim);
    QWeight w;
    w.rows = c.vocab;
    w.cols = c.dim;
    if (t.dtype == DType::F16) w.kind = QuantKind::F16;
    if (t.dtype == DType::BF16) w.kind = QuantKind::BF16;
    return w;
  }
  void stored_row_bytes_of(bool head, int64_t r0, int64_t n, void* out) override {
    const ModelConfig& c = m_.cfg;
    const SafeTensorInfo& t =
        tensor(head ? c.hf_head : c.hf_prefix + "embed_tokens.weight", c.vocab, c.dim);
    const int64_t es = int64_t(dtype_size(t.dtype));
    const uint8_t* at = t.data + r0 * c.dim * es;
    if (t.dtype == DType::F64)
      to_f32_n(t.dtype, at, static_cast<float*>(out), size_t(n * c.dim));
    else
      std::memcpy(out, at, size_t(n * c.dim * es));
  }

 private:
  std::string layer(int l) const { return m_.cfg.hf_prefix + "layers." + std::to_string(l) + "."; }
  std::string proj_prefix(int l, Proj p) const {
    return layer(l) + (p <= Proj::O ? "self_attn." : "mlp.") + proj_peft_name(p);
  }
  const SafeTensorInfo& tensor(const std::string& name, int64_t rows, int64_t cols) {
    const SafeTensorInfo* t = st_->find(name);
    QLFT_CHECK_FORMAT(t, "%s: tensor '%s' is missing", m_.hf_dir.c_str(), name.c_str());
    bool ok = cols < 0 ? (t->shape.size() == 1 && t->shape[0] == rows)
                       : (t->shape.size() == 2 && t->shape[0] == rows && t->shape[1] == cols);
    if (!ok) {
      std::string have, want = std::to_string(rows);
      for (int64_t d : t->shape) have += (have.empty() ? "" : ", ") + std::to_string(d);
      if (cols >= 0) want += ", " + std::to_string(cols);
      throw_error(QLFT_ERR_FORMAT, "%s: tensor '%s' has shape [%s], expected [%s]",
                  t->file->c_str(), name.c_str(), have.c_str(), want.c_str());
    }
    switch (t->dtype) {
      case DType::F32:
      case DType::F16:
      case DType::BF16:
      case DType::F64:
        break;
      default:
        throw_error(QLFT_ERR_FORMAT, "%s: tensor '%s' has dtype %s, expected a float type",
                    t->file->c_str(), name.c_str(), dtype_name(t->dtype));
    }
    return *t;
  }

  Buffer vector(const std::string& name, int64_t n) {
    const SafeTensorInfo& t = tensor(name, n, -1);
    Buffer b(tracker_, MemCategory::Weights, n * 4, name.c_str());
    to_f32_n(t.dtype, t.data, b.as<float>(), n);
    return b;
  }
  QWeight float_weight(const std::string& name, int64_t rows, int64_t cols) {
    const SafeTensorInfo& t = tensor(name, rows, cols);
    QWeight w;
    w.kind = QuantKind::F32;
    w.rows = rows;
    w.cols = cols;
    w.data = Buffer(tracker_, MemCategory::Weights, rows * cols * 4, name.c_str());
    to_f32_n(t.dtype, t.data, w.data.as<float>(), rows * cols);
    return w;
  }
  QWeight linear_weight(const std::string& prefix, int64_t rows, int64_t cols) {
    QWeight w;
    if (load_bnb_weight(tracker_, *st_, prefix, rows, cols, &w)) return w;
    const SafeTensorInfo& t = tensor(prefix + ".weight", rows, cols);
    return stored_weight(t, t.data, rows, cols);
  }
  // The [rows, cols] matrix of t's elements from `at` (all of t, or a fused tensor's row block):
  // kept (quant.type=keep: f16 / bf16 as stored, else f32) or quantized.
  QWeight stored_weight(const SafeTensorInfo& t, const uint8_t* at, int64_t rows, int64_t cols) {
    QWeight w;
    const int64_t n = rows * cols;
    if (opt_.quant_type == QuantType::Keep) {
      w.rows = rows;
      w.cols = cols;
      if (t.dtype == DType::F16 || t.dtype == DType::BF16) {
        w.kind = t.dtype == DType::F16 ? QuantKind::F16 : QuantKind::BF16;
        w.data = Buffer(tracker_, MemCategory::Weights, n * 2, t.name.c_str());
        std::memcpy(w.data.data(), at, size_t(n) * 2);
        return w;
      }
      w.kind = QuantKind::F32;
      w.data = Buffer(tracker_, MemCategory::Weights, n * 4, t.name.c_str());
      to_f32_n(t.dtype, at, w.data.as<float>(), n);
      return w;
    }
    Buffer tmp(tracker_, MemCategory::Workspace, n * 4, "load staging");
    to_f32_n(t.dtype, at, tmp.as<float>(), n);
    require_finite(tmp.as<float>(), n, t.file->c_str(), t.name);
    return qweight_from_f32(tracker_, tmp.as<float>(), rows, cols, target_kind(opt_),
                            opt_.blocksize, opt_.double_quant);
  }

  std::unique_ptr<SafetensorsSet> st_;
};

}  // namespace

std::unique_ptr<FormatLoader> make_hf_loader(MemoryTracker* t, const LoadOptions& o, Model& m) {
  return std::make_unique<HfLoader>(t, o, m);
}

}  // namespace qlft
