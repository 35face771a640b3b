// Base weights that are not all resident in this process: ZeRO-3 keeps 1/N of them on each
// rank, NVMe offload keeps them in files. The Model then keeps every tensor's shape and type but
// leaves the storage Buffers of a streamed unit empty, except while a LlamaRunner has that unit
// acquired: the stream fills them before use and frees them after.
//
// A unit is what one step of the forward pass reads: the token embedding, one decoder layer, or
// the final norm with the output head. The runner announces the unit it will ask for next, so a
// stream can fetch it (all-gather, file read) while the current one computes.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "quant/qweight.h"

namespace qlft {

constexpr int kEmbeddingUnit = 0;
inline int layer_unit(int layer) {
  return layer + 1;
}
inline int head_unit(int n_layers) {
  return n_layers + 1;
}
inline int unit_count(int n_layers) {
  return n_layers + 2;
}
constexpr int kNoUnit = -1;

class WeightStream {
 public:
  virtual ~WeightStream() = default;
  // Makes unit u's storage complete in the model until release(u). next is the unit the runner
  // will acquire after this one (kNoUnit if it does not know); the stream may start fetching it.
  // Throws (QLFT_ERR_DISTRIBUTED, QLFT_ERR_IO, ...) when the weights cannot be had; the model
  // is then as before the call. Every rank of a ZeRO-3 run must acquire the same units in the
  // same order (the runner does: it is a function of the batch shape only).
  virtual void acquire(int u, int next) = 0;
  // Frees what acquire(u) filled in. Never throws.
  virtual void release(int u) noexcept = 0;
  // One line for messages: "ZeRO-3 shards over 2 ranks", "NVMe offload in /scratch/qlft".
  virtual std::string describe() const = 0;
  // A stream over the same weights that this process can use alone (no collective: what one
  // rank uses to evaluate or generate while its peers do something else), or nullptr when there
  // is none. Using it leaves this stream's own state consistent (it evicts what it installed).
  virtual std::shared_ptr<WeightStream> rank_local() { return nullptr; }

  // A stream may keep the token embedding and the output head sharded by rows and never whole
  // (ZeRO-3 on host ranks, dist/zero3_stream.h): rows_sharded() says so. The embedding and head
  // units then acquire no rows of them, and the runner instead looks its tokens up with
  // lookup_rows (inside the embedding unit) and walks the head with each_head_slice (inside the
  // head unit). Both are collectives when the stream's are: every rank calls them, in the same
  // order, with its own rows (none is fine).
  virtual bool rows_sharded() const { return false; }
  // out[i] = embedding row tokens[i], i < n (n x dim floats in host memory). Throws
  // QLFT_ERR_INVALID_ARGUMENT for an id outside the vocabulary (on every rank alike).
  virtual void lookup_rows(const int32_t* tokens, int64_t n, float* out);
  // f(slice, row0) for consecutive slices of the head (slice holds rows [row0, row0 +
  // slice.rows), valid during the call), in row order, covering every row.
  virtual void each_head_slice(const std::function<void(const QWeight& slice, int64_t row0)>& f);
};

// What acquire(u) of a stream that holds one unit at a time requires (ZeRO-3, device offload):
// u is one of its `units` and no other unit is `held`. `who` names the stream in the error.
void check_one_unit_acquire(const char* who, int u, size_t units, int held);

// Holds a unit for the length of a scope (no-op without a stream).
class UnitUse {
 public:
  UnitUse(WeightStream* ws, int u, int next) : ws_(ws), u_(u) {
    if (ws_) ws_->acquire(u_, next);
  }
  ~UnitUse() {
    if (ws_) ws_->release(u_);
  }
  UnitUse(const UnitUse&) = delete;
  UnitUse& operator=(const UnitUse&) = delete;

 private:
  WeightStream* ws_;
  int u_;
};

}  // namespace qlft
