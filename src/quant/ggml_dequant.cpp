#include "quant/ggml_dequant.h"

#include <cstring>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "core/dtype.h"
#include "core/error.h"
#include "quant/ggml_math.h"
#include "quant/ggml_types.h"

namespace qlft {

namespace {

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
// Vector forms of the two decoders the compiler does not vectorize on its own; same operations
// per element as ggml_dequant_q4_0 / ggml_dequant_q6_k (the tests compare them to gguf-py).
void dequant_q4_0_avx512(const uint8_t* b, float* y) {
  const __m512 d = _mm512_set1_ps(ggml_f16_at(b));
  const __m512i w = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2)));
  const __m512i eight = _mm512_set1_epi32(8);
  const __m512i lo = _mm512_sub_epi32(_mm512_and_si512(w, _mm512_set1_epi32(15)), eight);
  const __m512i hi = _mm512_sub_epi32(_mm512_srli_epi32(w, 4), eight);
  _mm512_storeu_ps(y, _mm512_mul_ps(d, _mm512_cvtepi32_ps(lo)));
  _mm512_storeu_ps(y + 16, _mm512_mul_ps(d, _mm512_cvtepi32_ps(hi)));
}

void dequant_q6_k_avx512(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = ggml_f16_at(b + 208);
  const __m512i m4 = _mm512_set1_epi32(15), m2 = _mm512_set1_epi32(3), k32 = _mm512_set1_epi32(32);
  auto load16 = [](const uint8_t* p) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  };
  for (int n = 0; n < 2; ++n) {
    for (int h = 0; h < 2; ++h) {  // l in [16h, 16h + 16): scale index is = h
      const int l = 16 * h;
      const __m512i a = load16(ql + l), c = load16(ql + l + 32), hb = load16(qh + l);
      const __m512i q1 = _mm512_sub_epi32(
          _mm512_or_si512(_mm512_and_si512(a, m4), _mm512_slli_epi32(_mm512_and_si512(hb, m2), 4)),
          k32);
      const __m512i q2 = _mm512_sub_epi32(
          _mm512_or_si512(_mm512_and_si512(c, m4),
                          _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(hb, 2), m2), 4)),
          k32);
      const __m512i q3 = _mm512_sub_epi32(
          _mm512_or_si512(_mm512_srli_epi32(a, 4),
                          _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(hb, 4), m2), 4)),
          k32);
      const __m512i q4 = _mm512_sub_epi32(
          _mm512_or_si512(_mm512_srli_epi32(c, 4), _mm512_slli_epi32(_mm512_srli_epi32(hb, 6), 4)),
          k32);
      _mm512_storeu_ps(y + l, _mm512_mul_ps(_mm512_set1_ps(d * static_cast<float>(sc[h + 0])),
                                            _mm512_cvtepi32_ps(q1)));
      _mm512_storeu_ps(y + l + 32, _mm512_mul_ps(_mm512_set1_ps(d * static_cast<float>(sc[h + 2])),
                                                 _mm512_cvtepi32_ps(q2)));
      _mm512_storeu_ps(y + l + 64, _mm512_mul_ps(_mm512_set1_ps(d * static_cast<float>(sc[h + 4])),
                                                 _mm512_cvtepi32_ps(q3)));
      _mm512_storeu_ps(y + l + 96, _mm512_mul_ps(_mm512_set1_ps(d * static_cast<float>(sc[h + 6])),
                                                 _mm512_cvtepi32_ps(q4)));
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}
#define QLFT_Q4_0 dequant_q4_0_avx512
#define QLFT_Q6_K dequant_q6_k_avx512
#else
#define QLFT_Q4_0 ggml_dequant_q4_0
#define QLFT_Q6_K ggml_dequant_q6_k
#endif

template <int kBlock, int kBytes, void (*kDecode)(const uint8_t*, float*)>
void blocks(const void* src, int64_t n, float* dst) {
  const uint8_t* p = static_cast<const uint8_t*>(src);
  const int64_t nb = n / kBlock;
  for (int64_t b = 0; b < nb; ++b) kDecode(p + b * kBytes, dst + b * kBlock);
}

}  // namespace

void ggml_dequantize(uint32_t type, const void* src, int64_t n, float* dst) {
  const GgmlTypeTraits* t = ggml_type_traits(type);
  if (!t || !t->dequantizable)
    throw_error(QLFT_ERR_UNSUPPORTED, "ggml type %s (%u): dequantization is not supported",
                t ? t->name : "unknown", type);
  QLFT_CHECK_ARG(n >= 0 && n % t->block == 0,
                 "ggml_dequantize: %lld elements is not a multiple of the %s block size %u",
                 static_cast<long long>(n), t->name, t->block);
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case GgmlType::F16:
      f16_to_f32_n(static_cast<const uint16_t*>(src), dst, n);
      return;
    case GgmlType::BF16:
      bf16_to_f32_n(static_cast<const uint16_t*>(src), dst, n);
      return;
    case GgmlType::F64: {
      const uint8_t* p = static_cast<const uint8_t*>(src);
      for (int64_t i = 0; i < n; ++i) {
        double v;
        std::memcpy(&v, p + i * 8, 8);
        dst[i] = static_cast<float>(v);
      }
      return;
    }
    case GgmlType::Q4_0:
      blocks<32, 18, QLFT_Q4_0>(src, n, dst);
      return;
    case GgmlType::Q4_1:
      blocks<32, 20, ggml_dequant_q4_1>(src, n, dst);
      return;
    case GgmlType::Q8_0:
      blocks<32, 34, ggml_dequant_q8_0>(src, n, dst);
      return;
    case GgmlType::Q4_K:
      blocks<256, 144, ggml_dequant_q4_k>(src, n, dst);
      return;
    case GgmlType::Q5_K:
      blocks<256, 176, ggml_dequant_q5_k>(src, n, dst);
      return;
    case GgmlType::Q6_K:
      blocks<256, 210, QLFT_Q6_K>(src, n, dst);
      return;
    default:
      break;
  }
  throw_error(QLFT_ERR_INTERNAL, "ggml type %s marked dequantizable but has no decoder", t->name);
}

}  // namespace qlft
