#include "temp_marker.h"  // relative: the CLI compiles this file without src/ on its path

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace qlft::temp {

namespace {

constexpr const char* kAttr = "user.qlft.temp";

std::string read_small(const char* path) {
  FILE* f = std::fopen(path, "rb");
  if (!f) return {};
  char buf[1024];
  size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  return std::string(buf, n);
}

// Field 22 of /proc/<pid>/stat (start time in clock ticks after boot); "" when unreadable,
// with *gone set when the process does not exist.
std::string start_time(long pid, bool* gone) {
  const std::string p = "/proc/" + std::to_string(pid) + "/stat";
  errno = 0;
  const std::string s = read_small(p.c_str());
  if (gone) *gone = s.empty() && errno == ENOENT;
  const size_t rp = s.rfind(')');
  if (rp == std::string::npos) return {};
  // After ") ": state is field 3, start time field 22.
  size_t pos = rp + 2;
  for (int field = 3; field < 22 && pos < s.size(); ++field) {
    pos = s.find(' ', pos);
    if (pos == std::string::npos) return {};
    ++pos;
  }
  const size_t end = s.find(' ', pos);
  return s.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
}

std::string boot_id() {
  std::string b = read_small("/proc/sys/kernel/random/boot_id");
  while (!b.empty() && (b.back() == '\n' || b.back() == ' ')) b.pop_back();
  return b;
}

// "<name>\n<pid>\n<start>\n<boot>"
std::string marker_for(const std::string& as_name) {
  const long pid = static_cast<long>(::getpid());
  return as_name + "\n" + std::to_string(pid) + "\n" + start_time(pid, nullptr) + "\n" + boot_id();
}

std::string base_name(const std::string& p) {
  std::string s = p;
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  const size_t k = s.rfind('/');
  return k == std::string::npos ? s : s.substr(k + 1);
}

}  // namespace

std::string temp_path(const std::string& path) {
  return path + ".tmp." + std::to_string(::getpid());
}

std::string old_path(const std::string& path) {
  return path + ".old." + std::to_string(::getpid());
}

bool mark(int fd, const std::string& as_name) {
  const std::string m = marker_for(base_name(as_name));
  return ::fsetxattr(fd, kAttr, m.data(), m.size(), 0) == 0;
}

bool mark_path(const std::string& path, const std::string& as_name) {
  const std::string m = marker_for(base_name(as_name));
  return ::lsetxattr(path.c_str(), kAttr, m.data(), m.size(), 0) == 0;
}

void unmark_path(const std::string& path) {
  ::lremovexattr(path.c_str(), kAttr);
}

bool is_stale(const std::string& dir, const std::string& name) {
  const std::string p = dir + "/" + name;
  char buf[512];
  const ssize_t n = ::lgetxattr(p.c_str(), kAttr, buf, sizeof buf - 1);
  if (n <= 0) return false;  // no marker: not ours
  std::string fields[4];
  size_t f = 0;
  for (ssize_t i = 0; i < n && f < 4; ++i) {
    if (buf[i] == '\n')
      ++f;
    else
      fields[f] += buf[i];
  }
  if (f != 3 || fields[0] != name) return false;  // the marker of another name (moved): keep
  char* end = nullptr;
  const long pid = std::strtol(fields[1].c_str(), &end, 10);
  if (fields[1].empty() || *end || pid <= 0) return false;
  const std::string boot = boot_id();
  if (!boot.empty() && !fields[3].empty() && boot != fields[3]) return true;  // made before a boot
  if (start_time(static_cast<long>(::getpid()), nullptr).empty())  // no /proc: by pid alone
    return ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
  bool gone = false;
  const std::string st = start_time(pid, &gone);
  if (gone) return true;
  if (st.empty()) return false;                  // unreadable: assume it lives
  return !fields[2].empty() && st != fields[2];  // the pid now names another process
}

bool parse_temp_name(const std::string& name, const std::string& base, std::string* stem,
                     std::string* kind) {
  for (const char* k : {".tmp.", ".old."}) {
    const size_t m = name.rfind(k);
    if (m == std::string::npos || m == 0) continue;
    const size_t d = m + std::strlen(k);
    if (d >= name.size()) continue;
    bool digits = true;
    for (size_t i = d; i < name.size(); ++i) digits &= name[i] >= '0' && name[i] <= '9';
    if (!digits) continue;
    if (!base.empty() && name.compare(0, m, base) != 0) continue;
    if (!base.empty() && m != base.size()) continue;
    if (stem) *stem = name.substr(0, m);
    if (kind) *kind = k[1] == 't' ? "tmp" : "old";
    return true;
  }
  return false;
}

std::vector<std::string> remove_stale(const std::string& dir, const std::string& base,
                                      bool with_old) {
  std::vector<std::string> removed, names;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return removed;
  while (dirent* e = ::readdir(d)) names.emplace_back(e->d_name);
  ::closedir(d);
  for (const std::string& n : names) {
    std::string kind;
    if (!parse_temp_name(n, base, nullptr, &kind)) continue;
    if (kind == "old" && !with_old) continue;
    if (!is_stale(dir, n)) continue;
    const std::string p = dir + "/" + n;
    std::error_code ec;
    std::filesystem::remove_all(p, ec);
    if (!ec) removed.push_back(p);
  }
  return removed;
}

}  // namespace qlft::temp
