#include "support/rss_check.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/test_support.h"

namespace qlft_test {
namespace {

// A "VmRSS:" / "VmHWM:" line of /proc/self/status, bytes; 0 if absent.
uint64_t status_kib(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const size_t n = std::strlen(key);
  while (std::getline(f, line))
    if (line.compare(0, n, key) == 0) return std::stoull(line.substr(n)) * 1024;
  return 0;
}

void write_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t w = ::write(fd, s.data() + off, s.size() - off);
    if (w <= 0) return;
    off += static_cast<size_t>(w);
  }
}

}  // namespace

void rss_mark() {
  // Resets VmHWM to the current RSS (Linux >= 4.0).
  int fd = ::open("/proc/self/clear_refs", O_WRONLY);
  const bool ok = fd >= 0 && ::write(fd, "5", 1) == 1;
  if (fd >= 0) ::close(fd);
  if (!ok) throw std::runtime_error("cannot reset VmHWM (/proc/self/clear_refs)");
}

RssGrowth measure_rss_growth(const std::function<uint64_t()>& body) {
  RssGrowth g;
  int fds[2];
  if (::pipe(fds) != 0) {
    g.error = "pipe failed";
    return g;
  }
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    g.error = "fork failed";
    return g;
  }
  if (pid == 0) {
    ::close(fds[0]);
    std::string out;
    try {
      rss_mark();  // so the peak below is the body's
      const uint64_t before = status_kib("VmRSS:");
      const uint64_t tracked = body();
      const uint64_t peak = status_kib("VmHWM:");
      out =
          "ok " + std::to_string(peak > before ? peak - before : 0) + " " + std::to_string(tracked);
    } catch (const std::exception& e) {
      out = std::string("error ") + e.what();
    }
    write_all(fds[1], out);
    ::close(fds[1]);
    std::fflush(nullptr);
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string msg;
  char buf[512];
  ssize_t r;
  while ((r = ::read(fds[0], buf, sizeof buf)) > 0) msg.append(buf, static_cast<size_t>(r));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    g.error = "child died (status " + std::to_string(status) + ")";
  } else if (msg.rfind("ok ", 0) == 0) {
    unsigned long long a = 0, b = 0;
    if (std::sscanf(msg.c_str() + 3, "%llu %llu", &a, &b) == 2) {
      g.rss_growth = a;
      g.tracked = b;
    } else {
      g.error = "unreadable child report: " + msg;
    }
  } else {
    g.error = msg.empty() ? "child reported nothing" : msg;
  }
  return g;
}

std::string text_slice(const std::string& text, size_t bytes) {
  const std::string path = temp_dir("rss") + "/data.txt";
  std::ifstream in(text, std::ios::binary);
  std::vector<char> buf(bytes);
  in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
  write_file(path, buf.data(), static_cast<size_t>(in.gcount()));
  return path;
}

std::string check_untracked(const RssGrowth& g, uint64_t bound, const std::string& what) {
  if (!g.error.empty()) return what + ": " + g.error;
  char line[256];
  std::snprintf(line, sizeof line,
                "%s: RSS growth %.1f MiB, tracked %.1f MiB, untracked %.1f MiB (bound %.1f MiB)",
                what.c_str(), g.rss_growth / 1048576.0, g.tracked / 1048576.0,
                g.untracked() / 1048576.0, bound / 1048576.0);
  std::printf("[rss] %s\n", line);
  return g.untracked() <= bound ? "" : std::string(line) + ": untracked memory over the bound";
}

}  // namespace qlft_test
