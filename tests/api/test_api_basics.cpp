// The C ABI basics through libqlft.so: versions, status strings, thread-local errors, NULL
// frees, settings (set/get, buffers, enumeration, rejected values), and the log callback.
#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "qlft.h"
#include "support/format_cases.h"
#include "support/test_support.h"

TEST(ApiBasics, VersionMacrosMatchTheLibrary) {
  EXPECT_EQ(qlft_version_number(), static_cast<uint32_t>(QLFT_VERSION_NUMBER));
  EXPECT_EQ(QLFT_VERSION_NUMBER,
            QLFT_VERSION_MAJOR * 10000 + QLFT_VERSION_MINOR * 100 + QLFT_VERSION_PATCH);
  const std::string v = std::to_string(QLFT_VERSION_MAJOR) + "." +
                        std::to_string(QLFT_VERSION_MINOR) + "." +
                        std::to_string(QLFT_VERSION_PATCH);
  EXPECT_EQ(std::string(qlft_version_string()), v);
  const std::string info = qlft_build_info();
  EXPECT_NE(info.find("cuda="), std::string::npos) << info;
  EXPECT_NE(info.find("mpi="), std::string::npos) << info;
  EXPECT_NE(info.find(v), std::string::npos) << info;
}

TEST(ApiBasics, StatusStringForEveryCode) {
  const std::pair<int32_t, const char*> codes[] = {
      {QLFT_OK, "QLFT_OK"},
      {QLFT_ERR_INVALID_ARGUMENT, "QLFT_ERR_INVALID_ARGUMENT"},
      {QLFT_ERR_IO, "QLFT_ERR_IO"},
      {QLFT_ERR_FORMAT, "QLFT_ERR_FORMAT"},
      {QLFT_ERR_UNSUPPORTED, "QLFT_ERR_UNSUPPORTED"},
      {QLFT_ERR_OUT_OF_MEMORY, "QLFT_ERR_OUT_OF_MEMORY"},
      {QLFT_ERR_NUMERICAL, "QLFT_ERR_NUMERICAL"},
      {QLFT_ERR_CANCELLED, "QLFT_ERR_CANCELLED"},
      {QLFT_ERR_BACKEND, "QLFT_ERR_BACKEND"},
      {QLFT_ERR_DISTRIBUTED, "QLFT_ERR_DISTRIBUTED"},
      {QLFT_ERR_INTERNAL, "QLFT_ERR_INTERNAL"}};
  std::set<std::string> seen;
  for (auto [code, name] : codes) {
    EXPECT_STREQ(qlft_status_string(code), name);
    seen.insert(qlft_status_string(code));
  }
  EXPECT_EQ(seen.size(), 11u);
  EXPECT_STREQ(qlft_status_string(-1), "QLFT_ERR_UNKNOWN");
  EXPECT_STREQ(qlft_status_string(11), "QLFT_ERR_UNKNOWN");
  EXPECT_STREQ(qlft_status_string(INT32_MAX), "QLFT_ERR_UNKNOWN");
}

TEST(ApiBasics, LastErrorIsThreadLocal) {
  qlft_config* cfg = nullptr;
  ASSERT_EQ(qlft_config_create(&cfg), QLFT_OK);
  ASSERT_EQ(qlft_config_set(cfg, "threads", "not-a-number"), QLFT_ERR_INVALID_ARGUMENT);
  const std::string mine = qlft_last_error();
  EXPECT_NE(mine.find("threads"), std::string::npos) << mine;

  std::string other_before, other_after;
  std::thread t([&] {
    other_before = qlft_last_error();  // a fresh thread has no error
    qlft_config* c2 = nullptr;
    qlft_config_create(&c2);
    EXPECT_EQ(qlft_config_set(c2, "no.such.key", "1"), QLFT_ERR_INVALID_ARGUMENT);
    other_after = qlft_last_error();
    qlft_config_free(c2);
  });
  t.join();
  EXPECT_EQ(other_before, "");
  EXPECT_NE(other_after.find("no.such.key"), std::string::npos) << other_after;
  EXPECT_EQ(std::string(qlft_last_error()), mine);  // untouched by the other thread

  // Many threads failing at once each keep their own message.
  std::atomic<int> bad{0};
  std::vector<std::thread> ts;
  for (int i = 0; i < 8; ++i) {
    ts.emplace_back([&, i] {
      qlft_config* c = nullptr;
      qlft_config_create(&c);
      const std::string key = "bogus.key" + std::to_string(i);
      for (int k = 0; k < 200; ++k) {
        qlft_config_set(c, key.c_str(), "1");
        if (std::string(qlft_last_error()).find(key) == std::string::npos) ++bad;
      }
      qlft_config_free(c);
    });
  }
  for (auto& th : ts) th.join();
  EXPECT_EQ(bad.load(), 0);
  qlft_config_free(cfg);
}

TEST(ApiBasics, FreeNullIsANoOp) {
  qlft_config_free(nullptr);
  qlft_runtime_free(nullptr);
  qlft_model_free(nullptr);
  qlft_dataset_free(nullptr);
  qlft_trainer_free(nullptr);
}

TEST(ApiBasics, NullArgumentsAreInvalidArgument) {
  EXPECT_EQ(qlft_config_create(nullptr), QLFT_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qlft_last_error()), "");
  EXPECT_EQ(qlft_config_set(nullptr, "threads", "1"), QLFT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(qlft_runtime_create(nullptr, nullptr), QLFT_ERR_INVALID_ARGUMENT);
  qlft_model* m = reinterpret_cast<qlft_model*>(0x1);
  EXPECT_EQ(qlft_model_load(nullptr, "x.gguf", nullptr, &m), QLFT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(m, nullptr);  // out is cleared on failure
  EXPECT_EQ(qlft_model_info(nullptr, nullptr), QLFT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(qlft_runtime_memory_report(nullptr, nullptr), QLFT_ERR_INVALID_ARGUMENT);
}

TEST(ApiBasics, ConfigSetGetRoundTrip) {
  qlft_config* cfg = nullptr;
  ASSERT_EQ(qlft_config_create(&cfg), QLFT_OK);
  char buf[64];
  size_t needed = 0;
  // Unset keys read as their default.
  ASSERT_EQ(qlft_config_get(cfg, "quant.type", buf, sizeof buf, &needed), QLFT_OK);
  EXPECT_STREQ(buf, "nf4");
  EXPECT_EQ(needed, 4u);
  ASSERT_EQ(qlft_config_set(cfg, "quant.type", "int8"), QLFT_OK);
  ASSERT_EQ(qlft_config_get(cfg, "quant.type", buf, sizeof buf, &needed), QLFT_OK);
  EXPECT_STREQ(buf, "int8");
  ASSERT_EQ(qlft_config_set(cfg, "threads", "3"), QLFT_OK);
  ASSERT_EQ(qlft_config_get(cfg, "threads", buf, sizeof buf, nullptr), QLFT_OK);
  EXPECT_STREQ(buf, "3");
  // A NULL config reads the defaults.
  ASSERT_EQ(qlft_config_get(nullptr, "quant.type", buf, sizeof buf, nullptr), QLFT_OK);
  EXPECT_STREQ(buf, "nf4");

  // Size query, exact fit, and a buffer one byte too small.
  needed = 0;
  ASSERT_EQ(qlft_config_get(cfg, "quant.type", nullptr, 0, &needed), QLFT_OK);
  EXPECT_EQ(needed, 5u);
  char exact[5];
  ASSERT_EQ(qlft_config_get(cfg, "quant.type", exact, sizeof exact, &needed), QLFT_OK);
  EXPECT_STREQ(exact, "int8");
  char small[4] = {'x', 'x', 'x', 'x'};
  EXPECT_EQ(qlft_config_get(cfg, "quant.type", small, sizeof small, &needed),
            QLFT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(needed, 5u);
  EXPECT_NE(std::string(qlft_last_error()).find("quant.type"), std::string::npos);
  EXPECT_EQ(qlft_config_get(cfg, "no.such.key", buf, sizeof buf, nullptr),
            QLFT_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qlft_last_error()).find("no.such.key"), std::string::npos);
  qlft_config_free(cfg);
}

// qlft_config_run_settings: what the CLI decides on, read from the values as written (the key
// table's defaults, the size units, the bool spellings), never from the CLI's own parsing.
TEST(ApiBasics, RunSettingsAreTheSettingsAsParsed) {
  qlft_run_settings rs{};
  rs.struct_size = sizeof rs;
  ASSERT_EQ(qlft_config_run_settings(nullptr, &rs), QLFT_OK);  // the defaults
  EXPECT_EQ(rs.struct_size, sizeof rs);
  EXPECT_EQ(rs.micro_batch_auto, 0);
  EXPECT_EQ(rs.micro_batch, 4u);
  EXPECT_EQ(rs.seq_len, 512u);
  EXPECT_EQ(rs.memory_limit, 0u);
  EXPECT_EQ(rs.distributed, 0);
  EXPECT_EQ(rs.zero3_shard_adapter, 0);
  EXPECT_EQ(rs.save_every, 0);

  qlft_config* cfg = nullptr;
  ASSERT_EQ(qlft_config_create(&cfg), QLFT_OK);
  for (auto [k, v] : {std::pair{"train.micro_batch", "auto"},
                      {"memory.limit", "1.5G"},
                      {"dist.backend", "nccl"},
                      {"dist.zero3_shard_adapter", "yes"},
                      {"train.save_every", "25"},
                      {"data.seq_len", "1024"}})
    ASSERT_EQ(qlft_config_set(cfg, k, v), QLFT_OK) << k;
  ASSERT_EQ(qlft_config_run_settings(cfg, &rs), QLFT_OK);
  EXPECT_EQ(rs.micro_batch_auto, 1);
  EXPECT_EQ(rs.micro_batch, 1u);
  EXPECT_EQ(rs.seq_len, 1024u);
  EXPECT_EQ(rs.memory_limit, 3ull << 29);
  EXPECT_EQ(rs.distributed, 1);
  EXPECT_EQ(rs.zero3_shard_adapter, 1);
  EXPECT_EQ(rs.save_every, 25);
  ASSERT_EQ(qlft_config_set(cfg, "dist.backend", "mpi"), QLFT_OK);
  ASSERT_EQ(qlft_config_set(cfg, "train.micro_batch", "16"), QLFT_OK);
  ASSERT_EQ(qlft_config_run_settings(cfg, &rs), QLFT_OK);
  EXPECT_EQ(rs.distributed, 1);
  EXPECT_EQ(rs.micro_batch_auto, 0);
  EXPECT_EQ(rs.micro_batch, 16u);

  // An older caller's shorter struct: only its bytes are written, and it is told how many.
  unsigned char old[sizeof rs];
  std::memset(old, 0xAB, sizeof old);
  const uint32_t old_size = offsetof(qlft_run_settings, seq_len);
  std::memcpy(old, &old_size, sizeof old_size);
  ASSERT_EQ(qlft_config_run_settings(cfg, reinterpret_cast<qlft_run_settings*>(old)), QLFT_OK);
  qlft_run_settings got;
  std::memcpy(&got, old, sizeof got);
  EXPECT_EQ(got.struct_size, old_size);
  EXPECT_EQ(got.micro_batch, 16u);
  EXPECT_EQ(old[old_size], 0xAB);

  // Settings the typed form refuses are an error naming the key; a NULL out is refused.
  ASSERT_EQ(qlft_config_set(cfg, "data.vars", "novalue"), QLFT_OK);
  EXPECT_EQ(qlft_config_run_settings(cfg, &rs), QLFT_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qlft_last_error()).find("data.vars"), std::string::npos);
  EXPECT_EQ(qlft_config_run_settings(cfg, nullptr), QLFT_ERR_INVALID_ARGUMENT);
  qlft_config_free(cfg);
}

TEST(ApiBasics, InvalidValuesLeaveTheOldValue) {
  qlft_config* cfg = nullptr;
  ASSERT_EQ(qlft_config_create(&cfg), QLFT_OK);
  ASSERT_EQ(qlft_config_set(cfg, "threads", "2"), QLFT_OK);
  ASSERT_EQ(qlft_config_set(cfg, "quant.type", "keep"), QLFT_OK);
  ASSERT_EQ(qlft_config_set(cfg, "memory.limit", "64M"), QLFT_OK);
  const std::pair<const char*, const char*> bad[] = {
      {"threads", "abc"},       {"threads", "-1"},         {"threads", "2.5"},
      {"threads", ""},          {"quant.type", "nf5"},     {"quant.type", "nf4x"},
      {"memory.limit", "lots"}, {"memory.limit", "-3G"},   {"quant.double_quant", "maybe"},
      {"quant.blocksize", "1"}, {"quant.blocksize", "1e9"}};
  for (auto [k, v] : bad) {
    EXPECT_EQ(qlft_config_set(cfg, k, v), QLFT_ERR_INVALID_ARGUMENT) << k << "=" << v;
    EXPECT_NE(std::string(qlft_last_error()).find(k), std::string::npos) << qlft_last_error();
  }
  char buf[64];
  ASSERT_EQ(qlft_config_get(cfg, "threads", buf, sizeof buf, nullptr), QLFT_OK);
  EXPECT_STREQ(buf, "2");
  ASSERT_EQ(qlft_config_get(cfg, "quant.type", buf, sizeof buf, nullptr), QLFT_OK);
  EXPECT_STREQ(buf, "keep");
  ASSERT_EQ(qlft_config_get(cfg, "memory.limit", buf, sizeof buf, nullptr), QLFT_OK);
  EXPECT_STREQ(buf, "64M");
  ASSERT_EQ(qlft_config_get(cfg, "quant.double_quant", buf, sizeof buf, nullptr), QLFT_OK);
  EXPECT_STREQ(buf, "true");  // still the default
  qlft_config_free(cfg);
}

TEST(ApiBasics, KeyEnumeration) {
  const size_t n = qlft_config_key_count();
  ASSERT_GT(n, 5u);
  std::set<std::string> names;
  qlft_config* cfg = nullptr;
  ASSERT_EQ(qlft_config_create(&cfg), QLFT_OK);
  for (size_t i = 0; i < n; ++i) {
    qlft_config_key k{};
    k.struct_size = sizeof k;
    ASSERT_EQ(qlft_config_key_at(i, &k), QLFT_OK);
    EXPECT_EQ(k.struct_size, sizeof k);
    ASSERT_NE(k.name, nullptr);
    EXPECT_TRUE(names.insert(k.name).second) << "duplicate key " << k.name;
    ASSERT_NE(k.type, nullptr);
    ASSERT_NE(k.default_value, nullptr);
    ASSERT_NE(k.allowed, nullptr);
    ASSERT_NE(k.doc, nullptr);
    EXPECT_GT(std::strlen(k.doc), 0u) << k.name;
    // Each default is itself a valid value, and reads back as set.
    EXPECT_EQ(qlft_config_set(cfg, k.name, k.default_value), QLFT_OK)
        << k.name << "=" << k.default_value << ": " << qlft_last_error();
    size_t need = 0;
    ASSERT_EQ(qlft_config_get(cfg, k.name, nullptr, 0, &need), QLFT_OK);
    std::vector<char> b(need);
    ASSERT_EQ(qlft_config_get(cfg, k.name, b.data(), b.size(), nullptr), QLFT_OK);
    EXPECT_STREQ(b.data(), k.default_value) << k.name;
  }
  for (const char* must : {"backend", "threads", "memory.limit", "quant.type"})
    EXPECT_TRUE(names.count(must)) << must;
  qlft_config_key k{};
  k.struct_size = sizeof k;
  EXPECT_EQ(qlft_config_key_at(n, &k), QLFT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(qlft_config_key_at(0, nullptr), QLFT_ERR_INVALID_ARGUMENT);
  // An older caller with a shorter struct gets only the fields it knows.
  struct {
    qlft_config_key k;
    char guard[8];
  } old;
  std::memset(&old, 0x5a, sizeof old);
  old.k.struct_size = offsetof(qlft_config_key, type);  // knows only `name`
  ASSERT_EQ(qlft_config_key_at(0, &old.k), QLFT_OK);
  EXPECT_EQ(old.k.struct_size, offsetof(qlft_config_key, type));
  EXPECT_NE(old.k.name, nullptr);
  const unsigned char* tail = reinterpret_cast<const unsigned char*>(&old.k.type);
  for (size_t i = 0; i < sizeof(qlft_config_key) - offsetof(qlft_config_key, type); ++i)
    EXPECT_EQ(tail[i], 0x5a) << "byte " << i << " past struct_size was written";
  qlft_config_free(cfg);
}

namespace {
struct LogSink {
  std::mutex mu;
  std::vector<std::pair<int32_t, std::string>> messages;
};
void sink(int32_t level, const char* message, void* user) {
  auto* s = static_cast<LogSink*>(user);
  std::lock_guard<std::mutex> lock(s->mu);
  s->messages.emplace_back(level, message);
}
}  // namespace

TEST(ApiBasics, LogCallbackReceivesMessages) {
  // Loading a model logs at info level.
  const std::string dir = qlft_test::temp_dir("api-log");
  const auto bytes = qlft_test::tiny_llama_gguf().build();
  const std::string path = dir + "/tiny.gguf";
  qlft_test::write_file(path, bytes.data(), bytes.size());
  qlft_runtime* rt = nullptr;
  ASSERT_EQ(qlft_runtime_create(nullptr, &rt), QLFT_OK);
  qlft_config* cfg = nullptr;
  ASSERT_EQ(qlft_config_create(&cfg), QLFT_OK);
  ASSERT_EQ(qlft_config_set(cfg, "quant.type", "keep"), QLFT_OK);

  LogSink s;
  qlft_set_log_callback(sink, &s, QLFT_LOG_INFO);
  qlft_model* m = nullptr;
  ASSERT_EQ(qlft_model_load(rt, path.c_str(), cfg, &m), QLFT_OK) << qlft_last_error();
  qlft_model_free(m);
  {
    std::lock_guard<std::mutex> lock(s.mu);
    bool found = false;
    for (auto& [lvl, msg] : s.messages) {
      EXPECT_LE(lvl, QLFT_LOG_INFO);
      if (lvl == QLFT_LOG_INFO && msg.find(path) != std::string::npos) found = true;
    }
    EXPECT_TRUE(found) << "no info message naming the loaded model";
    s.messages.clear();
  }
  // Above max_level nothing arrives.
  qlft_set_log_callback(sink, &s, QLFT_LOG_WARN);
  ASSERT_EQ(qlft_model_load(rt, path.c_str(), cfg, &m), QLFT_OK);
  qlft_model_free(m);
  {
    std::lock_guard<std::mutex> lock(s.mu);
    for (auto& [lvl, msg] : s.messages) EXPECT_LE(lvl, QLFT_LOG_WARN) << msg;
  }
  // NULL restores the default; the sink gets nothing more.
  qlft_set_log_callback(nullptr, nullptr, QLFT_LOG_DEBUG);
  size_t before = s.messages.size();
  ASSERT_EQ(qlft_model_load(rt, path.c_str(), cfg, &m), QLFT_OK);
  qlft_model_free(m);
  EXPECT_EQ(s.messages.size(), before);
  qlft_config_free(cfg);
  qlft_runtime_free(rt);
}
