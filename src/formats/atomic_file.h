// Crash-safe file writing: bytes go to `<path>.tmp.<pid>`, which is fsync'ed and renamed over
// `path` only by commit(). A failure at any point removes the temporary file and throws
// QLFT_ERR_IO naming the path, so `path` is either its old content or the complete new one,
// never a half-written file. The temporary is created exclusively (never through a symlink),
// carries qlft's marker (formats/temp_marker.h), so a later write of the same path removes a
// killed writer's leftover and nothing else, and takes the permissions of the file it replaces.
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "formats/unique_fd.h"

namespace qlft {

class AtomicFile {
 public:
  // Creates the temporary file beside path (same directory, so rename is atomic).
  explicit AtomicFile(const std::string& path);
  // Without commit() the temporary file is removed and path is left untouched.
  ~AtomicFile();

  void write(const void* data, size_t n);
  void write(std::string_view s) { write(s.data(), s.size()); }
  // Writes `byte` until size() is a multiple of alignment.
  void pad_to(uint64_t alignment, uint8_t byte = 0);
  // Bytes written so far.
  uint64_t size() const { return size_; }

  // Flushes, fsyncs, renames over path and fsyncs the directory. Throws QLFT_ERR_IO (and removes
  // the temporary file) on failure.
  void commit();

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return tmp_; }

 private:
  void fail(const char* what, int err);  // cleans up, then throws
  void flush_buffer();
  void write_all(const char* p, size_t n);

  std::string path_, tmp_;
  UniqueFd fd_;  // the temporary, open until commit() or a failure
  uint64_t size_ = 0;
  std::string buf_;  // small writes are batched
  bool committed_ = false;
};

// Writes a whole file atomically.
void write_file_atomic(const std::string& path, std::string_view content);

// Test-only fault injection for every AtomicFile in the process (disk full and friends).
// write_budget >= 0: that many more bytes reach the disk, the write that crosses the budget is
// cut short there (a short write, as the kernel does when a disk fills), and every later write
// fails with `err`. fail_fsync: commit()'s fsync fails with `err` (a delayed write error).
// Reset with IoFault{}.
struct IoFault {
  int64_t write_budget = -1;
  bool fail_fsync = false;
  int err = ENOSPC;
};
void set_io_fault_for_testing(const IoFault& f);

// Test-only crash injection for the end-to-end tests: with QLFT_TEST_CRASH_AT=N in the
// environment, the N-th crash point the process reaches (every create, write, fsync and rename
// of an AtomicFile, and each rename of a PEFT adapter directory) SIGKILLs the process there.
// A no-op without the variable.
void crash_point();

}  // namespace qlft
