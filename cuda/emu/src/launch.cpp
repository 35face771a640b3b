// Grid execution for the CUDA emulator: every CUDA thread of a block is a fiber (ucontext) on the
// launching OS thread; blocks run one after another; kernels one at a time (device_lock).
//
// Bug-finding schedule: between two synchronization points the runnable fibers of a block run
// in an order picked per pass by QLFT_EMU_SCHEDULE (forward | reverse | random, default random;
// QLFT_EMU_SEED fixes the random stream, otherwise it is drawn per process and printed with
// every finding). Static __shared__ variables and the dynamic shared buffer are filled with 0xff
// (NaN for float/double) before each block. Launch limits are H100's: 1024 threads per block,
// block.z <= 64, grid.y/z <= 65535, 48 KiB of dynamic shared memory unless
// cudaFuncSetAttribute raised it (up to 227 KiB), and __launch_bounds__ (kept in the section
// name of the kernel's code, see qlft_emu_device.h).
#include <sys/mman.h>
#include <ucontext.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "emu_internal.h"

// Under AddressSanitizer every switch between the scheduler's stack and a fiber's is announced
// (__sanitizer_{start,finish}_switch_fiber), so ASan knows which stack is live (an exception
// thrown on a fiber stack, or its no-return handling, otherwise sees a "stack" of gigabytes),
// and a stack handed to a new fiber is unpoisoned first: an abandoned fiber (a fault, the grid
// stopped) leaves its frames' redzones poisoned in the shadow, which the next kernel's frames on
// the same stack would hit as false stack-buffer-overflows.
#if defined(__SANITIZE_ADDRESS__)
#define QLFT_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define QLFT_EMU_ASAN 1
#endif
#endif
#if QLFT_EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

// Bounds of the static __shared__ section and of the kernels' __launch_bounds__ sections
// (provided by the linker; weak so a module without any stays linkable).
extern "C" {
extern char __start_qlft_emu_shared[] __attribute__((weak));
extern char __stop_qlft_emu_shared[] __attribute__((weak));
#define QLFT_EMU_LB(n)                                         \
  extern char __start_qlft_emu_lb_##n[] __attribute__((weak)); \
  extern char __stop_qlft_emu_lb_##n[] __attribute__((weak));
QLFT_EMU_LB(32)
QLFT_EMU_LB(64)
QLFT_EMU_LB(128)
QLFT_EMU_LB(256)
QLFT_EMU_LB(512)
QLFT_EMU_LB(1024)
#undef QLFT_EMU_LB
}

// Fiber switching. On x86-64 a minimal switch (callee-saved registers, MXCSR and the x87 control
// word; glibc's swapcontext also saves the signal mask with a system call on every switch, which
// made a 16M-thread grid take a minute). Elsewhere ucontext.
#if defined(__x86_64__)
extern "C" void qlft_emu_switch(void** save_sp, void* to_sp);
asm(R"(
  .text
  .globl qlft_emu_switch
  .hidden qlft_emu_switch
  .type qlft_emu_switch,@function
qlft_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size qlft_emu_switch, .-qlft_emu_switch
)");
#endif

namespace qlft_emu {

namespace {
#if defined(__x86_64__)
struct Ctx {
  void* sp = nullptr;
};
inline void ctx_switch(Ctx* from, Ctx* to) {
  qlft_emu_switch(&from->sp, to->sp);
}
void ctx_make(Ctx* c, char* stack, size_t bytes, void (*entry)()) {
  uintptr_t top = (reinterpret_cast<uintptr_t>(stack) + bytes) & ~uintptr_t(15);
  uint64_t* p = reinterpret_cast<uint64_t*>(top - 16);
  p[0] = reinterpret_cast<uint64_t>(entry);  // `ret` lands here with rsp % 16 == 8, as a call
  p[1] = 0;
  uint64_t* regs = p - 6;  // r15 r14 r13 r12 rbx rbp, popped in that order
  for (int i = 0; i < 6; ++i) regs[i] = 0;
  uint32_t* ctl = reinterpret_cast<uint32_t*>(regs - 1);
  ctl[0] = 0x1f80;  // MXCSR default
  ctl[1] = 0x037f;  // x87 control word default
  c->sp = regs - 1;
}
#else
struct Ctx {
  ucontext_t uc;
};
inline void ctx_switch(Ctx* from, Ctx* to) {
  swapcontext(&from->uc, &to->uc);
}
__attribute__((noinline)) void ctx_make(Ctx* c, char* stack, size_t bytes, void (*entry)()) {
  getcontext(&c->uc);
  c->uc.uc_stack.ss_sp = stack;
  c->uc.uc_stack.ss_size = bytes;
  c->uc.uc_link = nullptr;
  makecontext(&c->uc, entry, 0);
}
#endif
}  // namespace

thread_local uint3 t_block_idx, t_block_dim, t_grid_dim;

namespace {

enum class State { Runnable, AtBlockBarrier, AtWarpSync, Done };

struct Fiber {
  Ctx ctx;
  uint3 tid;
  int linear = 0;
  State st = State::Runnable;
  unsigned mask = 0;
  bool shuffle = false;  // at a shuffle (else __syncwarp)
  uint64_t bits = 0;     // value offered / value received
  int src = 0;
  int stack = -1;  // index into Grid::stacks once it first runs
};

constexpr size_t kStackBytes = 256 * 1024;

struct Grid {
  std::vector<Fiber> fibers;
  std::vector<char*> stacks;
  // Stacks not held by a started, unfinished fiber. A fiber takes one when it first runs and
  // gives it back when it ends, so a block whose threads never synchronize runs every thread on
  // the same (cache-warm) stack; the order the fibers run in is the schedule's either way.
  std::vector<int> free_stacks;
  Ctx sched;
  const void* sched_bottom = nullptr;  // the scheduler's stack, for ASan's switch annotations
  size_t sched_size = 0;
  const std::function<void()>* body = nullptr;
  std::string fault;
  void* dyn = nullptr;
  size_t dyn_bytes = 0;
};

thread_local Grid* t_grid = nullptr;
thread_local Fiber* t_fiber = nullptr;

// The two switches: scheduler -> fiber, and the running fiber -> scheduler (`last`: the fiber
// is never resumed, so ASan may drop its fake stack).
void to_fiber(Grid& g, Fiber& fb) {
#if QLFT_EMU_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, g.stacks[size_t(fb.stack)], kStackBytes);
#endif
  ctx_switch(&g.sched, &fb.ctx);
#if QLFT_EMU_ASAN
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}
void to_sched(bool last = false) {
  Grid& g = *t_grid;
#if QLFT_EMU_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(last ? nullptr : &fake, g.sched_bottom, g.sched_size);
#else
  (void)last;
#endif
  ctx_switch(&t_fiber->ctx, &g.sched);
#if QLFT_EMU_ASAN
  __sanitizer_finish_switch_fiber(fake, &g.sched_bottom, &g.sched_size);
#endif
}

enum class Order { Forward, Reverse, Random };
struct Schedule {
  Order order = Order::Random;
  uint64_t seed = 0;
  std::mt19937_64 rng;
  Schedule() {
    const char* o = std::getenv("QLFT_EMU_SCHEDULE");
    if (o && std::strcmp(o, "forward") == 0)
      order = Order::Forward;
    else if (o && std::strcmp(o, "reverse") == 0)
      order = Order::Reverse;
    else if (o && *o && std::strcmp(o, "random") != 0) {
      std::fprintf(stderr,
                   "qlft CUDA emulator: QLFT_EMU_SCHEDULE=%s is not forward, reverse or "
                   "random\n",
                   o);
      std::abort();
    }
    const char* s = std::getenv("QLFT_EMU_SEED");
    seed = s ? std::strtoull(s, nullptr, 10) : std::random_device{}();
    rng.seed(seed);
  }
};
Schedule& schedule() {
  static Schedule* s = new Schedule;
  return *s;
}

std::map<const void*, int>& max_dynamic_smem() {
  static std::map<const void*, int>* m = new std::map<const void*, int>;
  return *m;
}

// The __launch_bounds__ of a kernel: which lb section holds its code (0: none declared).
int launch_bound(const void* f) {
  const char* p = static_cast<const char*>(f);
  struct B {
    int n;
    const char *lo, *hi;
  } const bs[] = {{32, __start_qlft_emu_lb_32, __stop_qlft_emu_lb_32},
                  {64, __start_qlft_emu_lb_64, __stop_qlft_emu_lb_64},
                  {128, __start_qlft_emu_lb_128, __stop_qlft_emu_lb_128},
                  {256, __start_qlft_emu_lb_256, __stop_qlft_emu_lb_256},
                  {512, __start_qlft_emu_lb_512, __stop_qlft_emu_lb_512},
                  {1024, __start_qlft_emu_lb_1024, __stop_qlft_emu_lb_1024}};
  for (const B& b : bs)
    if (b.lo && p >= b.lo && p < b.hi) return b.n;
  return 0;
}

[[noreturn]] void fail_fiber(const std::string& what) {
  Grid* g = t_grid;
  if (g->fault.empty()) g->fault = what;
  to_sched(true);  // never resumed
  std::abort();
}

void fiber_entry() {
#if QLFT_EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &t_grid->sched_bottom, &t_grid->sched_size);
#endif
  (*t_grid->body)();
  t_fiber->st = State::Done;
  to_sched(true);
  std::abort();  // a finished fiber is never resumed
}

std::string where(const Fiber& f) {
  char b[160];
  std::snprintf(b, sizeof b, "block (%u,%u,%u) thread (%u,%u,%u)", t_block_idx.x, t_block_idx.y,
                t_block_idx.z, f.tid.x, f.tid.y, f.tid.z);
  return b;
}

char* stack_at(Grid& g, size_t i) {
  while (g.stacks.size() <= i) {
    void* m = mmap(nullptr, kStackBytes + 4096, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
      std::perror("qlft CUDA emulator: fiber stack");
      std::abort();
    }
    mprotect(m, 4096, PROT_NONE);  // guard page below the stack
    g.stacks.push_back(static_cast<char*>(m) + 4096);
  }
  return g.stacks[i];
}

// Releases warp groups whose lanes have all arrived; returns whether any was released, or sets
// g.fault for a group that can never complete.
bool release_warps(Grid& g, int nthreads) {
  bool any = false;
  for (int w0 = 0; w0 < nthreads; w0 += 32) {
    const int nl = std::min(32, nthreads - w0);
    for (int l = 0; l < nl; ++l) {
      Fiber& f = g.fibers[w0 + l];
      if (f.st != State::AtWarpSync) continue;
      bool complete = true;
      for (int m = 0; m < nl; ++m) {
        if (!(f.mask >> m & 1u)) continue;
        const Fiber& o = g.fibers[w0 + m];
        if (o.st == State::Done) {
          g.fault = where(f) + ": " + (f.shuffle ? "__shfl*_sync" : "__syncwarp") +
                    " with mask 0x" +
                    [&] {
                      char b[16];
                      std::snprintf(b, sizeof b, "%08x", f.mask);
                      return std::string(b);
                    }() +
                    " names lane " + std::to_string(m) + ", which has exited";
          return false;
        }
        if (o.st != State::AtWarpSync || o.mask != f.mask) complete = false;
      }
      if (!complete) continue;
      // Every lane of the mask is here: exchange (all reads see the values offered now).
      racecheck_warp_sync(w0, f.mask, nl);
      uint64_t offered[32];
      for (int m = 0; m < nl; ++m) offered[m] = g.fibers[w0 + m].bits;
      for (int m = 0; m < nl; ++m) {
        Fiber& o = g.fibers[w0 + m];
        if (!(f.mask >> m & 1u)) continue;
        if (o.shuffle != f.shuffle) {
          g.fault = where(o) +
                    ": lanes of one mask meet at different warp operations "
                    "(__syncwarp vs __shfl*_sync)";
          return false;
        }
        if (o.shuffle) {
          if (o.src < 0 || o.src >= nl || !(f.mask >> o.src & 1u)) {
            g.fault = where(o) + ": __shfl*_sync reads lane " + std::to_string(o.src) +
                      ", which is not in the mask (undefined on a GPU)";
            return false;
          }
          o.bits = offered[o.src];
        }
        o.st = State::Runnable;
      }
      any = true;
    }
  }
  return any;
}

}  // namespace

void set_schedule(const char* order, uint64_t seed) {
  std::lock_guard<std::recursive_mutex> g(device_lock());
  Schedule& s = schedule();
  const std::string o = order ? order : "";
  if (o == "forward")
    s.order = Order::Forward;
  else if (o == "reverse")
    s.order = Order::Reverse;
  else if (o == "random")
    s.order = Order::Random;
  else
    device_fault("set_schedule: order is not forward, reverse or random");
  s.seed = seed;
  s.rng.seed(seed);
}

std::string schedule_description() {
  Schedule& s = schedule();
  const char* o = s.order == Order::Forward   ? "forward"
                  : s.order == Order::Reverse ? "reverse"
                                              : "random";
  return std::string("QLFT_EMU_SCHEDULE=") + o + " QLFT_EMU_SEED=" + std::to_string(s.seed);
}

const uint3& thread_idx() {
  if (!t_fiber) device_fault("threadIdx read outside a kernel");
  return t_fiber->tid;
}

int lane_id() {
  return t_fiber->linear & 31;
}

void* dynamic_shared() {
  return t_grid->dyn;
}

void device_fault(const char* what) {
  if (!t_fiber) {
    std::fprintf(stderr, "qlft CUDA emulator: %s\n", what);
    std::abort();
  }
  fail_fiber(where(*t_fiber) + ": " + what);
}

void sync_block() {
  if (!t_fiber) device_fault("__syncthreads outside a kernel");
  t_fiber->st = State::AtBlockBarrier;
  to_sched();
}

void sync_warp(unsigned mask) {
  if (!t_fiber) device_fault("__syncwarp outside a kernel");
  if (!(mask >> lane_id() & 1u)) fail_fiber(where(*t_fiber) + ": __syncwarp mask omits the caller");
  t_fiber->st = State::AtWarpSync;
  t_fiber->mask = mask;
  t_fiber->shuffle = false;
  to_sched();
}

uint64_t shfl(unsigned mask, uint64_t bits, int src) {
  if (!t_fiber) device_fault("__shfl_sync outside a kernel");
  if (!(mask >> lane_id() & 1u))
    fail_fiber(where(*t_fiber) + ": __shfl*_sync mask omits the caller");
  Fiber* f = t_fiber;
  f->st = State::AtWarpSync;
  f->mask = mask;
  f->shuffle = true;
  f->bits = bits;
  f->src = src;
  to_sched();
  return f->bits;
}

cudaError_t func_set_attribute(const void* f, cudaFuncAttribute a, int v) {
  std::lock_guard<std::recursive_mutex> g(device_lock());
  if (!f) {
    set_last_error(cudaErrorInvalidDeviceFunction);
    return cudaErrorInvalidDeviceFunction;
  }
  if (a == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    const size_t stat = size_t(__stop_qlft_emu_shared - __start_qlft_emu_shared);
    if (v < 0 || size_t(v) + (__start_qlft_emu_shared ? 0 : 0) > kSharedOptinLimit ||
        size_t(v) + std::min(stat, kStaticSharedLimit) > kSharedOptinLimit) {
      report(cudaErrorInvalidValue, "cudaFuncSetAttribute(MaxDynamicSharedMemorySize, " +
                                        std::to_string(v) + ") exceeds the device's 227 KiB");
      return cudaErrorInvalidValue;
    }
    max_dynamic_smem()[f] = v;
    return cudaSuccess;
  }
  if (a == cudaFuncAttributePreferredSharedMemoryCarveout) return cudaSuccess;
  report(cudaErrorInvalidValue, "cudaFuncSetAttribute: attribute not emulated");
  return cudaErrorInvalidValue;
}

cudaError_t func_get_attributes(cudaFuncAttributes* attr, const void* f) {
  if (!attr || !f) {
    set_last_error(cudaErrorInvalidDeviceFunction);
    return cudaErrorInvalidDeviceFunction;
  }
  std::lock_guard<std::recursive_mutex> g(device_lock());
  std::memset(attr, 0, sizeof *attr);
  const int lb = launch_bound(f);
  attr->maxThreadsPerBlock = lb ? lb : kMaxThreadsPerBlock;
  attr->numRegs = 32;
  attr->ptxVersion = 90;
  attr->binaryVersion = 90;
  auto it = max_dynamic_smem().find(f);
  attr->maxDynamicSharedSizeBytes = it != max_dynamic_smem().end() ? it->second : 48 * 1024;
  return cudaSuccess;
}

void run_grid(const void* f, dim3 grid, dim3 block, size_t smem, cudaStream_t s,
              const std::function<void()>& body) {
  std::lock_guard<std::recursive_mutex> lk(device_lock());
  if (!stream_is_valid(s))
    return report(cudaErrorInvalidResourceHandle, "launch on a destroyed stream");
  const unsigned long long nthreads = 1ull * block.x * block.y * block.z;
  const int lb = launch_bound(f);
  char cfg[160];
  std::snprintf(cfg, sizeof cfg, "grid (%u,%u,%u) block (%u,%u,%u) dynamic smem %zu", grid.x,
                grid.y, grid.z, block.x, block.y, block.z, smem);
  if (nthreads == 0 || nthreads > unsigned(kMaxThreadsPerBlock) || block.x > 1024 ||
      block.y > 1024 || block.z > 64 || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
      grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535)
    return report(cudaErrorInvalidConfiguration, std::string("launch ") + cfg);
  if (lb && nthreads > unsigned(lb))
    return report(cudaErrorInvalidConfiguration, std::string("launch ") + cfg +
                                                     " exceeds the kernel's __launch_bounds__(" +
                                                     std::to_string(lb) + ")");
  auto it = max_dynamic_smem().find(f);
  const size_t smem_max = it != max_dynamic_smem().end() ? size_t(it->second) : kStaticSharedLimit;
  if (smem > smem_max)
    return report(cudaErrorInvalidValue,
                  std::string("launch ") + cfg + " asks more dynamic shared memory than the " +
                      std::to_string(smem_max) + " bytes allowed (cudaFuncSetAttribute)");
  const size_t stat = size_t(__stop_qlft_emu_shared - __start_qlft_emu_shared);
  if (stat > kStaticSharedLimit)
    return report(cudaErrorInvalidConfiguration,
                  "the static __shared__ variables exceed 48 KiB: " + std::to_string(stat));

  cudaError_t ce = cudaSuccess;  // recorded: replayed with the arguments `body` owns
  if (captured(
          s, Api::Kernel, f,
          [=](cudaStream_t r) {
            run_grid(f, grid, block, smem, r, body);
            return cudaPeekAtLastError();
          },
          &ce))
    return;
  count_api(s, Api::Kernel, f);
  static Grid* gp = new Grid;
  Grid& g = *gp;
  g.fibers.assign(nthreads, Fiber{});
  g.body = &body;
  g.fault.clear();
  // Dynamic shared memory: exactly `smem` bytes (16-aligned) ending at a PROT_NONE page. One
  // mapping, grown when a launch needs more, serves every launch (right-aligned in it).
  const size_t dyn_round = (smem + 15) & ~size_t(15);
  const size_t dyn_pages = (dyn_round + 4095) / 4096 * 4096;
  static char* dm = nullptr;
  static size_t dm_pages = 0;
  if (!dm || dyn_pages > dm_pages) {
    if (dm) munmap(dm, dm_pages + 4096);
    dm = static_cast<char*>(mmap(nullptr, dyn_pages + 4096, PROT_READ | PROT_WRITE,
                                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (dm == MAP_FAILED) {
      dm = nullptr;
      return report(cudaErrorMemoryAllocation, "dynamic shared memory");
    }
    dm_pages = dyn_pages;
    mprotect(dm + dm_pages, 4096, PROT_NONE);
  }
  g.dyn = dm + dm_pages - dyn_round;
  g.dyn_bytes = dyn_round;
  set_shared_guard(dm + dm_pages, smem);
  racecheck_launch(f, g.dyn, smem, int(nthreads));

  Schedule& sch = schedule();
  DeviceOpen open;
  t_grid = &g;
  t_grid_dim = grid;
  t_block_dim = block;
  std::vector<int> order(nthreads);
  for (unsigned bz = 0; bz < grid.z && g.fault.empty(); ++bz)
    for (unsigned by = 0; by < grid.y && g.fault.empty(); ++by)
      for (unsigned bx = 0; bx < grid.x && g.fault.empty(); ++bx) {
        t_block_idx = uint3{bx, by, bz};
        if (stat) std::memset(__start_qlft_emu_shared, 0xff, stat);
        if (smem) std::memset(g.dyn, 0xff, dyn_round);
        racecheck_block();
        for (unsigned i = 0; i < nthreads; ++i) {
          Fiber& fb = g.fibers[i];
          fb = Fiber{};
          fb.linear = int(i);
          fb.tid =
              uint3{i % block.x, (i / block.x) % block.y, unsigned(i / (1ull * block.x * block.y))};
        }
        g.free_stacks.clear();
        for (size_t i = g.stacks.size(); i-- > 0;) g.free_stacks.push_back(int(i));
        for (;;) {
          for (unsigned i = 0; i < nthreads; ++i) order[i] = int(i);
          if (sch.order == Order::Reverse) std::reverse(order.begin(), order.end());
          if (sch.order == Order::Random) std::shuffle(order.begin(), order.end(), sch.rng);
          for (int i : order) {
            Fiber& fb = g.fibers[i];
            if (fb.st != State::Runnable) continue;
            if (fb.stack < 0) {  // first run: a stack no live fiber holds
              if (g.free_stacks.empty()) {
                stack_at(g, g.stacks.size());
                g.free_stacks.push_back(int(g.stacks.size() - 1));
              }
              fb.stack = g.free_stacks.back();
              g.free_stacks.pop_back();
#if QLFT_EMU_ASAN
              ASAN_UNPOISON_MEMORY_REGION(g.stacks[size_t(fb.stack)], kStackBytes);
#endif
              ctx_make(&fb.ctx, g.stacks[size_t(fb.stack)], kStackBytes, fiber_entry);
            }
            t_fiber = &fb;
            racecheck_enter(i);
            to_fiber(g, fb);  // runs until its next sync point or its end
            racecheck_enter(-1);
            t_fiber = nullptr;
            if (fb.st == State::Done) g.free_stacks.push_back(fb.stack);
            if (!g.fault.empty()) break;
          }
          if (!g.fault.empty()) break;
          if (release_warps(g, int(nthreads))) continue;
          if (!g.fault.empty()) break;
          size_t done = 0, at_bar = 0;
          for (const Fiber& fb : g.fibers) {
            done += fb.st == State::Done;
            at_bar += fb.st == State::AtBlockBarrier;
          }
          if (done == nthreads) break;
          if (done + at_bar == nthreads) {  // exited threads count as arrived, as on hardware
            racecheck_barrier();
            for (Fiber& fb : g.fibers)
              if (fb.st == State::AtBlockBarrier) fb.st = State::Runnable;
            continue;
          }
          // Nothing can run: some threads wait at __syncthreads, others at a warp operation.
          std::string who;
          for (const Fiber& fb : g.fibers)
            if (fb.st == State::AtWarpSync) {
              who = where(fb) +
                    " waits at a warp operation while other threads wait at "
                    "__syncthreads";
              break;
            }
          g.fault = "deadlock: " + who;
          break;
        }
      }
  t_grid = nullptr;
  racecheck_end();
  set_shared_guard(nullptr, 0);
  if (!g.fault.empty())
    return report(cudaErrorLaunchFailure, std::string("kernel ") + cfg + ": " + g.fault);
}

}  // namespace qlft_emu
