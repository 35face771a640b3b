#include "output_guard.h"  // relative: the CLI compiles this file without src/ on its path

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>

namespace qlft {

namespace {

std::string strip_slashes(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

// realpath(3) of an existing path; empty when it does not resolve.
std::string real_path(const std::string& p) {
  char buf[PATH_MAX];
  return ::realpath(p.c_str(), buf) ? std::string(buf) : std::string();
}

void split(const std::string& p, std::string* dir, std::string* name) {
  const size_t s = p.rfind('/');
  *name = s == std::string::npos ? p : p.substr(s + 1);
  *dir = s == std::string::npos ? std::string(".") : p.substr(0, s == 0 ? 1 : s);
}

// The path as an absolute one without symlinks (the parent resolved when the path does not
// exist yet); empty when even the parent does not resolve.
std::string resolved(const std::string& path) {
  const std::string p = strip_slashes(path);
  std::string r = real_path(p);
  if (!r.empty()) return r;
  std::string dir, name;
  split(p, &dir, &name);
  if (name.empty() || name == "." || name == "..") return {};
  r = real_path(dir);
  if (r.empty()) return {};
  return r == "/" ? "/" + name : r + "/" + name;
}

}  // namespace

PathId path_id(const std::string& path) {
  PathId id;
  if (path.empty()) return id;
  const std::string p = strip_slashes(path);
  struct stat st;
  if (::stat(p.c_str(), &st) == 0) {
    id.dev = st.st_dev;
    id.ino = st.st_ino;
    id.valid = true;
    return id;
  }
  // Not there yet (or a dangling symlink, which a rename replaces itself): the directory it
  // goes into plus its name.
  std::string dir, name;
  split(p, &dir, &name);
  if (name.empty() || name == "." || name == "..") return id;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return id;
  id.dev = st.st_dev;
  id.ino = st.st_ino;
  id.name = name;
  id.valid = true;
  return id;
}

void OutputGuard::add_input(const std::string& path, const std::string& what) {
  if (path.empty()) return;
  inputs_.push_back({path_id(path), path, what});
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return;
  DIR* d = ::opendir(path.c_str());
  if (!d) return;
  while (dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n == "." || n == "..") continue;
    const std::string p = strip_slashes(path) + "/" + n;
    inputs_.push_back({path_id(p), p, what});
  }
  ::closedir(d);
}

void OutputGuard::add_run_dir(const std::string& dir, const char* except) {
  if (dir.empty()) return;
  for (const char* n : kRunOwnedFiles)
    if (!except || std::strcmp(n, except) != 0)
      inputs_.push_back({path_id(strip_slashes(dir) + "/" + n), strip_slashes(dir) + "/" + n,
                         std::string("a file of the training run in ") + dir});
}

std::string OutputGuard::refusal(const std::string& out, const char* writer,
                                 bool replaced_whole) const {
  const PathId o = path_id(out);
  if (!o.valid) return {};  // its directory does not exist: the write itself fails, naming it
  for (const Input& in : inputs_)
    if (in.id == o)
      return std::string(writer) + ": " + out + " is " + in.what + " (" + in.path +
             ", after links); writing it would replace what this reads: choose another output "
             "path";
  if (!replaced_whole || !o.name.empty()) return {};  // only an existing directory holds inputs
  // An input inside out: one of its resolved ancestors is out.
  for (const Input& in : inputs_) {
    std::string r = resolved(in.path);
    while (r.size() > 1) {
      r = r.substr(0, std::max<size_t>(r.rfind('/'), 1));
      struct stat st;
      if (::stat(r.c_str(), &st) == 0 && st.st_dev == o.dev && st.st_ino == o.ino)
        return std::string(writer) + ": " + out + " holds " + in.what + " (" + in.path +
               ", after links); replacing the directory would delete what this reads: choose "
               "another output path";
    }
  }
  return {};
}

}  // namespace qlft
