// Model loading through the C ABI: stories260K (shape against the `gguf` package's view of the
// file), tiny Hugging Face directories, the memory budget (out-of-memory names the category and
// leaks nothing), and every hostile GGUF/safetensors case.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "qlft.h"
#include "support/format_cases.h"
#include "support/test_support.h"

namespace {

struct Rt {
  qlft_runtime* rt = nullptr;
  explicit Rt(const char* limit = nullptr) {
    qlft_config* c = nullptr;
    qlft_config_create(&c);
    if (limit) EXPECT_EQ(qlft_config_set(c, "memory.limit", limit), QLFT_OK);
    EXPECT_EQ(qlft_runtime_create(c, &rt), QLFT_OK) << qlft_last_error();
    qlft_config_free(c);
  }
  ~Rt() { qlft_runtime_free(rt); }
  qlft_memory_report report() const {
    qlft_memory_report r{};
    r.struct_size = sizeof r;
    EXPECT_EQ(qlft_runtime_memory_report(rt, &r), QLFT_OK);
    return r;
  }
};

struct Cfg {
  qlft_config* c = nullptr;
  explicit Cfg(const char* quant) {
    qlft_config_create(&c);
    if (quant) EXPECT_EQ(qlft_config_set(c, "quant.type", quant), QLFT_OK);
  }
  ~Cfg() { qlft_config_free(c); }
};

qlft_model_details info_of(const qlft_model* m) {
  qlft_model_details d{};
  d.struct_size = sizeof d;
  EXPECT_EQ(qlft_model_info(m, &d), QLFT_OK) << qlft_last_error();
  return d;
}

nlohmann::json stories_fixture() {
  std::ifstream f(qlft_test::fixture_path("formats/stories260K.json"));
  return nlohmann::json::parse(f);
}

}  // namespace

TEST(ApiModel, Stories260KKeepsF32AndReportsItsShape) {
  QLFT_NEED_SHARED(path, "models/stories260K.gguf");
  const auto fx = stories_fixture();
  uint64_t bytes = 0, params = 0;
  for (const auto& t : fx["tensors"]) {
    bytes += t["nbytes"].get<uint64_t>();
    uint64_t n = 1;
    for (const auto& d : t["ne"]) n *= d.get<uint64_t>();
    params += n;
  }
  Rt rt;
  Cfg cfg("keep");
  qlft_model* m = nullptr;
  ASSERT_EQ(qlft_model_load(rt.rt, path.c_str(), cfg.c, &m), QLFT_OK) << qlft_last_error();
  const qlft_model_details d = info_of(m);
  EXPECT_EQ(d.struct_size, sizeof d);
  EXPECT_STREQ(d.architecture, "llama");
  EXPECT_STREQ(d.source_format, "gguf");
  EXPECT_STREQ(d.quant_type, "f32");
  EXPECT_EQ(d.dim, 64u);
  EXPECT_EQ(d.n_layers, 5u);
  EXPECT_EQ(d.n_heads, 8u);
  EXPECT_EQ(d.n_kv_heads, 4u);
  EXPECT_EQ(d.head_dim, 8u);
  EXPECT_EQ(d.ffn_dim, 172u);
  EXPECT_EQ(d.vocab_size, 512u);
  EXPECT_EQ(d.context_length, 2048u);
  EXPECT_EQ(d.tied_embeddings, 0u);
  EXPECT_EQ(d.rope_adjacent_pairs, 1u);
  EXPECT_FLOAT_EQ(d.rms_norm_eps, 1e-5f);
  EXPECT_EQ(d.n_params, params);
  EXPECT_EQ(d.weight_bytes, bytes);  // keep: the file's f32 bytes, one for one
  // The memory report shows the weights (every tensor here is a multiple of 64 bytes).
  qlft_memory_report r = rt.report();
  EXPECT_EQ(r.reserved[QLFT_MEM_WEIGHTS], bytes);
  EXPECT_EQ(r.allocated[QLFT_MEM_WEIGHTS], bytes);
  EXPECT_EQ(r.reserved[QLFT_MEM_WORKSPACE], 0u);
  EXPECT_GE(r.total_reserved, bytes);
  EXPECT_GE(r.peak[QLFT_MEM_WEIGHTS], bytes);
  EXPECT_GT(r.process_peak_rss, 0u);
  qlft_model_free(m);
  r = rt.report();
  EXPECT_EQ(r.total_reserved, 0u);
  EXPECT_EQ(r.reserved[QLFT_MEM_WEIGHTS], 0u);
}

TEST(ApiModel, Stories260KDefaultNf4) {
  QLFT_NEED_SHARED(path, "models/stories260K.gguf");
  Rt rt;
  qlft_model* m = nullptr;
  int32_t st = qlft_model_load(rt.rt, path.c_str(), nullptr, &m);
  ASSERT_EQ(st, QLFT_OK) << qlft_last_error();
  const qlft_model_details d = info_of(m);
  EXPECT_STREQ(d.quant_type, "nf4");
  EXPECT_EQ(d.dim, 64u);
  EXPECT_EQ(d.n_layers, 5u);
  EXPECT_EQ(d.n_heads, 8u);
  EXPECT_EQ(d.n_kv_heads, 4u);
  EXPECT_EQ(d.ffn_dim, 172u);
  EXPECT_EQ(d.vocab_size, 512u);
  // The linears shrink ~8x (4 bits + absmax); embeddings, head and norms stay f32.
  const uint64_t linear_f32 = 5 * (64 * 64 * 2 + 64 * 32 * 2 + 64 * 172 * 3) * 4;
  const uint64_t other_f32 = (2 * 512 * 64 + 64 + 5 * 2 * 64) * 4;
  EXPECT_LT(d.weight_bytes, other_f32 + linear_f32 / 4);
  EXPECT_GT(d.weight_bytes, other_f32 + linear_f32 / 8);
  // The report counts each buffer rounded up to 64 bytes (NF4 has several small ones per weight).
  const uint64_t reserved = rt.report().reserved[QLFT_MEM_WEIGHTS];
  EXPECT_GE(reserved, d.weight_bytes);
  EXPECT_LT(reserved - d.weight_bytes, 64u * 8 * 40);
  qlft_model_free(m);
  EXPECT_EQ(rt.report().total_reserved, 0u);
}

TEST(ApiModel, MemoryLimitSmallerThanTheModelIsOutOfMemory) {
  QLFT_NEED_SHARED(path, "models/stories260K.gguf");
  Rt rt("512K");  // the f32 weights are 1.1 MiB
  const qlft_memory_report before = rt.report();
  EXPECT_EQ(before.limit, 512u * 1024);
  Cfg cfg("keep");
  qlft_model* m = reinterpret_cast<qlft_model*>(0x1);
  ASSERT_EQ(qlft_model_load(rt.rt, path.c_str(), cfg.c, &m), QLFT_ERR_OUT_OF_MEMORY);
  EXPECT_EQ(m, nullptr);
  const std::string msg = qlft_last_error();
  EXPECT_NE(msg.find("weights"), std::string::npos) << msg;
  EXPECT_NE(msg.find("memory.limit"), std::string::npos) << msg;
  const qlft_memory_report after = rt.report();
  EXPECT_EQ(after.total_reserved, before.total_reserved);
  for (int c = 0; c < QLFT_MEM_CATEGORY_COUNT; ++c) {
    EXPECT_EQ(after.reserved[c], before.reserved[c]) << qlft_memory_category_name(c);
    EXPECT_EQ(after.allocated[c], before.allocated[c]) << qlft_memory_category_name(c);
  }
  EXPECT_GT(after.peak[QLFT_MEM_WEIGHTS], 0u);  // it got part of the way
  EXPECT_LE(after.total_peak, 512u * 1024);     // and never past the limit
  // The same runtime still loads a model that fits.
  const std::string dir = qlft_test::temp_dir("api-oom-fit");
  const auto bytes = qlft_test::tiny_llama_gguf().build();
  qlft_test::write_file(dir + "/tiny.gguf", bytes.data(), bytes.size());
  ASSERT_EQ(qlft_model_load(rt.rt, (dir + "/tiny.gguf").c_str(), cfg.c, &m), QLFT_OK)
      << qlft_last_error();
  EXPECT_GT(rt.report().reserved[QLFT_MEM_WEIGHTS], 0u);
  qlft_model_free(m);
  EXPECT_EQ(rt.report().total_reserved, 0u);
}

TEST(ApiModel, TinyHuggingFaceDirectories) {
  for (bool qwen2 : {false, true}) {
    for (bool tied : {false, true}) {
      SCOPED_TRACE(std::string(qwen2 ? "qwen2" : "llama") + (tied ? " tied" : " untied"));
      qlft_test::TinySpec s;
      s.tied = tied;
      const std::string dir = qlft_test::temp_dir("api-hf");
      const auto st = qlft_test::tiny_hf_safetensors(s, qwen2).build();
      qlft_test::write_file(dir + "/model.safetensors", st.data(), st.size());
      const std::string cj = qlft_test::tiny_hf_config(s, qwen2);
      qlft_test::write_file(dir + "/config.json", cj.data(), cj.size());
      Rt rt;
      Cfg cfg("keep");
      qlft_model* m = nullptr;
      ASSERT_EQ(qlft_model_load(rt.rt, dir.c_str(), cfg.c, &m), QLFT_OK) << qlft_last_error();
      const qlft_model_details d = info_of(m);
      EXPECT_STREQ(d.architecture, qwen2 ? "qwen2" : "llama");
      EXPECT_STREQ(d.source_format, "safetensors");
      EXPECT_EQ(d.dim, 8u);
      EXPECT_EQ(d.n_layers, 1u);
      EXPECT_EQ(d.n_heads, 2u);
      EXPECT_EQ(d.n_kv_heads, 1u);
      EXPECT_EQ(d.ffn_dim, 16u);
      EXPECT_EQ(d.vocab_size, 12u);
      EXPECT_EQ(d.context_length, 128u);
      EXPECT_EQ(d.tied_embeddings, tied ? 1u : 0u);
      EXPECT_EQ(d.rope_adjacent_pairs, 0u);
      uint64_t params = 0;
      for (const auto& t : qlft_test::tiny_hf_safetensors(s, qwen2).tensors)
        params += t.data.size() / 4;
      EXPECT_EQ(d.n_params, params);
      qlft_model_free(m);
    }
  }
}

TEST(ApiModel, MissingPathIsIoError) {
  Rt rt;
  qlft_model* m = nullptr;
  EXPECT_EQ(qlft_model_load(rt.rt, "/nonexistent/model.gguf", nullptr, &m), QLFT_ERR_IO);
  EXPECT_NE(std::string(qlft_last_error()).find("/nonexistent/model.gguf"), std::string::npos);
  EXPECT_EQ(qlft_model_load(rt.rt, "", nullptr, &m), QLFT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(qlft_model_load(rt.rt, nullptr, nullptr, &m), QLFT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(qlft_model_load(rt.rt, "x", nullptr, nullptr), QLFT_ERR_INVALID_ARGUMENT);
}

TEST(ApiModel, HostileGgufCases) {
  const std::string dir = qlft_test::temp_dir("api-hostile-gguf");
  Rt rt;
  Cfg cfg("keep");
  for (const auto& c : qlft_test::hostile_gguf_cases()) {
    SCOPED_TRACE(c.name);
    const std::string p = dir + "/" + c.name + ".gguf";
    qlft_test::write_file(p, c.bytes.data(), c.bytes.size());
    qlft_model* m = reinterpret_cast<qlft_model*>(0x1);
    EXPECT_EQ(qlft_model_load(rt.rt, p.c_str(), cfg.c, &m), c.load_status) << qlft_last_error();
    EXPECT_EQ(m, nullptr);
    const std::string msg = qlft_last_error();
    EXPECT_NE(msg.find(c.message), std::string::npos) << msg;
    EXPECT_FALSE(msg.empty());
    EXPECT_EQ(rt.report().total_reserved, 0u);
  }
}

TEST(ApiModel, EveryGgufPrefixIsFormatError) {
  const std::string dir = qlft_test::temp_dir("api-trunc");
  const auto full = qlft_test::tiny_llama_gguf().build();
  const std::string p = dir + "/t.gguf";
  Rt rt;
  Cfg cfg("keep");
  qlft_test::AppendFile grow(p);
  for (size_t n = 0; n < full.size(); ++n) {
    if (n > 0) grow.append(&full[n - 1], 1);
    qlft_model* m = nullptr;
    ASSERT_EQ(qlft_model_load(rt.rt, p.c_str(), cfg.c, &m), QLFT_ERR_FORMAT) << "prefix " << n;
    ASSERT_NE(std::string(qlft_last_error()), "");
  }
  grow.append(&full.back(), 1);
  qlft_model* m = nullptr;
  ASSERT_EQ(qlft_model_load(rt.rt, p.c_str(), cfg.c, &m), QLFT_OK) << qlft_last_error();
  qlft_model_free(m);
  EXPECT_EQ(rt.report().total_reserved, 0u);
}

TEST(ApiModel, HostileSafetensorsCases) {
  Rt rt;
  Cfg cfg("keep");
  const std::string cj = qlft_test::tiny_hf_config();
  for (const auto& c : qlft_test::hostile_safetensors_cases()) {
    SCOPED_TRACE(c.name);
    const std::string dir = qlft_test::temp_dir("api-hostile-st");
    qlft_test::write_file(dir + "/config.json", cj.data(), cj.size());
    qlft_test::write_file(dir + "/model.safetensors", c.bytes.data(), c.bytes.size());
    qlft_model* m = reinterpret_cast<qlft_model*>(0x1);
    EXPECT_EQ(qlft_model_load(rt.rt, dir.c_str(), cfg.c, &m), c.load_status) << qlft_last_error();
    EXPECT_EQ(m, nullptr);
    const std::string msg = qlft_last_error();
    EXPECT_NE(msg.find(c.message), std::string::npos) << msg;
    EXPECT_EQ(rt.report().total_reserved, 0u);
  }
}
