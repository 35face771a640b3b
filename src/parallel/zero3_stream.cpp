#include "parallel/zero3_stream.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "model/file_unit_stream.h"

namespace qlft::dist {

namespace {
constexpr size_t kAlign = 64;            // per-rank slices: whole 64-byte units for the MPI gather
constexpr size_t kLargeSlot = 64 << 10;  // gathered in place, not packed

size_t slice_bytes(size_t total, int world) {
  const size_t share = (total + static_cast<size_t>(world) - 1) / static_cast<size_t>(world);
  return (share + kAlign - 1) / kAlign * kAlign;
}

// Copies the part of a source's bytes (bytes [off, off + n) of a stream) that falls in [lo, hi)
// to dst + (.. - lo); read(from, count, to) copies the source's bytes [from, from + count).
template <class Read>
void copy_overlap(char* dst, size_t lo, size_t hi, size_t off, size_t n, const Read& read) {
  const size_t a = std::max(lo, off), b = std::min(hi, off + n);
  if (a < b) read(a - off, b - a, dst + (a - lo));
}
}  // namespace

RowChunks RowChunks::of(int64_t rows, uint64_t row_bytes, int world, uint64_t chunk_bytes) {
  RowChunks c;
  c.row_bytes = row_bytes;
  const int64_t w = world;
  const int64_t share = (rows + w - 1) / w;  // one chunk holds the whole matrix at most
  const int64_t most =
      std::clamp<int64_t>(static_cast<int64_t>(chunk_bytes / (uint64_t(w) * row_bytes)), 1,
                          std::max<int64_t>(1, share));
  c.chunks = (rows + w * most - 1) / (w * most);
  c.per = (rows + w * c.chunks - 1) / (w * c.chunks);  // the chunks evened out: little padding
  return c;
}

bool row_shardable(const QWeight& w) {
  return w.kind == QuantKind::F32 && w.rows > 0 && w.absmax.empty() && w.nested_absmax.empty() &&
         w.code.empty() && w.nested_code.empty() && w.scb.empty();
}

uint64_t row_lookup_bytes(int64_t rows, int64_t dim, int world) {
  auto rb = [](uint64_t n) { return (n + 63) / 64 * 64; };
  const uint64_t w = uint64_t(world), r = uint64_t(rows), d = uint64_t(dim);
  return rb(w * r * 4) + rb(r * d * 4);
}

Zero3Stream::Zero3Stream(Model& model, Communicator* comm, MemoryTracker* tracker,
                         DeviceAllocator* device, WeightGroupSource* source,
                         uint64_t row_chunk_bytes)
    : model_(&model),
      comm_(comm),
      tracker_(tracker),
      device_(device),
      rank_(comm->rank()),
      world_(comm->world()) {
  QLFT_CHECK_ARG(!device_ == !comm_->device_buffers(),
                 "ZeRO-3: %s memory for the shards but a %s communicator (%s)",
                 device_ ? "device" : "host", comm_->device_buffers() ? "device" : "host",
                 comm_->backend());
  // Groups: 0 the embedding, 1..L the layers, L+1 the final norm and untied output head.
  groups_.resize(model.layers.size() + 2);
  unit_groups_ = weight_groups_of_units(model);
  // write(dst) fills a shard's bytes: in place on the host, through a host copy on the device.
  auto fill = [&](Buffer& shard, const auto& write) {
    if (!device_) return write(shard.as<char>());
    std::vector<char> h(shard.size(), 0);
    write(h.data());
    shard.copy_from_host(h.data(), h.size());
  };
  // The runner reads row-sharded storage through lookup_rows and each_head_slice together, so
  // the embedding and the head are sharded by rows both or neither.
  const bool by_rows = row_chunk_bytes && !device_ && row_shardable(model.tok_embd) &&
                       (!model.output.rows || row_shardable(model.output));
  // Group by group: with a source (a deferred load) this rank's slices of a group the file
  // stores as the model keeps it are read by range (WeightGroupSource::stored_group), other
  // groups are loaded, sliced and freed, so no more than one group is ever whole here; without
  // one every shard is made before any full Buffer goes (an out-of-memory leaves the model
  // whole).
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    Group& g = groups_[gi];
    if (gi == 0 && by_rows && source) {
      // The embedding by rows straight from the file, as stored: never whole here.
      g.slots.push_back({&model.tok_embd.data, size_t(model.tok_embd.numel()) * 4});
      shard_rows(g.slots.back(), source->stored_rows(false), row_chunk_bytes,
                 [&](int64_t r0, int64_t n, char* dst) { source->load_rows(false, r0, n, dst); });
      emb_rows_ = &g.slots.back();
      continue;
    }
    // An untied head likewise: the last group's final norm is loaded, the head read by rows.
    const bool head_from_file =
        by_rows && source && gi + 1 == groups_.size() && model.output.rows > 0;
    const std::vector<size_t> stored =
        source ? source->stored_group(static_cast<int>(gi), !head_from_file)
               : std::vector<size_t>{};
    if (source && stored.empty()) source->load(model, static_cast<int>(gi), !head_from_file);
    // A slot's bytes [from, from + count) to `to`: from the file, or from its loaded Buffer.
    auto read = [&](const Slot& sl) {
      return [&sl, source](size_t from, size_t count, char* to) {
        if (sl.stored >= 0)
          source->read_stored(size_t(sl.stored), from, count, to);
        else
          std::memcpy(to, sl.buf->as<const char>() + from, count);
      };
    };
    try {
      std::vector<Buffer*> bufs;  // the group's, in for_each_weight_buffer's order
      for_each_weight_buffer(model, [&](int bg, Buffer& b) {
        if (bg == static_cast<int>(gi)) bufs.push_back(&b);
      });
      if (!stored.empty() && stored.size() != bufs.size())
        throw_error(QLFT_ERR_INTERNAL,
                    "ZeRO-3: weight group %zu lists %zu stored Buffers, the model %zu", gi,
                    stored.size(), bufs.size());
      for (size_t i = 0; i < bufs.size(); ++i)
        if (const size_t n = stored.empty() ? bufs[i]->size() : stored[i]) {
          g.slots.push_back({bufs[i], n});
          if (!stored.empty()) g.slots.back().stored = static_cast<int>(i);
        }
      for (Slot& sl : g.slots) {
        // The f32 embedding and untied head by rows (host shards, host compute).
        const bool emb = sl.buf == &model.tok_embd.data, head = sl.buf == &model.output.data;
        if (by_rows && (emb || head)) {
          if (sl.stored >= 0)
            throw_error(QLFT_ERR_INTERNAL,
                        "ZeRO-3: the f32 embedding or head by rows is read through load_rows");
          const QWeight* w = emb ? &model.tok_embd : &model.output;
          QWeight fmt;  // f32, as loaded
          fmt.rows = w->rows;
          fmt.cols = w->cols;
          shard_rows(sl, fmt, row_chunk_bytes, [&sl](int64_t r0, int64_t n, char* dst) {
            const size_t rb = sl.bytes / size_t(sl.n_rows);
            std::memcpy(dst, sl.buf->as<const char>() + size_t(r0) * rb, size_t(n) * rb);
          });
          (emb ? emb_rows_ : head_rows_) = &sl;
        } else if (sl.bytes >= kLargeSlot) {
          sl.per_rank = slice_bytes(sl.bytes, world_);
          sl.shard = make(MemCategory::Weights, sl.per_rank, "ZeRO-3 shard");
        } else {
          g.total += sl.bytes;
        }
      }
      g.per_rank = slice_bytes(g.total, world_);
      if (g.total) g.shard = make(MemCategory::Weights, g.per_rank, "ZeRO-3 shard");
      const size_t lo = g.per_rank * static_cast<size_t>(rank_), hi = lo + g.per_rank;
      for (Slot& sl : g.slots)
        if (sl.per_rank) {
          const size_t l = sl.per_rank * static_cast<size_t>(rank_);
          fill(sl.shard,
               [&](char* dst) { copy_overlap(dst, l, l + sl.per_rank, 0, sl.bytes, read(sl)); });
        }
      if (g.total)
        fill(g.shard, [&](char* dst) {
          size_t off = 0;  // of a small slot in the group's packed stream
          for (const Slot& sl : g.slots)
            if (sl.packed()) {
              copy_overlap(dst, lo, hi, off, sl.bytes, read(sl));
              off += sl.bytes;
            }
        });
      if (head_from_file) {
        g.slots.push_back({&model.output.data, size_t(model.output.numel()) * 4});
        shard_rows(g.slots.back(), source->stored_rows(true), row_chunk_bytes,
                   [&](int64_t r0, int64_t n, char* dst) { source->load_rows(true, r0, n, dst); });
        head_rows_ = &g.slots.back();
      }
    } catch (...) {
      if (source)
        for (const Slot& sl : g.slots) sl.buf->reset();
      throw;
    }
    if (source)
      for (const Slot& sl : g.slots) sl.buf->reset();
  }
  if (!source)
    for (Group& g : groups_)
      for (const Slot& sl : g.slots) sl.buf->reset();
  if (by_rows && !model.output.rows) head_rows_ = emb_rows_;  // tied
}

void Zero3Stream::shard_rows(Slot& sl, const QWeight& fmt, uint64_t chunk_bytes,
                             const std::function<void(int64_t, int64_t, char*)>& read) {
  const uint64_t rb = stored_row_bytes(fmt);
  if (rb == 0)
    throw_error(QLFT_ERR_INTERNAL, "ZeRO-3: a %s matrix cannot be sharded by rows",
                fmt.type_name().c_str());
  sl.rows = RowChunks::of(fmt.rows, rb, world_, chunk_bytes);
  sl.n_rows = fmt.rows;
  sl.rowq.kind = fmt.kind;
  sl.rowq.ggml_type = fmt.ggml_type;
  sl.rowq.rows = sl.rows.chunks * sl.rows.per;
  sl.rowq.cols = fmt.cols;
  sl.rowq.data = make(MemCategory::Weights, sl.rows.shard_bytes(), "ZeRO-3 row shard");
  // Of chunk c this rank keeps rows (c * world + rank) * per + [0, per): one run of rows each.
  const int64_t per = sl.rows.per;
  char* dst = sl.rowq.data.as<char>();
  for (int64_t c = 0; c < sl.rows.chunks; ++c) {
    const int64_t row = (c * world_ + rank_) * per, n = std::min(per, fmt.rows - row);
    if (n > 0) read(row, n, dst + c * per * int64_t(rb));
  }
}

Buffer Zero3Stream::make(MemCategory c, size_t bytes, const char* what) const {
  return device_ ? Buffer(device_, c, bytes, what, BufferInit::Uninit)
                 : Buffer(tracker_, c, bytes, what);
}

Zero3Stream::~Zero3Stream() {
  detach();
}

uint64_t Zero3Stream::shard_bytes() const {
  uint64_t n = 0;
  for (const Group& g : groups_) {
    n += g.shard.size();
    for (const Slot& sl : g.slots) n += sl.shard.size() + sl.rowq.data.size();
  }
  return n;
}

uint64_t Zero3Stream::full_bytes() const {
  uint64_t n = 0;
  for (const Group& g : groups_)
    for (const Slot& sl : g.slots) n += sl.bytes;
  return n;
}

std::string Zero3Stream::describe() const {
  if (detached_) return "ZeRO-3 shards of a trainer that has ended";
  std::string rows;
  if (head_rows_)
    rows = strf("; embedding and head by rows, gathered in %lld chunks",
                static_cast<long long>(head_rows_->rows.chunks));
  return strf("ZeRO-3 shards over %d ranks (%s of %s here%s)", world_,
              format_bytes(shard_bytes()).c_str(), format_bytes(full_bytes()).c_str(),
              rows.c_str());
}

Zero3Stream::Fetch Zero3Stream::start(int u) {
  Fetch f;
  f.unit = u;
  const size_t w = static_cast<size_t>(world_);
  // Every receive Buffer first: an out-of-memory then throws before this rank started any of
  // the unit's gathers, not after some (which would leave the peers waiting in the others).
  for (int gi : groups_of(u)) {
    const Group& g = groups_[static_cast<size_t>(gi)];
    f.packed.emplace_back();
    if (g.total)
      f.packed.back() = make(MemCategory::Communication, g.per_rank * w, "gathered unit");
    f.full.emplace_back();
    for (const Slot& sl : g.slots) {
      f.full.back().emplace_back();
      if (sl.per_rank)
        f.full.back().back() = make(MemCategory::Communication, sl.per_rank * w, "gathered unit");
    }
  }
  const std::vector<int>& gs = groups_of(u);
  for (size_t k = 0; k < gs.size(); ++k) {
    Group& g = groups_[static_cast<size_t>(gs[k])];
    if (g.total)
      f.pending.push_back(
          comm_->start_all_gather_raw(g.shard.data(), f.packed[k].data(), g.per_rank));
    for (size_t i = 0; i < g.slots.size(); ++i) {
      Slot& sl = g.slots[i];
      if (sl.per_rank)
        f.pending.push_back(
            comm_->start_all_gather_raw(sl.shard.data(), f.full[k][i].data(), sl.per_rank));
    }
  }
  ++gathers_;
  return f;
}

void Zero3Stream::finish(Fetch& f) {
  for (auto& p : f.pending) p->wait();
  f.pending.clear();
}

void Zero3Stream::install(Fetch& f) {
  const std::vector<int>& gs = groups_of(f.unit);
  try {
    for (size_t k = 0; k < gs.size(); ++k) {
      Group& g = groups_[static_cast<size_t>(gs[k])];
      size_t off = 0;
      for (size_t i = 0; i < g.slots.size(); ++i) {
        const Slot& sl = g.slots[i];
        if (sl.rows.per) continue;  // never installed
        if (sl.per_rank) {
          // The gathered Buffer itself: sl.bytes of data, then padding nothing reads.
          *sl.buf = std::move(f.full[k][i]);
        } else {
          Buffer b = make(MemCategory::Communication, sl.bytes, "gathered unit");
          b.copy_from(f.packed[k], off, sl.bytes);
          *sl.buf = std::move(b);
          off += sl.bytes;
        }
      }
      f.packed[k].reset();
    }
    installed_ = f.unit;
    if (extra_ && is_layer(f.unit)) extra_->fill(layer_of(f.unit));
  } catch (...) {
    uninstall(f.unit);
    throw;
  }
}

void Zero3Stream::uninstall(int u) noexcept {
  for (int gi : groups_of(u))
    for (const Slot& s : groups_[static_cast<size_t>(gi)].slots) s.buf->reset();
  if (extra_ && is_layer(u)) extra_->drop(layer_of(u));
  if (installed_ == u) installed_ = kNoUnit;
}

void Zero3Stream::drop_ahead() noexcept {
  // Its destructor waits for a gather still in flight (every rank started it, so it completes),
  // unless the communicator is broken.
  ahead_.reset();
}

void Zero3Stream::retire_ahead() {
  if (!ahead_) return;
  std::unique_ptr<Fetch> a = std::move(ahead_);
  finish(*a);  // a timeout or peer failure is reported here, not swallowed
}

void Zero3Stream::acquire(int u, int next) {
  if (detached_)
    throw_error(QLFT_ERR_UNSUPPORTED,
                "base weights were sharded by a ZeRO-3 trainer that has ended; load the model "
                "again");
  check_one_unit_acquire("ZeRO-3", u, unit_groups_.size(), held_);
  try {
    if (installed_ != u || !present(u)) {
      if (installed_ != kNoUnit) uninstall(installed_);
      std::unique_ptr<Fetch> f;
      if (ahead_ && ahead_->unit == u) {
        f = std::move(ahead_);
        ++hits_;
      } else {
        retire_ahead();  // a prefetch the runner did not ask for after all
        f = std::make_unique<Fetch>(start(u));
      }
      finish(*f);
      install(*f);
    }
    held_ = u;
    keep_ = next == u;
    if (prefetch_ && next != kNoUnit && next != u && !(ahead_ && ahead_->unit == next)) {
      QLFT_CHECK_ARG(next >= 0 && next < static_cast<int>(unit_groups_.size()),
                     "ZeRO-3: next unit %d does not exist", next);
      retire_ahead();
      ahead_ = std::make_unique<Fetch>(start(next));
    }
  } catch (...) {
    // The model as before the call: nothing of u installed, no prefetch pending.
    if (installed_ == u) uninstall(u);
    held_ = kNoUnit;
    drop_ahead();
    throw;
  }
}

bool Zero3Stream::present(int u) const {
  for (int gi : groups_of(u))
    for (const Slot& sl : groups_[static_cast<size_t>(gi)].slots)
      if (!sl.rows.per && sl.buf->empty()) return false;
  return true;
}

std::shared_ptr<WeightStream> Zero3Stream::rank_local() {
  if (device_) return nullptr;  // the device backend uses the gathered device Buffers in place
  if (held_ != kNoUnit)
    throw_error(QLFT_ERR_INTERNAL, "ZeRO-3: a rank-local stream asked for while unit %d is held",
                held_);
  if (!local_) local_ = std::make_shared<FileUnitStream>(*model_, tracker_);
  drop_ahead();
  if (installed_ != kNoUnit) uninstall(installed_);
  keep_ = false;
  return local_;
}

void Zero3Stream::release(int u) noexcept {
  if (held_ != u) return;
  held_ = kNoUnit;
  if (!keep_ && installed_ == u) uninstall(u);
}

void Zero3Stream::lookup_rows(const int32_t* tokens, int64_t n, float* out) {
  QLFT_CHECK_ARG(emb_rows_ && comm_, "ZeRO-3: %s has no row-sharded embedding", describe().c_str());
  const Slot& sl = *emb_rows_;
  const int64_t per = sl.rows.per, w = world_, V = sl.n_rows;
  // How many ids each rank looks up, then all of them (each rank's padded to the most).
  std::vector<int64_t> counts(static_cast<size_t>(w));
  comm_->all_gather_raw(&n, counts.data(), sizeof(int64_t));
  const int64_t most = *std::max_element(counts.begin(), counts.end());
  if (most == 0) return;
  Buffer ids = make(MemCategory::Communication, size_t(w * most) * 4, "embedding lookup ids");
  {
    std::vector<int32_t> mine(static_cast<size_t>(most), 0);
    std::copy(tokens, tokens + n, mine.begin());
    comm_->all_gather_raw(mine.data(), ids.data(), size_t(most) * 4);
  }
  // Every rank checks every rank's ids, so a bad one fails all of them alike.
  const int32_t* all = ids.as<int32_t>();
  for (int64_t q = 0; q < w; ++q)
    for (int64_t i = 0; i < counts[size_t(q)]; ++i) {
      const int32_t t = all[q * most + i];
      if (t < 0 || t >= V)
        throw_error(QLFT_ERR_INVALID_ARGUMENT,
                    "token id %d at position %lld of rank %lld is outside the vocabulary of %lld "
                    "tokens",
                    t, static_cast<long long>(i), static_cast<long long>(q),
                    static_cast<long long>(V));
    }
  // For each asking rank q in turn: the rows of q's ids this rank keeps (dequantized to f32),
  // zero elsewhere, summed onto q (one buffer of q's rows, not one of every rank's).
  const int64_t D = sl.rowq.cols;
  Buffer part = make(MemCategory::Communication, size_t(most * D) * 4, "embedding lookup rows");
  float* dst = part.as<float>();
  for (int64_t q = 0; q < w; ++q) {
    const int64_t m = counts[size_t(q)];
    if (m == 0) continue;
    for (int64_t i = 0; i < m; ++i) {
      const int64_t t = all[q * most + i], c = t / (w * per), in = t % (w * per);
      if (in / per == rank_)
        sl.rowq.dequantize_rows(c * per + in % per, 1, dst + i * D);
      else
        std::fill(dst + i * D, dst + (i + 1) * D, 0.0f);
    }
    comm_->reduce(dst, size_t(m * D), static_cast<int>(q), ReduceOp::Sum);
    if (q == rank_) std::memcpy(out, dst, size_t(n * D) * 4);
  }
}

void Zero3Stream::each_head_slice(const std::function<void(const QWeight&, int64_t)>& f) {
  QLFT_CHECK_ARG(head_rows_ && comm_, "ZeRO-3: %s has no row-sharded head", describe().c_str());
  const Slot& sl = *head_rows_;
  const RowChunks& rc = sl.rows;
  const size_t part = size_t(rc.per) * rc.row_bytes;  // one rank's share of a chunk
  struct Chunk {
    Buffer rows;
    std::unique_ptr<PendingCollective> pending;
  };
  auto start_chunk = [&](int64_t c) {
    Chunk k;
    k.rows = make(MemCategory::Communication, rc.gathered_bytes(world_), "gathered head rows");
    k.pending = comm_->start_all_gather_raw(sl.rowq.data.as<const char>() + size_t(c) * part,
                                            k.rows.data(), part);
    return k;
  };
  const int64_t span = int64_t(world_) * rc.per;  // rows of a chunk
  Chunk cur = start_chunk(0);
  for (int64_t c = 0; c < rc.chunks; ++c) {
    Chunk next;
    if (c + 1 < rc.chunks) next = start_chunk(c + 1);  // in flight while this one is used
    cur.pending->wait();
    cur.pending.reset();
    QWeight slice;
    slice.kind = sl.rowq.kind;
    slice.ggml_type = sl.rowq.ggml_type;
    slice.rows = std::min(span, sl.n_rows - c * span);
    slice.cols = sl.rowq.cols;
    slice.data = std::move(cur.rows);
    f(slice, c * span);
    cur = std::move(next);
  }
}

void Zero3Stream::replay_training_pass(const std::function<void(int)>& backward_layer,
                                       int head_walks) {
  // LlamaRunner::run_forward (training) then backward: the same acquires with the same hints.
  const int L = static_cast<int>(unit_groups_.size()) - 2;
  auto use = [this](int u, int next) {
    acquire(u, next);
    release(u);
  };
  {
    UnitUse emb(this, kEmbeddingUnit, layer_unit(0));
    if (rows_sharded()) lookup_rows(nullptr, 0, nullptr);  // no ids of its own
  }
  for (int l = 0; l < L; ++l) use(layer_unit(l), l + 1 < L ? layer_unit(l + 1) : head_unit(L));
  {
    UnitUse head(this, head_unit(L), head_unit(L));
    if (rows_sharded())  // the cross-entropy's walks (model/llama.cpp)
      for (int walk = 0; walk < head_walks; ++walk) each_head_slice([](const QWeight&, int64_t) {});
  }
  use(head_unit(L), layer_unit(L - 1));
  for (int l = L - 1; l >= 0; --l) {
    acquire(layer_unit(l), l > 0 ? layer_unit(l - 1) : kNoUnit);
    try {
      if (backward_layer) backward_layer(l);
    } catch (...) {
      release(layer_unit(l));
      throw;
    }
    release(layer_unit(l));
  }
}

void Zero3Stream::detach() noexcept {
  if (detached_) return;
  drop_ahead();
  if (installed_ != kNoUnit) uninstall(installed_);
  held_ = kNoUnit;
  for (Group& g : groups_) {
    g.shard.reset();
    for (Slot& sl : g.slots) {
      sl.shard.reset();
      sl.rowq.data.reset();
    }
  }
  comm_ = nullptr;
  detached_ = true;
}

}  // namespace qlft::dist
