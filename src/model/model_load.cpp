#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <set>
#include <unordered_map>

#include "core/dtype.h"
#include "core/error.h"
#include "core/log.h"
#include "formats/json_file.h"
#include "formats/safetensors.h"
#include "formats/safetensors_bnb.h"
#include "model/model.h"
#include "model/file_unit_stream.h"
#include "quant/ggml_dequant.h"
#include "quant/ggml_types.h"

namespace qlft {

const char* proj_peft_name(Proj p) {
  static const char* n[] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                            "gate_proj", "up_proj", "down_proj"};
  return n[static_cast<int>(p)];
}
const char* proj_gguf_name(Proj p) {
  static const char* n[] = {"attn_q",   "attn_k", "attn_v",  "attn_output",
                            "ffn_gate", "ffn_up", "ffn_down"};
  return n[static_cast<int>(p)];
}

uint64_t Model::n_params() const {
  uint64_t n = tok_embd.numel() + output.numel() + cfg.dim;
  for (const LayerWeights& l : layers) {
    n += 2 * static_cast<uint64_t>(cfg.dim);
    for (const QWeight& w : l.proj) n += w.numel();
    for (const Buffer& b : l.bias) n += b.size() / 4;
  }
  return n;
}

std::vector<std::vector<int>> weight_groups_of_units(const Model& m) {
  const int L = static_cast<int>(m.layers.size());
  std::vector<std::vector<int>> u(static_cast<size_t>(unit_count(L)));
  u[kEmbeddingUnit] = {0};
  for (int l = 0; l < L; ++l) u[static_cast<size_t>(layer_unit(l))] = {l + 1};
  u[static_cast<size_t>(head_unit(L))] = {L + 1};
  if (!m.output.rows) u[static_cast<size_t>(head_unit(L))].push_back(0);
  return u;
}

void Model::require_resident(const char* what) const {
  if (stream && load_options.deferred)
    throw_error(QLFT_ERR_UNSUPPORTED,
                "%s: %s needs all base weights in memory, but the model was loaded for ZeRO-3 "
                "shards (%s: dist.zero_stage=3 under a launcher); load it without those "
                "settings for it",
                path.c_str(), what, stream->describe().c_str());
  if (stream)
    throw_error(QLFT_ERR_UNSUPPORTED,
                "%s: %s needs all base weights in memory, but a trainer streams them (%s); load "
                "the model again for it",
                path.c_str(), what, stream->describe().c_str());
}

uint64_t Model::weight_bytes() const {
  if (load_options.deferred) return deferred_weight_bytes;
  uint64_t n = tok_embd.bytes() + output.bytes() + output_norm.size();
  for (const LayerWeights& l : layers) {
    n += l.attn_norm.size() + l.ffn_norm.size();
    for (const QWeight& w : l.proj) n += w.bytes();
    for (const Buffer& b : l.bias) n += b.size();
  }
  return n;
}

namespace {

// Sanity bounds for shape settings read from files: generous for real models, small enough that
// products of them never overflow.
constexpr int64_t kMaxLayers = 1024, kMaxDim = int64_t(1) << 20, kMaxHeads = 4096,
                  kMaxHeadDim = 4096, kMaxVocab = int64_t(1) << 24, kMaxContext = int64_t(1) << 26;

bool ends_with(const std::string& s, const char* suf) {
  size_t n = std::strlen(suf);
  return s.size() >= n && s.compare(s.size() - n, n, suf) == 0;
}
bool is_dir(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
std::string dirname_of(const std::string& p) {
  size_t s = p.rfind('/');
  return s == std::string::npos ? "." : p.substr(0, s);
}

// Quantizing divides each block by its absmax: a NaN or Inf weight would turn every code of its
// block into an out-of-range float-to-int conversion (undefined behaviour) and the model into
// garbage. Refuse it where the file and tensor can still be named.
void require_finite(const float* x, int64_t n, const char* file, const std::string& tensor) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i]))
      throw_error(QLFT_ERR_FORMAT, "%s: tensor '%s' holds a non-finite value (%g) at element %lld",
                  file, tensor.c_str(), static_cast<double>(x[i]), static_cast<long long>(i));
}

QuantKind target_kind(const LoadOptions& o) {
  if (o.quant_type == "nf4") return QuantKind::NF4;
  if (o.quant_type == "int8") return QuantKind::INT8;
  throw_error(QLFT_ERR_INVALID_ARGUMENT, "quant.type '%s' has no target kind",
              o.quant_type.c_str());
}

}  // namespace

void check_model_config(const ModelConfig& c, const std::string& path) {
  QLFT_CHECK_FORMAT(c.n_layers > 0 && c.n_layers <= 1024, "%s: layer count %d is invalid",
                    path.c_str(), c.n_layers);
  QLFT_CHECK_FORMAT(c.dim > 0 && c.n_heads > 0 && c.n_kv_heads > 0 && c.ffn_dim > 0,
                    "%s: dimensions must be positive (dim %d, heads %d, kv heads %d, ffn %d)",
                    path.c_str(), c.dim, c.n_heads, c.n_kv_heads, c.ffn_dim);
  QLFT_CHECK_FORMAT(c.n_heads % c.n_kv_heads == 0,
                    "%s: head count %d is not a multiple of the KV head count %d", path.c_str(),
                    c.n_heads, c.n_kv_heads);
  QLFT_CHECK_FORMAT(c.head_dim > 0 && c.head_dim % 2 == 0, "%s: head dimension %d must be even",
                    path.c_str(), c.head_dim);
  QLFT_CHECK_FORMAT(
      c.rms_eps > 0 && std::isfinite(c.rms_eps) && c.rope_theta > 0 && std::isfinite(c.rope_theta),
      "%s: rms eps (%g) and rope theta (%g) must be finite and > 0", path.c_str(),
      static_cast<double>(c.rms_eps), static_cast<double>(c.rope_theta));
}

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
  return linear && o.quant_type == "keep" && tr && tr->dequantizable;
}

namespace {

// ---- GGUF ---------------------------------------------------------------------------------

class GgufLoader {
 public:
  GgufLoader(MemoryTracker* t, const LoadOptions& o, Model& m) : tracker_(t), opt_(o), m_(m) {}

  // The configuration and the tensors' presence and shapes; no weight storage (load_group).
  void open(const std::string& path) {
    m_.gguf = GgufFile::open(path);
    const GgufFile& g = *m_.gguf;
    ModelConfig& c = m_.cfg;
    c.arch = g.get_string("general.architecture");
    QLFT_CHECK_FORMAT(c.arch == "llama" || c.arch == "qwen2" || c.arch == "mistral",
                      "%s: architecture '%s' is not supported (llama, mistral, qwen2 are)",
                      path.c_str(), c.arch.c_str());
    const std::string a = c.arch + ".";
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
                      "%s: embedding length %d is not a multiple of the head count %d",
                      path.c_str(), c.dim, c.n_heads);
    c.head_dim = static_cast<int>(
        g.get_int_in(a + "attention.key_length", 1, kMaxHeadDim, c.dim / c.n_heads));
    // llama.cpp's converter permutes llama/mistral q and k rows into adjacent-pair RoPE order;
    // qwen2 keeps Hugging Face's rotate-half order (NEOX rope).
    c.rope_adjacent = c.arch != "qwen2";
    c.qkv_bias = g.find_tensor("blk.0.attn_q.bias") != nullptr;
    check_model_config(c, path);
    // llama.cpp's converter writes llama3 RoPE scaling as per-pair divisors of the frequencies.
    if (g.find_tensor("rope_freqs.weight")) {
      std::vector<float>& d = c.rope.freq_divisors;
      d.resize(static_cast<size_t>(c.head_dim / 2));
      vector_f32("rope_freqs.weight", d.data(), c.head_dim / 2);
      for (size_t i = 0; i < d.size(); ++i)
        QLFT_CHECK_FORMAT(std::isfinite(d[i]) && d[i] > 0,
                          "%s: tensor 'rope_freqs.weight' holds %g at element %zu (divisors must "
                          "be positive)",
                          path.c_str(), static_cast<double>(d[i]), i);
    }

    const GgufTensorInfo& emb = tensor("token_embd.weight", -1, c.dim);
    QLFT_CHECK_FORMAT(emb.ne[1] >= 1 && emb.ne[1] <= kMaxVocab,
                      "%s: tensor 'token_embd.weight' has %lld rows, not a vocabulary size",
                      path.c_str(), static_cast<long long>(emb.ne[1]));
    c.vocab = static_cast<int>(emb.ne[1]);
    check_gguf_vocabulary(g, emb.ne[1]);
    if (const GgufTensorInfo* out = g.find_tensor("output.weight"))
      expect_shape(*out, c.vocab, c.dim);
    else
      c.tied_embeddings = true;
    m_.layers.resize(c.n_layers);
  }

  // The storage of weight group g (for_each_weight_buffer's numbering) into the model.
  void load_group(int g, bool with_head = true) {
    const ModelConfig& c = m_.cfg;
    if (g == 0) {
      float_weight(m_.tok_embd, tensor("token_embd.weight", c.vocab, c.dim), c.vocab, c.dim);
      return;
    }
    if (g == c.n_layers + 1) {
      vector(m_.output_norm, "output_norm.weight", c.dim);
      if (!c.tied_embeddings && with_head)
        float_weight(m_.output, tensor("output.weight", c.vocab, c.dim), c.vocab, c.dim);
      return;
    }
    const int i = g - 1;
    const int q_out = c.n_heads * c.head_dim, kv_out = c.n_kv_heads * c.head_dim;
    const int64_t shapes[kProjCount][2] = {
        {q_out, c.dim},     {kv_out, c.dim},    {kv_out, c.dim},   {c.dim, q_out},
        {c.ffn_dim, c.dim}, {c.ffn_dim, c.dim}, {c.dim, c.ffn_dim}};
    LayerWeights& L = m_.layers[i];
    std::string b = "blk." + std::to_string(i) + ".";
    vector(L.attn_norm, b + "attn_norm.weight", c.dim);
    vector(L.ffn_norm, b + "ffn_norm.weight", c.dim);
    for (int p = 0; p < kProjCount; ++p) {
      std::string n = b + proj_gguf_name(static_cast<Proj>(p)) + ".weight";
      const GgufTensorInfo& t = tensor(n, shapes[p][0], shapes[p][1]);
      linear_weight(L.proj[p], t, shapes[p][0], shapes[p][1]);
    }
    if (c.qkv_bias) {
      const char* names[3] = {"attn_q.bias", "attn_k.bias", "attn_v.bias"};
      for (int j = 0; j < 3; ++j) vector(L.bias[j], b + names[j], shapes[j][0]);
    }
  }
  // load_group without reading a weight: the group's shapes and types set in the model and, for
  // each storage Buffer a load would fill, where its bytes lie in the map (span). False when a
  // Buffer of the group is made on load (gguf_kept_as_stored): then load_group it.
  bool plan_group(int g, bool with_head) {
    plan_ = Plan{};
    plan_.on = true;
    try {
      load_group(g, with_head);
    } catch (...) {
      plan_.on = false;
      throw;
    }
    plan_.on = false;
    return plan_.whole;
  }
  // Of the last plan_group: Buffer b's bytes in the map and their count (nullptr, 0: b stays
  // empty).
  std::pair<const uint8_t*, size_t> span(const Buffer* b) const {
    auto it = plan_.at.find(b);
    return it == plan_.at.end() ? std::pair<const uint8_t*, size_t>{nullptr, 0} : it->second;
  }
  // The embedding (head: the untied head) as stored (WeightGroupSource::stored_rows), and its
  // rows [r0, r0 + n) in that format.
  QWeight stored_rows(bool head) {
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
  void stored_row_bytes_of(bool head, int64_t r0, int64_t n, void* out) {
    const ModelConfig& c = m_.cfg;
    const GgufTensorInfo& t = tensor(head ? "output.weight" : "token_embd.weight", c.vocab, c.dim);
    const uint64_t rb = stored_row_bytes(stored_rows(head));
    std::memcpy(out, t.data + uint64_t(r0) * rb, uint64_t(n) * rb);
  }

 private:
  const GgufTensorInfo& tensor(const std::string& name, int64_t rows, int64_t cols) {
    const GgufTensorInfo* t = m_.gguf->find_tensor(name);
    QLFT_CHECK_FORMAT(t, "%s: tensor '%s' is missing", m_.gguf->path().c_str(), name.c_str());
    expect_shape(*t, rows, cols);
    return *t;
  }
  void expect_shape(const GgufTensorInfo& t, int64_t rows, int64_t cols) {
    bool ok = t.n_dims <= 2 && t.ne[0] == cols && (rows < 0 || t.ne[1] == rows);
    QLFT_CHECK_FORMAT(ok,
                      "%s: tensor '%s' has shape [%lld, %lld], expected [%lld, %lld] (GGUF order)",
                      m_.gguf->path().c_str(), t.name.c_str(), static_cast<long long>(t.ne[0]),
                      static_cast<long long>(t.ne[1]), static_cast<long long>(cols),
                      static_cast<long long>(rows));
  }
  void to_f32(const GgufTensorInfo& t, float* dst) {
    const GgmlTypeTraits* tr = ggml_type_traits(t.type);
    switch (static_cast<GgmlType>(t.type)) {
      case GgmlType::I8:
      case GgmlType::I16:
      case GgmlType::I32:
      case GgmlType::I64:
        throw_error(QLFT_ERR_FORMAT,
                    "%s: tensor '%s' has integer type %s, expected a float or "
                    "quantized type",
                    m_.gguf->path().c_str(), t.name.c_str(), tr->name);
      default:
        break;
    }
    if (!tr->dequantizable)
      throw_error(QLFT_ERR_UNSUPPORTED, "%s: tensor '%s' has type %s, which qlft cannot dequantize",
                  m_.gguf->path().c_str(), t.name.c_str(), tr->name);
    ggml_dequantize(t.type, t.data, t.numel(), dst);
  }
  // plan_group: b's bytes are t's first n, or (kept false) b is made on load.
  void note(Buffer& b, const GgufTensorInfo& t, uint64_t n, bool kept) {
    if (!kept) {
      plan_.whole = false;
      return;
    }
    QLFT_CHECK_FORMAT(n <= t.nbytes, "%s: tensor '%s' holds %llu bytes, %llu expected",
                      m_.gguf->path().c_str(), t.name.c_str(),
                      static_cast<unsigned long long>(t.nbytes),
                      static_cast<unsigned long long>(n));
    plan_.at[&b] = {t.data, size_t(n)};
  }
  // A small f32 vector read into host memory (rope_freqs.weight), checked like vector's.
  void vector_f32(const std::string& name, float* dst, int64_t n) {
    const GgufTensorInfo* t = m_.gguf->find_tensor(name);
    QLFT_CHECK_FORMAT(t, "%s: tensor '%s' is missing", m_.gguf->path().c_str(), name.c_str());
    QLFT_CHECK_FORMAT(t->numel() == n && t->ne[0] == n,
                      "%s: tensor '%s' has %lld elements, expected %lld", m_.gguf->path().c_str(),
                      name.c_str(), static_cast<long long>(t->numel()), static_cast<long long>(n));
    to_f32(*t, dst);
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
  void float_weight(QWeight& w, const GgufTensorInfo& t, int64_t rows, int64_t cols) {
    w = QWeight{};
    w.kind = QuantKind::F32;
    w.rows = rows;
    w.cols = cols;
    const uint64_t n = uint64_t(rows * cols) * 4;
    if (plan_.on) return note(w.data, t, n, gguf_kept_as_stored(t, false, opt_));
    w.data = Buffer(tracker_, MemCategory::Weights, n, t.name.c_str());
    to_f32(t, w.data.as<float>());
  }
  void linear_weight(QWeight& w, const GgufTensorInfo& t, int64_t rows, int64_t cols) {
    if (opt_.quant_type == "keep") {
      if (static_cast<GgmlType>(t.type) == GgmlType::F32) return float_weight(w, t, rows, cols);
      const GgmlTypeTraits* tr = ggml_type_traits(t.type);
      if (!tr->dequantizable)
        throw_error(QLFT_ERR_UNSUPPORTED, "%s: tensor '%s' has type %s, which qlft cannot use",
                    m_.gguf->path().c_str(), t.name.c_str(), tr->name);
      if (!plan_.on) {
        w = qweight_from_ggml(tracker_, t.type, t.data, rows, cols);
        return;
      }
      uint64_t nb = 0;
      w = qweight_ggml_shape(t.type, rows, cols, &nb);
      return note(w.data, t, nb, gguf_kept_as_stored(t, true, opt_));
    }
    if (plan_.on) {
      plan_.whole = false;  // quantized on load
      return;
    }
    Buffer tmp(tracker_, MemCategory::Workspace, rows * cols * 4, "load staging");
    to_f32(t, tmp.as<float>());
    require_finite(tmp.as<float>(), rows * cols, m_.gguf->path().c_str(), t.name);
    w = qweight_from_f32(tracker_, tmp.as<float>(), rows, cols, target_kind(opt_), opt_.blocksize,
                         opt_.double_quant);
  }

  // plan_group's state: on while it runs; whole while every Buffer so far is a span.
  struct Plan {
    bool on = false, whole = true;
    std::unordered_map<const Buffer*, std::pair<const uint8_t*, size_t>> at;
  };

  MemoryTracker* tracker_;
  const LoadOptions& opt_;
  Model& m_;
  Plan plan_;
};

// ---- Hugging Face safetensors + config.json --------------------------------------------------

class HfLoader {
 public:
  HfLoader(MemoryTracker* t, const LoadOptions& o, Model& m) : tracker_(t), opt_(o), m_(m) {}

  // The configuration and the tensors' presence; no weight storage (load_group).
  void open(const std::string& path) {
    std::string dir = is_dir(path) ? path : dirname_of(path);
    m_.hf_dir = dir;
    JsonFile cj = JsonFile::load(dir + "/config.json");
    ModelConfig& c = m_.cfg;
    std::string arch_name;
    if (cj.root().contains("architectures") && cj.root()["architectures"].is_array() &&
        !cj.root()["architectures"].empty() && cj.root()["architectures"][0].is_string())
      arch_name = cj.root()["architectures"][0].get<std::string>();
    std::string model_type = cj.get_string("model_type", "");
    if (arch_name == "LlamaForCausalLM" || model_type == "llama")
      c.arch = "llama";
    else if (arch_name == "MistralForCausalLM" || model_type == "mistral")
      c.arch = "mistral";
    else if (arch_name == "Qwen2ForCausalLM" || model_type == "qwen2")
      c.arch = "qwen2";
    else
      throw_error(QLFT_ERR_UNSUPPORTED, "%s: architecture '%s' (model_type '%s') is not supported",
                  cj.path().c_str(), arch_name.c_str(), model_type.c_str());
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
    QLFT_CHECK_FORMAT(c.n_heads % c.n_kv_heads == 0,
                      "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d",
                      cj.path().c_str(), c.n_heads, c.n_kv_heads);
    QLFT_CHECK_FORMAT(c.rms_eps > 0 && c.rms_eps < 1, "%s: rms_norm_eps %g is out of range",
                      cj.path().c_str(), c.rms_eps);
    QLFT_CHECK_FORMAT(c.rope_theta > 0, "%s: rope_theta %g must be positive", cj.path().c_str(),
                      c.rope_theta);
    c.tied_embeddings = cj.get_bool("tie_word_embeddings", false);
    const bool tie_explicit = cj.has("tie_word_embeddings");
    c.rope_adjacent = false;
    check_model_config(c, cj.path());
    QLFT_CHECK_FORMAT(c.vocab > 0, "%s: vocab_size must be positive", cj.path().c_str());

    st_ = SafetensorsSet::open(is_dir(path) ? dir : path);
    // Qwen2 always has q/k/v biases; llama only with attention_bias (o_proj bias unsupported).
    c.qkv_bias = c.arch == "qwen2" || cj.get_bool("attention_bias", false) ||
                 st_->find("model.layers.0.self_attn.q_proj.bias") != nullptr;
    if (!st_->find("lm_head.weight") || c.tied_embeddings) {
      QLFT_CHECK_FORMAT(c.tied_embeddings || !tie_explicit,
                        "%s: tensor 'lm_head.weight' is missing and tie_word_embeddings is false",
                        m_.hf_dir.c_str());
      c.tied_embeddings = true;
    }
    m_.layers.resize(c.n_layers);
  }

  // The storage of weight group g (for_each_weight_buffer's numbering) into the model.
  void load_group(int g, bool with_head = true) {
    const ModelConfig& c = m_.cfg;
    if (g == 0) {
      m_.tok_embd = float_weight("model.embed_tokens.weight", c.vocab, c.dim);
      return;
    }
    if (g == c.n_layers + 1) {
      m_.output_norm = vector("model.norm.weight", c.dim);
      if (!c.tied_embeddings && with_head)
        m_.output = float_weight("lm_head.weight", c.vocab, c.dim);
      return;
    }
    const int i = g - 1;
    const int q_out = c.n_heads * c.head_dim, kv_out = c.n_kv_heads * c.head_dim;
    const int64_t shapes[kProjCount][2] = {
        {q_out, c.dim},     {kv_out, c.dim},    {kv_out, c.dim},   {c.dim, q_out},
        {c.ffn_dim, c.dim}, {c.ffn_dim, c.dim}, {c.dim, c.ffn_dim}};
    LayerWeights& L = m_.layers[i];
    std::string b = "model.layers." + std::to_string(i) + ".";
    L.attn_norm = vector(b + "input_layernorm.weight", c.dim);
    L.ffn_norm = vector(b + "post_attention_layernorm.weight", c.dim);
    for (int p = 0; p < kProjCount; ++p) {
      const char* sub = p < 4 ? "self_attn." : "mlp.";
      std::string prefix = b + sub + proj_peft_name(static_cast<Proj>(p));
      L.proj[p] = linear_weight(prefix, shapes[p][0], shapes[p][1]);
    }
    if (c.qkv_bias) {
      for (int j = 0; j < 3; ++j)
        L.bias[j] =
            vector(b + "self_attn." + proj_peft_name(static_cast<Proj>(j)) + ".bias", shapes[j][0]);
    }
  }

  // Safetensors groups are loaded whole (GgufLoader::plan_group reads GGUF groups by range).
  bool plan_group(int, bool) { return false; }
  std::pair<const uint8_t*, size_t> span(const Buffer*) const { return {nullptr, 0}; }

  // The embedding (head: the untied head) as stored (WeightGroupSource::stored_rows), and its
  // rows [r0, r0 + n) in that format (f64 converted to f32).
  QWeight stored_rows(bool head) {
    const ModelConfig& c = m_.cfg;
    const SafeTensorInfo& t =
        tensor(head ? "lm_head.weight" : "model.embed_tokens.weight", c.vocab, c.dim);
    QWeight w;
    w.rows = c.vocab;
    w.cols = c.dim;
    if (t.dtype == DType::F16) w.kind = QuantKind::F16;
    if (t.dtype == DType::BF16) w.kind = QuantKind::BF16;
    return w;
  }
  void stored_row_bytes_of(bool head, int64_t r0, int64_t n, void* out) {
    const ModelConfig& c = m_.cfg;
    const SafeTensorInfo& t =
        tensor(head ? "lm_head.weight" : "model.embed_tokens.weight", c.vocab, c.dim);
    const int64_t es = int64_t(dtype_size(t.dtype));
    const uint8_t* at = t.data + r0 * c.dim * es;
    if (t.dtype == DType::F64)
      to_f32_n(t.dtype, at, static_cast<float*>(out), size_t(n * c.dim));
    else
      std::memcpy(out, at, size_t(n * c.dim * es));
  }

 private:
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
    const std::string name = prefix + ".weight";
    const SafeTensorInfo& t = tensor(name, rows, cols);
    if (opt_.quant_type == "keep") {
      if (t.dtype == DType::F16 || t.dtype == DType::BF16) {
        w.kind = t.dtype == DType::F16 ? QuantKind::F16 : QuantKind::BF16;
        w.rows = rows;
        w.cols = cols;
        w.data = Buffer(tracker_, MemCategory::Weights, t.nbytes, name.c_str());
        std::memcpy(w.data.data(), t.data, t.nbytes);
        return w;
      }
      return float_weight(name, rows, cols);
    }
    Buffer tmp(tracker_, MemCategory::Workspace, rows * cols * 4, "load staging");
    to_f32_n(t.dtype, t.data, tmp.as<float>(), rows * cols);
    require_finite(tmp.as<float>(), rows * cols, t.file->c_str(), name);
    return qweight_from_f32(tracker_, tmp.as<float>(), rows, cols, target_kind(opt_),
                            opt_.blocksize, opt_.double_quant);
  }

  MemoryTracker* tracker_;
  const LoadOptions& opt_;
  Model& m_;
  std::unique_ptr<SafetensorsSet> st_;
};

// A second loader over the model's file (its own map / reader), handing single groups' storage
// to the model.
template <class Loader>
class LoaderGroupSource final : public WeightGroupSource {
 public:
  LoaderGroupSource(MemoryTracker* t, const Model& m)
      : opt_(m.load_options), loader_(t, opt_, scratch_) {
    loader_.open(m.path);
    const ModelConfig &a = scratch_.cfg, &b = m.cfg;
    if (a.n_layers != b.n_layers || a.dim != b.dim || a.ffn_dim != b.ffn_dim ||
        a.vocab != b.vocab || a.n_heads != b.n_heads || a.n_kv_heads != b.n_kv_heads ||
        a.tied_embeddings != b.tied_embeddings || a.qkv_bias != b.qkv_bias)
      throw_error(QLFT_ERR_IO, "%s: the model file changed since it was loaded", m.path.c_str());
  }
  QWeight stored_rows(bool head) override { return loader_.stored_rows(head); }
  void load_rows(bool head, int64_t row0, int64_t n, void* out) override {
    loader_.stored_row_bytes_of(head, row0, n, out);
    ranged_bytes_ += uint64_t(n) * stored_row_bytes(loader_.stored_rows(head));
    if (scratch_.gguf) scratch_.gguf->drop_tensor_pages();
  }
  std::vector<size_t> stored_group(int group, bool with_head) override {
    spans_.clear();
    if (!loader_.plan_group(group, with_head)) return {};
    if (!with_head && !scratch_.cfg.tied_embeddings) {
      // The head's shape, so that the list has its (empty) Buffers as the model lists them.
      scratch_.output = QWeight{};
      scratch_.output.rows = scratch_.cfg.vocab;
      scratch_.output.cols = scratch_.cfg.dim;
    }
    std::vector<size_t> sizes;
    for_each_weight_buffer(scratch_, [&](int g, Buffer& b) {
      if (g != group) return;
      spans_.push_back(loader_.span(&b));
      sizes.push_back(spans_.back().second);
    });
    return sizes;
  }
  void read_stored(size_t i, size_t off, size_t n, void* out) override {
    QLFT_CHECK_ARG(i < spans_.size() && off <= spans_[i].second && n <= spans_[i].second - off,
                   "read_stored: bytes [%zu, %zu) of stored Buffer %zu (of %zu) are not there", off,
                   off + n, i, spans_.size());
    std::memcpy(out, spans_[i].first + off, n);
    ranged_bytes_ += n;
    if (scratch_.gguf) scratch_.gguf->drop_tensor_pages();
  }
  void load(Model& m, int group, bool with_head) override {
    ++groups_loaded_;
    loader_.load_group(group, with_head);
    if (scratch_.gguf) scratch_.gguf->drop_tensor_pages();
    if (!with_head && m.output.rows) {
      // The head's shape, so that both models list its (empty) buffers alike.
      scratch_.output.kind = m.output.kind;
      scratch_.output.rows = m.output.rows;
      scratch_.output.cols = m.output.cols;
    }
    std::vector<Buffer*> from, to;
    for_each_weight_buffer(scratch_, [&](int g, Buffer& b) {
      if (g == group) from.push_back(&b);
    });
    for_each_weight_buffer(m, [&](int g, Buffer& b) {
      if (g == group) to.push_back(&b);
    });
    if (from.size() != to.size())
      throw_error(QLFT_ERR_INTERNAL, "weight group %d: %zu vs %zu buffers", group, from.size(),
                  to.size());
    for (size_t i = 0; i < from.size(); ++i) *to[i] = std::move(*from[i]);
  }

 private:
  LoadOptions opt_;
  Model scratch_;
  Loader loader_;
  std::vector<std::pair<const uint8_t*, size_t>> spans_;  // of the last stored_group
};

bool has_gguf_magic(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;  // no FIFO reads
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return false;
  char m[4] = {0, 0, 0, 0};
  size_t n = std::fread(m, 1, 4, f);
  std::fclose(f);
  return n == 4 && std::memcmp(m, "GGUF", 4) == 0;
}

}  // namespace

std::unique_ptr<WeightGroupSource> WeightGroupSource::open(MemoryTracker* tracker, const Model& m) {
  if (m.source_format == "gguf") return std::make_unique<LoaderGroupSource<GgufLoader>>(tracker, m);
  return std::make_unique<LoaderGroupSource<HfLoader>>(tracker, m);
}

std::unique_ptr<Model> load_model(MemoryTracker* tracker, const std::string& path,
                                  const LoadOptions& opt) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    throw_error(QLFT_ERR_IO, "%s: no such file or directory", path.c_str());
  auto m = std::make_unique<Model>();
  m->path = path;
  const char* prev_phase = "setup";
  tracker->set_phase("load");
  try {
    // The file's order (embedding, final norm and head, layers): the planner's load peak
    // (weight_footprint_of_file) follows it.
    auto all = [&](auto&& loader) {
      loader.open(path);
      const int L = m->cfg.n_layers;
      // Deferred: each group is freed once loaded (its shapes and types stay).
      auto group = [&](int g) {
        // The f32 embedding and an untied head: their shapes alone, never whole here (ZeRO-3
        // shards them by rows from the file, WeightGroupSource::load_rows, or loads the group
        // when it needs it).
        auto shape_only = [&](QWeight& w) {
          w.kind = QuantKind::F32;
          w.rows = m->cfg.vocab;
          w.cols = m->cfg.dim;
          m->deferred_weight_bytes += uint64_t(m->cfg.vocab) * uint64_t(m->cfg.dim) * 4;
        };
        if (opt.deferred && g == 0) return shape_only(m->tok_embd);
        const bool head_by_shape = opt.deferred && g == L + 1 && !m->cfg.tied_embeddings;
        if (opt.deferred && loader.plan_group(g, !head_by_shape)) {
          // Kept as the file stores it: the header gave the shapes; nothing read.
          for_each_weight_buffer(*m, [&](int bg, Buffer& b) {
            if (bg == g) m->deferred_weight_bytes += loader.span(&b).second;
          });
          if (head_by_shape) shape_only(m->output);
          return;
        }
        loader.load_group(g, !head_by_shape);
        if (head_by_shape) shape_only(m->output);
        if (!opt.deferred) return;
        ++m->deferred_groups_read;
        for_each_weight_buffer(*m, [&](int bg, Buffer& b) {
          if (bg != g) return;
          m->deferred_weight_bytes += b.size();
          b.reset();
        });
        if (m->gguf) m->gguf->drop_tensor_pages();
      };
      group(0);
      group(L + 1);
      for (int g = 1; g <= L; ++g) group(g);
      // The weights were copied out: the file's pages leave the resident set (the map stays
      // for the tokenizer's metadata; every rank of a ZeRO-3 run would otherwise keep them).
      if (m->gguf) m->gguf->drop_tensor_pages();
    };
    m->load_options = opt;
    // A regular file that is neither GGUF (by its magic) nor .safetensors / a shard index is not
    // a model: the HF loader would look for a config.json beside it (any, not the user's).
    const bool gguf = has_gguf_magic(path);
    QLFT_CHECK_FORMAT(gguf || S_ISDIR(st.st_mode) || ends_with(path, ".safetensors") ||
                          ends_with(path, ".json") || ends_with(path, ".gguf"),
                      "%s: not a model (expected a .gguf file, a .safetensors file beside its "
                      "config.json, or a Hugging Face model directory)",
                      path.c_str());
    if (ends_with(path, ".gguf") || gguf) {
      m->source_format = "gguf";
      all(GgufLoader(tracker, opt, *m));
    } else {
      m->source_format = "safetensors";
      all(HfLoader(tracker, opt, *m));
    }
  } catch (...) {
    tracker->set_phase(prev_phase);
    throw;
  }
  tracker->set_phase(prev_phase);
  if (opt.deferred) m->stream = std::make_shared<FileUnitStream>(*m, tracker);
  std::set<std::string> kinds;
  for (const LayerWeights& l : m->layers)
    for (const QWeight& w : l.proj) kinds.insert(w.type_name());
  m->quant_summary = kinds.size() == 1 ? *kinds.begin() : "mixed";
  QLFT_LOG_I("loaded %s model %s (%s): %d layers, dim %d, vocab %d, %s weights, %s",
             m->cfg.arch.c_str(), path.c_str(), m->source_format.c_str(), m->cfg.n_layers,
             m->cfg.dim, m->cfg.vocab, m->quant_summary.c_str(),
             format_bytes(m->weight_bytes()).c_str());
  return m;
}

}  // namespace qlft
