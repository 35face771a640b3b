// The per-ISA (de)quantization kernels (quant/quant_kernels.h): every set this CPU can run gives
// the bits of the scalar formulas of quant/nf4_math.h (NF4, LLM.int8: single products and
// comparisons, which no compiler contraction can change) and of the baseline set (GGUF blocks,
// whose baseline decoders test_quant_formats holds to gguf-py at every level through the `isa`
// ctest label). Inputs cover ties on the NF4 midpoints, odd starts and lengths, partial blocks and
// spans that cross blocks, so the vector loops' heads and tails run too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/cpu_isa.h"
#include "core/half.h"
#include "quant/ggml_types.h"
#include "quant/nf4.h"
#include "quant/nf4_math.h"
#include "quant/quant_kernels.h"

using namespace qlft;

namespace {

const CpuIsa kLevels[] = {CpuIsa::Baseline, CpuIsa::Avx2, CpuIsa::Avx512};

// The kernel sets this CPU (with the QLFT_CPU_ISA cap) runs; at least the baseline.
std::vector<const QuantKernels*> runnable_sets() {
  std::vector<const QuantKernels*> v;
  for (CpuIsa l : kLevels)
    if (const QuantKernels* k = quant_kernels_at(l)) {
      EXPECT_EQ(k->isa, l) << "quant_kernels_at(" << cpu_isa_name(l) << ")";
      v.push_back(k);
    }
  return v;
}

// Bit-exact float comparison (NaN payloads included).
void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b, const char* what,
                      CpuIsa isa) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    uint32_t x, y;
    std::memcpy(&x, &a[i], 4);
    std::memcpy(&y, &b[i], 4);
    ASSERT_EQ(x, y) << what << " at " << cpu_isa_name(isa) << ": element " << i << " is " << b[i]
                    << ", expected " << a[i];
  }
}

// A tensor of n values in blocks of bs whose first block holds every NF4 midpoint exactly (its
// absmax is 1, so x * (1 / absmax) is x) and both neighbours of each, then random values, an
// all-zero block and a last, partial block of random values.
std::vector<float> nf4_input(int64_t n, int64_t bs, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, 0.05f);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = d(rng);
  std::vector<float> edge = {1.0f, -1.0f, 0.0f, -0.0f};
  for (int k = 0; k < 15; ++k) {
    const float m = (nf4_value(uint32_t(k)) + nf4_value(uint32_t(k + 1))) / 2.0f;
    edge.push_back(m);
    edge.push_back(std::nextafter(m, 2.0f));
    edge.push_back(std::nextafter(m, -2.0f));
  }
  for (size_t i = 0; i < edge.size() && i < size_t(std::min(bs, n)); ++i) x[i] = edge[i];
  if (n >= 3 * bs)
    for (int64_t i = bs; i < 2 * bs; ++i) x[size_t(i)] = 0.0f;
  return x;
}

// bitsandbytes quantize_4bit per element: the oracle the kernels must reproduce.
void nf4_oracle(const std::vector<float>& x, int64_t bs, std::vector<uint8_t>& packed,
                std::vector<float>& absmax) {
  const int64_t n = int64_t(x.size()), nb = nf4_num_blocks(n, bs), full = n / bs;
  packed.assign(size_t(nf4_packed_bytes(n)), 0);
  absmax.assign(size_t(nb), 0.f);
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t s = b * bs, len = std::min(bs, n - s);
    float am = 0.f;
    for (int64_t i = 0; i < len; ++i) am = std::max(am, std::fabs(x[size_t(s + i)]));
    const float clamped = nf4_clamp_absmax(am);
    const bool partial = b >= full;
    absmax[size_t(b)] = partial ? clamped : am;
    const float scale = partial ? clamped : (1.0f / clamped) * 1.0f;
    for (int64_t i = 0; i < len; ++i) {
      const float v = x[size_t(s + i)];
      const uint8_t c = nf4_encode(clamp_unit(partial ? v / scale : v * scale));
      const int64_t e = s + i;
      packed[size_t(e / 2)] |= uint8_t((e & 1) ? c : c << 4);
    }
    if (len & 1) packed[size_t((s + len) / 2)] |= nf4_encode(0.0f);  // odd tail's padding code
  }
}

}  // namespace

TEST(QuantIsa, DispatchUsesTheCappedCpuLevel) {
  const CpuIsa want = std::min(cpu_isa(), CpuIsa::Avx512);
  EXPECT_EQ(quant_kernels().isa, want) << "cpu_isa " << cpu_isa_name(cpu_isa());
  for (CpuIsa l : kLevels)
    if (l > cpu_isa()) EXPECT_EQ(quant_kernels_at(l), nullptr) << cpu_isa_name(l);
}

TEST(QuantIsa, Nf4QuantizeEveryPathMatchesBitsandbytesPerElement) {
  // (n, blocksize): full blocks only, a partial last block, an odd tail, chunks past 256
  const int64_t cases[][2] = {
      {64 * 9, 64}, {64 * 9 + 17, 64}, {64 * 5 + 33, 64}, {4096 * 2 + 1001, 4096}, {2, 2}, {13, 8}};
  for (const auto& c : cases) {
    const std::vector<float> x = nf4_input(c[0], c[1], uint32_t(c[0]));
    std::vector<uint8_t> want_p;
    std::vector<float> want_a;
    nf4_oracle(x, c[1], want_p, want_a);
    for (const QuantKernels* k : runnable_sets()) {
      const int64_t n = c[0], bs = c[1], nb = nf4_num_blocks(n, bs), full = n / bs;
      std::vector<uint8_t> p(size_t(nf4_packed_bytes(n)), 0xAB);
      std::vector<float> a(size_t(nb), -1.f);
      for (int64_t b = 0; b < nb; ++b)
        k->nf4_quantize_block(x.data() + b * bs, std::min(bs, n - b * bs), b >= full,
                              p.data() + b * bs / 2, &a[size_t(b)]);
      EXPECT_EQ(p, want_p) << "n " << n << " blocksize " << bs << " at " << cpu_isa_name(k->isa);
      expect_same_bits(want_a, a, "nf4 absmax", k->isa);
    }
  }
}

TEST(QuantIsa, Nf4DequantizeEveryPathMatchesCodeTimesAbsmax) {
  std::mt19937 rng(7);
  const int64_t n = 64 * 40 + 31, bs = 64, nb = nf4_num_blocks(n, bs);
  std::vector<uint8_t> packed(static_cast<size_t>(nf4_packed_bytes(n)));
  for (uint8_t& b : packed) b = uint8_t(rng());
  std::vector<float> absmax(static_cast<size_t>(nb));
  std::normal_distribution<float> d(0.f, 1.f);
  for (float& a : absmax) a = std::fabs(d(rng));
  // spans: whole tensor, odd start, odd length, inside one block, across many blocks
  const int64_t spans[][2] = {{0, n},  {1, n - 1},  {3, 200},  {64, 64},
                              {65, 1}, {127, 1300}, {n - 5, 5}};
  for (const auto& s : spans) {
    std::vector<float> want(static_cast<size_t>(s[1]));
    for (int64_t i = 0; i < s[1]; ++i)
      want[size_t(i)] =
          nf4_decode(nf4_nibble(packed.data(), s[0] + i), absmax[size_t((s[0] + i) / bs)]);
    for (const QuantKernels* k : runnable_sets()) {
      std::vector<float> out(size_t(s[1]), NAN);
      // first_block = the span's first block: absmax is passed from there on (as the
      // double-quantized path does)
      const int64_t b0 = s[0] / bs;
      k->nf4_dequantize_scaled(packed.data(), bs, s[0], s[1], absmax.data() + b0, b0, out.data());
      expect_same_bits(want, out, "nf4 dequantize", k->isa);
    }
  }
}

TEST(QuantIsa, GgufBlocksEveryPathMatchesTheBaselineDecoders) {
  const GgmlType types[] = {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0,
                            GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};
  std::mt19937 rng(3);
  const QuantKernels* base = quant_kernels_at(CpuIsa::Baseline);
  ASSERT_NE(base, nullptr);
  for (GgmlType t : types) {
    const GgmlTypeTraits* tr = ggml_type_traits(uint32_t(t));
    ASSERT_NE(tr, nullptr);
    const int64_t nblocks = 37, n = nblocks * tr->block;
    std::vector<uint8_t> src(size_t(nblocks) * tr->bytes);
    for (uint8_t& b : src) b = uint8_t(rng());
    // Finite f16 scales (random bytes could be NaN or inf, which prove nothing here): every
    // f16 field of these layouts is rewritten with a normal value of either sign.
    std::normal_distribution<float> d(0.f, 0.02f);
    for (int64_t b = 0; b < nblocks; ++b) {
      uint8_t* p = src.data() + b * tr->bytes;
      std::vector<size_t> f16_at;
      if (t == GgmlType::Q6_K)
        f16_at = {208};
      else if (t == GgmlType::Q4_0 || t == GgmlType::Q8_0)
        f16_at = {0};
      else
        f16_at = {0, 2};
      for (size_t o : f16_at) {
        const uint16_t h = f32_to_f16(d(rng));
        std::memcpy(p + o, &h, 2);
      }
    }
    std::vector<float> want(static_cast<size_t>(n));
    ASSERT_TRUE(base->ggml_dequantize_blocks(uint32_t(t), src.data(), n, want.data())) << tr->name;
    for (const QuantKernels* k : runnable_sets()) {
      std::vector<float> out(size_t(n), NAN);
      ASSERT_TRUE(k->ggml_dequantize_blocks(uint32_t(t), src.data(), n, out.data()));
      expect_same_bits(want, out, tr->name, k->isa);
    }
  }
  float dummy = 0;
  EXPECT_FALSE(base->ggml_dequantize_blocks(uint32_t(GgmlType::F16), &dummy, 0, &dummy));
}

TEST(QuantIsa, Int8RowsEveryPathMatchesTheScalarDecode) {
  std::mt19937 rng(5);
  const int64_t rows = 9, cols = 77;
  std::vector<int8_t> codes(static_cast<size_t>(rows * cols));
  for (int8_t& c : codes) c = int8_t(rng());
  std::vector<float> scb(static_cast<size_t>(rows));
  std::normal_distribution<float> d(0.f, 1.f);
  for (float& s : scb) s = std::fabs(d(rng));
  const int64_t r0 = 2, n = 6;
  std::vector<float> want(static_cast<size_t>(n * cols));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < cols; ++c)
      want[size_t(r * cols + c)] =
          int8_decode(codes[size_t((r0 + r) * cols + c)], scb[size_t(r0 + r)]);
  for (const QuantKernels* k : runnable_sets()) {
    std::vector<float> out(want.size(), NAN);
    k->int8_dequantize_rows(codes.data(), scb.data(), r0, n, cols, out.data());
    expect_same_bits(want, out, "int8 rows", k->isa);
  }
}
