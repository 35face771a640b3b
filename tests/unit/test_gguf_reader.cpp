// GGUF reader against files written by the reference `gguf` Python package
// (tests/reference/gen_formats_fixtures.py): every metadata value type, alignment, tensor table
// and tensor bytes must read back as the package wrote and read them.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/gguf.h"
#include "quant/ggml_dequant.h"
#include "quant/ggml_types.h"
#include "support/test_support.h"

using namespace qlft;
using nlohmann::json;

namespace {

json load_json(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path;
  return json::parse(f);
}

std::string to_hex(const uint8_t* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s += d[p[i] >> 4];
    s += d[p[i] & 15];
  }
  return s;
}

void expect_scalar(const std::string& key, const GgufValue& v, const json& want) {
  const std::string type = want["type"];
  ASSERT_EQ(gguf_type_name(v.type), type) << key;
  if (type == "string") {
    EXPECT_EQ(std::string(v.str), want["value"].get<std::string>()) << key;
  } else if (type == "bool") {
    EXPECT_EQ(v.u != 0, want["value"].get<bool>()) << key;
  } else if (type == "f32" || type == "f64") {
    EXPECT_EQ(v.f, want["value"].get<double>()) << key;
  } else if (type[0] == 'u') {
    EXPECT_EQ(v.u, want["value"].get<uint64_t>()) << key;
  } else {
    EXPECT_EQ(v.i, want["value"].get<int64_t>()) << key;
  }
}

void expect_array(const std::string& key, const GgufValue& v, const json& want) {
  ASSERT_EQ(v.type, GgufType::ARRAY) << key;
  const std::string elem = want["elem"];
  ASSERT_EQ(gguf_type_name(v.elem_type), elem) << key;
  if (elem == "array") {
    EXPECT_EQ(v.count, want["count"].get<uint64_t>()) << key;
    return;
  }
  const json& vals = want["value"];
  ASSERT_EQ(v.count, vals.size()) << key;
  for (size_t i = 0; i < vals.size(); ++i) {
    if (elem == "string") {
      ASSERT_EQ(v.strings.size(), vals.size());
      EXPECT_EQ(std::string(v.strings[i]), vals[i].get<std::string>()) << key << "[" << i << "]";
    } else if (elem == "bool") {
      EXPECT_EQ(v.array_i(i) != 0, vals[i].get<bool>()) << key;
    } else if (elem == "f32" || elem == "f64") {
      EXPECT_EQ(v.array_f(i), vals[i].get<double>()) << key << "[" << i << "]";
    } else if (elem == "u64") {
      EXPECT_EQ(static_cast<uint64_t>(v.array_i(i)), vals[i].get<uint64_t>()) << key;
    } else {
      EXPECT_EQ(v.array_i(i), vals[i].get<int64_t>()) << key << "[" << i << "]";
    }
  }
}

}  // namespace

TEST(GgufReader, ReadsEveryValueTypeWrittenByPythonGguf) {
  const json want = load_json(qlft_test::fixture_path("formats/all_types.json"));
  auto g = GgufFile::open(qlft_test::fixture_path("formats/all_types.gguf"));
  EXPECT_EQ(g->version(), 3u);
  EXPECT_EQ(g->alignment(), want["alignment"].get<uint64_t>());
  EXPECT_EQ(g->metadata().size(), want["n_kv"].get<size_t>());
  for (auto it = want["metadata"].begin(); it != want["metadata"].end(); ++it) {
    const GgufValue* v = g->find(it.key());
    ASSERT_NE(v, nullptr) << it.key();
    if (it.value()["type"] == "array")
      expect_array(it.key(), *v, it.value());
    else
      expect_scalar(it.key(), *v, it.value());
  }
  // Typed getters.
  EXPECT_EQ(g->get_string("t.string"), want["metadata"]["t.string"]["value"].get<std::string>());
  EXPECT_EQ(g->get_int("t.i32"), -2000000000);
  EXPECT_EQ(g->get_int("z.after_nested"), 77);  // parsing resumed correctly after the nested array
  EXPECT_TRUE(g->get_bool("t.bool_true", false));
  EXPECT_EQ(g->get_float("t.f64", 0), -1.5e300);
  EXPECT_EQ(g->get_int("missing.key", 5), 5);
  try {
    g->get_int("t.u64");  // 2^63 + 5 does not fit int64
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), QLFT_ERR_FORMAT);
    EXPECT_NE(std::string(e.what()).find("t.u64"), std::string::npos);
  }
  try {
    g->get_string("t.u8");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), QLFT_ERR_FORMAT);
    EXPECT_NE(std::string(e.what()).find("t.u8"), std::string::npos);
  }
  EXPECT_THROW(g->find("a.string")->array_i(0), Error);  // not a numeric array
  EXPECT_THROW(g->find("a.u8")->array_i(3), Error);      // out of range

  ASSERT_EQ(g->tensors().size(), want["tensors"].size());
  for (const json& wt : want["tensors"]) {
    const std::string name = wt["name"];
    const GgufTensorInfo* t = g->find_tensor(name);
    ASSERT_NE(t, nullptr) << name;
    ASSERT_EQ(t->n_dims, wt["ne"].size()) << name;
    for (size_t d = 0; d < wt["ne"].size(); ++d) EXPECT_EQ(t->ne[d], wt["ne"][d].get<int64_t>());
    EXPECT_EQ(t->type, wt["type"].get<uint32_t>()) << name;
    EXPECT_EQ(t->offset, wt["offset"].get<uint64_t>()) << name;
    EXPECT_EQ(t->nbytes, wt["nbytes"].get<uint64_t>()) << name;
    EXPECT_EQ(t->offset % 64, 0u);
    EXPECT_EQ(to_hex(t->data, t->nbytes), wt["hex"].get<std::string>()) << name;
    const std::vector<double> vals = wt["values"];
    ASSERT_EQ(vals.size(), static_cast<size_t>(t->numel()));
    if (ggml_type_traits(t->type)->dequantizable) {
      std::vector<float> f(t->numel());
      ggml_dequantize(t->type, t->data, t->numel(), f.data());
      for (size_t i = 0; i < f.size(); ++i) EXPECT_EQ(f[i], vals[i]) << name << "[" << i << "]";
    }
  }
}

TEST(GgufReader, Stories260KTensorTableMatchesPythonGguf) {
  QLFT_NEED_SHARED(path, "models/stories260K.gguf");
  const json want = load_json(qlft_test::fixture_path("formats/stories260K.json"));
  auto g = GgufFile::open(path);
  EXPECT_EQ(g->metadata().size(), want["n_kv"].get<size_t>());
  for (auto it = want["keys"].begin(); it != want["keys"].end(); ++it)
    EXPECT_EQ(g->get_int(it.key()), it.value().get<int64_t>()) << it.key();
  const GgufValue* toks = g->find("tokenizer.ggml.tokens");
  ASSERT_NE(toks, nullptr);
  ASSERT_EQ(toks->strings.size(), want["n_tokens"].get<size_t>());
  for (size_t i = 0; i < want["tokens_head"].size(); ++i)
    EXPECT_EQ(std::string(toks->strings[i]), want["tokens_head"][i].get<std::string>());
  ASSERT_EQ(g->tensors().size(), want["tensors"].size());
  for (const json& wt : want["tensors"]) {
    const GgufTensorInfo* t = g->find_tensor(wt["name"]);
    ASSERT_NE(t, nullptr) << wt["name"];
    for (size_t d = 0; d < wt["ne"].size(); ++d) EXPECT_EQ(t->ne[d], wt["ne"][d].get<int64_t>());
    EXPECT_EQ(t->offset, wt["offset"].get<uint64_t>());
    EXPECT_EQ(t->nbytes, wt["nbytes"].get<uint64_t>());
    std::vector<float> f(t->numel());
    ggml_dequantize(t->type, t->data, t->numel(), f.data());
    double sum = 0;
    for (float x : f) sum += x;
    EXPECT_NEAR(sum, wt["sum"].get<double>(), 1e-9 * (1 + std::fabs(sum))) << wt["name"];
    for (size_t i = 0; i < wt["first"].size(); ++i) EXPECT_EQ(f[i], wt["first"][i].get<double>());
  }
}

TEST(GgufReader, MissingFileIsIoError) {
  try {
    GgufFile::open("/nonexistent/dir/x.gguf");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), QLFT_ERR_IO);
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/x.gguf"), std::string::npos);
  }
}
