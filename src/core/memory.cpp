#include "core/memory.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "core/error.h"
#include "core/threads.h"

namespace qlft {

namespace {
// Large host blocks made outside a trainer's steps (loading, sharding, checkpoints, exports) come
// straight from the OS (page-mapped) and go straight back: through malloc, glibc's mmap
// threshold rises to the largest block freed so far (up to 32 MiB), after which such blocks come
// from the heap, and the heap keeps the pages of blocks freed below its top (measured: ~7 MiB of
// each 4-rank ZeRO-3 rank's peak RSS for SmolLM2 was freed load-time buffers still resident).
// While a trainer holds the host cache, blocks come from malloc as before: the step's blocks of
// varying sizes are then reused from the heap, where fresh mappings would fault every page again
// (measured: 4.2x the page faults and ~8% more CPU time in a bf16 training run). Under
// AddressSanitizer every block stays on malloc so overflows are still caught.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kMapHostBlocks = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kMapHostBlocks = false;
#else
constexpr bool kMapHostBlocks = true;
#endif
#else
constexpr bool kMapHostBlocks = true;
#endif

// A block of `bytes` (a multiple of 64), 64-byte aligned: page-mapped when `map` allows it and it
// is large (*mapped; its bytes are then zero, fresh pages), else from malloc.
void* host_block_alloc(size_t bytes, bool map, bool* mapped) {
  *mapped = false;
  if (!(map && kMapHostBlocks && bytes >= kHostCacheMinBytes)) return std::aligned_alloc(64, bytes);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  *mapped = true;
  return p;
}

void host_block_free(void* block, size_t bytes, bool mapped) noexcept {
  if (!block) return;
  if (mapped)
    munmap(block, bytes);
  else
    std::free(block);
}
}  // namespace

const char* mem_category_name(MemCategory c) {
  static const char* names[kMemCategoryCount] = {
      "weights", "adapter", "gradients", "optimizer", "activations", "workspace", "communication"};
  int i = static_cast<int>(c);
  return (i >= 0 && i < kMemCategoryCount) ? names[i] : "unknown";
}

MemoryTracker::~MemoryTracker() {
  trim_host_cache();
}

void MemoryTracker::check_limit(MemCategory c, uint64_t bytes, const char* what, MemSpace s) {
  bool injected = false;
  if (fail_countdown_ > 0 && --fail_countdown_ == 0) injected = true;
  const bool device = limit_space_ == MemSpace::Device;
  const uint64_t total = device ? s_.device_total : s_.total_reserved;
  if (injected || (limited(s) && total + bytes > s_.limit)) {
    throw_error(QLFT_ERR_OUT_OF_MEMORY,
                "memory.limit exceeded during %s: allocating %s of %s (%s) would bring the %s "
                "to %s of %s; lower train.micro_batch or the sequence length, enable "
                "train.grad_checkpointing, offload optimizer state, or raise memory.limit%s",
                phase_, format_bytes(bytes).c_str(), mem_category_name(c), what ? what : "",
                device ? "device memory" : "total", format_bytes(total + bytes).c_str(),
                format_bytes(s_.limit).c_str(), injected ? " [injected fault]" : "");
  }
}

void MemoryTracker::count_in(MemCategory c, uint64_t bytes) {
  int i = static_cast<int>(c);
  s_.allocated[i] += bytes;
  s_.reserved[i] += bytes;
  if (s_.reserved[i] > s_.peak[i]) s_.peak[i] = s_.reserved[i];
}

void MemoryTracker::count_device(MemCategory c, uint64_t bytes) {
  const int i = static_cast<int>(c);
  s_.device_reserved[i] += bytes;
  s_.device_peak[i] = std::max(s_.device_peak[i], s_.device_reserved[i]);
  s_.device_live_peak = std::max(s_.device_live_peak, s_.device_total - s_.device_cached);
  s_.device_total_peak = std::max(s_.device_total_peak, s_.device_total);
}

void MemoryTracker::acquire(MemCategory c, uint64_t bytes, const char* what, MemSpace s) {
  std::lock_guard<std::mutex> lock(mu_);
  evict_for(bytes);
  check_limit(c, bytes, what, s);
  count_in(c, bytes);
  s_.total_reserved += bytes;
  if (s_.total_reserved > s_.total_peak) s_.total_peak = s_.total_reserved;
  if (s == MemSpace::Device) {
    s_.device_total += bytes;
    count_device(c, bytes);
  }
}

void MemoryTracker::release(MemCategory c, uint64_t bytes, MemSpace s) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  int i = static_cast<int>(c);
  s_.allocated[i] -= bytes;
  s_.reserved[i] -= bytes;
  s_.total_reserved -= bytes;
  if (s == MemSpace::Device) {
    s_.device_reserved[i] -= bytes;
    s_.device_total -= bytes;
  }
}

void MemoryTracker::to_device_cache(MemCategory c, uint64_t bytes) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  const int i = static_cast<int>(c);
  s_.allocated[i] -= bytes;
  s_.reserved[i] -= bytes;
  s_.device_reserved[i] -= bytes;
  s_.device_cached += bytes;
}

void MemoryTracker::from_device_cache(MemCategory c, uint64_t bytes, const char* what) {
  std::lock_guard<std::mutex> lock(mu_);
  check_limit(c, 0, what, MemSpace::Device);  // fault injection counts every acquire
  s_.device_cached -= bytes;
  count_in(c, bytes);
  count_device(c, bytes);
}

void MemoryTracker::device_cache_freed(uint64_t bytes) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  s_.device_cached -= bytes;
  s_.device_total -= bytes;
  s_.total_reserved -= bytes;
}

bool MemoryTracker::host_cache_held() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cache_holders_ > 0;
}

void* MemoryTracker::acquire_block(MemCategory c, uint64_t bytes, const char* what, bool* mapped) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = cache_.find(bytes);
  if (it == cache_.end()) {
    evict_for(bytes);
    check_limit(c, bytes, what, MemSpace::Host);
    count_in(c, bytes);
    s_.total_reserved += bytes;
    if (s_.total_reserved > s_.total_peak) s_.total_peak = s_.total_reserved;
    return nullptr;
  }
  // A hit moves bytes from `cached` into the category; the total held from the OS is unchanged.
  check_limit(c, 0, what, MemSpace::Host);  // fault injection counts every acquire
  void* block = it->second.block;
  *mapped = it->second.mapped;
  cache_.erase(it);
  s_.cached -= bytes;
  count_in(c, bytes);
  return block;
}

bool MemoryTracker::release_block(MemCategory c, uint64_t bytes, void* block,
                                  bool mapped) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  int i = static_cast<int>(c);
  s_.allocated[i] -= bytes;
  s_.reserved[i] -= bytes;
  if (cache_holders_ > 0 && bytes >= kHostCacheMinBytes) {
    try {
      cache_.emplace(bytes, CachedBlock{block, mapped});
      s_.cached += bytes;
      return true;
    } catch (...) {  // no room for the map node: free the block as without a cache
    }
  }
  s_.total_reserved -= bytes;
  return false;
}

// Returns cached blocks, largest first, until `bytes` more fit within both the total peak so far
// (so the cache never raises a peak) and the limit.
void MemoryTracker::evict_for(uint64_t bytes) noexcept {
  while (!cache_.empty() && (s_.total_reserved + bytes > s_.total_peak ||
                             (limited(MemSpace::Host) && s_.total_reserved + bytes > s_.limit))) {
    auto last = std::prev(cache_.end());
    host_block_free(last->second.block, last->first, last->second.mapped);
    s_.cached -= last->first;
    s_.total_reserved -= last->first;
    cache_.erase(last);
  }
}

void MemoryTracker::hold_host_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  ++cache_holders_;
}

void MemoryTracker::drop_host_cache() noexcept {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (cache_holders_ > 0) --cache_holders_;
    if (cache_holders_ > 0) return;
  }
  trim_host_cache();
}

void MemoryTracker::trim_host_cache() noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [bytes, b] : cache_) {
    host_block_free(b.block, bytes, b.mapped);
    s_.total_reserved -= bytes;
  }
  cache_.clear();
  s_.cached = 0;
}

void MemoryTracker::reset_peaks() {
  trim_host_cache();
  std::lock_guard<std::mutex> lock(mu_);
  s_.peak = s_.reserved;
  s_.total_peak = s_.total_reserved;
  s_.device_peak = s_.device_reserved;
  s_.device_live_peak = s_.device_total - s_.device_cached;
  s_.device_total_peak = s_.device_total;
}

MemorySnapshot MemoryTracker::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  MemorySnapshot s = s_;
  s.limit_device = limit_space_ == MemSpace::Device;
  return s;
}

uint64_t MemoryTracker::total_reserved() const {
  std::lock_guard<std::mutex> lock(mu_);
  return s_.total_reserved;
}

uint64_t MemoryTracker::budgeted_reserved() const {
  std::lock_guard<std::mutex> lock(mu_);
  return limit_space_ == MemSpace::Device ? s_.device_total : s_.total_reserved;
}

uint64_t MemoryTracker::budgeted_peak() const {
  std::lock_guard<std::mutex> lock(mu_);
  return limit_space_ == MemSpace::Device ? s_.device_live_peak : s_.total_peak;
}

namespace {
bool poison_uninit() {
  static const bool on = [] {
    const char* v = std::getenv("QLFT_POISON_UNINIT");
    return v && std::strcmp(v, "1") == 0;
  }();
  return on;
}
}  // namespace

Buffer::Buffer(MemoryTracker* tracker, MemCategory c, size_t bytes, const char* what,
               BufferInit init)
    : tracker_(tracker), cat_(c) {
  if (bytes == 0) return;
  size_t rounded = (bytes + 63) / 64 * 64;
  bool fresh_zero = false;
  if (tracker_) data_ = tracker_->acquire_block(c, rounded, what, &mapped_);
  if (!data_) {
    data_ = host_block_alloc(rounded, !(tracker_ && tracker_->host_cache_held()), &mapped_);
    fresh_zero = mapped_;
  }
  if (!data_) {
    if (tracker_) tracker_->release(c, rounded);
    throw_error(QLFT_ERR_OUT_OF_MEMORY, "the OS refused %s of %s (%s)",
                format_bytes(rounded).c_str(), mem_category_name(c), what ? what : "");
  }
  if (init == BufferInit::Zero && !fresh_zero)
    std::memset(data_, 0, rounded);
  else if (init != BufferInit::Zero && poison_uninit())
    std::memset(data_, 0xff, rounded);
  size_ = bytes;
}

Buffer::Buffer(DeviceAllocator* device, MemCategory c, size_t bytes, const char* what,
               BufferInit init)
    : device_(device), cat_(c) {
  if (bytes == 0) return;
  const size_t rounded = (bytes + 63) / 64 * 64;
  data_ = device_->allocate(c, rounded, what);
  size_ = bytes;
  if (init == BufferInit::Zero)
    device_->fill(data_, 0, rounded);
  else if (poison_uninit())
    device_->fill(data_, 0xff, rounded);
}

Buffer::~Buffer() {
  reset();
}

Buffer Buffer::view_of(Buffer& of) {
  Buffer b;
  b.device_ = of.device_;
  b.cat_ = of.cat_;
  b.data_ = of.data_;
  b.size_ = of.size_;
  b.view_ = true;
  return b;
}

Buffer Buffer::view_of(Buffer& of, size_t offset, size_t bytes) {
  QLFT_CHECK_ARG(offset <= of.size_ && bytes <= of.size_ - offset,
                 "a view of %zu bytes at %zu of a buffer of %zu", bytes, offset, of.size_);
  Buffer b = view_of(of);
  b.data_ = static_cast<char*>(of.data_) + offset;
  b.size_ = bytes;
  return b;
}

void Buffer::reset() noexcept {
  if (view_) {
    // another Buffer's bytes: view_of
  } else if (data_ && device_) {
    device_->release(data_);
  } else if (data_) {
    const size_t rounded = (size_ + 63) / 64 * 64;
    if (!tracker_ || !tracker_->release_block(cat_, rounded, data_, mapped_))
      host_block_free(data_, rounded, mapped_);
  }
  data_ = nullptr;
  size_ = 0;
  mapped_ = false;
  view_ = false;
}

void Buffer::zero() {
  if (!data_) return;
  if (device_) {
    device_->fill(data_, 0, size_);
    return;
  }
  // Large host buffers (the runner's gradient scratch, every layer) on the runtime's threads:
  // one core's memset leaves the other idle.
  constexpr size_t kChunk = size_t(1) << 18;
  const int64_t chunks = int64_t((size_ + kChunk - 1) / kChunk);
  char* p = static_cast<char*>(data_);
#pragma omp parallel for num_threads(call_threads()) schedule(static) if (chunks > 4)
  for (int64_t c = 0; c < chunks; ++c) {
    const size_t a = size_t(c) * kChunk;
    std::memset(p + a, 0, std::min(kChunk, size_ - a));
  }
}

namespace {
// bytes from src to dst: through the allocator's op for a device buffer, memcpy for a host one.
void move_bytes(DeviceAllocator* device, void (DeviceAllocator::*op)(void*, const void*, size_t),
                void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  if (device)
    (device->*op)(dst, src, bytes);
  else
    std::memcpy(dst, src, bytes);
}
}  // namespace

void Buffer::copy_from_host(const void* src, size_t bytes) {
  QLFT_CHECK_ARG(bytes <= size_, "copy of %zu bytes into a buffer of %zu", bytes, size_);
  move_bytes(device_, &DeviceAllocator::to_device, data_, src, bytes);
}

void Buffer::copy_from(const Buffer& src, size_t src_off, size_t bytes) {
  QLFT_CHECK_ARG(bytes <= size_ && src_off <= src.size_ && bytes <= src.size_ - src_off,
                 "copy of %zu bytes at %zu of a %zu-byte buffer into one of %zu", bytes, src_off,
                 src.size_, size_);
  QLFT_CHECK_ARG(device_ == src.device_, "copy between host and device buffers");
  move_bytes(device_, &DeviceAllocator::copy, data_, static_cast<const char*>(src.data_) + src_off,
             bytes);
}

void Buffer::copy_to_host(void* dst, size_t bytes) const {
  QLFT_CHECK_ARG(bytes <= size_, "copy of %zu bytes out of a buffer of %zu", bytes, size_);
  move_bytes(device_, &DeviceAllocator::to_host, dst, data_, bytes);
}

Buffer::Buffer(Buffer&& o) noexcept
    : tracker_(o.tracker_),
      device_(o.device_),
      cat_(o.cat_),
      data_(o.data_),
      size_(o.size_),
      mapped_(o.mapped_),
      view_(o.view_) {
  o.data_ = nullptr;
  o.size_ = 0;
  o.view_ = false;
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    reset();
    tracker_ = o.tracker_;
    device_ = o.device_;
    cat_ = o.cat_;
    data_ = o.data_;
    size_ = o.size_;
    mapped_ = o.mapped_;
    view_ = o.view_;
    o.data_ = nullptr;
    o.size_ = 0;
    o.view_ = false;
  }
  return *this;
}

std::string format_bytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  return u == 0 ? strf("%llu B", static_cast<unsigned long long>(bytes))
                : strf("%.1f %s", v, units[u]);
}

uint64_t parse_bytes(const std::string& text, const char* key) {
  const char* s = text.c_str();
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(s, &end);
  if (end == s || errno != 0 || !(v >= 0) || v > 1.8e19)
    throw_error(QLFT_ERR_INVALID_ARGUMENT, "%s must be a byte size like 512M or 4GiB, got '%s'",
                key, text.c_str());
  std::string unit;
  for (const char* p = end; *p; ++p)
    if (!std::isspace(static_cast<unsigned char>(*p)))
      unit += static_cast<char>(std::tolower(static_cast<unsigned char>(*p)));
  double mult = 1;
  if (unit.empty() || unit == "b")
    mult = 1;
  else if (unit == "k" || unit == "kb" || unit == "kib")
    mult = 1024.0;
  else if (unit == "m" || unit == "mb" || unit == "mib")
    mult = 1024.0 * 1024;
  else if (unit == "g" || unit == "gb" || unit == "gib")
    mult = 1024.0 * 1024 * 1024;
  else if (unit == "t" || unit == "tb" || unit == "tib")
    mult = 1024.0 * 1024 * 1024 * 1024;
  else
    throw_error(QLFT_ERR_INVALID_ARGUMENT, "%s: unknown size unit in '%s' (use K, M, G or T)", key,
                text.c_str());
  double b = v * mult;
  if (b > 1.8e19)
    throw_error(QLFT_ERR_INVALID_ARGUMENT, "%s: size '%s' is too large", key, text.c_str());
  return static_cast<uint64_t>(b);
}

uint64_t process_rss() {
  // statm: size, resident, ... in pages.
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  unsigned long long size = 0, resident = 0;
  const int n = std::fscanf(f, "%llu %llu", &size, &resident);
  std::fclose(f);
  return n == 2 ? resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE)) : 0;
}

uint64_t process_peak_rss() {
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

}  // namespace qlft
