// The device side of the CUDA emulator (QLFT_CUDA_EMULATE): forced into every cuda/src/*.cu
// compiled as host C++ with g++/clang. Kernels run as fibers, one per CUDA thread, on one OS
// thread (cuda/emu/src/launch.cpp); this header gives them CUDA's built-ins.
//
// - threadIdx is the running fiber's; blockIdx/blockDim/gridDim the running block's.
// - `__shared__` variables are static objects in the section qlft_emu_shared: one object for
//   every fiber of a block, refilled with NaN bytes (0xff) before each block, so a read before
//   the write that a barrier should have ordered reads NaN. Blocks run one after another and
//   kernels one at a time (process-wide), so one object per variable is enough.
// - Dynamic shared memory (QLFT_DYNAMIC_SHARED in check.h) is a per-launch buffer of exactly the
//   requested size followed by a protected page, so a read one past it faults.
// - __syncthreads/__syncwarp/__shfl*_sync switch fibers; the lanes named by the mask meet and
//   exchange values as hardware does (emu_runtime.h, launch.cpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
// The bound is kept as the section of the kernel's code, which run_grid checks launches against.
#define __launch_bounds__(n, ...) __attribute__((section("qlft_emu_lb_" #n)))
#define __restrict__ __restrict
#define __shared__ static __attribute__((section("qlft_emu_shared")))
#define __constant__ static

struct uint3 {
  unsigned x, y, z;
};

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return uint3{x, y, z}; }
};

#if defined(__SANITIZE_THREAD__)
#define QLFT_EMU_RACECHECK_BUILT 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define QLFT_EMU_RACECHECK_BUILT 1
#endif
#endif
#ifndef QLFT_EMU_RACECHECK_BUILT
#define QLFT_EMU_RACECHECK_BUILT 0
#endif

namespace qlft_emu {

extern thread_local uint3 t_block_idx, t_block_dim, t_grid_dim;
const uint3& thread_idx();      // the running fiber's threadIdx
int lane_id();                  // linear thread index % 32
void sync_block();              // __syncthreads
void sync_warp(unsigned mask);  // __syncwarp
// Every lane in `mask` calls this with its value and the lane it reads; returns that lane's value.
uint64_t shfl(unsigned mask, uint64_t bits, int src_lane);
void* dynamic_shared();  // the launch's extern __shared__ buffer
[[noreturn]] void device_fault(const char* what);
// Site switches: QLFT_EMU_SKIP_SITE=file:line[,file:line...] makes the emulator leave out the
// synchronization (or load) at that source line, the file matched by its trailing path
// components (`reduce.cuh:26`, `cuda/src/k_quant.cu:103`), so tests/support/check_barriers.sh
// can show the suite fails without it. An intrinsic that can be switched off takes its call site
// as defaulted arguments (`const char* file = __builtin_FILE(), int line = __builtin_LINE()`,
// which GCC and clang evaluate at the caller, as std::source_location does) and does nothing
// when skip_site(file, line) says so. The first skip of a site is announced on stderr.
bool skip_site(const char* file, int line);
// Shared-memory race detection (cuda/emu/src/racecheck.cpp): on where the device code was built
// with the instrumentation (QLFT_EMU_RACECHECK_BUILT in that code) and QLFT_EMU_RACECHECK is not 0.
bool racecheck_enabled();

template <class T>
T shfl_typed(unsigned mask, T v, int src) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shfl of a wide type");
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  b = shfl(mask, b, src);
  T r;
  std::memcpy(&r, &b, sizeof(T));
  return r;
}

}  // namespace qlft_emu

#define threadIdx (::qlft_emu::thread_idx())
#define blockIdx (::qlft_emu::t_block_idx)
#define blockDim (::qlft_emu::t_block_dim)
#define gridDim (::qlft_emu::t_grid_dim)
constexpr int warpSize = 32;

// Both take their call site (see skip_site) so one barrier can be switched off by its file:line.
inline void __syncthreads(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  if (!qlft_emu::skip_site(file, line)) qlft_emu::sync_block();
}
inline void __syncwarp(unsigned mask = 0xffffffffu, const char* file = __builtin_FILE(),
                       int line = __builtin_LINE()) {
  if (!qlft_emu::skip_site(file, line)) qlft_emu::sync_warp(mask);
}
inline void __threadfence() {
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
}
inline void __threadfence_block() {
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

// Shuffles (width a power of two <= 32, lanes grouped in segments of `width`, as documented).
template <class T>
T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
  const int lane = qlft_emu::lane_id();
  return qlft_emu::shfl_typed(mask, v, (lane & ~(width - 1)) + (src & (width - 1)));
}
template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  const int lane = qlft_emu::lane_id(), s = lane ^ lane_mask;
  return qlft_emu::shfl_typed(mask, v, s >= ((lane / width) + 1) * width ? lane : s);
}
template <class T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  const int lane = qlft_emu::lane_id(), s = lane + int(delta);
  return qlft_emu::shfl_typed(mask, v, s >= ((lane / width) + 1) * width ? lane : s);
}
template <class T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  const int lane = qlft_emu::lane_id(), s = lane - int(delta);
  return qlft_emu::shfl_typed(mask, v, s < (lane / width) * width ? lane : s);
}

// Atomics. Blocks and their fibers run on one OS thread, so these need no hardware atomics;
// they are written with __atomic builtins anyway so a later multi-threaded grid stays correct.
#define QLFT_EMU_ATOMIC_INT(T)                                                                  \
  inline T atomicAdd(T* p, T v) {                                                               \
    return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);                                          \
  }                                                                                             \
  inline T atomicSub(T* p, T v) {                                                               \
    return __atomic_fetch_sub(p, v, __ATOMIC_SEQ_CST);                                          \
  }                                                                                             \
  inline T atomicAnd(T* p, T v) {                                                               \
    return __atomic_fetch_and(p, v, __ATOMIC_SEQ_CST);                                          \
  }                                                                                             \
  inline T atomicOr(T* p, T v) {                                                                \
    return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST);                                           \
  }                                                                                             \
  inline T atomicXor(T* p, T v) {                                                               \
    return __atomic_fetch_xor(p, v, __ATOMIC_SEQ_CST);                                          \
  }                                                                                             \
  inline T atomicExch(T* p, T v) {                                                              \
    return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST);                                         \
  }                                                                                             \
  inline T atomicCAS(T* p, T cmp, T v) {                                                        \
    __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);         \
    return cmp;                                                                                 \
  }                                                                                             \
  inline T atomicMax(T* p, T v) {                                                               \
    T o = *p;                                                                                   \
    while (o < v &&                                                                             \
           !__atomic_compare_exchange_n(p, &o, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) { \
    }                                                                                           \
    return o;                                                                                   \
  }                                                                                             \
  inline T atomicMin(T* p, T v) {                                                               \
    T o = *p;                                                                                   \
    while (v < o &&                                                                             \
           !__atomic_compare_exchange_n(p, &o, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) { \
    }                                                                                           \
    return o;                                                                                   \
  }
QLFT_EMU_ATOMIC_INT(int)
QLFT_EMU_ATOMIC_INT(unsigned)
QLFT_EMU_ATOMIC_INT(unsigned long long)
QLFT_EMU_ATOMIC_INT(long long)
#undef QLFT_EMU_ATOMIC_INT

template <class F>
inline F qlft_emu_atomic_add_fp(F* p, F v) {
  F o = *p, n;
  do {
    n = o + v;
  } while (!__atomic_compare_exchange(p, &o, &n, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST));
  return o;
}
inline float atomicAdd(float* p, float v) {
  return qlft_emu_atomic_add_fp(p, v);
}
inline double atomicAdd(double* p, double v) {
  return qlft_emu_atomic_add_fp(p, v);
}

// Device math. Host libm where CUDA has a correctly rounded or documented-ulp equivalent; the
// fast intrinsics (__expf, ...) are the accurate host functions (the GPU's are less accurate,
// see docs/ARCHITECTURE.md "CUDA emulator").
inline float rsqrtf(float x) {
  return 1.f / std::sqrt(x);
}
inline double rsqrt(double x) {
  return 1.0 / std::sqrt(x);
}
inline float __expf(float x) {
  return std::exp(x);
}
inline float __logf(float x) {
  return std::log(x);
}
inline float __sinf(float x) {
  return std::sin(x);
}
inline float __cosf(float x) {
  return std::cos(x);
}
inline float __powf(float a, float b) {
  return std::pow(a, b);
}
inline float __fdividef(float a, float b) {
  return a / b;
}
inline float __frcp_rn(float a) {
  return 1.f / a;
}
inline float __fsqrt_rn(float a) {
  return std::sqrt(a);
}
inline float __fmul_rn(float a, float b) {
  return a * b;
}
inline float __fadd_rn(float a, float b) {
  return a + b;
}
inline float __fsub_rn(float a, float b) {
  return a - b;
}
inline float __fdiv_rn(float a, float b) {
  return a / b;
}
inline float __fmaf_rn(float a, float b, float c) {
  return std::fma(a, b, c);
}
inline double __dmul_rn(double a, double b) {
  return a * b;
}
inline double __dadd_rn(double a, double b) {
  return a + b;
}
inline float __saturatef(float x) {
  return x < 0.f ? 0.f : (x > 1.f ? 1.f : (x == x ? x : 0.f));
}
inline float __int_as_float(int i) {
  float f;
  std::memcpy(&f, &i, 4);
  return f;
}
inline int __float_as_int(float f) {
  int i;
  std::memcpy(&i, &f, 4);
  return i;
}
inline unsigned __float_as_uint(float f) {
  unsigned i;
  std::memcpy(&i, &f, 4);
  return i;
}
inline float __uint_as_float(unsigned i) {
  float f;
  std::memcpy(&f, &i, 4);
  return f;
}
inline int __popc(unsigned x) {
  return __builtin_popcount(x);
}
inline int __popcll(unsigned long long x) {
  return __builtin_popcountll(x);
}
inline int __clz(int x) {
  return x == 0 ? 32 : __builtin_clz(unsigned(x));
}
inline int __ffs(int x) {
  return __builtin_ffs(x);
}
template <class T>
inline T __ldg(const T* p) {
  return *p;
}

// CUDA's global min/max overloads for the integer and float types.
#define QLFT_EMU_MINMAX(T) \
  inline T min(T a, T b) { \
    return b < a ? b : a;  \
  }                        \
  inline T max(T a, T b) { \
    return a < b ? b : a;  \
  }
QLFT_EMU_MINMAX(int)
QLFT_EMU_MINMAX(unsigned)
QLFT_EMU_MINMAX(long)
QLFT_EMU_MINMAX(unsigned long)
QLFT_EMU_MINMAX(long long)
QLFT_EMU_MINMAX(unsigned long long)
#undef QLFT_EMU_MINMAX
inline float min(float a, float b) {
  return std::fmin(a, b);
}
inline float max(float a, float b) {
  return std::fmax(a, b);
}
inline double min(double a, double b) {
  return std::fmin(a, b);
}
inline double max(double a, double b) {
  return std::fmax(a, b);
}
