// Process-wide logging through the callback set by qlft_set_log_callback.
#pragma once

#include <cstdint>
#include <string>

#include "qlft.h"

namespace qlft {

void log_message(int32_t level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
bool log_enabled(int32_t level);
void set_log_callback(qlft_log_fn fn, void* user, int32_t max_level);
// Changes only the most verbose level passed on (the log.level setting, applied by
// qlft_runtime_create when a config sets it).
void set_log_level(int32_t max_level);
// QLFT_LOG_* of a log.level value ("error", "warn", "info", "debug"); -1 if none of them.
int32_t log_level_from_name(const std::string& name);

}  // namespace qlft

#define QLFT_LOG_E(...) ::qlft::log_message(QLFT_LOG_ERROR, __VA_ARGS__)
#define QLFT_LOG_W(...) ::qlft::log_message(QLFT_LOG_WARN, __VA_ARGS__)
#define QLFT_LOG_I(...) ::qlft::log_message(QLFT_LOG_INFO, __VA_ARGS__)
#define QLFT_LOG_D(...) ::qlft::log_message(QLFT_LOG_DEBUG, __VA_ARGS__)
