// The emulated device memory: a protected arena in which every allocation sits before a guard
// page and is opened only while device work runs (protection keys, else mprotect), the fault
// handler that names what a stray access hit, managed memory, and the copies and fills that check
// direction and extent against the allocation table.
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "emu_internal.h"

namespace qlft_emu {

namespace {

constexpr size_t kPage = 4096;
constexpr size_t kArenaBytes = size_t(160) << 30;  // virtual; pages exist only while allocated

struct Alloc {
  uintptr_t region;     // first page
  size_t region_bytes;  // pages holding the allocation (the guard page follows)
  uintptr_t p;          // what cudaMalloc returned (right-aligned against the guard page)
  size_t bytes;
  bool freed;
};

struct Arena {
  uintptr_t base = 0, next = 0, end = 0;
  size_t live_bytes = 0;
  int open = 0;
  std::map<uintptr_t, Alloc> by_p;  // every allocation ever made, freed ones included
  std::set<uintptr_t> live;         // user pointers of live allocations
  std::map<uintptr_t, size_t> managed;
  // Where each 4 KiB page of a managed allocation is: -1 the host (where it starts), else the
  // device it was last prefetched to. Only prefetches move pages here (no fault migration).
  std::map<uintptr_t, std::vector<int8_t>> managed_pages;
  ManagedPrefetchStats prefetch_stats;
};

Arena& arena() {
  static Arena* a = nullptr;
  if (!a) {
    a = new Arena;
    void* m =
        mmap(nullptr, kArenaBytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
      std::fprintf(stderr, "qlft CUDA emulator: cannot reserve the device arena\n");
      std::abort();
    }
    a->base = a->next = reinterpret_cast<uintptr_t>(m);
    a->end = a->base + kArenaBytes;
  }
  return *a;
}

const Alloc* find_alloc(uintptr_t x) {
  Arena& a = arena();
  auto it = a.by_p.upper_bound(x);
  if (it == a.by_p.begin()) return nullptr;
  --it;
  const Alloc& al = it->second;
  if (x >= al.region && x < al.region + al.region_bytes + kPage) return &al;
  return nullptr;
}

struct sigaction g_prev_segv;
std::atomic<bool> g_handler_installed{false};

int g_pkey = -2;                       // device_pkey(): -2 not decided yet, -1 mprotect mode
thread_local bool t_key_open = false;  // this thread holds the key open

std::atomic<uintptr_t> g_guard{0};
std::atomic<size_t> g_guard_smem{0};

void segv_handler(int sig, siginfo_t* si, void* ctx) {
  const uintptr_t x = reinterpret_cast<uintptr_t>(si->si_addr);
  Arena& a = arena();
  const uintptr_t gd = g_guard.load();
  if (gd && x >= gd && x < gd + kPage) {
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "qlft CUDA emulator: device code touched %zu bytes past the end of the launch's "
                  "dynamic shared memory (%zu bytes)\n",
                  size_t(x - gd), g_guard_smem.load());
    ssize_t w = write(2, buf, std::strlen(buf));
    (void)w;
    signal(SIGSEGV, SIG_DFL);
    return;
  }
  if (x >= a.base && x < a.end) {
    char buf[512];
    const Alloc* al = find_alloc(x);
    // Under a protection key only the thread that opened it runs device work.
    const bool dev = g_pkey >= 0 ? t_key_open : a.open > 0;
    const char* where = dev ? "device code (a kernel, copy or GEMM)" : "host code";
    if (!al)
      std::snprintf(buf, sizeof buf,
                    "qlft CUDA emulator: %s touched device address %p, which no allocation "
                    "covers\n",
                    where, si->si_addr);
    else if (al->freed)
      std::snprintf(buf, sizeof buf,
                    "qlft CUDA emulator: %s touched device address %p inside an allocation of "
                    "%zu bytes at %p that was freed (use after free)\n",
                    where, si->si_addr, al->bytes, reinterpret_cast<void*>(al->p));
    else if (x >= al->p + al->bytes)
      std::snprintf(buf, sizeof buf,
                    "qlft CUDA emulator: %s touched device address %p, %zu bytes past the end of "
                    "an allocation of %zu bytes at %p (out of bounds)\n",
                    where, si->si_addr, size_t(x - (al->p + al->bytes)), al->bytes,
                    reinterpret_cast<void*>(al->p));
    else
      std::snprintf(buf, sizeof buf,
                    "qlft CUDA emulator: host code dereferenced device pointer %p (allocation of "
                    "%zu bytes at %p); device memory is only reachable through kernels and "
                    "cudaMemcpy\n",
                    si->si_addr, al->bytes, reinterpret_cast<void*>(al->p));
    ssize_t w = write(2, buf, std::strlen(buf));
    (void)w;
    signal(SIGSEGV, SIG_DFL);  // return and fault again: the default action (core) follows
    return;
  }
  if (g_prev_segv.sa_flags & SA_SIGINFO) {
    if (g_prev_segv.sa_sigaction) return g_prev_segv.sa_sigaction(sig, si, ctx);
  } else if (g_prev_segv.sa_handler != SIG_DFL && g_prev_segv.sa_handler != SIG_IGN) {
    return g_prev_segv.sa_handler(sig);
  }
  signal(SIGSEGV, SIG_DFL);
}

void install_handler() {
  if (g_handler_installed.exchange(true)) return;
  struct sigaction sa {};
  sa.sa_sigaction = segv_handler;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, &g_prev_segv);
}

void protect(const Alloc& al, int prot) {
  if (mprotect(reinterpret_cast<void*>(al.region), al.region_bytes, prot) != 0) {
    std::perror("qlft CUDA emulator: mprotect");
    std::abort();
  }
}

// Opening and closing device memory. With x86 protection keys (PKU; Linux, glibc >= 2.27) every
// live allocation is mapped read/write once, tagged with one key, and opened or closed by
// changing the key's rights in this thread's PKRU register: no system call and no page-table
// walk. Without them (or QLFT_EMU_PKEYS=0) each live allocation is mprotect-ed open and closed
// again, which took half the emulated training step's time. The key also confines device access
// to the thread running the device work: another host thread touching device memory meanwhile
// faults, where mprotect would have let it through. Threads start with every key but 0 denied
// (Linux's default PKRU), and pkey_alloc grants the caller the rights it is given (none).
int device_pkey() {
  if (g_pkey == -2) {
    const char* e = std::getenv("QLFT_EMU_PKEYS");
    g_pkey = e && std::strcmp(e, "0") == 0 ? -1 : pkey_alloc(0, PKEY_DISABLE_ACCESS);
    if (g_pkey < 0) g_pkey = -1;
  }
  return g_pkey;
}
void set_key_open(bool open) {
  t_key_open = open;
  if (pkey_set(g_pkey, open ? 0 : PKEY_DISABLE_ACCESS) != 0) {
    std::perror("qlft CUDA emulator: pkey_set");
    std::abort();
  }
}
// A live allocation's pages: readable and writable under the key, or opened / closed by mprotect.
void map_live(const Alloc& al) {
  if (device_pkey() >= 0) {
    if (pkey_mprotect(reinterpret_cast<void*>(al.region), al.region_bytes, PROT_READ | PROT_WRITE,
                      g_pkey) != 0) {
      std::perror("qlft CUDA emulator: pkey_mprotect");
      std::abort();
    }
  } else {
    protect(al, PROT_READ | PROT_WRITE);
  }
}

// Opens only the allocations a copy or memset touches (opening every live allocation per copy
// made the training step spend its time in mprotect).
class RangeOpen {
 public:
  RangeOpen(const void* a, const void* b) {
    if (arena().open) return;  // inside an open region already
    if (device_pkey() >= 0) {  // the key opens everything at no cost (the extents are checked)
      set_key_open(true);
      keyed_ = true;
      return;
    }
    for (const void* p : {a, b}) {
      if (!p || !is_device(p)) continue;
      const Alloc* x = find_alloc(reinterpret_cast<uintptr_t>(p));
      if (!x || x->freed || (n_ == 1 && open_[0] == x)) continue;
      protect(*x, PROT_READ | PROT_WRITE);
      open_[n_++] = x;
    }
  }
  ~RangeOpen() {
    if (keyed_) set_key_open(false);
    for (int i = 0; i < n_; ++i) protect(*open_[i], PROT_NONE);
  }
  RangeOpen(const RangeOpen&) = delete;
  RangeOpen& operator=(const RangeOpen&) = delete;

 private:
  const Alloc* open_[2] = {nullptr, nullptr};
  int n_ = 0;
  bool keyed_ = false;
};

cudaError_t ret(cudaError_t e) {
  if (e != cudaSuccess) set_last_error(e);
  return e;
}

bool on_host(const void* p, size_t n) {
  return !is_device(p) || is_managed(p, n);
}
bool on_device(const void* p, size_t n) {
  return check_device_range(p, n).empty() || is_managed(p, n);
}

cudaError_t copy_check(void* dst, size_t dbytes, const void* src, size_t sbytes,
                       cudaMemcpyKind kind) {
  const size_t bytes = dbytes;
  bool ok = true;
  const char* why = "";
  switch (kind) {
    case cudaMemcpyHostToDevice:
      ok = on_host(src, sbytes) && on_device(dst, bytes);
      why = "cudaMemcpyHostToDevice needs a host source and a device destination";
      break;
    case cudaMemcpyDeviceToHost:
      ok = on_device(src, sbytes) && on_host(dst, bytes);
      why = "cudaMemcpyDeviceToHost needs a device source and a host destination";
      break;
    case cudaMemcpyDeviceToDevice:
      ok = on_device(src, sbytes) && on_device(dst, bytes);
      why = "cudaMemcpyDeviceToDevice needs device source and destination";
      break;
    case cudaMemcpyHostToHost:
      ok = on_host(src, sbytes) && on_host(dst, bytes);
      why = "cudaMemcpyHostToHost needs host source and destination";
      break;
    case cudaMemcpyDefault:
      ok = (on_host(src, sbytes) || on_device(src, sbytes)) &&
           (on_host(dst, bytes) || on_device(dst, bytes));
      why = "cudaMemcpyDefault: a pointer is neither host memory nor a live device range";
      break;
    default:
      report(cudaErrorInvalidMemcpyDirection, "unknown cudaMemcpyKind");
      return cudaErrorInvalidMemcpyDirection;
  }
  if (!ok) {
    std::string d = is_device(dst) ? check_device_range(dst, bytes) : "";
    std::string s = is_device(src) ? check_device_range(src, sbytes) : "";
    report(cudaErrorInvalidValue,
           std::string(why) + " (" + std::to_string(bytes) + " bytes; dst " +
               (is_device(dst) ? "device" : "host") + (d.empty() ? "" : ": " + d) + ", src " +
               (is_device(src) ? "device" : "host") + (s.empty() ? "" : ": " + s) + ")");
    return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

}  // namespace

bool is_device(const void* p) {
  const uintptr_t x = reinterpret_cast<uintptr_t>(p);
  Arena& a = arena();
  return x >= a.base && x < a.end;
}

bool is_managed(const void* p, size_t bytes) {
  std::lock_guard<std::recursive_mutex> g(device_lock());
  Arena& a = arena();
  const uintptr_t x = reinterpret_cast<uintptr_t>(p);
  auto it = a.managed.upper_bound(x);
  if (it == a.managed.begin()) return false;
  --it;
  return x >= it->first && x + bytes <= it->first + it->second;
}

std::string check_device_range(const void* p, size_t bytes) {
  std::lock_guard<std::recursive_mutex> g(device_lock());
  const uintptr_t x = reinterpret_cast<uintptr_t>(p);
  if (!is_device(p)) return "not a device pointer";
  const Alloc* al = find_alloc(x);
  char buf[256];
  if (!al || x < al->p) {
    std::snprintf(buf, sizeof buf, "%p is not inside any device allocation", p);
    return buf;
  }
  if (al->freed) {
    std::snprintf(buf, sizeof buf, "%p is inside a freed allocation of %zu bytes at %p", p,
                  al->bytes, reinterpret_cast<void*>(al->p));
    return buf;
  }
  if (x + bytes > al->p + al->bytes) {
    std::snprintf(
        buf, sizeof buf, "[%p, +%zu) runs %zu bytes past the allocation of %zu bytes at %p", p,
        bytes, size_t(x + bytes - (al->p + al->bytes)), al->bytes, reinterpret_cast<void*>(al->p));
    return buf;
  }
  return "";
}

void open_device_memory() {
  std::lock_guard<std::recursive_mutex> g(device_lock());
  Arena& a = arena();
  if (a.open++ > 0) return;
  if (device_pkey() >= 0) return set_key_open(true);
  for (uintptr_t p : a.live) protect(a.by_p.at(p), PROT_READ | PROT_WRITE);
}

void close_device_memory() {
  std::lock_guard<std::recursive_mutex> g(device_lock());
  Arena& a = arena();
  if (--a.open > 0) return;
  if (device_pkey() >= 0) return set_key_open(false);
  for (uintptr_t p : a.live) protect(a.by_p.at(p), PROT_NONE);
}

void set_shared_guard(const void* guard, size_t smem_bytes) {
  install_handler();
  g_guard_smem = smem_bytes;
  g_guard = reinterpret_cast<uintptr_t>(guard);
}

}  // namespace qlft_emu

using namespace qlft_emu;

cudaError_t cudaMalloc(void** p, size_t bytes) {
  if (!p) return ret(cudaErrorInvalidValue);
  if (const cudaError_t e = unsafe_call("cudaMalloc")) return e;
  std::lock_guard<std::recursive_mutex> g(device_lock());
  install_handler();
  Arena& a = arena();
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;
  const size_t rounded = (bytes + 255) & ~size_t(255);
  const size_t pages = (rounded + kPage - 1) / kPage * kPage;
  if (a.live_bytes + rounded > kDeviceBytes || a.next + pages + kPage > a.end)
    return ret(cudaErrorMemoryAllocation);
  Alloc al{a.next, pages, a.next + pages - rounded, bytes, false};
  a.next += pages + kPage;
  a.by_p[al.p] = al;
  a.live.insert(al.p);
  a.live_bytes += rounded;
  // Fresh device memory is not zero on a GPU: fill it with a NaN pattern.
  map_live(al);
  if (device_pkey() >= 0) {
    if (!a.open) set_key_open(true);
    std::memset(reinterpret_cast<void*>(al.p), 0xff, bytes);
    if (!a.open) set_key_open(false);
  } else {
    std::memset(reinterpret_cast<void*>(al.p), 0xff, bytes);
    if (!a.open) protect(al, PROT_NONE);
  }
  *p = reinterpret_cast<void*>(al.p);
  return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  if (!p) return cudaSuccess;
  if (const cudaError_t e = unsafe_call("cudaFree")) return e;
  std::lock_guard<std::recursive_mutex> g(device_lock());
  Arena& a = arena();
  const uintptr_t x = reinterpret_cast<uintptr_t>(p);
  auto mit = a.managed.find(x);  // managed memory is freed by the same call on a GPU
  if (mit != a.managed.end()) {
    munmap(p, mit->second);
    a.managed.erase(mit);
    a.managed_pages.erase(x);
    return cudaSuccess;
  }
  auto it = a.by_p.find(x);
  if (it == a.by_p.end() || it->second.freed) {
    report(cudaErrorInvalidValue,
           std::string("cudaFree of ") + (it == a.by_p.end() ? "a pointer cudaMalloc did not return"
                                                             : "an already freed pointer"));
    return cudaErrorInvalidValue;
  }
  Alloc& al = it->second;
  protect(al, PROT_NONE);
  madvise(reinterpret_cast<void*>(al.region), al.region_bytes, MADV_DONTNEED);
  al.freed = true;
  a.live.erase(x);
  a.live_bytes -= (al.bytes + 255) & ~size_t(255);
  return cudaSuccess;
}

cudaError_t cudaMallocManaged(void** p, size_t bytes, unsigned flags) {
  if (!p || (flags != cudaMemAttachGlobal && flags != cudaMemAttachHost))
    return ret(cudaErrorInvalidValue);
  if (const cudaError_t e = unsafe_call("cudaMallocManaged")) return e;
  std::lock_guard<std::recursive_mutex> g(device_lock());
  *p = nullptr;
  if (bytes == 0) return ret(cudaErrorInvalidValue);
  void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return ret(cudaErrorMemoryAllocation);
  arena().managed[reinterpret_cast<uintptr_t>(m)] = bytes;
  arena().managed_pages[reinterpret_cast<uintptr_t>(m)].assign(
      (bytes + kManagedPage - 1) / kManagedPage, int8_t(-1));
  *p = m;
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_b, size_t* total_b) {
  if (!free_b || !total_b) return ret(cudaErrorInvalidValue);
  std::lock_guard<std::recursive_mutex> g(device_lock());
  *total_b = kDeviceBytes;
  *free_b = kDeviceBytes - arena().live_bytes;
  return cudaSuccess;
}

cudaError_t cudaMemAdvise(const void* p, size_t bytes, cudaMemoryAdvise advice,
                          cudaMemLocation loc) {
  if (!is_managed(p, bytes) || advice < cudaMemAdviseSetReadMostly ||
      advice > cudaMemAdviseUnsetAccessedBy)
    return ret(cudaErrorInvalidValue);
  if (loc.type == cudaMemLocationTypeDevice && (loc.id < 0 || loc.id >= device_count()))
    return ret(cudaErrorInvalidDevice);
  return cudaSuccess;
}

cudaError_t cudaMemPrefetchAsync(const void* p, size_t bytes, cudaMemLocation loc, unsigned flags,
                                 cudaStream_t s) {
  if (!is_managed(p, bytes) || flags != 0 || !stream_is_valid(s)) return ret(cudaErrorInvalidValue);
  if (loc.type == cudaMemLocationTypeDevice && (loc.id < 0 || loc.id >= device_count()))
    return ret(cudaErrorInvalidDevice);
  if (loc.type != cudaMemLocationTypeDevice && loc.type != cudaMemLocationTypeHost)
    return ret(cudaErrorInvalidValue);
  // Count what moves: the pages of [p, p + bytes) not yet where they are sent (a page counts
  // whole, clipped to the allocation), as the driver migrates whole pages. A graph's prefetch
  // node moves them at each replay.
  std::lock_guard<std::recursive_mutex> g(device_lock());
  cudaError_t ce = cudaSuccess;
  if (captured(
          s, Api::Event, nullptr,
          [=](cudaStream_t r) { return cudaMemPrefetchAsync(p, bytes, loc, flags, r); }, &ce))
    return ce;
  Arena& a = arena();
  const uintptr_t x = reinterpret_cast<uintptr_t>(p);
  auto it = a.managed.upper_bound(x);
  --it;  // is_managed found it
  std::vector<int8_t>& pages = a.managed_pages[it->first];
  const int8_t to = loc.type == cudaMemLocationTypeDevice ? int8_t(loc.id) : int8_t(-1);
  const size_t first = (x - it->first) / kManagedPage;
  const size_t last = bytes ? (x + bytes - 1 - it->first) / kManagedPage : first;
  a.prefetch_stats.requested_bytes += bytes;
  for (size_t i = first; bytes && i <= last; ++i) {
    if (pages[i] == to) continue;
    const size_t page_bytes = std::min(kManagedPage, it->second - i * kManagedPage);
    (to < 0 ? a.prefetch_stats.to_host_bytes : a.prefetch_stats.to_device_bytes) += page_bytes;
    pages[i] = to;
  }
  return cudaSuccess;
}

namespace qlft_emu {
ManagedPrefetchStats managed_prefetch_stats() {
  std::lock_guard<std::recursive_mutex> g(device_lock());
  return arena().prefetch_stats;
}
}  // namespace qlft_emu

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s) {
  if (bytes == 0) return cudaSuccess;
  if (!stream_is_valid(s)) return ret(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::recursive_mutex> g(device_lock());
  cudaError_t ce = cudaSuccess;
  if (captured(
          s, Api::Memcpy, nullptr,
          [=](cudaStream_t r) { return cudaMemcpyAsync(dst, src, bytes, kind, r); }, &ce))
    return ce;
  const cudaError_t e = copy_check(dst, bytes, src, bytes, kind);
  if (e != cudaSuccess) return e;
  RangeOpen open(dst, src);
  std::memmove(dst, src, bytes);
  count_api(s, Api::Memcpy);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (const cudaError_t e = unsafe_call("cudaMemcpy")) return e;
  return cudaMemcpyAsync(dst, src, bytes, kind, nullptr);
}

cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind kind, cudaStream_t s) {
  if (width == 0 || height == 0) return cudaSuccess;
  if (width > dpitch || width > spitch) return ret(cudaErrorInvalidValue);
  if (!stream_is_valid(s)) return ret(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::recursive_mutex> g(device_lock());
  cudaError_t ce = cudaSuccess;
  if (captured(
          s, Api::Memcpy, nullptr,
          [=](cudaStream_t r) {
            return cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, kind, r);
          },
          &ce))
    return ce;
  const cudaError_t e =
      copy_check(dst, dpitch * (height - 1) + width, src, spitch * (height - 1) + width, kind);
  if (e != cudaSuccess) return e;
  RangeOpen open(dst, src);
  for (size_t r = 0; r < height; ++r)
    std::memmove(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch,
                 width);
  count_api(s, Api::Memcpy);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t s) {
  if (bytes == 0) return cudaSuccess;
  if (!stream_is_valid(s)) return ret(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::recursive_mutex> g(device_lock());
  cudaError_t ce = cudaSuccess;
  if (captured(
          s, Api::Memset, nullptr,
          [=](cudaStream_t r) { return cudaMemsetAsync(p, value, bytes, r); }, &ce))
    return ce;
  if (!on_device(p, bytes)) {
    report(cudaErrorInvalidValue, "cudaMemset: " + check_device_range(p, bytes));
    return cudaErrorInvalidValue;
  }
  RangeOpen open(p, nullptr);
  std::memset(p, value, bytes);
  count_api(s, Api::Memset);
  return cudaSuccess;
}

cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  if (const cudaError_t e = unsafe_call("cudaMemset")) return e;
  return cudaMemsetAsync(p, value, bytes, nullptr);
}

cudaError_t cudaMemset2DAsync(void* p, size_t pitch, int value, size_t width, size_t height,
                              cudaStream_t s) {
  if (width == 0 || height == 0) return cudaSuccess;
  if (width > pitch) return ret(cudaErrorInvalidValue);
  if (!stream_is_valid(s)) return ret(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::recursive_mutex> g(device_lock());
  cudaError_t ce = cudaSuccess;
  if (captured(
          s, Api::Memset, nullptr,
          [=](cudaStream_t r) { return cudaMemset2DAsync(p, pitch, value, width, height, r); },
          &ce))
    return ce;
  const size_t extent = pitch * (height - 1) + width;
  if (!on_device(p, extent)) {
    report(cudaErrorInvalidValue, "cudaMemset2D: " + check_device_range(p, extent));
    return cudaErrorInvalidValue;
  }
  RangeOpen open(p, nullptr);
  for (size_t r = 0; r < height; ++r) std::memset(static_cast<char*>(p) + r * pitch, value, width);
  count_api(s, Api::Memset);
  return cudaSuccess;
}
