// "An output never replaces an input" (issue 44, formats/output_guard.h) against random layouts:
// the input bytes build a small tree of directories, files, symlinks (relative, absolute,
// dangling, looping) and hard links in a scratch directory, pick the inputs (files, directories,
// names not there yet) and spell an output path through `.`, `..`, `//` and the links. Then:
//  - the guard's verdict must equal an independent oracle: realpath(3) strings, with the hard
//    links told apart by the layout's own record of which names it linked (not by st_ino, which
//    the guard uses), for the output and every input (a directory input: itself and its entries);
//  - the write is done when the guard allows it (AtomicFile, as every writer), and no input's
//    bytes may have changed.
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "formats/atomic_file.h"
#include "formats/output_guard.h"
#include "fuzz_common.h"

namespace {

struct Bytes {
  const uint8_t* p;
  size_t n, i = 0;
  uint8_t next() { return i < n ? p[i++] : 0; }
  bool done() const { return i >= n; }
};

std::string real(const std::string& p) {
  char buf[PATH_MAX];
  return ::realpath(p.c_str(), buf) ? std::string(buf) : std::string();
}

std::string strip(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// The layout's own record: realpath of every regular-file name -> the file it is (hard links
// share one id).
std::map<std::string, int> g_object;

// The oracle's identity of a path: "obj:<id>" for a file name the layout made, the realpath of
// other existing paths, "new:<realpath of parent>/<name>" for a path not there yet; "" when
// even the parent does not resolve (no verdict).
std::string oracle_id(const std::string& path) {
  const std::string p = strip(path);
  std::string r = real(p);
  if (!r.empty()) {
    auto it = g_object.find(r);
    return it != g_object.end() ? "obj:" + std::to_string(it->second) : r;
  }
  const size_t s = p.rfind('/');
  const std::string dir = s == std::string::npos ? "." : (s == 0 ? "/" : p.substr(0, s));
  const std::string name = s == std::string::npos ? p : p.substr(s + 1);
  if (name.empty() || name == "." || name == "..") return {};
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return {};
  return "new:" + real(dir) + "/" + name;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace fs = std::filesystem;
  Bytes b{data, size};
  const std::string root = qlft_fuzz::scratch_dir() + "/og";
  std::error_code ec;
  fs::remove_all(root, ec);
  fs::create_directories(root);
  const std::string rroot = real(root);
  g_object.clear();

  // Names made so far (relative to root), directories among them.
  std::vector<std::string> names{""}, dirs{""};
  static const char* kNames[] = {"a", "b", "m.gguf", "ad", "x.tmp.1", "out"};
  int objects = 0;
  const int ops = 1 + b.next() % 12;
  for (int k = 0; k < ops && !b.done(); ++k) {
    const std::string parent = dirs[b.next() % dirs.size()];
    const std::string name = (parent.empty() ? "" : parent + "/") + kNames[b.next() % 6];
    const std::string full = root + "/" + name;
    if (::access(full.c_str(), F_OK) == 0 || fs::is_symlink(full, ec)) continue;
    switch (b.next() % 5) {
      case 0:
        if (fs::create_directory(full, ec)) {
          names.push_back(name);
          dirs.push_back(name);
        }
        break;
      case 1: {
        std::ofstream(full) << "content " << objects;
        g_object[real(full)] = objects++;
        names.push_back(name);
        break;
      }
      case 2: {  // a relative symlink to something made (or a name not there: dangling)
        const std::string to = names[b.next() % names.size()];
        std::string rel;
        for (char c : name)
          if (c == '/') rel += "../";
        rel += to.empty() ? "." : to;
        if (b.next() % 4 == 0) rel += "/../" + std::string(kNames[b.next() % 6]);
        if (::symlink(rel.c_str(), full.c_str()) == 0) names.push_back(name);
        break;
      }
      case 3: {  // an absolute symlink, sometimes to itself (a loop)
        const std::string to =
            b.next() % 5 == 0 ? full : root + "/" + names[b.next() % names.size()];
        if (::symlink(to.c_str(), full.c_str()) == 0) names.push_back(name);
        break;
      }
      case 4: {  // a hard link to a file made
        const std::string from = root + "/" + names[b.next() % names.size()];
        const std::string r = real(from);
        auto it = g_object.find(r);
        if (it != g_object.end() && !fs::is_symlink(from, ec) &&
            ::link(r.c_str(), full.c_str()) == 0) {
          g_object[real(full)] = it->second;
          names.push_back(name);
        }
        break;
      }
    }
  }

  // Inputs: names made or not (a run's metrics before its first step).
  qlft::OutputGuard guard;
  std::set<std::string> input_ids;
  std::vector<std::string> input_real;          // each input's (and entry's) resolved path
  std::map<std::string, std::string> contents;  // every input file's bytes before
  const int n_inputs = 1 + b.next() % 3;
  for (int k = 0; k < n_inputs; ++k) {
    const std::string rel = b.next() % 4 == 0 ? std::string("new") + kNames[b.next() % 6]
                                              : names[b.next() % names.size()];
    const std::string in = root + "/" + rel;
    guard.add_input(in, "input");
    auto note = [&](const std::string& p) {
      const std::string id = oracle_id(p);
      input_ids.insert(id);
      const std::string r = real(strip(p));
      input_real.push_back(!r.empty() ? r : id.compare(0, 4, "new:") == 0 ? id.substr(4) : "");
    };
    note(in);
    struct stat st;
    if (::stat(in.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      for (const auto& e : fs::directory_iterator(in, ec)) {
        note(in + "/" + e.path().filename().string());
        const std::string er = real(e.path().string());
        if (g_object.count(er)) contents[er] = slurp(er);
      }
    } else if (::stat(in.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
      contents[real(in)] = slurp(in);
    }
  }
  input_ids.erase("");

  // The output, spelled through the layout.
  std::string out = root;
  const int parts = 1 + b.next() % 5;
  for (int k = 0; k < parts; ++k) {
    const uint8_t c = b.next() % 9;
    out += c == 6 ? "/." : c == 7 ? "/.." : c == 8 ? "/" : "/" + std::string(kNames[c % 6]);
  }
  const bool whole = b.next() % 4 == 1;
  const std::string why = guard.refusal(out, "fuzz", whole);

  const std::string oid = oracle_id(out);
  bool expect = !oid.empty() && input_ids.count(oid) > 0;
  if (whole && !oid.empty() && oid.compare(0, 4, "new:") != 0) {
    const std::string ro = real(strip(out));
    struct stat st;
    if (!ro.empty() && ::stat(ro.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
      for (const std::string& r : input_real) {  // an input anywhere under the directory
        const std::string prefix = ro == "/" ? ro : ro + "/";
        expect |= r.size() > prefix.size() && r.compare(0, prefix.size(), prefix) == 0;
      }
  }
  if (expect != !why.empty()) {
    std::fprintf(stderr, "verdict mismatch for %s (oracle %s, guard '%s')\n", out.c_str(),
                 expect ? "refuses" : "allows", why.c_str());
    std::abort();
  }

  // Allowed and inside the scratch tree: write it as every writer does; no input may change.
  const std::string parent_real = oid.compare(0, 4, "new:") == 0 ? oid.substr(4) : real(strip(out));
  if (why.empty() && !oid.empty() && parent_real.compare(0, rroot.size(), rroot) == 0) {
    try {
      qlft::write_file_atomic(out, "written");
    } catch (const qlft::Error&) {
      // a directory there, a path through a file: refused by the file system, fine
    }
  }
  for (const auto& kv : contents)
    if (slurp(kv.first) != kv.second) {
      std::fprintf(stderr, "input %s changed by writing %s\n", kv.first.c_str(), out.c_str());
      std::abort();
    }
  return 0;
}
