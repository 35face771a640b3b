// The CUDA backend's bf16-writing forms of the runner's 16-bit protocol (issue 45, Done when 2:
// no conversion kernel between a producer and its bf16 consumer), each against an oracle of its
// own: linear_fwd_to_16 (the LoRA GEMM writes its bf16 term, the weight panel's GEMM adds x W^T
// reading it) and a linear_bwd whose dx is asked in bf16 (next_dx_16) against double sums of
// the same bf16 operands; rmsnorm_bwd_16 against the CPU backend's rmsnorm_bwd; attention_bwd_16's
// dv, written in bf16 by the tensor-core kernel, against the same kernel's fp32 dv rounded.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda_entry.h"
#include "backend/rope_freqs.h"
#include "core/half.h"
#include "cuda_test_util.h"
#include "quant/qweight.h"

using qlft_cuda_test::norm_err;

namespace {

using namespace qlft;
using FVec = std::vector<float>;
using HVec = std::vector<uint16_t>;

// Values already on the bf16 grid (what the runner's stored copies hold).
FVec bf16_normal(std::mt19937_64& g, size_t n, float sd) {
  std::normal_distribution<float> d(0.f, sd);
  FVec v(n);
  for (auto& x : v) x = bf16_to_f32(f32_to_bf16(d(g)));
  return v;
}
HVec to_bf16(const FVec& v) {
  HVec h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = f32_to_bf16(v[i]);
  return h;
}
FVec widen(const HVec& h) {
  FVec v(h.size());
  for (size_t i = 0; i < h.size(); ++i) v[i] = bf16_to_f32(h[i]);
  return v;
}
double bf16_round(double v) {
  return bf16_to_f32(f32_to_bf16(float(v)));
}

// A bf16 autocast CUDA backend (as make_backend makes it for train.precision=bf16) and device
// buffers made from host vectors.
struct Bf16Gpu {
  MemoryTracker tr;
  std::unique_ptr<Backend> gpu;
  std::vector<std::unique_ptr<Buffer>> bufs;
  Bf16Gpu() {
    CudaBackendOptions o;
    o.spec.precision = Precision::BF16;
    o.autocast = true;
    gpu = make_cuda_backend(&tr, o);
  }
  template <class T>
  T* up(const std::vector<T>& v) {
    bufs.push_back(std::make_unique<Buffer>(
        gpu->alloc(MemCategory::Workspace, std::max<size_t>(v.size(), 1) * sizeof(T), "test")));
    if (!v.empty()) bufs.back()->copy_from_host(v.data(), v.size() * sizeof(T));
    return bufs.back()->as<T>();
  }
  template <class T>
  std::vector<T> down(const T* p, size_t n) {
    for (const auto& b : bufs)
      if (b->as<T>() == p) {
        std::vector<T> v(n);
        b->copy_to_host(v.data(), n * sizeof(T));
        return v;
      }
    ADD_FAILURE() << "not a test buffer";
    return std::vector<T>(n);
  }
};

// Conversion kernels this process launched so far (fp32 <-> 16-bit copies and rounding copies,
// counted by the launch wrapper): each op below must launch none.
uint64_t conversions(Backend& b) {
  uint64_t n = 0;
  for (const KernelLaunches& k : b.launch_counts())
    if (k.name.rfind("k_convert", 0) == 0 || k.name.rfind("k_round16", 0) == 0 ||
        k.name.rfind("k_widen", 0) == 0)
      n += k.count;
  return n;
}

// |got - want| within one bf16 step of want, plus `extra` (an inner term's rounding) and the
// fp32 sums' error on the magnitude mag (the sum of the products' absolute values).
bool within(double got, double want, double extra, double mag) {
  return std::fabs(got - want) <= std::ldexp(std::fabs(want), -7) + extra + 1e-5 * mag + 1e-30;
}

}  // namespace

// y16 = round(x W^T + round(s xa B^T)) with xa = round(x A^T) (the bf16 xa the runner keeps):
// against double sums of the same bf16 operands, every element within one bf16 rounding of the
// exact y plus the LoRA term's own rounding (the base term missing, the LoRA term missing or
// counted twice, a transposed operand each miss by far more).
TEST(CudaBf16Outputs, LinearFwdTo16WritesTheRoundedSum) {
  QLFT_NEED_GPU();
  Bf16Gpu g;
  std::mt19937_64 rng(5);
  for (const bool with_lora : {true, false}) {
    const int64_t M = 37, K = 96, N = 72;
    const int r = 8;
    const float s = 2.f;
    SCOPED_TRACE(with_lora ? "lora" : "no lora");
    const FVec wv = bf16_normal(rng, size_t(N * K), 0.1f);
    QWeight W = qweight_from_f32(&g.tr, wv.data(), N, K, QuantKind::BF16, 64, false);
    const FVec x = bf16_normal(rng, size_t(M * K), 1.f);
    const FVec A = bf16_normal(rng, size_t(r * K), 0.1f), B = bf16_normal(rng, size_t(N * r), 0.1f);
    float* xd = g.up(x);
    uint16_t* x16 = g.up(to_bf16(x));
    LoraRef l;
    l.A = g.up(A);
    l.B = g.up(B);
    l.A16 = g.up(to_bf16(A));
    l.B16 = g.up(to_bf16(B));
    l.r = r;
    l.scale = s;
    uint16_t* xa16 = g.up(HVec(size_t(M * r), 0));
    uint16_t* y16 = g.up(HVec(size_t(M * N), 0x7fc0));  // NaN: every element must be written
    float* yd = g.up(FVec(size_t(M * N), 0.f));
    g.gpu->begin_shared_input_16(CMatF(xd, M, K), DType::BF16, x16);
    if (with_lora) g.gpu->next_xa_16(DType::BF16, xa16);
    const uint64_t conv0 = conversions(*g.gpu);
    g.gpu->linear_fwd_to_16(W, nullptr, with_lora ? &l : nullptr, CMatF(xd, M, K), MatF(yd, M, N),
                            with_lora ? g.up(FVec(size_t(M * r))) : nullptr, DType::BF16, y16);
    g.gpu->end_shared_input();
    EXPECT_EQ(conversions(*g.gpu), conv0);
    const FVec y = widen(g.down(y16, size_t(M * N)));
    const FVec xa = widen(g.down(xa16, size_t(M * r)));
    int64_t bad_xa = 0, bad_y = 0;
    for (int64_t i = 0; i < M; ++i) {
      for (int j = 0; with_lora && j < r; ++j) {
        double e = 0, m = 0;
        for (int64_t k = 0; k < K; ++k) {
          e += double(x[size_t(i * K + k)]) * A[size_t(j * K + k)];
          m += std::fabs(double(x[size_t(i * K + k)]) * A[size_t(j * K + k)]);
        }
        bad_xa += !within(xa[size_t(i * r + j)], e, 0, m);
      }
      for (int64_t n = 0; n < N; ++n) {
        double base = 0, lo = 0, m = 0;
        for (int64_t k = 0; k < K; ++k) {
          base += double(x[size_t(i * K + k)]) * wv[size_t(n * K + k)];
          m += std::fabs(double(x[size_t(i * K + k)]) * wv[size_t(n * K + k)]);
        }
        for (int j = 0; with_lora && j < r; ++j) {
          lo += double(xa[size_t(i * r + j)]) * B[size_t(n * r + j)];
          m += s * std::fabs(double(xa[size_t(i * r + j)]) * B[size_t(n * r + j)]);
        }
        lo *= s;
        bad_y += !within(y[size_t(i * N + n)], base + lo, std::ldexp(std::fabs(lo), -8), m);
      }
    }
    EXPECT_EQ(bad_xa, 0);
    EXPECT_EQ(bad_y, 0);
  }
}

// next_dx_16: dx16 = round(dy W + round(s g A)), g = round(dy B), and dx's fp32 memory left as
// it was; dA and dB equal (bit for bit) those of the same call with an fp32 dx.
TEST(CudaBf16Outputs, LinearBwdWritesDxIn16Bits) {
  QLFT_NEED_GPU();
  Bf16Gpu g;
  std::mt19937_64 rng(6);
  const int64_t M = 29, K = 64, N = 80;
  const int r = 8;
  const float s = 2.f;
  const FVec wv = bf16_normal(rng, size_t(N * K), 0.1f);
  QWeight W = qweight_from_f32(&g.tr, wv.data(), N, K, QuantKind::BF16, 64, false);
  const FVec x = bf16_normal(rng, size_t(M * K), 1.f), dy = bf16_normal(rng, size_t(M * N), 1.f);
  const FVec A = bf16_normal(rng, size_t(r * K), 0.1f), B = bf16_normal(rng, size_t(N * r), 0.1f);
  float* xd = g.up(x);
  uint16_t* x16 = g.up(to_bf16(x));
  float* dyd = g.up(dy);
  uint16_t* dy16 = g.up(to_bf16(dy));
  uint16_t* xa16 = g.up(HVec(size_t(M * r), 0));
  LoraRef l;
  l.A = g.up(A);
  l.B = g.up(B);
  l.A16 = g.up(to_bf16(A));
  l.B16 = g.up(to_bf16(B));
  l.r = r;
  l.scale = s;
  // xa as the forward keeps it
  g.gpu->begin_shared_input_16(CMatF(xd, M, K), DType::BF16, x16);
  g.gpu->next_xa_16(DType::BF16, xa16);
  g.gpu->linear_fwd(W, nullptr, &l, CMatF(xd, M, K), MatF(g.up(FVec(size_t(M * N))), M, N),
                    g.up(FVec(size_t(M * r))));
  float* dA[2] = {g.up(FVec(size_t(r * K), 0.f)), g.up(FVec(size_t(r * K), 0.f))};
  float* dB[2] = {g.up(FVec(size_t(N * r), 0.f)), g.up(FVec(size_t(N * r), 0.f))};
  const FVec sentinel(size_t(M * K), 3.f);
  float* dx32 = g.up(FVec(size_t(M * K), 0.f));
  float* dxroom = g.up(sentinel);
  uint16_t* dx16 = g.up(HVec(size_t(M * K), 0x7fc0));
  for (int pass = 0; pass < 2; ++pass) {
    g.gpu->next_dy_16(DType::BF16, View2<uint16_t>(dy16, M, N, N));
    g.gpu->next_xa_16(DType::BF16, xa16);
    if (pass == 1) {
      ASSERT_TRUE(g.gpu->next_dx_16(DType::BF16, dx16, W, &l));
    }
    const uint64_t conv0 = conversions(*g.gpu);
    g.gpu->linear_bwd(W, &l, CMatF(xd, M, K), nullptr, CMatF(dyd, M, N),
                      MatF(pass ? dxroom : dx32, M, K), dA[pass], dB[pass]);
    EXPECT_EQ(conversions(*g.gpu), conv0);
  }
  g.gpu->end_shared_input();
  EXPECT_EQ(g.down(dA[1], size_t(r * K)), g.down(dA[0], size_t(r * K)));
  EXPECT_EQ(g.down(dB[1], size_t(N * r)), g.down(dB[0], size_t(N * r)));
  EXPECT_EQ(g.down(dxroom, size_t(M * K)), sentinel);
  const FVec dx = widen(g.down(dx16, size_t(M * K)));
  const FVec dx_fp32 = g.down(dx32, size_t(M * K));
  int64_t bad = 0;
  for (int64_t i = 0; i < M; ++i) {
    std::vector<double> gv(static_cast<size_t>(r));
    for (int j = 0; j < r; ++j) {
      double e = 0;
      for (int64_t n = 0; n < N; ++n) e += double(dy[size_t(i * N + n)]) * B[size_t(n * r + j)];
      gv[size_t(j)] = bf16_round(e);
    }
    for (int64_t k = 0; k < K; ++k) {
      double base = 0, lo = 0, mag = 0, m = 0;
      for (int64_t n = 0; n < N; ++n) {
        base += double(dy[size_t(i * N + n)]) * wv[size_t(n * K + k)];
        m += std::fabs(double(dy[size_t(i * N + n)]) * wv[size_t(n * K + k)]);
      }
      for (int j = 0; j < r; ++j) {
        lo += gv[size_t(j)] * A[size_t(j * K + k)];
        mag += std::fabs(gv[size_t(j)] * A[size_t(j * K + k)]);
      }
      // g's own rounding (one bf16 step of each g, either way of a tie) and the LoRA term's
      const double extra = s * std::ldexp(mag, -7) + std::ldexp(std::fabs(s * lo), -8);
      bad += !within(dx[size_t(i * K + k)], base + s * lo, extra, m + s * mag);
    }
  }
  EXPECT_EQ(bad, 0);
  EXPECT_LT(norm_err(dx, dx_fp32), 1e-2);  // and near the fp32 dx of the same call
}

// rmsnorm_bwd_16: dx (accumulated) as the CPU backend's rmsnorm_bwd, dx16 its values rounded.
TEST(CudaBf16Outputs, RmsnormBwdWritesTheResidualGradientIn16Bits) {
  QLFT_NEED_GPU();
  Bf16Gpu g;
  auto cpu = make_cpu_backend(&g.tr);
  std::mt19937_64 rng(7);
  const int64_t M = 19, C = 96;
  const FVec x = bf16_normal(rng, size_t(M * C), 1.f), w = bf16_normal(rng, size_t(C), 1.f),
             dy = bf16_normal(rng, size_t(M * C), 1.f), dx0 = bf16_normal(rng, size_t(M * C), 1.f);
  FVec rstd(static_cast<size_t>(M));
  for (int64_t i = 0; i < M; ++i) {
    double ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += double(x[size_t(i * C + c)]) * x[size_t(i * C + c)];
    rstd[size_t(i)] = float(1.0 / std::sqrt(ss / double(C) + 1e-5));
  }
  FVec want = dx0;
  cpu->rmsnorm_bwd(CMatF(x.data(), M, C), w.data(), rstd.data(), CMatF(dy.data(), M, C),
                   MatF(want.data(), M, C));
  float* dxd = g.up(dx0);
  uint16_t* dx16 = g.up(HVec(size_t(M * C), 0x7fc0));
  const uint64_t conv0 = conversions(*g.gpu);
  g.gpu->rmsnorm_bwd_16(CMatF(g.up(x), M, C), g.up(w), g.up(rstd), CMatF(g.up(dy), M, C),
                        MatF(dxd, M, C), DType::BF16, dx16);
  EXPECT_EQ(conversions(*g.gpu), conv0);
  const FVec got = g.down(dxd, size_t(M * C));
  EXPECT_LT(norm_err(got, want), 1e-6);
  EXPECT_EQ(g.down(dx16, size_t(M * C)), to_bf16(got));
}

// attention_bwd_16 with the runner's bf16 q / k / v / out: dv written in bf16 by the tensor-core
// kernel equals the same kernel's fp32 dv (attention_bwd into zeros, same hints) rounded, bit
// for bit; and that dv follows the CPU backend's (bf16-level error).
TEST(CudaBf16Outputs, AttentionBwdWritesDvIn16Bits) {
  QLFT_NEED_GPU();
  Bf16Gpu g;
  auto cpu = make_cpu_backend(&g.tr);
  std::mt19937_64 rng(8);
  AttnShape sh;
  sh.n_heads = 4;
  sh.n_kv_heads = 2;
  sh.head_dim = 64;
  sh.batch = 2;
  sh.seq = 21;
  const int64_t R = sh.batch * sh.seq, qd = sh.q_dim(), kvd = sh.kv_dim();
  ASSERT_TRUE(cuda_attention_tensor_cores(Precision::BF16, true, sh.head_dim));
  const FVec q = bf16_normal(rng, size_t(R * qd), 1.f), k = bf16_normal(rng, size_t(R * kvd), 1.f),
             v = bf16_normal(rng, size_t(R * kvd), 1.f),
             dout = bf16_normal(rng, size_t(R * qd), 1.f);
  const uint16_t *q16 = g.up(to_bf16(q)), *k16 = g.up(to_bf16(k)), *v16 = g.up(to_bf16(v));
  float *qd_ = g.up(q), *kd = g.up(k), *vd = g.up(v), *doutd = g.up(dout);
  const uint16_t* dout16 = g.up(to_bf16(dout));  // as the o projection's dx GEMM writes it
  uint16_t* out16 = g.up(HVec(size_t(R * qd), 0));
  float* out = g.up(FVec(size_t(R * qd), 0.f));
  float* lse = g.up(FVec(size_t(sh.n_heads * R), 0.f));
  g.gpu->attention_inputs_16(DType::BF16, q16, k16, v16);
  g.gpu->attention_fwd_to_16(sh, CMatF(qd_, R, qd), CMatF(kd, R, kvd), CMatF(vd, R, kvd),
                             MatF(out, R, qd), lse, DType::BF16, out16);
  // fp32 gradients from the same kernel
  float *dq = g.up(FVec(size_t(R * qd), 0.f)), *dk = g.up(FVec(size_t(R * kvd), 0.f)),
        *dv = g.up(FVec(size_t(R * kvd), 0.f));
  g.gpu->attention_inputs_16(DType::BF16, q16, k16, v16);
  g.gpu->attention_out_16(DType::BF16, out16, dout16);
  g.gpu->attention_bwd(sh, CMatF(qd_, R, qd), CMatF(kd, R, kvd), CMatF(vd, R, kvd),
                       CMatF(out, R, qd), lse, CMatF(doutd, R, qd), MatF(dq, R, qd),
                       MatF(dk, R, kvd), MatF(dv, R, kvd));
  // and the 16-bit form
  std::vector<int32_t> pos(static_cast<size_t>(R));
  for (int64_t i = 0; i < R; ++i) pos[size_t(i)] = int32_t(i % sh.seq);
  const RopeFreqs fr = RopeFreqs::plain(10000.f, sh.head_dim);
  RopeArgs ra;
  ra.pos = g.up(pos);
  ra.freqs = &fr;
  uint16_t *dq16 = g.up(HVec(size_t(R * qd), 0)), *dk16 = g.up(HVec(size_t(R * kvd), 0)),
           *dv16 = g.up(HVec(size_t(R * kvd), 0x7fc0));
  g.gpu->attention_inputs_16(DType::BF16, q16, k16, v16);
  g.gpu->attention_out_16(DType::BF16, out16, dout16);
  const uint64_t conv0 = conversions(*g.gpu);
  g.gpu->attention_bwd_16(sh, CMatF(qd_, R, qd), CMatF(kd, R, kvd), CMatF(vd, R, kvd),
                          CMatF(out, R, qd), lse, CMatF(doutd, R, qd), ra, DType::BF16,
                          View2<uint16_t>(dq16, R, qd, qd), View2<uint16_t>(dk16, R, kvd, kvd),
                          View2<uint16_t>(dv16, R, kvd, kvd));
  EXPECT_EQ(conversions(*g.gpu), conv0);
  const FVec dv32 = g.down(dv, size_t(R * kvd));
  EXPECT_EQ(g.down(dv16, size_t(R * kvd)), to_bf16(dv32));
  // The CPU backend's dv on the same (bf16-valued) inputs and the device's rounded out.
  const FVec outr = widen(g.down(out16, size_t(R * qd)));
  const FVec lse_h = g.down(lse, size_t(sh.n_heads * R));
  FVec cq(size_t(R * qd), 0.f), ck(size_t(R * kvd), 0.f), cv(size_t(R * kvd), 0.f);
  cpu->attention_bwd(sh, CMatF(q.data(), R, qd), CMatF(k.data(), R, kvd), CMatF(v.data(), R, kvd),
                     CMatF(outr.data(), R, qd), lse_h.data(), CMatF(dout.data(), R, qd),
                     MatF(cq.data(), R, qd), MatF(ck.data(), R, kvd), MatF(cv.data(), R, kvd));
  EXPECT_LT(norm_err(dv32, cv), 2e-2);
}
