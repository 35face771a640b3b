// The plugin's side of two core facilities, in place of core/error.cpp and core/log.cpp (strf and
// vstrf come from core/strf.cpp, which the plugin shares with the core): every
// error raised in libqlft-cuda.so is thrown by libqlft (CudaPluginHost::raise), so one
// qlft::Error type exists in the process whatever the two DSOs' hidden typeinfo, and log lines
// go to libqlft's logger (qlft_set_log_callback, log.level). The linker takes these definitions
// before the static core's; a core object needing anything else of error.cpp or log.cpp would
// pull those files in and fail the link with duplicate symbols, not split the state silently.
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
}  // namespace

void set_plugin_host(const CudaPluginHost* host) {
  g_host = host;
}

void throw_error(int32_t status, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string s = vstrf(fmt, ap);
  va_end(ap);
  g_host->raise(status, s.c_str());
  std::abort();  // raise throws
}

// The rest of core/error.cpp, so that no object the plugin pulls from the static core needs that
// file: the linker takes an archive member for any symbol it defines (Error's typeinfo included,
// which core objects emit), and error.cpp's throw_error beside these would then be defined
// twice. A status the plugin's own code returns carries its message in its Error; the plugin
// never answers a C ABI call, so its last-error text is never read.
namespace {
thread_local std::string t_last_error;
}  // namespace

void set_last_error(const std::string& message) {
  try {
    t_last_error = message;
  } catch (...) {
  }
}

const char* last_error() {
  return t_last_error.c_str();
}

bool log_enabled(int32_t level) {
  return g_host->log_enabled(level);
}

void log_message(int32_t level, const char* fmt, ...) {
  if (!log_enabled(level)) return;
  va_list ap;
  va_start(ap, fmt);
  std::string s = vstrf(fmt, ap);
  va_end(ap);
  g_host->log(level, s.c_str());
}

}  // namespace qlft
