// QWeight: builders for every kind, dequantize_rows on arbitrary row ranges (NF4 blocks that
// straddle rows included) against dequantizing the whole matrix, agreement with the
// bitsandbytes fixtures, and load_bnb_weight on a safetensors file written by bitsandbytes /
// transformers serialization (tests/reference/gen_quant_fixtures.py), plus malformed variants.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "formats/safetensors.h"
#include "formats/safetensors_bnb.h"
#include "quant/ggml_types.h"
#include "quant/nf4.h"
#include "quant/qweight.h"
#include "support/test_support.h"

using namespace qlft;

namespace {

std::vector<float> randn(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<float> all_rows(const QWeight& w) {
  std::vector<float> v(w.rows * w.cols);
  w.dequantize_rows(0, w.rows, v.data());
  return v;
}

// Every (r0, n) range decodes to the same bits as the whole matrix.
void check_row_ranges(const QWeight& w) {
  SCOPED_TRACE(w.type_name());
  auto whole = all_rows(w);
  std::vector<float> part(w.rows * w.cols);
  for (int64_t r0 = 0; r0 < w.rows; ++r0)
    for (int64_t n = 1; r0 + n <= w.rows; n += (n < 3 ? 1 : 5)) {
      w.dequantize_rows(r0, n, part.data());
      ASSERT_EQ(0, std::memcmp(part.data(), whole.data() + r0 * w.cols, n * w.cols * 4))
          << "rows " << r0 << "+" << n;
    }
}

template <class T>
std::vector<T> fixture_tensor(const SafetensorsFile& f, const std::string& name) {
  for (const auto& t : f.tensors())
    if (t.name == name) {
      std::vector<T> v(t.nbytes / sizeof(T));
      std::memcpy(v.data(), t.data, t.nbytes);
      return v;
    }
  ADD_FAILURE() << "fixture tensor missing: " << name;
  return {};
}

size_t bit_diffs(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return SIZE_MAX;
  size_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i) bad += f32_bits(a[i]) != f32_bits(b[i]);
  return bad;
}

}  // namespace

TEST(QWeight, PlainKindsConvertAndDequantizeAnyRows) {
  MemoryTracker tr;
  const int64_t rows = 7, cols = 33;
  auto x = randn(rows * cols, 1);
  QWeight f = qweight_from_f32(&tr, x.data(), rows, cols, QuantKind::F32);
  EXPECT_EQ(all_rows(f), x);
  QWeight h = qweight_from_f32(&tr, x.data(), rows, cols, QuantKind::F16);
  QWeight b = qweight_from_f32(&tr, x.data(), rows, cols, QuantKind::BF16);
  auto hv = all_rows(h), bv = all_rows(b);
  for (int64_t i = 0; i < rows * cols; ++i) {
    ASSERT_EQ(f32_bits(hv[i]), f32_bits(f16_to_f32(f32_to_f16(x[i]))));
    ASSERT_EQ(f32_bits(bv[i]), f32_bits(bf16_to_f32(f32_to_bf16(x[i]))));
  }
  EXPECT_EQ(h.bytes(), uint64_t(rows * cols * 2));
  EXPECT_EQ(f.type_name(), "f32");
  EXPECT_EQ(h.type_name(), "f16");
  EXPECT_EQ(b.type_name(), "bf16");
  check_row_ranges(f);
  check_row_ranges(h);
  check_row_ranges(b);
}

TEST(QWeight, Nf4BlocksStraddleRowsAndRangesMatchWhole) {
  MemoryTracker tr;
  for (bool dq : {false, true})
    for (int64_t cols : {172, 40, 64, 1000}) {
      for (int32_t bs : {64, 128}) {
        const int64_t rows = 23;
        auto x = randn(rows * cols, 7 + cols + bs);
        QWeight w = qweight_from_f32(&tr, x.data(), rows, cols, QuantKind::NF4, bs, dq);
        EXPECT_EQ(w.type_name(), "nf4");
        EXPECT_EQ(w.double_quant, dq);
        const int64_t n = rows * cols, nb = (n + bs - 1) / bs;
        const uint64_t expect_bytes =
            (n + 1) / 2 + 16 * 4 + (dq ? nb + ((nb + 255) / 256) * 4 + 256 * 4 : nb * 4);
        EXPECT_EQ(w.bytes(), expect_bytes);
        check_row_ranges(w);
        // block scales: the full-range decode uses exactly nf4_block_absmax(b) per block
        auto whole = all_rows(w);
        for (int64_t b = 0; b < nb; ++b) {
          std::vector<float> blk(std::min<int64_t>(bs, n - b * bs));
          nf4_dequantize(w.data.as<uint8_t>(), std::vector<float>(nb, w.nf4_block_absmax(b)).data(),
                         bs, b * bs, static_cast<int64_t>(blk.size()), blk.data());
          ASSERT_EQ(0, std::memcmp(blk.data(), whole.data() + b * bs, blk.size() * 4))
              << "block " << b;
        }
        // NF4 keeps every value within half a code step of the block absmax (<= 0.16 * absmax)
        auto v = all_rows(w);
        float amax = 0;
        for (float a : x) amax = std::max(amax, std::fabs(a));
        for (int64_t i = 0; i < n; ++i) ASSERT_LE(std::fabs(v[i] - x[i]), 0.17f * amax);
      }
    }
}

TEST(QWeight, Nf4FromF32MatchesBitsandbytesFixture) {
  auto f = SafetensorsFile::open(qlft_test::fixture_path("quant/nf4.safetensors"));
  MemoryTracker tr;
  for (auto [name, dq, bs] :
       {std::tuple{"m12x172_bs64_dq", true, 64}, std::tuple{"m12x172_bs128", false, 128},
        std::tuple{"m40x448_bs64_dq", true, 64}}) {
    SCOPED_TRACE(name);
    auto meta = nlohmann::json::parse(f->metadata().at(name));
    const int64_t rows = meta["shape"][0], cols = meta["shape"][1];
    auto x = fixture_tensor<float>(*f, std::string(name) + ".input");
    QWeight w = qweight_from_f32(&tr, x.data(), rows, cols, QuantKind::NF4, bs, dq);
    auto want_packed = fixture_tensor<uint8_t>(*f, std::string(name) + ".packed");
    ASSERT_EQ(w.data.size(), want_packed.size());
    EXPECT_EQ(0, std::memcmp(w.data.data(), want_packed.data(), want_packed.size()));
    EXPECT_EQ(bit_diffs(all_rows(w), fixture_tensor<float>(*f, std::string(name) + ".dequant")),
              0u);
  }
}

TEST(QWeight, Int8RowsMatchFixtureAndRanges) {
  auto f = SafetensorsFile::open(qlft_test::fixture_path("quant/int8.safetensors"));
  auto x = fixture_tensor<float>(*f, "input");
  MemoryTracker tr;
  QWeight w = qweight_from_f32(&tr, x.data(), 9, 100, QuantKind::INT8);
  EXPECT_EQ(w.type_name(), "int8");
  EXPECT_EQ(w.bytes(), uint64_t(900 + 9 * 4));
  EXPECT_EQ(bit_diffs(all_rows(w), fixture_tensor<float>(*f, "dequant")), 0u);
  check_row_ranges(w);
}

TEST(QWeight, GgmlKeepsBlocksAndDequantizesRows) {
  auto f = SafetensorsFile::open(qlft_test::fixture_path("quant/gguf_blocks.safetensors"));
  MemoryTracker tr;
  for (auto [name, type] : {std::pair{"Q4_K", GgmlType::Q4_K}, std::pair{"Q6_K", GgmlType::Q6_K},
                            std::pair{"Q4_0", GgmlType::Q4_0}, std::pair{"Q8_0", GgmlType::Q8_0}}) {
    auto raw = fixture_tensor<uint8_t>(*f, std::string(name) + ".raw");
    auto want = fixture_tensor<float>(*f, std::string(name) + ".expected");
    QWeight w = qweight_from_ggml(&tr, static_cast<uint32_t>(type), raw.data(), 4, 256);
    EXPECT_EQ(w.bytes(), raw.size());
    EXPECT_EQ(bit_diffs(all_rows(w), want), 0u) << name;
    check_row_ranges(w);
  }
  EXPECT_EQ(qweight_from_ggml(&tr, static_cast<uint32_t>(GgmlType::Q4_0),
                              std::vector<uint8_t>(18 * 8).data(), 4, 64)
                .type_name(),
            "q4_0");
  try {  // rows must start on block boundaries
    qweight_from_ggml(&tr, static_cast<uint32_t>(GgmlType::Q4_K),
                      std::vector<uint8_t>(144 * 2).data(), 4, 128);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), QLFT_ERR_FORMAT);
  }
}

TEST(QWeight, BadRowRangeAndBlocksizeAreRejected) {
  MemoryTracker tr;
  auto x = randn(4 * 64, 3);
  QWeight w = qweight_from_f32(&tr, x.data(), 4, 64, QuantKind::NF4, 64, false);
  std::vector<float> out(5 * 64);
  EXPECT_THROW(w.dequantize_rows(3, 2, out.data()), Error);
  EXPECT_THROW(w.dequantize_rows(-1, 1, out.data()), Error);
  EXPECT_THROW(qweight_from_f32(&tr, x.data(), 4, 64, QuantKind::NF4, 48, false), Error);
  EXPECT_THROW(qweight_from_f32(&tr, x.data(), 4, 64, QuantKind::GGML), Error);
}

// ---- load_bnb_weight ----

namespace {

struct StTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// A minimal safetensors writer for malformed variants of the fixture: 4-byte types first so every
// tensor stays aligned to its element size.
void write_safetensors(const std::string& path, const std::map<std::string, StTensor>& ts) {
  std::vector<const std::pair<const std::string, StTensor>*> order;
  for (const auto& kv : ts) order.push_back(&kv);
  std::stable_sort(order.begin(), order.end(), [](auto* a, auto* b) {
    return (a->second.dtype == "F32") > (b->second.dtype == "F32");
  });
  nlohmann::json h = nlohmann::json::object();
  uint64_t off = 0;
  for (auto* kv : order) {
    const StTensor& t = kv->second;
    h[kv->first] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.bytes.size()}}};
    off += t.bytes.size();
  }
  std::string hs = h.dump();
  while (hs.size() % 8) hs += ' ';
  std::ofstream f(path, std::ios::binary);
  uint64_t n = hs.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f.write(hs.data(), hs.size());
  for (auto* kv : order)
    f.write(reinterpret_cast<const char*>(kv->second.bytes.data()), kv->second.bytes.size());
}

std::map<std::string, StTensor> read_all(const SafetensorsFile& f) {
  std::map<std::string, StTensor> m;
  for (const auto& t : f.tensors())
    m[t.name] = StTensor{safetensors_dtype_name(t.dtype), t.shape,
                         std::vector<uint8_t>(t.data, t.data + t.nbytes)};
  return m;
}

const char* kQ = "model.layers.0.self_attn.q_proj";
const char* kUp = "model.layers.0.mlp.up_proj";
const char* kO = "model.layers.0.self_attn.o_proj";

}  // namespace

TEST(Bnb, LoadsTransformersSerializationBitExact) {
  auto st = SafetensorsSet::open(qlft_test::fixture_path("quant/bnb_model.safetensors"));
  auto ex = SafetensorsFile::open(qlft_test::fixture_path("quant/bnb_expected.safetensors"));
  MemoryTracker tr;
  struct Case {
    const char* prefix;
    int64_t rows, cols;
    QuantKind kind;
    bool dq;
  };
  for (const Case& c :
       {Case{kQ, 24, 172, QuantKind::NF4, true}, Case{kUp, 40, 96, QuantKind::NF4, false},
        Case{kO, 20, 64, QuantKind::INT8, false}}) {
    SCOPED_TRACE(c.prefix);
    QWeight w;
    ASSERT_TRUE(load_bnb_weight(&tr, *st, c.prefix, c.rows, c.cols, &w));
    EXPECT_EQ(w.kind, c.kind);
    EXPECT_EQ(w.double_quant, c.dq);
    EXPECT_EQ(w.rows, c.rows);
    EXPECT_EQ(w.cols, c.cols);
    EXPECT_EQ(
        bit_diffs(all_rows(w), fixture_tensor<float>(*ex, std::string(c.prefix) + ".expected")),
        0u);
    check_row_ranges(w);
  }
  QWeight plain;
  EXPECT_FALSE(load_bnb_weight(&tr, *st, "model.layers.0.self_attn.k_proj", 8, 16, &plain));
  EXPECT_FALSE(load_bnb_weight(&tr, *st, "model.layers.9.absent", 8, 16, &plain));
}

TEST(Bnb, MalformedSerializationsFailWithFormatErrorsNamingTheTensor) {
  auto src = SafetensorsFile::open(qlft_test::fixture_path("quant/bnb_model.safetensors"));
  const auto base = read_all(*src);
  const std::string dir = qlft_test::temp_dir("bnb");
  const std::string wq = std::string(kQ) + ".weight";
  auto state_json = [&]() {
    const auto& b = base.at(wq + ".quant_state.bitsandbytes__nf4").bytes;
    return nlohmann::json::parse(std::string(b.begin(), b.end()));
  };
  auto with_state = [&](nlohmann::json j) {
    auto m = base;
    std::string s = j.dump();
    m[wq + ".quant_state.bitsandbytes__nf4"] =
        StTensor{"U8", {int64_t(s.size())}, std::vector<uint8_t>(s.begin(), s.end())};
    return m;
  };
  struct Bad {
    const char* what;
    std::map<std::string, StTensor> tensors;
    int32_t status;
    std::string must_name;
    int64_t rows = 24, cols = 172;
  };
  std::vector<Bad> cases;
  cases.push_back({"expected shape differs", base, QLFT_ERR_FORMAT, "quant_state", 24, 170});
  {
    auto j = state_json();
    j["quant_type"] = "fp4";
    cases.push_back({"fp4", with_state(j), QLFT_ERR_UNSUPPORTED, "quant_type"});
  }
  {
    auto j = state_json();
    j["blocksize"] = 48;
    cases.push_back({"blocksize", with_state(j), QLFT_ERR_FORMAT, "blocksize"});
  }
  {
    auto j = state_json();
    j["blocksize"] = 128;  // the absmax tensors no longer fit
    cases.push_back({"absmax count", with_state(j), QLFT_ERR_FORMAT, wq + ".absmax"});
  }
  {
    auto j = state_json();
    j.erase("nested_offset");
    cases.push_back({"no offset", with_state(j), QLFT_ERR_FORMAT, "nested_offset"});
  }
  {
    auto m = base;
    std::string s = "{\"quant_type\": ";
    m[wq + ".quant_state.bitsandbytes__nf4"] =
        StTensor{"U8", {int64_t(s.size())}, std::vector<uint8_t>(s.begin(), s.end())};
    cases.push_back({"bad json", m, QLFT_ERR_FORMAT, "JSON"});
  }
  {
    auto m = base;
    m[wq].bytes.pop_back();
    m[wq].shape = {int64_t(m[wq].bytes.size()), 1};
    cases.push_back({"short codes", m, QLFT_ERR_FORMAT, wq});
  }
  {
    auto m = base;
    m.erase(wq + ".nested_absmax");
    cases.push_back({"no nested absmax", m, QLFT_ERR_FORMAT, wq + ".nested_absmax"});
  }
  {
    auto m = base;
    std::memset(m[wq + ".quant_map"].bytes.data(), 0, 4);
    cases.push_back({"quant map", m, QLFT_ERR_FORMAT, wq + ".quant_map"});
  }
  {
    auto m = base;
    m.erase(wq + ".quant_state.bitsandbytes__nf4");
    cases.push_back({"absmax without state", m, QLFT_ERR_FORMAT, wq + ".absmax"});
  }
  {
    auto m = base;
    const std::string so = std::string(kO) + ".SCB";
    m[so].bytes.resize(m[so].bytes.size() - 4);
    m[so].shape = {19};
    cases.push_back({"short SCB", m, QLFT_ERR_FORMAT, so, 20, 64});
  }
  {
    auto m = base;
    m.erase(std::string(kO) + ".SCB");
    cases.push_back({"int8 without SCB", m, QLFT_ERR_FORMAT, std::string(kO) + ".weight", 20, 64});
  }
  int k = 0;
  for (const Bad& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string path = dir + "/bad" + std::to_string(k++) + ".safetensors";
    write_safetensors(path, c.tensors);
    auto st = SafetensorsSet::open(path);
    const char* prefix = c.must_name.find(kO) != std::string::npos ? kO : kQ;
    MemoryTracker tr;
    QWeight w;
    try {
      load_bnb_weight(&tr, *st, prefix, c.rows, c.cols, &w);
      ADD_FAILURE() << "expected an error";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), c.status) << e.what();
      EXPECT_NE(std::string(e.what()).find(c.must_name), std::string::npos) << e.what();
    }
  }
}

// A whole tiny Llama quantized by transformers (BitsAndBytesConfig, 4-bit NF4 with double quant and
// 8-bit LLM.int8) and written by save_pretrained: every linear loads and dequantizes to exactly
// what bitsandbytes dequantizes.
TEST(Bnb, LoadsTransformersSavePretrainedModels) {
  for (const std::string name : {"tiny_llama_nf4", "tiny_llama_int8"}) {
    SCOPED_TRACE(name);
    const std::string dir = qlft_test::fixture_path("quant/" + name);
    auto cfg_bytes = qlft_test::read_file(dir + "/config.json");
    auto cfg = nlohmann::json::parse(std::string(cfg_bytes.begin(), cfg_bytes.end()));
    const int64_t hidden = cfg["hidden_size"], inter = cfg["intermediate_size"];
    const int64_t heads = cfg["num_attention_heads"], kv = cfg["num_key_value_heads"];
    const int64_t head_dim = hidden / heads;
    auto st = SafetensorsSet::open(dir);
    auto ex =
        SafetensorsFile::open(qlft_test::fixture_path("quant/" + name + "_expected.safetensors"));
    const std::string l0 = "model.layers.0.";
    const std::vector<std::tuple<std::string, int64_t, int64_t>> linears = {
        {"self_attn.q_proj", hidden, hidden},
        {"self_attn.k_proj", kv * head_dim, hidden},
        {"self_attn.v_proj", kv * head_dim, hidden},
        {"self_attn.o_proj", hidden, hidden},
        {"mlp.gate_proj", inter, hidden},
        {"mlp.up_proj", inter, hidden},
        {"mlp.down_proj", hidden, inter}};
    MemoryTracker tr;
    for (const auto& [suffix, rows, cols] : linears) {
      SCOPED_TRACE(suffix);
      QWeight w;
      ASSERT_TRUE(load_bnb_weight(&tr, *st, l0 + suffix, rows, cols, &w));
      EXPECT_EQ(w.kind, name == "tiny_llama_nf4" ? QuantKind::NF4 : QuantKind::INT8);
      EXPECT_EQ(bit_diffs(all_rows(w), fixture_tensor<float>(*ex, l0 + suffix)), 0u);
      check_row_ranges(w);
    }
    QWeight plain;  // norms and embeddings stay plain
    EXPECT_FALSE(load_bnb_weight(&tr, *st, "model.embed_tokens", 64, hidden, &plain));
  }
}
