// offload.params=nvme: the frozen base weights live in an unnamed file under offload.dir, and a
// unit (model/weight_stream.h: the embedding, one layer, the head) is read back only while the
// runner uses it, the next unit's read already in flight behind the current one's compute.
//
// offload() writes the storage of every unit (QWeight data/absmax/nested_absmax/code/
// nested_code/scb, the norms, the biases) to the file, each Buffer at a 4 KiB-aligned offset.
// The bytes come from `host`: the model itself, whose storage is then freed (the tracker's
// weights fall to zero and so does their RSS), or another model of the same shapes read in
// place and left as it is (the shared model, train/weight_placement.h: no copy of it is made).
// acquire(u, next) gives u's Buffers back (fresh Buffers, category weights: they are the
// weights, and counting them there keeps "weights" equal to what is resident) and starts
// reading `next` into fresh Buffers too; release(u) frees u's. At most 1 + read_ahead units are
// resident at once (the one in use and those read ahead), so the weights category stays within
// those "prefetch buffers". A record shared by two units (tied embeddings: the head reads
// tok_embd) is reference counted, never read twice.
//
// Ownership: the stream belongs to the model it was made from (model.stream holds it) and
// points into that model's storage; it owns its file, so it keeps working after the trainer
// that made it is gone, for as long as the model lives. Buffers are counted in the tracker given
// to offload(), which must outlive the model (as the tracker the model was loaded with does).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/memory.h"
#include "model/weight_stream.h"
#include "parallel/uring_file.h"

namespace qlft {

struct Model;

class NvmeWeightStream final : public WeightStream {
 public:
  // Writes host's base weights into a file in dir ("" = system temp dir) and sets model.stream
  // (which must be empty) to read them back into model. &host == &model: model's storage is
  // freed once written; otherwise host has model's shapes and kinds, and model no storage.
  // read_ahead >= 0: units read ahead of the one in use (0: every read is synchronous). Throws
  // QLFT_ERR_IO (file) leaving the models as they were.
  static std::shared_ptr<NvmeWeightStream> offload(Model& model, const Model& host,
                                                   MemoryTracker* tracker, const std::string& dir,
                                                   int read_ahead);
  ~NvmeWeightStream() override;

  void acquire(int u, int next) override;
  void release(int u) noexcept override;
  std::string describe() const override;

  uint64_t offloaded_bytes() const { return file_bytes_; }  // bytes moved to the file
  uint64_t resident_bytes() const { return resident_; }     // storage resident now
  uint64_t peak_resident_bytes() const { return peak_resident_; }
  int read_ahead() const { return read_ahead_; }
  const char* engine() const { return file_->engine(); }

 private:
  struct Record {
    Buffer* slot;  // the Buffer in the model it fills
    size_t bytes;
    uint64_t off;
    const char* what;
    int refs = 0;
    UringFile::Ticket io = 0;  // a read in flight
  };
  NvmeWeightStream(Model& model, MemoryTracker* tracker, std::string dir, int read_ahead);
  void ref_unit(int u);             // allocates and starts reading what is not resident
  void wait_unit(int u);            // waits for u's reads; throws on a failed one
  void unref_unit(int u) noexcept;  // frees records no unit holds any more
  void unref_record(int i) noexcept;
  void drop_prefetch(int keep1, int keep2) noexcept;

  Model& model_;
  MemoryTracker* tracker_;
  std::string dir_;
  int read_ahead_;
  std::unique_ptr<UringFile> file_;
  std::vector<Record> records_;
  std::vector<std::vector<int>> units_;  // record indices of each unit
  std::vector<int> in_use_;              // acquire count per unit
  std::vector<int> prefetched_;          // units read ahead (each holds one ref on its records)
  uint64_t file_bytes_ = 0, resident_ = 0, peak_resident_ = 0;
};

}  // namespace qlft
