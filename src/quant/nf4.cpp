#include "quant/nf4.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "quant/blockwise8.h"
#include "quant/nf4_math.h"
#include "quant/quant_kernels.h"
#include "core/threads.h"

namespace qlft {

void nf4_check_blocksize(int64_t blocksize, const char* what) {
  QLFT_CHECK_ARG(blocksize >= 2 && blocksize <= 65536 && (blocksize & (blocksize - 1)) == 0,
                 "%s: NF4 blocksize must be a power of two in [2, 65536], got %lld", what,
                 static_cast<long long>(blocksize));
}

void nf4_quantize(const float* x, int64_t n, int64_t blocksize, uint8_t* packed, float* absmax) {
  nf4_check_blocksize(blocksize, "nf4_quantize");
  QLFT_CHECK_ARG(n >= 0, "nf4_quantize: negative element count");
  const int64_t nb = nf4_num_blocks(n, blocksize);
  const int64_t full = n / blocksize;
  const QuantKernels& k = quant_kernels();
  // Blocks hold an even number of elements, so no byte is shared between blocks (threads).
#pragma omp parallel for num_threads(qlft::num_threads()) schedule(static) if (nb > 256)
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t s = b * blocksize;
    k.nf4_quantize_block(x + s, std::min(blocksize, n - s), b >= full, packed + s / 2, &absmax[b]);
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

void nf4_dequantize_scaled(const uint8_t* packed, int64_t blocksize, int64_t e0, int64_t count,
                           const float* absmax, int64_t first_block, float* out) {
  quant_kernels().nf4_dequantize_scaled(packed, blocksize, e0, count, absmax, first_block, out);
}

}  // namespace qlft
