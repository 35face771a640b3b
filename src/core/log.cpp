#include "core/log.h"

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <mutex>

namespace qlft {

namespace {
void default_log(int32_t level, const char* message, void*) {
  static const char* names[] = {"error", "warn", "info", "debug"};
  const char* name = (level >= 0 && level <= 3) ? names[level] : "log";
  std::fprintf(stderr, "qlft %s: %s\n", name, message);
}

std::mutex g_mutex;  // guards the callback pair so fn and user always match
qlft_log_fn g_fn = default_log;
void* g_user = nullptr;
std::atomic<int32_t> g_max_level{QLFT_LOG_WARN};
}  // namespace

bool log_enabled(int32_t level) {
  return level <= g_max_level.load(std::memory_order_relaxed);
}

void set_log_callback(qlft_log_fn fn, void* user, int32_t max_level) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_fn = fn ? fn : default_log;
  g_user = fn ? user : nullptr;
  g_max_level.store(fn ? max_level : QLFT_LOG_WARN);
}

void set_log_level(int32_t max_level) {
  g_max_level.store(max_level);
}

int32_t log_level_from_name(const std::string& name) {
  static const char* names[] = {"error", "warn", "info", "debug"};
  for (int32_t i = 0; i < 4; ++i)
    if (name == names[i]) return i;
  return -1;
}

void log_message(int32_t level, const char* fmt, ...) {
  if (!log_enabled(level)) return;
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  std::lock_guard<std::mutex> lock(g_mutex);
  g_fn(level, buf, g_user);
}

}  // namespace qlft
