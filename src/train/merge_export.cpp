#include "train/merge_export.h"

#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>

#include "arch/families.h"
#include "core/error.h"
#include "formats/atomic_file.h"
#include "formats/gguf_writer.h"
#include "formats/safetensors_writer.h"

namespace qlft {

namespace {

std::vector<float> dequant(const QWeight& w) {
  std::vector<float> out(static_cast<size_t>(w.rows) * w.cols);
  if (w.rows) w.dequantize_rows(0, w.rows, out.data());
  return out;
}

std::vector<float> copy_f32(const Buffer& b) {
  const float* p = b.as<float>();
  return std::vector<float>(p, p + b.size() / sizeof(float));
}

bool is_qk(Proj p) {
  return p == Proj::Q || p == Proj::K;
}

// Reorders q/k rows (or a q/k bias, cols = 1) from the model's order into the wanted one.
void to_order(const ModelShapes& s, Proj p, std::vector<float>& w, int64_t cols,
              bool want_adjacent) {
  if (!is_qk(p) || s.qk_adjacent == want_adjacent) return;
  std::vector<float> out(w.size());
  if (want_adjacent)
    permute_rows_hf_to_adjacent(w.data(), out.data(), s.heads_of(p), s.head_dim, cols);
  else
    permute_rows_adjacent_to_hf(w.data(), out.data(), s.heads_of(p), s.head_dim, cols);
  w.swap(out);
}

void make_dir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
    throw_error(QLFT_ERR_IO, "%s: cannot create directory: %s", dir.c_str(), std::strerror(errno));
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw_error(QLFT_ERR_IO, "%s: exists and is not a directory", dir.c_str());
}

// The shortest decimal of a float as a double (1e-05, not 9.999999747378752e-06).
double short_double(float f) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(f));
  for (int prec = 1; prec <= 9; ++prec) {
    char t[32];
    std::snprintf(t, sizeof t, "%.*g", prec, static_cast<double>(f));
    if (std::strtof(t, nullptr) == f) return std::strtod(t, nullptr);
  }
  return std::strtod(buf, nullptr);
}

const char* const kHfProj[kProjCount] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                         "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                         "mlp.down_proj"};
const char* const kBiasProj[3] = {"q_proj", "k_proj", "v_proj"};

// A fused family's (ArchFamily::fused: phi3) q / k / v and gate / up merged weights gathered
// into one matrix each, as its files store them: on() takes a projection's rows (true when it is
// one of a fused block), take() hands the block over once its last part (V, Up) is in.
struct FusedRows {
  bool fused = false;
  std::vector<float> rows_data;
  int64_t rows = 0;
  bool on(Proj p, const std::vector<float>& t, int64_t n) {
    if (!fused || p == Proj::O || p == Proj::Down) return false;
    rows_data.insert(rows_data.end(), t.begin(), t.end());
    rows += n;
    return true;
  }
  std::vector<float> take() {
    std::vector<float> out = std::move(rows_data);
    rows_data.clear();
    rows = 0;
    return out;
  }
};

namespace {
// Layer l's router (which -1) or expert e's w1 (gate) / w2 (down) / w3 (up) with its LoRA
// folded in: W + scale B_e A_e (gate and up: the rows of the fused gate_up's B they own).
std::vector<float> merged_moe_weight(const Model& m, const LoraAdapter* lora, int l, int e,
                                     int which) {
  const MoeWeights& mw = m.layers[size_t(l)].moe;
  const QWeight& q = which < 0    ? mw.router
                     : which == 1 ? mw.w1[size_t(e)]
                     : which == 2 ? mw.w2[size_t(e)]
                                  : mw.w3[size_t(e)];
  std::vector<float> w = dequant(q);
  const MoePart p = which < 0 ? MoePart::Router : which == 2 ? MoePart::Down : MoePart::GateUp;
  if (!lora || !lora->moe_active(l, p)) return w;
  const MoeLoraSlot& s = lora->moe_slot(l, p);
  const int64_t row0 = which == 3 ? q.rows : 0, ex = which < 0 ? 0 : e;
  QLFT_CHECK_ARG(s.in == q.cols && row0 + q.rows <= s.out,
                 "merged export: layer %d %s LoRA is [%lld, %lld] but the weight [%lld, %lld]", l,
                 moe_part_name(p), (long long)s.out, (long long)s.in, (long long)q.rows,
                 (long long)q.cols);
  const float* A = s.A.as<float>() + ex * s.r * s.in;
  const float* B = s.B.as<float>() + (ex * s.out + row0) * s.r;
  for (int64_t o = 0; o < q.rows; ++o)
    for (int k = 0; k < s.r; ++k) {
      const float b = s.scale * B[o * s.r + k];
      for (int64_t i = 0; i < s.in; ++i) w[size_t(o * s.in + i)] += b * A[k * s.in + i];
    }
  return w;
}
}  // namespace

void export_safetensors(const Model& m, const LoraAdapter* lora, const std::string& dir) {
  if (!m.cfg.rope.freq_divisors.empty())
    throw_error(QLFT_ERR_UNSUPPORTED,
                "merged safetensors export: the model's RoPE scaling is GGUF's rope_freqs.weight "
                "(llama.cpp's llama3 form), which has no transformers config; export to GGUF "
                "instead");
  const ModelConfig& c = m.cfg;
  FusedRows fused;
  fused.fused = find_family(c.arch) && find_family(c.arch)->fused;
  make_dir(dir);
  SafetensorsWriter w;
  w.set_metadata("format", "pt");
  std::vector<float> t = dequant(m.tok_embd);
  w.add_tensor_f32("model.embed_tokens.weight", {m.tok_embd.rows, m.tok_embd.cols}, t.data());
  if (m.output.rows) {
    t = dequant(m.output);
    w.add_tensor_f32("lm_head.weight", {m.output.rows, m.output.cols}, t.data());
  }
  // Gemma's norms are held as 1 + w (model_load_internal.h); its files store w.
  auto norm = [&](const std::string& name, const Buffer& b) {
    std::vector<float> v = copy_f32(b);
    if (c.gemma)
      for (float& x : v) x -= 1.f;
    w.add_tensor_f32(name, {static_cast<int64_t>(v.size())}, v.data());
  };
  norm("model.norm.weight", m.output_norm);
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& L = m.layers[l];
    const std::string h = "model.layers." + std::to_string(l) + ".";
    norm(h + "input_layernorm.weight", L.attn_norm);
    if (c.gemma) {  // its post_attention_layernorm follows attention; the MLP's are pre / post
      norm(h + "post_attention_layernorm.weight", L.post_attn_norm);
      norm(h + "pre_feedforward_layernorm.weight", L.ffn_norm);
      norm(h + "post_feedforward_layernorm.weight", L.post_ffn_norm);
    } else {
      norm(h + "post_attention_layernorm.weight", L.ffn_norm);
    }
    if (!L.moe.w1.empty()) {  // the router and experts (frozen), as the family's files name them
      t = merged_moe_weight(m, lora, l, 0, -1);
      w.add_tensor_f32(hf_moe_tensor(c, l, -1, 0), {L.moe.router.rows, L.moe.router.cols},
                       t.data());
      for (size_t e = 0; e < L.moe.w1.size(); ++e)
        for (const auto& [which, q] : {std::pair<int, const QWeight*>{1, &L.moe.w1[e]},
                                       {2, &L.moe.w2[e]},
                                       {3, &L.moe.w3[e]}}) {
          t = merged_moe_weight(m, lora, l, int(e), which);
          w.add_tensor_f32(hf_moe_tensor(c, l, int(e), which), {q->rows, q->cols}, t.data());
        }
    }
    for (int pi = 0; pi < kProjCount; ++pi) {
      Proj p = static_cast<Proj>(pi);
      const QWeight& q = L.proj[pi];
      if (!q.rows) continue;  // (an MoE layer's dense MLP)
      t = merged_weight(m, lora, l, p);
      to_order(m.shapes, p, t, q.cols, false);
      if (fused.on(p, t, q.rows)) {  // phi3: q / k / v and gate / up as row blocks of one
        if (p == Proj::V || p == Proj::Up) {
          const int64_t rows = fused.rows;
          w.add_tensor_f32(
              h + (p == Proj::V ? "self_attn.qkv_proj" : "mlp.gate_up_proj") + ".weight",
              {rows, q.cols}, fused.take().data());
        }
        continue;
      }
      w.add_tensor_f32(h + kHfProj[pi] + ".weight", {q.rows, q.cols}, t.data());
      if (pi < 3 && !L.bias[pi].empty()) {
        t = copy_f32(L.bias[pi]);
        to_order(m.shapes, p, t, 1, false);
        w.add_tensor_f32(h + "self_attn." + kBiasProj[pi] + ".bias", {q.rows}, t.data());
      }
    }
    if (!L.q_norm.empty()) {  // qwen3's and gemma3's per-head norms
      norm(h + "self_attn.q_norm.weight", L.q_norm);
      norm(h + "self_attn.k_norm.weight", L.k_norm);
    }
  }
  const ArchFamily* fam = find_family(c.arch);
  QLFT_CHECK_ARG(fam, "merged safetensors export: architecture '%s' is not supported",
                 c.arch.c_str());
  nlohmann::json j = {
      {"architectures", {fam->hf_class}},
      {"model_type", c.arch},
      {"hidden_size", c.dim},
      {"intermediate_size", c.ffn_dim},
      {"num_hidden_layers", c.n_layers},
      {"num_attention_heads", c.n_heads},
      {"num_key_value_heads", c.n_kv_heads},
      {"head_dim", c.head_dim},
      {"vocab_size", c.vocab},
      {"rms_norm_eps", short_double(c.rms_eps)},
      {"rope_theta", short_double(c.rope_theta)},
      {"max_position_embeddings", c.context_length > 0 ? c.context_length : 2048},
      {"tie_word_embeddings", m.output.rows == 0},
      {"hidden_act", "silu"},
      {"torch_dtype", "float32"},
  };
  if (!fam->qkv_bias) j["attention_bias"] = c.qkv_bias;
  if (c.gemma) {  // Gemma 2's keys (null: no cap)
    j.erase("hidden_act");
    j["hidden_activation"] = "gelu_pytorch_tanh";
    // An integer where it is one: transformers' Gemma2Config types it int.
    const float qp = c.attn_scalar > 0 ? c.attn_scalar : static_cast<float>(c.head_dim);
    j["query_pre_attn_scalar"] = qp == std::floor(qp) ? nlohmann::json(static_cast<int64_t>(qp))
                                                      : nlohmann::json(short_double(qp));
    j["attn_logit_softcapping"] =
        c.attn_softcap > 0 ? nlohmann::json(short_double(c.attn_softcap)) : nlohmann::json();
    j["final_logit_softcapping"] =
        c.final_softcap > 0 ? nlohmann::json(short_double(c.final_softcap)) : nlohmann::json();
  }
  if (c.moe.n_experts > 0) {
    j["num_local_experts"] = c.moe.n_experts;
    j["num_experts_per_tok"] = c.moe.top_k;
    j["router_aux_loss_coef"] = short_double(c.moe.aux_coef);
    j["output_router_logits"] = c.moe.aux_loss;
  }
  if (c.arch == "qwen3_moe") {  // its experts' width, weights and dense layers
    j["num_experts"] = c.moe.n_experts;
    j["moe_intermediate_size"] = c.moe.expert_ffn;
    j["norm_topk_prob"] = c.moe.norm_topk;
    j["decoder_sparse_step"] = 1;
    nlohmann::json dense = nlohmann::json::array();
    for (int l = 0; l < c.n_layers; ++l)
      if (!c.layer_moe(l)) dense.push_back(l);
    j["mlp_only_layers"] = dense;
  }
  if (c.sliding_window > 0) {  // as transformers 5 reads it: the window and each layer's type
    j["sliding_window"] = c.sliding_window;
    j["use_sliding_window"] = true;  // Qwen's switch (layer_types decides)
    nlohmann::json types = nlohmann::json::array();
    for (int l = 0; l < c.n_layers; ++l)
      types.push_back(c.layer_slides(l) ? "sliding_attention" : "full_attention");
    j["layer_types"] = types;
  }
  // RoPE scaling as transformers 5 writes it (rope_parameters) and, when scaled, as older
  // readers expect it (rope_scaling beside rope_theta); transformers takes rope_scaling first.
  j["rope_parameters"] = rope_parameters_json(c);
  j["rope_parameters"]["rope_theta"] = short_double(c.rope_theta);
  if (c.rope.type != RopeType::Default) j["rope_scaling"] = rope_scaling_json(c);
  if (c.rope.type == RopeType::LongRope)  // Phi-3 reads its pretraining length from the root
    j["original_max_position_embeddings"] = c.rope.original_context;
  if (c.rope_local_theta > 0) {  // gemma3: per layer type, full layers' as above
    const nlohmann::json full = j["rope_parameters"];
    j["rope_parameters"] = {
        {"full_attention", full},
        {"sliding_attention",
         {{"rope_type", "default"}, {"rope_theta", short_double(c.rope_local_theta)}}}};
    j.erase("rope_scaling");
  }
  if (m.gguf) {  // special token ids, so generation stops where the source model's does
    int64_t bos = m.gguf->get_int("tokenizer.ggml.bos_token_id", -1);
    int64_t eos = m.gguf->get_int("tokenizer.ggml.eos_token_id", -1);
    if (bos >= 0) j["bos_token_id"] = bos;
    if (eos >= 0) j["eos_token_id"] = eos;
  }
  w.write(dir + "/model.safetensors");
  write_file_atomic(dir + "/config.json", j.dump(2) + "\n");
  // An HF source's tokenizer travels with the merged model.
  if (!m.hf_dir.empty() && m.hf_dir != dir) {
    for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                          "generation_config.json", "tokenizer.model"}) {
      std::ifstream in(m.hf_dir + "/" + f, std::ios::binary);
      if (!in) continue;
      std::stringstream ss;
      ss << in.rdbuf();
      write_file_atomic(dir + "/" + f, ss.str());
    }
  }
}

// RoPE scaling as llama.cpp's converter writes it: linear and yarn as rope.scaling.* keys, llama3
// as the tensor rope_freqs.weight (per-pair divisors of the plain frequencies, computed here from
// our table so llama.cpp rotates as transformers does). llama.cpp has no dynamic NTK and always
// truncates yarn's ramp: those are refused rather than written as another model.
void add_rope_scaling(GgufWriter& w, const std::string& a, const ModelConfig& c) {
  const RopeScaling& s = c.rope;
  switch (s.type) {
    case RopeType::Default:
    case RopeType::Llama3:  // rope_freqs.weight (export_gguf)
      return;
    case RopeType::Linear:
      w.add_string(a + "rope.scaling.type", "linear");
      w.add_f32(a + "rope.scaling.factor", static_cast<float>(s.factor));
      return;
    case RopeType::Yarn: {
      if (!s.truncate)
        throw_error(QLFT_ERR_UNSUPPORTED,
                    "merged GGUF export: yarn RoPE scaling with truncate = false has no GGUF form");
      w.add_string(a + "rope.scaling.type", "yarn");
      w.add_f32(a + "rope.scaling.factor", static_cast<float>(s.factor));
      w.add_u32(a + "rope.scaling.original_context_length",
                static_cast<uint32_t>(s.original_context));
      w.add_f32(a + "rope.scaling.yarn_beta_fast", static_cast<float>(s.beta_fast));
      w.add_f32(a + "rope.scaling.yarn_beta_slow", static_cast<float>(s.beta_slow));
      // llama.cpp multiplies attn_factor by 1 + 0.1 ln(factor) itself.
      RopeScaling plain = s;
      plain.has_attention_factor = false;
      plain.mscale = plain.mscale_all_dim = 0;
      const double ratio = rope_attention_factor(s) / rope_attention_factor(plain);
      if (ratio != 1.0) w.add_f32(a + "rope.scaling.attn_factor", static_cast<float>(ratio));
      return;
    }
    case RopeType::Dynamic:
      throw_error(QLFT_ERR_UNSUPPORTED,
                  "merged GGUF export: dynamic NTK RoPE scaling has no GGUF (llama.cpp) form; "
                  "export to safetensors instead");
    case RopeType::LongRope:  // llama.cpp's Phi-3 form: no type; the factors are tensors
      w.add_u32(a + "rope.scaling.original_context_length",
                static_cast<uint32_t>(s.original_context));
      w.add_f32(a + "rope.scaling.attn_factor", static_cast<float>(rope_attention_factor(s)));
      return;
  }
}

// llama3 scaling as llama.cpp's rope_freqs.weight: plain inverse frequency / scaled one.
std::vector<float> llama3_divisors(const ModelConfig& c) {
  const RopeFreqs plain = RopeFreqs::plain(c.rope_theta, c.head_dim);
  const RopeFreqs scaled = rope_freqs(c, 0);
  std::vector<float> d(plain.inv_freq.size());
  for (size_t i = 0; i < d.size(); ++i) d[i] = plain.inv_freq[i] / scaled.inv_freq[i];
  return d;
}

void export_gguf(const Model& m, const LoraAdapter* lora, const std::string& path, bool bf16) {
  const ModelConfig& c = m.cfg;
  FusedRows fused;
  fused.fused = find_family(c.arch) && find_family(c.arch)->fused;
  const GgmlType store = bf16 ? GgmlType::BF16 : GgmlType::F16;
  GgufWriter w;
  // llama.cpp's name of the family (its converter writes Mistral models as "llama").
  const ArchFamily* fam = find_family(c.arch);
  QLFT_CHECK_ARG(fam, "merged GGUF export: architecture '%s' is not supported", c.arch.c_str());
  const std::string arch = fam->gguf_arch;
  const bool g3 = arch == "gemma3";
  QLFT_CHECK_ARG(c.rope_local_theta == 0 || g3,
                 "merged GGUF export: %s's per-layer RoPE bases have no GGUF form qlft writes; "
                 "export as safetensors",
                 c.arch.c_str());
  const std::string a = arch + ".";
  w.add_string("general.architecture", arch);
  w.add_string("general.name", "qlft merged model");
  w.add_u32("general.file_type", bf16 ? 32u : 1u);  // llama_ftype MOSTLY_BF16 / MOSTLY_F16
  w.add_u32(a + "context_length",
            static_cast<uint32_t>(c.context_length > 0 ? c.context_length : 2048));
  w.add_u32(a + "embedding_length", static_cast<uint32_t>(c.dim));
  w.add_u32(a + "block_count", static_cast<uint32_t>(c.n_layers));
  w.add_u32(a + "feed_forward_length", static_cast<uint32_t>(c.ffn_dim));
  w.add_u32(a + "attention.head_count", static_cast<uint32_t>(c.n_heads));
  w.add_u32(a + "attention.head_count_kv", static_cast<uint32_t>(c.n_kv_heads));
  w.add_f32(a + "attention.layer_norm_rms_epsilon", c.rms_eps);
  w.add_f32(a + "rope.freq_base", c.rope_theta);
  w.add_u32(a + "rope.dimension_count", static_cast<uint32_t>(c.head_dim));
  add_rope_scaling(w, a, c);
  w.add_u32(a + "attention.key_length", static_cast<uint32_t>(c.head_dim));
  w.add_u32(a + "attention.value_length", static_cast<uint32_t>(c.head_dim));
  w.add_u32(a + "vocab_size", static_cast<uint32_t>(c.vocab));
  if (c.moe.n_experts > 0) {  // llama.cpp's TextModel / Qwen2MoeModel keys
    w.add_u32(a + "expert_count", static_cast<uint32_t>(c.moe.n_experts));
    w.add_u32(a + "expert_used_count", static_cast<uint32_t>(c.moe.top_k));
    if (c.moe.expert_ffn != c.ffn_dim)
      w.add_u32(a + "expert_feed_forward_length", static_cast<uint32_t>(c.moe.expert_ffn));
    if (!c.moe.norm_topk) w.add_bool(a + "expert_weights_norm", false);
  }
  if (c.gemma) {  // llama.cpp's gemma2 / gemma3: the caps, the scores' scale
    if (c.attn_softcap > 0) w.add_f32(a + "attn_logit_softcapping", c.attn_softcap);
    if (c.final_softcap > 0) w.add_f32(a + "final_logit_softcapping", c.final_softcap);
    const int big = g3 ? 62 : 46;  // the 27B models: (hidden / heads)^-0.5
    const float derived = static_cast<float>(c.n_layers == big ? c.dim / c.n_heads : c.head_dim);
    if (c.attn_scalar > 0 && c.attn_scalar != derived)
      w.add_f32(a + "attention.scale", 1.f / std::sqrt(c.attn_scalar));
    if (g3 && c.rope_local_theta > 0) w.add_f32(a + "rope.freq_base_swa", c.rope_local_theta);
  }
  if (c.sliding_window > 0) {
    // llama.cpp's key has no per-layer form: gemma2 slides on even layers, gemma3 on all but
    // every pattern-th (attention.sliding_window_pattern, the first full layer + 1).
    int pattern = 2;
    if (g3) {
      pattern = c.n_layers + 1;
      for (int l = 0; l < c.n_layers; ++l)
        if (!c.layer_slides(l)) {
          pattern = l + 1;
          break;
        }
    }
    bool fits = c.gemma;
    for (int l = 0; l < c.n_layers && fits; ++l)
      fits = c.layer_slides(l) == (l % pattern < pattern - 1);
    QLFT_CHECK_ARG(c.sliding_layers.empty() || fits,
                   "merged GGUF export: a sliding window on some layers only has no GGUF form");
    w.add_u32(a + "attention.sliding_window", static_cast<uint32_t>(c.sliding_window));
    if (g3) w.add_u32(a + "attention.sliding_window_pattern", static_cast<uint32_t>(pattern));
  }
  if (m.gguf)
    for (const auto& kv : m.gguf->metadata())
      if (kv.first.rfind("tokenizer.", 0) == 0) w.add_value(kv.first, kv.second);

  // llama.cpp's llama/mistral tensors keep q/k rows in adjacent pairs; qwen2 in rotate-half.
  const bool adjacent = fam->gguf_qk_adjacent;
  auto mat = [&](const std::string& name, const std::vector<float>& v, int64_t rows, int64_t cols) {
    w.add_tensor_f32(name, {cols, rows}, v.data(), store);
  };
  auto vec = [&](const std::string& name, const std::vector<float>& v) {
    w.add_tensor_f32(name, {static_cast<int64_t>(v.size())}, v.data(), GgmlType::F32);
  };
  if (!c.rope.freq_divisors.empty())
    vec("rope_freqs.weight", c.rope.freq_divisors);
  else if (c.rope.type == RopeType::Llama3)
    vec("rope_freqs.weight", llama3_divisors(c));
  if (c.rope.type == RopeType::LongRope) {
    vec("rope_factors_long.weight", c.rope.long_factor);
    vec("rope_factors_short.weight", c.rope.short_factor);
  }
  mat("token_embd.weight", dequant(m.tok_embd), m.tok_embd.rows, m.tok_embd.cols);
  vec("output_norm.weight", copy_f32(m.output_norm));
  if (m.output.rows) mat("output.weight", dequant(m.output), m.output.rows, m.output.cols);
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& L = m.layers[l];
    const std::string b = "blk." + std::to_string(l) + ".";
    vec(b + "attn_norm.weight", copy_f32(L.attn_norm));
    vec(b + "ffn_norm.weight", copy_f32(L.ffn_norm));
    if (!L.post_attn_norm.empty()) {  // gemma2 (held as 1 + w, as llama.cpp stores them)
      vec(b + "post_attention_norm.weight", copy_f32(L.post_attn_norm));
      vec(b + "post_ffw_norm.weight", copy_f32(L.post_ffn_norm));
    }
    if (!L.moe.w1.empty()) {  // the router (F32) and the experts stacked [E, rows, cols]
      w.add_tensor_f32(b + "ffn_gate_inp.weight", {L.moe.router.cols, L.moe.router.rows},
                       merged_moe_weight(m, lora, l, 0, -1).data(), GgmlType::F32);
      for (const auto& [name, ex, which] : {std::tuple{"ffn_gate_exps", &L.moe.w1, 1},
                                            {"ffn_up_exps", &L.moe.w3, 3},
                                            {"ffn_down_exps", &L.moe.w2, 2}}) {
        std::vector<float> all;
        for (size_t e = 0; e < ex->size(); ++e) {
          const std::vector<float> t = merged_moe_weight(m, lora, l, int(e), which);
          all.insert(all.end(), t.begin(), t.end());
        }
        const QWeight& q0 = ex->front();
        w.add_tensor_f32(b + name + ".weight", {q0.cols, q0.rows, static_cast<int64_t>(ex->size())},
                         all.data(), store);
      }
    }
    for (int pi = 0; pi < kProjCount; ++pi) {
      Proj p = static_cast<Proj>(pi);
      const QWeight& q = L.proj[pi];
      if (!q.rows) continue;  // (an MoE layer's dense MLP)
      std::vector<float> t = merged_weight(m, lora, l, p);
      to_order(m.shapes, p, t, q.cols, adjacent);
      if (fused.on(p, t, q.rows)) {  // phi3: llama.cpp's attn_qkv and ffn_up (gate first)
        const int64_t rows = fused.rows;
        if (p == Proj::V || p == Proj::Up)
          mat(b + (p == Proj::V ? "attn_qkv" : "ffn_up") + ".weight", fused.take(), rows, q.cols);
        continue;
      }
      mat(b + proj_gguf_name(p) + ".weight", t, q.rows, q.cols);
      if (pi < 3 && !L.bias[pi].empty()) {
        t = copy_f32(L.bias[pi]);
        to_order(m.shapes, p, t, 1, adjacent);
        vec(b + proj_gguf_name(p) + ".bias", t);
      }
    }
    if (!L.q_norm.empty()) {
      vec(b + "attn_q_norm.weight", copy_f32(L.q_norm));
      vec(b + "attn_k_norm.weight", copy_f32(L.k_norm));
    }
  }
  w.write(path);
}

}  // namespace

std::vector<float> merged_weight(const Model& m, const LoraAdapter* lora, int layer, Proj p) {
  QLFT_CHECK_ARG(layer >= 0 && layer < m.cfg.n_layers, "merged_weight: layer %d out of range",
                 layer);
  const QWeight& q = m.layers[layer].proj[static_cast<int>(p)];
  std::vector<float> w = dequant(q);
  if (!lora || !lora->active(layer, p)) return w;  // (not adapted on this layer: lora_adapts)
  const LoraSlot& s = lora->slot(layer, p);
  QLFT_CHECK_ARG(s.in == q.cols && s.out == q.rows,
                 "merged_weight: adapter %s of layer %d is [%d, %d] but the model weight is "
                 "[%lld, %lld]",
                 proj_peft_name(p), layer, s.out, s.in, static_cast<long long>(q.rows),
                 static_cast<long long>(q.cols));
  // B's rows are in the model's row order already (LoraAdapter keeps the source convention).
  // W + s B A, less s B0 A0 with a frozen start (lora_extras.h); with DoRA each row then scaled
  // to its magnitude: M[o] / ||W_o + s (B A)_o|| (PEFT's merge of a DoRA layer).
  const int r = lora->config().r;
  const float scale = lora->config().scale();
  auto add_product = [&](const float* A, const float* B, float f) {
    std::vector<float> row(static_cast<size_t>(s.in));
    for (int o = 0; o < s.out; ++o) {
      std::fill(row.begin(), row.end(), 0.f);
      for (int k = 0; k < r; ++k) {
        const float b = B[static_cast<size_t>(o) * r + k];
        const float* a = A + static_cast<size_t>(k) * s.in;
        for (int i = 0; i < s.in; ++i) row[i] += b * a[i];
      }
      float* wr = w.data() + static_cast<size_t>(o) * s.in;
      for (int i = 0; i < s.in; ++i) wr[i] += f * row[i];
    }
  };
  add_product(s.A.as<float>(), s.B.as<float>(), scale);
  if (s.has_start()) add_product(s.A0.as<float>(), s.B0.as<float>(), -scale);
  if (!s.M.empty())
    for (int o = 0; o < s.out; ++o) {
      float* wr = w.data() + static_cast<size_t>(o) * s.in;
      double n = 0;
      for (int i = 0; i < s.in; ++i) n += static_cast<double>(wr[i]) * wr[i];
      const float c = n > 0 ? static_cast<float>(s.M.as<float>()[o] / std::sqrt(n)) : 0.f;
      for (int i = 0; i < s.in; ++i) wr[i] *= c;
    }
  return w;
}

void export_merged(const Model& model, const LoraAdapter* lora, const std::string& path,
                   const std::string& format) {
  QLFT_CHECK_ARG(!path.empty(), "export_merged: empty path");
  model.require_resident("merged export");
  if (lora)
    QLFT_CHECK_ARG(lora->n_layers() == model.cfg.n_layers,
                   "export_merged: the adapter has %d layers but the model %d", lora->n_layers(),
                   model.cfg.n_layers);
  if (format == "safetensors")
    export_safetensors(model, lora, path);
  else if (format == "gguf-f16" || format == "gguf-bf16")
    export_gguf(model, lora, path, format == "gguf-bf16");
  else
    throw_error(QLFT_ERR_INVALID_ARGUMENT,
                "export_merged: format must be safetensors, gguf-f16 or gguf-bf16, got '%s'",
                format.c_str());
}

}  // namespace qlft
