// Host entry points of the optimizer and loss-scaler kernels (declared in cuda_entry.h): device
// pointers in, synchronous on the calling thread's default stream.
#include <array>
#include <mutex>
#include <vector>

#include "backend/cuda_entry.h"
#include "check.h"
#include "kernels.h"
#include "quant/blockwise8.h"
#include "quant/nf4_math.h"

namespace qlft {

namespace {

// The bnb dynamic maps (signed for m, unsigned for v) and their 65536-entry quantization tables,
// resident once per process. The table follows Blockwise8Quantizer's rule (entry i covers the
// normalized value -1 + 2i/65535 and holds the first code whose midpoint with the next is not
// below it); test_cuda_optim compares the codes with the CPU optimizer's.
struct Bnb8Tables {
  MemoryTracker tracker;  // counts these constants (they are not per-runtime)
  DeviceMemory code1, code2, lut1, lut2;
};

std::vector<uint8_t> build_lut(const std::array<float, 256>& code) {
  std::vector<uint8_t> lut(kBlockwise8LutSize);
  float mid[255];
  for (int j = 0; j < 255; ++j) mid[j] = 0.5f * (code[j] + code[j + 1]);
  int c = 0;
  for (int i = 0; i < kBlockwise8LutSize; ++i) {
    const float v =
        -1.0f + (2.0f * static_cast<float>(i)) / static_cast<float>(kBlockwise8LutSize - 1);
    while (c < 255 && mid[c] < v) ++c;
    lut[size_t(i)] = static_cast<uint8_t>(c);
  }
  return lut;
}

const Bnb8Tables& bnb8_tables() {
  static std::mutex mu;
  static Bnb8Tables* t = nullptr;  // never freed: may be used until exit
  std::lock_guard<std::mutex> lk(mu);
  if (!t) {
    auto* n = new Bnb8Tables();
    const std::array<float, 256> c1 = create_dynamic_map(true), c2 = create_dynamic_map(false);
    const std::vector<uint8_t> l1 = build_lut(c1), l2 = build_lut(c2);
    n->code1 = DeviceMemory(&n->tracker, MemCategory::Optimizer, 1024, "adamw8bit signed map");
    n->code2 = DeviceMemory(&n->tracker, MemCategory::Optimizer, 1024, "adamw8bit unsigned map");
    n->lut1 = DeviceMemory(&n->tracker, MemCategory::Optimizer, l1.size(), "adamw8bit table m");
    n->lut2 = DeviceMemory(&n->tracker, MemCategory::Optimizer, l2.size(), "adamw8bit table v");
    n->code1.upload(c1.data(), 1024);
    n->code2.upload(c2.data(), 1024);
    n->lut1.upload(l1.data(), l1.size());
    n->lut2.upload(l2.data(), l2.size());
    t = n;
  }
  return *t;
}

}  // namespace

cu::Bnb8Maps cu::bnb8_maps() {
  const Bnb8Tables& t = bnb8_tables();
  return {t.code1.as<float>(), t.code2.as<float>(), t.lut1.as<uint8_t>(), t.lut2.as<uint8_t>()};
}

namespace {

// A device counter / accumulator for one call.
struct Scalar {
  MemoryTracker tracker;
  DeviceMemory mem{&tracker, MemCategory::Workspace, 8, "reduction result"};
  Scalar() { QLFT_CUDA_CHECK(cudaMemset(mem.data(), 0, 8)); }
  template <class T>
  T get() {
    T v{};
    QLFT_CUDA_CHECK(cudaStreamSynchronize(nullptr));
    mem.download(&v, sizeof v);
    return v;
  }
};

void done() {
  QLFT_CUDA_CHECK(cudaStreamSynchronize(nullptr));
}

}  // namespace

void cuda_adamw_torch_step(float* p, float* m, float* v, const float* g, int64_t n,
                           const AdamWTorchCoeffs& c) {
  cu::adamw_torch(p, m, v, g, n, c, nullptr);
  done();
}

int64_t cuda_adamw_bnb8_step(float* p, uint8_t* q1, uint8_t* q2, float* absmax1, float* absmax2,
                             const float* g, int64_t n, const AdamBnbCoeffs& c) {
  const Bnb8Tables& t = bnb8_tables();
  Scalar skipped;
  cu::adamw_bnb8(p, q1, q2, absmax1, absmax2, g, n, c, t.code1.as<float>(), t.code2.as<float>(),
                 t.lut1.as<uint8_t>(), t.lut2.as<uint8_t>(), skipped.mem.as<unsigned long long>(),
                 nullptr);
  return static_cast<int64_t>(skipped.get<unsigned long long>());
}

int64_t cuda_adamw_bnb32_step(float* p, float* m, float* v, const float* g, int64_t n,
                              const AdamBnbCoeffs& c) {
  Scalar skipped;
  cu::adamw_bnb32(p, m, v, g, n, c, skipped.mem.as<unsigned long long>(), nullptr);
  return static_cast<int64_t>(skipped.get<unsigned long long>());
}

double cuda_sum_squares(const float* g, int64_t n) {
  Scalar acc;
  cu::sum_squares(g, n, acc.mem.as<double>(), nullptr);
  return acc.get<double>();
}

void cuda_scale(float* g, int64_t n, float s) {
  cu::scale(g, n, s, nullptr);
  done();
}

int64_t cuda_count_nonfinite(const float* g, int64_t n) {
  Scalar count;
  cu::count_nonfinite(g, n, count.mem.as<unsigned long long>(), nullptr);
  return static_cast<int64_t>(count.get<unsigned long long>());
}

}  // namespace qlft
