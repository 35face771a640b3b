// offload.optimizer=nvme: optimizer state in an unnamed file under offload.dir, streamed one
// group (a parameter tensor's state arrays) at a time through a few buffers.
//
// The groups lie in the file one after another (4 KiB-aligned); a group's arrays sit together
// in it, so each group is one read and one write. 1 + buffers slots, each as large as the
// largest group, are the only memory (counted as optimizer memory): begin(g, next) finds g in a
// slot (read ahead, or still there from an earlier use) or reads it, and starts reading `next`
// into a free slot; end(g, true) queues g's write-back from its slot, which then stays a cached
// copy until the slot is reused, so a group is never read while its newer copy is being written.
// A fresh file reads as zeros, which is what optimizers expect of new state.
#pragma once

#include <memory>
#include <string>

#include "core/state_store.h"

namespace qlft {

// dir: "" = system temp dir. buffers >= 1: slots besides the one in use (1: no read-ahead while a
// write-back is pending; 2 lets a read and a write overlap the update). Throws QLFT_ERR_IO naming
// dir when no file can be made there.
std::unique_ptr<StateStore> make_nvme_state_store(MemoryTracker* tracker, const std::string& dir,
                                                  int buffers);

}  // namespace qlft
