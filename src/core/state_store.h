// Where optimizer state lives. The optimizers ask a store for zeroed arrays and never free
// them one by one; everything goes when the store does. Every byte is counted in the tracker
// as optimizer memory.
//
//  - host:  ordinary runtime buffers (qlft::Buffer).
//  - paged: on CPU, shared mappings of files in offload.dir that are unlinked at once (or
//           never named: O_TMPFILE), so the kernel may write cold state back to disk and drop
//           it from RAM, and nothing is left behind even after a crash. A CUDA build gives the
//           same interface cudaMallocManaged memory. (On a tmpfs offload.dir, such as /tmp on
//           many systems, the pages can only go to swap: point it at a disk for real paging.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/memory.h"

namespace qlft {

class StateStore {
 public:
  virtual ~StateStore() = default;
  // Zeroed, 64-byte aligned memory for `bytes` (> 0), valid until the store is destroyed.
  // Throws QLFT_ERR_OUT_OF_MEMORY (tracker limit) or QLFT_ERR_IO (paged file) naming `what`.
  virtual void* allocate(size_t bytes, const char* what) = 0;
  // true when the memory may be paged out to a file (or migrated, on CUDA).
  virtual bool paged() const = 0;
  virtual const char* kind() const = 0;
  // Bytes handed out (what the tracker counts for this store).
  uint64_t bytes() const { return bytes_; }

  // The optimizers' interface, which also fits a store that keeps the state elsewhere
  // (offload.optimizer=nvme: src/parallel/nvme_state_store.h). State comes in groups, one per
  // parameter tensor, numbered from 0 in the order a step updates them:
  //   add(group, bytes, what) declares a zeroed array and returns its id;
  //   begin(group, next) makes the group's arrays addressable through data(id) until
  //   end(group, modified), and may start fetching group `next` (-1: none);
  //   end(group, true) keeps what was written (a streamed store writes it back).
  // One group is begun at a time. For the resident stores here add() is allocate(), data() is
  // valid for the store's lifetime and begin/end do nothing.
  virtual int add(int group, size_t bytes, const char* what) {
    (void)group;
    ptrs_.push_back(allocate(bytes, what));
    return static_cast<int>(ptrs_.size()) - 1;
  }
  virtual void* data(int id) { return ptrs_[static_cast<size_t>(id)]; }
  virtual void begin(int group, int next) {
    (void)group;
    (void)next;
  }
  virtual void end(int group, bool modified) {
    (void)group;
    (void)modified;
  }
  // Bytes of state kept outside memory (0 for resident stores).
  virtual uint64_t offloaded_bytes() const { return 0; }

 protected:
  uint64_t bytes_ = 0;
  std::vector<void*> ptrs_;  // add()'s arrays in a resident store
};

std::unique_ptr<StateStore> make_host_state_store(MemoryTracker* tracker);
// dir: where the backing files go; "" means the system temp dir ($TMPDIR or /tmp).
// Throws QLFT_ERR_IO naming dir if it is not a writable directory.
std::unique_ptr<StateStore> make_paged_state_store(MemoryTracker* tracker, const std::string& dir);

// Throws QLFT_ERR_IO unless dir is a writable directory: the paged store's check, also run by
// qlft_runtime_create so a bad offload.dir fails before the model and data load.
void check_offload_dir(const std::string& dir);

}  // namespace qlft
