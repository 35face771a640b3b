// An owned POSIX file descriptor (AtomicFile's temporary, the file MappedFile opens to map):
// closed when its owner goes, moved but never copied, so an owner needs no close on each error
// path and is not copyable by its nature.
#pragma once

#include <unistd.h>

#include <utility>

namespace qlft {

class UniqueFd {
 public:
  UniqueFd() = default;
  // Owns fd (as open() returned it: -1, none).
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  // Closes it now and says how that went: close()'s 0, or -1 with errno (a writer's last chance
  // to hear of a failed write). The descriptor is given up either way.
  int close() { return ::close(std::exchange(fd_, -1)); }
  // Closes it, if any, ignoring the outcome (a failure path).
  void reset() noexcept {
    if (fd_ >= 0) ::close(std::exchange(fd_, -1));
  }

 private:
  int fd_ = -1;
};

}  // namespace qlft
