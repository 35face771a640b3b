#include "quant/blockwise8.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "quant/nf4_math.h"
#include "core/threads.h"

namespace qlft {

namespace {

// torch.linspace(start, end, steps, dtype=float32) on CPU: a float step; the first half counted
// up from start, the second half down from end, each element with one rounding (fused
// multiply-add), which is what torch's kernel produces (checked against torch in the tests).
std::vector<float> torch_linspace_f32(float start, float end, int64_t steps) {
  std::vector<float> out(static_cast<size_t>(steps));
  if (steps == 1) {
    out[0] = start;
    return out;
  }
  const float step = (end - start) / static_cast<float>(steps - 1);
  const int64_t halfway = steps / 2;
  for (int64_t i = 0; i < steps; ++i)
    out[i] = i < halfway ? std::fma(step, static_cast<float>(i), start)
                         : std::fma(-step, static_cast<float>(steps - i - 1), end);
  return out;
}

}  // namespace

std::array<float, 256> create_dynamic_map(bool is_signed, int max_exponent_bits, int total_bits) {
  QLFT_CHECK_ARG(total_bits == 8 && max_exponent_bits >= 1 && max_exponent_bits <= 7,
                 "create_dynamic_map: only 8-bit maps with 1..7 exponent bits are supported");
  std::vector<double> data;
  const int non_sign_bits = total_bits - 1;
  const int additional_items = (1 << (non_sign_bits - max_exponent_bits)) - 1;
  auto add_means = [&](int64_t items, int i) {
    std::vector<float> b = torch_linspace_f32(static_cast<float>(0.1), 1.0f, items);
    // python's 10 ** k, then the float32 scalar torch multiplies with
    const float scale = static_cast<float>(std::pow(10.0, -(max_exponent_bits - 1) + i));
    for (size_t j = 0; j + 1 < b.size(); ++j) {
      const float mean = (b[j] + b[j + 1]) / 2.0f;
      data.push_back(static_cast<double>(scale * mean));
      if (is_signed) data.push_back(static_cast<double>(-scale * mean));
    }
  };
  int i = 0;
  for (i = 0; i < max_exponent_bits; ++i) {
    const int64_t fraction_items =
        is_signed ? (int64_t(1) << (i + non_sign_bits - max_exponent_bits)) + 1
                  : (int64_t(1) << (i + non_sign_bits - max_exponent_bits + 1)) + 1;
    add_means(fraction_items, i);
  }
  if (additional_items > 0) add_means(additional_items + 1, i - 1);
  data.push_back(0.0);
  data.push_back(1.0);
  QLFT_CHECK_ARG(data.size() <= 256, "create_dynamic_map: %zu values do not fit in 8 bits",
                 data.size());
  while (data.size() < 256) data.push_back(0.0);
  std::sort(data.begin(), data.end());
  std::array<float, 256> out{};
  for (size_t j = 0; j < 256; ++j) out[j] = static_cast<float>(data[j]);
  return out;
}

Blockwise8Quantizer::Blockwise8Quantizer(const float* code256)
    : lut_(new uint8_t[kBlockwise8LutSize]) {
  std::copy(code256, code256 + 256, code_.begin());
  // Table entry i covers the normalized value -1 + 2i/65535 and holds the first code whose
  // midpoint with the next code is not below it (bitsandbytes build_quantize_lut).
  float mid[255];
  for (int j = 0; j < 255; ++j) mid[j] = 0.5f * (code_[j] + code_[j + 1]);
  int c = 0;
  for (int i = 0; i < kBlockwise8LutSize; ++i) {
    const float v =
        -1.0f + (2.0f * static_cast<float>(i)) / static_cast<float>(kBlockwise8LutSize - 1);
    while (c < 255 && mid[c] < v) ++c;
    lut_[i] = static_cast<uint8_t>(c);
  }
}

float Blockwise8Quantizer::quantize_block(const float* x, int64_t len, uint8_t* codes) const {
  float am = 0.0f;
  for (int64_t i = 0; i < len; ++i) am = std::max(am, std::fabs(x[i]));
  if (am == 0.0f) {
    std::fill(codes, codes + len, uint8_t{0});
    return am;
  }
  const float inv = 1.0f / am;
  const uint8_t* lut = lut_.get();
  for (int64_t i = 0; i < len; ++i) codes[i] = lut[blockwise8_lut_index(x[i] * inv)];
  return am;
}

void Blockwise8Quantizer::quantize(const float* x, int64_t n, int64_t blocksize, uint8_t* codes,
                                   float* absmax) const {
  QLFT_CHECK_ARG(blocksize > 0, "blockwise quantization: blocksize must be positive");
  const int64_t nblocks = (n + blocksize - 1) / blocksize;
#pragma omp parallel for num_threads(qlft::num_threads()) schedule(static) if (nblocks > 64)
  for (int64_t b = 0; b < nblocks; ++b) {
    const int64_t s = b * blocksize, len = std::min(blocksize, n - s);
    absmax[b] = quantize_block(x + s, len, codes + s);
  }
}

void dequantize_blockwise8(const float* code, const uint8_t* codes, const float* absmax, int64_t n,
                           int64_t blocksize, float* out) {
  QLFT_CHECK_ARG(blocksize > 0, "blockwise dequantization: blocksize must be positive");
  for (int64_t s = 0; s < n; s += blocksize) {
    const int64_t len = std::min(blocksize, n - s);
    const float am = absmax[s / blocksize];
    for (int64_t i = 0; i < len; ++i) out[s + i] = blockwise8_decode(code, codes[s + i], am);
  }
}

// ---- torch's float32 cascade sum -------------------------------------------------------------

namespace {

int64_t ceil_log2(int64_t x) {
  if (x <= 2) return 1;
  int64_t v = x - 1, last = 0;
  while (v >>= 1) ++last;
  return last + 1;
}

// torch multi_row_sum with 4 columns of L-lane vectors: element (row i, column k, lane l) is
// x[(i * 4 + k) * L + l]. Partial sums cascade over 4 levels of 2^level_power rows each.
template <int L>
void multi_row_sum4(const float* x, int64_t size, float out[4][L]) {
  constexpr int kLevels = 4;
  const int64_t level_power = std::max<int64_t>(4, ceil_log2(size) / kLevels);
  const int64_t level_step = int64_t(1) << level_power;
  const int64_t level_mask = level_step - 1;
  float acc[kLevels][4][L] = {};
  int64_t i = 0;
  while (i + level_step <= size) {
    for (int64_t j = 0; j < level_step; ++j, ++i)
      for (int k = 0; k < 4; ++k)
        for (int l = 0; l < L; ++l) acc[0][k][l] += x[(i * 4 + k) * L + l];
    for (int j = 1; j < kLevels; ++j) {
      for (int k = 0; k < 4; ++k)
        for (int l = 0; l < L; ++l) {
          acc[j][k][l] += acc[j - 1][k][l];
          acc[j - 1][k][l] = 0.0f;
        }
      if ((i & (level_mask << (j * level_power))) != 0) break;
    }
  }
  for (; i < size; ++i)
    for (int k = 0; k < 4; ++k)
      for (int l = 0; l < L; ++l) acc[0][k][l] += x[(i * 4 + k) * L + l];
  for (int j = 1; j < kLevels; ++j)
    for (int k = 0; k < 4; ++k)
      for (int l = 0; l < L; ++l) acc[0][k][l] += acc[j][k][l];
  for (int k = 0; k < 4; ++k)
    for (int l = 0; l < L; ++l) out[k][l] = acc[0][k][l];
}

// torch row_sum: `size` L-lane vectors summed with 4 interleaved accumulators.
template <int L>
void row_sum(const float* x, int64_t size, float out[L]) {
  const int64_t size_ilp = size / 4;
  float ps[4][L];
  multi_row_sum4<L>(x, size_ilp, ps);
  for (int64_t i = size_ilp * 4; i < size; ++i)
    for (int l = 0; l < L; ++l) ps[0][l] += x[i * L + l];
  for (int k = 1; k < 4; ++k)
    for (int l = 0; l < L; ++l) ps[0][l] += ps[k][l];
  for (int l = 0; l < L; ++l) out[l] = ps[0][l];
}

}  // namespace

float torch_mean_f32(const float* x, int64_t n) {
  QLFT_CHECK_ARG(n > 0, "mean of an empty vector");
  constexpr int kLanes = 8;
  float sum;
  if (n >= kLanes) {
    const int64_t vec_size = n / kLanes;
    float lanes[kLanes];
    row_sum<kLanes>(x, vec_size, lanes);
    sum = 0.0f;
    for (int64_t k = vec_size * kLanes; k < n; ++k) sum += x[k];
    for (int l = 0; l < kLanes; ++l) sum += lanes[l];
  } else {
    float s[1];
    row_sum<1>(x, n, s);
    sum = s[0];
  }
  return sum / static_cast<float>(n);
}

}  // namespace qlft
