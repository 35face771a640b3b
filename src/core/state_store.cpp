#include "core/state_store.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "core/error.h"

namespace qlft {

namespace {

class HostStateStore final : public StateStore {
 public:
  explicit HostStateStore(MemoryTracker* tracker) : tracker_(tracker) {}
  void* allocate(size_t bytes, const char* what) override {
    QLFT_CHECK_ARG(bytes > 0, "optimizer state '%s': empty allocation", what);
    buffers_.emplace_back(tracker_, MemCategory::Optimizer, bytes, what);
    bytes_ += (bytes + 63) / 64 * 64;  // what Buffer counts
    return buffers_.back().data();
  }
  bool paged() const override { return false; }
  const char* kind() const override { return "host"; }

 private:
  MemoryTracker* tracker_;
  std::vector<Buffer> buffers_;
};

// One unnamed file per allocation, mapped shared: dirty pages are written back to the file
// under memory pressure instead of pinning RAM or swap.
class PagedFileStore final : public StateStore {
 public:
  PagedFileStore(MemoryTracker* tracker, std::string dir)
      : tracker_(tracker), dir_(std::move(dir)) {
    check_offload_dir(dir_);
  }
  ~PagedFileStore() override {
    for (const Mapping& m : maps_) {
      ::munmap(m.addr, m.len);
      if (tracker_) tracker_->release(MemCategory::Optimizer, m.counted);
    }
  }

  void* allocate(size_t bytes, const char* what) override {
    QLFT_CHECK_ARG(bytes > 0, "optimizer state '%s': empty allocation", what);
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    const size_t len = (bytes + page - 1) / page * page;
    if (tracker_) tracker_->acquire(MemCategory::Optimizer, bytes, what);
    int fd = open_unnamed();
    if (fd < 0) {
      int e = errno;
      if (tracker_) tracker_->release(MemCategory::Optimizer, bytes);
      throw_error(QLFT_ERR_IO, "paged optimizer state '%s': cannot create a file in '%s': %s", what,
                  dir_.c_str(), std::strerror(e));
    }
    void* addr = MAP_FAILED;
    if (::ftruncate(fd, static_cast<off_t>(len)) == 0)
      addr = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int e = errno;
    ::close(fd);  // the mapping keeps the file alive
    if (addr == MAP_FAILED) {
      if (tracker_) tracker_->release(MemCategory::Optimizer, bytes);
      throw_error(QLFT_ERR_IO, "paged optimizer state '%s': cannot map %zu bytes in '%s': %s", what,
                  len, dir_.c_str(), std::strerror(e));
    }
    maps_.push_back({addr, len, bytes});
    bytes_ += bytes;
    return addr;  // page aligned, and a fresh file reads as zeros
  }
  bool paged() const override { return true; }
  const char* kind() const override { return "paged-file"; }

 private:
  struct Mapping {
    void* addr;
    size_t len;
    uint64_t counted;
  };

  // O_TMPFILE files never have a name; where the file system lacks it, a named temp file is
  // unlinked right after it is opened.
  int open_unnamed() const {
#ifdef O_TMPFILE
    int fd = ::open(dir_.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd >= 0) return fd;
#endif
    std::string tmpl = dir_ + "/qlft-optim-XXXXXX";
    std::vector<char> name(tmpl.begin(), tmpl.end());
    name.push_back('\0');
    int fd2 = ::mkostemp(name.data(), O_CLOEXEC);
    if (fd2 >= 0) ::unlink(name.data());
    return fd2;
  }

  MemoryTracker* tracker_;
  std::string dir_;
  std::vector<Mapping> maps_;
};

}  // namespace

std::unique_ptr<StateStore> make_host_state_store(MemoryTracker* tracker) {
  return std::make_unique<HostStateStore>(tracker);
}

void check_offload_dir(const std::string& dir) {
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw_error(QLFT_ERR_IO, "offload.dir '%s' is not a directory", dir.c_str());
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    throw_error(QLFT_ERR_IO, "offload.dir '%s' is not writable: %s", dir.c_str(),
                std::strerror(errno));
}

std::unique_ptr<StateStore> make_paged_state_store(MemoryTracker* tracker, const std::string& dir) {
  std::string d = dir;
  if (d.empty()) {
    std::error_code ec;
    d = std::filesystem::temp_directory_path(ec).string();
    if (ec || d.empty()) d = "/tmp";
  }
  return std::make_unique<PagedFileStore>(tracker, d);
}

}  // namespace qlft
