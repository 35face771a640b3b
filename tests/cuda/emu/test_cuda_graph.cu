// The emulator's stream capture and CUDA graphs (cuda/emu/src/graph.cpp) against CUDA's stated
// semantics: a captured sequence (fills, kernels, a cuBLASLt matmul, copies, events) replayed by
// cudaGraphLaunch gives the bytes the same sequence gives run eagerly, reading device memory as
// it is at replay and the launch's scalars as they were at capture; what CUDA forbids during a
// capture fails with CUDA's error and invalidates it; a forked stream must be joined back; the
// runtime counts a replay as one graph launch. Built only with -DQLFT_CUDA_EMULATE=ON.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "check.h"
#include "launch_count.h"

namespace {

__global__ void k_axpy(float a, const float* x, float* y, int n) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) y[i] = a * x[i] + y[i];
}

__global__ void k_square(float* y, int n) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) y[i] = y[i] * y[i];
}

struct Buf {
  float* p = nullptr;
  size_t n;
  explicit Buf(size_t count) : n(count) { QLFT_CUDA_CHECK(cudaMalloc(&p, n * 4)); }
  ~Buf() { QLFT_CUDA_WARN(cudaFree(p)); }
  void put(const std::vector<float>& v) {
    QLFT_CUDA_CHECK(cudaMemcpy(p, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
  }
  std::vector<float> get() const {
    std::vector<float> v(n);
    QLFT_CUDA_CHECK(cudaMemcpy(v.data(), p, n * 4, cudaMemcpyDeviceToHost));
    return v;
  }
};

// D (2x2, column-major) = alpha * A B.
struct Gemm2x2 {
  cublasLtHandle_t h = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t l = nullptr;
  Gemm2x2() {
    QLFT_CUBLAS_CHECK(cublasLtCreate(&h));
    QLFT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    QLFT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, CUDA_R_32F, 2, 2, 2));
  }
  ~Gemm2x2() {
    QLFT_CUBLAS_WARN(cublasLtMatrixLayoutDestroy(l));
    QLFT_CUBLAS_WARN(cublasLtMatmulDescDestroy(op));
    QLFT_CUBLAS_WARN(cublasLtDestroy(h));
  }
  void run(float alpha, const float* A, const float* B, float* D, cudaStream_t s) {
    const float beta = 0.f;
    QLFT_CUBLAS_CHECK(
        cublasLtMatmul(h, op, &alpha, A, l, B, l, &beta, D, l, D, l, nullptr, nullptr, 0, s));
  }
};

// The sequence both ways: y = 0; y += 2 x; y = y^2; D = 0.5 * Y[0:4] X[0:4]; out = y; event.
struct Sequence {
  static constexpr int n = 300;  // two blocks of 256, the second ragged
  Buf x{n}, y{n}, out{n}, d{4};
  Gemm2x2 gemm;
  float a = 2.f;
  void issue(cudaStream_t s, cudaEvent_t done) {
    QLFT_CUDA_CHECK(cudaMemsetAsync(y.p, 0, n * 4, s));
    qlft::cu::launch(k_axpy, dim3(2), dim3(256), 0, s, a, x.p, y.p, n);
    qlft::cu::launch(k_square, dim3(2), dim3(256), 0, s, y.p, n);
    gemm.run(0.5f, y.p, x.p, d.p, s);
    QLFT_CUDA_CHECK(cudaMemcpyAsync(out.p, y.p, n * 4, cudaMemcpyDeviceToDevice, s));
    QLFT_CUDA_CHECK(cudaEventRecord(done, s));
  }
};

std::vector<float> ramp(int n, float base) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[size_t(i)] = base + 0.25f * float(i % 17) - 1.f;
  return v;
}

void expect_bits_equal(const std::vector<float>& a, const std::vector<float>& b) {
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
}

class EmuGraph : public ::testing::Test {
 protected:
  void SetUp() override {
    QLFT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    QLFT_CUDA_CHECK(cudaEventCreate(&ev));
  }
  void TearDown() override {
    (void)cudaGetLastError();  // the refusals below leave theirs
    QLFT_CUDA_WARN(cudaEventDestroy(ev));
    QLFT_CUDA_WARN(cudaStreamDestroy(s));
  }
  cudaStream_t s = nullptr;
  cudaEvent_t ev = nullptr;
};

TEST_F(EmuGraph, ReplayEqualsEagerAndReadsMemoryAtReplay) {
  Sequence eager, cap;
  for (Sequence* q : {&eager, &cap}) q->x.put(ramp(Sequence::n, 0.f));
  eager.issue(s, ev);
  QLFT_CUDA_CHECK(cudaStreamSynchronize(s));

  const std::vector<float> before = cap.out.get();
  QLFT_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  QLFT_CUDA_CHECK(cudaStreamIsCapturing(s, &st));
  EXPECT_EQ(st, cudaStreamCaptureStatusActive);
  cap.issue(s, ev);
  EXPECT_EQ(cudaEventQuery(ev), cudaErrorCapturedEvent);  // recorded into the open capture
  (void)cudaGetLastError();
  cudaGraph_t g = nullptr;
  QLFT_CUDA_CHECK(cudaStreamEndCapture(s, &g));
  ASSERT_NE(g, nullptr);
  size_t nodes = 0;
  QLFT_CUDA_CHECK(cudaGraphGetNodes(g, nullptr, &nodes));
  EXPECT_EQ(nodes, 6u);                      // memset, 2 kernels, matmul, copy, event
  expect_bits_equal(cap.out.get(), before);  // capturing ran nothing
  cudaGraphExec_t x = nullptr;
  QLFT_CUDA_CHECK(cudaGraphInstantiate(&x, g, 0));
  QLFT_CUDA_CHECK(cudaGraphDestroy(g));  // the executable graph is a copy
  QLFT_CUDA_CHECK(cudaGraphLaunch(x, s));
  QLFT_CUDA_CHECK(cudaStreamSynchronize(s));
  EXPECT_EQ(cudaEventQuery(ev), cudaSuccess);
  expect_bits_equal(cap.out.get(), eager.out.get());
  expect_bits_equal(cap.d.get(), eager.d.get());

  // New input bytes at the same address: the replay reads them (pointers are fixed, data not).
  for (Sequence* q : {&eager, &cap}) q->x.put(ramp(Sequence::n, 3.f));
  eager.issue(s, ev);
  QLFT_CUDA_CHECK(cudaGraphLaunch(x, s));
  QLFT_CUDA_CHECK(cudaStreamSynchronize(s));
  expect_bits_equal(cap.out.get(), eager.out.get());
  expect_bits_equal(cap.d.get(), eager.d.get());
  EXPECT_NE(cap.out.get()[1], before[1]);
  QLFT_CUDA_CHECK(cudaGraphExecDestroy(x));
  EXPECT_EQ(cudaGraphLaunch(x, s), cudaErrorInvalidResourceHandle);
}

TEST_F(EmuGraph, KernelAndMatmulScalarsAreThoseOfCaptureTime) {
  Buf x(4), y(4), d(4);
  x.put({1.f, 2.f, 3.f, 4.f});
  Gemm2x2 gemm;
  float a = 3.f, alpha = 1.f;
  QLFT_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  QLFT_CUDA_CHECK(cudaMemsetAsync(y.p, 0, 16, s));
  qlft::cu::launch(k_axpy, dim3(1), dim3(32), 0, s, a, x.p, y.p, 4);
  gemm.run(alpha, x.p, x.p, d.p, s);
  cudaGraph_t g = nullptr;
  QLFT_CUDA_CHECK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t ex = nullptr;
  QLFT_CUDA_CHECK(cudaGraphInstantiate(&ex, g));
  a = 100.f;  // changed after capture: a kernel node keeps the value it was launched with
  alpha = 100.f;
  QLFT_CUDA_CHECK(cudaGraphLaunch(ex, s));
  QLFT_CUDA_CHECK(cudaStreamSynchronize(s));
  EXPECT_EQ(y.get(), (std::vector<float>{3.f, 6.f, 9.f, 12.f}));
  // [1 3; 2 4] squared (column-major) = [7 15; 10 22].
  EXPECT_EQ(d.get(), (std::vector<float>{7.f, 10.f, 15.f, 22.f}));
  QLFT_CUDA_CHECK(cudaGraphExecDestroy(ex));
  QLFT_CUDA_CHECK(cudaGraphDestroy(g));
}

// Begins a capture, makes `forbidden` return its error, then shows the capture invalidated:
// further work is refused and ending it gives no graph.
template <class F>
void expect_invalidates(cudaStream_t s, cudaStreamCaptureMode mode, cudaError_t want, F forbidden) {
  Buf y(4);
  QLFT_CUDA_CHECK(cudaStreamBeginCapture(s, mode));
  QLFT_CUDA_CHECK(cudaMemsetAsync(y.p, 0, 16, s));
  EXPECT_EQ(forbidden(), want);
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  QLFT_CUDA_CHECK(cudaStreamIsCapturing(s, &st));
  EXPECT_EQ(st, cudaStreamCaptureStatusInvalidated);
  EXPECT_EQ(cudaMemsetAsync(y.p, 0, 16, s), cudaErrorStreamCaptureInvalidated);
  cudaGraph_t g = reinterpret_cast<cudaGraph_t>(&st);
  EXPECT_EQ(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(g, nullptr);
  QLFT_CUDA_CHECK(cudaStreamIsCapturing(s, &st));
  EXPECT_EQ(st, cudaStreamCaptureStatusNone);  // ended: the stream works eagerly again
  (void)cudaGetLastError();
  QLFT_CUDA_CHECK(cudaMemsetAsync(y.p, 0, 16, s));
}

TEST_F(EmuGraph, ForbiddenCallsFailAndInvalidateTheCapture) {
  Buf d(4);
  std::vector<float> h(4);
  const auto G = cudaStreamCaptureModeGlobal, T = cudaStreamCaptureModeThreadLocal;
  expect_invalidates(s, G, cudaErrorStreamCaptureUnsupported,
                     [&] { return cudaMemcpy(h.data(), d.p, 16, cudaMemcpyDeviceToHost); });
  expect_invalidates(s, T, cudaErrorStreamCaptureUnsupported,
                     [&] { return cudaMemset(d.p, 0, 16); });
  expect_invalidates(s, cudaStreamCaptureModeRelaxed, cudaErrorStreamCaptureUnsupported,
                     [&] { return cudaStreamSynchronize(s); });
  expect_invalidates(s, T, cudaErrorStreamCaptureUnsupported, [&] { return cudaStreamQuery(s); });
  expect_invalidates(s, G, cudaErrorStreamCaptureUnsupported,
                     [] { return cudaDeviceSynchronize(); });
  expect_invalidates(s, T, cudaErrorStreamCaptureUnsupported, [] {
    void* p = nullptr;
    return cudaMalloc(&p, 64);
  });
  Buf spare(1);  // allocated before the capture: cudaMalloc in it would be refused too
  expect_invalidates(s, G, cudaErrorStreamCaptureUnsupported, [&] { return cudaFree(spare.p); });
  // Legacy-stream work implicitly waits for a blocking stream, which cannot capture then.
  cudaStream_t blocking = nullptr;
  QLFT_CUDA_CHECK(cudaStreamCreate(&blocking));
  expect_invalidates(blocking, cudaStreamCaptureModeRelaxed, cudaErrorStreamCaptureImplicit,
                     [&] { return cudaMemsetAsync(d.p, 0, 16, nullptr); });
  QLFT_CUDA_CHECK(cudaStreamDestroy(blocking));
  // A kernel launched into an invalidated capture fails at its checked launch.
  QLFT_CUDA_CHECK(cudaStreamBeginCapture(s, G));
  EXPECT_EQ(cudaStreamSynchronize(s), cudaErrorStreamCaptureUnsupported);
  EXPECT_THROW(qlft::cu::launch(k_square, dim3(1), dim3(32), 0, s, d.p, 4), qlft::Error);
  cudaGraph_t g = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
}

TEST_F(EmuGraph, RelaxedCaptureAllowsAllocationAndMisuseIsRefused) {
  QLFT_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, 64), cudaSuccess);
  EXPECT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), cudaErrorIllegalState);
  cudaGraph_t g = nullptr;
  QLFT_CUDA_CHECK(cudaStreamEndCapture(s, &g));
  QLFT_CUDA_CHECK(cudaFree(p));
  size_t nodes = 1;
  QLFT_CUDA_CHECK(cudaGraphGetNodes(g, nullptr, &nodes));
  EXPECT_EQ(nodes, 0u);
  QLFT_CUDA_CHECK(cudaGraphDestroy(g));
  EXPECT_EQ(cudaStreamEndCapture(s, &g), cudaErrorIllegalState);
  EXPECT_EQ(cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeGlobal),
            cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(cudaGraphDestroy(g), cudaErrorInvalidResourceHandle);
}

TEST_F(EmuGraph, ForkedStreamMustJoinBeforeTheCaptureEnds) {
  Buf x(4), y(4);
  x.put({1.f, 2.f, 3.f, 4.f});
  cudaStream_t side = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
  QLFT_CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  QLFT_CUDA_CHECK(cudaEventCreate(&fork));
  QLFT_CUDA_CHECK(cudaEventCreate(&join));
  for (bool joined : {false, true}) {
    QLFT_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    QLFT_CUDA_CHECK(cudaMemsetAsync(y.p, 0, 16, s));
    QLFT_CUDA_CHECK(cudaEventRecord(fork, s));
    QLFT_CUDA_CHECK(cudaStreamWaitEvent(side, fork));  // side joins the capture
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    QLFT_CUDA_CHECK(cudaStreamIsCapturing(side, &st));
    EXPECT_EQ(st, cudaStreamCaptureStatusActive);
    qlft::cu::launch(k_axpy, dim3(1), dim3(32), 0, side, 2.f, x.p, y.p, 4);
    if (joined) {
      QLFT_CUDA_CHECK(cudaEventRecord(join, side));
      QLFT_CUDA_CHECK(cudaStreamWaitEvent(s, join));
    }
    qlft::cu::launch(k_square, dim3(1), dim3(32), 0, s, y.p, 4);
    cudaGraph_t g = nullptr;
    const cudaError_t e = cudaStreamEndCapture(s, &g);
    QLFT_CUDA_CHECK(cudaStreamIsCapturing(side, &st));
    EXPECT_EQ(st, cudaStreamCaptureStatusNone);
    if (!joined) {
      EXPECT_EQ(e, cudaErrorStreamCaptureUnjoined);
      EXPECT_EQ(g, nullptr);
      (void)cudaGetLastError();
      continue;
    }
    ASSERT_EQ(e, cudaSuccess);
    cudaGraphExec_t ex = nullptr;
    QLFT_CUDA_CHECK(cudaGraphInstantiate(&ex, g));
    QLFT_CUDA_CHECK(cudaGraphLaunch(ex, s));
    QLFT_CUDA_CHECK(cudaStreamSynchronize(s));
    EXPECT_EQ(y.get(), (std::vector<float>{4.f, 16.f, 36.f, 64.f}));
    QLFT_CUDA_CHECK(cudaGraphExecDestroy(ex));
    QLFT_CUDA_CHECK(cudaGraphDestroy(g));
  }
  QLFT_CUDA_CHECK(cudaEventDestroy(join));
  QLFT_CUDA_CHECK(cudaEventDestroy(fork));
  QLFT_CUDA_CHECK(cudaStreamDestroy(side));
}

// Captured work counts once, where the host submitted it; each replay is one graph launch.
TEST_F(EmuGraph, AReplayCountsAsOneGraphLaunch) {
  Sequence q;
  q.x.put(ramp(Sequence::n, 1.f));
  // By difference: a new stream may reuse a destroyed one's address, and its counts.
  const qlft_emu::StreamCounts b = qlft_emu::stream_counts()[s];
  QLFT_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  q.issue(s, ev);
  cudaGraph_t g = nullptr;
  QLFT_CUDA_CHECK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t ex = nullptr;
  QLFT_CUDA_CHECK(cudaGraphInstantiate(&ex, g));
  const qlft_emu::StreamCounts c0 = qlft_emu::stream_counts()[s];
  EXPECT_EQ(c0.kernels - b.kernels, 2u);
  EXPECT_EQ(c0.matmuls - b.matmuls, 1u);
  EXPECT_EQ(c0.memsets - b.memsets, 1u);
  EXPECT_EQ(c0.memcpys - b.memcpys, 1u);
  EXPECT_EQ(c0.graphs - b.graphs, 0u);
  const uint64_t backend0 = qlft::cu::launches_total();
  for (int i = 0; i < 3; ++i) QLFT_CUDA_CHECK(cudaGraphLaunch(ex, s));
  const qlft_emu::StreamCounts c1 = qlft_emu::stream_counts()[s];
  EXPECT_EQ(c1.kernels, c0.kernels);
  EXPECT_EQ(c1.matmuls, c0.matmuls);
  EXPECT_EQ(c1.graphs - c0.graphs, 3u);
  EXPECT_EQ(c1.memcpys, c0.memcpys);
  EXPECT_EQ(qlft::cu::launches_total(), backend0);  // cudaGraphLaunch is not cu::launch
  QLFT_CUDA_CHECK(cudaGraphExecDestroy(ex));
  QLFT_CUDA_CHECK(cudaGraphDestroy(g));
}

}  // namespace
