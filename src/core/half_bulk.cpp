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

// ---- vector lanes: one block of W elements per call, a struct per ISA level -------------------

// Upper halves of round-to-nearest-even (u + 0x7fff + lsb), NaN lanes u | quiet bit, as 32-bit
// lanes whose low 16 bits are the bf16 value.
QLFT_TARGET_AVX2 inline __m256i rne_bf16_256(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
  const __m256i q = _mm256_or_si256(u, _mm256_set1_epi32(0x40 << 16));
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  return _mm256_srli_epi32(_mm256_blendv_epi8(r, q, nan), 16);
}

// AVX2 + F16C: f32_to_bf16's integer rounding 8 at a time.
struct Avx2Lanes {
  static constexpr size_t W = 8;
  QLFT_TARGET_AVX2 static void f32_to_bf16(const float* s, uint16_t* d) {
    const __m256i r = rne_bf16_256(_mm256_loadu_ps(s));
    // Each lane is below 2^16, so the saturating pack is exact.
    const __m128i h = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d), h);
  }
  QLFT_TARGET_AVX2 static void bf16_to_f32(const uint16_t* s, float* d) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d),
                        _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  QLFT_TARGET_AVX2 static void f32_to_f16(const float* s, uint16_t* d) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d),
                     _mm256_cvtps_ph(_mm256_loadu_ps(s), _MM_FROUND_TO_NEAREST_INT));
  }
  QLFT_TARGET_AVX2 static void f16_to_f32(const uint16_t* s, float* d) {
    _mm256_storeu_ps(d, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s))));
  }
  QLFT_TARGET_AVX2 static void round_bf16(const float* s, float* d) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d),
                        _mm256_slli_epi32(rne_bf16_256(_mm256_loadu_ps(s)), 16));
  }
};

QLFT_TARGET_AVX512 inline __m512i rne_bf16_512(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
  r = _mm512_mask_or_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), u,
                           _mm512_set1_epi32(0x40 << 16));
  return _mm512_srli_epi32(r, 16);
}

// AVX-512: the same integer rounding 16 at a time.
struct Avx512Lanes {
  static constexpr size_t W = 16;
  QLFT_TARGET_AVX512 static void f32_to_bf16(const float* s, uint16_t* d) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d),
                        _mm512_cvtepi32_epi16(rne_bf16_512(_mm512_loadu_ps(s))));
  }
  QLFT_TARGET_AVX512 static void bf16_to_f32(const uint16_t* s, float* d) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s));
    _mm512_storeu_si512(d, _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  QLFT_TARGET_AVX512 static void f32_to_f16(const float* s, uint16_t* d) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d),
                        _mm512_cvtps_ph(_mm512_loadu_ps(s), _MM_FROUND_TO_NEAREST_INT));
  }
  QLFT_TARGET_AVX512 static void f16_to_f32(const uint16_t* s, float* d) {
    _mm512_storeu_ps(d, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s))));
  }
  QLFT_TARGET_AVX512 static void round_bf16(const float* s, float* d) {
    _mm512_storeu_si512(d, _mm512_slli_epi32(rne_bf16_512(_mm512_loadu_ps(s)), 16));
  }
};

// VCVTNEPS2BF16 rounds to nearest even and quiets NaN like f32_to_bf16, but treats subnormal
// inputs as zero. Lanes whose exponent field is zero (zeros and subnormals) take the integer
// rounding instead, which is exact for both; a normal input never rounds to a bf16 subnormal.
QLFT_TARGET_AVX512BF16 inline __m256i native_bf16_512(__m512 v) {
  const __m256bh nb = _mm512_cvtneps_pbh(v);
  __m256i h;
  std::memcpy(&h, &nb, sizeof h);
  const __mmask16 tiny =
      _mm512_testn_epi32_mask(_mm512_castps_si512(v), _mm512_set1_epi32(0x7f800000));
  if (tiny) h = _mm256_mask_mov_epi16(h, tiny, _mm512_cvtepi32_epi16(rne_bf16_512(v)));
  return h;
}

// AVX512-BF16: the native instruction for f32 -> bf16, subnormal lanes patched; the rest as
// AVX-512.
struct Avx512Bf16Lanes : Avx512Lanes {
  QLFT_TARGET_AVX512BF16 static void f32_to_bf16(const float* s, uint16_t* d) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d), native_bf16_512(_mm512_loadu_ps(s)));
  }
  QLFT_TARGET_AVX512BF16 static void round_bf16(const float* s, float* d) {
    const __m256i h = native_bf16_512(_mm512_loadu_ps(s));
    _mm512_storeu_si512(d, _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
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

// The level's block functions over whole arrays: Block on each whole block of L::W elements, the
// scalar rule on the rest. Written once as a template, compiled per level inside half_bulk.inc
// (the loop needs the level's target attribute to inline the block: a template's attribute cannot
// depend on its parameters).
namespace avx2 {
using L = Avx2Lanes;
#define QLFT_KT QLFT_TARGET_AVX2
#include "core/half_bulk.inc"
#undef QLFT_KT
}  // namespace avx2

namespace avx512 {
using L = Avx512Lanes;
#define QLFT_KT QLFT_TARGET_AVX512
#include "core/half_bulk.inc"
#undef QLFT_KT
}  // namespace avx512

namespace avx512bf16 {
using L = Avx512Bf16Lanes;
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
