// The emulated NCCL's transport (nccl_transport.h): files in one directory per communicator.
#include "nccl_transport.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <thread>

namespace qlft_emu {

namespace {

std::string sys_error(const std::string& what, const std::string& path) {
  return what + " " + path + ": " + std::strerror(errno);
}

std::string base_dir() {
  struct stat st;
  if (stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) && access("/dev/shm", W_OK) == 0)
    return "/dev/shm";
  const char* t = std::getenv("TMPDIR");
  return t && *t ? t : "/tmp";
}

void write_file(const std::string& path, const void* data, size_t bytes) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) throw std::runtime_error(sys_error("cannot create", tmp));
  const char* p = static_cast<const char*>(data);
  for (size_t done = 0; done < bytes;) {
    const ssize_t w = ::write(fd, p + done, bytes - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const std::string e = sys_error("cannot write", tmp);
      ::close(fd);
      throw std::runtime_error(e);
    }
    done += size_t(w);
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0)
    throw std::runtime_error(sys_error("cannot rename to", path));
}

// The whole file, or false while it does not exist yet.
bool read_file(const std::string& path, std::string* out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return false;
    throw std::runtime_error(sys_error("cannot open", path));
  }
  out->clear();
  char buf[1 << 16];
  for (;;) {
    const ssize_t r = ::read(fd, buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const std::string e = sys_error("cannot read", path);
      ::close(fd);
      throw std::runtime_error(e);
    }
    if (r == 0) break;
    out->append(buf, size_t(r));
  }
  ::close(fd);
  return true;
}

}  // namespace

NcclTransport::NcclTransport(const std::string& name, int rank, int nranks, double timeout_s)
    : dir_(base_dir() + "/" + name), rank_(rank), nranks_(nranks), timeout_s_(timeout_s) {
  if (::mkdir(dir_.c_str(), 0700) != 0 && errno != EEXIST)
    throw std::runtime_error(sys_error("cannot create", dir_));
}

NcclTransport::~NcclTransport() {
  // A rank's last files may still be unread when it leaves (a peer can be behind in the last
  // round), so nothing is removed until every rank has left: each leaves a marker, and a rank that
  // finds every marker (the last to leave, or both of two leaving at once) removes the directory.
  try {
    write_file(dir_ + "/left." + std::to_string(rank_), "", 0);
    for (int r = 0; r < nranks_; ++r) {
      struct stat st;
      if (stat((dir_ + "/left." + std::to_string(r)).c_str(), &st) != 0) return;
    }
  } catch (const std::exception&) {
    return;  // the directory stays (a destructor does not throw)
  }
  if (DIR* d = opendir(dir_.c_str())) {
    while (const dirent* e = readdir(d))
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0)
        ::unlink((dir_ + "/" + e->d_name).c_str());
    closedir(d);
  }
  ::rmdir(dir_.c_str());
}

std::string NcclTransport::file(long round, int rank) const {
  return dir_ + "/" + std::to_string(round) + "." + std::to_string(rank);
}

std::vector<std::string> NcclTransport::exchange(const void* data, size_t bytes) {
  const long k = round_++;
  if (k >= 2) ::unlink(file(k - 2, rank_).c_str());
  write_file(file(k, rank_), data, bytes);
  std::vector<std::string> all(static_cast<size_t>(nranks_));
  std::vector<bool> have(static_cast<size_t>(nranks_), false);
  const auto start = std::chrono::steady_clock::now();
  auto pause = std::chrono::microseconds(10);
  for (int left = nranks_;;) {
    for (int r = 0; r < nranks_; ++r)
      if (!have[size_t(r)] && read_file(file(k, r), &all[size_t(r)])) {
        have[size_t(r)] = true;
        --left;
      }
    if (left == 0) return all;
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (waited > timeout_s_) {
      std::string missing;
      for (int r = 0; r < nranks_; ++r)
        if (!have[size_t(r)]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      throw std::runtime_error("round " + std::to_string(k) + " in " + dir_ + ": rank(s) " +
                               missing + " did not arrive within " +
                               std::to_string(int(timeout_s_)) + " s");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(2000));
  }
}

}  // namespace qlft_emu
