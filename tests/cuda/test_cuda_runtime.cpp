// The CUDA runtime pieces: backend selection without a device (must fail clearly, runs
// everywhere), and with a device the accounted caching allocator (category totals, reuse, OOM
// naming the category) and the managed-memory optimizer state store.
#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <string>

#include "backend/backend_select.h"
#include "backend/cuda_entry.h"
#include "core/error.h"
#include "cuda_test_util.h"
#include "core/state_store.h"
#include "qlft.h"

namespace {

bool have_gpu() {
  std::string why;
  return qlft::cuda_device_count(&why) > 0;
}

}  // namespace

// Runs on every machine: with no device, backend=cuda is QLFT_ERR_BACKEND saying so, through the
// C API and through the backend factory; with one, the runtime is created.
TEST(CudaSelection, BackendCudaWithoutDeviceFailsClearly) {
  qlft_config* cfg = nullptr;
  ASSERT_EQ(qlft_config_create(&cfg), QLFT_OK);
  ASSERT_EQ(qlft_config_set(cfg, "backend", "cuda"), QLFT_OK);
  qlft_runtime* rt = nullptr;
  const int32_t st = qlft_runtime_create(cfg, &rt);
  if (have_gpu()) {
    EXPECT_EQ(st, QLFT_OK) << qlft_last_error();
  } else {
    EXPECT_EQ(st, QLFT_ERR_BACKEND);
    EXPECT_NE(std::string(qlft_last_error()).find("no usable CUDA device"), std::string::npos)
        << qlft_last_error();
    EXPECT_EQ(rt, nullptr);
  }
  qlft_runtime_free(rt);
  qlft_config_free(cfg);
  EXPECT_NE(std::string(qlft_build_info()).find("cuda=1"), std::string::npos) << qlft_build_info();
}

TEST(CudaSelection, FactoryWithoutDeviceThrowsBackendError) {
  if (have_gpu())
    QLFT_SKIP("gpu-present") << "a CUDA device is present: this case covers machines without one";
  qlft::MemoryTracker t;
  try {
    qlft::BackendSpec spec;
    spec.kind = qlft::BackendKind::Cuda;
    auto be = qlft::make_backend(spec, &t);
    FAIL() << "make_backend(cuda) succeeded without a device";
  } catch (const qlft::Error& e) {
    EXPECT_EQ(e.status(), QLFT_ERR_BACKEND);
    EXPECT_NE(std::string(e.what()).find("no usable CUDA device"), std::string::npos) << e.what();
  }
  EXPECT_THROW(qlft::make_managed_state_store(&t), qlft::Error);
  EXPECT_EQ(t.total_reserved(), 0u);
}

TEST(CudaAllocator, CountsCategoriesAndReusesBlocks) {
  QLFT_NEED_GPU();
  qlft::MemoryTracker t;
  void* first = nullptr;
  // A live block keeps the pool's cache (a pool with nothing live returns it, checked below).
  std::optional<qlft::DeviceMemory> keep;
  keep.emplace(&t, qlft::MemCategory::Weights, 512, "test keeper");
  {
    qlft::DeviceMemory a(&t, qlft::MemCategory::Activations, 3 << 20, "test activations");
    first = a.data();
    EXPECT_GE(t.snapshot().reserved[QLFT_MEM_ACTIVATIONS], uint64_t(3) << 20);
    std::vector<float> h(1000, 1.5f), back(1000);
    a.upload(h.data(), 4000);
    a.download(back.data(), 4000);
    EXPECT_EQ(back, h);
  }
  // Freed into the cache: still reserved, then reused for a request of the same size class in
  // another category (its accounting moves with it).
  EXPECT_GT(qlft::cuda_cached_bytes(&t), 0u);
  {
    qlft::DeviceMemory b(&t, qlft::MemCategory::Workspace, 3 << 20, "test workspace");
    EXPECT_EQ(b.data(), first);
    auto s = t.snapshot();
    EXPECT_EQ(s.reserved[QLFT_MEM_ACTIVATIONS], 0u);
    EXPECT_GE(s.reserved[QLFT_MEM_WORKSPACE], uint64_t(3) << 20);
  }
  qlft::cuda_empty_cache(&t);
  EXPECT_EQ(t.total_reserved(), 512u);
  EXPECT_EQ(qlft::cuda_cached_bytes(&t), 512u);  // the keeper, still live
  // The last live block freed: the cache goes back at once, so nothing outlives the tracker's
  // use (pools are keyed by tracker address; a later tracker there starts empty).
  { qlft::DeviceMemory c(&t, qlft::MemCategory::Workspace, 3 << 20, "test workspace"); }
  EXPECT_GT(qlft::cuda_cached_bytes(&t), 512u);
  keep.reset();
  EXPECT_EQ(t.total_reserved(), 0u);
  EXPECT_EQ(qlft::cuda_cached_bytes(&t), 0u);
}

TEST(CudaAllocator, OutOfMemoryNamesCategory) {
  QLFT_NEED_GPU();
  qlft::MemoryTracker t(1 << 20);  // 1 MiB budget
  try {
    qlft::DeviceMemory m(&t, qlft::MemCategory::Gradients, 8 << 20, "test gradients");
    FAIL() << "allocation past the budget succeeded";
  } catch (const qlft::Error& e) {
    EXPECT_EQ(e.status(), QLFT_ERR_OUT_OF_MEMORY);
    EXPECT_NE(std::string(e.what()).find(qlft::mem_category_name(qlft::MemCategory::Gradients)),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(t.total_reserved(), 0u);
  // A request the device cannot hold (no budget): cudaErrorMemoryAllocation -> OUT_OF_MEMORY.
  qlft::MemoryTracker u;
  try {
    qlft::DeviceMemory m(&u, qlft::MemCategory::Weights, size_t(1) << 46, "test weights");
    FAIL() << "a 64 TiB device allocation succeeded";
  } catch (const qlft::Error& e) {
    EXPECT_EQ(e.status(), QLFT_ERR_OUT_OF_MEMORY) << e.what();
    EXPECT_NE(std::string(e.what()).find("weights"), std::string::npos) << e.what();
  }
  EXPECT_EQ(u.total_reserved(), 0u);
}

TEST(CudaStateStore, ManagedMemoryIsZeroedCountedAndHostVisible) {
  QLFT_NEED_GPU();
  qlft::MemoryTracker t;
  {
    auto store = qlft::make_managed_state_store(&t);
    EXPECT_TRUE(store->paged());
    EXPECT_STREQ(store->kind(), "cuda-managed");
    auto* p = static_cast<float*>(store->allocate(4096 * 4, "test state"));
    for (int i = 0; i < 4096; ++i) ASSERT_EQ(p[i], 0.f);
    p[17] = 3.f;  // managed memory is addressable from the host
    // and from the device: a kernel scales it.
    qlft::cuda_scale(p, 4096, 2.f);
    EXPECT_EQ(p[17], 6.f);
    EXPECT_EQ(t.snapshot().reserved[QLFT_MEM_OPTIMIZER], 4096u * 4);
  }
  EXPECT_EQ(t.total_reserved(), 0u);
}

TEST(CudaDevice, PropertiesAndPrecisionCheck) {
  QLFT_NEED_GPU();
  const qlft::CudaDeviceInfo i = qlft::cuda_device_info(0);
  EXPECT_FALSE(i.name.empty());
  EXPECT_GT(i.sm_count, 0);
  EXPECT_NE(qlft::cuda_runtime_info().find("devices="), std::string::npos);
  if (i.cc_major >= 8) {
    EXPECT_NO_THROW(qlft::cuda_check_precision(0, qlft::Precision::BF16));
  } else {
    EXPECT_THROW(qlft::cuda_check_precision(0, qlft::Precision::BF16), qlft::Error);
    EXPECT_NO_THROW(qlft::cuda_check_precision(0, qlft::Precision::FP16));
  }
}
