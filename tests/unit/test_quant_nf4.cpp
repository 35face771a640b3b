// NF4 and blockwise dynamic 8-bit quantization against bitsandbytes 0.50.2 (CPU) fixtures made by
// tests/reference/gen_quant_fixtures.py: codes, absmax, double-quant statistics and dequantized
// values must be bit-identical; the dynamic maps equal create_dynamic_map; the double-quant
// offset equals torch.mean.
#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/half.h"
#include "formats/safetensors.h"
#include "quant/blockwise8.h"
#include "quant/nf4.h"
#include "quant/nf4_math.h"
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
  nlohmann::json meta(const std::string& key) const {
    return nlohmann::json::parse(f->metadata().at(key));
  }
};

// Bitwise float equality (so -0 vs 0 or NaN payloads would show up too).
void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want,
                      const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (f32_bits(got[i]) != f32_bits(want[i]) && bad++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << " want " << want[i];
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " differ";
}

}  // namespace

TEST(Nf4, CodeBookAndMidpointsMatchBitsandbytes) {
  Fixture fx("nf4.safetensors");
  auto code = fx.get<float>("nf4_code");
  ASSERT_EQ(code.size(), 16u);
  for (uint32_t k = 0; k < 16; ++k) EXPECT_EQ(f32_bits(nf4_value(k)), f32_bits(code[k])) << k;
  // bucketize: a value on a midpoint takes the lower code, just above it the upper one.
  for (uint32_t k = 0; k < 15; ++k) {
    const float m = (code[k] + code[k + 1]) / 2.0f;
    EXPECT_EQ(nf4_encode(m), k);
    EXPECT_EQ(nf4_encode(std::nextafter(m, 2.0f)), k + 1);
  }
  EXPECT_EQ(nf4_encode(0.0f), 7);
  EXPECT_EQ(nf4_encode(-0.0f), 7);
  EXPECT_EQ(nf4_encode(-1.0f), 0);
  EXPECT_EQ(nf4_encode(1.0f), 15);
}

TEST(Nf4, QuantizeAndDequantizeMatchBitsandbytesBitForBit) {
  Fixture fx("nf4.safetensors");
  auto cases = fx.meta("cases");
  ASSERT_GE(cases.size(), 6u);
  for (const auto& jn : cases) {
    const std::string name = jn.get<std::string>();
    SCOPED_TRACE(name);
    auto m = fx.meta(name);
    const int64_t bs = m["blocksize"].get<int64_t>();
    const bool dq = m["double_quant"].get<bool>();
    auto x = fx.get<float>(name + ".input");
    const int64_t n = static_cast<int64_t>(x.size());
    const int64_t nb = nf4_num_blocks(n, bs);
    std::vector<uint8_t> packed(nf4_packed_bytes(n));
    std::vector<float> absmax(nb);
    nf4_quantize(x.data(), n, bs, packed.data(), absmax.data());
    auto want_packed = fx.get<uint8_t>(name + ".packed");
    ASSERT_EQ(packed.size(), want_packed.size());
    size_t bad = 0;
    for (size_t i = 0; i < packed.size(); ++i)
      if (packed[i] != want_packed[i] && bad++ < 5)
        ADD_FAILURE() << "byte " << i << ": got " << int(packed[i]) << " want "
                      << int(want_packed[i]);
    EXPECT_EQ(bad, 0u);

    std::vector<float> deq(n);
    if (!dq) {
      expect_same_bits(absmax, fx.get<float>(name + ".absmax"), "absmax");
      nf4_dequantize(packed.data(), absmax.data(), bs, 0, n, deq.data());
    } else {
      const int64_t nnb = nf4_num_blocks(nb, 256);
      std::vector<uint8_t> codes(nb);
      std::vector<float> nested(nnb);
      float offset = 0;
      nf4_double_quantize(absmax.data(), nb, 256, codes.data(), nested.data(), &offset);
      auto want_offset = fx.get<float>(name + ".offset");
      EXPECT_EQ(f32_bits(offset), f32_bits(want_offset[0])) << offset << " vs " << want_offset[0];
      EXPECT_EQ(codes, fx.get<uint8_t>(name + ".absmax_codes"));
      expect_same_bits(nested, fx.get<float>(name + ".nested_absmax"), "nested absmax");
      auto ncode = fx.get<float>(name + ".nested_code");
      expect_same_bits(std::vector<float>(nf4_nested_code().begin(), nf4_nested_code().end()),
                       ncode, "nested code");
      std::vector<float> am(nb);
      nf4_decode_absmax(codes.data(), nested.data(), ncode.data(), offset, 256, 0, nb, am.data());
      nf4_dequantize(packed.data(), am.data(), bs, 0, n, deq.data());
    }
    expect_same_bits(deq, fx.get<float>(name + ".dequant"), "dequantized");
  }
}

TEST(Nf4, DequantizeAnyRangeEqualsWholeTensor) {
  std::vector<float> x(3 * 1000 + 7);
  uint32_t s = 99;
  for (float& v : x) {
    s = s * 1664525u + 1013904223u;
    v = static_cast<float>(static_cast<int32_t>(s)) * 1e-9f;
  }
  const int64_t n = static_cast<int64_t>(x.size()), bs = 64;
  std::vector<uint8_t> packed(nf4_packed_bytes(n));
  std::vector<float> absmax(nf4_num_blocks(n, bs)), whole(n), part(n);
  nf4_quantize(x.data(), n, bs, packed.data(), absmax.data());
  nf4_dequantize(packed.data(), absmax.data(), bs, 0, n, whole.data());
  for (int64_t e0 : {0, 1, 31, 63, 64, 65, 127, 1001, 2999}) {
    for (int64_t cnt : {1, 2, 3, 33, 64, 100, 191}) {
      if (e0 + cnt > n) continue;
      nf4_dequantize(packed.data(), absmax.data(), bs, e0, cnt, part.data());
      for (int64_t i = 0; i < cnt; ++i)
        ASSERT_EQ(f32_bits(part[i]), f32_bits(whole[e0 + i])) << e0 << "+" << i;
    }
  }
}

TEST(Blockwise8, DynamicMapsEqualCreateDynamicMap) {
  Fixture fx("blockwise8.safetensors");
  auto s = create_dynamic_map(true), u = create_dynamic_map(false);
  expect_same_bits(std::vector<float>(s.begin(), s.end()), fx.get<float>("map_signed"),
                   "signed map");
  expect_same_bits(std::vector<float>(u.begin(), u.end()), fx.get<float>("map_unsigned"),
                   "unsigned map");
}

TEST(Blockwise8, QuantizeBlockwiseMatchesBitsandbytes) {
  Fixture fx("blockwise8.safetensors");
  for (const auto& jn : fx.meta("cases")) {
    const std::string name = jn.get<std::string>();
    SCOPED_TRACE(name);
    auto m = fx.meta(name);
    const int64_t bs = m["blocksize"].get<int64_t>();
    auto map = create_dynamic_map(m["signed"].get<bool>());
    Blockwise8Quantizer q(map);
    auto x = fx.get<float>(name + ".input");
    const int64_t n = static_cast<int64_t>(x.size());
    std::vector<uint8_t> codes(n);
    std::vector<float> absmax(nf4_num_blocks(n, bs)), deq(n);
    q.quantize(x.data(), n, bs, codes.data(), absmax.data());
    auto want = fx.get<uint8_t>(name + ".codes");
    size_t bad = 0;
    for (int64_t i = 0; i < n; ++i)
      if (codes[i] != want[i] && bad++ < 5)
        ADD_FAILURE() << "code " << i << ": got " << int(codes[i]) << " want " << int(want[i])
                      << " x=" << x[i];
    EXPECT_EQ(bad, 0u);
    expect_same_bits(absmax, fx.get<float>(name + ".absmax"), "absmax");
    dequantize_blockwise8(map.data(), codes.data(), absmax.data(), n, bs, deq.data());
    expect_same_bits(deq, fx.get<float>(name + ".dequant"), "dequantized");
  }
}

TEST(Blockwise8, MeanMatchesTorch) {
  Fixture fx("blockwise8.safetensors");
  auto sizes = fx.meta("mean.sizes").get<std::vector<int64_t>>();
  auto vals = fx.get<float>("mean.values");
  auto want = fx.get<float>("mean.results");
  int64_t off = 0;
  for (size_t k = 0; k < sizes.size(); ++k) {
    const float got = torch_mean_f32(vals.data() + off, sizes[k]);
    EXPECT_EQ(f32_bits(got), f32_bits(want[k]))
        << "n=" << sizes[k] << " got " << got << " want " << want[k];
    off += sizes[k];
  }
}
