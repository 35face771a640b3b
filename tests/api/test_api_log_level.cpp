// The log.level setting: a config that sets it changes the process-wide level when a runtime is
// created with it (the model load's info message arrives or not); a config without it leaves
// the level that qlft_set_log_callback chose.
#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <vector>

#include "qlft.h"
#include "support/format_cases.h"
#include "support/test_support.h"

namespace {

struct LogSink {
  std::mutex mu;
  std::vector<std::pair<int32_t, std::string>> messages;
  size_t count_at(int32_t level) {
    std::lock_guard<std::mutex> lock(mu);
    size_t n = 0;
    for (auto& m : messages) n += m.first == level;
    messages.clear();
    return n;
  }
};

void sink(int32_t level, const char* message, void* user) {
  auto* s = static_cast<LogSink*>(user);
  std::lock_guard<std::mutex> lock(s->mu);
  s->messages.emplace_back(level, message);
}

// Creates a runtime with log.level = level ("" = unset) and loads the model: the info
// messages the sink received.
size_t infos_with(const std::string& path, const char* level, LogSink& s) {
  qlft_config* cfg = nullptr;
  EXPECT_EQ(qlft_config_create(&cfg), QLFT_OK);
  EXPECT_EQ(qlft_config_set(cfg, "quant.type", "keep"), QLFT_OK);
  if (*level) {
    EXPECT_EQ(qlft_config_set(cfg, "log.level", level), QLFT_OK);
  }
  qlft_runtime* rt = nullptr;
  EXPECT_EQ(qlft_runtime_create(cfg, &rt), QLFT_OK) << qlft_last_error();
  s.count_at(QLFT_LOG_INFO);
  qlft_model* m = nullptr;
  EXPECT_EQ(qlft_model_load(rt, path.c_str(), cfg, &m), QLFT_OK) << qlft_last_error();
  qlft_model_free(m);
  qlft_runtime_free(rt);
  qlft_config_free(cfg);
  return s.count_at(QLFT_LOG_INFO);
}

TEST(ApiLogLevel, ConfigLevelAppliesWhenSet) {
  const std::string dir = qlft_test::temp_dir("api-log-level");
  const auto bytes = qlft_test::tiny_llama_gguf().build();
  const std::string path = dir + "/tiny.gguf";
  qlft_test::write_file(path, bytes.data(), bytes.size());
  LogSink s;
  qlft_set_log_callback(sink, &s, QLFT_LOG_WARN);
  EXPECT_EQ(infos_with(path, "", s), 0u);      // the callback's warn level stands
  EXPECT_GE(infos_with(path, "info", s), 1u);  // log.level=info lets the load's message through
  EXPECT_GE(infos_with(path, "", s), 1u);      // ...and stays (process-wide) until changed
  EXPECT_EQ(infos_with(path, "error", s), 0u);
  qlft_set_log_callback(sink, &s, QLFT_LOG_DEBUG);  // the last setter wins
  EXPECT_GE(infos_with(path, "", s), 1u);
  qlft_set_log_callback(nullptr, nullptr, QLFT_LOG_WARN);
}

}  // namespace
