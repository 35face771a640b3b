#include "parallel/uring_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "core/log.h"

#if QLFT_HAVE_URING
#include <liburing.h>
#endif

namespace qlft {

namespace {

constexpr unsigned kQueueDepth = 64;

void log_engine_once(const char* engine, const char* why) {
  static std::atomic<bool> logged{false};
  if (!logged.exchange(true)) log_message(QLFT_LOG_INFO, "offload files: %s%s", engine, why);
}

}  // namespace

std::string offload_dir_or_temp(const std::string& dir) {
  if (!dir.empty()) return dir;
  std::error_code ec;
  std::string d = std::filesystem::temp_directory_path(ec).string();
  return (ec || d.empty()) ? std::string("/tmp") : d;
}

// One request in flight: a chunk of a ticket's transfer.
struct Op {
  UringFile::Ticket ticket;
  bool write;
  char* buf;
  size_t len;
  uint64_t off;
};

struct TicketState {
  size_t pending = 0;  // requests not yet completed
  std::string error;   // the first failure, if any
};

struct UringFile::Impl {
  bool uring = false;
#if QLFT_HAVE_URING
  io_uring ring{};
#endif
  unsigned in_flight = 0;
  Ticket next_ticket = 1;
  std::unordered_map<Ticket, TicketState> tickets;
  std::unordered_map<Op*, std::unique_ptr<Op>> ops;
};

UringFile::UringFile(int fd, std::string name)
    : fd_(fd), name_(std::move(name)), impl_(std::make_unique<Impl>()) {
#if QLFT_HAVE_URING
  // QLFT_OFFLOAD_NO_URING=1 asks for the fallback (tests, or a system where io_uring misbehaves).
  const char* no = std::getenv("QLFT_OFFLOAD_NO_URING");
  if (no && *no && std::strcmp(no, "0") != 0) {
    log_engine_once("pread/pwrite", " (QLFT_OFFLOAD_NO_URING is set)");
    return;
  }
  int rc = io_uring_queue_init(kQueueDepth, &impl_->ring, 0);
  if (rc == 0) {
    impl_->uring = true;
    log_engine_once("io_uring", "");
  } else {
    // Seccomp profiles (containers) and kernel.io_uring_disabled refuse it: same files, sync I/O.
    log_engine_once("pread/pwrite",
                    strf(" (io_uring_queue_init failed: %s)", std::strerror(-rc)).c_str());
  }
#else
  log_engine_once("pread/pwrite", " (built without liburing)");
#endif
}

UringFile::~UringFile() {
  try {
    wait_all();
  } catch (...) {
    // Nothing more to do with a failure here: the data is being thrown away.
  }
#if QLFT_HAVE_URING
  if (impl_->uring) io_uring_queue_exit(&impl_->ring);
#endif
  if (fd_ >= 0) ::close(fd_);
}

const char* UringFile::engine() const {
  return impl_->uring ? "io_uring" : "pread/pwrite";
}

std::unique_ptr<UringFile> UringFile::create_temp(const std::string& dir_in,
                                                  const std::string& what) {
  const std::string dir = offload_dir_or_temp(dir_in);
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw_error(QLFT_ERR_IO, "offload.dir '%s' (%s) is not a directory", dir.c_str(), what.c_str());
  int fd = -1;
  int err = 0;
#ifdef O_TMPFILE
  fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  err = errno;
#endif
  if (fd < 0) {
    // No O_TMPFILE here (some file systems): a temp name, unlinked right away.
    std::string tmpl = dir + "/qlft-offload-XXXXXX";
    std::vector<char> nm(tmpl.begin(), tmpl.end());
    nm.push_back('\0');
    fd = ::mkostemp(nm.data(), O_CLOEXEC);
    if (fd >= 0)
      ::unlink(nm.data());
    else
      err = errno;
  }
  if (fd < 0)
    throw_error(QLFT_ERR_IO, "offload.dir '%s': cannot create the %s file there: %s", dir.c_str(),
                what.c_str(), std::strerror(err));
  return std::unique_ptr<UringFile>(
      new UringFile(fd, strf("%s/<%s, unlinked>", dir.c_str(), what.c_str())));
}

std::unique_ptr<UringFile> UringFile::open_path(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_error(QLFT_ERR_IO, "'%s': cannot open: %s", path.c_str(), std::strerror(errno));
  return std::unique_ptr<UringFile>(new UringFile(fd, path));
}

void UringFile::resize(uint64_t bytes) {
  if (::ftruncate(fd_, static_cast<off_t>(bytes)) != 0)
    throw_error(QLFT_ERR_IO, "offload file '%s': cannot grow it to %llu bytes: %s", name_.c_str(),
                static_cast<unsigned long long>(bytes), std::strerror(errno));
}

UringFile::Ticket UringFile::read_async(void* buf, size_t len, uint64_t off) {
  return submit(false, buf, len, off);
}

UringFile::Ticket UringFile::write_async(const void* buf, size_t len, uint64_t off) {
  return submit(true, const_cast<void*>(buf), len, off);
}

namespace {

std::string io_failure(const std::string& name, bool write, size_t len, uint64_t off,
                       const char* why) {
  return strf("offload file '%s': %s of %zu bytes at offset %llu failed: %s", name.c_str(),
              write ? "write" : "read", len, static_cast<unsigned long long>(off), why);
}

}  // namespace

UringFile::Ticket UringFile::submit(bool write, void* buf, size_t len, uint64_t off) {
  Impl& m = *impl_;
  const Ticket t = m.next_ticket++;
  TicketState& ts = m.tickets[t];
  char* p = static_cast<char*>(buf);
  if (!m.uring) {
    // Synchronous fallback: the whole transfer now; wait() reports it.
    size_t done = 0;
    while (done < len && ts.error.empty()) {
      ssize_t r = write ? ::pwrite(fd_, p + done, len - done, static_cast<off_t>(off + done))
                        : ::pread(fd_, p + done, len - done, static_cast<off_t>(off + done));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0)
        ts.error = io_failure(name_, write, len - done, off + done, std::strerror(errno));
      else if (r == 0)
        ts.error = io_failure(name_, write, len - done, off + done,
                              write ? "nothing was written" : "short read (the file ends there)");
      else
        done += static_cast<size_t>(r);
    }
    (write ? bytes_written_ : bytes_read_) += done;
    return t;
  }
#if QLFT_HAVE_URING
  try {
    for (size_t pos = 0; pos < len; pos += kChunk) {
      const size_t n = std::min(kChunk, len - pos);
      // At most kQueueDepth requests queued or in flight, so the completion queue (twice that)
      // never overflows: past it, let one complete first.
      while (m.in_flight >= kQueueDepth) {
        io_uring_submit(&m.ring);
        reap_one();
      }
      io_uring_sqe* sqe = io_uring_get_sqe(&m.ring);
      if (!sqe) {
        io_uring_submit(&m.ring);
        sqe = io_uring_get_sqe(&m.ring);
      }
      if (!sqe)
        throw_error(QLFT_ERR_IO, "offload file '%s': no io_uring submission slot", name_.c_str());
      auto op = std::make_unique<Op>(Op{t, write, p + pos, n, off + pos});
      if (write)
        io_uring_prep_write(sqe, fd_, op->buf, static_cast<unsigned>(n), op->off);
      else
        io_uring_prep_read(sqe, fd_, op->buf, static_cast<unsigned>(n), op->off);
      io_uring_sqe_set_data(sqe, op.get());
      ++ts.pending;
      ++m.in_flight;
      Op* key = op.get();
      m.ops.emplace(key, std::move(op));
    }
  } catch (...) {
    // The caller never gets this ticket: the requests already queued must end before the
    // buffer can be released.
    io_uring_submit(&m.ring);
    try {
      while (m.tickets[t].pending > 0) reap_one();
    } catch (...) {
    }
    m.tickets.erase(t);
    throw;
  }
  io_uring_submit(&m.ring);
#endif
  return t;
}

void UringFile::reap_one() {
#if QLFT_HAVE_URING
  Impl& m = *impl_;
  io_uring_cqe* cqe = nullptr;
  int rc;
  do {
    rc = io_uring_wait_cqe(&m.ring, &cqe);
  } while (rc == -EINTR);
  if (rc < 0)
    throw_error(QLFT_ERR_IO, "offload file '%s': waiting for io_uring completions failed: %s",
                name_.c_str(), std::strerror(-rc));
  Op* op = static_cast<Op*>(io_uring_cqe_get_data(cqe));
  const int res = cqe->res;
  io_uring_cqe_seen(&m.ring, cqe);
  --m.in_flight;
  auto oi = m.ops.find(op);
  if (oi == m.ops.end()) return;
  TicketState& s = m.tickets[op->ticket];
  if (res > 0) (op->write ? bytes_written_ : bytes_read_) += static_cast<uint64_t>(res);
  if (res > 0 && static_cast<size_t>(res) < op->len) {
    // A partial transfer: the rest goes in again (the completion just freed a queue slot).
    op->buf += res;
    op->len -= static_cast<size_t>(res);
    op->off += static_cast<uint64_t>(res);
    io_uring_sqe* sqe = io_uring_get_sqe(&m.ring);
    if (!sqe) {
      io_uring_submit(&m.ring);
      sqe = io_uring_get_sqe(&m.ring);
    }
    if (!sqe) {
      if (s.error.empty())
        s.error = io_failure(name_, op->write, op->len, op->off, "no io_uring submission slot");
      --s.pending;
      m.ops.erase(oi);
      return;
    }
    if (op->write)
      io_uring_prep_write(sqe, fd_, op->buf, static_cast<unsigned>(op->len), op->off);
    else
      io_uring_prep_read(sqe, fd_, op->buf, static_cast<unsigned>(op->len), op->off);
    io_uring_sqe_set_data(sqe, op);
    ++m.in_flight;
    io_uring_submit(&m.ring);
    return;
  }
  if (res < 0 && s.error.empty())
    s.error = io_failure(name_, op->write, op->len, op->off, std::strerror(-res));
  else if (res == 0 && s.error.empty())
    s.error = io_failure(name_, op->write, op->len, op->off,
                         op->write ? "nothing was written" : "short read (the file ends there)");
  --s.pending;
  m.ops.erase(oi);
#endif
}

bool UringFile::done(Ticket t) const {
  auto it = impl_->tickets.find(t);
  return it == impl_->tickets.end() || it->second.pending == 0;
}

void UringFile::wait(Ticket t) {
  Impl& m = *impl_;
  auto it = m.tickets.find(t);
  if (it == m.tickets.end()) return;
#if QLFT_HAVE_URING
  while (m.uring && m.tickets[t].pending > 0) reap_one();
#endif
  std::string err = std::move(m.tickets[t].error);
  m.tickets.erase(t);
  if (!err.empty()) throw_error(QLFT_ERR_IO, "%s", err.c_str());
}

void UringFile::wait_all() {
  std::vector<Ticket> all;
  for (const auto& [t, s] : impl_->tickets) all.push_back(t);
  std::string first;
  for (Ticket t : all) {
    try {
      wait(t);
    } catch (const Error& e) {
      if (first.empty()) first = e.what();
    }
  }
  if (!first.empty()) throw_error(QLFT_ERR_IO, "%s", first.c_str());
}

}  // namespace qlft
