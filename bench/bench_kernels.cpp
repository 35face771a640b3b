// CPU kernel benchmarks at SmolLM2-135M shapes, through the Backend interface as the model calls
// them, plus the raw GEMMs that set the machine's measured bf16 peak.
//
//   OMP_WAIT_POLICY=passive build-bench/bench/bench_kernels [--benchmark_filter=linear]
//
// Shapes: dim 576, ffn 1536, 9 query / 3 KV heads of 64, vocab 49152, rows = 4 x 512 = 2048
// (QLFT_BENCH_ROWS overrides),
// LoRA r = 16 (alpha 32). Threads: QLFT_BENCH_THREADS (default 2).
//
// Before any benchmark runs, main() measures the machine's bf16 GEMM peak: the largest GFLOP/s
// of oneDNN's bf16 matmul (qlft::cpu::gemm_bf16) over a few large square and skinny shapes
// (QLFT_BENCH_PEAK_GFLOPS=x skips the measurement and uses x), and the same for OpenBLAS sgemm
// (QLFT_BENCH_F32_PEAK_GFLOPS). On a CPU without AVX512-BF16 oneDNN emulates bf16 and the fp32
// figure is the higher one. Every benchmark then reports:
//   GFLOP/s    its model FLOPs per second of wall time
//   peak_frac  GFLOP/s divided by the measured bf16 peak
//   best_frac  GFLOP/s divided by the better of the two peaks
// Model FLOPs count each GEMM of the math once (2 per multiply-add), never a recomputation:
// linear forward 2MKN (+ LoRA 2Mr(K+N)), linear backward 2MKN for dx (+ LoRA dx, dA, dB
// 4Mr(K+N)), causal attention forward 2 * 2 * D * H * B * S(S+1)/2 and backward twice that,
// cross-entropy 2MVH forward and 2MVH for dh. Pointwise kernels report bytes/s instead.
//
// "/bf16" variants run behind the autocast backend (train.precision = bf16), as training does.
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/autocast_backend.h"
#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/gemm_bf16.h"
#include "backend/cpu/vec_kernels.h"
#include "core/half.h"
#include "core/memory.h"
#include "core/threads.h"
#include "quant/ggml_types.h"
#include "quant/qweight.h"

namespace {

using namespace qlft;

constexpr int kDim = 576, kFfn = 1536, kHeads = 9, kKvHeads = 3, kHeadDim = 64, kVocab = 49152;
constexpr int kRank = 16;
// Rows of the activations: QLFT_BENCH_ROWS, default 4 x 512 (a micro-batch of 4 at seq 512).
const int kRows = [] {
  const char* r = std::getenv("QLFT_BENCH_ROWS");
  return r && std::atoi(r) > 0 ? std::atoi(r) : 4 * 512;
}();
constexpr float kTheta = 100000.f;

double g_peak_gflops = 0;  // measured (or given) bf16 GEMM peak
double g_best_gflops = 0;  // max(bf16 peak, fp32 sgemm peak): the best GEMM the machine has

MemoryTracker& tracker() {
  static MemoryTracker t;
  return t;
}

std::vector<float> randn(size_t n, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Random Q4_1 blocks: f16 scale d, f16 min m, 16 bytes of 4-bit codes for 32 elements.
QWeight make_q4_1(int64_t rows, int64_t cols, uint32_t seed) {
  const int64_t nb = rows * cols / 32;
  std::vector<uint8_t> blocks(size_t(nb) * 20);
  std::mt19937 rng(seed);
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* p = blocks.data() + b * 20;
    const uint16_t d = f32_to_f16(0.01f), m = f32_to_f16(-0.08f);
    std::memcpy(p, &d, 2);
    std::memcpy(p + 2, &m, 2);
    for (int i = 0; i < 16; ++i) p[4 + i] = uint8_t(rng());
  }
  return qweight_from_ggml(&tracker(), uint32_t(GgmlType::Q4_1), blocks.data(), rows, cols);
}

// Random Q8_0 blocks: f16 scale d, 32 int8 codes.
QWeight make_q8_0(int64_t rows, int64_t cols, uint32_t seed) {
  const int64_t nb = rows * cols / 32;
  std::vector<uint8_t> blocks(size_t(nb) * 34);
  std::mt19937 rng(seed);
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* p = blocks.data() + b * 34;
    const uint16_t d = f32_to_f16(0.0005f);
    std::memcpy(p, &d, 2);
    for (int i = 0; i < 32; ++i) p[2 + i] = uint8_t(rng());
  }
  return qweight_from_ggml(&tracker(), uint32_t(GgmlType::Q8_0), blocks.data(), rows, cols);
}

QWeight make_weight(const std::string& kind, int64_t rows, int64_t cols, uint32_t seed) {
  if (kind == "q4_1") return make_q4_1(rows, cols, seed);
  if (kind == "q8_0") return make_q8_0(rows, cols, seed);
  std::vector<float> w = randn(size_t(rows * cols), 0.04f, seed);
  return qweight_from_f32(&tracker(), w.data(), rows, cols,
                          kind == "nf4" ? QuantKind::NF4 : QuantKind::F32);
}

// tune: sets the CPU backend's tuning before the bf16 wrapper goes on.
std::unique_ptr<Backend> make_backend(bool bf16,
                                      const std::function<void(cpu::CpuTuning&)>& tune = {}) {
  std::unique_ptr<Backend> be = make_cpu_backend(&tracker());
  if (tune) tune(static_cast<cpu::CpuBackend&>(*be).tune);
  if (bf16) be = make_autocast_backend(std::move(be), DType::BF16);
  return be;
}

using Clock = std::chrono::steady_clock;

// Counters from wall time measured around the timing loop: Google Benchmark's rate counters
// divide by the main thread's CPU time, which is wrong for kernels running on several threads.
// Process CPU seconds (all threads): with other work on the machine, wall time is noise, while
// the CPU time a kernel burns (spinning and yielding included) is not.
double process_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// Set by each benchmark just before its timing loop (with t0).
thread_local double g_cpu0 = 0;

Clock::time_point start_clock() {
  g_cpu0 = process_cpu_s();
  return Clock::now();
}

void report(benchmark::State& st, double flops_per_iter, Clock::time_point t0) {
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  const double gflops = flops_per_iter * double(st.iterations()) / s * 1e-9;
  st.counters["GFLOP/s"] = gflops;
  // Model FLOPs per CPU-second (summed over threads): x threads gives the GFLOP/s an idle
  // machine would show if the threads never waited.
  const double cpu = process_cpu_s() - g_cpu0;
  if (cpu > 0) st.counters["GFLOP/cpu_s"] = flops_per_iter * double(st.iterations()) / cpu * 1e-9;
  if (g_peak_gflops > 0) st.counters["peak_frac"] = gflops / g_peak_gflops;
  if (g_best_gflops > 0) st.counters["best_frac"] = gflops / g_best_gflops;
}

void report_bytes(benchmark::State& st, double bytes_per_iter, Clock::time_point t0) {
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  st.counters["GB/s"] = bytes_per_iter * double(st.iterations()) / s * 1e-9;
}

// ---- raw GEMMs --------------------------------------------------------------------------------

// C[M, N] = A[M, K] B[N, K]^T, the x W^T of a linear layer.
void BM_sgemm(benchmark::State& st) {
  const int64_t M = st.range(0), N = st.range(1), K = st.range(2);
  std::vector<float> A = randn(size_t(M * K), 1, 1), B = randn(size_t(N * K), 1, 2),
                     C(size_t(M * N));
  const Clock::time_point t0 = start_clock();
  for (auto _ : st) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(M), int(N), int(K), 1.f, A.data(),
                int(K), B.data(), int(K), 0.f, C.data(), int(N));
    benchmark::DoNotOptimize(C.data());
  }
  report(st, 2.0 * M * N * K, t0);
}

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = f32_to_bf16(v[i]);
  return o;
}

void BM_gemm_bf16(benchmark::State& st) {
  const int64_t M = st.range(0), N = st.range(1), K = st.range(2);
  std::vector<uint16_t> A = to_bf16(randn(size_t(M * K), 1, 1)),
                        B = to_bf16(randn(size_t(N * K), 1, 2));
  std::vector<float> C(size_t(M * N));
  st.SetLabel(cpu::gemm_bf16_impl(false, true, M, N, K, K, K, N));
  const Clock::time_point t0 = start_clock();
  for (auto _ : st) {
    cpu::gemm_bf16(false, true, M, N, K, 1.f, A.data(), K, B.data(), K, 0.f, C.data(), N);
    benchmark::DoNotOptimize(C.data());
  }
  report(st, 2.0 * M * N * K, t0);
}

// Large square and skinny shapes (the model's are skinny: K or N = 576).
const std::vector<std::vector<int64_t>> kGemmShapes = {
    {2048, 2048, 2048}, {4096, 4096, 1024}, {2048, 1536, 576}, {2048, 576, 1536}, {2048, 8192, 576},
};

// Best GFLOP/s of gemm(M, N, K) over a few timed repetitions of each of kGemmShapes.
double process_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// Also sets *best_cpu: GFLOP per CPU-second of the process times the thread count, the peak
// with every thread busy, which other work on a shared machine does not lower the way it
// lowers wall-clock GFLOP/s.
template <class T, class Gemm>
double measure_peak(const char* what, Gemm gemm, T (*conv)(float), double* best_cpu) {
  double best = 0;
  *best_cpu = 0;
  for (const auto& s : kGemmShapes) {
    const int64_t M = s[0], N = s[1], K = s[2];
    std::vector<float> a = randn(size_t(M * K), 1, 1), b = randn(size_t(N * K), 1, 2);
    std::vector<T> A(a.size()), B(b.size());
    for (size_t i = 0; i < a.size(); ++i) A[i] = conv(a[i]);
    for (size_t i = 0; i < b.size(); ++i) B[i] = conv(b[i]);
    std::vector<float> C(size_t(M * N));
    gemm(M, N, K, A.data(), B.data(), C.data());
    const double flops = 2.0 * M * N * K;
    const int reps = std::max(1, int(1e10 / flops));  // ~10 GFLOP per timing
    for (int t = 0; t < 3; ++t) {
      auto t0 = Clock::now();
      const double c0 = process_cpu_seconds();
      for (int r = 0; r < reps; ++r) gemm(M, N, K, A.data(), B.data(), C.data());
      const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
      const double csec = process_cpu_seconds() - c0;
      best = std::max(best, flops * reps / sec * 1e-9);
      *best_cpu = std::max(*best_cpu, flops * reps / csec * 1e-9 * num_threads());
    }
    std::fprintf(stderr, "%s peak probe %lldx%lldx%lld: best so far %.1f GFLOP/s\n", what,
                 (long long)M, (long long)N, (long long)K, best);
  }
  return best;
}

float ident(float x) {
  return x;
}
uint16_t bf16_of(float x) {
  return f32_to_bf16(x);
}

double measure_bf16_peak(double* cpu) {
  // oneDNN 2.x has no bf16 matmul below AVX-512 (a Zen 3, or QLFT_CPU_ISA=avx2): no bf16 peak
  // there; MFU is then stated against the fp32 peak alone.
  if (!cpu::gemm_bf16_available()) return 0;
  return measure_peak<uint16_t>(
      "bf16",
      [](int64_t M, int64_t N, int64_t K, const uint16_t* A, const uint16_t* B, float* C) {
        cpu::gemm_bf16(false, true, M, N, K, 1.f, A, K, B, K, 0.f, C, N);
      },
      bf16_of, cpu);
}

// The better of the two fp32 engines the backend uses: OpenBLAS sgemm and oneDNN's fp32 matmul
// (the linear layers' x W^T, the LoRA and attention products on AVX-512), so an MFU against it
// is against the best fp32 GEMM the machine runs, not the slower engine's.
double measure_f32_peak(double* cpu) {
  double cpu_blas = 0, cpu_dnnl = 0;
  const double blas = measure_peak<float>(
      "fp32 (OpenBLAS sgemm)",
      [](int64_t M, int64_t N, int64_t K, const float* A, const float* B, float* C) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(M), int(N), int(K), 1.f, A, int(K),
                    B, int(K), 0.f, C, int(N));
      },
      ident, &cpu_blas);
  const double dnnl = measure_peak<float>(
      "fp32 (oneDNN matmul)",
      [](int64_t M, int64_t N, int64_t K, const float* A, const float* B, float* C) {
        cpu::gemm_f32_onednn(false, true, M, N, K, 1.f, A, K, B, K, 0.f, C, N);
      },
      ident, &cpu_dnnl);
  *cpu = std::max(cpu_blas, cpu_dnnl);
  return std::max(blas, dnnl);
}

// ---- linear with LoRA -------------------------------------------------------------------------

struct LinearCase {
  QWeight W;
  std::vector<float> A, B, x, y, xa, dy, dx, dA, dB;
  LoraRef lora;
  LinearCase(const std::string& kind, int64_t in, int64_t out) {
    W = make_weight(kind, out, in, 3);
    A = randn(size_t(kRank * in), 0.02f, 4);
    B = randn(size_t(out * kRank), 0.02f, 5);
    x = randn(size_t(kRows * in), 1, 6);
    dy = randn(size_t(kRows * out), 1e-3f, 7);
    y.resize(size_t(kRows * out));
    xa.resize(size_t(kRows * kRank));
    dx.resize(size_t(kRows * in));
    dA.resize(A.size());
    dB.resize(B.size());
    lora.A = A.data();
    lora.B = B.data();
    lora.r = kRank;
    lora.scale = 32.f / kRank;
  }
};

const char* kKinds[] = {"f32", "nf4", "q4_1", "q8_0"};
// (in, out): q/o projection, gate/up, down.
const int64_t kLinShapes[][2] = {{kDim, kDim}, {kDim, kFfn}, {kFfn, kDim}};

void BM_linear(benchmark::State& st) {
  const std::string kind = kKinds[st.range(0)];
  const int64_t in = kLinShapes[st.range(1)][0], out = kLinShapes[st.range(1)][1];
  const bool bf16 = st.range(2) != 0, bwd = st.range(3) != 0;
  auto be = make_backend(bf16);
  LinearCase c(kind, in, out);
  CMatF x(c.x.data(), kRows, in);
  if (bwd) be->linear_fwd(c.W, nullptr, &c.lora, x, MatF(c.y.data(), kRows, out), c.xa.data());
  const Clock::time_point t0 = start_clock();
  for (auto _ : st) {
    if (!bwd) {
      be->linear_fwd(c.W, nullptr, &c.lora, x, MatF(c.y.data(), kRows, out), c.xa.data());
    } else {
      be->linear_bwd(c.W, &c.lora, x, c.xa.data(), CMatF(c.dy.data(), kRows, out),
                     MatF(c.dx.data(), kRows, in), c.dA.data(), c.dB.data());
    }
    benchmark::ClobberMemory();
  }
  const double base = 2.0 * kRows * in * out, lora = 2.0 * kRows * kRank * (in + out);
  report(st, bwd ? base + 2 * lora : base + lora, t0);
  st.SetLabel(kind + " " + std::to_string(in) + "->" + std::to_string(out) +
              (bf16 ? " bf16" : " fp32") + (bwd ? " bwd" : " fwd"));
}

// ---- attention --------------------------------------------------------------------------------

// stair: the causal staircase's step rows on every engine (CpuTuning::attn_stair_rows and
// attn_stair_rows_bf16); -1 whole tiles; 0 the backend's defaults. bq: query rows per tile
// (CpuTuning::attn_block_q), 0 the default. amx: bf16 on the AMX tile path (attn_amx on).
void run_attention(benchmark::State& st, int seq, bool bf16, bool bwd, int64_t stair, int64_t bq,
                   bool amx) {
  const int batch = kRows / seq > 0 ? kRows / seq : 1;
  const int64_t R = int64_t(batch) * seq, qc = kHeads * kHeadDim, kc = kKvHeads * kHeadDim;
  auto be = make_backend(bf16, [&](cpu::CpuTuning& t) {
    if (stair != 0) t.attn_stair_rows = t.attn_stair_rows_bf16 = std::max<int64_t>(0, stair);
    if (bq > 0) t.attn_block_q = bq;
    if (amx) t.attn_amx = cpu::CpuTuning::AttnAmx::On;
  });
  AttnShape s;
  s.batch = batch;
  s.seq = seq;
  s.n_heads = kHeads;
  s.n_kv_heads = kKvHeads;
  s.head_dim = kHeadDim;
  std::vector<float> q = randn(size_t(R * qc), 1, 1), k = randn(size_t(R * kc), 1, 2),
                     v = randn(size_t(R * kc), 1, 3), o(size_t(R * qc)), lse(size_t(kHeads * R)),
                     dout = randn(size_t(R * qc), 1e-3f, 4), dq(q.size()), dk(k.size()),
                     dv(v.size());
  CMatF Q(q.data(), R, qc), K(k.data(), R, kc), V(v.data(), R, kc);
  be->attention_fwd(s, Q, K, V, MatF(o.data(), R, qc), lse.data());
  // The backward's oneDNN primitives made before the clock starts, as the forward's are: the
  // loop may run only a few iterations.
  if (bwd)
    be->attention_bwd(s, Q, K, V, CMatF(o.data(), R, qc), lse.data(), CMatF(dout.data(), R, qc),
                      MatF(dq.data(), R, qc), MatF(dk.data(), R, kc), MatF(dv.data(), R, kc));
  const Clock::time_point t0 = start_clock();
  for (auto _ : st) {
    if (!bwd)
      be->attention_fwd(s, Q, K, V, MatF(o.data(), R, qc), lse.data());
    else
      be->attention_bwd(s, Q, K, V, CMatF(o.data(), R, qc), lse.data(), CMatF(dout.data(), R, qc),
                        MatF(dq.data(), R, qc), MatF(dk.data(), R, kc), MatF(dv.data(), R, kc));
    benchmark::ClobberMemory();
  }
  const double fwd = 2.0 * 2.0 * kHeadDim * kHeads * batch * (double(seq) * (seq + 1) / 2);
  report(st, bwd ? 2 * fwd : fwd, t0);
  st.SetLabel("batch " + std::to_string(batch) + " x seq " + std::to_string(seq) +
              (bf16 ? (amx ? " bf16 amx" : " bf16") : " fp32") + (bwd ? " bwd" : " fwd") +
              (stair < 0   ? " whole tiles"
               : stair > 0 ? " steps of " + std::to_string(stair)
                           : "") +
              (bq > 0 ? " tiles of " + std::to_string(bq) : ""));
}

void BM_attention(benchmark::State& st) {
  run_attention(st, int(st.range(0)), st.range(1) != 0, st.range(2) != 0, st.range(3), st.range(4),
                false);
}

// attention_amx_fwd|bwd/seq/bq: the bf16 attention on the AMX tile path (only where the CPU has
// AMX), against attention_fwd|bwd/seq/1/... on oneDNN's tiles.
void BM_attention_amx(benchmark::State& st) {
  run_attention(st, int(st.range(0)), true, st.range(1) != 0, 0, st.range(2), true);
}

// ---- fused linear + cross-entropy -------------------------------------------------------------

void BM_linear_cross_entropy(benchmark::State& st) {
  const bool bf16 = st.range(0) != 0, with_dh = st.range(1) != 0;
  const std::string kind = kKinds[st.range(2)];
  auto be = make_backend(bf16);
  QWeight head = make_weight(kind, kVocab, kDim, 11);
  std::vector<float> h = randn(size_t(kRows * kDim), 1, 12), dh(h.size());
  std::vector<int32_t> tgt(kRows);
  std::mt19937 rng(13);
  for (int32_t& t : tgt) t = int32_t(rng() % kVocab);
  int64_t count = 0;
  const Clock::time_point t0 = start_clock();
  for (auto _ : st) {
    double loss =
        be->linear_cross_entropy(head, CMatF(h.data(), kRows, kDim), tgt.data(), -100, 1.f / kRows,
                                 with_dh ? MatF(dh.data(), kRows, kDim) : MatF(), &count);
    benchmark::DoNotOptimize(loss);
  }
  const double f = 2.0 * kRows * kVocab * kDim;
  report(st, with_dh ? 2 * f : f, t0);
  st.SetLabel(kind + (bf16 ? " bf16" : " fp32") + (with_dh ? " loss+dh" : " loss"));
}

// ---- pointwise --------------------------------------------------------------------------------

void BM_rmsnorm(benchmark::State& st) {
  const bool bwd = st.range(0) != 0;
  auto be = make_backend(false);
  std::vector<float> x = randn(size_t(kRows * kDim), 1, 1), w = randn(kDim, 1, 2), y(x.size()),
                     rstd(kRows), dy = randn(x.size(), 1, 3), dx(x.size());
  be->rmsnorm_fwd(CMatF(x.data(), kRows, kDim), w.data(), 1e-5f, MatF(y.data(), kRows, kDim),
                  rstd.data());
  const Clock::time_point t0 = start_clock();
  for (auto _ : st) {
    if (!bwd)
      be->rmsnorm_fwd(CMatF(x.data(), kRows, kDim), w.data(), 1e-5f, MatF(y.data(), kRows, kDim),
                      rstd.data());
    else
      be->rmsnorm_bwd(CMatF(x.data(), kRows, kDim), w.data(), rstd.data(),
                      CMatF(dy.data(), kRows, kDim), MatF(dx.data(), kRows, kDim));
    benchmark::ClobberMemory();
  }
  // fwd reads x, writes y; bwd reads x, dy and reads+writes dx.
  report_bytes(st, double(x.size()) * 4 * (bwd ? 4 : 2), t0);
  report(st, double(x.size()) * (bwd ? 8 : 4), t0);
}

// Arg 1: pairs of adjacent elements (GGUF Llama models, as the e2e model), 0: the two halves of
// each head (Hugging Face Llama, Qwen2).
void BM_rope(benchmark::State& st) {
  const bool adjacent = st.range(0) != 0;
  auto be = make_backend(false);
  const int64_t qc = kHeads * kHeadDim;
  std::vector<float> x = randn(size_t(kRows * qc), 1, 1);
  std::vector<int32_t> pos(kRows);
  for (int i = 0; i < kRows; ++i) pos[i] = i % 512;
  const RopeFreqs freqs = RopeFreqs::plain(kTheta, kHeadDim);  // the runner makes it once a batch
  const Clock::time_point t0 = start_clock();
  for (auto _ : st) {
    be->rope(MatF(x.data(), kRows, qc), pos.data(), kHeads, kHeadDim, freqs, adjacent, false);
    benchmark::ClobberMemory();
  }
  report_bytes(st, double(x.size()) * 4 * 2, t0);
  report(st, double(x.size()) * 3, t0);
}

void BM_swiglu(benchmark::State& st) {
  const bool bwd = st.range(0) != 0;
  auto be = make_backend(false);
  const size_t n = size_t(kRows) * kFfn;
  std::vector<float> g = randn(n, 1, 1), u = randn(n, 1, 2), o(n), d = randn(n, 1, 3), dg(n), du(n);
  const Clock::time_point t0 = start_clock();
  for (auto _ : st) {
    if (!bwd)
      be->swiglu_fwd(CMatF(g.data(), kRows, kFfn), CMatF(u.data(), kRows, kFfn),
                     MatF(o.data(), kRows, kFfn));
    else
      be->swiglu_bwd(CMatF(g.data(), kRows, kFfn), CMatF(u.data(), kRows, kFfn),
                     CMatF(d.data(), kRows, kFfn), MatF(dg.data(), kRows, kFfn),
                     MatF(du.data(), kRows, kFfn));
    benchmark::ClobberMemory();
  }
  report_bytes(st, double(n) * 4 * (bwd ? 5 : 3), t0);
  report(st, double(n) * (bwd ? 10 : 5), t0);
}

// The bf16 step's SwiGLU: gate and up as stored bf16 copies, the output (fwd) or the gate / up
// gradients (bwd) written as bf16 (swiglu_fwd_from_16, swiglu_bwd_to_16).
void BM_swiglu_16(benchmark::State& st) {
  const bool bwd = st.range(0) != 0;
  auto be = make_backend(true);
  const size_t n = size_t(kRows) * kFfn;
  std::vector<uint16_t> g16(n), u16(n), o16(n), dg16(n), du16(n);
  std::vector<float> g = randn(n, 1, 1), u = randn(n, 1, 2), d = randn(n, 1e-3f, 3);
  f32_to_bf16_n(g.data(), g16.data(), n);
  f32_to_bf16_n(u.data(), u16.data(), n);
  const Clock::time_point t0 = start_clock();
  for (auto _ : st) {
    if (!bwd)
      be->swiglu_fwd_from_16(DType::BF16, g16.data(), u16.data(), o16.data(), kRows, kFfn);
    else
      be->swiglu_bwd_to_16(DType::BF16, g16.data(), u16.data(), CMatF(d.data(), kRows, kFfn),
                           View2<uint16_t>(dg16.data(), kRows, kFfn),
                           View2<uint16_t>(du16.data(), kRows, kFfn));
    benchmark::ClobberMemory();
  }
  // fwd reads 2 and writes 1 bf16 tensor; bwd reads 2 bf16 and the fp32 dout, writes 2 bf16.
  report_bytes(st, double(n) * (bwd ? 2 * 4 + 4 : 2 * 3), t0);
  report(st, double(n) * (bwd ? 10 : 5), t0);
}

// The softmax passes of one attention score tile (128 query rows x 512 keys, fp32, in L2 as a
// task's tile is), on one thread, through the CPU's vec_kernels set: 0 the bf16 forward (max,
// exp and sum in place, probabilities scaled into bf16: tile_probs' fused path), 1 the bf16
// backward (exp(S - lse) into bf16, then dS = P (dP - D) into bf16), 2 the fp32 forward (max,
// exp and sum, scaled in place). ns/elem is per score. The forward leaves exponentials in the
// tile, so later iterations see scores in [0, 1]: the kernels have no value-dependent branches.
void BM_softmax_rows(benchmark::State& st) {
  const int kind = int(st.range(0));
  constexpr int64_t kTileRows = 128, kKeys = 512;
  const cpu::VecKernels& vk = cpu::vec_kernels();
  std::vector<float> s = randn(size_t(kTileRows * kKeys), 2, 1), dp = randn(s.size(), 1e-3f, 2);
  std::vector<uint16_t> p16(s.size()), ds16(s.size());
  const Clock::time_point t0 = start_clock();
  for (auto _ : st) {
    for (int64_t i = 0; i < kTileRows; ++i) {
      float* row = s.data() + i * kKeys;
      if (kind == 1) {
        vk.exp_shifted_bf16(row, kKeys, 4.f, p16.data() + i * kKeys);
        vk.softmax_bwd_row_bf16(dp.data() + i * kKeys, row, 1e-4f, kKeys, ds16.data() + i * kKeys);
        continue;
      }
      const float m = vk.max_of(row, kKeys);
      const float inv = float(1.0 / vk.exp_sum_shifted(row, kKeys, m));
      if (kind == 0)
        vk.scale_to_bf16(row, kKeys, inv, p16.data() + i * kKeys);
      else
        for (int64_t j = 0; j < kKeys; ++j) row[j] *= inv;
    }
    benchmark::ClobberMemory();
  }
  const double s_wall = std::chrono::duration<double>(Clock::now() - t0).count();
  st.counters["ns/elem"] = s_wall * 1e9 / (double(st.iterations()) * kTileRows * kKeys);
  st.SetLabel(std::string(kind == 0   ? "bf16 fwd"
                          : kind == 1 ? "bf16 bwd"
                                      : "fp32 fwd") +
              " 128x512, 1 thread");
}

// ---- dequantization ---------------------------------------------------------------------------

// Random GGUF blocks of any type: random bytes, with each f16 scale rewritten to a small normal
// value (random bytes could be NaN or inf).
QWeight make_ggml(GgmlType type, int64_t rows, int64_t cols, uint32_t seed) {
  const GgmlTypeTraits* t = ggml_type_traits(uint32_t(type));
  const int64_t nb = rows * cols / t->block;
  std::vector<uint8_t> blocks(size_t(nb) * t->bytes);
  std::mt19937 rng(seed);
  for (uint8_t& b : blocks) b = uint8_t(rng());
  const std::vector<size_t> f16_at = type == GgmlType::Q6_K ? std::vector<size_t>{208}
                                     : (type == GgmlType::Q4_0 || type == GgmlType::Q8_0)
                                         ? std::vector<size_t>{0}
                                         : std::vector<size_t>{0, 2};
  for (int64_t b = 0; b < nb; ++b)
    for (size_t o : f16_at) {
      const uint16_t h = f32_to_f16(0.01f);
      std::memcpy(blocks.data() + b * t->bytes + o, &h, 2);
    }
  return qweight_from_ggml(&tracker(), uint32_t(type), blocks.data(), rows, cols);
}

const char* kDequantKinds[] = {"nf4", "int8", "q4_0", "q4_1", "q8_0", "q4_k", "q6_k"};

// A whole [ffn, dim] weight ([dim, ffn] for the K-quants) to fp32, as the linear layers' panels do
// (one thread: the kernels themselves, per ISA path; QLFT_CPU_ISA picks the path). GB/s of fp32
// output.
void BM_dequant(benchmark::State& st) {
  const std::string kind = kDequantKinds[st.range(0)];
  // K-quant rows are whole 256-element super-blocks: those take the weight as [dim, ffn].
  const bool k_quant = kind == "q4_k" || kind == "q6_k";
  const int64_t rows = k_quant ? kDim : kFfn, cols = k_quant ? kFfn : kDim;
  QWeight w;
  if (kind == "nf4" || kind == "int8") {
    std::vector<float> f = randn(size_t(rows * cols), 0.04f, 21);
    w = qweight_from_f32(&tracker(), f.data(), rows, cols,
                         kind == "nf4" ? QuantKind::NF4 : QuantKind::INT8);
  } else {
    const GgmlType t = kind == "q4_0"   ? GgmlType::Q4_0
                       : kind == "q4_1" ? GgmlType::Q4_1
                       : kind == "q8_0" ? GgmlType::Q8_0
                       : kind == "q4_k" ? GgmlType::Q4_K
                                        : GgmlType::Q6_K;
    w = make_ggml(t, rows, cols, 22);
  }
  // bf16: straight into the bf16 panels the oneDNN GEMMs take (dequantize_rows_bf16).
  const bool bf16 = st.range(1) != 0;
  std::vector<float> out(bf16 ? 0 : size_t(rows * cols));
  std::vector<uint16_t> out16(bf16 ? size_t(rows * cols) : 0);
  const Clock::time_point t0 = start_clock();
  for (auto _ : st) {
    if (bf16)
      w.dequantize_rows_bf16(0, rows, out16.data());
    else
      w.dequantize_rows(0, rows, out.data());
    benchmark::ClobberMemory();
  }
  report_bytes(st, double(rows * cols) * (bf16 ? 2 : 4), t0);
  st.SetLabel(kind + " " + std::to_string(rows) + "x" + std::to_string(cols) +
              (bf16 ? " to bf16" : ""));
}

template <class Fn>
benchmark::internal::Benchmark* reg(const char* name, Fn fn) {
  return benchmark::RegisterBenchmark(name, fn)->UseRealTime()->Unit(benchmark::kMillisecond);
}

void register_all() {
  for (const auto& s : kGemmShapes) {
    reg("gemm/sgemm_openblas", BM_sgemm)->Args(s);
    if (cpu::gemm_bf16_available()) reg("gemm/bf16_onednn", BM_gemm_bf16)->Args(s);
  }
  for (int kind = 0; kind < 3; ++kind)
    for (int shape = 0; shape < 3; ++shape)
      for (int bf16 = 0; bf16 < 2; ++bf16)
        for (int bwd = 0; bwd < 2; ++bwd)
          reg(bwd ? "linear_bwd" : "linear_fwd", BM_linear)->Args({kind, shape, bf16, bwd});
  for (int seq : {512, 2048})
    for (int bf16 = 0; bf16 < 2; ++bf16)
      for (int bwd = 0; bwd < 2; ++bwd)
        for (int stair : {0, -1, 64, 32})
          for (int bq : {0, 64, 256})
            // At the e2e shape: the staircase's steps, and the tile rows with the steps at their
            // defaults.
            if ((seq == 512 || stair == 0) && (bq == 0 || (seq == 512 && stair == 0)))
              reg(bwd ? "attention_bwd" : "attention_fwd", BM_attention)
                  ->Args({seq, bf16, bwd, stair, bq});
  if (cpu::amx_hardware())
    for (int bwd = 0; bwd < 2; ++bwd)
      for (int bq : {0, 64, 256})
        reg(bwd ? "attention_amx_bwd" : "attention_amx_fwd", BM_attention_amx)
            ->Args({512, bwd, bq});
  for (int bf16 = 0; bf16 < 2; ++bf16)
    for (int dh = 0; dh < 2; ++dh)
      reg("linear_cross_entropy", BM_linear_cross_entropy)
          ->Args({bf16, dh, 3});  // the model's head is its Q8_0 token embedding (tied)
  for (int k = 0; k < 7; ++k)
    for (int bf16 = 0; bf16 < 2; ++bf16) reg("dequant", BM_dequant)->Args({k, bf16});
  reg("rmsnorm_fwd", BM_rmsnorm)->Arg(0);
  reg("rmsnorm_bwd", BM_rmsnorm)->Arg(1);
  reg("rope", BM_rope)->Arg(0)->Arg(1);
  reg("swiglu_fwd", BM_swiglu)->Arg(0);
  reg("swiglu_bwd", BM_swiglu)->Arg(1);
  reg("swiglu_fwd_16", BM_swiglu_16)->Arg(0);
  reg("swiglu_bwd_16", BM_swiglu_16)->Arg(1);
  for (int kind = 0; kind < 3; ++kind) reg("softmax_rows", BM_softmax_rows)->Arg(kind);
}

}  // namespace

int main(int argc, char** argv) {
  const char* th = std::getenv("QLFT_BENCH_THREADS");
  const int threads = th && *th ? std::atoi(th) : 2;
  qlft::set_num_threads(threads);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  const char* pk = std::getenv("QLFT_BENCH_PEAK_GFLOPS");
  const char* pf = std::getenv("QLFT_BENCH_F32_PEAK_GFLOPS");
  double bf16_cpu = 0, f32_cpu = 0;
  g_peak_gflops = pk && *pk ? std::atof(pk) : measure_bf16_peak(&bf16_cpu);
  const double f32 = pf && *pf ? std::atof(pf) : measure_f32_peak(&f32_cpu);
  g_best_gflops = std::max(g_peak_gflops, f32);
  // e2e.sh reads these two lines.
  std::fprintf(stderr, "bf16 GEMM peak (%s, %d threads, oneDNN %s): %.1f GFLOP/s\n",
               pk && *pk ? "given" : "measured", threads,
               cpu::gemm_bf16_native()      ? "native AVX512-BF16"
               : cpu::gemm_bf16_available() ? "without native bf16"
                                            : "none below AVX-512",
               g_peak_gflops);
  std::fprintf(stderr,
               "fp32 GEMM peak (%s, %d threads, the better of OpenBLAS sgemm and oneDNN matmul): "
               "%.1f GFLOP/s\n",
               pf && *pf ? "given" : "measured", threads, f32);
  if (bf16_cpu > 0 || f32_cpu > 0)
    std::fprintf(stderr, "GEMM peaks per CPU-second x %d threads: bf16 %.1f fp32 %.1f GFLOP/s\n",
                 threads, bf16_cpu, f32_cpu);
  benchmark::AddCustomContext("threads", std::to_string(threads));
  benchmark::AddCustomContext("bf16_peak_gflops", std::to_string(g_peak_gflops));
  benchmark::AddCustomContext("f32_peak_gflops", std::to_string(f32));
  benchmark::AddCustomContext("bf16_native", cpu::gemm_bf16_native() ? "yes" : "no");
  register_all();
  // Wall time throughout: the kernels run on several threads.
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
