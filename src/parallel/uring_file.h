// A scratch file for NVMe offload, read and written asynchronously with io_uring.
//
// The file has no name on disk: it is opened O_TMPFILE in its directory (or created under a
// temporary name and unlinked at once where the file system lacks O_TMPFILE), so nothing is left
// behind, even after a crash. Transfers are split into aligned chunks of at most kChunk bytes,
// each one an io_uring request; a ticket covers one whole transfer and wait() checks every
// completion: an error (-EIO, -ENOSPC, ...) or a read that ends early (the file is shorter) throws
// QLFT_ERR_IO naming the file and the offset. A positive short transfer is resubmitted for the
// rest, as the kernel may legally return one.
//
// Builds without liburing (QLFT_URING=OFF), and kernels or sandboxes that refuse io_uring, use
// plain pread/pwrite instead: each transfer then runs synchronously when it is queued, and wait()
// reports its result (so does any file made while QLFT_OFFLOAD_NO_URING=1 is set). engine() says
// which path runs; the choice is logged once per process.
//
// Not thread-safe: one owner thread queues and waits. Buffers handed to read_async/write_async
// must stay valid until their ticket has been waited for (the destructor waits for everything).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace qlft {

class UringFile {
 public:
  using Ticket = uint64_t;
  static constexpr size_t kChunk = size_t(1) << 20;  // bytes per io_uring request

  // An unnamed read-write file in dir ("" = the system temp dir: $TMPDIR or /tmp). `what` names
  // it in messages ("base weights"). Throws QLFT_ERR_IO naming dir when no file can be made there.
  static std::unique_ptr<UringFile> create_temp(const std::string& dir, const std::string& what);
  // Opens an existing file read-write (or read-only if it cannot be written): for tests and
  // tools. Throws QLFT_ERR_IO naming path.
  static std::unique_ptr<UringFile> open_path(const std::string& path);
  ~UringFile();
  UringFile(const UringFile&) = delete;
  UringFile& operator=(const UringFile&) = delete;

  // Queue a transfer of len bytes at byte offset off and start it; wait for its ticket before
  // touching buf again. len == 0 gives a ticket that is already complete.
  Ticket read_async(void* buf, size_t len, uint64_t off);
  Ticket write_async(const void* buf, size_t len, uint64_t off);
  // Blocks until every request of t has completed; throws QLFT_ERR_IO if one failed. A ticket
  // is waited for once; waiting for an unknown or already waited ticket returns at once.
  void wait(Ticket t);
  // Waits for every queued transfer; throws the first failure after all have completed.
  void wait_all();
  bool done(Ticket t) const;

  void read(void* buf, size_t len, uint64_t off) { wait(read_async(buf, len, off)); }
  void write(const void* buf, size_t len, uint64_t off) { wait(write_async(buf, len, off)); }
  // Sets the file's size (new space reads as zeros). Throws QLFT_ERR_IO (ENOSPC, EFBIG, ...).
  void resize(uint64_t bytes);

  const std::string& name() const { return name_; }
  const char* engine() const;  // "io_uring" or "pread/pwrite"
  uint64_t bytes_read() const { return bytes_read_; }
  uint64_t bytes_written() const { return bytes_written_; }

 private:
  struct Impl;
  UringFile(int fd, std::string name);
  Ticket submit(bool write, void* buf, size_t len, uint64_t off);
  void reap_one();  // waits for one io_uring completion and accounts for it

  int fd_ = -1;
  std::string name_;
  uint64_t bytes_read_ = 0, bytes_written_ = 0;
  std::unique_ptr<Impl> impl_;
};

// The system temp dir ($TMPDIR, else /tmp) when dir is empty, else dir.
std::string offload_dir_or_temp(const std::string& dir);

}  // namespace qlft
