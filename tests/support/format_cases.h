// Hand-built GGUF and safetensors bytes for the reader tests: a tiny valid llama model in both
// formats, and the hostile variants every reader must reject. Header-only and independent of
// qlft (no library symbols), so the C API tests (which link only libqlft.so) can use it too, and
// so the files do not come from the writers under test.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "qlft.h"

namespace qlft_test {

// ---- little-endian byte building -----------------------------------------------------------

struct Bytes {
  std::vector<uint8_t> b;
  template <class T>
  void put(T v) {
    uint8_t tmp[sizeof(T)];
    std::memcpy(tmp, &v, sizeof(T));
    b.insert(b.end(), tmp, tmp + sizeof(T));
  }
  void str(const std::string& s, std::optional<uint64_t> len = {}) {
    put<uint64_t>(len ? *len : s.size());
    b.insert(b.end(), s.begin(), s.end());
  }
  void raw(const void* p, size_t n) {
    const uint8_t* c = static_cast<const uint8_t*>(p);
    b.insert(b.end(), c, c + n);
  }
  void pad_to(size_t a) {
    while (b.size() % a) b.push_back(0);
  }
};

// ---- GGUF ------------------------------------------------------------------------------------

enum : uint32_t {
  kGU8 = 0,
  kGI8,
  kGU16,
  kGI16,
  kGU32,
  kGI32,
  kGF32,
  kGBOOL,
  kGSTRING,
  kGARRAY,
  kGU64,
  kGI64,
  kGF64
};

struct RawKV {
  std::string key;
  uint32_t type;
  std::vector<uint8_t> payload;  // the encoded value (after the type field)
};
struct RawTensor {
  std::string name;
  std::vector<uint64_t> ne;  // GGUF order
  uint32_t type = 0;         // ggml type (0 = F32)
  uint64_t offset = 0;
};

inline RawKV kv_u32(const std::string& k, uint32_t v) {
  Bytes b;
  b.put(v);
  return {k, kGU32, b.b};
}
inline RawKV kv_u64(const std::string& k, uint64_t v) {
  Bytes b;
  b.put(v);
  return {k, kGU64, b.b};
}
inline RawKV kv_i32(const std::string& k, int32_t v) {
  Bytes b;
  b.put(v);
  return {k, kGI32, b.b};
}
inline RawKV kv_f32(const std::string& k, float v) {
  Bytes b;
  b.put(v);
  return {k, kGF32, b.b};
}
inline RawKV kv_str(const std::string& k, const std::string& v) {
  Bytes b;
  b.str(v);
  return {k, kGSTRING, b.b};
}
inline RawKV kv_str_array(const std::string& k, const std::vector<std::string>& v) {
  Bytes b;
  b.put<uint32_t>(kGSTRING);
  b.put<uint64_t>(v.size());
  for (const auto& s : v) b.str(s);
  return {k, kGARRAY, b.b};
}

struct RawGguf {
  char magic[4] = {'G', 'G', 'U', 'F'};
  uint32_t version = 3;
  std::optional<uint64_t> n_tensors, n_kv;  // overrides of the true counts
  std::vector<RawKV> kv;
  std::vector<RawTensor> tensors;
  uint64_t alignment = 32;
  std::vector<uint8_t> data;  // the data section

  std::vector<uint8_t> build() const {
    Bytes b;
    b.raw(magic, 4);
    b.put(version);
    b.put<uint64_t>(n_tensors ? *n_tensors : tensors.size());
    b.put<uint64_t>(n_kv ? *n_kv : kv.size());
    for (const RawKV& k : kv) {
      b.str(k.key);
      b.put(k.type);
      b.raw(k.payload.data(), k.payload.size());
    }
    for (const RawTensor& t : tensors) {
      b.str(t.name);
      b.put<uint32_t>(static_cast<uint32_t>(t.ne.size()));
      for (uint64_t d : t.ne) b.put(d);
      b.put(t.type);
      b.put(t.offset);
    }
    b.pad_to(alignment);
    b.raw(data.data(), data.size());
    return b.b;
  }
  RawTensor* find(const std::string& name) {
    for (RawTensor& t : tensors)
      if (t.name == name) return &t;
    return nullptr;
  }
  RawKV* find_kv(const std::string& key) {
    for (RawKV& k : kv)
      if (k.key == key) return &k;
    return nullptr;
  }
};

// A deterministic weight value, shared by the GGUF and safetensors tiny models.
inline float tiny_value(size_t tensor_index, size_t i) {
  return 0.1f * std::sin(0.37f * static_cast<float>(i) + 1.3f * static_cast<float>(tensor_index));
}

struct TinySpec {
  int dim = 8, layers = 1, heads = 2, kv_heads = 1, ffn = 16, vocab = 12;
  bool tied = false;
  int head_dim() const { return dim / heads; }
};

// A complete llama GGUF (all F32) that qlft_model_load accepts.
inline RawGguf tiny_llama_gguf(const TinySpec& s = {}) {
  RawGguf g;
  g.kv.push_back(kv_str("general.architecture", "llama"));
  g.kv.push_back(kv_u32("llama.block_count", s.layers));
  g.kv.push_back(kv_u32("llama.embedding_length", s.dim));
  g.kv.push_back(kv_u32("llama.feed_forward_length", s.ffn));
  g.kv.push_back(kv_u32("llama.attention.head_count", s.heads));
  g.kv.push_back(kv_u32("llama.attention.head_count_kv", s.kv_heads));
  g.kv.push_back(kv_u32("llama.context_length", 64));
  g.kv.push_back(kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f));
  std::vector<std::string> toks;
  for (int i = 0; i < s.vocab; ++i) toks.push_back("t" + std::to_string(i));
  g.kv.push_back(kv_str_array("tokenizer.ggml.tokens", toks));
  const uint64_t d = s.dim, q = s.heads * s.head_dim(), kv = s.kv_heads * s.head_dim(), f = s.ffn;
  std::vector<std::pair<std::string, std::vector<uint64_t>>> ts = {
      {"token_embd.weight", {d, uint64_t(s.vocab)}}, {"output_norm.weight", {d}}};
  if (!s.tied) ts.push_back({"output.weight", {d, uint64_t(s.vocab)}});
  for (int l = 0; l < s.layers; ++l) {
    std::string p = "blk." + std::to_string(l) + ".";
    ts.push_back({p + "attn_norm.weight", {d}});
    ts.push_back({p + "ffn_norm.weight", {d}});
    ts.push_back({p + "attn_q.weight", {d, q}});
    ts.push_back({p + "attn_k.weight", {d, kv}});
    ts.push_back({p + "attn_v.weight", {d, kv}});
    ts.push_back({p + "attn_output.weight", {q, d}});
    ts.push_back({p + "ffn_gate.weight", {d, f}});
    ts.push_back({p + "ffn_up.weight", {d, f}});
    ts.push_back({p + "ffn_down.weight", {f, d}});
  }
  for (size_t k = 0; k < ts.size(); ++k) {
    RawTensor t;
    t.name = ts[k].first;
    t.ne = ts[k].second;
    uint64_t n = 1;
    for (uint64_t x : t.ne) n *= x;
    while (g.data.size() % g.alignment) g.data.push_back(0);
    t.offset = g.data.size();
    for (uint64_t i = 0; i < n; ++i) {
      float v = tiny_value(k, i);
      const uint8_t* p = reinterpret_cast<const uint8_t*>(&v);
      g.data.insert(g.data.end(), p, p + 4);
    }
    g.tensors.push_back(t);
  }
  return g;
}

struct HostileCase {
  std::string name;
  std::vector<uint8_t> bytes;
  bool reader_ok;       // the format reader alone accepts it (only the model loader fails)
  int32_t load_status;  // what qlft_model_load returns
  std::string message;  // a fragment the error message must contain
};

inline std::vector<HostileCase> hostile_gguf_cases() {
  std::vector<HostileCase> c;
  auto add = [&](const std::string& name, const RawGguf& g, bool reader_ok, const char* msg) {
    c.push_back({name, g.build(), reader_ok, QLFT_ERR_FORMAT, msg});
  };
  const RawGguf base = tiny_llama_gguf();
  const uint64_t huge = uint64_t(1) << 62;
  {
    RawGguf g = base;
    g.magic[0] = 'X';
    add("bad_magic", g, false, "magic");
  }
  {
    RawGguf g = base;
    g.version = 1;
    add("version_1", g, false, "version");
  }
  {
    RawGguf g = base;
    g.version = 0x03000000;
    add("version_big_endian", g, false, "version");
  }
  {
    RawGguf g = base;
    g.n_tensors = huge;
    add("n_tensors_huge", g, false, "tensor count");
  }
  {
    RawGguf g = base;
    g.n_kv = huge;
    add("n_kv_huge", g, false, "metadata count");
  }
  {
    RawGguf g = base;
    g.n_kv = ~uint64_t(0);
    add("n_kv_max", g, false, "metadata count");
  }
  {
    RawGguf g = base;
    g.n_tensors = g.tensors.size() + 1;
    add("n_tensors_plus_one", g, false, "");
  }
  {
    RawGguf g = base;
    g.n_kv = g.kv.size() + 1;
    add("n_kv_plus_one", g, false, "");
  }
  {
    RawGguf g = base;
    Bytes b;
    b.put<uint32_t>(kGSTRING);
    b.put<uint64_t>(huge);
    g.find_kv("tokenizer.ggml.tokens")->payload = b.b;
    add("string_array_length_huge", g, false, "tokenizer.ggml.tokens");
  }
  {
    RawGguf g = base;
    Bytes b;
    b.put<uint32_t>(kGF32);
    b.put<uint64_t>(huge);
    g.kv.push_back({"x.floats", kGARRAY, b.b});
    add("f32_array_length_huge", g, false, "x.floats");
  }
  {
    RawGguf g = base;
    Bytes b;
    b.str("abc", huge);
    g.kv.insert(g.kv.begin(), {"x.str", kGSTRING, b.b});
    add("string_length_huge", g, false, "x.str");
  }
  {
    RawGguf g = base;
    Bytes b;
    b.str("abc", ~uint64_t(0));
    g.kv.insert(g.kv.begin(), {"x.str", kGSTRING, b.b});
    add("string_length_max", g, false, "x.str");
  }
  {
    RawGguf g = base;
    g.kv.insert(g.kv.begin(), {"x.bad", 99, {1, 2, 3, 4}});
    add("unknown_kv_type", g, false, "unknown type");
  }
  {
    RawGguf g = base;
    Bytes b;
    b.put<uint32_t>(77);
    b.put<uint64_t>(1);
    b.put<uint32_t>(0);
    g.kv.push_back({"x.arr", kGARRAY, b.b});
    add("unknown_array_type", g, false, "x.arr");
  }
  {
    RawGguf g = base;  // arrays nested 12 deep
    Bytes b;
    for (int i = 0; i < 12; ++i) {
      b.put<uint32_t>(kGARRAY);
      b.put<uint64_t>(1);
    }
    b.put<uint32_t>(kGU8);
    b.put<uint64_t>(0);
    g.kv.push_back({"x.deep", kGARRAY, b.b});
    add("nested_arrays_too_deep", g, false, "deep");
  }
  {
    RawGguf g = base;
    g.kv.push_back(kv_u32("llama.block_count", 1));
    add("duplicate_key", g, false, "twice");
  }
  {
    RawGguf g = base;
    g.kv.push_back(kv_str("", "x"));
    add("empty_key", g, false, "empty key");
  }
  {
    RawGguf g = base;
    g.kv.push_back(kv_u32("general.alignment", 3));
    add("alignment_not_pow2", g, false, "general.alignment");
  }
  {
    RawGguf g = base;
    g.kv.push_back(kv_u32("general.alignment", 0));
    add("alignment_zero", g, false, "general.alignment");
  }
  {
    RawGguf g = base;
    g.kv.push_back(kv_str("general.alignment", "32"));
    add("alignment_string", g, false, "general.alignment");
  }
  {
    RawGguf g = base;
    g.tensors[1].offset += 4;
    add("tensor_offset_misaligned", g, false, "not aligned");
  }
  {
    RawGguf g = base;
    g.tensors[1].offset = huge;
    add("tensor_offset_out_of_range", g, false, "past the end");
  }
  {
    RawGguf g = base;
    g.tensors[1].offset = ~uint64_t(0) - 31;
    add("tensor_offset_max", g, false, "");
  }
  {
    RawGguf g = base;
    g.tensors[2].offset = g.tensors[0].offset;
    add("tensor_overlap", g, false, "overlap");
  }
  {
    RawGguf g = base;
    g.tensors[0].type = 99;
    add("tensor_unknown_type", g, false, "unknown ggml type");
  }
  {
    RawGguf g = base;
    g.tensors[0].ne = {8, 12, 1, 1, 1};
    add("tensor_5_dims", g, false, "dimensions");
  }
  {
    RawGguf g = base;
    g.tensors[0].ne = {uint64_t(1) << 32, uint64_t(1) << 32, uint64_t(1) << 32, uint64_t(1) << 32};
    add("tensor_numel_overflow", g, false, "");
  }
  {
    RawGguf g = base;
    g.tensors[0].ne = {uint64_t(1) << 41};
    add("tensor_dim_huge", g, false, "dimension");
  }
  {
    RawGguf g = base;
    g.tensors[0].type = 2;
    add("q4_0_row_not_block_multiple", g, false, "block");
  }
  {
    RawGguf g = base;
    g.tensors[3].name = g.tensors[2].name;
    add("duplicate_tensor_name", g, false, "twice");
  }
  {
    RawGguf g = base;  // a long but valid name: the reader takes it; the model misses token_embd
    g.tensors[0].name = std::string(1024, 'x');
    add("missing_token_embd", g, true, "token_embd.weight");
  }
  // Only the model loader can tell these apart from valid GGUF.
  {
    RawGguf g = base;
    g.find_kv("llama.block_count")->payload = kv_str("", "two").payload;
    g.find_kv("llama.block_count")->type = kGSTRING;
    add("block_count_string", g, true, "llama.block_count");
  }
  {
    RawGguf g = base;
    *g.find_kv("llama.block_count") = kv_u64("llama.block_count", uint64_t(1) << 40);
    add("block_count_huge", g, true, "llama.block_count");
  }
  {
    RawGguf g = base;
    *g.find_kv("llama.attention.head_count") = kv_i32("llama.attention.head_count", -2);
    add("head_count_negative", g, true, "llama.attention.head_count");
  }
  {
    RawGguf g = base;
    *g.find_kv("llama.attention.head_count") = kv_u32("llama.attention.head_count", 3);
    add("head_count_not_divisor", g, true, "head count");
  }
  {
    RawGguf g = base;
    for (size_t i = 0; i < g.kv.size(); ++i)
      if (g.kv[i].key == "general.architecture") g.kv.erase(g.kv.begin() + i);
    add("no_architecture", g, true, "general.architecture");
  }
  {
    RawGguf g = base;
    g.tensors.erase(g.tensors.end() - 1);
    add("missing_tensor", g, true, "blk.0.ffn_down.weight");
  }
  {
    RawGguf g = base;
    std::swap(g.find("blk.0.attn_k.weight")->ne[0], g.find("blk.0.attn_k.weight")->ne[1]);
    add("wrong_shape", g, true, "blk.0.attn_k.weight");
  }
  {
    RawGguf g = base;
    g.find("blk.0.attn_norm.weight")->type = 26;
    add("norm_is_i32", g, true, "blk.0.attn_norm.weight");
  }
  {
    RawGguf g = base;
    g.find("blk.0.ffn_norm.weight")->ne = {4};
    add("norm_too_short", g, true, "blk.0.ffn_norm.weight");
  }
  return c;
}

// ---- safetensors ----------------------------------------------------------------------------

struct RawStTensor {
  std::string name;
  std::string dtype;           // "F32"
  std::vector<int64_t> shape;  // outermost first
  std::vector<uint8_t> data;
  std::optional<std::pair<uint64_t, uint64_t>> offsets;  // override of the true data_offsets
};

struct RawSafetensors {
  std::vector<RawStTensor> tensors;
  std::map<std::string, std::string> metadata;
  std::optional<std::string> header;   // replaces the generated header text
  std::optional<uint64_t> header_len;  // replaces the true header length

  std::string make_header() const {
    std::string h = "{";
    bool first = true;
    if (!metadata.empty()) {
      h += "\"__metadata__\":{";
      for (auto it = metadata.begin(); it != metadata.end(); ++it)
        h += (it == metadata.begin() ? "" : ",") + ("\"" + it->first + "\":\"" + it->second + "\"");
      h += "}";
      first = false;
    }
    uint64_t off = 0;
    for (const RawStTensor& t : tensors) {
      uint64_t b = off, e = off + t.data.size();
      if (t.offsets) {
        b = t.offsets->first;
        e = t.offsets->second;
      }
      off += t.data.size();
      h += first ? "" : ",";
      first = false;
      h += "\"" + t.name + "\":{\"dtype\":\"" + t.dtype + "\",\"shape\":[";
      for (size_t i = 0; i < t.shape.size(); ++i) h += (i ? "," : "") + std::to_string(t.shape[i]);
      h += "],\"data_offsets\":[" + std::to_string(b) + "," + std::to_string(e) + "]}";
    }
    return h + "}";
  }
  std::vector<uint8_t> build() const {
    std::string h = header ? *header : make_header();
    while (h.size() % 8) h += ' ';
    Bytes b;
    b.put<uint64_t>(header_len ? *header_len : h.size());
    b.raw(h.data(), h.size());
    for (const RawStTensor& t : tensors) b.raw(t.data.data(), t.data.size());
    return b.b;
  }
  RawStTensor* find(const std::string& name) {
    for (RawStTensor& t : tensors)
      if (t.name == name) return &t;
    return nullptr;
  }
};

inline RawStTensor st_f32(const std::string& name, std::vector<int64_t> shape, size_t index) {
  RawStTensor t{name, "F32", shape, {}, {}};
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  t.data.resize(n * 4);
  for (size_t i = 0; i < n; ++i) {
    float v = tiny_value(index, i);
    std::memcpy(&t.data[i * 4], &v, 4);
  }
  return t;
}

// The tiny model as Hugging Face tensors. qwen2 adds q/k/v biases.
inline RawSafetensors tiny_hf_safetensors(const TinySpec& s = {}, bool qwen2 = false) {
  RawSafetensors r;
  const int64_t d = s.dim, q = s.heads * s.head_dim(), kv = s.kv_heads * s.head_dim(), f = s.ffn;
  size_t k = 0;
  r.tensors.push_back(st_f32("model.embed_tokens.weight", {s.vocab, d}, k++));
  r.tensors.push_back(st_f32("model.norm.weight", {d}, k++));
  if (!s.tied) r.tensors.push_back(st_f32("lm_head.weight", {s.vocab, d}, k++));
  for (int l = 0; l < s.layers; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    r.tensors.push_back(st_f32(p + "input_layernorm.weight", {d}, k++));
    r.tensors.push_back(st_f32(p + "post_attention_layernorm.weight", {d}, k++));
    r.tensors.push_back(st_f32(p + "self_attn.q_proj.weight", {q, d}, k++));
    r.tensors.push_back(st_f32(p + "self_attn.k_proj.weight", {kv, d}, k++));
    r.tensors.push_back(st_f32(p + "self_attn.v_proj.weight", {kv, d}, k++));
    r.tensors.push_back(st_f32(p + "self_attn.o_proj.weight", {d, q}, k++));
    r.tensors.push_back(st_f32(p + "mlp.gate_proj.weight", {f, d}, k++));
    r.tensors.push_back(st_f32(p + "mlp.up_proj.weight", {f, d}, k++));
    r.tensors.push_back(st_f32(p + "mlp.down_proj.weight", {d, f}, k++));
    if (qwen2) {
      r.tensors.push_back(st_f32(p + "self_attn.q_proj.bias", {q}, k++));
      r.tensors.push_back(st_f32(p + "self_attn.k_proj.bias", {kv}, k++));
      r.tensors.push_back(st_f32(p + "self_attn.v_proj.bias", {kv}, k++));
    }
  }
  return r;
}

inline std::string tiny_hf_config(const TinySpec& s = {}, bool qwen2 = false) {
  std::string arch = qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM";
  return "{\n  \"architectures\": [\"" + arch + "\"],\n  \"model_type\": \"" +
         (qwen2 ? "qwen2" : "llama") + "\",\n  \"hidden_size\": " + std::to_string(s.dim) +
         ",\n  \"intermediate_size\": " + std::to_string(s.ffn) +
         ",\n  \"num_hidden_layers\": " + std::to_string(s.layers) +
         ",\n  \"num_attention_heads\": " + std::to_string(s.heads) +
         ",\n  \"num_key_value_heads\": " + std::to_string(s.kv_heads) +
         ",\n  \"vocab_size\": " + std::to_string(s.vocab) +
         ",\n  \"max_position_embeddings\": 128,\n  \"rms_norm_eps\": 1e-06,\n  \"rope_theta\": "
         "10000.0,\n  \"tie_word_embeddings\": " +
         (s.tied ? "true" : "false") + "\n}\n";
}

// Hostile single-file safetensors (each replaces model.safetensors of a valid tiny model).
inline std::vector<HostileCase> hostile_safetensors_cases() {
  std::vector<HostileCase> c;
  auto add = [&](const std::string& name, const RawSafetensors& r, bool reader_ok, const char* msg,
                 int32_t status = QLFT_ERR_FORMAT) {
    c.push_back({name, r.build(), reader_ok, status, msg});
  };
  const RawSafetensors base = tiny_hf_safetensors();
  c.push_back({"empty_file", {}, false, QLFT_ERR_FORMAT, "truncated"});
  c.push_back({"seven_bytes", {1, 0, 0, 0, 0, 0, 0}, false, QLFT_ERR_FORMAT, "truncated"});
  {
    RawSafetensors r = base;
    r.header_len = uint64_t(1) << 62;
    add("header_len_huge", r, false, "header length");
  }
  {
    RawSafetensors r = base;
    r.header_len = ~uint64_t(0);
    add("header_len_max", r, false, "header length");
  }
  {
    RawSafetensors r = base;
    r.header_len = r.build().size();
    add("header_len_past_end", r, false, "header length");
  }
  {
    RawSafetensors r = base;
    r.header = "{\"a\": [1, 2";
    add("header_not_json", r, false, "JSON");
  }
  {
    RawSafetensors r = base;
    r.header = "[1, 2, 3]";
    add("header_is_array", r, false, "object");
  }
  {
    RawSafetensors r = base;
    r.header = std::string(100000, '[') + std::string(100000, ']');
    add("header_deeply_nested", r, false, "");
  }
  {
    RawSafetensors r = base;
    r.header = "{\"x\": 5}";
    add("entry_not_object", r, false, "'x'");
  }
  {
    RawSafetensors r = base;
    r.header = "{\"x\": {\"shape\": [1], \"data_offsets\": [0, 4]}}";
    add("no_dtype", r, false, "dtype");
  }
  {
    RawSafetensors r = base;
    r.header = "{\"x\": {\"dtype\": \"F32\", \"data_offsets\": [0, 4]}}";
    add("no_shape", r, false, "shape");
  }
  {
    RawSafetensors r = base;
    r.header = "{\"x\": {\"dtype\": \"F32\", \"shape\": [1]}}";
    add("no_offsets", r, false, "data_offsets");
  }
  {
    RawSafetensors r = base;
    r.tensors[1].dtype = "Q4";
    add("unknown_dtype", r, false, "Q4");
  }
  {
    RawSafetensors r = base;
    r.tensors[1].dtype = "U32";
    r.tensors[1].shape = {8};
    add("unsupported_dtype", r, false, "U32", QLFT_ERR_UNSUPPORTED);
  }
  {
    RawSafetensors r = base;
    r.tensors[1].shape = {-8};
    add("negative_dim", r, false, "shape");
  }
  {
    RawSafetensors r = base;
    r.tensors[1].shape = {int64_t(1) << 41};
    add("dim_huge", r, false, "too large");
  }
  {
    RawSafetensors r = base;
    r.tensors[1].shape = {int64_t(1) << 30, int64_t(1) << 30};
    add("numel_overflow", r, false, "too many elements");
  }
  {
    RawSafetensors r = base;
    r.tensors[1].shape = {1, 1, 1, 1, 1, 1, 1, 1, 8};
    add("nine_dims", r, false, "dimensions");
  }
  {
    RawSafetensors r = base;
    r.tensors[1].offsets = {{0, uint64_t(1) << 40}};
    add("offset_out_of_range", r, false, "outside");
  }
  {
    RawSafetensors r = base;
    r.tensors[1].offsets = {{100, 68}};
    add("offset_begin_after_end", r, false, "outside");
  }
  {
    RawSafetensors r = base;
    r.tensors[1].offsets = {{0, 16}};
    add("size_mismatch", r, false, "need");
  }
  {
    RawSafetensors r = base;
    r.tensors[2].offsets = {{0, r.tensors[2].data.size()}};
    add("overlap", r, false, "overlap");
  }
  {
    RawSafetensors r = base;  // a 2-byte U8 first pushes every F32 after it to an odd offset
    r.tensors.insert(r.tensors.begin(), RawStTensor{"pad.u8", "U8", {2}, {1, 2}, {}});
    add("misaligned_f32", r, false, "not a multiple");
  }
  {
    RawSafetensors r = base;
    std::string h = r.make_header();
    h.insert(1, "\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[8],\"data_offsets\":[0,32]},");
    r.header = h;
    add("duplicate_name", r, false, "twice");
  }
  {
    RawSafetensors r = base;
    r.header = "{\"__metadata__\": [1]}";
    add("metadata_not_object", r, false, "__metadata__");
  }
  {
    RawSafetensors r = base;
    r.header = "{\"__metadata__\": {\"a\": 1}}";
    add("metadata_value_not_string", r, false, "__metadata__");
  }
  // Only the model loader rejects these.
  {
    RawSafetensors r = base;
    r.tensors.erase(r.tensors.begin() + 1);
    add("missing_tensor", r, true, "model.norm.weight");
  }
  {
    RawSafetensors r = base;
    RawStTensor* t = r.find("model.layers.0.self_attn.k_proj.weight");
    std::swap(t->shape[0], t->shape[1]);
    add("wrong_shape", r, true, "model.layers.0.self_attn.k_proj.weight");
  }
  {
    RawSafetensors r = base;
    r.find("model.norm.weight")->dtype = "I32";
    add("wrong_dtype", r, true, "model.norm.weight");
  }
  return c;
}

}  // namespace qlft_test
