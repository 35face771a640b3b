// MemoryTracker's device space (issue 18): device blocks are counted in the categories and
// totals and on their own; with the limit on the device space (backend=cuda's memory.limit) host
// bytes are outside the budget; the caching allocator's free blocks leave their category for
// `device_cached` and the device live peak excludes them.
#include <gtest/gtest.h>

#include "core/error.h"
#include "core/memory.h"

using namespace qlft;

TEST(MemoryTrackerDevice, CountsDeviceBytesApartAndInTheTotals) {
  MemoryTracker t;
  t.acquire(MemCategory::Weights, 1000, "host weights");
  t.acquire(MemCategory::Activations, 300, "device acts", MemSpace::Device);
  MemorySnapshot s = t.snapshot();
  EXPECT_EQ(s.total_reserved, 1300u);
  EXPECT_EQ(s.reserved[int(MemCategory::Activations)], 300u);
  EXPECT_EQ(s.device_total, 300u);
  EXPECT_EQ(s.device_reserved[int(MemCategory::Activations)], 300u);
  EXPECT_EQ(s.device_reserved[int(MemCategory::Weights)], 0u);
  EXPECT_EQ(s.device_live_peak, 300u);
  t.release(MemCategory::Activations, 300, MemSpace::Device);
  t.release(MemCategory::Weights, 1000);
  s = t.snapshot();
  EXPECT_EQ(s.total_reserved, 0u);
  EXPECT_EQ(s.device_total, 0u);
  EXPECT_EQ(s.device_live_peak, 300u);
}

TEST(MemoryTrackerDevice, DeviceLimitBudgetsOnlyDeviceBytes) {
  MemoryTracker t(500);
  t.set_limit_space(MemSpace::Device);
  // Host memory is outside a device budget, however much.
  t.acquire(MemCategory::Weights, 4000, "host weights");
  t.acquire(MemCategory::Activations, 400, "device", MemSpace::Device);
  EXPECT_EQ(t.budgeted_reserved(), 400u);
  try {
    t.acquire(MemCategory::Workspace, 200, "device panel", MemSpace::Device);
    FAIL() << "past the device budget";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), QLFT_ERR_OUT_OF_MEMORY);
    EXPECT_NE(std::string(e.what()).find("device memory"), std::string::npos) << e.what();
  }
  EXPECT_EQ(t.budgeted_reserved(), 400u);  // nothing counted by the failed acquire
  t.acquire(MemCategory::Workspace, 100, "device panel", MemSpace::Device);
  EXPECT_EQ(t.budgeted_peak(), 500u);
  // The default space budgets every byte, as on the CPU.
  MemoryTracker h(500);
  h.acquire(MemCategory::Activations, 400, "device", MemSpace::Device);
  EXPECT_THROW(h.acquire(MemCategory::Weights, 200, "host"), Error);
}

TEST(MemoryTrackerDevice, CachedBlocksLeaveTheirCategoryAndTheLivePeak) {
  MemoryTracker t(1000);
  t.set_limit_space(MemSpace::Device);
  t.acquire(MemCategory::Workspace, 600, "panel", MemSpace::Device);
  t.to_device_cache(MemCategory::Workspace, 600);  // freed, kept by the allocator
  MemorySnapshot s = t.snapshot();
  EXPECT_EQ(s.device_reserved[int(MemCategory::Workspace)], 0u);
  EXPECT_EQ(s.device_cached, 600u);
  EXPECT_EQ(s.device_total, 600u);
  EXPECT_EQ(s.total_reserved, 600u);
  // Reused by an activation: counted there, no new bytes.
  t.from_device_cache(MemCategory::Activations, 600, "reuse");
  s = t.snapshot();
  EXPECT_EQ(s.device_cached, 0u);
  EXPECT_EQ(s.device_reserved[int(MemCategory::Activations)], 600u);
  EXPECT_EQ(s.device_total, 600u);
  t.to_device_cache(MemCategory::Activations, 600);
  t.reset_peaks();
  // A cached block counts against the budget (the allocator returns it before failing) but not
  // in the live peak.
  EXPECT_THROW(t.acquire(MemCategory::Activations, 500, "x", MemSpace::Device), Error);
  t.device_cache_freed(600);
  t.acquire(MemCategory::Activations, 500, "x", MemSpace::Device);
  s = t.snapshot();
  EXPECT_EQ(s.device_live_peak, 500u);
  EXPECT_EQ(s.device_total_peak, 600u);
  EXPECT_EQ(s.total_reserved, 500u);
  t.release(MemCategory::Activations, 500, MemSpace::Device);
}
