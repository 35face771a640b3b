// Hostile safetensors input and bad shard indexes: each must fail with QLFT_ERR_FORMAT (or _IO
// for a missing file, _UNSUPPORTED for a valid but unhandled dtype) and a message naming the
// problem, in the reader and in the model loader, with no out-of-bounds read (run under
// -DQLFT_SANITIZE=address,undefined too) and no leaked tracked memory.
#include <gtest/gtest.h>

#include <random>

#include "core/error.h"
#include "core/memory.h"
#include "formats/safetensors.h"
#include "model/model.h"
#include "support/format_cases.h"
#include "support/test_support.h"

using namespace qlft;

namespace {

struct Outcome {
  int32_t status = QLFT_OK;
  std::string message;
};

template <class F>
Outcome run(F&& f) {
  Outcome o;
  try {
    f();
  } catch (const Error& e) {
    o.status = e.status();
    o.message = e.what();
  }
  return o;
}

Outcome load(const std::string& p, MemoryTracker& tr) {
  LoadOptions opt;
  opt.quant_type = qlft::QuantType::Keep;
  return run([&] { load_model(&tr, p, opt); });
}

void put_text(const std::string& path, const std::string& s) {
  qlft_test::write_file(path, s.data(), s.size());
}

// A model directory with the tiny llama config.json and the given model.safetensors bytes.
std::string model_dir(const std::string& tag, const std::vector<uint8_t>& st) {
  std::string dir = qlft_test::temp_dir(tag);
  put_text(dir + "/config.json", qlft_test::tiny_hf_config());
  qlft_test::write_file(dir + "/model.safetensors", st.data(), st.size());
  return dir;
}

void expect_fails(const Outcome& o, int32_t status, const std::string& fragment) {
  EXPECT_EQ(o.status, status) << o.message;
  EXPECT_NE(o.message.find(fragment), std::string::npos) << o.message;
}

}  // namespace

TEST(SafetensorsHostile, TinyModelIsValid) {
  const std::string dir = model_dir("st-valid", qlft_test::tiny_hf_safetensors().build());
  MemoryTracker tr;
  Outcome o = load(dir, tr);
  EXPECT_EQ(o.status, QLFT_OK) << o.message;
}

TEST(SafetensorsHostile, EveryCaseFails) {
  auto cases = qlft_test::hostile_safetensors_cases();
  ASSERT_GT(cases.size(), 25u);
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string dir = model_dir("st-hostile-" + c.name, c.bytes);
    const std::string file = dir + "/model.safetensors";
    Outcome r = run([&] { SafetensorsFile::open(file); });
    if (c.reader_ok) {
      EXPECT_EQ(r.status, QLFT_OK) << r.message;
    } else {
      expect_fails(r, c.load_status, c.message);
      EXPECT_NE(r.message.find(file), std::string::npos) << r.message;
    }
    MemoryTracker tr;
    expect_fails(load(dir, tr), c.load_status, c.message);
    EXPECT_EQ(tr.total_reserved(), 0u);
  }
}

TEST(SafetensorsHostile, EveryTruncationFails) {
  const auto full = qlft_test::tiny_hf_safetensors().build();
  const std::string dir = model_dir("st-trunc", {});
  const std::string file = dir + "/model.safetensors";
  qlft_test::AppendFile grow(file);
  for (size_t n = 0; n < full.size(); ++n) {
    if (n > 0) grow.append(&full[n - 1], 1);
    Outcome r = run([&] { SafetensorsFile::open(file); });
    ASSERT_EQ(r.status, QLFT_ERR_FORMAT) << "prefix " << n << ": " << r.message;
    MemoryTracker tr;
    Outcome l = load(dir, tr);
    ASSERT_EQ(l.status, QLFT_ERR_FORMAT) << "prefix " << n << ": " << l.message;
    ASSERT_EQ(tr.total_reserved(), 0u);
  }
  grow.append(&full.back(), 1);
  MemoryTracker tr;
  EXPECT_EQ(load(dir, tr).status, QLFT_OK);
}

TEST(SafetensorsHostile, RandomHeaderCorruptionNeverCrashes) {
  const auto full = qlft_test::tiny_hf_safetensors().build();
  const std::string dir = model_dir("st-mutate", full);
  qlft_test::AppendFile file(dir + "/model.safetensors");
  uint64_t hlen;
  std::memcpy(&hlen, full.data(), 8);
  std::mt19937 rng(99);
  const char alphabet[] = "{}[]\",:0123456789-.eE ";
  int rejected = 0;
  for (int it = 0; it < 1000; ++it) {
    auto b = full;
    for (int f = 0, n = 1 + rng() % 3; f < n; ++f) {
      size_t pos = 8 + rng() % hlen;
      b[pos] = (rng() % 2) ? static_cast<uint8_t>(alphabet[rng() % (sizeof alphabet - 1)])
                           : static_cast<uint8_t>(rng());
    }
    file.overwrite(b.data(), b.size());
    MemoryTracker tr;
    Outcome l = load(dir, tr);
    ASSERT_TRUE(l.status == QLFT_OK || l.status == QLFT_ERR_FORMAT ||
                l.status == QLFT_ERR_UNSUPPORTED)
        << it << ": " << l.status << " " << l.message;
    rejected += l.status != QLFT_OK;
    ASSERT_EQ(tr.total_reserved(), 0u);
  }
  EXPECT_GT(rejected, 500);
}

// ---- model.safetensors.index.json ------------------------------------------------------------

class ShardIndex : public ::testing::Test {
 protected:
  // The tiny model split over two shards; `index` is the valid index text.
  void SetUp() override {
    dir_ = qlft_test::temp_dir("st-index");
    put_text(dir_ + "/config.json", qlft_test::tiny_hf_config());
    auto all = qlft_test::tiny_hf_safetensors();
    qlft_test::RawSafetensors a, b;
    for (size_t i = 0; i < all.tensors.size(); ++i)
      (i % 2 ? b : a).tensors.push_back(all.tensors[i]);
    auto ba = a.build(), bb = b.build();
    qlft_test::write_file(dir_ + "/s1.safetensors", ba.data(), ba.size());
    qlft_test::write_file(dir_ + "/s2.safetensors", bb.data(), bb.size());
    for (size_t i = 0; i < all.tensors.size(); ++i)
      map_ += std::string(map_.empty() ? "" : ",") + "\"" + all.tensors[i].name + "\":\"" +
              (i % 2 ? "s2" : "s1") + ".safetensors\"";
  }
  Outcome with_index(const std::string& text) {
    put_text(dir_ + "/model.safetensors.index.json", text);
    MemoryTracker tr;
    Outcome o = load(dir_, tr);
    EXPECT_EQ(tr.total_reserved(), 0u);
    Outcome r = run([&] { SafetensorsSet::open(dir_); });
    EXPECT_EQ(r.status, o.status) << r.message;  // the reader alone catches it too
    return o;
  }
  std::string index(const std::string& map) { return "{\"weight_map\": {" + map + "}}"; }
  std::string dir_, map_;
};

TEST_F(ShardIndex, ValidIndexLoads) {
  EXPECT_EQ(with_index(index(map_)).status, QLFT_OK);
}

TEST_F(ShardIndex, ShardOutsideTheDirectory) {
  expect_fails(with_index(index(map_ + ",\"x\":\"../s1.safetensors\"")), QLFT_ERR_FORMAT,
               "../s1.safetensors");
  expect_fails(with_index(index(map_ + ",\"x\":\"/etc/passwd\"")), QLFT_ERR_FORMAT, "/etc/passwd");
  expect_fails(with_index(index(map_ + ",\"x\":\"..\"")), QLFT_ERR_FORMAT, "beside the index");
  expect_fails(with_index(index(map_ + ",\"x\":\"\"")), QLFT_ERR_FORMAT, "beside the index");
}

TEST_F(ShardIndex, TensorMissingFromShard) {
  expect_fails(with_index(index(map_ + ",\"model.extra\":\"s1.safetensors\"")), QLFT_ERR_FORMAT,
               "model.extra");
}

TEST_F(ShardIndex, TensorInTheWrongShard) {
  std::string m = map_;
  // model.norm.weight is in s2; claim s1.
  size_t p = m.find("\"model.norm.weight\":\"s2");
  ASSERT_NE(p, std::string::npos);
  m[p + std::string("\"model.norm.weight\":\"s").size()] = '1';
  expect_fails(with_index(index(m)), QLFT_ERR_FORMAT, "model.norm.weight");
}

TEST_F(ShardIndex, InvalidJsonAndMissingMap) {
  expect_fails(with_index("{\"weight_map\": {"), QLFT_ERR_FORMAT, "model.safetensors.index.json");
  expect_fails(with_index("[]"), QLFT_ERR_FORMAT, "model.safetensors.index.json");
  expect_fails(with_index("{\"metadata\": {}}"), QLFT_ERR_FORMAT, "weight_map");
  expect_fails(with_index("{\"weight_map\": {\"a\": 5}}"), QLFT_ERR_FORMAT, "weight_map");
}

TEST_F(ShardIndex, MissingShardIsIoError) {
  expect_fails(with_index(index(map_ + ",\"x\":\"s3.safetensors\"")), QLFT_ERR_IO,
               "s3.safetensors");
}

TEST_F(ShardIndex, TensorInTwoShards) {
  // s3 repeats a tensor of s1.
  auto all = qlft_test::tiny_hf_safetensors();
  qlft_test::RawSafetensors c;
  c.tensors.push_back(all.tensors[0]);
  auto bc = c.build();
  qlft_test::write_file(dir_ + "/s3.safetensors", bc.data(), bc.size());
  expect_fails(with_index(index(map_ + ",\"y\":\"s3.safetensors\"")), QLFT_ERR_FORMAT,
               all.tensors[0].name);
}
