// ZeRO stage 3 for the frozen base weights: each rank keeps a 1/world slice of every unit's
// bytes (model/weight_stream.h: the token embedding, each decoder layer, the final norm with the
// output head) and all-gathers a unit when the runner acquires it.
//
// Layout: each storage Buffer of 64 KiB or more (QWeight codes, large scale arrays) is split on
// its own: padded to world x per_rank bytes (per_rank a multiple of 64), rank r keeps bytes
// [r * per_rank, (r + 1) * per_rank) in a Buffer counted as `weights`, and the gather lands
// directly in the Buffer handed back to the model. The small ones of a unit (norms, biases,
// code books, small scales) are flattened in a fixed order into one stream split the same way,
// gathered at once and copied out. Sharding is local (each rank has the full model, or each
// group in turn from the file when the load was deferred), so it needs no communication.
// Gathered copies are counted as `communication` ("gathered unit").
//
// With tied embeddings the head unit is the final norm plus the embedding's group: the
// embedding is stored once and gathered for both units.
//
// Row sharding (row_chunk_bytes > 0, host shards, a host backend computing): the f32 token
// embedding and the untied f32 head are never gathered whole. Read from the file (a deferred
// load) the embedding's rows are kept as the file stores them (GGUF blocks, f16, bf16: the
// gathered chunks are dequantized where they are used, to the same values). Each is cut into
// world x per rows (RowChunks, about row_chunk_bytes gathered), and rank r keeps rows [r * per,
// (r + 1) * per) of every chunk, so the gather of one chunk is consecutive rows of the matrix.
// The lookup (lookup_rows) all-gathers every rank's token ids; then for each rank in turn every
// rank writes the rows of its ids it keeps (zero elsewhere) into one [rows, dim] buffer and a sum
// reduce onto that rank hands it its rows (exact: one term of each sum is the row, the others
// +0). The head (each_head_slice) is
// gathered chunk by chunk, the next one in flight while the current one is used. What is alive
// at once is two chunks, not the matrix (108 MiB for SmolLM2-135M's tied embedding).
//
// Prefetch: acquire(u, next) starts a non-blocking gather of next, which overlaps u's compute
// (as far as MPI progresses it: OpenMPI moves data only inside MPI calls, so large transfers
// complete mostly at the wait). At most the acquired unit and one prefetched unit are alive.
// acquire(u, u) (the head before backward) keeps u installed after its release.
//
// Every rank must acquire the same units in the same order (the runner does); a collective
// inside a gather is bounded by dist.timeout_s like every other.
//
// On the device (a device communicator, NCCL, and the device backend's memory): the shards and
// the gathered units live in device memory, the gathers run device to device, and the model's
// Buffers are handed device memory (the CUDA backend uses such weights in place). The bytes go
// through the host once, when the shards are made.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/memory.h"
#include "core/communicator.h"
#include "model/model.h"
#include "model/weight_stream.h"

namespace qlft::dist {

// The row chunks of a row-sharded matrix (see above): `per` rows of each of `chunks` chunks per
// rank, so world * per * chunks >= rows (the last chunk padded with zero rows). The planner
// (train/planner.cpp) sizes shards and gathers with it.
struct RowChunks {
  int64_t per = 0, chunks = 0;
  uint64_t row_bytes = 0;
  static RowChunks of(int64_t rows, uint64_t row_bytes, int world, uint64_t chunk_bytes);
  uint64_t shard_bytes() const { return uint64_t(chunks * per) * row_bytes; }
  uint64_t gathered_bytes(int world) const { return uint64_t(world) * uint64_t(per) * row_bytes; }
};

// Whether ZeRO-3 shards w by rows: a plain f32 matrix (no scales or codes), as load_model makes
// the embedding and head.
bool row_shardable(const QWeight& w);

// The bytes lookup_rows holds while it looks up `rows` tokens on each of `world` ranks with
// `dim`-wide rows: the gathered ids and one [rows, dim] buffer of partial rows.
uint64_t row_lookup_bytes(int64_t rows, int64_t dim, int world);

// What a layer unit holds besides its base weights (dist/zero3_lora.h: a sharded adapter's
// tensors). The stream fills it after it installed the layer's weights (inside acquire, so every
// rank, and a rank replaying passes, fills it at the same point: fill may be a collective) and
// drops it when it frees them.
class LayerExtra {
 public:
  virtual ~LayerExtra() = default;
  virtual void fill(int layer) = 0;
  virtual void drop(int layer) noexcept = 0;
};

class Zero3Stream final : public WeightStream {
 public:
  // Shards model's weights now (the full Buffers are freed once every shard is allocated; on
  // an exception the model is left as it was). comm must outlive the stream or detach() must be
  // called before it goes.
  // device: the device memory for shards and gathered units (comm must then have device
  // buffers); nullptr keeps them in host memory.
  // source: the model was loaded deferred (LoadOptions::deferred, its Buffers empty): each
  // group is loaded from it, sliced and freed in turn.
  // row_chunk_bytes: > 0 row-shards the f32 embedding and head (host shards only; the runner
  // must compute on the host: it gets their rows through lookup_rows and each_head_slice).
  Zero3Stream(Model& model, Communicator* comm, MemoryTracker* tracker,
              DeviceAllocator* device = nullptr, WeightGroupSource* source = nullptr,
              uint64_t row_chunk_bytes = 0);
  ~Zero3Stream() override;

  void acquire(int u, int next) override;
  void release(int u) noexcept override;
  std::string describe() const override;
  // Reads of the model's file (model/file_unit_stream.h), made on first use: evaluation and
  // generation on one rank without its peers (host shards; nullptr over a device
  // communicator). Works after detach() too. Evicts what this stream installed.
  std::shared_ptr<WeightStream> rank_local() override;
  bool rows_sharded() const override { return emb_rows_ != nullptr; }
  void lookup_rows(const int32_t* tokens, int64_t n, float* out) override;
  void each_head_slice(const std::function<void(const QWeight&, int64_t)>& f) override;

  // The acquires of one training forward and backward of the runner, without compute: a rank
  // with fewer micro-batches than its peers joins their gathers with it. backward_layer(l), when
  // set, runs while layer l's unit is held in the backward half (ZeRO-2's gradient exchanges
  // of that layer, dist/zero2_grads.h), as the runner's layer backward does.
  // head_walks: the walks of the row-sharded head the runner's cross-entropy takes
  // (Backend::cross_entropy_walks).
  void replay_training_pass(const std::function<void(int layer)>& backward_layer = {},
                            int head_walks = 2);

  // Whether acquire(u, next) starts gathering next (dist.zero3_prefetch; on by default). Off,
  // at most the acquired unit is gathered (the head's row chunks still overlap).
  void set_prefetch(bool on) { prefetch_ = on; }

  // extra (nullptr: none) is filled with each layer unit from now on; it must outlive the
  // stream or be unset first.
  void set_layer_extra(LayerExtra* extra) { extra_ = extra; }

  // The communicator is going away (the trainer ended): gathered copies and shards are freed;
  // every later acquire throws QLFT_ERR_UNSUPPORTED. Never throws.
  void detach() noexcept;

  // Counters for reports and tests.
  uint64_t shard_bytes() const;  // this rank's kept bytes
  uint64_t full_bytes() const;   // the unpadded bytes of every unit (the model's weights)
  int64_t gathers() const { return gathers_; }
  int64_t prefetch_hits() const { return hits_; }

 private:
  // A storage Buffer of the model. A large one is sliced on its own and gathered straight into
  // the Buffer the model gets back (a few padding bytes past its size, never read): no second
  // copy of the big tensors. Small ones (norms, biases, scales, code books) are packed per group
  // into one slice and one gather, then copied out.
  // A row-sharded slot (rows.per > 0) keeps RowChunks' rows of the matrix in rowq (its kind:
  // f32 made from the loaded matrix, or as the file stores it when read from the file) and is
  // never installed in the model: units skip it.
  struct Slot {
    Slot(Buffer* b, size_t n) : buf(b), bytes(n) {}
    Buffer* buf;
    size_t bytes;
    size_t per_rank = 0;  // large slots: this rank's slice
    Buffer shard;         // large slots
    RowChunks rows;       // row-sharded slots
    int64_t n_rows = 0;   // of the whole matrix
    QWeight rowq;         // [rows.chunks * rows.per, cols] of this rank
    int stored = -1;      // read by range: its index in the source's stored_group list
    bool packed() const { return !per_rank && !rows.per; }  // one of the group's small slots
  };
  struct Group {
    std::vector<Slot> slots;
    size_t total = 0, per_rank = 0;  // of the packed small slots
    Buffer shard;
  };
  struct Fetch {
    int unit = kNoUnit;
    std::vector<Buffer> packed;             // per group of the unit
    std::vector<std::vector<Buffer>> full;  // per group, per large slot (empty for small ones)
    std::vector<std::unique_ptr<PendingCollective>> pending;
  };

  const std::vector<int>& groups_of(int u) const { return unit_groups_[static_cast<size_t>(u)]; }
  Fetch start(int u);
  void finish(Fetch& f);           // waits for every gather of f
  void install(Fetch& f);          // copies f's bytes into the model's Buffers
  void uninstall(int u) noexcept;  // frees them
  Buffer make(MemCategory c, size_t bytes, const char* what) const;  // host or device memory
  void retire_ahead();         // waits for the prefetch and frees it
  void drop_ahead() noexcept;  // the same, errors swallowed (cleanup paths)

  bool present(int u) const;  // every Buffer of u is filled (a rank-local stream may empty them)
  // Makes sl's row shard of a matrix stored as fmt (kind, ggml_type, rows, cols; no data);
  // read(row0, n, dst) writes rows [row0, row0 + n) in that format to dst.
  void shard_rows(Slot& sl, const QWeight& fmt, uint64_t chunk_bytes,
                  const std::function<void(int64_t, int64_t, char*)>& read);

  Model* model_;
  Communicator* comm_;
  MemoryTracker* tracker_;
  std::shared_ptr<WeightStream> local_;  // rank_local()
  DeviceAllocator* device_;
  int rank_, world_;
  std::vector<Group> groups_;
  std::vector<std::vector<int>> unit_groups_;
  int installed_ = kNoUnit;  // unit whose Buffers are filled in the model
  int held_ = kNoUnit;       // unit acquired and not yet released
  bool keep_ = false;        // installed_ stays after its release (acquire(u, u))
  std::unique_ptr<Fetch> ahead_;
  const Slot* emb_rows_ = nullptr;   // row-sharded embedding, or nullptr
  const Slot* head_rows_ = nullptr;  // row-sharded head (the embedding's slot when tied)
  int64_t gathers_ = 0, hits_ = 0;
  bool detached_ = false;
  LayerExtra* extra_ = nullptr;
  bool prefetch_ = true;
  int layer_of(int u) const { return u - 1; }  // a layer unit's layer (weight_stream.h)
  bool is_layer(int u) const {
    return u >= layer_unit(0) && u < static_cast<int>(unit_groups_.size()) - 1;
  }
};

}  // namespace qlft::dist
