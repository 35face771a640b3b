// Errors inside the core: qlft::Error is thrown and converted to a status once, at the C ABI.
#pragma once

#include <cstdarg>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "qlft.h"

namespace qlft {

class Error : public std::runtime_error {
 public:
  Error(int32_t status, std::string message)
      : std::runtime_error(std::move(message)), status_(status) {}
  int32_t status() const noexcept { return status_; }

 private:
  int32_t status_;
};

// printf-style formatting into a std::string (g++ 12 has no std::format); core/strf.cpp, on its
// own so that the CUDA plugin, which brings its own throw_error, can link it.
std::string strf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string vstrf(const char* fmt, va_list ap);

[[noreturn]] void throw_error(int32_t status, const char* fmt, ...)
    __attribute__((format(printf, 2, 3)));

// Sets the thread-local detail returned by qlft_last_error().
void set_last_error(const std::string& message);
const char* last_error();

// Runs f and maps every exception to a status; never lets one escape. Used by every ABI entry.
template <class F>
int32_t guard(F&& f) noexcept {
  try {
    f();
    return QLFT_OK;
  } catch (const Error& e) {
    set_last_error(e.what());
    return e.status();
  } catch (const std::bad_alloc&) {
    set_last_error("out of host memory (operator new failed)");
    return QLFT_ERR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    set_last_error(std::string("internal error: ") + e.what());
    return QLFT_ERR_INTERNAL;
  } catch (...) {
    set_last_error("internal error: unknown exception");
    return QLFT_ERR_INTERNAL;
  }
}

#define QLFT_CHECK_ARG(cond, ...)                                             \
  do {                                                                        \
    if (!(cond)) ::qlft::throw_error(QLFT_ERR_INVALID_ARGUMENT, __VA_ARGS__); \
  } while (0)

#define QLFT_CHECK_FORMAT(cond, ...)                                \
  do {                                                              \
    if (!(cond)) ::qlft::throw_error(QLFT_ERR_FORMAT, __VA_ARGS__); \
  } while (0)

}  // namespace qlft
