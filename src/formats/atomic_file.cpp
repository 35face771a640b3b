#include "formats/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/path.h"
#include "formats/temp_marker.h"

namespace qlft {

namespace {
constexpr size_t kBufferBytes = size_t(1) << 20;

// The injected fault (set_io_fault_for_testing); -1: no budget.
std::atomic<int64_t> g_write_budget{-1};
std::atomic<bool> g_fail_fsync{false};
std::atomic<int> g_fault_errno{ENOSPC};

// ::write with the injected budget applied: short write at the budget, then `err`.
ssize_t write_with_faults(int fd, const char* p, size_t n) {
  int64_t budget = g_write_budget.load(std::memory_order_relaxed);
  if (budget < 0) return ::write(fd, p, n);
  if (budget == 0) {
    errno = g_fault_errno.load();
    return -1;
  }
  size_t allowed = std::min<size_t>(n, static_cast<size_t>(budget));
  ssize_t w = ::write(fd, p, allowed);
  if (w > 0) g_write_budget.fetch_sub(w);
  return w;
}

int fsync_with_faults(int fd) {
  if (g_fail_fsync.load(std::memory_order_relaxed)) {
    errno = g_fault_errno.load();
    return -1;
  }
  return ::fsync(fd);
}

}  // namespace

AtomicFile::AtomicFile(const std::string& path) : path_(path), tmp_(temp::temp_path(path)) {
  if (path.empty()) throw_error(QLFT_ERR_IO, "cannot write a file with an empty path");
  // A killed writer's temporary of this same file (marked, its process gone) is removed first;
  // anything else with a temporary's name is left alone.
  const size_t slash = path_.rfind('/');
  temp::remove_stale(dirname_of(path_),
                     slash == std::string::npos ? path_ : path_.substr(slash + 1), false);
  // Exclusive and without following links: nothing already at the temporary name (a planted
  // symlink, a user's file) is opened or truncated.
  fd_ = UniqueFd(::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
  if (!fd_) {
    const int e = errno;
    if (e == EEXIST)
      throw_error(QLFT_ERR_IO,
                  "%s: cannot create %s: something is already there that is not a leftover of a "
                  "finished qlft process (a live writer, or not made by qlft): remove it or "
                  "write elsewhere",
                  path_.c_str(), tmp_.c_str());
    throw_error(QLFT_ERR_IO, "%s: cannot create %s: %s", path_.c_str(), tmp_.c_str(),
                std::strerror(e));
  }
  temp::mark(fd_.get(), tmp_);
  // The file it replaces keeps its permissions (a 0600 checkpoint stays 0600).
  struct stat st;
  if (::stat(path_.c_str(), &st) == 0 && S_ISREG(st.st_mode))
    ::fchmod(fd_.get(), st.st_mode & 07777);
  crash_point();
}

AtomicFile::~AtomicFile() {
  if (committed_) return;
  fd_.reset();
  ::unlink(tmp_.c_str());
}

void AtomicFile::fail(const char* what, int err) {
  fd_.reset();
  ::unlink(tmp_.c_str());
  throw_error(QLFT_ERR_IO, "%s: %s failed: %s", path_.c_str(), what, std::strerror(err));
}

void AtomicFile::write_all(const char* p, size_t left) {
  while (left > 0) {
    crash_point();
    ssize_t n = write_with_faults(fd_.get(), p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("write", errno);
    }
    if (n == 0) fail("write", EIO);
    p += n;
    left -= static_cast<size_t>(n);
  }
}

void AtomicFile::flush_buffer() {
  write_all(buf_.data(), buf_.size());
  buf_.clear();
}

void AtomicFile::write(const void* data, size_t n) {
  if (committed_ || !fd_)
    throw_error(QLFT_ERR_INTERNAL, "%s: write after commit or failure", path_.c_str());
  if (n == 0) return;
  if (buf_.size() + n > kBufferBytes) flush_buffer();
  if (n >= kBufferBytes)
    write_all(static_cast<const char*>(data), n);  // large blocks (tensor data) go straight out
  else
    buf_.append(static_cast<const char*>(data), n);
  size_ += n;
}

void AtomicFile::pad_to(uint64_t alignment, uint8_t byte) {
  if (alignment <= 1) return;
  uint64_t pad = (alignment - size_ % alignment) % alignment;
  if (pad == 0) return;
  std::string zeros(static_cast<size_t>(pad), static_cast<char>(byte));
  write(zeros.data(), zeros.size());
}

void AtomicFile::commit() {
  if (committed_) return;
  if (!fd_) throw_error(QLFT_ERR_INTERNAL, "%s: commit after failure", path_.c_str());
  flush_buffer();
  crash_point();
  if (fsync_with_faults(fd_.get()) != 0) fail("fsync", errno);
  crash_point();
  if (fd_.close() != 0) {
    int e = errno;
    ::unlink(tmp_.c_str());
    throw_error(QLFT_ERR_IO, "%s: close failed: %s", path_.c_str(), std::strerror(e));
  }
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp_.c_str());
    throw_error(QLFT_ERR_IO, "%s: rename from %s failed: %s", path_.c_str(), tmp_.c_str(),
                std::strerror(e));
  }
  committed_ = true;
  temp::unmark_path(path_);  // the marker named the temporary; the file is the real one now
  crash_point();
  // Make the rename itself durable. Failure here cannot undo the rename; the file is complete.
  const UniqueFd dir(::open(dirname_of(path_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir) ::fsync(dir.get());
}

void write_file_atomic(const std::string& path, std::string_view content) {
  AtomicFile f(path);
  f.write(content);
  f.commit();
}

void crash_point() {
  static const long at = [] {
    const char* v = std::getenv("QLFT_TEST_CRASH_AT");
    return v ? std::atol(v) : 0L;
  }();
  if (at <= 0) return;
  static std::atomic<long> n{0};
  if (++n == at) ::kill(::getpid(), SIGKILL);
}

void set_io_fault_for_testing(const IoFault& f) {
  g_fault_errno.store(f.err);
  g_fail_fsync.store(f.fail_fsync);
  g_write_budget.store(f.write_budget);
}

}  // namespace qlft
