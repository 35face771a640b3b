#include "run_dir.h"

#include "../../src/formats/temp_marker.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace cli {

namespace {

std::string sys_error(const std::string& what, int err) {
  return what + ": " + std::strerror(err);
}

bool exists(const std::string& p) {
  struct stat st;
  return ::lstat(p.c_str(), &st) == 0;
}

std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") out.push_back(n);
  }
  ::closedir(d);
  return out;
}

bool write_all(int fd, const char* p, size_t n, int* err) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      *err = errno;
      return false;
    }
    if (w == 0) {
      *err = EIO;
      return false;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

}  // namespace

bool make_dirs(const std::string& dir, std::string* error) {
  std::string cur;
  size_t pos = 0;
  while (pos <= dir.size()) {
    size_t slash = dir.find('/', pos);
    if (slash == std::string::npos) slash = dir.size();
    cur = dir.substr(0, slash);
    pos = slash + 1;
    if (cur.empty() || cur == "." || cur == "..") continue;
    if (::mkdir(cur.c_str(), 0755) == 0) continue;
    int e = errno;
    struct stat st;
    if (::stat(cur.c_str(), &st) == 0) {
      if (S_ISDIR(st.st_mode)) continue;
      *error = cur + ": exists and is not a directory";
      return false;
    }
    *error = sys_error("cannot create directory " + cur, e);
    return false;
  }
  return true;
}

bool file_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa, sb;
  if (::stat(a.c_str(), &sa) != 0 || ::stat(b.c_str(), &sb) != 0) return false;
  return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

bool is_inside(const std::string& inner, const std::string& outer_dir) {
  std::error_code ec;
  auto in = std::filesystem::weakly_canonical(inner, ec);
  if (ec) return false;
  auto out = std::filesystem::weakly_canonical(outer_dir, ec);
  if (ec) return false;
  for (auto p = in; !p.empty(); p = p.parent_path()) {
    if (p == out) return true;
    if (p == p.parent_path()) break;
  }
  return false;
}

RunDir::~RunDir() {
  if (lock_fd_ >= 0) ::close(lock_fd_);  // closing releases the flocks
  if (dir_fd_ >= 0) ::close(dir_fd_);
}

void RunDir::release() {
  if (lock_fd_ >= 0) ::close(lock_fd_);
  if (dir_fd_ >= 0) ::close(dir_fd_);
  lock_fd_ = dir_fd_ = -1;
  dir_.clear();
}

namespace {
// The holder's pid as its lock file says ("unknown" when the file is gone or unreadable); read
// without following a symlink or blocking on a FIFO.
std::string holder_pid(const std::string& lock) {
  int fd = ::open(lock.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return "unknown: " + lock + " is gone";
  char buf[32] = {0};
  ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  ::close(fd);
  std::string pid = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string("unknown");
  while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
  return pid;
}
}  // namespace

bool RunDir::open(const std::string& dir_in, const RunDirOptions& opt, std::string* error) {
  refused_ = true;
  if (dir_in.empty()) {
    *error = "train.output_dir is empty: give the directory the run writes to";
    return false;
  }
  refused_ = false;
  std::string dir = dir_in;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  if (!make_dirs(dir, error)) {
    *error = "train.output_dir " + dir_in + ": " + *error;
    return false;
  }
  const std::string lock = dir + "/" + kLockFile;
  // The exclusion is a flock on the directory itself, which no one can delete from under a run
  // while it holds files (deleting .qlft.lock does not let a second run in). Where directories
  // cannot be flocked (some network file systems) the lock file's own flock below remains.
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) {
    *error = sys_error("train.output_dir " + dir + ": cannot open", errno);
    return false;
  }
  if (::flock(dfd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
    ::close(dfd);
    refused_ = true;
    *error = "train.output_dir " + dir + " is in use by another run (pid " + holder_pid(lock) +
             ", holding " + dir + "); wait for it or choose another train.output_dir";
    return false;
  }
  dir_fd_ = dfd;
  // The lock file holds the holder's pid (for that message) and, created here, is the
  // writability check. It is never followed through a symlink nor truncated through a hard
  // link: either would let the run overwrite a file outside the directory.
  int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int e = errno;
    release();
    if (e == ELOOP) {
      refused_ = true;
      *error = "train.output_dir " + dir + ": " + lock +
               " is a symbolic link; qlft does not write through it (it would overwrite the "
               "file it points to): remove it";
    } else {
      *error =
          "train.output_dir " + dir + " is not writable: " + sys_error("cannot create " + lock, e);
    }
    return false;
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_nlink != 1) {
    const bool linked = S_ISREG(st.st_mode) && st.st_nlink != 1;
    ::close(fd);
    release();
    refused_ = true;
    *error = "train.output_dir " + dir + ": " + lock +
             (linked ? " has other hard links; qlft does not overwrite it (that would change "
                       "the other names' file): remove it"
                     : " is not a regular file: remove it");
    return false;
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int e = errno;
    ::close(fd);
    release();
    refused_ = e == EWOULDBLOCK;
    if (e == EWOULDBLOCK)
      *error = "train.output_dir " + dir + " is in use by another run (pid " + holder_pid(lock) +
               ", holding " + lock + "); wait for it or choose another train.output_dir";
    else
      *error = sys_error("cannot lock " + lock, e);
    return false;
  }
  std::string pid = std::to_string(::getpid()) + "\n";
  int err = 0;
  if (::ftruncate(fd, 0) != 0 || !write_all(fd, pid.data(), pid.size(), &err)) {
    if (!err) err = errno;
    ::close(fd);
    release();
    *error = "train.output_dir " + dir + " is not writable: " + sys_error(lock, err);
    return false;
  }
  lock_fd_ = fd;
  dir_ = dir;

  // Leftovers of killed runs: only what a qlft writer marked as its temporary and whose writer
  // is gone (formats/temp_marker.h); a user's `notes.tmp.2024` is not touched. An adapter moved
  // aside by a save that died between its two renames is put back when none replaced it.
  for (const std::string& name : list_dir(dir)) {
    std::string stem, kind;
    if (!qlft::temp::parse_temp_name(name, kAdapterDir, &stem, &kind) || kind != "old" ||
        exists(file(kAdapterDir)) || !qlft::temp::is_stale(dir, name))
      continue;
    const std::string p = dir + "/" + name;
    if (::rename(p.c_str(), file(kAdapterDir).c_str()) == 0)
      qlft::temp::unmark_path(file(kAdapterDir));
  }
  for (const std::string& p : qlft::temp::remove_stale(dir, "", true)) removed_.push_back(p);
  for (const std::string& p : qlft::temp::remove_stale(file(kAdapterDir), "", false))
    removed_.push_back(p);

  std::vector<std::string> found;
  for (const char* n : {kCheckpointFile, kMetricsFile, kAdapterDir, kAdapterGguf})
    if (exists(file(n))) found.push_back(n);
  had_run_ = !found.empty();
  if (had_run_ && !opt.resume) {
    std::string list;
    for (const auto& f : found) list += (list.empty() ? "" : ", ") + f;
    if (!opt.overwrite) {
      refused_ = true;
      *error = "train.output_dir " + dir + " holds a run (" + list +
               "): continue it with --resume, replace it with --overwrite, or choose another "
               "train.output_dir";
      release();
      return false;
    }
    for (const auto& f : found) {
      std::error_code ec;
      std::filesystem::remove_all(file(f.c_str()), ec);
      if (ec) {
        *error = "--overwrite: cannot remove " + file(f.c_str()) + ": " + ec.message();
        release();
        return false;
      }
    }
  }
  return true;
}

std::string metrics_records_before(const std::string& text, uint64_t keep_before_step) {
  std::string out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) break;  // a cut-off last line is not a record
    std::string line = text.substr(pos, nl - pos);
    pos = nl + 1;
    const char* key = "{\"step\": ";
    if (line.compare(0, std::strlen(key), key) != 0 || line.back() != '}') continue;
    char* end = nullptr;
    unsigned long long step = std::strtoull(line.c_str() + std::strlen(key), &end, 10);
    if (end == line.c_str() + std::strlen(key) || step >= keep_before_step) continue;
    out += line;
    out += '\n';
  }
  return out;
}

MetricsLog::~MetricsLog() {
  close();
}

void MetricsLog::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

bool MetricsLog::open(const std::string& path, uint64_t keep_before_step, std::string* error) {
  close();
  path_ = path;
  std::string keep;
  if (keep_before_step > 1) {
    FILE* f = std::fopen(path.c_str(), "rb");
    if (f) {
      std::string text;
      char buf[65536];
      size_t n;
      while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
      std::fclose(f);
      keep = metrics_records_before(text, keep_before_step);
    }
  }
  // Rewritten in place (not renamed): the records kept are a prefix of what was there, and a
  // crash while writing them loses at most records a later resume rewrites anyway.
  // Through a symlink the user made (tests point it at /dev/full); `train` refuses one that
  // names an input before it gets here (formats/output_guard.h).
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    *error = sys_error("cannot write " + path, errno);
    return false;
  }
  int err = 0;
  if (!write_all(fd_, keep.data(), keep.size(), &err)) {
    *error = sys_error(path + ": write failed", err);
    close();
    return false;
  }
  size_ = keep.size();
  return true;
}

bool MetricsLog::append(const std::string& line, std::string* error) {
  if (fd_ < 0) {
    *error = path_ + ": not open";
    return false;
  }
  std::string rec = line + "\n";
  int err = 0;
  if (!write_all(fd_, rec.data(), rec.size(), &err)) {
    // Cut the partial record off so the file stays whole records (best effort).
    if (::ftruncate(fd_, static_cast<off_t>(size_)) == 0)
      ::lseek(fd_, static_cast<off_t>(size_), SEEK_SET);
    *error = sys_error(path_ + ": write failed", err);
    return false;
  }
  size_ += rec.size();
  return true;
}

std::string json_number(double v, const char* fmt) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

}  // namespace cli
