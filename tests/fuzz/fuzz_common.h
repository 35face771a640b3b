// Shared scaffolding of the libFuzzer targets. Every reader under test opens paths, so inputs are
// written to files in a per-process tmpfs directory (/dev/shm when present). A qlft::Error is the
// expected answer to a bad input; any other exception is a bug and aborts, so libFuzzer records
// the input (sanitizer reports abort on their own).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace qlft_fuzz {

// A scratch directory owned by this process (created once, files overwritten per input).
inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    const char* base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    std::string d = std::string(base) + "/qlft-fuzz-" + std::to_string(getpid());
    std::string cmd = "mkdir -p '" + d + "'";
    if (std::system(cmd.c_str()) != 0) std::abort();
    return d;
  }();
  return dir;
}

inline std::string write_scratch(const std::string& name, std::string_view bytes) {
  std::string path = scratch_dir() + "/" + name;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) std::abort();
  std::fclose(f);
  return path;
}

inline void remove_scratch(const std::string& name) {
  std::remove((scratch_dir() + "/" + name).c_str());
}

// Splits a multi-file input at the separator line "\n--qlft-file--\n" (up to n parts; missing
// parts are empty). Seeds for multi-file targets are built the same way (make_seeds.sh).
inline std::vector<std::string_view> split_parts(const uint8_t* data, size_t size, size_t n) {
  static constexpr std::string_view kSep = "\n--qlft-file--\n";
  std::string_view all(reinterpret_cast<const char*>(data), size);
  std::vector<std::string_view> parts;
  while (parts.size() + 1 < n) {
    size_t at = all.find(kSep);
    if (at == std::string_view::npos) break;
    parts.push_back(all.substr(0, at));
    all.remove_prefix(at + kSep.size());
  }
  parts.push_back(all);
  parts.resize(n);
  return parts;
}

// Runs f; qlft::Error is fine, anything else aborts with its message.
template <class F>
void expect_only_qlft_errors(F&& f) {
  try {
    f();
  } catch (const qlft::Error&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz: unexpected exception (not qlft::Error): %s\n", e.what());
    std::abort();
  } catch (...) {
    std::fprintf(stderr, "fuzz: unexpected non-std exception\n");
    std::abort();
  }
}

// Keeps a value alive so reads made only for ASan's sake are not optimized away.
inline void keep(uint64_t v) {
  [[maybe_unused]] static volatile uint64_t sink;
  sink = v;
}

// Where the real model and vocabulary files are (QLFT_SHARED_DIR overrides the build default).
inline std::string shared_file(const std::string& rel) {
  const char* env = std::getenv("QLFT_SHARED_DIR");
  std::string p = std::string(env ? env : QLFT_SHARED_DIR_DEFAULT) + "/" + rel;
  if (access(p.c_str(), R_OK) != 0) {
    std::fprintf(stderr, "fuzz: missing %s (set QLFT_SHARED_DIR)\n", p.c_str());
    std::abort();
  }
  return p;
}

}  // namespace qlft_fuzz
