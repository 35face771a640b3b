// INT8 row-wise (bitsandbytes int8_vectorwise_quant / _dequant) and GGUF block dequantization
// (gguf-py quants.quantize / quants.dequantize) against fixtures from
// tests/reference/gen_quant_fixtures.py. Both are exact float operations in the same order, so
// results must be bit-identical.
#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "formats/safetensors.h"
#include "quant/ggml_dequant.h"
#include "quant/ggml_types.h"
#include "quant/int8.h"
#include "support/test_support.h"

using namespace qlft;

namespace {

struct Fixture {
  std::unique_ptr<SafetensorsFile> f;
  explicit Fixture(const std::string& name)
      : f(SafetensorsFile::open(qlft_test::fixture_path("quant/" + name))) {}
  const SafeTensorInfo& t(const std::string& name) const {
    for (const auto& x : f->tensors())
      if (x.name == name) return x;
    throw std::runtime_error("fixture tensor missing: " + name);
  }
  template <class T>
  std::vector<T> get(const std::string& name) const {
    const SafeTensorInfo& x = t(name);
    std::vector<T> v(x.nbytes / sizeof(T));
    std::memcpy(v.data(), x.data, x.nbytes);
    return v;
  }
};

size_t count_bit_diffs(const std::vector<float>& got, const std::vector<float>& want,
                       const std::string& what) {
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (f32_bits(got[i]) != f32_bits(want[i]) && bad++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << " want " << want[i];
  return bad;
}

}  // namespace

TEST(Int8, RowwiseQuantizeAndDequantizeMatchBitsandbytes) {
  Fixture fx("int8.safetensors");
  const SafeTensorInfo& in = fx.t("input");
  ASSERT_EQ(in.shape.size(), 2u);
  const int64_t rows = in.shape[0], cols = in.shape[1];
  auto x = fx.get<float>("input");
  std::vector<int8_t> codes(rows * cols);
  std::vector<float> scb(rows), deq(rows * cols);
  int8_quantize_rows(x.data(), rows, cols, codes.data(), scb.data());
  EXPECT_EQ(codes, fx.get<int8_t>("codes"));
  EXPECT_EQ(count_bit_diffs(scb, fx.get<float>("scb"), "SCB"), 0u);
  int8_dequantize_rows(codes.data(), scb.data(), 0, rows, cols, deq.data());
  EXPECT_EQ(count_bit_diffs(deq, fx.get<float>("dequant"), "dequant"), 0u);
  // a row range equals the same rows of the whole
  std::vector<float> part(3 * cols);
  int8_dequantize_rows(codes.data(), scb.data(), 4, 3, cols, part.data());
  EXPECT_EQ(0, std::memcmp(part.data(), deq.data() + 4 * cols, part.size() * 4));
}

TEST(Ggml, DequantizeEveryTypeMatchesGgufPy) {
  Fixture fx("gguf_blocks.safetensors");
  auto types = nlohmann::json::parse(fx.f->metadata().at("types")).get<std::vector<std::string>>();
  ASSERT_EQ(types.size(), 10u);  // F32 F16 BF16 F64 Q8_0 Q4_0 Q4_1 Q4_K Q5_K Q6_K
  for (const std::string& name : types) {
    SCOPED_TRACE(name);
    const uint32_t type = static_cast<uint32_t>(std::stoul(fx.f->metadata().at(name)));
    auto raw = fx.get<uint8_t>(name + ".raw");
    auto want = fx.get<float>(name + ".expected");
    const GgmlTypeTraits* t = ggml_type_traits(type);
    ASSERT_NE(t, nullptr);
    ASSERT_EQ(raw.size(), want.size() / t->block * t->bytes);
    std::vector<float> got(want.size());
    ggml_dequantize(type, raw.data(), static_cast<int64_t>(got.size()), got.data());
    EXPECT_EQ(count_bit_diffs(got, want, name), 0u);
    // a later slice of whole blocks decodes the same on its own
    const int64_t skip = t->block * 2;
    std::vector<float> tail(want.size() - skip);
    ggml_dequantize(type, raw.data() + skip / t->block * t->bytes,
                    static_cast<int64_t>(tail.size()), tail.data());
    EXPECT_EQ(0, std::memcmp(tail.data(), got.data() + skip, tail.size() * 4));
  }
}

TEST(Ggml, RejectsUnsupportedTypesAndPartialBlocks) {
  std::vector<uint8_t> raw(1024);
  std::vector<float> out(512);
  try {
    ggml_dequantize(static_cast<uint32_t>(GgmlType::Q2_K), raw.data(), 256, out.data());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), QLFT_ERR_UNSUPPORTED);
  }
  try {
    ggml_dequantize(static_cast<uint32_t>(GgmlType::Q4_0), raw.data(), 33, out.data());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), QLFT_ERR_INVALID_ARGUMENT);
  }
  EXPECT_THROW(ggml_dequantize(999, raw.data(), 32, out.data()), Error);
}
