#include "parallel/nvme_state_store.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "parallel/uring_file.h"

namespace qlft {

namespace {

constexpr uint64_t kFileAlign = 4096;

uint64_t round_up(uint64_t v, uint64_t a) {
  return (v + a - 1) / a * a;
}

class NvmeStateStore final : public StateStore {
 public:
  NvmeStateStore(MemoryTracker* tracker, const std::string& dir, int buffers)
      : tracker_(tracker), slots_(static_cast<size_t>(buffers) + 1) {
    QLFT_CHECK_ARG(buffers >= 1, "offload.buffers must be >= 1, got %d", buffers);
    file_ = UringFile::create_temp(dir, "optimizer state");
  }
  ~NvmeStateStore() override {
    file_.reset();  // waits for every transfer before the slots go
  }

  void* allocate(size_t, const char* what) override {
    throw_error(QLFT_ERR_UNSUPPORTED,
                "optimizer state '%s': the NVMe store hands out state by group (add/begin/end), "
                "not as resident memory",
                what);
  }
  bool paged() const override { return true; }
  const char* kind() const override { return "nvme"; }
  uint64_t offloaded_bytes() const override { return file_bytes_; }

  int add(int group, size_t bytes, const char* what) override {
    QLFT_CHECK_ARG(bytes > 0, "optimizer state '%s': empty allocation", what);
    QLFT_CHECK_ARG(!ready_, "optimizer state '%s': added after the first step", what);
    QLFT_CHECK_ARG(group >= 0 && group >= static_cast<int>(groups_.size()) - 1,
                   "optimizer state '%s': groups must be added in order (got %d after %zu)", what,
                   group, groups_.size());
    if (group >= static_cast<int>(groups_.size())) groups_.resize(static_cast<size_t>(group) + 1);
    Group& g = groups_[static_cast<size_t>(group)];
    arrays_.push_back({group, g.bytes});
    g.bytes = round_up(g.bytes + bytes, 64);
    return static_cast<int>(arrays_.size()) - 1;
  }

  void* data(int id) override {
    const Array& a = arrays_.at(static_cast<size_t>(id));
    Slot* s = find(a.group);
    QLFT_CHECK_ARG(s && s->in_use, "optimizer state: group %d is read outside begin()/end()",
                   a.group);
    return static_cast<char*>(s->buf.data()) + a.off;
  }

  void begin(int g, int next) override {
    layout();
    QLFT_CHECK_ARG(g >= 0 && g < static_cast<int>(groups_.size()),
                   "optimizer state: group %d is out of range", g);
    if (next >= static_cast<int>(groups_.size()) || next == g) next = -1;
    Slot* s = find(g);
    if (!s) {
      s = victim(g, next);
      QLFT_CHECK_ARG(s, "optimizer state: no free buffer for group %d (one group at a time)", g);
      load(*s, g);
    }
    settle(*s);  // its read (or an earlier write-back of this copy) has ended
    s->in_use = true;
    s->last_use = ++clock_;
    if (next >= 0 && !find(next)) {
      Slot* v = victim(g, next);
      try {
        if (v) load(*v, next);
      } catch (...) {
        s->in_use = false;  // a failed write-back surfaced here: the caller gets no end()
        throw;
      }
    }
  }

  void end(int g, bool modified) override {
    Slot* s = find(g);
    if (!s || !s->in_use) return;
    s->in_use = false;
    if (modified) {
      const Group& gr = groups_[static_cast<size_t>(g)];
      s->io = file_->write_async(s->buf.data(), gr.bytes, gr.off);
    }
  }

 private:
  struct Group {
    uint64_t bytes = 0, off = 0;
  };
  struct Array {
    int group;
    uint64_t off;  // within the group
  };
  struct Slot {
    Buffer buf;
    int group = -1;  // whose copy it holds
    UringFile::Ticket io = 0;
    bool in_use = false;
    uint64_t last_use = 0;
  };

  // At the first begin(): the file's layout, its size (zeros), and the slots.
  void layout() {
    if (ready_) return;
    uint64_t off = 0, largest = 0;
    for (Group& g : groups_) {
      g.off = off;
      off = round_up(off + g.bytes, kFileAlign);
      largest = std::max(largest, g.bytes);
    }
    file_->resize(off);
    file_bytes_ = off;
    for (Slot& s : slots_) {
      s.buf = Buffer(tracker_, MemCategory::Optimizer, largest, "optimizer state buffer (nvme)");
      bytes_ += round_up(largest, 64);
    }
    ready_ = true;
    log_message(QLFT_LOG_INFO,
                "offload.optimizer=nvme: %s of optimizer state in %s (%s), %zu buffers of %s",
                format_bytes(off).c_str(), file_->name().c_str(), file_->engine(), slots_.size(),
                format_bytes(largest).c_str());
  }

  Slot* find(int g) {
    for (Slot& s : slots_)
      if (s.group == g) return &s;
    return nullptr;
  }

  // A slot to reuse: not in use and holding neither g nor next; one whose transfer has ended
  // first, the least recently used among those.
  Slot* victim(int g, int next) {
    Slot* best = nullptr;
    bool best_done = false;
    for (Slot& s : slots_) {
      if (s.in_use || (s.group >= 0 && (s.group == g || s.group == next))) continue;
      const bool d = file_->done(s.io);
      if (!best || (d && !best_done) || (d == best_done && s.last_use < best->last_use)) {
        best = &s;
        best_done = d;
      }
    }
    return best;
  }

  void settle(Slot& s) {
    const UringFile::Ticket t = s.io;
    s.io = 0;
    try {
      file_->wait(t);
    } catch (...) {
      s.group = -1;  // the copy is not to be trusted
      throw;
    }
  }

  void load(Slot& s, int g) {
    settle(s);  // a write-back from this slot must end before it is overwritten
    s.group = g;
    const Group& gr = groups_[static_cast<size_t>(g)];
    s.io = file_->read_async(s.buf.data(), gr.bytes, gr.off);
  }

  MemoryTracker* tracker_;
  std::unique_ptr<UringFile> file_;
  std::vector<Group> groups_;
  std::vector<Array> arrays_;
  std::vector<Slot> slots_;
  bool ready_ = false;
  uint64_t file_bytes_ = 0, clock_ = 0;
};

}  // namespace

std::unique_ptr<StateStore> make_nvme_state_store(MemoryTracker* tracker, const std::string& dir,
                                                  int buffers) {
  return std::make_unique<NvmeStateStore>(tracker, dir, buffers);
}

}  // namespace qlft
