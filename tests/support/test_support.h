// Helpers shared by the test suites: where the shared data lives, temp dirs, tolerances.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace qlft_test {

// $QLFT_SHARED_DIR or ../shared beside the source tree.
std::string shared_dir();
// Path of a file under shared/; if it is missing the test is skipped (or fails when
// QLFT_REQUIRE_SHARED=1, as in CI). Use as: auto p = shared_file("models/x.gguf"); if (p.empty())
// return;
std::string shared_file(const std::string& rel);
// tests/reference/fixtures/<rel> in the source tree (committed fixtures; must exist).
std::string fixture_path(const std::string& rel);
// A fresh empty directory under the system temp dir (left for inspection after a failure).
std::string temp_dir(const std::string& tag);
std::vector<uint8_t> read_file(const std::string& path);
void write_file(const std::string& path, const void* data, size_t n);
// The file's bytes as a string (read_file for files compared as text).
std::string read_text(const std::string& path);

// A file that grows by appended writes (each append is visible to readers at once). Used to
// test every prefix of a file without truncating it each time.
class AppendFile {
 public:
  explicit AppendFile(const std::string& path);  // creates or empties path
  ~AppendFile();
  AppendFile(const AppendFile&) = delete;
  AppendFile& operator=(const AppendFile&) = delete;
  void append(const void* data, size_t n);
  // Overwrites the first n bytes in place (no truncation; for same-size rewrites).
  void overwrite(const void* data, size_t n);

 private:
  int fd_ = -1;
};

// Sets (or, for nullptr, unsets) an environment variable for one scope; the old value (or its
// absence) comes back at the end of the scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value);
  ~ScopedEnv();
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

// max |a-b| / max(max|b|, floor): normalized error used by the parity tests.
double max_rel_error(const float* a, const float* b, size_t n, double floor = 1e-6);

}  // namespace qlft_test

namespace qlft_test {
// True when `category` is listed in tests/support/expected_skips.txt, the one list of reasons a
// test may skip under CI=true.
bool skip_expected(const std::string& category);
// True when a skip for `category` must fail instead: strict mode (CI=true, QLFT_REQUIRE_SHARED=1
// or QLFT_STRICT_SKIPS=1) and the category is not in the list; QLFT_REQUIRE_GPU=1 also makes
// "no-gpu" fail.
bool skip_fails(const std::string& category);
}  // namespace qlft_test

// The only way a test skips (tests/support/skip_guard.sh rejects a raw GTEST_SKIP): skips for a
// listed category, fails in strict mode for any other. Use as: QLFT_SKIP("isa-absent") << why;
#define QLFT_SKIP(category)                                                              \
  switch (0)                                                                             \
  case 0:                                                                                \
  default:                                                                               \
    if (::qlft_test::skip_fails(category))                                               \
      GTEST_FAIL() << "skip for '" << (category)                                         \
                   << "' is not allowed here (not in tests/support/expected_skips.txt, " \
                      "strict mode): ";                                                  \
    else                                                                                 \
      GTEST_SKIP() << "[skip: " << (category) << "] "

// Skips (or fails in strict mode, as in CI) when a shared file is absent.
#define QLFT_NEED_SHARED(var, rel)                 \
  std::string var = ::qlft_test::shared_file(rel); \
  if (var.empty())                                 \
  QLFT_SKIP("shared-missing") << "shared file " << rel << " not found (set QLFT_SHARED_DIR)"
