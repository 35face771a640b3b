// Our GGUF and safetensors writers read back by parsers written here from the format
// specifications (ggml docs/gguf.md; huggingface/safetensors README), sharing no code with
// src/formats: a writer bug mirrored by our own reader cannot pass. (The gguf-py check of the same
// files is `gen_formats_fixtures.py --check`, see test_gguf_writer.cpp.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "formats/gguf_writer.h"
#include "formats/safetensors_writer.h"
#include "support/test_support.h"

using namespace qlft;

namespace {

// A cursor over little-endian bytes that fails the test (and stops) on a read past the end.
struct Cursor {
  const std::vector<uint8_t>& b;
  size_t at = 0;
  bool ok = true;
  template <typename T>
  T get() {
    T v{};
    if (at + sizeof(T) > b.size()) {
      ok = false;
      return v;
    }
    std::memcpy(&v, &b[at], sizeof(T));
    at += sizeof(T);
    return v;
  }
  std::string str() {
    const uint64_t n = get<uint64_t>();
    if (!ok || at + n > b.size()) {
      ok = false;
      return "";
    }
    std::string s(reinterpret_cast<const char*>(&b[at]), n);
    at += n;
    return s;
  }
};

// GGUF v3 by the spec: every value rendered as text, so the test compares what it wrote.
std::string gguf_value(Cursor& c, uint32_t type) {
  switch (type) {
    case 0:
      return std::to_string(c.get<uint8_t>());
    case 1:
      return std::to_string(c.get<int8_t>());
    case 2:
      return std::to_string(c.get<uint16_t>());
    case 3:
      return std::to_string(c.get<int16_t>());
    case 4:
      return std::to_string(c.get<uint32_t>());
    case 5:
      return std::to_string(c.get<int32_t>());
    case 6:
      return std::to_string(c.get<float>());
    case 7:
      return c.get<uint8_t>() ? "true" : "false";
    case 8:
      return "\"" + c.str() + "\"";
    case 9: {
      const uint32_t elem = c.get<uint32_t>();
      const uint64_t n = c.get<uint64_t>();
      std::string s = "[";
      for (uint64_t i = 0; i < n && c.ok; ++i) s += (i ? "," : "") + gguf_value(c, elem);
      return s + "]";
    }
    case 10:
      return std::to_string(c.get<uint64_t>());
    case 11:
      return std::to_string(c.get<int64_t>());
    case 12:
      return std::to_string(c.get<double>());
  }
  c.ok = false;
  return "?";
}

struct SpecTensorInfo {
  std::vector<uint64_t> ne;
  uint32_t type = 0;
  uint64_t offset = 0;
};

}  // namespace

TEST(IndependentReader, GgufWriterOutputFollowsTheSpec) {
  const std::string path = qlft_test::temp_dir("indep-gguf") + "/w.gguf";
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.add_u32("general.alignment", 64);
  w.add_i8("k.i8", -3);
  w.add_u16("k.u16", 65535);
  w.add_i64("k.i64", -1234567890123LL);
  w.add_f32("k.f32", 0.5f);
  w.add_f64("k.f64", -2.25);
  w.add_bool("k.bool", true);
  w.add_array("k.arr", std::vector<int32_t>{1, -2, 3});
  w.add_string_array("k.strs", {"a", "", "bc"});
  const std::vector<float> t1 = {1.f, -2.f, 3.5f, 0.f, 7.f, -0.25f};
  w.add_tensor_f32("t.one", {3, 2}, t1.data());
  std::vector<uint8_t> q8(34 * 2);  // two Q8_0 blocks (ggml type 8): 2-byte scale + 32 codes
  for (size_t i = 0; i < q8.size(); ++i) q8[i] = static_cast<uint8_t>(i * 7 + 1);
  w.add_tensor("t.two", GgmlType::Q8_0, {64}, q8.data(), q8.size());
  w.write(path);

  const std::vector<uint8_t> b = qlft_test::read_file(path);
  Cursor c{b};
  ASSERT_EQ(c.get<uint32_t>(), 0x46554747u);  // "GGUF"
  ASSERT_EQ(c.get<uint32_t>(), 3u);
  const uint64_t n_tensors = c.get<uint64_t>(), n_kv = c.get<uint64_t>();
  ASSERT_EQ(n_tensors, 2u);
  ASSERT_EQ(n_kv, 10u);
  std::map<std::string, std::string> kv;
  for (uint64_t i = 0; i < n_kv && c.ok; ++i) {
    std::string key = c.str();
    const uint32_t type = c.get<uint32_t>();
    kv[key] = std::to_string(type) + ":" + gguf_value(c, type);
  }
  ASSERT_TRUE(c.ok);
  const std::map<std::string, std::string> want = {{"general.architecture", "8:\"llama\""},
                                                   {"general.alignment", "4:64"},
                                                   {"k.i8", "1:-3"},
                                                   {"k.u16", "2:65535"},
                                                   {"k.i64", "11:-1234567890123"},
                                                   {"k.f32", "6:" + std::to_string(0.5f)},
                                                   {"k.f64", "12:" + std::to_string(-2.25)},
                                                   {"k.bool", "7:true"},
                                                   {"k.arr", "9:[1,-2,3]"},
                                                   {"k.strs", "9:[\"a\",\"\",\"bc\"]"}};
  EXPECT_EQ(kv, want);
  std::map<std::string, SpecTensorInfo> ti;
  for (uint64_t i = 0; i < n_tensors && c.ok; ++i) {
    std::string name = c.str();
    SpecTensorInfo t;
    const uint32_t nd = c.get<uint32_t>();
    for (uint32_t d = 0; d < nd; ++d) t.ne.push_back(c.get<uint64_t>());
    t.type = c.get<uint32_t>();
    t.offset = c.get<uint64_t>();
    ti[name] = t;
  }
  ASSERT_TRUE(c.ok);
  // The data section starts at the next multiple of general.alignment; offsets are aligned.
  const size_t data = (c.at + 63) / 64 * 64;
  for (size_t i = c.at; i < data; ++i) EXPECT_EQ(b[i], 0) << "padding byte " << i;
  ASSERT_EQ(ti.size(), 2u);
  EXPECT_EQ(ti["t.one"].ne, (std::vector<uint64_t>{3, 2}));
  EXPECT_EQ(ti["t.one"].type, 0u);  // F32
  EXPECT_EQ(ti["t.two"].ne, (std::vector<uint64_t>{64}));
  EXPECT_EQ(ti["t.two"].type, 8u);  // Q8_0
  for (const auto& [name, t] : ti) EXPECT_EQ(t.offset % 64, 0u) << name;
  ASSERT_LE(data + ti["t.one"].offset + t1.size() * 4, b.size());
  EXPECT_EQ(0, std::memcmp(&b[data + ti["t.one"].offset], t1.data(), t1.size() * 4));
  ASSERT_LE(data + ti["t.two"].offset + q8.size(), b.size());
  EXPECT_EQ(0, std::memcmp(&b[data + ti["t.two"].offset], q8.data(), q8.size()));
}

TEST(IndependentReader, SafetensorsWriterOutputFollowsTheSpec) {
  const std::string path = qlft_test::temp_dir("indep-st") + "/w.safetensors";
  SafetensorsWriter w;
  w.set_metadata("format", "pt");
  const std::vector<float> a = {1.f, 2.f, -3.f, 4.5f, 5.f, 6.f};
  w.add_tensor_f32("b.weight", {2, 3}, a.data());
  const std::vector<int32_t> ids = {7, -8, 9};
  w.add_tensor("a.ids", DType::I32, {3}, ids.data(), ids.size() * 4);
  w.add_tensor_f32("c.half", {2}, a.data(), DType::BF16);
  w.write(path);

  const std::vector<uint8_t> b = qlft_test::read_file(path);
  ASSERT_GE(b.size(), 8u);
  uint64_t n;
  std::memcpy(&n, b.data(), 8);
  ASSERT_LE(8 + n, b.size());
  const nlohmann::json h =
      nlohmann::json::parse(std::string(reinterpret_cast<const char*>(&b[8]), n));
  EXPECT_EQ(h["__metadata__"], (nlohmann::json{{"format", "pt"}}));
  const uint8_t* data = &b[8 + n];
  const size_t data_size = b.size() - 8 - n;
  auto check = [&](const char* name, const char* dtype, std::vector<int> shape, const void* want,
                   size_t nbytes) {
    const nlohmann::json& t = h.at(name);
    EXPECT_EQ(t.at("dtype"), dtype) << name;
    EXPECT_EQ(t.at("shape").get<std::vector<int>>(), shape) << name;
    const auto off = t.at("data_offsets").get<std::vector<uint64_t>>();
    ASSERT_EQ(off.size(), 2u);
    ASSERT_EQ(off[1] - off[0], nbytes) << name;
    ASSERT_LE(off[1], data_size) << name;
    EXPECT_EQ(0, std::memcmp(data + off[0], want, nbytes)) << name;
  };
  check("b.weight", "F32", {2, 3}, a.data(), 24);
  check("a.ids", "I32", {3}, ids.data(), 12);
  const uint16_t bf[2] = {0x3f80, 0x4000};  // 1.0, 2.0 in bfloat16
  check("c.half", "BF16", {2}, bf, 4);
  // The byte buffer is covered exactly, without holes or overlaps (the spec's validity rule).
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (const auto& [k, v] : h.items())
    if (k != "__metadata__") spans.emplace_back(v["data_offsets"][0], v["data_offsets"][1]);
  std::sort(spans.begin(), spans.end());
  uint64_t end = 0;
  for (const auto& [s, e] : spans) {
    EXPECT_EQ(s, end);
    end = e;
  }
  EXPECT_EQ(end, data_size);
}
