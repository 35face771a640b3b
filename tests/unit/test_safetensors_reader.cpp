// safetensors reader against shards written by the reference `safetensors` package
// (tests/reference/gen_formats_fixtures.py), and the writer round trip. With QLFT_WRITER_OUT=DIR
// the written file is left for `gen_formats_fixtures.py --check DIR`.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/error.h"
#include "formats/safetensors.h"
#include "formats/safetensors_writer.h"
#include "support/test_support.h"

using namespace qlft;
using nlohmann::json;

namespace {

json load_json(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path;
  return json::parse(f);
}

std::vector<float> writer_values(size_t n, float scale, float offset) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i) * scale + offset;
  return v;
}

std::vector<double> as_f64(const SafeTensorInfo& t) {
  if (t.numel() == 0) return {};  // (memcpy into an empty vector's NULL data is UB)
  std::vector<float> f(t.numel());
  if (t.dtype == DType::I64 || t.dtype == DType::F64) {  // exact, wider than float
    std::vector<double> d(t.numel());
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (t.dtype == DType::I64) {
        int64_t x;
        std::memcpy(&x, t.data + 8 * i, 8);
        d[i] = static_cast<double>(x);
      } else {
        std::memcpy(&d[i], t.data + 8 * i, 8);
      }
    }
    return d;
  }
  to_f32_n(t.dtype, t.data, f.data(), f.size());
  return std::vector<double>(f.begin(), f.end());
}

void expect_matches(const SafeTensorInfo& t, const json& w) {
  EXPECT_STREQ(dtype_name(t.dtype), w["dtype"].get<std::string>().c_str()) << t.name;
  EXPECT_EQ(t.shape, w["shape"].get<std::vector<int64_t>>()) << t.name;
  const std::vector<double> want = w["values"];
  const std::vector<double> got = as_f64(t);
  ASSERT_EQ(got.size(), want.size()) << t.name;
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], want[i]) << t.name << "[" << i << "]";
}

}  // namespace

TEST(SafetensorsReader, ShardedSetWrittenByPythonSafetensors) {
  const json want = load_json(qlft_test::fixture_path("formats/sharded.json"));
  const std::string dir = qlft_test::fixture_path("formats/sharded");
  // The directory, and the index itself, both open the whole set.
  for (const std::string& p : {dir, dir + "/model.safetensors.index.json"}) {
    auto set = SafetensorsSet::open(p);
    ASSERT_EQ(set->files().size(), 2u);
    ASSERT_EQ(set->tensors().size(), want["tensors"].size());
    for (auto it = want["tensors"].begin(); it != want["tensors"].end(); ++it) {
      const SafeTensorInfo* t = set->find(it.key());
      ASSERT_NE(t, nullptr) << it.key();
      EXPECT_EQ(*t->file, dir + "/" + it.value()["file"].get<std::string>());
      expect_matches(*t, it.value());
    }
    using StrMap = std::map<std::string, std::string>;
    const StrMap meta = want["metadata"].get<StrMap>();
    for (const auto& f : set->files()) EXPECT_EQ(f->metadata(), meta);
  }
  // One shard on its own.
  auto one = SafetensorsFile::open(dir + "/model-00002-of-00002.safetensors");
  EXPECT_EQ(one->tensors().size(), 7u);
}

TEST(SafetensorsWriter, RoundTripAndAlignment) {
  std::string dir;
  if (const char* e = std::getenv("QLFT_WRITER_OUT"); e && *e) {
    dir = e;
    std::filesystem::create_directories(dir);
  } else {
    dir = qlft_test::temp_dir("st-writer");
  }
  const std::string path = dir + "/writer.safetensors";
  SafetensorsWriter w;
  w.set_metadata("format", "pt");
  w.set_metadata("who", "qlft");
  const int8_t i8[3] = {1, -2, 3};
  w.add_tensor("w.i8", DType::I8, {3}, i8,
               3);  // 1-byte dtype first in name order: still laid out last
  const auto f32 = writer_values(6, 1.5f, 2), f16 = writer_values(5, 0.5f, 0),
             bf = writer_values(4, 0.25f, -0.5f);
  w.add_tensor_f32("w.f32", {2, 3}, f32.data());
  w.add_tensor_f32("w.f16", {5}, f16.data(), DType::F16);
  w.add_tensor_f32("w.bf16", {2, 2}, bf.data(), DType::BF16);
  const float scalar = 9.f;
  w.add_tensor_f32("w.scalar", {}, &scalar);
  w.add_tensor_f32("w.empty", {0, 4}, nullptr);
  const int64_t i64[2] = {-(int64_t(1) << 60), 5};
  w.add_tensor("w.i64", DType::I64, {2}, i64, 16);
  EXPECT_EQ(w.data_bytes(), 3u + 24 + 10 + 8 + 4 + 0 + 16);
  w.write(path);

  auto bytes = qlft_test::read_file(path);
  uint64_t hlen;
  std::memcpy(&hlen, bytes.data(), 8);
  EXPECT_EQ(hlen % 8, 0u);  // header padded so the data section is 8-byte aligned
  EXPECT_EQ(bytes.size(), 8 + hlen + w.data_bytes());

  auto f = SafetensorsFile::open(path);
  EXPECT_EQ(f->metadata().at("who"), "qlft");
  ASSERT_EQ(f->tensors().size(), 7u);
  for (const SafeTensorInfo& t : f->tensors())
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % dtype_size(t.dtype), 0u) << t.name;
  auto set = SafetensorsSet::open(path);
  auto get = [&](const char* n) {
    const SafeTensorInfo* t = set->find(n);
    EXPECT_NE(t, nullptr) << n;
    return as_f64(*t);
  };
  EXPECT_EQ(get("w.f32"), std::vector<double>(f32.begin(), f32.end()));
  EXPECT_EQ(get("w.f16"), std::vector<double>(f16.begin(), f16.end()));
  EXPECT_EQ(get("w.bf16"), std::vector<double>(bf.begin(), bf.end()));
  EXPECT_EQ(get("w.scalar"), std::vector<double>{9.0});
  EXPECT_EQ(get("w.i8"), (std::vector<double>{1, -2, 3}));
  EXPECT_EQ(get("w.i64"), (std::vector<double>{-static_cast<double>(int64_t(1) << 60), 5}));
  EXPECT_EQ(set->find("w.empty")->nbytes, 0u);
  EXPECT_EQ(set->find("w.scalar")->shape.size(), 0u);
}

TEST(SafetensorsWriter, ShardedIndexRoundTrip) {
  const std::string dir = qlft_test::temp_dir("st-shards");
  SafetensorsWriter a, b;
  const auto v = writer_values(4, 1, 0);
  a.add_tensor_f32("x", {4}, v.data());
  b.add_tensor_f32("y", {2, 2}, v.data(), DType::BF16);
  a.write(dir + "/s1.safetensors");
  b.write(dir + "/s2.safetensors");
  write_safetensors_index(dir + "/model.safetensors.index.json", a.data_bytes() + b.data_bytes(),
                          {{"x", "s1.safetensors"}, {"y", "s2.safetensors"}});
  auto set = SafetensorsSet::open(dir);
  ASSERT_EQ(set->tensors().size(), 2u);
  EXPECT_EQ(*set->find("y")->file, dir + "/s2.safetensors");
  EXPECT_EQ(set->find("y")->dtype, DType::BF16);
}

TEST(SafetensorsWriter, RejectsInvalidInput) {
  SafetensorsWriter w;
  const float v[4] = {};
  EXPECT_THROW(w.add_tensor("t", DType::F32, {4}, v, 12), Error);
  EXPECT_THROW(w.add_tensor("__metadata__", DType::F32, {4}, v, 16), Error);
  EXPECT_THROW(w.add_tensor("t", DType::F32, {-1}, v, 0), Error);
  w.add_tensor("t", DType::F32, {4}, v, 16);
  EXPECT_THROW(w.add_tensor("t", DType::F32, {4}, v, 16), Error);
  EXPECT_THROW(w.add_tensor_f32("u", {4}, v, DType::I8), Error);
  try {
    w.write("/nonexistent-dir/x.safetensors");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), QLFT_ERR_IO);
    EXPECT_NE(std::string(e.what()).find("/nonexistent-dir/x.safetensors"), std::string::npos);
  }
}
