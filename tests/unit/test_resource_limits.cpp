// Resource limits: inputs that are huge or declare huge sizes get a clear error or a correct
// result, in memory bounded by what is kept (never by what is declared or skipped).
//  - a model whose declared tensor sizes exceed the file (a GGUF claiming a 2^36-element
//    embedding, and the real model cut short): QLFT_ERR_FORMAT naming the file, nothing allocated;
//  - a dataset line of 1 GB (a sparse file, so the disk holds almost nothing): refused as longer
//    than data.max_record_bytes naming file:line (or skipped and counted), without the line ever
//    being copied into memory;
//  - a vocabulary of 10 million tokens (a GGUF written on the fly): refused as larger than
//    Tokenizer::kMaxVocab, holding no more than the reader's views of the file; a tokenizer.json
//    whose one huge id would size a 2^30-entry table: refused without allocating it;
//  - 100k tiny records: all read, tokenized and packed, none lost.
// Memory is measured as the peak of live operator-new bytes (this executable replaces the global
// operator new/delete to count them); tracked Buffers are checked through the MemoryTracker.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "config/config.h"
#include "core/error.h"
#include "data/dataset.h"
#include "data/records.h"
#include "data/tokenizer_encoder.h"
#include "formats/gguf.h"
#include "formats/gguf_writer.h"
#include "model/model.h"
#include "support/test_support.h"
#include "tokenizer/tokenizer.h"

// ---- counting operator new ---------------------------------------------------------------------

namespace {
std::atomic<int64_t> g_live{0}, g_peak{0};

void note_alloc(void* p) {
  if (!p) return;
  int64_t now = g_live.fetch_add(static_cast<int64_t>(malloc_usable_size(p))) +
                static_cast<int64_t>(malloc_usable_size(p));
  int64_t peak = g_peak.load(std::memory_order_relaxed);
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
}
void note_free(void* p) {
  if (p) g_live.fetch_sub(static_cast<int64_t>(malloc_usable_size(p)));
}
void* counted_new(size_t n) {
  void* p = std::malloc(n ? n : 1);
  if (!p) throw std::bad_alloc();
  note_alloc(p);
  return p;
}

// Peak live heap bytes (operator new) above what was live when constructed.
struct HeapPeak {
  int64_t base;
  HeapPeak() : base(g_live.load()) { g_peak.store(base); }
  int64_t bytes() const { return g_peak.load() - base; }
};
}  // namespace

// Every non-aligned form is replaced, nothrow ones included (std::stable_sort uses them), so new
// and delete always pair up (ASan checks that); the aligned forms are left alone together.
void* operator new(size_t n, const std::nothrow_t&) noexcept {
  void* p = std::malloc(n ? n : 1);
  note_alloc(p);
  return p;
}
void* operator new[](size_t n, const std::nothrow_t& t) noexcept {
  return operator new(n, t);
}
void operator delete(void* p, const std::nothrow_t&) noexcept {
  note_free(p);
  std::free(p);
}
void operator delete[](void* p, const std::nothrow_t&) noexcept {
  note_free(p);
  std::free(p);
}
void* operator new(size_t n) {
  return counted_new(n);
}
void* operator new[](size_t n) {
  return counted_new(n);
}
void operator delete(void* p) noexcept {
  note_free(p);
  std::free(p);
}
void operator delete[](void* p) noexcept {
  note_free(p);
  std::free(p);
}
void operator delete(void* p, size_t) noexcept {
  note_free(p);
  std::free(p);
}
void operator delete[](void* p, size_t) noexcept {
  note_free(p);
  std::free(p);
}

using namespace qlft;

namespace {

constexpr int64_t kMiB = int64_t(1) << 20;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// path = head, then a hole of `hole` bytes (reads as NUL bytes, takes no disk), then tail.
void write_sparse(const std::string& path, const std::string& head, int64_t hole,
                  const std::string& tail) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0) << path;
  ASSERT_EQ(::write(fd, head.data(), head.size()), static_cast<ssize_t>(head.size()));
  ASSERT_EQ(::lseek(fd, hole, SEEK_CUR), static_cast<off_t>(head.size() + hole));
  ASSERT_EQ(::write(fd, tail.data(), tail.size()), static_cast<ssize_t>(tail.size()));
  ::close(fd);
}

}  // namespace

// ---- models that declare more than the file holds ----------------------------------------------

TEST(ResourceLimits, GgufTensorDeclaredLargerThanTheFileIsAFormatError) {
  const std::string dir = qlft_test::temp_dir("limits_gguf");
  const std::string path = dir + "/huge.gguf";
  {
    GgufWriter w;
    w.add_string("general.architecture", "llama");
    std::vector<float> v(64 * 8, 0.5f);
    w.add_tensor_f32("token_embd.weight", {64, 8}, v.data());
    w.write(path);
  }
  // Patch ne[1] of the tensor (after its name and n_dims) to 2^30: 2^36 elements declared.
  std::vector<uint8_t> bytes = qlft_test::read_file(path);
  const std::string name = "token_embd.weight";
  auto it = std::search(bytes.begin(), bytes.end(), name.begin(), name.end());
  ASSERT_NE(it, bytes.end());
  size_t at = static_cast<size_t>(it - bytes.begin()) + name.size() + 4 + 8;
  uint64_t huge = uint64_t(1) << 30;
  std::memcpy(&bytes[at], &huge, 8);
  qlft_test::write_file(path, bytes.data(), bytes.size());

  HeapPeak heap;
  try {
    GgufFile::open(path);
    FAIL() << "a tensor larger than the file must be refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), QLFT_ERR_FORMAT) << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("token_embd.weight"), std::string::npos) << e.what();
  }
  EXPECT_LT(heap.bytes(), 4 * kMiB) << "nothing of the declared size may be allocated";
}

TEST(ResourceLimits, TruncatedRealModelIsAFormatErrorWithNothingAllocated) {
  QLFT_NEED_SHARED(model, "models/stories260K.gguf");
  std::vector<uint8_t> bytes = qlft_test::read_file(model);
  const std::string dir = qlft_test::temp_dir("limits_model");
  for (double frac : {0.3, 0.9, 0.999}) {
    const std::string path = dir + "/cut.gguf";
    qlft_test::write_file(path, bytes.data(), static_cast<size_t>(bytes.size() * frac));
    MemoryTracker tracker;
    try {
      LoadOptions lo;
      lo.quant_type = qlft::QuantType::NF4;
      load_model(&tracker, path, lo);
      FAIL() << "a model cut at " << frac << " must not load";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), QLFT_ERR_FORMAT) << e.what();
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
    EXPECT_EQ(tracker.total_reserved(), 0u) << "the failed load must release what it took";
  }
}

// ---- a dataset line of 1 GB --------------------------------------------------------------------

TEST(ResourceLimits, DatasetLineOfOneGigabyteIsRefusedWithoutHoldingIt) {
  const std::string dir = qlft_test::temp_dir("limits_line");
  const int64_t kLine = int64_t(1) << 30;
  const std::string jsonl = dir + "/big.jsonl", txt = dir + "/big.txt";
  // Line 2 is 1 GiB of NUL bytes (a hole); lines 1 and 3 are ordinary records.
  write_sparse(jsonl, "{\"text\": \"first\"}\n", kLine, "\n{\"text\": \"third\"}\n");
  write_sparse(txt, "first\n", kLine, "\nthird\n");

  // JSONL, data.on_error=fail: an error naming file:line and the limit.
  {
    HeapPeak heap;
    data::DropLog log;
    auto t0 = std::chrono::steady_clock::now();
    try {
      data::read_records(jsonl, data::ReadOptions{}, log);
      FAIL() << "a 1 GiB record must be refused";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), QLFT_ERR_FORMAT) << e.what();
      EXPECT_NE(std::string(e.what()).find(jsonl + ":2"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("max_record_bytes"), std::string::npos) << e.what();
    }
    EXPECT_LT(heap.bytes(), 16 * kMiB) << "the line must not be copied";
    std::printf("[ limits ] 1 GiB JSONL line refused in %.2f s, peak heap %.2f MiB\n",
                seconds_since(t0), heap.bytes() / double(kMiB));
  }
  // Text split at every line, data.on_error=skip: the other documents are read, the long one
  // is counted (this splitter used to copy each piece before checking its size).
  {
    data::ReadOptions opt;
    opt.split = data::TextSplit::AtSeparator;
    opt.separator = "\n";
    opt.skip_bad = true;
    data::DropLog log;
    HeapPeak heap;
    std::vector<data::Record> recs = data::read_records(txt, opt, log);
    ASSERT_EQ(recs.size(), 2u);
    EXPECT_EQ(recs[0].text, "first");
    EXPECT_EQ(recs[1].text, "third");
    EXPECT_EQ(log.count, 1u);
    EXPECT_EQ(log.by_reason["too_long"], 1u);
    EXPECT_LT(heap.bytes(), 16 * kMiB) << "the line must not be copied";
  }
  // Blank-line separated text (the default): the file is one 1 GiB document, too long.
  {
    data::ReadOptions opt;
    opt.skip_bad = true;
    data::DropLog log;
    HeapPeak heap;
    std::vector<data::Record> recs = data::read_records(txt, opt, log);
    EXPECT_EQ(recs.size(), 0u);
    EXPECT_EQ(log.by_reason["too_long"], 1u);
    EXPECT_LT(heap.bytes(), 16 * kMiB) << "the document must not be copied";
  }
  std::remove(jsonl.c_str());
  std::remove(txt.c_str());
}

// ---- 100k tiny records -------------------------------------------------------------------------

TEST(ResourceLimits, HundredThousandTinyRecordsAreAllUsed) {
  QLFT_NEED_SHARED(model, "models/stories260K.gguf");
  auto tok = Tokenizer::from_gguf_file(model);
  data::TokenizerEncoder enc(*tok);
  const std::string dir = qlft_test::temp_dir("limits_records");
  const std::string path = dir + "/tiny.jsonl";
  const int kRecords = 100000;
  {
    std::string all;
    for (int i = 0; i < kRecords; ++i) all += "{\"text\": \"a cat\"}\n";
    qlft_test::write_file(path, all.data(), all.size());
  }
  Config c;
  c.set("data.path", path);
  c.set("data.seq_len", "64");
  HeapPeak heap;
  auto t0 = std::chrono::steady_clock::now();
  data::Dataset d = data::Dataset::build(qlft::parse_run_spec(c).data, enc);
  const double secs = seconds_since(t0);
  const data::DataStats& s = d.stats();
  EXPECT_EQ(s.records, static_cast<uint64_t>(kRecords));
  EXPECT_EQ(s.records_used, static_cast<uint64_t>(kRecords));
  EXPECT_EQ(s.records_dropped, 0u);
  EXPECT_EQ(s.train_docs, static_cast<uint64_t>(kRecords));
  // Every record is the same text: the total is the count times one record's tokens.
  data::Record one;
  one.text = "a cat";
  std::vector<int32_t> ids;
  std::vector<uint8_t> trained;
  std::string source;
  data::tokenize_record(one, data::resolve_template(data::TemplateKind::Auto, enc, &source),
                        data::TrainOn::Completion, enc, ids, trained);
  ASSERT_GT(ids.size(), 0u);
  EXPECT_EQ(s.tokens, static_cast<uint64_t>(kRecords) * ids.size());
  EXPECT_EQ(s.min_tokens, ids.size());
  EXPECT_EQ(s.max_tokens, ids.size());
  std::printf("[ limits ] 100k records: %.2f s, peak heap %.1f MiB, %llu rows\n", secs,
              heap.bytes() / double(kMiB), static_cast<unsigned long long>(s.train_rows));
  EXPECT_LT(heap.bytes(), 512 * kMiB) << "about 5 KiB per 6-token record would be a leak";
}

// ---- a vocabulary of 10 million tokens ---------------------------------------------------------

namespace {

// Streams a tokenizer-only GGUF v3 (SentencePiece "llama" model) with n distinct 4-character
// tokens (120 MB for 10M). Written directly, so the test holds no 10M-entry vector of its own.
void write_big_vocab(const std::string& path, uint64_t n) {
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_TRUE(f) << path;
  std::vector<char> buf(1 << 20);
  std::setvbuf(f, buf.data(), _IOFBF, buf.size());
  auto u32 = [&](uint32_t v) { std::fwrite(&v, 4, 1, f); };
  auto u64 = [&](uint64_t v) { std::fwrite(&v, 8, 1, f); };
  auto str = [&](const char* s, uint64_t len) {
    u64(len);
    std::fwrite(s, 1, len, f);
  };
  const uint32_t kString = 8, kArray = 9;
  std::fwrite("GGUF", 1, 4, f);
  u32(3);
  u64(0);  // tensors
  u64(2);  // key-value pairs
  str("tokenizer.ggml.model", 20);
  u32(kString);
  str("llama", 5);
  str("tokenizer.ggml.tokens", 21);
  u32(kArray);
  u32(kString);
  u64(n);
  static const char kAlpha[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_";
  for (uint64_t i = 0; i < n; ++i) {
    const char t[4] = {kAlpha[i & 63], kAlpha[(i >> 6) & 63], kAlpha[(i >> 12) & 63],
                       kAlpha[(i >> 18) & 63]};
    str(t, 4);
  }
  ASSERT_EQ(std::fclose(f), 0);
}

}  // namespace

// 10M tokens is ~40x any real vocabulary; building the lookup tables for it took minutes and
// 2.5 GB (measured: 260 B per token), so the tokenizer refuses vocabularies above
// Tokenizer::kMaxVocab (4M) before taking per-token memory. The GGUF reader itself holds one
// 16-byte view per string of the mapped file.
TEST(ResourceLimits, VocabularyOfTenMillionTokensIsRefusedClearly) {
  const std::string dir = qlft_test::temp_dir("limits_vocab");
  const std::string path = dir + "/vocab10m.gguf";
  const uint64_t kVocab = 10000000;
  write_big_vocab(path, kVocab);
  HeapPeak heap;
  auto t0 = std::chrono::steady_clock::now();
  try {
    Tokenizer::from_gguf_file(path);
    FAIL() << "a 10M-token vocabulary must be refused";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.status(), QLFT_ERR_FORMAT) << msg;
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find("tokenizer.ggml.tokens"), std::string::npos) << msg;
    EXPECT_NE(msg.find("10000000"), std::string::npos) << msg;
  }
  std::printf("[ limits ] 10M-token vocabulary refused in %.2f s, peak heap %.0f MiB\n",
              seconds_since(t0), heap.bytes() / double(kMiB));
  EXPECT_LT(heap.bytes(), 512 * kMiB) << "only the reader's string views may be held";
  std::remove(path.c_str());
}

// tokenizer.json sizes its token table by the largest id: one huge id must not allocate it.
TEST(ResourceLimits, TokenizerJsonHugeIdIsRefusedWithoutAllocating) {
  const std::string json =
      R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1073741000}, "merges": []}})";
  HeapPeak heap;
  try {
    Tokenizer::from_hf_json_text(json, "", "tokenizer.json");
    FAIL() << "an id of 2^30 must be refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), QLFT_ERR_FORMAT) << e.what();
    EXPECT_NE(std::string(e.what()).find("'b'"), std::string::npos) << e.what();
  }
  EXPECT_LT(heap.bytes(), 4 * kMiB);
}
