// The NCCL communicator (cuda/src/comm_nccl.cu), CUDA builds only. One rank (a single process:
// MPI singleton) with device buffers; under mpirun -np N each rank checks the same sums. Every
// case skips without a CUDA device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"
#include "core/communicator.h"
#include "parallel/comm_select.h"
#include "support/test_support.h"

using namespace qlft;

namespace {

bool have_device(std::string* why) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    *why = e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device";
    return false;
  }
  return true;
}

}  // namespace

TEST(DistNccl, CollectivesOnDeviceBuffers) {
  std::string why;
  if (!have_device(&why)) QLFT_SKIP("no-gpu") << why;
  auto c = dist::make_communicator(qlft::DistBackend::Nccl, 60);
  ASSERT_STREQ(c->backend(), "nccl");
  const int r = c->rank(), w = c->world();
  const size_t n = 4096;
  std::vector<float> h(n);
  for (size_t i = 0; i < n; ++i) h[i] = static_cast<float>(r + 1) * static_cast<float>(i % 97);
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, n * sizeof(float) * (w + 1)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d, h.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  c->all_reduce(d, n, dist::ReduceOp::Sum);
  ASSERT_EQ(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  const float ranks = static_cast<float>(w) * (w + 1) / 2;  // sum of (r + 1)
  for (size_t i = 0; i < n; i += 101) EXPECT_EQ(h[i], ranks * static_cast<float>(i % 97)) << i;
  // all_gather of each rank's first 16 values (now identical) into w blocks.
  c->all_gather(d, d + n, 16);
  std::vector<float> g(16 * w);
  ASSERT_EQ(cudaMemcpy(g.data(), d + n, g.size() * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  for (int b = 0; b < w; ++b)
    for (int i = 0; i < 16; ++i) EXPECT_EQ(g[b * 16 + i], h[i]);
  c->barrier();
  cudaFree(d);
}
