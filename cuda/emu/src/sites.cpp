// Source sites the emulator can be told to leave out (QLFT_EMU_SKIP_SITE), so a script can show
// that the suite fails without any one barrier (tests/support/check_barriers.sh).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "emu_internal.h"

namespace qlft_emu {

namespace {

struct Site {
  std::string file;  // trailing path components, as the user wrote them
  int line = 0;
  bool announced = false;
};

// QLFT_EMU_SKIP_SITE=file:line[,file:line...]; read once. A malformed entry aborts, since a
// sweep that silently skips nothing would report every site as missed.
std::vector<Site>& sites() {
  static std::vector<Site>* s = [] {
    auto* v = new std::vector<Site>;
    const char* e = std::getenv("QLFT_EMU_SKIP_SITE");
    std::string all = e ? e : "";
    size_t at = 0;
    while (at < all.size()) {
      size_t end = all.find(',', at);
      if (end == std::string::npos) end = all.size();
      const std::string one = all.substr(at, end - at);
      const size_t colon = one.rfind(':');
      char* stop = nullptr;
      const long line =
          colon == std::string::npos ? 0 : std::strtol(one.c_str() + colon + 1, &stop, 10);
      if (colon == std::string::npos || colon == 0 || line <= 0 || !stop || *stop) {
        std::fprintf(stderr, "qlft CUDA emulator: QLFT_EMU_SKIP_SITE entry '%s' is not file:line\n",
                     one.c_str());
        std::abort();
      }
      v->push_back(Site{one.substr(0, colon), int(line), false});
      at = end + 1;
    }
    return v;
  }();
  return *s;
}

// `file` ends with `tail` at a path-component boundary.
bool same_file(const char* file, const std::string& tail) {
  const size_t n = std::strlen(file);
  if (n < tail.size() || std::strcmp(file + n - tail.size(), tail.c_str()) != 0) return false;
  return n == tail.size() || file[n - tail.size() - 1] == '/';
}

}  // namespace

bool skip_site(const char* file, int line) {
  std::vector<Site>& v = sites();
  for (Site& s : v) {
    if (s.line != line || !same_file(file, s.file)) continue;
    if (!s.announced) {  // the sweep reads this to tell "caught" from "never reached"
      s.announced = true;
      std::fprintf(stderr, "qlft CUDA emulator: QLFT_EMU_SKIP_SITE: leaving out %s:%d\n", file,
                   line);
    }
    return true;
  }
  return false;
}

}  // namespace qlft_emu
