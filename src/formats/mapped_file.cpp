#include "formats/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "formats/unique_fd.h"

namespace qlft {

MappedFile::MappedFile(const std::string& path) : path_(path) {
  // O_NONBLOCK: opening a FIFO must not hang waiting for a writer (it is rejected below).
  const UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (!fd) throw_error(QLFT_ERR_IO, "%s: cannot open: %s", path.c_str(), std::strerror(errno));
  struct stat st;
  if (::fstat(fd.get(), &st) != 0)
    throw_error(QLFT_ERR_IO, "%s: cannot stat: %s", path.c_str(), std::strerror(errno));
  if (S_ISDIR(st.st_mode))
    throw_error(QLFT_ERR_IO, "%s: is a directory, expected a file", path.c_str());
  if (!S_ISREG(st.st_mode)) throw_error(QLFT_ERR_IO, "%s: is not a regular file", path.c_str());
  size_ = static_cast<size_t>(st.st_size);
  if (size_ == 0) return;
  void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd.get(), 0);
  if (p == MAP_FAILED)
    throw_error(QLFT_ERR_IO, "%s: cannot map: %s", path.c_str(), std::strerror(errno));
  map_ = {static_cast<const uint8_t*>(p), Unmap{size_}};  // the map outlives the descriptor
}

void MappedFile::Unmap::operator()(const uint8_t* p) const noexcept {
  ::munmap(const_cast<uint8_t*>(p), size);
}

void MappedFile::drop_pages(size_t offset, size_t n) const noexcept {
  if (!map_ || offset >= size_) return;
  n = std::min(n, size_ - offset);
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t a = reinterpret_cast<uintptr_t>(data() + offset) / page * page;
  const uintptr_t b = reinterpret_cast<uintptr_t>(data() + offset + n);
  // A private read-only mapping's pages are clean: dropping them loses nothing.
  if (b > a) ::madvise(reinterpret_cast<void*>(a), b - a, MADV_DONTNEED);
}

std::string read_text_file(const std::string& path, size_t max_bytes) {
  MappedFile f(path);
  if (f.size() > max_bytes)
    throw_error(QLFT_ERR_FORMAT, "%s: %zu bytes is larger than the %zu allowed for this file",
                path.c_str(), f.size(), max_bytes);
  return std::string(reinterpret_cast<const char*>(f.data()), f.size());
}

}  // namespace qlft
