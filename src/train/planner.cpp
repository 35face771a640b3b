#include "train/planner.h"

#include <algorithm>
#include <cstring>

#include "backend/backend_select.h"
#include "core/communicator.h"
#include "parallel/data_parallel.h"
#include "parallel/zero3_lora.h"
#include "parallel/zero3_stream.h"
#include "core/error.h"
#include "core/threads.h"
#include "model/llama.h"
#include "model/weight_stream.h"
#include "optim/adamw8bit.h"
#include "train/adapter_io.h"
#include "train/planner_offload.h"
#include "train/preference.h"

namespace qlft {

namespace {

constexpr auto rb = buffer_bytes;
constexpr auto fl = float_buffer_bytes;

// 8-bit AdamW's state of one tensor, each of its arrays counted as cnt(bytes) (its store's
// rounding).
template <class Count>
uint64_t optimizer_bytes_with(uint64_t numel, Count cnt) {
  if (!adam8bit_quantized(static_cast<int64_t>(numel))) return 2 * cnt(numel * 4);
  const uint64_t blocks = static_cast<uint64_t>(adam8bit_blocks(static_cast<int64_t>(numel)));
  return 2 * cnt(numel) + 2 * cnt(blocks * 4);
}

uint64_t optimizer_bytes(OptimizerKind kind, uint64_t numel) {
  if (kind == OptimizerKind::AdamW) return 2 * fl(int64_t(numel));
  const bool paged = kind == OptimizerKind::PagedAdamW8bit;
  // The paged store counts exact bytes; the host store rounds like Buffer.
  return optimizer_bytes_with(numel, [&](uint64_t b) { return paged ? b : rb(b); });
}

}  // namespace

PlanSettings PlanSettings::from_spec(const RunSpec& r) {
  PlanSettings s;
  s.precision = r.backend.precision;
  s.checkpoint_every = r.train.grad_checkpointing;
  s.mlp_tile_rows = r.train.mlp_tile_rows;
  s.offload_checkpoints = r.train.offload_checkpoints;
  s.offload_checkpoints_auto = r.train.offload_checkpoints_auto;
  s.seq_len = r.data.seq_len;
  s.micro_batch = r.train.micro_batch.n;  // auto: 1
  s.rows_per_example = is_paired(r.pref.objective) ? 2 : 1;
  s.reference_pass = needs_reference(r.pref.objective);
  s.per_sequence_loss = r.pref.objective != Objective::Sft;
  s.accumulation = r.train.accumulation;
  s.optimizer = r.optim.kind;
  s.lora = lora_config_from(r.lora);
  if (!r.lora.init_from.empty()) s.lora = read_peft_config(r.lora.init_from);
  s.threads = r.backend.threads;
  s.backend = r.backend.kind;
  s.zero_stage = r.dist.zero_stage;
  s.row_chunk_bytes = r.dist.row_chunk_bytes;
  s.bucket_bytes = r.dist.bucket_bytes;
  s.shard_adapter = r.dist.shard_adapter;
  s.zero3_prefetch = r.dist.prefetch;
  s.world = r.dist.backend == DistBackend::None ? 1 : dist::detect_launch().world;
  s.dist_backend = r.dist.backend;
  s.offload_optimizer = r.offload.optimizer;
  s.offload_params = r.offload.params;
  s.offload_buffers = r.offload.buffers;
  return s;
}

std::vector<int> plan_lora_owners(const std::vector<uint64_t>& numel, int world) {
  // dist::DataParallel's rule: tensor i goes to the rank whose equal share of the elements
  // holds its first element.
  world = std::max(world, 1);
  uint64_t total = 0;
  for (uint64_t n : numel) total += n;
  std::vector<int> owner(numel.size(), 0);
  uint64_t start = 0;
  for (size_t i = 0; i < numel.size(); ++i) {
    int o = total ? static_cast<int>((static_cast<unsigned __int128>(start) * world) / total) : 0;
    owner[i] = std::min(o, world - 1);
    start += numel[i];
  }
  return owner;
}

namespace {

// The trainer's LoRA tensors in its order (layer-major, targeted projections, A then B).
std::vector<uint64_t> lora_numels(const ModelConfig& c, const LoraConfig& lc) {
  const ModelShapes sh = model_shapes(c);
  std::vector<uint64_t> n;
  for (int l = 0; l < c.n_layers; ++l)
    for (int q = 0; q < kProjCount; ++q) {
      if (!lora_adapts(sh, lc, l, static_cast<Proj>(q))) continue;  // (MoE: below)
      const ProjShape& ps = sh.proj(l, static_cast<Proj>(q));
      n.push_back(uint64_t(lc.r) * uint64_t(ps.in));
      n.push_back(uint64_t(ps.out) * uint64_t(lc.r));
    }
  for (int l = 0; l < c.n_layers; ++l)  // the MoE layers' expert / router LoRA, A then B
    for (int p = 0; p < kMoePartCount; ++p)
      if (const MoeLoraSlot m = moe_lora_shape(sh, lc, l, MoePart(p)); m.active()) {
        n.push_back(uint64_t(m.a_n()));
        n.push_back(uint64_t(m.b_n()));
      }
  return n;
}

// ZeRO-2/3 on several ranks of a host backend: each rank keeps only its own tensors' gradients
// (dist/zero2_grads.h; Trainer::init_grads). Device backends keep them whole.
bool sharded_gradients(const PlanSettings& s) {
  return s.world > 1 && s.zero_stage >= 2 && s.backend != BackendKind::Cuda;
}

// dist.zero3_shard_adapter as the trainer applies it (Trainer::shard_adapter).
bool shard_adapter(const PlanSettings& s) {
  return s.shard_adapter && s.zero_stage == 3 && sharded_gradients(s);
}

// Optimizer bytes of each rank, and the exchange buffer's floats per rank segment.
std::vector<uint64_t> optimizer_by_rank(const ModelConfig& c, const PlanSettings& s,
                                        size_t* segment) {
  const int W = std::max(s.world, 1);
  const std::vector<uint64_t> numel = lora_numels(c, s.lora);
  const std::vector<int> owner = plan_lora_owners(numel, W);
  std::vector<uint64_t> fill(static_cast<size_t>(W), 0);
  std::vector<std::vector<uint64_t>> state(static_cast<size_t>(W));
  for (size_t i = 0; i < numel.size(); ++i) {
    // The NVMe store rounds every array like host memory (also for paged_adamw8bit).
    const bool nvme = s.offload_optimizer == OffloadTarget::Nvme;
    const uint64_t b = optimizer_bytes(nvme && s.optimizer == OptimizerKind::PagedAdamW8bit
                                           ? OptimizerKind::AdamW8bit
                                           : s.optimizer,
                                       numel[i]);
    fill[static_cast<size_t>(owner[i])] += numel[i];
    if (s.zero_stage == 0) {
      for (auto& v : state) v.push_back(b);
    } else {
      state[static_cast<size_t>(owner[i])].push_back(b);
    }
  }
  *segment = 0;
  for (int r = 0; r < W; ++r) {
    if (fill[static_cast<size_t>(r)] == 0 && s.zero_stage > 0)
      throw_error(QLFT_ERR_INVALID_ARGUMENT,
                  "dist.zero_stage %d over %d ranks: rank %d would own no LoRA tensor (%zu "
                  "tensors); use fewer ranks or stage 0",
                  s.zero_stage, W, r, numel.size());
    *segment = std::max<size_t>(*segment, fill[static_cast<size_t>(r)]);
  }
  std::vector<uint64_t> out(static_cast<size_t>(W), 0);
  for (int r = 0; r < W; ++r) {
    std::vector<uint64_t>& v = state[static_cast<size_t>(r)];
    if (s.offload_optimizer == OffloadTarget::Nvme) {
      // In a file but for 1 + offload.buffers slots as large as the largest tensor's state.
      const uint64_t largest = v.empty() ? 0 : *std::max_element(v.begin(), v.end());
      out[static_cast<size_t>(r)] = uint64_t(1 + std::max(s.offload_buffers, 1)) * largest;
      continue;
    }
    for (uint64_t b : v) out[static_cast<size_t>(r)] += b;
  }
  return out;
}

// The runner's unit order (model/weight_stream.h): (unit, next) of each acquire of a training
// forward and backward.
std::vector<std::pair<int, int>> training_unit_order(int L) {
  std::vector<std::pair<int, int>> o;
  o.push_back({kEmbeddingUnit, layer_unit(0)});
  for (int l = 0; l < L; ++l)
    o.push_back({layer_unit(l), l + 1 < L ? layer_unit(l + 1) : head_unit(L)});
  o.push_back({head_unit(L), head_unit(L)});
  o.push_back({head_unit(L), layer_unit(L - 1)});
  for (int l = L - 1; l >= 0; --l)
    o.push_back({layer_unit(l), l > 0 ? layer_unit(l - 1) : kNoUnit});
  return o;
}

std::vector<size_t> unit_groups(const WeightFootprint& w, int u) {
  const int L = static_cast<int>(w.groups.size()) - 2;
  if (u == head_unit(L) && w.tied) return {static_cast<size_t>(L) + 1, 0};
  return {static_cast<size_t>(u)};
}

uint64_t slots_bytes(const std::vector<uint64_t>& g) {
  uint64_t n = 0;
  for (uint64_t b : g) n += rb(b);
  return n;
}

// How ZeRO-3 (dist/zero3_stream.h) keeps the footprint's buffers on one of `world` ranks:
// a buffer of 64 KiB or more sliced on its own (ceil(bytes / world) rounded up to 64 per rank)
// and gathered straight into the buffer the model gets back (world x slice bytes); the smaller
// ones of a group packed into one slice, gathered into one buffer and copied out into buffers of
// their own sizes; with row sharding (row_chunk > 0: host ranks computing on the host) the f32
// embedding and untied head by rows (RowChunks), never gathered whole.
struct Zero3Layout {
  const WeightFootprint& w;
  int world;
  uint64_t row_chunk;      // 0: no row sharding
  bool from_file = false;  // a deferred load: the embedding's and head's rows as stored
  bool prefetch = true;    // dist.zero3_prefetch: the next unit gathered while one is in use

  static constexpr uint64_t kLargeSlot = 64 << 10;
  uint64_t slice(uint64_t bytes) const {
    const uint64_t share = (bytes + world - 1) / world;
    return (share + 63) / 64 * 64;
  }
  bool rows() const { return row_chunk && w.f32_rows > 0; }
  // The row chunks of the embedding (group 0) or the untied head.
  dist::RowChunks chunks(size_t g) const {
    const uint64_t stored = !from_file ? 0
                            : g == 0   ? w.emb_stored_row_bytes
                                       : w.head_stored_row_bytes;
    return dist::RowChunks::of(w.f32_rows, stored ? stored : w.row_bytes, world, row_chunk);
  }
  // Slot i of group g is the embedding's or the untied head's f32 matrix, kept by rows.
  bool by_rows(size_t g, size_t i) const {
    return rows() && i == (g == 0 ? 0u : 1u) && (g == 0 || (!w.tied && g == w.groups.size() - 1));
  }
  bool large(size_t g, size_t i) const { return !by_rows(g, i) && w.groups[g][i] >= kLargeSlot; }
  bool packed(size_t g, size_t i) const { return !by_rows(g, i) && !large(g, i); }
  // This rank's kept bytes of slot (g, i) (0 for a packed one: see packed_share).
  uint64_t share(size_t g, size_t i) const {
    if (by_rows(g, i)) return rb(chunks(g).shard_bytes());
    return large(g, i) ? rb(slice(w.groups[g][i])) : 0;
  }
  uint64_t packed_bytes(size_t g) const {
    uint64_t n = 0;
    for (size_t i = 0; i < w.groups[g].size(); ++i) n += packed(g, i) ? w.groups[g][i] : 0;
    return n;
  }
};

// A deferred ZeRO-3 load (host shards): the most weight bytes alive, when a group is whole
// beside the shards of the groups before it and its own (or alone, in the load's first pass).
// The embedding and an untied head are never whole: their shapes come from the header, and by
// rows their shards are read straight from the file. Nor is a group whose buffers are all the
// file's bytes (WeightFootprint::kept): its header gives the shapes, and the rank's slices are
// read by range.
uint64_t zero3_deferred_load_peak(const Zero3Layout& z) {
  uint64_t shards = 0, peak = 0;
  for (size_t g = 0; g < z.w.groups.size(); ++g) {
    uint64_t full = 0, mine = 0;
    bool ranged = true;
    for (size_t i = 0; i < z.w.groups[g].size(); ++i) {
      if (!z.by_rows(g, i)) {
        full += rb(z.w.groups[g][i]);
        ranged = ranged && z.w.kept_as_stored(g, i);
      }
      mine += z.share(g, i);
    }
    if (ranged) full = 0;
    if (const uint64_t small = z.packed_bytes(g)) mine += rb(z.slice(small));
    peak = std::max(peak, shards + full + mine);
    shards += mine;
  }
  return peak;
}

// ZeRO-3: this rank's shards (weights) and the most gathered bytes alive at once
// (communication) in a training pass of `rows` token rows.
// held(n): the bytes the memory holding the buffers counts for a Buffer of n bytes (the host's
// 64-byte rounding, or a device allocator's size classes on top of it: ZeRO-3 over NCCL).
template <class Held>
void zero3_bytes(const Zero3Layout& z, const ModelConfig& c, int64_t rows, const Held& held,
                 uint64_t* shards, uint64_t* gathered) {
  const WeightFootprint& w = z.w;
  const size_t G = w.groups.size();
  // packed: the small slots' gather buffer; large: the large slots' gathered buffers; copies:
  // the small slots' own buffers once installed.
  std::vector<uint64_t> packed(G), large(G), copies(G);
  *shards = 0;
  for (size_t g = 0; g < G; ++g) {
    for (size_t i = 0; i < w.groups[g].size(); ++i) {
      const uint64_t b = w.groups[g][i];
      if (z.by_rows(g, i)) {
        *shards += held(z.chunks(g).shard_bytes());
      } else if (z.large(g, i)) {
        *shards += held(z.slice(b));
        large[g] += held(z.slice(b) * z.world);
      } else {
        copies[g] += held(b);
      }
    }
    const uint64_t small = z.packed_bytes(g);
    if (small) *shards += held(z.slice(small));
    packed[g] = small ? held(z.slice(small) * z.world) : 0;
  }
  auto fetched = [&](size_t g) { return packed[g] + large[g]; };
  auto installed = [&](size_t g) { return large[g] + copies[g]; };
  const int L = static_cast<int>(G) - 2;
  // Row sharding: the lookup's buffers inside the embedding unit, and the head's chunks (the
  // one in use and the next in flight) inside the head unit's first acquire.
  uint64_t lookup = 0, head_chunks = 0;
  if (z.rows()) {
    const dist::RowChunks rc = z.chunks(w.tied ? 0 : G - 1);
    lookup = dist::row_lookup_bytes(rows, c.dim, z.world);
    head_chunks = held(rc.gathered_bytes(z.world)) * uint64_t(std::min<int64_t>(rc.chunks, 2));
  }
  *gathered = 0;
  int current = kNoUnit;
  for (auto [u, next] : training_unit_order(L)) {
    const std::vector<size_t> gs = unit_groups(w, u);
    uint64_t in_use = 0;
    for (size_t g : gs) in_use += installed(g);
    if (u != current) {
      // Installing group k: the earlier groups installed, k's copies beside its packed buffer,
      // the later groups still as fetched.
      for (size_t k = 0; k < gs.size(); ++k) {
        uint64_t b = packed[gs[k]];
        for (size_t j = 0; j < gs.size(); ++j) b += j <= k ? installed(gs[j]) : fetched(gs[j]);
        *gathered = std::max(*gathered, b);
      }
      current = u;
    }
    uint64_t ahead = 0;
    if (z.prefetch && next != kNoUnit && next != u)
      for (size_t g : unit_groups(w, next)) ahead += fetched(g);
    if (u == kEmbeddingUnit) ahead += lookup;
    if (u == head_unit(L) && next == u) ahead += head_chunks;
    *gathered = std::max(*gathered, in_use + ahead);
  }
}

// offload.params=nvme: the most unit storage resident at once. The stream keeps the unit in use
// and reads ahead only the runner's hint (others it read ahead are dropped as stale), so that is
// the unit and the next one of each acquire (one unit without read-ahead); a buffer two units
// share (tied embeddings) is counted once.
uint64_t nvme_resident_bytes(const WeightFootprint& w, int read_ahead) {
  const int L = static_cast<int>(w.groups.size()) - 2;
  uint64_t most = 0;
  for (auto [u, next] : training_unit_order(L)) {
    std::vector<bool> in(w.groups.size(), false);
    for (size_t g : unit_groups(w, u)) in[g] = true;
    if (read_ahead > 0 && next != kNoUnit)
      for (size_t g : unit_groups(w, next)) in[g] = true;
    uint64_t b = 0;
    for (size_t g = 0; g < in.size(); ++g)
      if (in[g]) b += slots_bytes(w.groups[g]);
    most = std::max(most, b);
  }
  return most;
}

// offload.params=cpu: the bytes DeviceWeightStream copies in one training pass (a forward and
// backward): a unit is copied when acquired neither installed nor read ahead, and the next one
// is read ahead unless it is the same unit or already ahead; a release frees the unit unless it
// was acquired as its own next. The stream copies each Buffer as stored (unrounded).
uint64_t device_stream_bytes_per_pass(const WeightFootprint& w) {
  const int L = static_cast<int>(w.groups.size()) - 2;
  auto unit_bytes = [&](int u) {
    uint64_t n = 0;
    for (size_t g : unit_groups(w, u))
      for (uint64_t b : w.groups[g]) n += b;
    return n;
  };
  uint64_t bytes = 0;
  int installed = kNoUnit, ahead = kNoUnit;
  for (auto [u, next] : training_unit_order(L)) {
    if (installed != u) {
      if (ahead != u) bytes += unit_bytes(u);
      ahead = kNoUnit;
      installed = u;
    }
    if (next != kNoUnit && next != u && ahead != next) {
      bytes += unit_bytes(next);
      ahead = next;
    }
    if (next != u) installed = kNoUnit;  // the release
  }
  return bytes;
}

// offload.params=cpu: the most device bytes DeviceWeightStream holds at once (the acquired unit
// and the one read ahead; a group two units share counted once).
uint64_t device_stream_resident_bytes(const WeightFootprint& w, const WorkspaceModel& m) {
  const int L = static_cast<int>(w.groups.size()) - 2;
  uint64_t most = 0;
  for (auto [u, next] : training_unit_order(L)) {
    std::vector<bool> in(w.groups.size(), false);
    for (size_t g : unit_groups(w, u)) in[g] = true;
    if (next != kNoUnit)
      for (size_t g : unit_groups(w, next)) in[g] = true;
    uint64_t b = 0;
    for (size_t g = 0; g < in.size(); ++g)
      if (in[g])
        for (uint64_t x : w.groups[g]) b += m.round(x);
    most = std::max(most, b);
  }
  return most;
}

}  // namespace

namespace {

// The LoRA tensors' floats (A and B of every targeted projection of every layer).
uint64_t lora_floats(const ModelConfig& c, const LoraConfig& lc) {
  uint64_t n = 0;
  for (uint64_t x : lora_numels(c, lc)) n += x;
  return n;
}

// backend=cuda: the device blocks that outlive a step (resident weights, the adapter's device
// copy and gradients, the device AdamW state), and the host's share of the optimizer state.
// host_adapter: the host adapter's bytes (its gradients are as large).
// The trainer's device step (trainer.cpp): AdamW on one rank or over NCCL, or (paged) 8-bit
// AdamW on one rank, its state not offloaded.
bool device_optimizer_step(const PlanSettings& s) {
  if (s.offload_optimizer != OffloadTarget::None) return false;
  if (s.optimizer != OptimizerKind::AdamW) return s.world == 1;
  return s.world == 1 || s.dist_backend == DistBackend::Nccl;
}

// segment: DataParallel's per-rank block of the exchange buffers, in floats.
void plan_device_persistent(const ModelConfig& c, const WeightFootprint& w, const PlanSettings& s,
                            const WorkspaceModel& m, uint64_t host_adapter, size_t segment,
                            MemoryPlan* p) {
  auto& d = p->device_train;
  // Every weight the runner reads, uploaded once, and the rope tables (head_dim / 2 floats each;
  // dynamic NTK: up to kRopeDeviceTables, one per sequence length).
  uint64_t weights = m.round(rb(uint64_t(c.head_dim / 2) * 4)) *
                     uint64_t(rope_varies(c.rope) ? kRopeDeviceTables : 1);
  const bool have_groups = w.groups.size() == static_cast<size_t>(c.n_layers) + 2;
  const bool nccl = s.world > 1 && s.dist_backend == DistBackend::Nccl;
  // The host's DataParallel exchange buffer (allocated on every rank of several).
  const uint64_t host_exchange =
      rb(dist::host_exchange_bytes(s.world, segment, false, s.bucket_bytes));
  if (nccl && s.zero_stage == 3 && have_groups) {
    // ZeRO-3 over NCCL (dist/zero3_stream.h): shards and gathered units in device memory, used
    // in place; the host keeps no weights after sharding.
    uint64_t shards = 0, gathered = 0;
    zero3_bytes(
        Zero3Layout{w, s.world, 0, false, s.zero3_prefetch}, c, 0,
        [&m](uint64_t n) { return m.round(rb(n)); }, &shards, &gathered);
    weights += shards;
    d[int(MemCategory::Communication)] += gathered;
    p->train[int(MemCategory::Weights)] = 0;
    p->train[int(MemCategory::Communication)] = host_exchange;
  } else if (s.offload_params == OffloadTarget::Cpu && have_groups) {
    // offload.params=cpu (offload/device_weight_stream.h): the unit in use and the next one
    // read ahead, each storage Buffer a device block as stored; the host keeps every weight.
    weights += device_stream_resident_bytes(w, m);
  } else {
    std::vector<uint64_t> slots = w.device_slots;
    if (is_low_precision(s.precision))  // the embedding and head kept in 16 bits
      for (size_t i : w.device_f32_tables)
        if (i < slots.size()) slots[i] /= 2;
    for (uint64_t b : slots) weights += m.round(b);
  }
  d[int(MemCategory::Weights)] = weights;
  // The runner's device copy of A/B and dA/dB: one flat array each (LlamaRunner::lora_to_device).
  const uint64_t flat = lora_floats(c, s.lora) * 4;
  if (flat == 0 || host_adapter == 0) return;
  d[int(MemCategory::Adapter)] = m.round(rb(flat));
  // bf16: A/B's bf16 copy beside it (LlamaRunner::lora_device_weights16, what the GEMMs read).
  if (s.precision == Precision::BF16) d[int(MemCategory::Adapter)] += m.round(rb(flat / 2));
  d[int(MemCategory::Gradients)] = m.round(rb(flat));
  // The device optimizer step (trainer.cpp): AdamW on one rank or over NCCL, or 8-bit AdamW
  // on one rank, its state not offloaded. AdamW's m and v are device arrays (this rank's
  // tensors); 8-bit AdamW's arrays are device blocks per tensor (device_adamw8bit.cpp), or
  // paged_adamw8bit's managed allocations, counted as device memory at their exact size. The
  // host has none.
  if (device_optimizer_step(s)) {
    uint64_t& host = p->train[int(MemCategory::Optimizer)];
    uint64_t& dev = d[int(MemCategory::Optimizer)];
    if (s.optimizer == OptimizerKind::AdamW) {
      dev = s.world == 1 ? 2 * m.round(rb(flat)) : 2 * m.round(host / 2);
    } else {
      const bool paged = s.optimizer == OptimizerKind::PagedAdamW8bit;
      dev = 0;
      for (uint64_t n : lora_numels(c, s.lora))
        dev += optimizer_bytes_with(n, [&](uint64_t b) { return paged ? b : m.round(rb(b)); });
    }
    host = 0;
    // DataParallel::attach_device: the device exchange buffer of stages 1-3.
    if (nccl && s.zero_stage > 0)
      d[int(MemCategory::Communication)] += m.round(rb((uint64_t(s.world) + 1) * segment * 4));
  }
}

}  // namespace

MemoryPlan plan_memory(const ModelConfig& c, const WeightFootprint& w, const PlanSettings& s) {
  size_t segment = 0;
  const std::vector<uint64_t> opt = optimizer_by_rank(c, s, &segment);
  if (sharded_gradients(s)) {
    // The gradients differ between ranks too (each keeps its own tensors'): the rank with the
    // largest total is the peak.
    MemoryPlan best = plan_memory_of_rank(c, w, s, 0);
    for (int r = 1; r < s.world; ++r) {
      MemoryPlan p = plan_memory_of_rank(c, w, s, r);
      if (p.total_peak > best.total_peak) best = std::move(p);
    }
    return best;
  }
  // Only the optimizer state differs between ranks: the rank with the most is the peak.
  const int r = static_cast<int>(std::max_element(opt.begin(), opt.end()) - opt.begin());
  return plan_memory_of_rank(c, w, s, r);
}

MemoryPlan plan_memory_of_rank(const ModelConfig& c, const WeightFootprint& w,
                               const PlanSettings& s, int rank) {
  QLFT_CHECK_ARG(s.micro_batch > 0 && s.seq_len > 0,
                 "memory plan: micro_batch %d and seq_len %d "
                 "must be positive",
                 s.micro_batch, s.seq_len);
  QLFT_CHECK_ARG(
      s.world >= 1 && rank >= 0 && rank < s.world && s.zero_stage >= 0 && s.zero_stage <= 3,
      "memory plan: rank %d of world %d, zero stage %d", rank, s.world, s.zero_stage);
  const int64_t B = int64_t(s.micro_batch) * s.rows_per_example, T = s.seq_len, R = B * T;
  const LoraConfig& lc = s.lora;

  MemoryPlan p;
  p.world = s.world;
  p.peak_rank = rank;
  auto& cat = p.train;
  const bool have_groups = w.groups.size() == static_cast<size_t>(c.n_layers) + 2;
  cat[int(MemCategory::Weights)] = w.bytes;
  // ZeRO-3 on host ranks (a host backend) keeps the f32 embedding and head by rows.
  // Several ranks load deferred (train/trainer.h load_into_shards).
  const bool deferred = s.world > 1 && s.dist_backend != DistBackend::None;
  const Zero3Layout z3{w, s.world, s.backend == BackendKind::Cuda ? 0 : s.row_chunk_bytes, deferred,
                       s.zero3_prefetch};
  if (have_groups && s.zero_stage == 3) {
    zero3_bytes(z3, c, R, rb, &cat[int(MemCategory::Weights)],
                &cat[int(MemCategory::Communication)]);
  } else if (have_groups && s.offload_params == OffloadTarget::Nvme) {
    cat[int(MemCategory::Weights)] = nvme_resident_bytes(w, s.offload_buffers);
  }

  // LoRA A [r, in], B [out, r] per targeted projection, their gradients (whole on every rank,
  // but this rank's tensors' only with ZeRO-2/3 on a host backend), this rank's optimizer state.
  const ModelShapes sh = model_shapes(c);
  check_lora_targets(sh, lc);  // as the adapter refuses them
  uint64_t adapter = 0;
  for (uint64_t n : lora_numels(c, lc)) adapter += fl(int64_t(n));
  // The most adapted projections of a layer (an MoE layer's gate / up / down adapt its experts,
  // whose LoRA inputs moe_fwd keeps: RunnerFootprint::moe_saved).
  int projs = 0;
  for (int l = 0; l < sh.n_layers; ++l) {
    int n = 0;
    for (int q = 0; q < kProjCount; ++q) n += lora_adapts(sh, lc, l, Proj(q)) ? 1 : 0;
    projs = std::max(projs, n);
  }
  cat[int(MemCategory::Adapter)] = adapter;
  cat[int(MemCategory::Gradients)] = adapter;
  if (sharded_gradients(s)) {
    // dist::Zero2Grads: the gradients of this rank's own tensors, and one reduce bucket as large
    // as the largest projection's A + B (communication).
    const std::vector<uint64_t> numel = lora_numels(c, lc);
    const std::vector<int> owner = plan_lora_owners(numel, s.world);
    uint64_t mine = 0;
    for (size_t i = 0; i < numel.size(); ++i)
      if (owner[i] == rank) mine += fl(int64_t(numel[i]));
    cat[int(MemCategory::Gradients)] = mine;
    if (shard_adapter(s)) {
      // dist::Zero3Lora: this rank's A / B, and one layer's others filled at a time.
      std::vector<uint64_t> bytes;
      for (uint64_t n : numel) bytes.push_back(n * 4);
      cat[int(MemCategory::Adapter)] = mine;
      cat[int(MemCategory::Communication)] += dist::Zero3Lora::fill_peak_bytes(
          bytes, owner, bytes.size() / size_t(c.n_layers), rank, rb);
    }
    uint64_t bucket = 0;
    for (const LayerShapes& ls : sh.layers)
      for (int q = 0; q < kProjCount; ++q)
        if (lc.targets[q])
          bucket =
              std::max<uint64_t>(bucket, uint64_t(lc.r) * uint64_t(ls.proj[q].in + ls.proj[q].out));
    cat[int(MemCategory::Communication)] += bucket ? rb(bucket * 4) : 0;
  }
  size_t segment = 0;
  cat[int(MemCategory::Optimizer)] = optimizer_by_rank(c, s, &segment)[static_cast<size_t>(rank)];
  // The gradient/parameter exchange buffer of dist::DataParallel (no reduce-scatter segment
  // when the gradients are sharded during backward).
  if (!shard_adapter(s))  // (nothing to exchange after the step when owners keep theirs)
    cat[int(MemCategory::Communication)] +=
        rb(dist::host_exchange_bytes(s.world, segment, sharded_gradients(s), s.bucket_bytes));

  // The backend's model of its memory: host (CPU) or device (CUDA) blocks.
  WorkspaceModelSettings wss;
  wss.precision = s.precision;
  wss.threads = s.threads > 0 ? s.threads : num_threads();
  wss.lora_r = lc.r;
  wss.lora_scale = lc.scale();
  wss.dropout = lc.dropout > 0.f;
  const std::unique_ptr<WorkspaceModel> m = make_workspace_model(s.backend, wss);
  p.device = m->device();
  // Where the runner's tensors and the kernels' scratch live.
  auto& act = p.device ? p.device_train : cat;

  int ckpt = 0;
  if (s.checkpoint_every > 0) ckpt = (c.n_layers + s.checkpoint_every - 1) / s.checkpoint_every;
  // The MLP's row tile, as the runner engages it (LlamaRunner::engaged_tile: not with DoRA or a
  // ZeRO-2 gradient sink).
  const int64_t tile =
      lc.use_dora || sharded_gradients(s)
          ? 0
          : mlp_tile_for(sh, mlp_tile_rows_of(sh, s.mlp_tile_rows), R, ckpt == c.n_layers);
  // Activations: the runner's own sizes.
  const RunnerFootprint f =
      LlamaRunner::footprint(sh, lc.r, projs, R, true, /*doc_ids=*/true,
                             activation_dtype(s.precision), m->round_fn(), tile, &lc);
  const int stored = c.n_layers - ckpt;
  act[int(MemCategory::Activations)] = f.activations(stored, ckpt);
  if (s.offload_checkpoints && ckpt > 0) {  // slots on the runner's side, copies on the host
    const CheckpointOffloadRows o =
        plan_checkpoint_offload(sh, R, ckpt, activation_dtype(s.precision), m->round_fn());
    act[int(MemCategory::Activations)] += uint64_t(o.runner_delta);  // (wraps back: a sum)
    cat[int(MemCategory::Activations)] += o.host;
  }
  // The reference pass (an inference forward over the same rows) reuses the step's residual
  // stream and runs its layers in the scratch set, which a step without checkpointed layers
  // (fp32 storage) does not have otherwise.
  if (s.reference_pass && !(ckpt > 0 || (f.scratch_always && stored > 0)))
    act[int(MemCategory::Activations)] += f.layer_acts;

  // Workspace: the largest set alive at once. Forward holds one kernel's scratch at a time; the
  // head's cross-entropy runs at the end of forward; backward adds its temporaries to one
  // kernel's scratch (or to a checkpointed layer's recompute).
  uint64_t fwd = std::max(m->attention_fwd(sh, B, T), m->rope(sh, T));
  uint64_t bwd = std::max(stored > 0 ? m->attention_bwd_stored(sh, B, T) : 0,
                          ckpt > 0 ? m->attention_bwd(sh, B, T) : 0);
  bwd = std::max(bwd, m->rope(sh, T));
  for (int i = 0; i < sh.n_layers * kProjCount; ++i) {
    const int q = i % kProjCount;
    const ProjShape& ps = sh.proj(i / kProjCount, static_cast<Proj>(q));
    // q/k/v share their input, gate/up theirs (LlamaRunner's SharedInput scopes).
    const Proj p = static_cast<Proj>(q);
    const bool shared =
        p == Proj::Q || p == Proj::K || p == Proj::V || p == Proj::Gate || p == Proj::Up;
    // The MLP's projections run over one tile's rows when tiled.
    const int64_t rows = tile && (p == Proj::Gate || p == Proj::Up || p == Proj::Down) ? tile : R;
    fwd = std::max(fwd, m->linear_fwd(ps.out, ps.in, rows, lc.targets[q], shared));
    bwd = std::max(bwd, m->linear_bwd(ps.out, ps.in, rows, lc.targets[q], shared));
  }
  // The backward temporaries stay allocated until the step ends: with accumulation, the next
  // micro-batch's forward runs beside them.
  const uint64_t held = s.accumulation > 1 ? f.backward_ws : 0;
  const uint64_t back = std::max(bwd, ckpt > 0 ? f.recompute_ws + fwd : 0);
  if (p.device) p.device_fixed = m->fixed();
  act[int(MemCategory::Workspace)] =
      m->fixed() + std::max({held + fwd, held + m->cross_entropy(sh, s.per_sequence_loss ? T : R),
                             f.backward_ws + back});

  if (p.device) {
    plan_device_persistent(c, w, s, *m, adapter * c.n_layers, segment, &p);
    // Per micro-batch: four int32 arrays of R (LlamaRunner::prepare), the streamed units, and
    // for a host step the adapter's A/B in (LlamaRunner::lora_to_device), its gradients out.
    uint64_t pass = 4 * uint64_t(R) * 4;
    if (s.offload_params == OffloadTarget::Cpu && have_groups)
      pass += device_stream_bytes_per_pass(w);
    const uint64_t host_step = device_optimizer_step(s) ? 0 : lora_floats(c, lc) * 4;
    const uint64_t passes = uint64_t(std::max(s.accumulation, 1));
    p.device_h2d_per_step = (pass + host_step) * passes;
    p.device_d2h_per_step = host_step * passes;  // LlamaRunner::lora_grads_to_host
  }
  for (int i = 0; i < kMemCategoryCount; ++i) {
    p.device_train_peak += p.device_train[i];
    if (p.device) cat[i] += p.device_train[i];
  }
  for (uint64_t v : cat) p.train_peak += v;
  p.load_peak = w.bytes + w.load_staging;
  // Every rank loads the whole model first; ZeRO-3 then makes its shards before the full
  // buffers go (NVMe offload writes them out and frees them). ZeRO-3 with several ranks loads
  // deferred (train/trainer.h load_into_shards): each group once alone, then group by group
  // beside the shards made so far.
  uint64_t loaded = w.bytes;
  if (have_groups && s.zero_stage == 3 && deferred) {
    loaded = zero3_deferred_load_peak(z3);
    p.load_peak = loaded + w.load_staging;
  } else if (have_groups && s.zero_stage == 3) {
    loaded += cat[int(MemCategory::Weights)];
  }
  p.load_peak = std::max(p.load_peak, loaded);
  p.peak = cat;
  p.peak[int(MemCategory::Weights)] = std::max(p.peak[int(MemCategory::Weights)], loaded);
  p.peak[int(MemCategory::Workspace)] =
      std::max(p.peak[int(MemCategory::Workspace)], w.load_staging);
  p.total_peak = std::max(p.train_peak, p.load_peak);
  return p;
}

}  // namespace qlft
