#include "core/error.h"

#include <cstdarg>
#include <cstdio>

namespace qlft {

namespace {
thread_local std::string t_last_error;
}  // namespace

void throw_error(int32_t status, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string s = vstrf(fmt, ap);
  va_end(ap);
  throw Error(status, std::move(s));
}

void set_last_error(const std::string& message) {
  // Assigning can itself throw bad_alloc; the caller is noexcept, so swallow and keep the old text.
  try {
    t_last_error = message;
  } catch (...) {
  }
}

const char* last_error() {
  return t_last_error.c_str();
}

}  // namespace qlft
