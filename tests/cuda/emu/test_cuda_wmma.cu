// The emulator's warp matrix API (cuda/emu/include/mma.h) against its stated semantics: a 16x16x16
// bf16 mma_sync is c + a b with exact bf16 products added in k order in fp32 (so a host loop in
// that order gives the same bits), for every operand layout; a fragment never loaded is NaN; a
// lane missing from a collective operation, lanes disagreeing on the pointer, and a misaligned
// pointer fail the launch.
#include <gtest/gtest.h>

#include <cuda_bf16.h>
#include <mma.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "check.h"
#include "core/half.h"

namespace {

using namespace nvcuda;
using bf16 = __nv_bfloat16;
using qlft::cu::launch;

enum class Mode { Exact, NoLoadA, LaneExits, LanesDisagree, Misaligned };

// d = c + a b; b given row-major (bt == false) or as its transpose row-major, i.e. B col-major.
template <bool kBColMajor>
__global__ void __launch_bounds__(32)
    k_mma(const uint16_t* a, const uint16_t* b, const float* c, float* d, Mode mode) {
  using LB = typename std::conditional<kBColMajor, wmma::col_major, wmma::row_major>::type;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, LB> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
  const int lane = threadIdx.x;
  const uint16_t* pa = a;
  if (mode == Mode::LanesDisagree && lane == 3) pa = a + 16;
  if (mode == Mode::Misaligned) pa = a + 8;  // 16 bytes off a 256-byte aligned allocation
  if (mode != Mode::NoLoadA) wmma::load_matrix_sync(fa, reinterpret_cast<const bf16*>(pa), 16);
  wmma::load_matrix_sync(fb, reinterpret_cast<const bf16*>(b), 16);
  wmma::load_matrix_sync(fc, c, 16, wmma::mem_col_major);  // c is stored transposed
  if (mode == Mode::LaneExits && lane == 5) return;
  wmma::mma_sync(fc, fa, fb, fc);
  wmma::store_matrix_sync(d, fc, 16, wmma::mem_row_major);
}

struct Buf {
  void* p = nullptr;
  explicit Buf(size_t bytes) { QLFT_CUDA_CHECK(cudaMalloc(&p, bytes)); }
  ~Buf() { QLFT_CUDA_WARN(cudaFree(p)); }
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

struct Inputs {
  std::vector<uint16_t> a, b, bt;  // [16][16] row-major bf16; bt = b transposed
  std::vector<float> c, ct;        // c and its transpose
};

Inputs draw(uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  Inputs in;
  in.a.resize(256);
  in.b.resize(256);
  in.bt.resize(256);
  in.c.resize(256);
  in.ct.resize(256);
  for (int i = 0; i < 256; ++i) {
    in.a[size_t(i)] = qlft::f32_to_bf16(d(g));
    in.b[size_t(i)] = qlft::f32_to_bf16(d(g));
    in.c[size_t(i)] = d(g);
  }
  for (int r = 0; r < 16; ++r)
    for (int k = 0; k < 16; ++k) {
      in.bt[size_t(k * 16 + r)] = in.b[size_t(r * 16 + k)];
      in.ct[size_t(k * 16 + r)] = in.c[size_t(r * 16 + k)];
    }
  return in;
}

// Runs k_mma; returns d (row-major) or throws what the launch check throws.
std::vector<float> run(const Inputs& in, bool b_col_major, Mode mode) {
  Buf a(1024), b(512), c(1024), d(1024);  // a: room for the misaligned case's reads
  QLFT_CUDA_CHECK(cudaMemcpy(a.p, in.a.data(), 512, cudaMemcpyHostToDevice));
  QLFT_CUDA_CHECK(
      cudaMemcpy(b.p, (b_col_major ? in.bt : in.b).data(), 512, cudaMemcpyHostToDevice));
  QLFT_CUDA_CHECK(cudaMemcpy(c.p, in.ct.data(), 1024, cudaMemcpyHostToDevice));
  if (b_col_major)
    launch(k_mma<true>, dim3(1), dim3(32), 0, nullptr, a.as<uint16_t>(), b.as<uint16_t>(),
           c.as<float>(), d.as<float>(), mode);
  else
    launch(k_mma<false>, dim3(1), dim3(32), 0, nullptr, a.as<uint16_t>(), b.as<uint16_t>(),
           c.as<float>(), d.as<float>(), mode);
  std::vector<float> out(256);
  QLFT_CUDA_CHECK(cudaMemcpy(out.data(), d.p, 1024, cudaMemcpyDeviceToHost));
  return out;
}

}  // namespace

TEST(EmuWmma, MmaIsExactProductsAddedInKOrderForEveryLayout) {
  for (bool col : {false, true}) {
    SCOPED_TRACE(col ? "B col_major" : "B row_major");
    const Inputs in = draw(col ? 2 : 1);
    const std::vector<float> d = run(in, col, Mode::Exact);
    for (int i = 0; i < 16; ++i)
      for (int j = 0; j < 16; ++j) {
        float acc = in.c[size_t(i * 16 + j)];
        for (int k = 0; k < 16; ++k)
          acc += qlft::bf16_to_f32(in.a[size_t(i * 16 + k)]) *
                 qlft::bf16_to_f32(in.b[size_t(k * 16 + j)]);
        uint32_t want, got;
        std::memcpy(&want, &acc, 4);
        std::memcpy(&got, &d[size_t(i * 16 + j)], 4);
        ASSERT_EQ(got, want) << "element (" << i << ", " << j << "): " << d[size_t(i * 16 + j)]
                             << " vs " << acc;
      }
  }
}

TEST(EmuWmma, AFragmentNeverLoadedIsNaN) {
  const std::vector<float> d = run(draw(3), false, Mode::NoLoadA);
  for (float x : d) ASSERT_TRUE(std::isnan(x));
}

TEST(EmuWmma, CollectiveMisuseFailsTheLaunch) {
  for (Mode m : {Mode::LaneExits, Mode::LanesDisagree, Mode::Misaligned}) {
    SCOPED_TRACE(int(m));
    EXPECT_ANY_THROW(run(draw(4), false, m));
  }
}
