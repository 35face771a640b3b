// Hostile GGUF input: truncations at every length, oversized counts and lengths, bad offsets,
// unknown types, duplicates, and model-level inconsistencies. Each must fail with
// QLFT_ERR_FORMAT and a message naming what is wrong, in the reader and in the model loader,
// without reading out of bounds (run under -DQLFT_SANITIZE=address,undefined too) and without
// leaking tracked memory.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <random>

#include "core/error.h"
#include "core/memory.h"
#include "formats/gguf.h"
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

Outcome open_gguf(const std::string& p) {
  return run([&] { GgufFile::open(p); });
}

Outcome load(const std::string& p, MemoryTracker& tr) {
  LoadOptions opt;
  opt.quant_type = qlft::QuantType::Keep;
  return run([&] { load_model(&tr, p, opt); });
}

std::string write_tmp(const std::string& dir, const std::string& name,
                      const std::vector<uint8_t>& b) {
  std::string p = dir + "/" + name + ".gguf";
  qlft_test::write_file(p, b.data(), b.size());
  return p;
}

}  // namespace

TEST(GgufHostile, TinyModelIsValid) {
  const std::string dir = qlft_test::temp_dir("gguf-hostile-valid");
  const std::string p = write_tmp(dir, "tiny", qlft_test::tiny_llama_gguf().build());
  MemoryTracker tr;
  LoadOptions opt;
  opt.quant_type = qlft::QuantType::Keep;
  auto m = load_model(&tr, p, opt);
  EXPECT_EQ(m->cfg.dim, 8);
  EXPECT_EQ(m->cfg.n_layers, 1);
  EXPECT_EQ(m->cfg.vocab, 12);
  EXPECT_EQ(m->cfg.n_kv_heads, 1);
  EXPECT_EQ(m->cfg.ffn_dim, 16);
  EXPECT_FALSE(m->cfg.tied_embeddings);
  // token_embd is tensor 0: GGUF ne {dim, vocab} -> row-major [vocab, dim]: element i is value i.
  std::vector<float> row(8 * 12);
  m->tok_embd.dequantize_rows(0, 12, row.data());
  for (size_t i = 0; i < row.size(); ++i) ASSERT_EQ(row[i], qlft_test::tiny_value(0, i));
}

TEST(GgufHostile, EveryCaseFailsWithFormatError) {
  const std::string dir = qlft_test::temp_dir("gguf-hostile");
  auto cases = qlft_test::hostile_gguf_cases();
  ASSERT_GT(cases.size(), 30u);
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string p = write_tmp(dir, c.name, c.bytes);
    Outcome r = open_gguf(p);
    if (c.reader_ok) {
      EXPECT_EQ(r.status, QLFT_OK) << r.message;
    } else {
      EXPECT_EQ(r.status, QLFT_ERR_FORMAT) << r.message;
      EXPECT_NE(r.message.find(c.message), std::string::npos) << r.message;
      EXPECT_NE(r.message.find(p), std::string::npos) << r.message;  // names the file
    }
    MemoryTracker tr;
    Outcome l = load(p, tr);
    EXPECT_EQ(l.status, c.load_status) << l.message;
    EXPECT_NE(l.message.find(c.message), std::string::npos) << l.message;
    EXPECT_EQ(tr.total_reserved(), 0u) << "tracked memory leaked after a failed load";
  }
}

TEST(GgufHostile, EveryTruncationFails) {
  const std::string dir = qlft_test::temp_dir("gguf-trunc");
  const auto full = qlft_test::tiny_llama_gguf().build();
  const std::string p = dir + "/t.gguf";
  // Prefixes grow one appended byte at a time (truncating a file per prefix is slow on ext4).
  qlft_test::AppendFile grow(p);
  for (size_t n = 0; n < full.size(); ++n) {
    if (n > 0) grow.append(&full[n - 1], 1);
    Outcome r = open_gguf(p);
    ASSERT_EQ(r.status, QLFT_ERR_FORMAT) << "prefix " << n << ": " << r.message;
    ASSERT_FALSE(r.message.empty());
    MemoryTracker tr;
    Outcome l = load(p, tr);
    ASSERT_EQ(l.status, QLFT_ERR_FORMAT) << "prefix " << n << ": " << l.message;
    ASSERT_EQ(tr.total_reserved(), 0u);
  }
  grow.append(&full.back(), 1);
  EXPECT_EQ(open_gguf(p).status, QLFT_OK);
}

TEST(GgufHostile, RandomByteCorruptionNeverCrashes) {
  // Random corruptions are not all detectable (a flipped weight byte is still a valid file), but
  // none may crash, read out of bounds or fail with anything but FORMAT/UNSUPPORTED.
  const std::string dir = qlft_test::temp_dir("gguf-mutate");
  const auto full = qlft_test::tiny_llama_gguf().build();
  const std::string p = dir + "/m.gguf";
  qlft_test::AppendFile file(p);
  std::mt19937 rng(1234);
  int rejected = 0;
  for (int it = 0; it < 1500; ++it) {
    auto b = full;
    int flips = 1 + rng() % 4;
    for (int f = 0; f < flips; ++f) {
      // Mostly in the header, where the structure is.
      size_t pos = (rng() % 4 != 0) ? rng() % std::min<size_t>(b.size(), 700) : rng() % b.size();
      b[pos] = static_cast<uint8_t>(rng());
    }
    file.overwrite(b.data(), b.size());
    MemoryTracker tr;
    Outcome l = load(p, tr);
    ASSERT_TRUE(l.status == QLFT_OK || l.status == QLFT_ERR_FORMAT ||
                l.status == QLFT_ERR_UNSUPPORTED)
        << "iteration " << it << ": " << l.status << " " << l.message;
    if (l.status != QLFT_OK) {
      ++rejected;
      ASSERT_FALSE(l.message.empty());
    }
    ASSERT_EQ(tr.total_reserved(), 0u);
  }
  EXPECT_GT(rejected, 100);
}

TEST(GgufHostile, SpecialFilesAreIoErrorsAndNeverBlock) {
  const std::string dir = qlft_test::temp_dir("gguf-fifo");
  const std::string fifo = dir + "/model.gguf";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  Outcome r = open_gguf(fifo);  // opening a FIFO for reading must not wait for a writer
  EXPECT_EQ(r.status, QLFT_ERR_IO) << r.message;
  EXPECT_NE(r.message.find(fifo), std::string::npos) << r.message;
  MemoryTracker tr;
  EXPECT_EQ(load(fifo, tr).status, QLFT_ERR_IO);
  EXPECT_EQ(open_gguf(dir).status, QLFT_ERR_IO);  // a directory
  EXPECT_EQ(open_gguf(dir + "/absent.gguf").status, QLFT_ERR_IO);
}
