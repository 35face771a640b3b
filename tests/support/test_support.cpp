#include "support/test_support.h"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace qlft_test {

std::string shared_dir() {
  const char* e = std::getenv("QLFT_SHARED_DIR");
  return e && *e ? e : QLFT_SHARED_DIR_DEFAULT;
}

std::string shared_file(const std::string& rel) {
  std::string p = shared_dir() + "/" + rel;
  struct stat st;
  if (::stat(p.c_str(), &st) == 0) return p;
  const char* req = std::getenv("QLFT_REQUIRE_SHARED");
  if (req && std::string(req) == "1") ADD_FAILURE() << "required shared file missing: " << p;
  return "";
}

namespace {
bool env_is(const char* name, const char* value) {
  const char* e = std::getenv(name);
  return e && std::string(e) == value;
}
}  // namespace

bool skip_expected(const std::string& category) {
  static const std::vector<std::string> listed = [] {
    std::vector<std::string> v;
    // QLFT_SOURCE_DIR: where the binaries run from another checkout (scripts/gpu_check.sh).
    const char* src = std::getenv("QLFT_SOURCE_DIR");
    const std::string path =
        std::string(src && *src ? src : QLFT_SOURCE_DIR) + "/tests/support/expected_skips.txt";
    std::ifstream f(path);
    if (!f) ADD_FAILURE() << "cannot read the expected-skip list " << path;
    std::string line;
    while (std::getline(f, line)) {
      if (line.empty() || line[0] == '#') continue;
      v.push_back(line.substr(0, line.find_first_of(" \t")));
    }
    return v;
  }();
  return std::find(listed.begin(), listed.end(), category) != listed.end();
}

bool skip_fails(const std::string& category) {
  if (category == "no-gpu" && env_is("QLFT_REQUIRE_GPU", "1")) return true;
  const bool strict = env_is("CI", "true") || env_is("QLFT_REQUIRE_SHARED", "1") ||
                      env_is("QLFT_STRICT_SKIPS", "1");
  return strict && !skip_expected(category);
}

std::string fixture_path(const std::string& rel) {
  return std::string(QLFT_SOURCE_DIR) + "/tests/reference/fixtures/" + rel;
}

std::string temp_dir(const std::string& tag) {
  namespace fs = std::filesystem;
  static int counter = 0;
  fs::path p = fs::temp_directory_path() / ("qlft-test-" + std::to_string(::getpid()) + "-" + tag +
                                            "-" + std::to_string(counter++));
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    ADD_FAILURE() << "cannot read " << path;
    return {};
  }
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)),
                              std::istreambuf_iterator<char>());
}

std::string read_text(const std::string& path) {
  const std::vector<uint8_t> b = read_file(path);
  return std::string(b.begin(), b.end());
}

void write_file(const std::string& path, const void* data, size_t n) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
  if (!f) ADD_FAILURE() << "cannot write " << path;
}

AppendFile::AppendFile(const std::string& path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) ADD_FAILURE() << "cannot create " << path;
}

AppendFile::~AppendFile() {
  if (fd_ >= 0) ::close(fd_);
}

void AppendFile::append(const void* data, size_t n) {
  if (fd_ < 0 || ::write(fd_, data, n) != static_cast<ssize_t>(n)) ADD_FAILURE() << "append failed";
}

void AppendFile::overwrite(const void* data, size_t n) {
  if (fd_ < 0 || ::pwrite(fd_, data, n, 0) != static_cast<ssize_t>(n))
    ADD_FAILURE() << "overwrite failed";
}

double max_rel_error(const float* a, const float* b, size_t n, double floor) {
  double mx = floor, err = 0;
  for (size_t i = 0; i < n; ++i) mx = std::max(mx, static_cast<double>(std::fabs(b[i])));
  for (size_t i = 0; i < n; ++i) {
    double d = std::fabs(static_cast<double>(a[i]) - b[i]);
    if (std::isnan(a[i]) != std::isnan(b[i])) return INFINITY;
    err = std::max(err, d);
  }
  return err / mx;
}

ScopedEnv::ScopedEnv(const char* name, const char* value) : name_(name) {
  const char* old = std::getenv(name);
  had_ = old != nullptr;
  if (had_) old_ = old;
  if (value)
    ::setenv(name, value, 1);
  else
    ::unsetenv(name);
}

ScopedEnv::~ScopedEnv() {
  if (had_)
    ::setenv(name_, old_.c_str(), 1);
  else
    ::unsetenv(name_);
}

}  // namespace qlft_test
