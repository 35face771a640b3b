// Hugging Face model directories (config.json + safetensors, single or sharded) written with
// qlft's SafetensorsWriter: llama and qwen2 (q/k/v biases), tied and untied embeddings, bf16 and
// f32 storage. The loaded shapes must follow config.json and every weight must read back as
// written; inconsistent directories fail with QLFT_ERR_FORMAT naming the tensor or key.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>

#include "support/settings.h"
#include "core/error.h"
#include "core/memory.h"
#include "formats/atomic_file.h"
#include "formats/safetensors_writer.h"
#include "model/model.h"
#include "support/test_support.h"

using namespace qlft;
using nlohmann::json;

namespace {

struct Spec {
  std::string arch = "llama";  // llama | qwen2
  int dim = 16, layers = 2, heads = 4, kv_heads = 2, ffn = 24, vocab = 20;
  bool tied = false;
  DType store = DType::F32;
  int shards = 1;
};

json config_for(const Spec& s) {
  return {{"architectures", {s.arch == "qwen2" ? "Qwen2ForCausalLM" : "LlamaForCausalLM"}},
          {"model_type", s.arch},
          {"hidden_size", s.dim},
          {"intermediate_size", s.ffn},
          {"num_hidden_layers", s.layers},
          {"num_attention_heads", s.heads},
          {"num_key_value_heads", s.kv_heads},
          {"vocab_size", s.vocab},
          {"max_position_embeddings", 256},
          {"rms_norm_eps", 1e-6},
          {"rope_theta", 1000000.0},
          {"tie_word_embeddings", s.tied}};
}

// Writes the model; returns name -> the float values stored (after rounding to s.store).
std::map<std::string, std::vector<float>> write_model(
    const std::string& dir, const Spec& s, const json& config, const std::string& skip = "",
    const std::string& reshape = "", const std::string& poison = "", float poison_value = 0.0f) {
  write_file_atomic(dir + "/config.json", config.dump(2));
  const int64_t hd = s.dim / s.heads, q = s.heads * hd, kv = s.kv_heads * hd;
  std::vector<std::pair<std::string, std::vector<int64_t>>> ts = {
      {"model.embed_tokens.weight", {s.vocab, s.dim}}, {"model.norm.weight", {s.dim}}};
  if (!s.tied) ts.push_back({"lm_head.weight", {s.vocab, s.dim}});
  for (int l = 0; l < s.layers; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    ts.push_back({p + "input_layernorm.weight", {s.dim}});
    ts.push_back({p + "post_attention_layernorm.weight", {s.dim}});
    ts.push_back({p + "self_attn.q_proj.weight", {q, s.dim}});
    ts.push_back({p + "self_attn.k_proj.weight", {kv, s.dim}});
    ts.push_back({p + "self_attn.v_proj.weight", {kv, s.dim}});
    ts.push_back({p + "self_attn.o_proj.weight", {s.dim, q}});
    ts.push_back({p + "mlp.gate_proj.weight", {s.ffn, s.dim}});
    ts.push_back({p + "mlp.up_proj.weight", {s.ffn, s.dim}});
    ts.push_back({p + "mlp.down_proj.weight", {s.dim, s.ffn}});
    if (s.arch == "qwen2") {
      ts.push_back({p + "self_attn.q_proj.bias", {q}});
      ts.push_back({p + "self_attn.k_proj.bias", {kv}});
      ts.push_back({p + "self_attn.v_proj.bias", {kv}});
    }
  }
  std::vector<SafetensorsWriter> w(s.shards);
  std::map<std::string, std::string> wm;
  std::map<std::string, std::vector<float>> values;
  for (size_t k = 0; k < ts.size(); ++k) {
    auto [name, shape] = ts[k];
    if (name == skip) continue;
    if (name == reshape) std::swap(shape[0], shape.back()), shape.push_back(1);
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> v(n);
    for (int64_t i = 0; i < n; ++i) v[i] = 0.01f * static_cast<float>((i * 7 + k * 13) % 97) - 0.4f;
    if (name == poison) v[5] = poison_value;
    if (s.store == DType::BF16)
      for (float& x : v) x = bf16_to_f32(f32_to_bf16(x));
    values[name] = v;
    const int shard = static_cast<int>(k % s.shards);
    w[shard].add_tensor_f32(name, shape, v.data(), s.store);
    wm[name] = "model-0000" + std::to_string(shard + 1) + ".safetensors";
  }
  if (s.shards == 1) {
    w[0].write(dir + "/model.safetensors");
  } else {
    uint64_t total = 0;
    for (int i = 0; i < s.shards; ++i) {
      w[i].write(dir + "/model-0000" + std::to_string(i + 1) + ".safetensors");
      total += w[i].data_bytes();
    }
    write_safetensors_index(dir + "/model.safetensors.index.json", total, wm);
  }
  return values;
}

std::vector<float> rows_of(const QWeight& w) {
  std::vector<float> out(w.rows * w.cols);
  w.dequantize_rows(0, w.rows, out.data());
  return out;
}

std::unique_ptr<Model> load(MemoryTracker& tr, const std::string& path) {
  LoadOptions opt;
  opt.quant_type = qlft::QuantType::Keep;
  return load_model(&tr, path, opt);
}

void check_model(const Model& m, const Spec& s, std::map<std::string, std::vector<float>>& v) {
  const int hd = s.dim / s.heads;
  EXPECT_EQ(m.cfg.arch, s.arch);
  EXPECT_EQ(m.source_format, "safetensors");
  EXPECT_EQ(m.cfg.dim, s.dim);
  EXPECT_EQ(m.cfg.n_layers, s.layers);
  EXPECT_EQ(m.cfg.n_heads, s.heads);
  EXPECT_EQ(m.cfg.n_kv_heads, s.kv_heads);
  EXPECT_EQ(m.cfg.head_dim, hd);
  EXPECT_EQ(m.cfg.ffn_dim, s.ffn);
  EXPECT_EQ(m.cfg.vocab, s.vocab);
  EXPECT_EQ(m.cfg.context_length, 256);
  EXPECT_FLOAT_EQ(m.cfg.rope_theta, 1e6f);
  EXPECT_FLOAT_EQ(m.cfg.rms_eps, 1e-6f);
  EXPECT_EQ(m.cfg.tied_embeddings, s.tied);
  EXPECT_FALSE(m.cfg.rope_adjacent);  // Hugging Face rotate-half order
  EXPECT_EQ(m.cfg.qkv_bias, s.arch == "qwen2");
  EXPECT_EQ(rows_of(m.tok_embd), v["model.embed_tokens.weight"]);
  if (s.tied)
    EXPECT_EQ(m.output.rows, 0);
  else
    EXPECT_EQ(rows_of(m.output), v["lm_head.weight"]);
  EXPECT_EQ(rows_of(m.head()), v[s.tied ? "model.embed_tokens.weight" : "lm_head.weight"]);
  ASSERT_EQ(m.layers.size(), static_cast<size_t>(s.layers));
  const int64_t out[kProjCount] = {
      s.heads * hd, s.kv_heads * hd, s.kv_heads * hd, s.dim, s.ffn, s.ffn, s.dim};
  const int64_t in[kProjCount] = {s.dim, s.dim, s.dim, s.heads * hd, s.dim, s.dim, s.ffn};
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const LayerWeights& L = m.layers[l];
    for (int j = 0; j < kProjCount; ++j) {
      const std::string n =
          p + (j < 4 ? "self_attn." : "mlp.") + proj_peft_name(static_cast<Proj>(j)) + ".weight";
      EXPECT_EQ(L.proj[j].rows, out[j]) << n;
      EXPECT_EQ(L.proj[j].cols, in[j]) << n;
      EXPECT_EQ(rows_of(L.proj[j]), v[n]) << n;
    }
    auto vec = [](const Buffer& b) {
      return std::vector<float>(b.as<float>(), b.as<float>() + b.size() / 4);
    };
    EXPECT_EQ(vec(L.attn_norm), v[p + "input_layernorm.weight"]);
    EXPECT_EQ(vec(L.ffn_norm), v[p + "post_attention_layernorm.weight"]);
    for (int j = 0; j < 3; ++j) {
      if (s.arch == "qwen2")
        EXPECT_EQ(vec(L.bias[j]),
                  v[p + "self_attn." + proj_peft_name(static_cast<Proj>(j)) + ".bias"]);
      else
        EXPECT_TRUE(L.bias[j].empty());
    }
  }
}

struct Failure {
  int32_t status = QLFT_OK;
  std::string message;
};

Failure load_fails(const std::string& dir) {
  MemoryTracker tr;
  Failure f;
  try {
    load(tr, dir);
  } catch (const Error& e) {
    f.status = e.status();
    f.message = e.what();
  }
  EXPECT_EQ(tr.total_reserved(), 0u);
  return f;
}

void expect_format_error(const std::string& dir, const std::string& fragment) {
  Failure f = load_fails(dir);
  EXPECT_EQ(f.status, QLFT_ERR_FORMAT) << f.message;
  EXPECT_NE(f.message.find(fragment), std::string::npos) << f.message;
}

}  // namespace

TEST(HfModel, LlamaUntiedSingleFile) {
  Spec s;
  const std::string dir = qlft_test::temp_dir("hf-llama");
  auto v = write_model(dir, s, config_for(s));
  MemoryTracker tr;
  auto m = load(tr, dir);
  check_model(*m, s, v);
  // Loading through the .safetensors file path (config.json beside it) is the same model.
  auto m2 = load(tr, dir + "/model.safetensors");
  EXPECT_EQ(m2->cfg.dim, s.dim);
  // Every tensor size here is a multiple of 64 bytes, so tracked bytes equal the weight bytes;
  // nothing is left in workspace after loading.
  const MemorySnapshot snap = tr.snapshot();
  EXPECT_EQ(snap.reserved[static_cast<int>(MemCategory::Weights)],
            m->weight_bytes() + m2->weight_bytes());
  EXPECT_EQ(snap.reserved[static_cast<int>(MemCategory::Workspace)], 0u);
  m.reset();
  m2.reset();
  EXPECT_EQ(tr.total_reserved(), 0u);
}

TEST(HfModel, Qwen2BiasesTiedBf16Sharded) {
  Spec s;
  s.arch = "qwen2";
  s.tied = true;
  s.store = DType::BF16;
  s.shards = 3;
  const std::string dir = qlft_test::temp_dir("hf-qwen2");
  auto v = write_model(dir, s, config_for(s));
  MemoryTracker tr;
  auto m = load(tr, dir);
  check_model(*m, s, v);
  EXPECT_EQ(m->quant_summary, "bf16");  // keep: bf16 linears stay bf16
}

// Single weight groups loaded again (WeightGroupSource, a deferred load) hold the bytes of the
// full load: bf16 kept with biases over 3 shards, untied f32.
TEST(HfModel, WeightGroupsLoadAgainAlike) {
  for (bool qwen : {true, false}) {
    Spec s;
    s.arch = qwen ? "qwen2" : "llama";
    s.store = qwen ? DType::BF16 : DType::F32;
    s.shards = qwen ? 3 : 1;
    SCOPED_TRACE(s.arch);
    const std::string dir = qlft_test::temp_dir("hf-groups");
    write_model(dir, s, config_for(s));
    MemoryTracker tr;
    LoadOptions opt;
    opt.quant_type = qlft::QuantType::Keep;
    auto full = load_model(&tr, dir, opt);
    opt.deferred = true;
    auto lazy = load_model(&tr, dir, opt);
    ASSERT_TRUE(lazy->stream);
    EXPECT_EQ(lazy->weight_bytes(), full->weight_bytes());
    auto bytes = [](Model& m, int g) {
      std::vector<std::vector<uint8_t>> out;
      for_each_weight_buffer(m, [&](int bg, Buffer& b) {
        if (bg != g) return;
        const auto* p = b.empty() ? nullptr : b.as<const uint8_t>();
        out.emplace_back(p, p ? p + b.size() : p);
      });
      return out;
    };
    auto src = WeightGroupSource::open(&tr, *lazy);
    for (int g = 0; g < s.layers + 2; ++g) {
      src->load(*lazy, g, /*with_head=*/true);
      EXPECT_EQ(bytes(*lazy, g), bytes(*full, g)) << "group " << g;
    }
  }
}

TEST(HfModel, HeadDimFromConfig) {
  Spec s;
  json c = config_for(s);
  c["head_dim"] = s.dim / s.heads;  // explicit and equal: accepted
  const std::string dir = qlft_test::temp_dir("hf-headdim");
  auto v = write_model(dir, s, c);
  MemoryTracker tr;
  check_model(*load(tr, dir), s, v);
}

TEST(HfModel, MissingTensorsAreNamed) {
  Spec s;
  for (const std::string name :
       {"model.embed_tokens.weight", "model.norm.weight", "model.layers.1.mlp.down_proj.weight",
        "model.layers.0.input_layernorm.weight"}) {
    const std::string dir = qlft_test::temp_dir("hf-missing");
    write_model(dir, s, config_for(s), name);
    expect_format_error(dir, name);
  }
  // qwen2 needs its biases.
  Spec q;
  q.arch = "qwen2";
  const std::string dir = qlft_test::temp_dir("hf-missing-bias");
  write_model(dir, q, config_for(q), "model.layers.1.self_attn.v_proj.bias");
  expect_format_error(dir, "model.layers.1.self_attn.v_proj.bias");
  // Untied (explicitly) without lm_head.
  const std::string d2 = qlft_test::temp_dir("hf-missing-head");
  write_model(d2, s, config_for(s), "lm_head.weight");
  expect_format_error(d2, "lm_head.weight");
}

TEST(HfModel, WrongShapesAreNamed) {
  Spec s;
  for (const std::string name : {"model.layers.0.self_attn.k_proj.weight", "model.norm.weight",
                                 "lm_head.weight", "model.layers.1.mlp.up_proj.weight"}) {
    const std::string dir = qlft_test::temp_dir("hf-shape");
    write_model(dir, s, config_for(s), "", name);
    expect_format_error(dir, name);
  }
  // A config that disagrees with the tensors: the first tensor checked is named.
  json c = config_for(s);
  c["intermediate_size"] = 32;
  const std::string dir = qlft_test::temp_dir("hf-shape-cfg");
  write_model(dir, s, c);
  expect_format_error(dir, "model.layers.0.mlp.gate_proj.weight");
}

// Quantizing a NaN or Inf weight is undefined (float-to-int conversion out of range; found by
// fuzz_hf_model): the load refuses it, naming file, tensor and element, and frees everything.
TEST(HfModel, NonFiniteWeightIsRefusedWhenQuantizing) {
  Spec s;
  const std::string name = "model.layers.1.mlp.up_proj.weight";
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    for (DType store : {DType::F32, DType::BF16}) {
      s.store = store;
      const std::string dir = qlft_test::temp_dir("hf-nonfinite");
      write_model(dir, s, config_for(s), "", "", name, bad);
      for (const char* quant : {"nf4", "int8"}) {
        LoadOptions opt;
        opt.quant_type = qlft_test::quant_type(quant);
        MemoryTracker tr;
        Failure f;
        try {
          load_model(&tr, dir, opt);
        } catch (const Error& e) {
          f.status = e.status();
          f.message = e.what();
        }
        EXPECT_EQ(f.status, QLFT_ERR_FORMAT) << quant << ": " << f.message;
        EXPECT_NE(f.message.find(name), std::string::npos) << f.message;
        EXPECT_NE(f.message.find("model.safetensors"), std::string::npos) << f.message;
        EXPECT_NE(f.message.find("element 5"), std::string::npos) << f.message;
        EXPECT_EQ(tr.total_reserved(), 0u);
      }
      // Kept unquantized, the value is loaded as stored (training then reports non-finite loss).
      MemoryTracker tr;
      auto m = load(tr, dir);
      std::vector<float> up = rows_of(m->layers[1].proj[static_cast<int>(Proj::Up)]);
      EXPECT_EQ(std::isnan(up[5]), std::isnan(bad));
    }
  }
}

TEST(HfModel, BadConfigValuesNameTheKey) {
  Spec s;
  const std::string dir = qlft_test::temp_dir("hf-config");
  write_model(dir, s, config_for(s));
  struct Case {
    const char* key;
    json value;
  };
  const std::vector<Case> cases = {{"hidden_size", "abc"},
                                   {"hidden_size", 0},
                                   {"hidden_size", -16},
                                   {"hidden_size", 1.5},
                                   {"num_hidden_layers", 0},
                                   {"num_hidden_layers", uint64_t(1) << 63},
                                   {"num_attention_heads", 5},
                                   {"num_key_value_heads", 3},
                                   {"vocab_size", int64_t(1) << 40},
                                   {"intermediate_size", nullptr},
                                   {"rms_norm_eps", -1.0},
                                   {"rope_theta", "x"},
                                   {"tie_word_embeddings", "yes"},
                                   {"max_position_embeddings", -1}};
  for (const Case& c : cases) {
    json cfg = config_for(s);
    cfg[c.key] = c.value;
    write_file_atomic(dir + "/config.json", cfg.dump());
    SCOPED_TRACE(std::string(c.key) + " = " + c.value.dump());
    expect_format_error(dir, c.key);
  }
  // Not JSON / not an object / number overflow.
  for (const char* text : {"{\"hidden_size\": ", "[1, 2]", "{\"hidden_size\": 1e999}"}) {
    write_file_atomic(dir + "/config.json", text);
    expect_format_error(dir, "config.json");
  }
  // Unsupported architecture.
  json cfg = config_for(s);
  cfg["architectures"] = {"GPT2LMHeadModel"};
  cfg["model_type"] = "gpt2";
  write_file_atomic(dir + "/config.json", cfg.dump());
  Failure f = load_fails(dir);
  EXPECT_EQ(f.status, QLFT_ERR_UNSUPPORTED) << f.message;
  EXPECT_NE(f.message.find("GPT2LMHeadModel"), std::string::npos);
}

TEST(HfModel, MissingConfigOrWeightsIsIoError) {
  const std::string dir = qlft_test::temp_dir("hf-io");
  Failure f = load_fails(dir);
  EXPECT_EQ(f.status, QLFT_ERR_IO) << f.message;
  EXPECT_NE(f.message.find("config.json"), std::string::npos) << f.message;
  Spec s;
  write_file_atomic(dir + "/config.json", config_for(s).dump());
  f = load_fails(dir);
  EXPECT_EQ(f.status, QLFT_ERR_IO) << f.message;
  EXPECT_NE(f.message.find(dir), std::string::npos) << f.message;
  f = load_fails(dir + "/does-not-exist");
  EXPECT_EQ(f.status, QLFT_ERR_IO) << f.message;
}
