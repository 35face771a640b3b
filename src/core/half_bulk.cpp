// Bulk f32 <-> bf16 / f16 conversions, compiled for each ISA level with GCC/Clang target
// attributes (whatever -march the build uses) and chosen at run time from cpu_isa().
#include "core/half_bulk.h"

// GCC 12 reports its own _mm512_undefined_*() placeholders inside AVX-512 intrinsics as "may be
// used uninitialized" when they are inlined into target-attribute functions (a false positive).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstring>

#include "core/half.h"
#include "core/isa_target.h"

namespace qlft {
namespace {

using F2H = void (*)(const float*, uint16_t*, size_t);
using H2F = void (*)(const uint16_t*, float*, size_t);
using F2F = void (*)(const float*, float*, size_t);

// ---- baseline: the scalar rules themselves -----------------------------------------------------

void f32_to_bf16_scalar(const float* s, uint16_t* d, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = f32_to_bf16(s[i]);
}
void bf16_to_f32_scalar(const uint16_t* s, float* d, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = bf16_to_f32(s[i]);
}
void f32_to_f16_scalar(const float* s, uint16_t* d, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = f32_to_f16(s[i]);
}
void f16_to_f32_scalar(const uint16_t* s, float* d, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = f16_to_f32(s[i]);
}
void round_bf16_scalar(const float* s, float* d, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = bf16_to_f32(f32_to_bf16(s[i]));
}

// ---- vector lanes: what each ISA level adds to half_bulk.inc's blocks -------------------------

// The f16 conversions, which have no generic vector form: the F16C / AVX-512 instructions on one
// block of W floats (round to nearest even).
struct Avx2Isa {
  static constexpr size_t W = 8;
  QLFT_TARGET_AVX2 static __m128i to_f16(__m256 v) {
    return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
  }
  QLFT_TARGET_AVX2 static __m256 from_f16(__m128i h) { return _mm256_cvtph_ps(h); }
};

struct Avx512Isa {
  static constexpr size_t W = 16;
  QLFT_TARGET_AVX512 static __m256i to_f16(__m512 v) {
    return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
  }
  QLFT_TARGET_AVX512 static __m512 from_f16(__m256i h) { return _mm512_cvtph_ps(h); }
};

// AVX512-BF16 adds the native f32 -> bf16 instruction. VCVTNEPS2BF16 rounds to nearest even and
// quiets NaN like f32_to_bf16, but treats subnormal inputs as zero: lanes whose exponent field is
// zero (zeros and subnormals) take the integer rounding `rne` instead, which is exact for both; a
// normal input never rounds to a bf16 subnormal.
struct Avx512Bf16Isa : Avx512Isa {
  QLFT_TARGET_AVX512BF16 static __m256i native_bf16(__m512 v, __m256i rne) {
    const __m256bh nb = _mm512_cvtneps_pbh(v);
    __m256i h;
    std::memcpy(&h, &nb, sizeof h);
    const __mmask16 tiny =
        _mm512_testn_epi32_mask(_mm512_castps_si512(v), _mm512_set1_epi32(0x7f800000));
    return tiny ? _mm256_mask_mov_epi16(h, tiny, rne) : h;
  }
};

// ---- dispatch ----------------------------------------------------------------------------------

struct Paths {
  F2H f32_bf16;
  H2F bf16_f32;
  F2H f32_f16;
  H2F f16_f32;
  F2F round_bf16;
};

// Each level's blocks and whole-array loops, written once in half_bulk.inc and compiled there
// per level with the level's Isa and target attribute (a function's attribute cannot depend on a
// template parameter, and the attribute is what lets the blocks' vector code use the level).
namespace avx2 {
using Isa = Avx2Isa;
#define QLFT_KT QLFT_TARGET_AVX2
#include "core/half_bulk.inc"
#undef QLFT_KT
}  // namespace avx2

namespace avx512 {
using Isa = Avx512Isa;
#define QLFT_KT QLFT_TARGET_AVX512
#include "core/half_bulk.inc"
#undef QLFT_KT
}  // namespace avx512

namespace avx512bf16 {
using Isa = Avx512Bf16Isa;
#define QLFT_KT QLFT_TARGET_AVX512BF16
#include "core/half_bulk.inc"
#undef QLFT_KT
}  // namespace avx512bf16

Paths paths_for(CpuIsa isa) {
  if (isa >= CpuIsa::Avx512Bf16) return avx512bf16::kPaths;
  if (isa >= CpuIsa::Avx512) return avx512::kPaths;
  if (isa >= CpuIsa::Avx2) return avx2::kPaths;
  return {f32_to_bf16_scalar, bf16_to_f32_scalar, f32_to_f16_scalar, f16_to_f32_scalar,
          round_bf16_scalar};
}

// bulk_convert_at's ops, in BulkOp's order: each one Paths member, on untyped pointers.
template <class S, class D>
void run_path(void (*fn)(const S*, D*, size_t), const void* src, void* dst, size_t n) {
  fn(static_cast<const S*>(src), static_cast<D*>(dst), n);
}
template <auto kMember>
void run_op(const Paths& p, const void* src, void* dst, size_t n) {
  run_path(p.*kMember, src, dst, n);
}
constexpr void (*kOps[])(const Paths&, const void*, void*, size_t) = {
    run_op<&Paths::f32_bf16>, run_op<&Paths::bf16_f32>, run_op<&Paths::f32_f16>,
    run_op<&Paths::f16_f32>, run_op<&Paths::round_bf16>};
static_assert(sizeof kOps / sizeof kOps[0] == static_cast<size_t>(BulkOp::RoundThroughBf16) + 1,
              "an op per BulkOp");

const Paths& active() {
  static const Paths p = paths_for(cpu_isa());
  return p;
}

}  // namespace

void f32_to_bf16_n(const float* src, uint16_t* dst, size_t n) {
  active().f32_bf16(src, dst, n);
}
void bf16_to_f32_n(const uint16_t* src, float* dst, size_t n) {
  active().bf16_f32(src, dst, n);
}
void f32_to_f16_n(const float* src, uint16_t* dst, size_t n) {
  active().f32_f16(src, dst, n);
}
void f16_to_f32_n(const uint16_t* src, float* dst, size_t n) {
  active().f16_f32(src, dst, n);
}

void round_through_n(DType t, const float* src, float* dst, size_t n) {
  if (t == DType::BF16) return active().round_bf16(src, dst, n);
  if (t != DType::F16) {
    if (dst != src && n != 0) std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  constexpr size_t kChunk = 1024;
  uint16_t tmp[kChunk];
  for (size_t i = 0; i < n; i += kChunk) {
    const size_t m = n - i < kChunk ? n - i : kChunk;
    f32_to_f16_n(src + i, tmp, m);
    f16_to_f32_n(tmp, dst + i, m);
  }
}

CpuIsa bulk_convert_path(CpuIsa isa, BulkOp op) {
  const bool has_native = op == BulkOp::F32ToBf16 || op == BulkOp::RoundThroughBf16;
  if (isa >= CpuIsa::Avx512Bf16) return has_native ? CpuIsa::Avx512Bf16 : CpuIsa::Avx512;
  return isa;
}

bool bulk_convert_at(CpuIsa isa, BulkOp op, const void* src, void* dst, size_t n) {
  if (isa > cpu_isa()) return false;
  kOps[static_cast<size_t>(op)](paths_for(isa), src, dst, n);
  return true;
}

}  // namespace qlft
