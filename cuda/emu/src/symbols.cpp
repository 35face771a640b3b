// Names of emulated device code: cudaFuncGetName (the kernel's mangled name, as the real runtime
// gives it) and the static __shared__ variable an address lies in (the race check's reports).
// Kernels and shared variables are hidden symbols, absent from the dynamic symbol table, so the
// object that holds the address (dladdr) is read once for its ELF .symtab.
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "emu_internal.h"

namespace qlft_emu {

namespace {

struct Sym {
  uintptr_t lo, hi;  // load addresses
  std::string name;
};
struct Table {
  std::vector<Sym> syms;  // functions and objects, sorted by lo
};

// The function and object symbols of the ELF file `path` loaded at `base` (ET_DYN: symbol values
// are offsets from the base; ET_EXEC: absolute).
Table read_table(const char* path, uintptr_t base) {
  Table t;
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return t;
  struct stat sb {};
  if (fstat(fd, &sb) != 0 || size_t(sb.st_size) < sizeof(Elf64_Ehdr)) {
    close(fd);
    return t;
  }
  const size_t n = size_t(sb.st_size);
  void* m = mmap(nullptr, n, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (m == MAP_FAILED) return t;
  const char* f = static_cast<const char*>(m);
  const auto* eh = reinterpret_cast<const Elf64_Ehdr*>(f);
  const bool ok = std::memcmp(eh->e_ident, ELFMAG, SELFMAG) == 0 &&
                  eh->e_ident[EI_CLASS] == ELFCLASS64 &&
                  eh->e_shoff + eh->e_shnum * sizeof(Elf64_Shdr) <= n;
  if (ok) {
    const auto* sh = reinterpret_cast<const Elf64_Shdr*>(f + eh->e_shoff);
    const uintptr_t bias = eh->e_type == ET_DYN ? base : 0;
    for (unsigned i = 0; i < eh->e_shnum; ++i) {
      if (sh[i].sh_type != SHT_SYMTAB || sh[i].sh_link >= eh->e_shnum) continue;
      const Elf64_Shdr& str = sh[sh[i].sh_link];
      if (sh[i].sh_offset + sh[i].sh_size > n || str.sh_offset + str.sh_size > n) continue;
      const auto* s = reinterpret_cast<const Elf64_Sym*>(f + sh[i].sh_offset);
      const size_t count = sh[i].sh_size / sizeof(Elf64_Sym);
      for (size_t k = 0; k < count; ++k) {
        const int type = ELF64_ST_TYPE(s[k].st_info);
        if ((type != STT_FUNC && type != STT_OBJECT) || !s[k].st_value ||
            s[k].st_name >= str.sh_size)
          continue;
        const uintptr_t lo = bias + s[k].st_value;
        t.syms.push_back(Sym{lo, lo + (s[k].st_size ? s[k].st_size : 1),
                             std::string(f + str.sh_offset + s[k].st_name)});
      }
    }
  }
  munmap(m, n);
  std::sort(t.syms.begin(), t.syms.end(), [](const Sym& a, const Sym& b) { return a.lo < b.lo; });
  return t;
}

std::mutex& lock() {
  static std::mutex* m = new std::mutex;
  return *m;
}

// The symbol covering `p` and the offset into it, or nullptr.
const Sym* find(const void* p, size_t* offset) {
  Dl_info info{};
  if (!dladdr(p, &info) || !info.dli_fname) return nullptr;
  static std::map<std::string, Table>* tables = new std::map<std::string, Table>;
  auto it = tables->find(info.dli_fname);
  if (it == tables->end())
    it = tables
             ->emplace(info.dli_fname,
                       read_table(info.dli_fname, reinterpret_cast<uintptr_t>(info.dli_fbase)))
             .first;
  const std::vector<Sym>& v = it->second.syms;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto s =
      std::upper_bound(v.begin(), v.end(), a, [](uintptr_t x, const Sym& y) { return x < y.lo; });
  // The nearest symbols at or below `a`; several may start at one address (aliases).
  while (s != v.begin()) {
    --s;
    if (a >= s->lo && a < s->hi) {
      if (offset) *offset = a - s->lo;
      return &*s;
    }
    if (a - s->lo > (size_t(1) << 20)) break;
  }
  return nullptr;
}

}  // namespace

const char* symbol_name(const void* p, size_t* offset) {
  std::lock_guard<std::mutex> g(lock());
  const Sym* s = find(p, offset);
  return s ? s->name.c_str() : nullptr;  // tables are never freed: the pointer stays valid
}

}  // namespace qlft_emu

cudaError_t cudaFuncGetName(const char** name, const void* func) {
  if (!name || !func) {
    qlft_emu::set_last_error(cudaErrorInvalidValue);
    return cudaErrorInvalidValue;
  }
  size_t off = 0;
  const char* s = qlft_emu::symbol_name(func, &off);
  if (!s || off != 0) {  // not the entry of a function in a loaded object
    qlft_emu::set_last_error(cudaErrorInvalidDeviceFunction);
    return cudaErrorInvalidDeviceFunction;
  }
  *name = s;
  return cudaSuccess;
}
