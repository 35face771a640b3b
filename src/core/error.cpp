#include "core/error.h"

#include <cstdarg>
#include <cstdio>

namespace qlft {

namespace {
thread_local std::string t_last_error;

std::string vstrf(const char* fmt, va_list ap) {
  va_list ap2;
  va_copy(ap2, ap);
  int n = std::vsnprintf(nullptr, 0, fmt, ap2);
  va_end(ap2);
  if (n <= 0) return std::string();
  std::string s(static_cast<size_t>(n), '\0');
  std::vsnprintf(s.data(), s.size() + 1, fmt, ap);
  return s;
}
}  // namespace

std::string strf(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string s = vstrf(fmt, ap);
  va_end(ap);
  return s;
}

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
