// The CUDA emulator can fail (issue 17, Done-when 3): kernels with the bugs a GPU would punish
// are reported, not silently computed. Built only with -DQLFT_CUDA_EMULATE=ON (label cuda-emu).
//
// - block_sum with its first __syncthreads deleted (a copy of cuda/src/reduce.cuh's) reads the
//   NaN-filled shared array before the other warps wrote it (forward and random schedules);
// - reading one float past the dynamic shared buffer, a host dereference of a device pointer and
//   a kernel touching freed device memory die with the emulator's message;
// - shuffles exchange lanes as hardware does; a shuffle naming an exited lane, a deadlocked
//   barrier, a launch over __launch_bounds__ or over the shared-memory limit fail the launch;
// - copies in the wrong direction and past an allocation are refused;
// - cuBLASLt's 16-bit output is the fp32 result rounded to nearest even (ties, overflow).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda_entry.h"
#include "check.h"
#include "core/half.h"
#include "gemm.h"
#include "launch_count.h"
#include "reduce.cuh"
#include "support/test_support.h"

namespace {

using qlft::cu::launch;

// ---- A copy of qlft::cu::block_sum (reduce.cuh) with the first __syncthreads deleted ----------
__device__ float block_sum_missing_barrier(float v, float* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = qlft::cu::warp_sum(v);
  if (lane == 0) shared[warp] = v;
  // __syncthreads();   <- deleted: lanes read shared[] before every warp wrote it
  float r = lane < nw ? shared[lane] : 0.f;
  r = qlft::cu::warp_sum(r);
  __syncthreads();
  return r;
}

template <bool kBroken>
__global__ void __launch_bounds__(256) k_row_sums(const float* x, float* out, int cols) {
  __shared__ float red[32];
  float s = 0.f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) s += x[blockIdx.x * cols + c];
  s = kBroken ? block_sum_missing_barrier(s, red) : qlft::cu::block_sum(s, red);
  if (threadIdx.x == 0) out[blockIdx.x] = s;
}

struct Dev {
  float* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) { QLFT_CUDA_CHECK(cudaMalloc(&p, n * 4)); }
  ~Dev() { QLFT_CUDA_WARN(cudaFree(p)); }
  void put(const std::vector<float>& v) {
    QLFT_CUDA_CHECK(cudaMemcpy(p, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
  }
  std::vector<float> get() const {
    std::vector<float> v(n);
    QLFT_CUDA_CHECK(cudaMemcpy(v.data(), p, n * 4, cudaMemcpyDeviceToHost));
    return v;
  }
};

std::vector<float> row_sums(bool broken, const std::vector<float>& x, int rows, int cols) {
  Dev dx(x.size());
  Dev dout{size_t(rows)};
  dx.put(x);
  if (broken)
    launch(k_row_sums<true>, dim3(rows), dim3(256), 0, nullptr, dx.p, dout.p, cols);
  else
    launch(k_row_sums<false>, dim3(rows), dim3(256), 0, nullptr, dx.p, dout.p, cols);
  QLFT_CUDA_CHECK(cudaDeviceSynchronize());
  return dout.get();
}

class EmuSchedule : public ::testing::TestWithParam<const char*> {};

TEST_P(EmuSchedule, DeletedSyncthreadsIsCaughtAndIntactKernelIsExact) {
  qlft_emu::set_schedule(GetParam(), 12345);
  const int rows = 5, cols = 1000;  // ragged: 1000 = 3 * 256 + 232
  std::vector<float> x(size_t(rows) * cols);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i % 7) - 3);  // small integers: exact
  std::vector<double> want(rows, 0.0);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) want[r] += x[size_t(r) * cols + c];
  const std::vector<float> good = row_sums(false, x, rows, cols);
  for (int r = 0; r < rows; ++r) EXPECT_EQ(good[r], float(want[r])) << "row " << r;
  // Forward and random orders run a lane that reads shared[w] before warp w's lane 0 wrote it,
  // so every row is wrong (NaN from the fill). Reverse happens to run the writers first: one
  // fixed order never exposes every race, which is why random (a new order per pass, a new seed
  // per run) is the default.
  // With the race check (racecheck.cpp) the launch fails under every order, reverse included:
  // it sees the read of a word another thread wrote in the same barrier interval, whatever the
  // values. Without it (an ASan build) only the NaN fill can show the bug.
  if (QLFT_EMU_RACECHECK_BUILT && qlft_emu::racecheck_enabled()) {
    try {
      row_sums(true, x, rows, cols);
      ADD_FAILURE() << "the race went unreported under " << GetParam();
    } catch (const qlft::Error& e) {
      EXPECT_NE(std::string(e.what()).find("cudaErrorLaunchFailure"), std::string::npos)
          << e.what();
    }
    return;
  }
  const std::vector<float> bad = row_sums(true, x, rows, cols);
  int wrong = 0;
  for (int r = 0; r < rows; ++r) wrong += !(bad[r] == float(want[r]));
  if (std::string(GetParam()) != "reverse") {
    EXPECT_EQ(wrong, rows) << "the missing barrier went unnoticed under " << GetParam();
  }
}

INSTANTIATE_TEST_SUITE_P(Orders, EmuSchedule, ::testing::Values("forward", "reverse", "random"));

// ---- Race check (cuda/emu/src/racecheck.cpp) -------------------------------------------------
// A copy of block_sum without its trailing barrier, called twice on one shared array (as the
// 8-bit AdamW kernel does): a warp that finishes the first sum writes shared[warp] for the second
// while lanes of other warps may still read the first. Schedules that run the readers first give
// the right sums, so the values alone miss it; the race check does not.
__device__ float block_sum_no_trailing_barrier(float v, float* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = qlft::cu::warp_sum(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float r = lane < nw ? shared[lane] : 0.f;
  return qlft::cu::warp_sum(r);  // __syncthreads() deleted here
}

template <bool kBroken>
__global__ void __launch_bounds__(256) k_sum_and_squares(const float* x, float* out, int cols) {
  __shared__ float red[32];
  float s = 0.f, q = 0.f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    const float v = x[blockIdx.x * cols + c];
    s += v;
    q += v * v;
  }
  s = kBroken ? block_sum_no_trailing_barrier(s, red) : qlft::cu::block_sum(s, red);
  q = kBroken ? block_sum_no_trailing_barrier(q, red) : qlft::cu::block_sum(q, red);
  if (threadIdx.x == 0) {
    out[2 * blockIdx.x] = s;
    out[2 * blockIdx.x + 1] = q;
  }
}

// Warp-level patterns on one static array. mode 0: lane 0 writes, __syncwarp, lane 5 reads
// (ordered); 1: the same without __syncwarp (a race inside one warp); 2: with __syncwarp but the
// reader in the other warp (a warp operation orders only its own lanes); 3: every thread
// atomicAdds one word (atomics are not races); 4: a shuffle orders the write and the read.
__global__ void __launch_bounds__(64) k_warp_patterns(int mode, int* out) {
  __shared__ int s[2];
  const int t = threadIdx.x;
  if (mode == 3) {
    if (t == 0) s[0] = 0;
    __syncthreads();
    atomicAdd(&s[0], 1);
    __syncthreads();
    out[t] = s[0];
    return;
  }
  if (t == 0) s[1] = 7;
  if (mode == 0 || mode == 2) __syncwarp();
  if (mode == 4) out[t] = __shfl_sync(0xffffffffu, t, 0);
  if (t == (mode == 2 ? 32 : 5)) out[0] = s[1];
}

// Dynamic shared memory: each thread writes its word and reads its neighbour's.
__global__ void __launch_bounds__(64) k_neighbour(bool barrier, int* out) {
  QLFT_DYNAMIC_SHARED(int, d);
  const int t = threadIdx.x;
  d[t] = t;
  if (barrier) __syncthreads();
  out[t] = d[t ^ 1];
}

// What a launch wrote on stderr if it failed (the emulator's report), else "".
template <class F>
std::string launch_failure(F run) {
  testing::internal::CaptureStderr();
  try {
    run();
  } catch (const qlft::Error& e) {
    const std::string err = testing::internal::GetCapturedStderr();
    return err.empty() ? std::string(e.what()) : err;
  }
  testing::internal::GetCapturedStderr();
  return "";
}

#define QLFT_NEED_RACECHECK()                                       \
  if (!(QLFT_EMU_RACECHECK_BUILT && qlft_emu::racecheck_enabled())) \
  QLFT_SKIP("racecheck-off") << "race check not built (a sanitizer build) or QLFT_EMU_RACECHECK=0"

TEST_P(EmuSchedule, MissingTrailingBarrierIsARaceWhateverTheValues) {
  QLFT_NEED_RACECHECK();
  qlft_emu::set_schedule(GetParam(), 777);
  const int rows = 3, cols = 700;
  std::vector<float> x(size_t(rows) * cols);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i % 5) - 2);
  Dev dx(x.size()), dout(2 * rows);
  dx.put(x);
  EXPECT_EQ(launch_failure([&] {
              launch(k_sum_and_squares<false>, dim3(rows), dim3(256), 0, nullptr, dx.p, dout.p,
                     cols);
            }),
            "");
  const std::vector<float> got = dout.get();
  for (int r = 0; r < rows; ++r) {
    double s = 0, q = 0;
    for (int c = 0; c < cols; ++c) {
      const double v = x[size_t(r) * cols + c];
      s += v;
      q += v * v;
    }
    EXPECT_EQ(got[2 * r], float(s)) << r;
    EXPECT_EQ(got[2 * r + 1], float(q)) << r;
  }
  const std::string err = launch_failure([&] {
    launch(k_sum_and_squares<true>, dim3(rows), dim3(256), 0, nullptr, dx.p, dout.p, cols);
  });
  EXPECT_NE(err.find("shared-memory race (write after read)"), std::string::npos) << err;
  EXPECT_NE(err.find("static __shared__"), std::string::npos) << err;
}

TEST(EmuRaceCheck, WarpSynchronizationAndAtomicsOrderOnlyWhatCudaSays) {
  QLFT_NEED_RACECHECK();
  Dev d(64);
  int* out = reinterpret_cast<int*>(d.p);
  auto run = [&](int mode) {
    return launch_failure(
        [&] { launch(k_warp_patterns, dim3(2), dim3(64), 0, nullptr, mode, out); });
  };
  for (const char* order : {"forward", "reverse", "random"}) {
    qlft_emu::set_schedule(order, 99);
    EXPECT_EQ(run(0), "") << order;
    const std::string same_warp = run(1);
    EXPECT_NE(same_warp.find("shared-memory race"), std::string::npos) << order << same_warp;
    EXPECT_NE(same_warp.find("thread (0,0,0)"), std::string::npos) << order << same_warp;
    EXPECT_NE(same_warp.find("thread (5,0,0)"), std::string::npos) << order << same_warp;
    const std::string other_warp = run(2);
    EXPECT_NE(other_warp.find("shared-memory race"), std::string::npos) << order << other_warp;
    EXPECT_NE(other_warp.find("thread (32,0,0)"), std::string::npos) << order << other_warp;
    EXPECT_EQ(run(3), "") << order;
    std::vector<float> h = d.get();
    int v = 0;
    std::memcpy(&v, &h[0], 4);
    EXPECT_EQ(v, 64) << "every thread's atomicAdd counted";
    EXPECT_EQ(run(4), "") << order;
  }
}

TEST(EmuRaceCheck, DynamicSharedMemoryIsCheckedToo) {
  QLFT_NEED_RACECHECK();
  Dev d(64);
  int* out = reinterpret_cast<int*>(d.p);
  EXPECT_EQ(
      launch_failure([&] { launch(k_neighbour, dim3(1), dim3(64), 256, nullptr, true, out); }), "");
  const std::string err =
      launch_failure([&] { launch(k_neighbour, dim3(1), dim3(64), 256, nullptr, false, out); });
  EXPECT_NE(err.find("dynamic shared"), std::string::npos) << err;
}

// ---- Launch counting: the backend's (cuda/src/launch_count.h) against the runtime's own ------
__global__ void __launch_bounds__(32) k_count_a(float* p) {
  p[threadIdx.x] += 1.f;
}
template <int N>
__global__ void __launch_bounds__(32) k_count_b(float* p) {
  p[threadIdx.x] *= float(N);
}

uint64_t runtime_launches() {  // kernels and matmuls the emulated runtime accepted, all streams
  uint64_t n = 0;
  for (const auto& [stream, c] : qlft_emu::stream_counts()) n += c.kernels + c.matmuls;
  return n;
}
uint64_t backend_count(const std::string& name) {
  for (const qlft::cu::LaunchCount& c : qlft::cu::launch_counts())
    if (c.name == name) return c.count;
  return 0;
}

TEST(EmuLaunchCount, AKnownSequenceIsCountedByKernelAndStream) {
  EXPECT_EQ(qlft::cu::short_kernel_name("void qlft::cu::k_attn_fwd<4>(qlft::cu::AttnArgs, float*)"),
            "k_attn_fwd<4>");
  EXPECT_EQ(qlft::cu::short_kernel_name("qlft::cu::(anonymous namespace)::k_x(float, int)"), "k_x");
  Dev d(32);
  cudaStream_t s = nullptr;
  QLFT_CUDA_CHECK(cudaStreamCreate(&s));
  const uint64_t a0 = backend_count("k_count_a"), b0 = backend_count("k_count_b<3>");
  const uint64_t total0 = qlft::cu::launches_total(), rt0 = runtime_launches();
  const uint64_t ka0 = qlft_emu::kernel_counts()[reinterpret_cast<const void*>(&k_count_a)];
  for (int i = 0; i < 3; ++i) launch(k_count_a, dim3(1), dim3(32), 0, s, d.p);
  for (int i = 0; i < 2; ++i) launch(k_count_b<3>, dim3(1), dim3(32), 0, nullptr, d.p);
  launch(k_count_a, dim3(0), dim3(32), 0, s, d.p);  // an empty grid submits nothing
  std::vector<float> h(32);
  QLFT_CUDA_CHECK(cudaMemsetAsync(d.p, 0, 128, s));
  for (int i = 0; i < 2; ++i)
    QLFT_CUDA_CHECK(cudaMemcpyAsync(h.data(), d.p, 128, cudaMemcpyDeviceToHost, s));
  QLFT_CUDA_CHECK(cudaStreamSynchronize(s));
  EXPECT_EQ(backend_count("k_count_a") - a0, 3u);
  EXPECT_EQ(backend_count("k_count_b<3>") - b0, 2u);
  EXPECT_EQ(qlft::cu::launches_total() - total0, 5u);
  EXPECT_EQ(runtime_launches() - rt0, 5u);
  EXPECT_EQ(qlft_emu::kernel_counts()[reinterpret_cast<const void*>(&k_count_a)] - ka0, 3u);
  const qlft_emu::StreamCounts c = qlft_emu::stream_counts()[s];  // a new stream: from zero
  EXPECT_EQ(c.kernels, 3u);
  EXPECT_EQ(c.memsets, 1u);
  EXPECT_EQ(c.memcpys, 2u);
  EXPECT_EQ(c.matmuls, 0u);
  QLFT_CUDA_CHECK(cudaStreamDestroy(s));
}

// The backend's ops (staging copies, kernels, cuBLASLt) counted by the backend equal what the
// runtime accepted, and the by-name list adds up to the total.
TEST(EmuLaunchCount, BackendOpsCountWhatTheRuntimeRan) {
  qlft::MemoryTracker tracker;
  qlft::CudaBackendOptions o;
  std::unique_ptr<qlft::Backend> gpu = qlft::make_cuda_backend(&tracker, o);
  const int64_t M = 5, C = 128;
  std::vector<float> x(size_t(M * C), 0.5f), w(size_t(C), 1.f), y(x.size()),
      r(static_cast<size_t>(M));
  std::vector<float> g(x.size(), 0.25f), u(x.size(), 2.f), out(x.size());
  uint64_t named0 = 0;
  for (const qlft::cu::LaunchCount& c : qlft::cu::launch_counts()) named0 += c.count;
  const uint64_t before = gpu->transfers().launches, rt0 = runtime_launches();
  for (int i = 0; i < 2; ++i) {
    gpu->rmsnorm_fwd(qlft::CMatF{x.data(), M, C, C}, w.data(), 1e-5f, qlft::MatF{y.data(), M, C, C},
                     r.data());
    gpu->swiglu_fwd(qlft::CMatF{g.data(), M, C, C}, qlft::CMatF{u.data(), M, C, C},
                    qlft::MatF{out.data(), M, C, C});
  }
  const uint64_t counted = gpu->transfers().launches - before;
  EXPECT_GE(counted, 4u) << "two ops, twice";
  EXPECT_EQ(counted, runtime_launches() - rt0);
  uint64_t named = 0;
  for (const qlft::cu::LaunchCount& c : qlft::cu::launch_counts()) {
    EXPECT_FALSE(c.name.empty());
    named += c.count;
  }
  EXPECT_EQ(named - named0, counted);
}

// ---- Shuffles -------------------------------------------------------------------------------
__global__ void __launch_bounds__(64) k_shuffles(int* out) {
  const int t = threadIdx.x, lane = t & 31;
  const int x = __shfl_xor_sync(0xffffffffu, t * 10, 5);
  const int d = __shfl_down_sync(0xffffffffu, t, 3, 16);
  const int u = __shfl_up_sync(0xffffffffu, t, 2);
  const int b = __shfl_sync(0xffffffffu, t, 7);
  out[4 * t + 0] = x;
  out[4 * t + 1] = d;
  out[4 * t + 2] = u;
  out[4 * t + 3] = b;
  (void)lane;
}

TEST(EmuWarp, ShufflesExchangeLanesAsDocumented) {
  int* d = nullptr;
  QLFT_CUDA_CHECK(cudaMalloc(&d, 64 * 4 * sizeof(int)));
  launch(k_shuffles, dim3(1), dim3(64), 0, nullptr, d);
  std::vector<int> h(256);
  QLFT_CUDA_CHECK(cudaMemcpy(h.data(), d, h.size() * 4, cudaMemcpyDeviceToHost));
  for (int t = 0; t < 64; ++t) {
    const int lane = t & 31, w = t - lane;
    EXPECT_EQ(h[4 * t + 0], (w + (lane ^ 5)) * 10) << t;
    const int seg = lane / 16 * 16;
    EXPECT_EQ(h[4 * t + 1], lane + 3 < seg + 16 ? t + 3 : t) << t;  // own value past the segment
    EXPECT_EQ(h[4 * t + 2], lane >= 2 ? t - 2 : t) << t;
    EXPECT_EQ(h[4 * t + 3], w + 7) << t;
  }
  QLFT_CUDA_CHECK(cudaFree(d));
}

__global__ void __launch_bounds__(32) k_shfl_exited_lane(int* out) {
  if (threadIdx.x == 31) return;  // lane 31 leaves, then the others name it in the mask
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, int(threadIdx.x), 1);
}

__global__ void __launch_bounds__(32) k_barrier_deadlock(int* out) {
  // Lanes 0-15 wait at __syncthreads while lanes 16-31 wait at a shuffle naming all 32 lanes:
  // neither can complete (a hang or undefined behaviour on a GPU).
  if (threadIdx.x < 16)
    __syncthreads();
  else
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1, 1);
}

TEST(EmuWarp, ExitedLaneAndDivergentBarrierFailTheLaunch) {
  int* d = nullptr;
  QLFT_CUDA_CHECK(cudaMalloc(&d, 64 * sizeof(int)));
  try {
    launch(k_shfl_exited_lane, dim3(1), dim3(32), 0, nullptr, d);
    ADD_FAILURE() << "a shuffle naming an exited lane ran";
  } catch (const qlft::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cudaErrorLaunchFailure"), std::string::npos) << e.what();
  }
  try {
    launch(k_barrier_deadlock, dim3(1), dim3(32), 0, nullptr, d);
    ADD_FAILURE() << "a deadlocked barrier ran";
  } catch (const qlft::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cudaErrorLaunchFailure"), std::string::npos) << e.what();
  }
  QLFT_CUDA_CHECK(cudaFree(d));
}

// ---- Launch limits ----------------------------------------------------------------------------
__global__ void __launch_bounds__(128) k_fill(float* p, float v, int n) {
  QLFT_DYNAMIC_SHARED(float, s);
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = v;
  (void)s;
}

TEST(EmuLaunch, LimitsOfTheDeviceAndTheKernelAreEnforced) {
  Dev d(1024);
  EXPECT_THROW(launch(k_fill, dim3(1), dim3(256), 0, nullptr, d.p, 1.f, 1024), qlft::Error)
      << "256 threads on a __launch_bounds__(128) kernel";
  EXPECT_THROW(launch(k_fill, dim3(1), dim3(2048), 0, nullptr, d.p, 1.f, 1024), qlft::Error);
  EXPECT_THROW(launch(k_fill, dim3(1), dim3(1, 1, 65), 0, nullptr, d.p, 1.f, 1024), qlft::Error);
  EXPECT_THROW(launch(k_fill, dim3(1), dim3(128), 64 * 1024, nullptr, d.p, 1.f, 1024), qlft::Error)
      << "64 KiB of dynamic shared memory without cudaFuncSetAttribute";
  QLFT_CUDA_CHECK(
      cudaFuncSetAttribute(k_fill, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024));
  EXPECT_NO_THROW(launch(k_fill, dim3(8), dim3(128), 64 * 1024, nullptr, d.p, 2.f, 1024));
  EXPECT_NE(cudaFuncSetAttribute(k_fill, cudaFuncAttributeMaxDynamicSharedMemorySize, 228 * 1024),
            cudaSuccess);
  (void)cudaGetLastError();
  for (float v : d.get()) ASSERT_EQ(v, 2.f);
}

// ---- Memory faults ----------------------------------------------------------------------------
__global__ void __launch_bounds__(32) k_read_past_shared(float* out, int n) {
  QLFT_DYNAMIC_SHARED(float, s);
  for (int i = threadIdx.x; i < n; i += blockDim.x) s[i] = 1.f;
  __syncthreads();
  if (threadIdx.x == 0) out[0] = s[n];  // one element past the n floats launched with
}

__global__ void __launch_bounds__(32) k_copy(const float* in, float* out, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = in[i];
}

using EmuDeathTest = ::testing::Test;

TEST(EmuDeathTest, ReadOnePastDynamicSharedFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto run = [] {
    Dev d(4);
    launch(k_read_past_shared, dim3(1), dim3(32), 64 * 4, nullptr, d.p, 64);
  };
  EXPECT_DEATH(run(), "dynamic shared memory");
}

TEST(EmuDeathTest, HostDereferenceOfDevicePointerFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto run = [] {
    Dev d(16);
    volatile float x = d.p[3];
    (void)x;
  };
  EXPECT_DEATH(run(), "host code dereferenced device pointer");
}

TEST(EmuDeathTest, KernelUseAfterFreeFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto run = [] {
    float *a = nullptr, *b = nullptr;
    QLFT_CUDA_CHECK(cudaMalloc(&a, 4096));
    QLFT_CUDA_CHECK(cudaMalloc(&b, 4096));
    QLFT_CUDA_CHECK(cudaFree(a));
    launch(k_copy, dim3(1), dim3(32), 0, nullptr, a, b, 64);
  };
  EXPECT_DEATH(run(), "use after free");
}

TEST(EmuDeathTest, KernelOutOfBoundsDeviceReadFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto run = [] {
    Dev a(1024), b(2048);
    launch(k_copy, dim3(1), dim3(32), 0, nullptr, a.p, b.p, 2048);
  };
  EXPECT_DEATH(run(), "past the end of an allocation");
}

TEST(EmuMemory, CopiesInTheWrongDirectionOrPastAnAllocationAreRefused) {
  Dev d(64);
  std::vector<float> h(128, 1.f);
  EXPECT_EQ(cudaMemcpy(h.data(), d.p, 64 * 4, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(d.p, h.data(), 64 * 4, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(d.p, h.data(), 65 * 4, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(d.p, h.data(), 64 * 4, cudaMemcpyHostToDevice), cudaSuccess);
  float* freed = nullptr;
  ASSERT_EQ(cudaMalloc(&freed, 256), cudaSuccess);
  ASSERT_EQ(cudaFree(freed), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(h.data(), freed, 16, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  EXPECT_EQ(cudaFree(freed), cudaErrorInvalidValue) << "double free";
  (void)cudaGetLastError();
}

TEST(EmuMemory, FreshDeviceMemoryAndSharedMemoryAreNotZero) {
  Dev d(8);
  for (float v : d.get()) EXPECT_TRUE(std::isnan(v));
}

}  // namespace

// ---- cuBLASLt's 16-bit output (gemm.h's C of the operands' type) ------------------------------
// A bf16 / fp16 D is the fp32 result (alpha * sum of exact products + beta * C) rounded to
// nearest even, as cuBLASLt's epilogue writes it. The oracle: the sum in double, rounded to fp32,
// then core/half's rounding (not the emulator's own narrow16); ties, overflow and a 16-bit C
// read back with beta 1 included.
TEST(EmuCublasLt, SixteenBitOutputIsTheFp32ResultRoundedToNearestEven) {
  qlft::MemoryTracker tracker;
  cudaStream_t s;
  QLFT_CUDA_CHECK(cudaStreamCreate(&s));
  {
    qlft::cu::LtGemm gemm(&tracker, s);
    for (const qlft::cu::TileType t : {qlft::cu::TileType::BF16, qlft::cu::TileType::F16}) {
      const bool bf = t == qlft::cu::TileType::BF16;
      auto to16 = [bf](float v) { return bf ? qlft::f32_to_bf16(v) : qlft::f32_to_f16(v); };
      auto from16 = [bf](uint16_t h) { return bf ? qlft::bf16_to_f32(h) : qlft::f16_to_f32(h); };
      const int64_t M = 3, N = 5, K = 7;
      std::vector<uint16_t> a(size_t(M * K)), b(size_t(N * K)), c(size_t(M * N));
      uint32_t seed = 7;
      auto rnd = [&] {
        seed = seed * 1664525u + 1013904223u;
        return float(int(seed >> 9) % 2001 - 1000) / 317.f;
      };
      for (uint16_t& v : a) v = to16(rnd());
      for (uint16_t& v : b) v = to16(rnd());
      for (uint16_t& v : c) v = to16(rnd());
      uint16_t *da, *db, *dc;
      QLFT_CUDA_CHECK(cudaMalloc(&da, a.size() * 2));
      QLFT_CUDA_CHECK(cudaMalloc(&db, b.size() * 2));
      QLFT_CUDA_CHECK(cudaMalloc(&dc, c.size() * 2));
      QLFT_CUDA_CHECK(cudaMemcpy(da, a.data(), a.size() * 2, cudaMemcpyHostToDevice));
      QLFT_CUDA_CHECK(cudaMemcpy(db, b.data(), b.size() * 2, cudaMemcpyHostToDevice));
      for (const float beta : {0.f, 1.f}) {
        QLFT_CUDA_CHECK(cudaMemcpy(dc, c.data(), c.size() * 2, cudaMemcpyHostToDevice));
        const float alpha = 1.25f;
        // C [M, N] = alpha * A [M, K] B^T (B stored [N, K]) + beta * C
        gemm.run(M, N, K, alpha, {da, t, K, false}, {db, t, K, true}, beta, dc, t, N);
        std::vector<uint16_t> got(c.size());
        QLFT_CUDA_CHECK(cudaMemcpy(got.data(), dc, got.size() * 2, cudaMemcpyDeviceToHost));
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = 0; j < N; ++j) {
            double acc = 0;
            for (int64_t k = 0; k < K; ++k)
              acc += double(from16(a[size_t(i * K + k)])) * double(from16(b[size_t(j * K + k)]));
            const double r = double(alpha) * acc + double(beta) * from16(c[size_t(i * N + j)]);
            EXPECT_EQ(got[size_t(i * N + j)], to16(float(r)))
                << (bf ? "bf16" : "fp16") << " beta " << beta << " at " << i << "," << j;
          }
      }
      // Ties go to even, past the largest finite value to inf: 1 x 1 times alpha.
      const uint16_t one = to16(1.f);
      QLFT_CUDA_CHECK(cudaMemcpy(da, &one, 2, cudaMemcpyHostToDevice));
      QLFT_CUDA_CHECK(cudaMemcpy(db, &one, 2, cudaMemcpyHostToDevice));
      const float ulp = bf ? 0x1p-7f : 0x1p-10f;
      const float big = bf ? 3.4e38f : 65520.f;
      const std::pair<float, uint16_t> cases[] = {
          {1.f + ulp / 2, to16(1.f)},                // halfway, 1.0's mantissa even: down
          {1.f + 3 * ulp / 2, to16(1.f + 2 * ulp)},  // halfway, odd below: up
          {1.f + ulp / 2 + ulp / 8, to16(1.f + ulp)},
          {big, uint16_t(bf ? 0x7f80 : 0x7c00)}};  // rounds to inf
      for (const auto& [alpha, want] : cases) {
        gemm.run(1, 1, 1, alpha, {da, t, 1, false}, {db, t, 1, false}, 0.f, dc, t, 1);
        uint16_t got = 0;
        QLFT_CUDA_CHECK(cudaMemcpy(&got, dc, 2, cudaMemcpyDeviceToHost));
        EXPECT_EQ(got, want) << (bf ? "bf16" : "fp16") << " alpha " << alpha;
      }
      QLFT_CUDA_WARN(cudaFree(da));
      QLFT_CUDA_WARN(cudaFree(db));
      QLFT_CUDA_WARN(cudaFree(dc));
    }
  }
  QLFT_CUDA_CHECK(cudaStreamDestroy(s));
}
