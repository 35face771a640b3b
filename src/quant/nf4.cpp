#include "quant/nf4.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "quant/blockwise8.h"
#include "quant/nf4_math.h"
#include "core/threads.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#endif

namespace qlft {

void nf4_check_blocksize(int64_t blocksize, const char* what) {
  QLFT_CHECK_ARG(blocksize >= 2 && blocksize <= 65536 && (blocksize & (blocksize - 1)) == 0,
                 "%s: NF4 blocksize must be a power of two in [2, 65536], got %lld", what,
                 static_cast<long long>(blocksize));
}

namespace {

// Codes of one scaled chunk; separate from the packing so the compiler vectorizes both loops.
// full block: x * (1 / absmax); partial last block: x / absmax (bitsandbytes does both).
void encode_chunk(const float* x, int64_t len, float scale, bool divide, uint8_t* q) {
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
  if (!divide) {
    // 16 values at a time: the code is the count of midpoints below the scaled value (clamping
    // to [-1, 1] cannot change that count, so it is skipped).
    static const __m512 kMid[15] = {_mm512_set1_ps((nf4_value(0) + nf4_value(1)) / 2.0f),
                                    _mm512_set1_ps((nf4_value(1) + nf4_value(2)) / 2.0f),
                                    _mm512_set1_ps((nf4_value(2) + nf4_value(3)) / 2.0f),
                                    _mm512_set1_ps((nf4_value(3) + nf4_value(4)) / 2.0f),
                                    _mm512_set1_ps((nf4_value(4) + nf4_value(5)) / 2.0f),
                                    _mm512_set1_ps((nf4_value(5) + nf4_value(6)) / 2.0f),
                                    _mm512_set1_ps((nf4_value(6) + nf4_value(7)) / 2.0f),
                                    _mm512_set1_ps((nf4_value(7) + nf4_value(8)) / 2.0f),
                                    _mm512_set1_ps((nf4_value(8) + nf4_value(9)) / 2.0f),
                                    _mm512_set1_ps((nf4_value(9) + nf4_value(10)) / 2.0f),
                                    _mm512_set1_ps((nf4_value(10) + nf4_value(11)) / 2.0f),
                                    _mm512_set1_ps((nf4_value(11) + nf4_value(12)) / 2.0f),
                                    _mm512_set1_ps((nf4_value(12) + nf4_value(13)) / 2.0f),
                                    _mm512_set1_ps((nf4_value(13) + nf4_value(14)) / 2.0f),
                                    _mm512_set1_ps((nf4_value(14) + nf4_value(15)) / 2.0f)};
    const __m512 vs = _mm512_set1_ps(scale);
    const __m512i one = _mm512_set1_epi32(1);
    int64_t i = 0;
    for (; i + 16 <= len; i += 16) {
      const __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + i), vs);
      __m512i c = _mm512_setzero_si512();
      for (int k = 0; k < 15; ++k)
        c = _mm512_mask_add_epi32(c, _mm512_cmp_ps_mask(v, kMid[k], _CMP_GT_OQ), c, one);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), _mm512_cvtepi32_epi8(c));
    }
    for (; i < len; ++i) q[i] = nf4_encode(clamp_unit(x[i] * scale));
    return;
  }
#endif
  if (divide) {
    for (int64_t i = 0; i < len; ++i) q[i] = nf4_encode(clamp_unit(x[i] / scale));
  } else {
    for (int64_t i = 0; i < len; ++i) q[i] = nf4_encode(clamp_unit(x[i] * scale));
  }
}

// One block (len elements starting at an even element): absmax, then the codes of x * (1 / absmax)
// for a full block or x / absmax for the partial last block (whose stored absmax is the clamped
// one), as bitsandbytes' quantize_4bit does. An odd tail is padded with a scaled 0.0 (code 7).
void quantize_block(const float* x, int64_t len, bool partial, uint8_t* packed, float* absmax_out) {
  float am = 0.0f;
  for (int64_t i = 0; i < len; ++i) am = std::max(am, std::fabs(x[i]));
  const float clamped = nf4_clamp_absmax(am);
  const float scale = partial ? clamped : (1.0f / clamped) * 1.0f;
  *absmax_out = partial ? clamped : am;
  constexpr int64_t kChunk = 256;
  alignas(64) uint8_t q[kChunk];
  for (int64_t c = 0; c < len; c += kChunk) {
    const int64_t n = std::min(kChunk, len - c);
    encode_chunk(x + c, n, scale, partial, q);
    if (n & 1) q[n] = nf4_encode(0.0f);  // only the very last element of the tensor
    uint8_t* p = packed + c / 2;
    int64_t i = 0;
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
    // 32 codes -> 16 bytes: each 16-bit pair (q[2i] low byte, q[2i+1] high byte) -> q[2i] << 4 |
    // q[2i+1]
    for (; 2 * i + 32 <= n; i += 16) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 2 * i));
      const __m256i b =
          _mm256_or_si256(_mm256_and_si256(_mm256_slli_epi16(w, 4), _mm256_set1_epi16(0xF0)),
                          _mm256_srli_epi16(w, 8));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(p + i), _mm256_cvtepi16_epi8(b));
    }
#endif
    for (; i < (n + 1) / 2; ++i) p[i] = static_cast<uint8_t>((q[2 * i] << 4) | q[2 * i + 1]);
  }
}

}  // namespace

void nf4_quantize(const float* x, int64_t n, int64_t blocksize, uint8_t* packed, float* absmax) {
  nf4_check_blocksize(blocksize, "nf4_quantize");
  QLFT_CHECK_ARG(n >= 0, "nf4_quantize: negative element count");
  const int64_t nb = nf4_num_blocks(n, blocksize);
  const int64_t full = n / blocksize;
  // Blocks hold an even number of elements, so no byte is shared between blocks (threads).
#pragma omp parallel for num_threads(qlft::num_threads()) schedule(static) if (nb > 256)
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
  if (count <= 0) return;
  int64_t g = b0 / nested_blocksize;  // one division; then walk the nested blocks
  int64_t group_end = (g + 1) * nested_blocksize;
  for (int64_t b = b0; b < b0 + count; ++b) {
    if (b == group_end) {
      ++g;
      group_end += nested_blocksize;
    }
    absmax[b - b0] = nested_absmax_decode(nested_code, codes[b], nested_absmax[g], offset);
  }
}

void nf4_dequantize_double_quant(const uint8_t* packed, int64_t blocksize, const uint8_t* codes,
                                 const float* nested_absmax, const float* nested_code, float offset,
                                 int64_t nested_blocksize, int64_t e0, int64_t count, float* out) {
  constexpr int64_t kChunk = 256;
  float am[kChunk];
  int64_t e = e0;
  const int64_t end = e0 + count;
  while (e < end) {
    const int64_t b0 = e / blocksize;
    const int64_t last = (end - 1) / blocksize + 1;
    const int64_t b1 = std::min(b0 + kChunk, last);
    nf4_decode_absmax(codes, nested_absmax, nested_code, offset, nested_blocksize, b0, b1 - b0, am);
    const int64_t ce = std::min(b1 * blocksize, end);
    nf4_dequantize_scaled(packed, blocksize, e, ce - e, am, b0, out + (e - e0));
    e = ce;
  }
}

namespace {

// Dequantizes `len` elements starting at element e, all in one block with the given absmax.
inline __attribute__((always_inline)) void dequantize_span(const uint8_t* packed, int64_t e,
                                                           int64_t len, float absmax, float* out) {
  // The 16 possible products code * absmax, looked up per nibble: the same single multiply
  // bitsandbytes does per element.
  alignas(64) float t[16];
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
  // built in a register: 16 scalar stores followed by a vector load would stall forwarding
  const __m512 kCodes = _mm512_setr_ps(nf4_value(0), nf4_value(1), nf4_value(2), nf4_value(3),
                                       nf4_value(4), nf4_value(5), nf4_value(6), nf4_value(7),
                                       nf4_value(8), nf4_value(9), nf4_value(10), nf4_value(11),
                                       nf4_value(12), nf4_value(13), nf4_value(14), nf4_value(15));
  const __m512 table = _mm512_mul_ps(kCodes, _mm512_set1_ps(absmax));
  _mm512_store_ps(t, table);
#else
  for (uint32_t k = 0; k < 16; ++k) t[k] = nf4_decode(k, absmax);
#endif
  int64_t i = 0;
  if (e & 1) {  // a span starting on a low nibble
    out[0] = t[packed[e >> 1] & 15u];
    i = 1;
  }
  const uint8_t* p = packed + ((e + i) >> 1);
  const int64_t pairs = (len - i) / 2;
  float* o = out + i;
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
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

}  // namespace

void nf4_dequantize_scaled(const uint8_t* packed, int64_t blocksize, int64_t e0, int64_t count,
                           const float* absmax, int64_t first_block, float* out) {
  if (count <= 0) return;
  int64_t e = e0;
  const int64_t end = e0 + count;
  int64_t b = e0 / blocksize;  // one division; then walk the blocks
  int64_t block_end = (b + 1) * blocksize;
  const float* am = absmax - first_block;
  while (e < end) {
    const int64_t stop = block_end < end ? block_end : end;
    dequantize_span(packed, e, stop - e, am[b], out + (e - e0));
    e = stop;
    ++b;
    block_end += blocksize;
  }
}

}  // namespace qlft
