// A read-only memory map of a whole file. Readers validate every offset against size().
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace qlft {

class MappedFile {
 public:
  // Throws QLFT_ERR_IO naming the path if it cannot be opened or mapped.
  explicit MappedFile(const std::string& path);

  const uint8_t* data() const { return map_.get(); }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Takes the pages of bytes [offset, offset + n) out of this process's resident set (they stay
  // readable: a later read faults them in again from the page cache). For data read once, such
  // as weights copied out at load time. Never throws.
  void drop_pages(size_t offset, size_t n) const noexcept;

 private:
  // Unmaps the whole file when the MappedFile goes.
  struct Unmap {
    size_t size;
    void operator()(const uint8_t* p) const noexcept;
  };
  std::string path_;
  size_t size_ = 0;
  std::unique_ptr<const uint8_t, Unmap> map_{nullptr, Unmap{0}};
};

// What a format reader over a memory map holds (GgufFile, SafetensorsFile): the map of its file,
// opened by the constructor, and the path for messages. The reader keeps pointers into the map.
class MappedReader {
 public:
  const std::string& path() const { return file_->path(); }

 protected:
  // Throws QLFT_ERR_IO naming the path if it cannot be opened or mapped.
  explicit MappedReader(const std::string& path) : file_(std::make_unique<MappedFile>(path)) {}
  std::unique_ptr<MappedFile> file_;
};

// Reads a whole (small) text file; throws QLFT_ERR_IO naming the path.
std::string read_text_file(const std::string& path, size_t max_bytes = size_t(256) << 20);

}  // namespace qlft
