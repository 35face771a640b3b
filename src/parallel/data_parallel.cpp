#include "parallel/data_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/log.h"
#include "parallel/zero2_grads.h"
#include "parallel/zero3_lora.h"
#include "parallel/zero3_stream.h"

namespace qlft::dist {

DataParallel::DataParallel(std::unique_ptr<Communicator> comm, int zero_stage,
                           std::vector<ParamRef> params, MemoryTracker* tracker,
                           bool host_gradient_shards, uint64_t bucket_bytes)
    : comm_(std::move(comm)),
      host_(&comm_->host()),
      stage_(zero_stage),
      params_(std::move(params)),
      shard_grads_(host_gradient_shards && zero_stage >= 2 && comm_->world() > 1) {
  // Stage 3 treats the LoRA tensors as stage 2 does; its base-weight sharding is Zero3Stream.
  QLFT_CHECK_ARG(stage_ >= 0 && stage_ <= 3, "dist.zero_stage %d: stages are 0 to 3", stage_);
  const int w = comm_->world();
  size_t total = 0;
  uint64_t layout = 1469598103934665603ull;  // FNV-1a over names and sizes: ranks must agree
  for (const ParamRef& p : params_) {
    total += p.numel;
    for (char ch : p.name + "#" + std::to_string(p.numel))
      layout = (layout ^ uint8_t(ch)) * 1099511628211ull;
  }
  comm_->check_same(layout, "the trainable tensors (model, lora.* settings)");

  // Contiguous runs balanced by elements: tensor i goes to the rank whose share holds its start.
  owner_.resize(params_.size());
  offset_.resize(params_.size());
  std::vector<size_t> fill(static_cast<size_t>(w), 0);
  size_t start = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    int o = total ? static_cast<int>((static_cast<unsigned __int128>(start) * w) / total) : 0;
    if (o >= w) o = w - 1;
    owner_[i] = o;
    offset_[i] = fill[o];
    fill[o] += params_[i].numel;
    start += params_[i].numel;
  }
  for (int r = 0; r < w; ++r) {
    if (fill[r] == 0 && stage_ > 0)
      throw_error(QLFT_ERR_INVALID_ARGUMENT,
                  "dist.zero_stage %d over %d ranks: rank %d would own no LoRA tensor (%zu "
                  "tensors); use fewer ranks or stage 0",
                  stage_, w, r, params_.size());
    segment_ = std::max(segment_, fill[r]);
  }
  fill_ = fill;
  // The last segment receives this rank's reduce-scattered gradients (stages 2-3), unless they
  // are sharded during backward; the others hold every rank's share (all-gathers).
  chunk_ = exchange_chunk_floats(segment_, bucket_bytes);
  if (w > 1)
    flat_ = Buffer(tracker, MemCategory::Communication,
                   host_exchange_bytes(w, segment_, shard_grads_, bucket_bytes),
                   "gradient/parameter exchange buffer");
}

size_t exchange_chunk_floats(size_t segment, uint64_t bucket_bytes) {
  return std::min<size_t>(segment, std::max<uint64_t>(1, bucket_bytes / sizeof(float)));
}

uint64_t host_exchange_bytes(int world, size_t segment, bool shard_grads, uint64_t bucket_bytes) {
  if (world <= 1) return 0;
  return (uint64_t(world) + (shard_grads ? 0 : 1)) * exchange_chunk_floats(segment, bucket_bytes) *
         sizeof(float);
}

DataParallel::~DataParallel() {
  // Before the communicator goes: the model keeps the stream, which must not reach it.
  if (zero3_) {
    zero3_->detach();
    zero3_->set_layer_extra(nullptr);
  }
}

void DataParallel::set_adapter_shards(std::unique_ptr<Zero3Lora> a) {
  QLFT_CHECK_ARG(zero3_ && shard_grads_ && !dev_,
                 "a sharded adapter needs ZeRO-3 with gradients sharded on a host backend");
  lora_ = std::move(a);
  zero3_->set_layer_extra(lora_.get());
  for (size_t i = 0; i < params_.size(); ++i)
    if (owner_[i] != rank()) params_[i].data = nullptr;
  flat_.reset();
}

void DataParallel::set_zero3_stream(std::shared_ptr<Zero3Stream> s) {
  zero3_ = std::move(s);
}

void DataParallel::set_grad_shards(std::unique_ptr<Zero2Grads> g) {
  QLFT_CHECK_ARG(shard_grads_ == (g != nullptr),
                 "ZeRO gradient shards must be announced when the partition is made");
  grads_ = std::move(g);
}

int DataParallel::missing_passes(int passes) {
  if ((!zero3_ && !grads_) || world() == 1) return 0;
  std::vector<double> n(static_cast<size_t>(world()), 0.0);
  n[static_cast<size_t>(rank())] = passes;
  host_->all_reduce(n.data(), n.size(), ReduceOp::Sum);
  return static_cast<int>(*std::max_element(n.begin(), n.end())) - passes;
}

void DataParallel::replay_passes(int n, int head_walks) {
  // In the runner's order: each layer's gradient exchanges while its weights are held.
  for (int i = 0; i < n; ++i) {
    if (zero3_) {
      zero3_->replay_training_pass(
          [this](int layer) {
            if (grads_) grads_->replay_layer(layer);
          },
          head_walks);
    } else if (grads_) {
      grads_->replay_pass();
    }
  }
}

std::vector<ParamRef> DataParallel::owned_params() const {
  if (stage_ == 0) return params_;
  std::vector<ParamRef> out;
  for (size_t i = 0; i < params_.size(); ++i)
    if (owner_[i] == rank()) out.push_back(params_[i]);
  return out;
}

bool DataParallel::any(bool flag) {
  if (world() == 1) return flag;
  double v = flag ? 1.0 : 0.0;
  host_->all_reduce(&v, 1, ReduceOp::Sum);
  return v > 0;
}

bool DataParallel::begin_collective(Collective what, bool flag) {
  if (world() == 1) return flag;
  // One all-reduce: the flag, and a count per kind of call, so that ranks in different calls
  // learn it here, all of them alike, before any of the call's own collectives mismatch.
  double v[3] = {flag ? 1.0 : 0.0, what == Collective::Step ? 1.0 : 0.0,
                 what == Collective::Evaluate ? 1.0 : 0.0};
  host_->all_reduce(v, 3, ReduceOp::Sum);
  if (v[1] > 0 && v[2] > 0)
    throw_error(QLFT_ERR_INVALID_ARGUMENT,
                "%d of %d ranks evaluate while the others train a step: with the LoRA tensors "
                "sharded (dist.zero3_shard_adapter) evaluation gathers them, so every rank must "
                "call it at the same point",
                static_cast<int>(v[2]), world());
  return v[0] > 0;
}

template <class F>
void DataParallel::each_in_chunk(size_t lo, size_t n, F&& f) const {
  // params()[i] holds elements [offset_i, offset_i + numel) of its owner's segment.
  for (size_t i = 0; i < params_.size(); ++i) {
    const size_t a = std::max(offset_[i], lo), b = std::min(offset_[i] + params_[i].numel, lo + n);
    if (a < b) f(i, a - offset_[i], a - lo, b - a);
  }
}

template <class F>
void DataParallel::each_bucket(F&& f) const {
  // Bucket by bucket of every segment: the exchange buffer holds one bucket of each rank's.
  for (size_t lo = 0; lo < segment_; lo += chunk_) f(lo, std::min(chunk_, segment_ - lo));
}

void DataParallel::pack(bool grads, size_t lo, size_t n) {
  float* f = flat_.as<float>();
  each_in_chunk(lo, n, [&](size_t i, size_t from, size_t at, size_t len) {
    if (!grads && owner_[i] != rank()) return;  // parameters: only what this rank updated
    const float* src = grads ? params_[i].grad : params_[i].data;
    std::memcpy(f + owner_[i] * n + at, src + from, len * sizeof(float));
  });
}

void DataParallel::unpack(bool grads, int only_rank, size_t lo, size_t n) {
  const float* f = flat_.as<float>();
  each_in_chunk(lo, n, [&](size_t i, size_t to, size_t at, size_t len) {
    if (only_rank >= 0 && owner_[i] != only_rank) return;
    float* dst = grads ? const_cast<float*>(params_[i].grad) : params_[i].data;
    // A reduce-scatter leaves this rank's block after the world's blocks.
    const float* src = only_rank >= 0 && grads ? f + world() * n + at : f + owner_[i] * n + at;
    std::memcpy(dst + to, src, len * sizeof(float));
  });
}

void DataParallel::reduce_gradients() {
  if (world() == 1 || grads_) return;
  QLFT_CHECK_ARG(!shard_grads_, "ZeRO gradient shards were announced but never set");
  if (dev_) return reduce_device_gradients();
  float* f = flat_.as<float>();
  each_bucket([&](size_t lo, size_t n) {
    pack(true, lo, n);
    if (stage_ < 2) {
      host_->all_reduce(f, static_cast<size_t>(world()) * n, ReduceOp::Sum);
      unpack(true, -1, lo, n);
    } else {
      host_->reduce_scatter(f, f + world() * n, n, ReduceOp::Sum);
      unpack(true, rank(), lo, n);
    }
  });
}

std::vector<GradSpan> DataParallel::grad_spans() const {
  std::vector<GradSpan> g;
  for (size_t i = 0; i < params_.size(); ++i)
    if (stage_ < 2 || owner_[i] == rank())
      g.push_back({const_cast<float*>(params_[i].grad), params_[i].numel});
  return g;
}

ClipResult DataParallel::clip(const std::vector<GradSpan>& grads, double max_norm) {
  // Stages 0-1: every rank holds identical full gradients, so the local clip is the global one
  // (and bit-identical to the 1-rank computation).
  if (stage_ < 2 || world() == 1) return clip_grad_norm(grads, max_norm);
  const double local = global_grad_norm(grads);
  double sq = local * local;
  host_->all_reduce(&sq, 1, ReduceOp::Sum);
  const ClipResult r = clip_rule(std::sqrt(sq), max_norm);
  if (!r.clipped) return r;
  const float cf = static_cast<float>(r.coef);
  for (const GradSpan& g : grads)
    for (size_t i = 0; i < g.n; ++i) g.data[i] *= cf;
  return r;
}

void DataParallel::gather_params() {
  if (stage_ == 0 || world() == 1 || lora_) return;
  if (dev_) return gather_device_params();
  float* f = flat_.as<float>();
  each_bucket([&](size_t lo, size_t n) {
    pack(false, lo, n);
    host_->all_gather(f + rank() * n, f, n);
    for (int r = 0; r < world(); ++r)
      if (r != rank()) unpack(false, r, lo, n);
  });
}

std::vector<StateEntry> DataParallel::state_catalog(const StateDict& mine) {
  std::vector<StateEntry> all;
  for (int r = 0; r < world(); ++r) {
    std::string meta = r == rank() ? serialize_state(mine, /*with_bytes=*/false) : std::string();
    uint64_t n = meta.size();
    if (world() > 1) {
      host_->broadcast(&n, sizeof n, r);
      meta.resize(static_cast<size_t>(n));
      if (n) host_->broadcast(meta.data(), meta.size(), r);
    }
    each_state_entry(meta, false,
                     [&](const std::string& name, DType dt, std::vector<int64_t> shape, const char*,
                         uint64_t nb) {
                       all.push_back({name, dt, std::move(shape), nb, r});
                     });
  }
  // Entries every rank holds (the step count) are written from the lowest rank's.
  std::stable_sort(all.begin(), all.end(),
                   [](const StateEntry& a, const StateEntry& b) { return a.name < b.name; });
  all.erase(std::unique(all.begin(), all.end(),
                        [](const StateEntry& a, const StateEntry& b) { return a.name == b.name; }),
            all.end());
  return all;
}

const void* DataParallel::fetch_state_entry(const StateEntry& e, const StateDict& mine,
                                            std::vector<uint8_t>* scratch) {
  const void* own = nullptr;
  if (e.owner == rank()) {
    auto it = mine.tensors().find(e.name);
    QLFT_CHECK_ARG(it != mine.tensors().end() && it->second.bytes.size() == e.nbytes,
                   "optimizer state entry '%s' changed after its catalog", e.name.c_str());
    own = it->second.bytes.data();
  }
  if (e.owner == 0 || world() == 1) return own;  // rank 0 reads its own; no one else needs it
  // Flow control: the owner sends once rank 0 asks (a byte broadcast from rank 0), so it never
  // runs ahead of the writer. Without it, over TCP, a rank's small entries (under the eager
  // limit) piled up at rank 0 as unexpected messages: 30 MiB there for SmolLM2 at 2 ranks.
  uint8_t ask = 1;
  host_->broadcast(&ask, 1, 0);
  // Read, not written, on the owner: the broadcast's source.
  void* at =
      own ? const_cast<void*>(own)
          : (scratch->resize(static_cast<size_t>(e.nbytes)), static_cast<void*>(scratch->data()));
  if (e.nbytes) host_->broadcast(at, static_cast<size_t>(e.nbytes), e.owner);
  return rank() == 0 || own ? at : nullptr;
}

// ---- state dict bytes: count, then per entry name, dtype, shape, bytes (little-endian) -------

namespace {
template <class T>
void put_raw(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof v);
}
struct Reader {
  const std::string& s;
  size_t pos = 0;
  template <class T>
  T get() {
    QLFT_CHECK_FORMAT(s.size() - pos >= sizeof(T), "state exchange: truncated at byte %zu", pos);
    T v;
    std::memcpy(&v, s.data() + pos, sizeof v);
    pos += sizeof v;
    return v;
  }
  const char* take(uint64_t n) {
    QLFT_CHECK_FORMAT(s.size() - pos >= n, "state exchange: truncated at byte %zu", pos);
    const char* p = s.data() + pos;
    pos += n;
    return p;
  }
};
}  // namespace

std::string serialize_state(const StateDict& sd, bool with_bytes) {
  std::string s;
  put_raw<uint64_t>(s, sd.size());
  for (const auto& [name, t] : sd.tensors()) {
    put_raw<uint32_t>(s, static_cast<uint32_t>(name.size()));
    s += name;
    put_raw<int32_t>(s, static_cast<int32_t>(t.dtype));
    put_raw<uint32_t>(s, static_cast<uint32_t>(t.shape.size()));
    for (int64_t d : t.shape) put_raw<int64_t>(s, d);
    put_raw<uint64_t>(s, t.bytes.size());
    if (with_bytes) s.append(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
  }
  return s;
}

void each_state_entry(const std::string& bytes, bool with_bytes,
                      const std::function<void(const std::string&, DType, std::vector<int64_t>,
                                               const char*, uint64_t)>& f) {
  Reader r{bytes};
  const uint64_t n = r.get<uint64_t>();
  for (uint64_t i = 0; i < n; ++i) {
    const uint32_t len = r.get<uint32_t>();
    std::string name(r.take(len), len);
    const int32_t dt = r.get<int32_t>();
    const uint32_t nd = r.get<uint32_t>();
    QLFT_CHECK_FORMAT(nd <= 8, "state exchange: %s has %u dimensions", name.c_str(), nd);
    std::vector<int64_t> shape(nd);
    for (auto& d : shape) d = r.get<int64_t>();
    const uint64_t nb = r.get<uint64_t>();
    const char* data = with_bytes ? r.take(nb) : nullptr;
    try {
      f(name, static_cast<DType>(dt), std::move(shape), data, nb);
    } catch (const Error& e) {
      throw_error(QLFT_ERR_FORMAT, "state exchange: %s", e.what());
    }
  }
}

void deserialize_state(const std::string& bytes, StateDict& out) {
  each_state_entry(
      bytes, true,
      [&](const std::string& name, DType dt, std::vector<int64_t> shape, const char* data,
          uint64_t nb) { out.put(name, dt, std::move(shape), data, static_cast<size_t>(nb)); });
}

}  // namespace qlft::dist
