#include "backend/cpu/amx_gemm.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/cpu_isa.h"
#include "core/error.h"
#include "core/half.h"

namespace qlft::cpu {

namespace {

// Tiles: C blocks 0 1 / 2 3 (row block i, column block j: 2 i + j), A 4 5, B 6 7; every tile
// 16 rows of 64 bytes (palette 1).
constexpr int kRows = 16;
constexpr int kColsb = 64;

// The hardware tiles, in inline assembly: the instructions need only the assembler's AMX support,
// not a target attribute on every function that inlines them (GCC's intrinsics are this assembly;
// clang's are builtins that need the attribute). A tile number is an immediate operand printed
// bare (%c), so "%%tmm%c0" is the register of tile T. AT&T operand order: tdpbf16ps b, a, c
// computes c += a b. Loads and stores clobber memory so no buffer access moves across them.
struct AmxHw {
  template <int T>
  static inline __attribute__((always_inline)) void zero() {
    static_assert(T >= 0 && T < 4, "a C tile");
    __asm__ volatile("tilezero %%tmm%c0" ::"i"(T));
  }
  template <int T>
  static inline __attribute__((always_inline)) void load(const void* p, int64_t s) {
    static_assert(T >= 0 && T < 8, "a tile");
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm%c2" ::"r"(p), "r"(s), "i"(T) : "memory");
  }
  template <int T>
  static inline __attribute__((always_inline)) void store(void* p, int64_t s) {
    static_assert(T >= 0 && T < 4, "a C tile");
    __asm__ volatile("tilestored %%tmm%c2, (%0,%1,1)" ::"r"(p), "r"(s), "i"(T) : "memory");
  }
  // C tile 2 (a - 4) + (b - 6) += A tile a times B tile b.
  template <int A, int B>
  static inline __attribute__((always_inline)) void dp() {
    static_assert((A == 4 || A == 5) && (B == 6 || B == 7), "A tile 4 or 5, B tile 6 or 7");
    __asm__ volatile("tdpbf16ps %%tmm%c0, %%tmm%c1, %%tmm%c2" ::"i"(B), "i"(A),
                     "i"(2 * (A - 4) + (B - 6)));
  }
};

// The same six operations on memory (see amx_gemm.h).
struct AmxEmu {
  struct Tiles {
    alignas(64) uint8_t t[8][kRows][kColsb];
  };
  static Tiles& tiles() {
    thread_local Tiles x;
    return x;
  }
  template <int T>
  static void zero() {
    std::memset(tiles().t[T], 0, sizeof(tiles().t[T]));
  }
  template <int T>
  static void load(const void* p, int64_t stride) {
    for (int r = 0; r < kRows; ++r)
      std::memcpy(tiles().t[T][r], static_cast<const char*>(p) + r * stride, kColsb);
  }
  template <int T>
  static void store(void* p, int64_t stride) {
    for (int r = 0; r < kRows; ++r)
      std::memcpy(static_cast<char*>(p) + r * stride, tiles().t[T][r], kColsb);
  }
  static float in(uint16_t b) {  // a bf16 input, subnormals as zero
    return (b & 0x7f80) == 0 ? 0.f : bf16_to_f32(b);
  }
  static float flushed(float x) { return std::fabs(x) < 1.17549435e-38f ? 0.f * x : x; }
  template <int A, int B>
  static void dp() {
    constexpr int C = 2 * (A - 4) + (B - 6);
    Tiles& x = tiles();
    for (int m = 0; m < kRows; ++m) {
      float c[16];
      uint16_t a[32];
      std::memcpy(c, x.t[C][m], sizeof c);
      std::memcpy(a, x.t[A][m], sizeof a);
      for (int k = 0; k < kRows; ++k) {
        uint16_t b[32];
        std::memcpy(b, x.t[B][k], sizeof b);
        const float a0 = in(a[2 * k]), a1 = in(a[2 * k + 1]);
        for (int n = 0; n < 16; ++n) {
          // (each bf16 product is exact in fp32: with or without contraction, one rounding)
          c[n] = flushed(c[n] + a0 * in(b[2 * n]));
          c[n] = flushed(c[n] + a1 * in(b[2 * n + 1]));
        }
      }
      std::memcpy(x.t[C][m], c, sizeof c);
    }
  }
};

// One block of C of MT x NT tiles over k in [k0, k1).
template <class Ops, int MT, int NT>
inline __attribute__((always_inline)) void block(const uint16_t* A, int64_t lda, const uint16_t* B,
                                                 int64_t ldb, float* C, int64_t ldc, int64_t k0,
                                                 int64_t k1, bool load_c) {
  const int64_t sa = lda * 2, sb = ldb * 2, sc = ldc * 4;
  float* const c1 = C + kRows;
  float* const c2 = C + kRows * ldc;
  float* const c3 = c2 + kRows;
  if (load_c) {
    Ops::template load<0>(C, sc);
    if constexpr (NT > 1) Ops::template load<1>(c1, sc);
    if constexpr (MT > 1) Ops::template load<2>(c2, sc);
    if constexpr (MT > 1 && NT > 1) Ops::template load<3>(c3, sc);
  } else {
    Ops::template zero<0>();
    if constexpr (NT > 1) Ops::template zero<1>();
    if constexpr (MT > 1) Ops::template zero<2>();
    if constexpr (MT > 1 && NT > 1) Ops::template zero<3>();
  }
  for (int64_t k = k0; k < k1; k += kAmxK) {
    const uint16_t* b = B + (k / 2) * ldb;
    Ops::template load<4>(A + k, sa);
    if constexpr (MT > 1) Ops::template load<5>(A + kRows * lda + k, sa);
    Ops::template load<6>(b, sb);
    if constexpr (NT > 1) Ops::template load<7>(b + 2 * kRows, sb);
    Ops::template dp<4, 6>();
    if constexpr (NT > 1) Ops::template dp<4, 7>();
    if constexpr (MT > 1) Ops::template dp<5, 6>();
    if constexpr (MT > 1 && NT > 1) Ops::template dp<5, 7>();
  }
  Ops::template store<0>(C, sc);
  if constexpr (NT > 1) Ops::template store<1>(c1, sc);
  if constexpr (MT > 1) Ops::template store<2>(c2, sc);
  if constexpr (MT > 1 && NT > 1) Ops::template store<3>(c3, sc);
}

struct Args {
  int64_t M, N, K;
  const uint16_t* A;
  int64_t lda;
  const uint16_t* B;
  int64_t ldb;
  float* C;
  int64_t ldc;
  bool accumulate;
  AmxCausal causal;
};

// Every block of C in 32 x 32 steps (16 at the edges), each over its causal k range.
template <class Ops>
inline __attribute__((always_inline)) void run_blocks(const Args& g) {
  const AmxCausal cz = g.causal;
  for (int64_t m0 = 0; m0 < g.M; m0 += 2 * kRows) {
    const bool m2 = g.M - m0 >= 2 * kRows;
    const int64_t last_row = m0 + (m2 ? 2 : 1) * kRows - 1;
    for (int64_t n0 = 0; n0 < g.N; n0 += 2 * kRows) {
      const bool n2 = g.N - n0 >= 2 * kRows;
      if (cz.kind == AmxCausal::ColsUpToRow && n0 > cz.d + last_row) continue;
      int64_t k0 = 0, k1 = g.K;
      if (cz.kind == AmxCausal::KUpToRow) k1 = std::min<int64_t>(amx_pad(cz.d + last_row + 1), g.K);
      if (cz.kind == AmxCausal::KFromCol)
        k0 = std::min<int64_t>(std::max<int64_t>(n0 - cz.d, 0) / kAmxK * kAmxK, g.K);
      float* c = g.C + m0 * g.ldc + n0;
      if (k0 >= k1) {
        if (!g.accumulate)
          for (int64_t r = 0; r < (m2 ? 2 : 1) * kRows; ++r)
            std::fill(c + r * g.ldc, c + r * g.ldc + (n2 ? 2 : 1) * kRows, 0.f);
        continue;
      }
      const uint16_t* a = g.A + m0 * g.lda;
      const uint16_t* b = g.B + 2 * n0;
      if (m2 && n2)
        block<Ops, 2, 2>(a, g.lda, b, g.ldb, c, g.ldc, k0, k1, g.accumulate);
      else if (m2)
        block<Ops, 2, 1>(a, g.lda, b, g.ldb, c, g.ldc, k0, k1, g.accumulate);
      else if (n2)
        block<Ops, 1, 2>(a, g.lda, b, g.ldb, c, g.ldc, k0, k1, g.accumulate);
      else
        block<Ops, 1, 1>(a, g.lda, b, g.ldb, c, g.ldc, k0, k1, g.accumulate);
    }
  }
}

// The tile configuration (palette 1): tiles 0-7 of 16 rows by 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

void run_hardware(const Args& g) {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = kColsb;
    cfg.rows[t] = kRows;
  }
  __asm__ volatile("ldtilecfg %0" ::"m"(cfg));
  run_blocks<AmxHw>(g);
  // The tile state is large; a released thread's context switches skip it.
  __asm__ volatile("tilerelease" ::: "memory");
}

void run_emulated(const Args& g) {
  run_blocks<AmxEmu>(g);
}

}  // namespace

bool amx_hardware() {
  return cpu_isa() >= CpuIsa::Amx;
}

void amx_gemm_bf16(AmxExec ex, int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda,
                   const uint16_t* B, int64_t ldb, float* C, int64_t ldc, bool accumulate,
                   AmxCausal causal) {
  QLFT_CHECK_ARG(M >= 0 && N >= 0 && K >= 0 && M % kRows == 0 && N % kRows == 0 && K % kAmxK == 0,
                 "amx_gemm_bf16: M %lld and N %lld must be multiples of 16, K %lld of 32",
                 static_cast<long long>(M), static_cast<long long>(N), static_cast<long long>(K));
  QLFT_CHECK_ARG(lda >= K && ldb >= 2 * N && ldc >= N,
                 "amx_gemm_bf16: strides lda %lld, ldb %lld, ldc %lld too small",
                 static_cast<long long>(lda), static_cast<long long>(ldb),
                 static_cast<long long>(ldc));
  if (M == 0 || N == 0) return;
  const Args g{M, N, K, A, lda, B, ldb, C, ldc, accumulate, causal};
  if (ex == AmxExec::Emulated) {
    run_emulated(g);
    return;
  }
  if (!amx_hardware())
    throw Error(QLFT_ERR_UNSUPPORTED, "amx_gemm_bf16: this CPU (or QLFT_CPU_ISA) has no AMX tiles");
  run_hardware(g);
}

}  // namespace qlft::cpu
