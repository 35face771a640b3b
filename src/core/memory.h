// The budgeted allocator: every byte the runtime owns is counted in one category of one tracker.
//
// `reserved` is what is held from the OS, `allocated` what live buffers use (they differ only for
// pooling allocators such as the CUDA caching allocator). The limit applies to total reserved
// bytes; going past it throws QLFT_ERR_OUT_OF_MEMORY naming the category and phase and leaves the
// counters as they were.
//
// The host block cache: a training step frees and reallocates the same large activation and
// workspace buffers every step; returned to the OS in between (blocks of at least
// kHostCacheMinBytes are page-mapped and unmapped when freed, memory.cpp), each
// step pays first-touch page faults on all of them (measured: 5% of samples in clear_page at
// micro-batch 4). While a trainer holds the cache on, freed blocks of at least kHostCacheMinBytes
// are kept and reused for the same size. They are counted in `cached` (part of total reserved, in
// no category) and never raise the total peak: a miss first returns cached blocks until the new
// total stays within the peak so far and the limit.
//
// Device memory (a GPU backend's caching allocator, MemSpace::Device) is counted in the same
// categories and totals, and also on its own: the planner's device prediction and a device budget
// are checked against it. Blocks the caching allocator keeps after their user freed them are
// `device_cached` (in the totals, in no category): with backend=cuda memory.limit budgets device
// bytes only (set_limit_space), and past it the allocator returns its cache before failing, so what
// must fit is the live device bytes.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
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

// Where a tracked block lives: host RAM, or a backend's device memory.
enum class MemSpace : uint8_t { Host, Device };

struct MemorySnapshot {
  uint64_t limit = 0;
  std::array<uint64_t, kMemCategoryCount> allocated{}, reserved{}, peak{};
  uint64_t total_reserved = 0, total_peak = 0;
  uint64_t cached = 0;  // freed host blocks kept for reuse (in total_reserved, in no category)
  // Device memory alone (also counted above): live blocks per category, and the device totals.
  bool limit_device = false;  // the limit budgets device bytes only (backend=cuda)
  std::array<uint64_t, kMemCategoryCount> device_reserved{}, device_peak{};
  uint64_t device_total = 0;       // device bytes held now: live + cached
  uint64_t device_cached = 0;      // freed device blocks the caching allocator keeps
  uint64_t device_live_peak = 0;   // the most device bytes in live blocks at once
  uint64_t device_total_peak = 0;  // the most device bytes held at once (live + cached)
};

constexpr uint64_t kHostCacheMinBytes = 256 * 1024;

class MemoryTracker {
 public:
  explicit MemoryTracker(uint64_t limit = 0) { s_.limit = limit; }
  ~MemoryTracker();
  MemoryTracker(const MemoryTracker&) = delete;
  MemoryTracker& operator=(const MemoryTracker&) = delete;

  // Counts bytes as reserved and allocated; throws QLFT_ERR_OUT_OF_MEMORY if over the limit.
  void acquire(MemCategory c, uint64_t bytes, const char* what, MemSpace s = MemSpace::Host);
  void release(MemCategory c, uint64_t bytes, MemSpace s = MemSpace::Host) noexcept;

  // The device caching allocator: a freed block kept for reuse leaves its category for
  // `device_cached` (to_device_cache); reused, it joins the new user's category
  // (from_device_cache: no limit check, the total is unchanged, but fault injection counts it);
  // returned to the driver, it leaves the totals (device_cache_freed).
  void to_device_cache(MemCategory c, uint64_t bytes) noexcept;
  void from_device_cache(MemCategory c, uint64_t bytes, const char* what);
  void device_cache_freed(uint64_t bytes) noexcept;

  // Host blocks (Buffer's storage): acquire_block counts like acquire and returns a cached block
  // of exactly `bytes` when there is one (nullptr: the caller allocates), *mapped telling how it
  // was allocated; release_block counts like release and keeps the block (true) or leaves it to
  // the caller to free (false).
  void* acquire_block(MemCategory c, uint64_t bytes, const char* what, bool* mapped);
  bool release_block(MemCategory c, uint64_t bytes, void* block, bool mapped) noexcept;
  // Whether a trainer holds the cache on (its steps are running).
  bool host_cache_held() const;
  // Nested on/off (one per trainer): off at the outermost returns every cached block.
  void hold_host_cache();
  void drop_host_cache() noexcept;
  void trim_host_cache() noexcept;

  void set_limit(uint64_t limit) { s_.limit = limit; }
  uint64_t limit() const { return s_.limit; }
  // What the limit budgets: every tracked byte (Host, the default: the CPU backend's memory is
  // host RAM) or device bytes only (Device: backend=cuda, where memory.limit is the GPU budget and
  // the host copies of the weights and adapter are not in it).
  void set_limit_space(MemSpace s) { limit_space_ = s; }
  MemSpace limit_space() const { return limit_space_; }
  // The bytes the limit applies to now (total_reserved, or the device total), and their peak
  // since the last reset_peaks (for the device: its live peak, what had to fit).
  uint64_t budgeted_reserved() const;
  uint64_t budgeted_peak() const;
  // The phase named in out-of-memory messages ("forward", "backward", "optimizer", "load").
  void set_phase(const char* phase) { phase_ = phase; }
  // Fault injection: the n-th acquire from now (1-based) fails as if over the limit; 0 disables.
  void fail_nth_acquire(uint64_t n) { fail_countdown_ = n; }
  // Returns the cached blocks, then resets the per-category and total peaks to the current
  // reservation (a fresh measurement, as the auto-tuner's trials need).
  void reset_peaks();

  MemorySnapshot snapshot() const;
  uint64_t total_reserved() const;

 private:
  mutable std::mutex mu_;
  // The counts, held in the form snapshot() returns (limit_device aside: see limit_space_).
  MemorySnapshot s_;
  const char* phase_ = "setup";
  uint64_t fail_countdown_ = 0;
  int cache_holders_ = 0;
  struct CachedBlock {
    void* block;
    bool mapped;  // page-mapped (else malloc's)
  };
  std::multimap<uint64_t, CachedBlock> cache_;  // size -> free block
  MemSpace limit_space_ = MemSpace::Host;
  void check_limit(MemCategory c, uint64_t bytes, const char* what, MemSpace s);
  void count_device(MemCategory c, uint64_t bytes);  // live device bytes in, peaks updated
  bool limited(MemSpace s) const {
    return s_.limit > 0 && (limit_space_ == MemSpace::Host || s == MemSpace::Device);
  }
  void count_in(MemCategory c, uint64_t bytes);
  void evict_for(uint64_t bytes) noexcept;  // with mu_ held
};

// How a new Buffer's bytes start: zeroed, or left as the allocator gives them, for scratch that
// its users overwrite before they read it (the memset of large per-call scratch was 5% of a bf16
// training step). Uninit buffers are filled with 0xff bytes (NaN as floats) when the environment
// sets QLFT_POISON_UNINIT=1, as the test suite does, so a reader of unwritten scratch fails there.
enum class BufferInit : uint8_t { Zero, Uninit };

// Memory outside host RAM that a backend computes in (a GPU's). A Buffer made on it (through
// Backend::alloc) holds a device address: only that backend's operations and the copies below
// touch its bytes. The allocator counts its blocks in its own tracker.
class DeviceAllocator {
 public:
  virtual void* allocate(MemCategory c, size_t bytes, const char* what) = 0;
  virtual void release(void* p) noexcept = 0;
  virtual void fill(void* p, uint8_t byte, size_t bytes) = 0;
  // Ordered after the backend's queued work; to_host returns once the bytes are there.
  virtual void to_device(void* dst, const void* src, size_t bytes) = 0;
  virtual void to_host(void* dst, const void* src, size_t bytes) = 0;
  // Within device memory, ordered after the queued work; does not wait.
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;

 protected:
  ~DeviceAllocator() = default;
};

// A move-only, 64-byte aligned buffer (zero-initialized unless asked otherwise) counted in a
// tracker: host memory, or a DeviceAllocator's memory.
class Buffer {
 public:
  Buffer() = default;
  Buffer(MemoryTracker* tracker, MemCategory c, size_t bytes, const char* what,
         BufferInit init = BufferInit::Zero);
  Buffer(DeviceAllocator* device, MemCategory c, size_t bytes, const char* what,
         BufferInit init = BufferInit::Zero);
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
  bool on_device() const { return device_ != nullptr; }
  void reset() noexcept;
  // A Buffer naming of's bytes without owning them (reset and the destructor leave them alone):
  // one tensor in two places, e.g. the A that a fused module's LoRA parts share (model/lora.h).
  // It must not outlive of.
  static Buffer view_of(Buffer& of);
  // A view of `bytes` of of's bytes from `offset` (offset + bytes <= of.size()): a tensor placed
  // in the dead part of another (the runner's backward temporaries, model/llama_internal.h).
  static Buffer view_of(Buffer& of, size_t offset, size_t bytes);
  bool is_view() const { return view_; }

  // Wherever the bytes live: zero them, or copy `bytes` (<= size()) in from / out to host memory.
  void zero();
  void copy_from_host(const void* src, size_t bytes);
  void copy_to_host(void* dst, size_t bytes) const;
  // bytes of src from offset src_off into the start of this buffer; both in the same memory
  // (host, or one DeviceAllocator's).
  void copy_from(const Buffer& src, size_t src_off, size_t bytes);

 private:
  MemoryTracker* tracker_ = nullptr;
  DeviceAllocator* device_ = nullptr;
  MemCategory cat_ = MemCategory::Workspace;
  void* data_ = nullptr;
  size_t size_ = 0;
  bool mapped_ = false;  // host storage page-mapped (memory.cpp host_block_alloc)
  bool view_ = false;    // view_of: the bytes are another Buffer's
};

// Holds a tracker's host block cache on for its lifetime (a trainer's): declared before the
// buffers it should serve, it is destroyed after them and returns the cached blocks.
class HostCacheHold {
 public:
  explicit HostCacheHold(MemoryTracker* t) : t_(t) {
    if (t_) t_->hold_host_cache();
  }
  ~HostCacheHold() {
    if (t_) t_->drop_host_cache();
  }
  HostCacheHold(const HostCacheHold&) = delete;
  HostCacheHold& operator=(const HostCacheHold&) = delete;

 private:
  MemoryTracker* t_;
};

// "12.0 MiB"
std::string format_bytes(uint64_t bytes);
// Parses "0", "1048576", "512M", "4GiB", "1.5G" (powers of 1024). Throws INVALID_ARGUMENT.
uint64_t parse_bytes(const std::string& text, const char* key);
// Peak resident set size of the process from the OS, in bytes.
uint64_t process_peak_rss();
// The process's resident set now, from the OS (0 where /proc is not there).
uint64_t process_rss();

}  // namespace qlft
