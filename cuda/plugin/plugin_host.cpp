// The plugin's side of two core facilities, in place of core/error.cpp and core/log.cpp: every
// error raised in libqlft-cuda.so is thrown by libqlft (CudaPluginHost::raise), so one
// qlft::Error type exists in the process whatever the two DSOs' hidden typeinfo, and log lines
// go to libqlft's logger (qlft_set_log_callback, log.level). The linker takes these definitions
// before the static core's; a core object needing the rest of error.cpp or log.cpp would pull
// those files in and fail the link with duplicate symbols, not split the state silently.
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "plugin_host.h"
#include "core/error.h"
#include "core/log.h"

namespace qlft {

namespace {
const CudaPluginHost* g_host = nullptr;

std::string vformat(const char* fmt, va_list ap) {
  va_list ap2;
  va_copy(ap2, ap);
  char small[512];
  const int n = std::vsnprintf(small, sizeof small, fmt, ap);
  std::string s;
  if (n < 0) {
    s = fmt;
  } else if (size_t(n) < sizeof small) {
    s.assign(small, size_t(n));
  } else {
    s.resize(size_t(n));
    std::vsnprintf(s.data(), size_t(n) + 1, fmt, ap2);
  }
  va_end(ap2);
  return s;
}
}  // namespace

void set_plugin_host(const CudaPluginHost* host) {
  g_host = host;
}

std::string strf(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string s = vformat(fmt, ap);
  va_end(ap);
  return s;
}

void throw_error(int32_t status, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string s = vformat(fmt, ap);
  va_end(ap);
  g_host->raise(status, s.c_str());
  std::abort();  // raise throws
}

bool log_enabled(int32_t level) {
  return g_host->log_enabled(level);
}

void log_message(int32_t level, const char* fmt, ...) {
  if (!log_enabled(level)) return;
  va_list ap;
  va_start(ap, fmt);
  std::string s = vformat(fmt, ap);
  va_end(ap);
  g_host->log(level, s.c_str());
}

}  // namespace qlft
