#include "quant/nf4.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "quant/blockwise8.h"
#include "quant/nf4_math.h"

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#endif

namespace qlft {

void nf4_check_blocksize(int64_t blocksize, const char* what) {
  QLFT_CHECK_ARG(blocksize >= 2 && blocksize <= 65536 && (blocksize & (blocksize - 1)) == 0,
                 "%s: NF4 blocksize must be a power of two in [2, 65536], got %lld", what,
                 static_cast<long long>(blocksize));
}

namespace {

// One block (len elements starting at an even element): absmax, then the codes of x * (1 / absmax)
// for a full block or x / absmax for the partial last block (whose stored absmax is the clamped
// one), as bitsandbytes' quantize_4bit does. An odd tail is padded with a scaled 0.0 (code 7).
void quantize_block(const float* x, int64_t len, bool partial, uint8_t* packed, float* absmax_out) {
  float am = 0.0f;
  for (int64_t i = 0; i < len; ++i) am = std::max(am, std::fabs(x[i]));
  const float clamped = nf4_clamp_absmax(am);
  const int64_t pairs = len / 2;
  if (partial) {
    for (int64_t i = 0; i < pairs; ++i)
      packed[i] = static_cast<uint8_t>((nf4_encode(clamp_unit(x[2 * i] / clamped)) << 4) |
                                       nf4_encode(clamp_unit(x[2 * i + 1] / clamped)));
    if (len & 1)
      packed[pairs] = static_cast<uint8_t>((nf4_encode(clamp_unit(x[len - 1] / clamped)) << 4) |
                                           nf4_encode(0.0f));
    *absmax_out = clamped;
  } else {
    const float inv = (1.0f / clamped) * 1.0f;
    for (int64_t i = 0; i < pairs; ++i)
      packed[i] = static_cast<uint8_t>((nf4_encode(clamp_unit(x[2 * i] * inv)) << 4) |
                                       nf4_encode(clamp_unit(x[2 * i + 1] * inv)));
    *absmax_out = am;
  }
}

}  // namespace

void nf4_quantize(const float* x, int64_t n, int64_t blocksize, uint8_t* packed, float* absmax) {
  nf4_check_blocksize(blocksize, "nf4_quantize");
  QLFT_CHECK_ARG(n >= 0, "nf4_quantize: negative element count");
  const int64_t nb = nf4_num_blocks(n, blocksize);
  const int64_t full = n / blocksize;
  // Blocks hold an even number of elements, so no byte is shared between blocks (threads).
#pragma omp parallel for schedule(static) if (nb > 256)
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t s = b * blocksize;
    quantize_block(x + s, std::min(blocksize, n - s), b >= full, packed + s / 2, &absmax[b]);
  }
}

const std::array<float, 256>& nf4_nested_code() {
  static const std::array<float, 256> code = create_dynamic_map(true);
  return code;
}

void nf4_double_quantize(const float* absmax, int64_t nblocks, int64_t nested_blocksize,
                         uint8_t* codes, float* nested_absmax, float* offset) {
  QLFT_CHECK_ARG(nblocks > 0 && nested_blocksize > 0, "nf4_double_quantize: empty input");
  static const Blockwise8Quantizer quantizer(nf4_nested_code());
  const float mean = torch_mean_f32(absmax, nblocks);
  std::vector<float> centered(static_cast<size_t>(nblocks));
  for (int64_t i = 0; i < nblocks; ++i) centered[i] = absmax[i] - mean;
  quantizer.quantize(centered.data(), nblocks, nested_blocksize, codes, nested_absmax);
  *offset = mean;
}

void nf4_decode_absmax(const uint8_t* codes, const float* nested_absmax, const float* nested_code,
                       float offset, int64_t nested_blocksize, int64_t b0, int64_t count,
                       float* absmax) {
  for (int64_t i = 0; i < count; ++i) {
    const int64_t b = b0 + i;
    absmax[i] =
        nested_absmax_decode(nested_code, codes[b], nested_absmax[b / nested_blocksize], offset);
  }
}

void nf4_dequantize_span(const uint8_t* packed, int64_t e, int64_t len, float absmax, float* out) {
  // The 16 possible products code * absmax, looked up per nibble: the same single multiply
  // bitsandbytes does per element.
  alignas(64) float t[16];
  for (uint32_t k = 0; k < 16; ++k) t[k] = nf4_decode(k, absmax);
  int64_t i = 0;
  if (e & 1) {  // a span starting on a low nibble
    out[0] = t[packed[e >> 1] & 15u];
    i = 1;
  }
  const uint8_t* p = packed + ((e + i) >> 1);
  const int64_t pairs = (len - i) / 2;
  float* o = out + i;
#if defined(__AVX512F__) && defined(__AVX512BW__)
  const __m512 table = _mm512_load_ps(t);
  int64_t j = 0;
  for (; j + 16 <= pairs; j += 16) {
    // 16 bytes -> 32 nibbles, interleaved high, low, high, low...
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + j));
    const __m512i w = _mm512_cvtepu8_epi32(bytes);
    const __m512i hi = _mm512_srli_epi32(w, 4);
    const __m512i lo = _mm512_and_si512(w, _mm512_set1_epi32(15));
    const __m512 vhi = _mm512_permutexvar_ps(hi, table);
    const __m512 vlo = _mm512_permutexvar_ps(lo, table);
    // interleave: out[2k] = hi[k], out[2k+1] = lo[k]
    const __m512i idx0 = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i idx1 =
        _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    _mm512_storeu_ps(o + 2 * j, _mm512_permutex2var_ps(vhi, idx0, vlo));
    _mm512_storeu_ps(o + 2 * j + 16, _mm512_permutex2var_ps(vhi, idx1, vlo));
  }
  for (; j < pairs; ++j) {
    o[2 * j] = t[p[j] >> 4];
    o[2 * j + 1] = t[p[j] & 15u];
  }
#else
  for (int64_t j = 0; j < pairs; ++j) {
    o[2 * j] = t[p[j] >> 4];
    o[2 * j + 1] = t[p[j] & 15u];
  }
#endif
  if ((len - i) & 1) o[2 * pairs] = t[p[pairs] >> 4];
}

void nf4_dequantize(const uint8_t* packed, const float* absmax, int64_t blocksize, int64_t e0,
                    int64_t count, float* out) {
  nf4_dequantize_range(
      packed, blocksize, e0, count, [absmax](int64_t b) { return absmax[b]; }, out);
}

}  // namespace qlft
