// GGUF writer round trips through the reader, and AtomicFile never leaves a half-written file.
// With QLFT_WRITER_OUT=DIR the files are also left in DIR for the Python check
// (`gen_formats_fixtures.py --check DIR`, which loads them with the `gguf` package).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "core/error.h"
#include "core/half.h"
#include "formats/atomic_file.h"
#include "formats/gguf.h"
#include "formats/gguf_writer.h"
#include "support/test_support.h"

using namespace qlft;

namespace {

std::vector<float> writer_values(size_t n, float scale, float offset) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i) * scale + offset;
  return v;
}

std::string out_dir(const std::string& tag) {
  const char* e = std::getenv("QLFT_WRITER_OUT");
  if (e && *e) {
    std::filesystem::create_directories(e);
    return e;
  }
  return qlft_test::temp_dir(tag);
}

bool exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

// Files in dir whose name contains ".tmp.".
int temp_files(const std::string& dir) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().filename().string().find(".tmp.") != std::string::npos) ++n;
  return n;
}

}  // namespace

TEST(GgufWriter, RoundTripsEveryValueTypeAndTensorKind) {
  const std::string path = out_dir("gguf-writer") + "/writer.gguf";
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.add_u32("general.alignment", 64);
  w.add_u8("w.u8", 7);
  w.add_i8("w.i8", -7);
  w.add_u16("w.u16", 65000);
  w.add_i16("w.i16", -3);
  w.add_u32("w.u32", 4000000001u);
  w.add_i32("w.i32", -5);
  w.add_u64("w.u64", ~uint64_t(0) - 1);
  w.add_i64("w.i64", INT64_MIN + 1);
  w.add_f32("w.f32", 0.125f);
  w.add_f64("w.f64", 1e300);
  w.add_bool("w.bool", true);
  w.add_string("w.string", "qlft \xe2\x9c\x93");
  w.add_array("w.arr_i32", std::vector<int32_t>{1, -2, 3});
  w.add_array("w.arr_f32", std::vector<float>{0.5f, 1.5f});
  const uint64_t u64s[2] = {1, ~uint64_t(0)};
  w.add_array("w.arr_u64", GgufType::U64, u64s, 2);
  const uint8_t bools[3] = {1, 0, 1};
  w.add_array("w.arr_bool", GgufType::BOOL, bools, 3);
  w.add_array("w.arr_empty", GgufType::F64, nullptr, 0);
  w.add_string_array("w.arr_str", {"a", "", "bc"});
  EXPECT_EQ(w.alignment(), 64u);

  const auto f32 = writer_values(12, 0.5f, -3), f16 = writer_values(8, 0.25f, 1),
             bf16 = writer_values(16, 0.125f, -1);
  w.add_tensor_f32("w.f32", {4, 3}, f32.data());
  w.add_tensor_f32("w.f16", {8}, f16.data(), GgmlType::F16);
  w.add_tensor_f32("w.bf16", {16}, bf16.data(), GgmlType::BF16);
  // Raw Q8_0 blocks: f16 scale 0.5, then 32 int8 codes; codes run -32..31 over the two blocks.
  std::vector<uint8_t> q8(2 * 34);
  for (int b = 0; b < 2; ++b) {
    uint16_t d = f32_to_f16(0.5f);
    std::memcpy(&q8[b * 34], &d, 2);
    for (int i = 0; i < 32; ++i) q8[b * 34 + 2 + i] = static_cast<uint8_t>(int8_t(b * 32 + i - 32));
  }
  w.add_tensor("w.q8_0", GgmlType::Q8_0, {64}, q8.data(), q8.size());
  const auto big = writer_values(2 * 3 * 5 * 7, 1, 0);
  w.add_tensor_f32("w.4d", {2, 3, 5, 7}, big.data(), GgmlType::F32);
  w.write(path);
  EXPECT_EQ(temp_files(std::filesystem::path(path).parent_path()), 0);

  auto g = GgufFile::open(path);
  EXPECT_EQ(g->version(), 3u);
  EXPECT_EQ(g->alignment(), 64u);
  EXPECT_EQ(g->metadata().size(), 20u);
  EXPECT_EQ(g->find("w.u8")->u, 7u);
  EXPECT_EQ(g->find("w.u8")->type, GgufType::U8);
  EXPECT_EQ(g->find("w.i8")->i, -7);
  EXPECT_EQ(g->find("w.u16")->u, 65000u);
  EXPECT_EQ(g->find("w.i16")->i, -3);
  EXPECT_EQ(g->find("w.u32")->u, 4000000001u);
  EXPECT_EQ(g->find("w.i32")->i, -5);
  EXPECT_EQ(g->find("w.u64")->u, ~uint64_t(0) - 1);
  EXPECT_EQ(g->find("w.i64")->i, INT64_MIN + 1);
  EXPECT_EQ(g->find("w.f32")->f, 0.125);
  EXPECT_EQ(g->find("w.f32")->type, GgufType::F32);
  EXPECT_EQ(g->find("w.f64")->f, 1e300);
  EXPECT_TRUE(g->get_bool("w.bool", false));
  EXPECT_EQ(g->get_string("w.string"), "qlft \xe2\x9c\x93");
  const GgufValue* a = g->find("w.arr_i32");
  ASSERT_EQ(a->count, 3u);
  EXPECT_EQ(a->array_i(1), -2);
  EXPECT_EQ(g->find("w.arr_f32")->array_f(1), 1.5);
  EXPECT_EQ(static_cast<uint64_t>(g->find("w.arr_u64")->array_i(1)), ~uint64_t(0));
  EXPECT_EQ(g->find("w.arr_bool")->array_i(2), 1);
  EXPECT_EQ(g->find("w.arr_empty")->count, 0u);
  const GgufValue* s = g->find("w.arr_str");
  ASSERT_EQ(s->strings.size(), 3u);
  EXPECT_EQ(s->strings[0], "a");
  EXPECT_EQ(s->strings[1], "");
  EXPECT_EQ(s->strings[2], "bc");

  ASSERT_EQ(g->tensors().size(), 5u);
  const GgufTensorInfo* t = g->find_tensor("w.f32");
  ASSERT_EQ(t->n_dims, 2u);
  EXPECT_EQ(t->ne[0], 4);
  EXPECT_EQ(t->ne[1], 3);
  EXPECT_EQ(std::memcmp(t->data, f32.data(), 48), 0);
  t = g->find_tensor("w.f16");
  EXPECT_EQ(t->type, static_cast<uint32_t>(GgmlType::F16));
  for (int i = 0; i < 8; ++i) {
    uint16_t h;
    std::memcpy(&h, t->data + 2 * i, 2);
    EXPECT_EQ(f16_to_f32(h), f16[i]);  // all exactly representable
  }
  t = g->find_tensor("w.bf16");
  for (int i = 0; i < 16; ++i) {
    uint16_t h;
    std::memcpy(&h, t->data + 2 * i, 2);
    EXPECT_EQ(bf16_to_f32(h), bf16[i]);
  }
  t = g->find_tensor("w.q8_0");
  EXPECT_EQ(t->nbytes, 68u);
  EXPECT_EQ(std::memcmp(t->data, q8.data(), 68), 0);
  t = g->find_tensor("w.4d");
  EXPECT_EQ(t->n_dims, 4u);
  EXPECT_EQ(t->ne[3], 7);
  EXPECT_EQ(std::memcmp(t->data, big.data(), big.size() * 4), 0);
  for (const auto& ti : g->tensors()) EXPECT_EQ(ti.offset % 64, 0u) << ti.name;
}

TEST(GgufWriter, DefaultAlignmentIs32AndZeroTensorsIsValid) {
  const std::string dir = qlft_test::temp_dir("gguf-writer-min");
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.write(dir + "/empty.gguf");
  auto g = GgufFile::open(dir + "/empty.gguf");
  EXPECT_EQ(g->tensors().size(), 0u);
  EXPECT_EQ(g->alignment(), 32u);

  GgufWriter w2;
  const float v[3] = {1, 2, 3};
  w2.add_tensor_f32("a", {3}, v);
  w2.add_tensor_f32("b", {3}, v);
  w2.write(dir + "/two.gguf");
  auto g2 = GgufFile::open(dir + "/two.gguf");
  EXPECT_EQ(g2->find_tensor("b")->offset, 32u);
}

TEST(GgufWriter, RejectsInvalidInput) {
  GgufWriter w;
  w.add_u32("k", 1);
  EXPECT_THROW(w.add_u32("k", 2), Error);                   // duplicate key
  EXPECT_THROW(w.add_string("", "x"), Error);               // empty key
  EXPECT_THROW(w.add_u32("general.alignment", 48), Error);  // not a power of two
  const float v[4] = {};
  EXPECT_THROW(w.add_tensor("t", GgmlType::F32, {4}, v, 12), Error);   // size mismatch
  EXPECT_THROW(w.add_tensor("t", GgmlType::Q4_0, {16}, v, 9), Error);  // not a block multiple
  EXPECT_THROW(w.add_tensor("t", GgmlType::F32, {1, 1, 1, 1, 4}, v, 16), Error);
  w.add_tensor_f32("t", {4}, v);
  EXPECT_THROW(w.add_tensor_f32("t", {4}, v), Error);  // duplicate name
  EXPECT_THROW(w.add_tensor_f32("u", {4}, v, GgmlType::Q8_0), Error);
}

TEST(AtomicFile, CommitReplacesAndLeavesNoTemp) {
  const std::string dir = qlft_test::temp_dir("atomic");
  const std::string p = dir + "/f.bin";
  write_file_atomic(p, "old");
  {
    AtomicFile f(p);
    f.write("new content");
    f.pad_to(16, '.');
    EXPECT_EQ(f.size(), 16u);
    EXPECT_TRUE(exists(f.temp_path()));
    EXPECT_EQ(f.temp_path(), p + ".tmp." + std::to_string(::getpid()));
    f.commit();
  }
  auto b = qlft_test::read_file(p);
  EXPECT_EQ(std::string(b.begin(), b.end()), "new content.....");
  EXPECT_EQ(temp_files(dir), 0);
}

TEST(AtomicFile, AbandonedWriteKeepsOldFile) {
  const std::string dir = qlft_test::temp_dir("atomic-abandon");
  const std::string p = dir + "/f.bin";
  write_file_atomic(p, "old");
  {
    AtomicFile f(p);
    f.write(std::string(3 << 20, 'x'));  // past the internal buffer: bytes reach the temp file
  }
  auto b = qlft_test::read_file(p);
  EXPECT_EQ(std::string(b.begin(), b.end()), "old");
  EXPECT_EQ(temp_files(dir), 0);
  // A throwing writer (exception mid-way) behaves the same.
  try {
    AtomicFile f(dir + "/g.bin");
    f.write("partial");
    throw std::runtime_error("boom");
  } catch (const std::runtime_error&) {
  }
  EXPECT_FALSE(exists(dir + "/g.bin"));
  EXPECT_EQ(temp_files(dir), 0);
}

TEST(AtomicFile, ErrorsAreIoAndNameThePath) {
  const std::string dir = qlft_test::temp_dir("atomic-err");
  try {
    write_file_atomic(dir + "/no/such/dir/f.bin", "x");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), QLFT_ERR_IO);
    EXPECT_NE(std::string(e.what()).find(dir + "/no/such/dir/f.bin"), std::string::npos);
  }
  // rename over a non-empty directory fails at commit: temp removed, directory untouched.
  std::filesystem::create_directories(dir + "/d/sub");
  try {
    write_file_atomic(dir + "/d", "x");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), QLFT_ERR_IO);
    EXPECT_NE(std::string(e.what()).find(dir + "/d"), std::string::npos);
  }
  EXPECT_EQ(temp_files(dir), 0);
  EXPECT_TRUE(std::filesystem::is_directory(dir + "/d/sub"));
}

TEST(AtomicFile, WriteFailureMidwayRemovesTemp) {
  // A file-size limit makes write() fail with EFBIG part-way through, like a full disk.
  const std::string dir = qlft_test::temp_dir("atomic-efbig");
  const std::string p = dir + "/big.bin";
  struct rlimit old;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto prev = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit lim = old;
  lim.rlim_cur = 1 << 20;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &lim), 0);
  int32_t status = QLFT_OK;
  std::string msg;
  try {
    GgufWriter w;
    std::vector<float> v(1 << 20);  // 4 MiB of tensor data
    w.add_tensor_f32("t", {static_cast<int64_t>(v.size())}, v.data());
    w.write(p);
  } catch (const Error& e) {
    status = e.status();
    msg = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, prev);
  EXPECT_EQ(status, QLFT_ERR_IO);
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_FALSE(exists(p));
  EXPECT_EQ(temp_files(dir), 0);
}
