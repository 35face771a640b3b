// The budgeted allocator: every byte the runtime owns is counted in one category of one tracker.
//
// `reserved` is what is held from the OS, `allocated` what live buffers use (they differ only for
// pooling allocators such as the CUDA caching allocator). The limit applies to total reserved
// bytes; going past it throws QLFT_ERR_OUT_OF_MEMORY naming the category and phase and leaves the
// counters as they were.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

#include "qlft.h"

namespace qlft {

enum class MemCategory : int {
  Weights = QLFT_MEM_WEIGHTS,
  Adapter = QLFT_MEM_ADAPTER,
  Gradients = QLFT_MEM_GRADIENTS,
  Optimizer = QLFT_MEM_OPTIMIZER,
  Activations = QLFT_MEM_ACTIVATIONS,
  Workspace = QLFT_MEM_WORKSPACE,
  Communication = QLFT_MEM_COMMUNICATION,
};
constexpr int kMemCategoryCount = QLFT_MEM_CATEGORY_COUNT;
const char* mem_category_name(MemCategory c);

struct MemorySnapshot {
  uint64_t limit = 0;
  std::array<uint64_t, kMemCategoryCount> allocated{}, reserved{}, peak{};
  uint64_t total_reserved = 0, total_peak = 0;
};

class MemoryTracker {
 public:
  explicit MemoryTracker(uint64_t limit = 0) : limit_(limit) {}
  MemoryTracker(const MemoryTracker&) = delete;
  MemoryTracker& operator=(const MemoryTracker&) = delete;

  // Counts bytes as reserved and allocated; throws QLFT_ERR_OUT_OF_MEMORY if over the limit.
  void acquire(MemCategory c, uint64_t bytes, const char* what);
  void release(MemCategory c, uint64_t bytes) noexcept;

  void set_limit(uint64_t limit) { limit_ = limit; }
  uint64_t limit() const { return limit_; }
  // The phase named in out-of-memory messages ("forward", "backward", "optimizer", "load").
  void set_phase(const char* phase) { phase_ = phase; }
  // Fault injection: the n-th acquire from now (1-based) fails as if over the limit; 0 disables.
  void fail_nth_acquire(uint64_t n) { fail_countdown_ = n; }
  // Resets the per-category and total peaks to the current reservation.
  void reset_peaks();

  MemorySnapshot snapshot() const;
  uint64_t total_reserved() const;

 private:
  mutable std::mutex mu_;
  uint64_t limit_;
  const char* phase_ = "setup";
  uint64_t fail_countdown_ = 0;
  std::array<uint64_t, kMemCategoryCount> allocated_{}, reserved_{}, peak_{};
  uint64_t total_ = 0, total_peak_ = 0;
};

// A move-only, 64-byte aligned, zero-initialized host buffer counted in a tracker.
class Buffer {
 public:
  Buffer() = default;
  Buffer(MemoryTracker* tracker, MemCategory c, size_t bytes, const char* what);
  ~Buffer();
  Buffer(Buffer&& o) noexcept;
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() { return data_; }
  const void* data() const { return data_; }
  template <class T>
  T* as() {
    return static_cast<T*>(data_);
  }
  template <class T>
  const T* as() const {
    return static_cast<const T*>(data_);
  }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  MemCategory category() const { return cat_; }
  void reset() noexcept;

 private:
  MemoryTracker* tracker_ = nullptr;
  MemCategory cat_ = MemCategory::Workspace;
  void* data_ = nullptr;
  size_t size_ = 0;
};

// "12.0 MiB"
std::string format_bytes(uint64_t bytes);
// Parses "0", "1048576", "512M", "4GiB", "1.5G" (powers of 1024). Throws INVALID_ARGUMENT.
uint64_t parse_bytes(const std::string& text, const char* key);
// Peak resident set size of the process from the OS, in bytes.
uint64_t process_peak_rss();

}  // namespace qlft
