// Shared-memory race detection for the CUDA emulator, as compute-sanitizer's racecheck: a 4-byte
// word of shared memory written by one thread and read or written by another in the same barrier
// interval, with no warp synchronization between them, fails the launch. Deterministic: every
// access is seen, whatever order the schedule runs the fibers in.
//
// Seeing every access: cuda/src/*.cu (and the emulator's own test kernels) are compiled with
// -fsanitize=thread but linked without TSan's runtime (cuda/emu/emulate.cmake); the compiler's
// calls (__tsan_read4, __tsan_write8, __tsan_atomic32_fetch_add, ...) land here. Shared memory is
// plain C++ arrays (statics in the kernel's object, and the launch's dynamic buffer), so no type
// can wrap it; the instrumentation sees loads and stores whatever their type. The fast path is one
// range test per access; only accesses inside the running block's shared memory reach the shadow.
// Atomics are performed and not recorded (atomics on shared memory are not races). Host code and
// the scheduler run with no current fiber and are ignored. Where the compiler cannot instrument
// (an ASan build: TSan's instrumentation excludes ASan's) nothing calls in and the check is off;
// QLFT_EMU_RACECHECK_BUILT (qlft_emu_device.h) says which.
//
// Happens-before inside a block: __syncthreads ends the interval (a new epoch; older shadow
// entries count as empty). __syncwarp and shuffles order the lanes of their mask, as CUDA's memory
// model says: every lane of a warp keeps a vector clock over the warp's 32 lanes, joined at each
// completed warp operation; an access by lane B is ordered after lane A's earlier access when B's
// clock for A has passed A's clock at that access. Different warps are ordered by barriers only.
// Granule: the aligned 4-byte word (a 2-byte access races with its neighbour in the same word,
// which CUDA's own racecheck, byte-exact, would not report; no kernel here shares words that way).
#include <cxxabi.h>
#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "emu_internal.h"

namespace qlft_emu {

namespace {

// The fast path's ranges: empty (length 0) unless a block with race checking on is running.
// Plain globals (kernels run one at a time under device_lock; other threads only ever compare).
uintptr_t g_lo[2] = {0, 0};
uintptr_t g_len[2] = {0, 0};

struct Word {
  uint64_t epoch = 0;
  int32_t wtid = -1;   // last writer (linear thread index), -1 none this epoch
  uint32_t wclk = 0;   // its own clock at the write
  int32_t rwarp = -1;  // readers since the last write: -1 none, -2 several warps, else their warp
  uint32_t rmask = 0;  // lanes of rwarp that read
  int32_t rtid = -1, rtid_other = -1;  // a reader, and one in another warp (rwarp == -2)
};

struct State {
  bool env_checked = false, enabled = true;
  uintptr_t base[2] = {0, 0};
  size_t words[2] = {0, 0};
  std::vector<Word> shadow;
  std::vector<uint32_t> rclk;    // [word][lane]: the reader's own clock at its read
  std::vector<uint32_t> clocks;  // [thread][lane]: each thread's clock over its warp
  uint64_t epoch = 0;
  int cur = -1;  // running fiber (linear index) or -1
  std::map<uintptr_t, std::pair<uintptr_t, uintptr_t>> writable;  // object base -> its data
  int nthreads = 0;
};
State& st() {
  static State* s = new State;
  return *s;
}

// The writable data of the object (executable or library) holding `code`: where its static
// __shared__ variables live. GCC ignores the section attribute on a static local of a template
// (the qlft_emu_shared section misses those), so the whole writable image of the kernel's object
// is watched: kernels write nothing else there, and reads alone never race.
std::pair<uintptr_t, uintptr_t> writable_data(State& s, const void* code) {
  Dl_info info{};
  if (!dladdr(code, &info)) return {0, 0};
  const uintptr_t base = reinterpret_cast<uintptr_t>(info.dli_fbase);
  auto it = s.writable.find(base);
  if (it != s.writable.end()) return it->second;
  struct Find {
    uintptr_t base, lo = UINTPTR_MAX, hi = 0;
  } q{base};
  dl_iterate_phdr(
      [](dl_phdr_info* pi, size_t, void* arg) {
        Find& q = *static_cast<Find*>(arg);
        uintptr_t first = UINTPTR_MAX;  // the object's lowest mapped address is its dladdr base
        for (int i = 0; i < pi->dlpi_phnum; ++i)
          if (pi->dlpi_phdr[i].p_type == PT_LOAD)
            first = std::min<uintptr_t>(first, pi->dlpi_addr + pi->dlpi_phdr[i].p_vaddr);
        if (first == UINTPTR_MAX || (first & ~uintptr_t(4095)) != q.base) return 0;
        for (int i = 0; i < pi->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = pi->dlpi_phdr[i];
          if (ph.p_type != PT_LOAD || !(ph.p_flags & PF_W)) continue;
          q.lo = std::min<uintptr_t>(q.lo, pi->dlpi_addr + ph.p_vaddr);
          q.hi = std::max<uintptr_t>(q.hi, pi->dlpi_addr + ph.p_vaddr + ph.p_memsz);
        }
        return 1;
      },
      &q);
  std::pair<uintptr_t, uintptr_t> r{0, 0};
  if (q.lo < q.hi) r = {q.lo & ~uintptr_t(3), q.hi};
  s.writable[base] = r;
  return r;
}

std::string thread_name(int linear) {
  const uint3 d = t_block_dim;
  char b[64];
  std::snprintf(b, sizeof b, "thread (%u,%u,%u)", unsigned(linear) % d.x,
                (unsigned(linear) / d.x) % d.y, unsigned(linear) / (d.x * d.y));
  return b;
}

[[noreturn]] void race(State& s, size_t word, bool write, const char* kind, int other) {
  const int r = word < s.words[0] ? 0 : 1;
  const size_t off = (word - (r ? s.words[0] : 0)) * 4;
  // Static shared memory: the variable, from the symbol table (a function-local static's
  // demangled name is "function::variable"); `off` counts from the object's writable data.
  std::string what = "the launch's dynamic shared memory at byte " + std::to_string(off);
  if (r == 0) {
    size_t in = 0;
    const char* sym = symbol_name(reinterpret_cast<void*>(s.base[0] + off), &in);
    int ok = -1;
    char* dm = sym ? abi::__cxa_demangle(sym, nullptr, nullptr, &ok) : nullptr;
    what = "static __shared__ " +
           std::string(ok == 0 ? dm
                       : sym   ? sym
                               : "?") +
           " at byte " + std::to_string(in);
    std::free(dm);
  }
  char b[1024];
  std::snprintf(b, sizeof b,
                "shared-memory race (%s): %s %s %s, which %s %s in the same barrier interval "
                "with no __syncthreads or warp synchronization between them "
                "(QLFT_EMU_RACECHECK=0 turns the check off)",
                kind, thread_name(s.cur).c_str(), write ? "writes" : "reads", what.c_str(),
                thread_name(other).c_str(),
                std::strcmp(kind, "write after read") == 0 ? "read" : "wrote");
  device_fault(b);
}

void check_word(State& s, size_t i, bool write) {
  Word& w = s.shadow[i];
  if (w.epoch != s.epoch) w = Word{s.epoch};
  const int f = s.cur, warp = f >> 5, lane = f & 31;
  const uint32_t* vc = &s.clocks[size_t(f) * 32];
  // Is `other`'s access at its clock `clk` ordered before this one?
  auto ordered = [&](int other, uint32_t clk) {
    return (other >> 5) == warp && vc[other & 31] > clk;
  };
  if (w.wtid >= 0 && w.wtid != f && !ordered(w.wtid, w.wclk))
    race(s, i, write, write ? "write after write" : "read after write", w.wtid);
  if (write) {
    if (w.rwarp == -2)
      race(s, i, true, "write after read", (w.rtid >> 5) != warp ? w.rtid : w.rtid_other);
    if (w.rwarp >= 0) {
      if (w.rwarp != warp) race(s, i, true, "write after read", w.rtid);
      for (uint32_t m = w.rmask & ~(1u << lane); m; m &= m - 1) {
        const int l = __builtin_ctz(m);
        if (!(vc[l] > s.rclk[i * 32 + size_t(l)]))
          race(s, i, true, "write after read", warp * 32 + l);
      }
    }
    w.wtid = f;
    w.wclk = vc[lane];
    w.rwarp = -1;
    w.rmask = 0;
    return;
  }
  if (w.rwarp == -1) {
    w.rwarp = warp;
    w.rtid = f;
  } else if (w.rwarp >= 0 && w.rwarp != warp) {
    w.rwarp = -2;
    w.rtid_other = f;
  }
  if (w.rwarp >= 0) {
    w.rmask |= 1u << lane;
    s.rclk[i * 32 + size_t(lane)] = vc[lane];
  }
}

__attribute__((noinline)) void slow(uintptr_t a, size_t n, bool write) {
  State& s = st();
  if (s.cur < 0) return;
  for (int r = 0; r < 2; ++r) {
    if (a + n <= s.base[r] || a >= s.base[r] + g_len[r]) continue;
    const uintptr_t lo = a < s.base[r] ? s.base[r] : a;
    const uintptr_t hi = a + n > s.base[r] + g_len[r] ? s.base[r] + g_len[r] : a + n;
    const size_t first = (lo - s.base[r]) / 4, last = (hi - 1 - s.base[r]) / 4;
    for (size_t k = first; k <= last; ++k) check_word(s, (r ? s.words[0] : 0) + k, write);
  }
}

inline void access(const volatile void* p, size_t n, bool write) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  // g_lo is 16 bytes below the range: an access starting up to 16 bytes before it may reach in.
  if (a - g_lo[0] < g_len[0] + 16 || a - g_lo[1] < g_len[1] + 16) slow(a, n, write);
}

}  // namespace

bool racecheck_enabled() {
  State& s = st();
  if (!s.env_checked) {
    s.env_checked = true;
    const char* e = std::getenv("QLFT_EMU_RACECHECK");
    s.enabled = !(e && std::strcmp(e, "0") == 0);
  }
  return s.enabled;
}

void racecheck_launch(const void* kernel, void* dyn, size_t dyn_bytes, int nthreads) {
  State& s = st();
  if (!racecheck_enabled()) return;
  const std::pair<uintptr_t, uintptr_t> data = writable_data(s, kernel);
  const size_t stat_bytes = data.second - data.first;
  s.base[0] = data.first;
  s.base[1] = reinterpret_cast<uintptr_t>(dyn);
  s.words[0] = (stat_bytes + 3) / 4;
  s.words[1] = (dyn_bytes + 3) / 4;
  const size_t nw = s.words[0] + s.words[1];
  if (s.shadow.size() < nw) {
    s.shadow.resize(nw);
    s.rclk.resize(nw * 32);
  }
  s.clocks.assign(size_t(nthreads) * 32, 0);
  s.cur = -1;
  g_lo[0] = s.base[0] - 16;  // see access(): the test is shifted by 16 bytes
  g_lo[1] = s.base[1] - 16;
  g_len[0] = stat_bytes;
  g_len[1] = dyn_bytes;
  ++s.epoch;
}

void racecheck_block() {
  State& s = st();
  if (!g_len[0] && !g_len[1]) return;
  std::fill(s.clocks.begin(), s.clocks.end(), 0u);
  ++s.epoch;
}

void racecheck_barrier() {
  ++st().epoch;
}

void racecheck_warp_sync(int first, unsigned mask, int nlanes) {
  State& s = st();
  if (!g_len[0] && !g_len[1]) return;
  uint32_t join[32] = {};
  for (int m = 0; m < nlanes; ++m) {
    if (!(mask >> m & 1u)) continue;
    uint32_t* vc = &s.clocks[size_t(first + m) * 32];
    ++vc[m];  // this lane's accesses before the operation are ordered before everyone's after
    for (int l = 0; l < 32; ++l) join[l] = vc[l] > join[l] ? vc[l] : join[l];
  }
  for (int m = 0; m < nlanes; ++m)
    if (mask >> m & 1u) std::memcpy(&s.clocks[size_t(first + m) * 32], join, sizeof join);
}

void racecheck_enter(int linear) {
  st().cur = linear;
}

void racecheck_end() {
  g_lo[0] = g_lo[1] = g_len[0] = g_len[1] = 0;
  st().cur = -1;
}

}  // namespace qlft_emu

// ---- The instrumentation's entry points (GCC's and clang's -fsanitize=thread ABI) --------------
// Hidden: libqlft-cuda.so binds its own calls here, never to a TSan runtime elsewhere in the
// process.
#define QLFT_RC_API extern "C" __attribute__((visibility("hidden")))
using qlft_emu::access;

QLFT_RC_API void __tsan_init() {}
QLFT_RC_API void __tsan_func_entry(void*) {}
QLFT_RC_API void __tsan_func_exit() {}
QLFT_RC_API void __tsan_vptr_update(void**, void*) {}
QLFT_RC_API void __tsan_vptr_read(void**) {}
QLFT_RC_API void __tsan_read_range(void* p, unsigned long n) {
  access(p, n, false);
}
QLFT_RC_API void __tsan_write_range(void* p, unsigned long n) {
  access(p, n, true);
}
#define QLFT_RC_RW(n)                                        \
  QLFT_RC_API void __tsan_read##n(void* p) {                 \
    access(p, n, false);                                     \
  }                                                          \
  QLFT_RC_API void __tsan_write##n(void* p) {                \
    access(p, n, true);                                      \
  }                                                          \
  QLFT_RC_API void __tsan_unaligned_read##n(const void* p) { \
    access(p, n, false);                                     \
  }                                                          \
  QLFT_RC_API void __tsan_unaligned_write##n(void* p) {      \
    access(p, n, true);                                      \
  }                                                          \
  QLFT_RC_API void __tsan_volatile_read##n(void* p) {        \
    access(p, n, false);                                     \
  }                                                          \
  QLFT_RC_API void __tsan_volatile_write##n(void* p) {       \
    access(p, n, true);                                      \
  }
QLFT_RC_RW(1)
QLFT_RC_RW(2)
QLFT_RC_RW(4)
QLFT_RC_RW(8)
QLFT_RC_RW(16)
#undef QLFT_RC_RW

// Atomics: done (sequentially consistent, at least as strong as asked), not recorded.
#define QLFT_RC_ATOMIC(n, T)                                                                       \
  QLFT_RC_API T __tsan_atomic##n##_load(const volatile T* a, int) {                                \
    return __atomic_load_n(a, __ATOMIC_SEQ_CST);                                                   \
  }                                                                                                \
  QLFT_RC_API void __tsan_atomic##n##_store(volatile T* a, T v, int) {                             \
    __atomic_store_n(a, v, __ATOMIC_SEQ_CST);                                                      \
  }                                                                                                \
  QLFT_RC_API T __tsan_atomic##n##_exchange(volatile T* a, T v, int) {                             \
    return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST);                                            \
  }                                                                                                \
  QLFT_RC_API T __tsan_atomic##n##_fetch_add(volatile T* a, T v, int) {                            \
    return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST);                                             \
  }                                                                                                \
  QLFT_RC_API T __tsan_atomic##n##_fetch_sub(volatile T* a, T v, int) {                            \
    return __atomic_fetch_sub(a, v, __ATOMIC_SEQ_CST);                                             \
  }                                                                                                \
  QLFT_RC_API T __tsan_atomic##n##_fetch_and(volatile T* a, T v, int) {                            \
    return __atomic_fetch_and(a, v, __ATOMIC_SEQ_CST);                                             \
  }                                                                                                \
  QLFT_RC_API T __tsan_atomic##n##_fetch_or(volatile T* a, T v, int) {                             \
    return __atomic_fetch_or(a, v, __ATOMIC_SEQ_CST);                                              \
  }                                                                                                \
  QLFT_RC_API T __tsan_atomic##n##_fetch_xor(volatile T* a, T v, int) {                            \
    return __atomic_fetch_xor(a, v, __ATOMIC_SEQ_CST);                                             \
  }                                                                                                \
  QLFT_RC_API T __tsan_atomic##n##_fetch_nand(volatile T* a, T v, int) {                           \
    return __atomic_fetch_nand(a, v, __ATOMIC_SEQ_CST);                                            \
  }                                                                                                \
  QLFT_RC_API int __tsan_atomic##n##_compare_exchange_strong(volatile T* a, T* c, T v, int, int) { \
    return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);        \
  }                                                                                                \
  QLFT_RC_API int __tsan_atomic##n##_compare_exchange_weak(volatile T* a, T* c, T v, int, int) {   \
    return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);        \
  }                                                                                                \
  QLFT_RC_API T __tsan_atomic##n##_compare_exchange_val(volatile T* a, T c, T v, int, int) {       \
    __atomic_compare_exchange_n(a, &c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);              \
    return c;                                                                                      \
  }
QLFT_RC_ATOMIC(8, uint8_t)
QLFT_RC_ATOMIC(16, uint16_t)
QLFT_RC_ATOMIC(32, uint32_t)
QLFT_RC_ATOMIC(64, uint64_t)
#undef QLFT_RC_ATOMIC
QLFT_RC_API void __tsan_atomic_thread_fence(int) {
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
}
QLFT_RC_API void __tsan_atomic_signal_fence(int) {
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
}
