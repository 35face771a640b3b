// The trainer's own copy of a shared model (train/weight_placement.h).
#include "train/weight_placement.h"

#include "core/error.h"
#include "model/file_unit_stream.h"

namespace qlft {

namespace {

// bytes false: an empty Buffer (a skeleton's slot, filled by its stream).
Buffer copy_buffer(MemoryTracker* tracker, const Buffer& b, bool bytes, const char* what) {
  if (b.empty()) return Buffer();
  if (b.on_device())
    throw_error(QLFT_ERR_INTERNAL, "%s: a shared model's base weights are in host memory", what);
  if (!bytes) return Buffer();
  Buffer out(tracker, b.category(), b.size(), what, BufferInit::Uninit);
  out.copy_from(b, 0, b.size());
  return out;
}

QWeight copy_qweight(MemoryTracker* tracker, const QWeight& w, bool bytes) {
  // The kind, shape and block settings; the storage Buffers follow, copied (or left empty).
  QWeight c{.kind = w.kind,
            .ggml_type = w.ggml_type,
            .rows = w.rows,
            .cols = w.cols,
            .data = {},
            .blocksize = w.blocksize,
            .double_quant = w.double_quant,
            .absmax = {},
            .nested_absmax = {},
            .nested_blocksize = w.nested_blocksize,
            .nested_offset = w.nested_offset,
            .code = {},
            .nested_code = {},
            .scb = {}};
  for (Buffer QWeight::*b : {&QWeight::data, &QWeight::absmax, &QWeight::nested_absmax,
                             &QWeight::code, &QWeight::nested_code, &QWeight::scb})
    c.*b = copy_buffer(tracker, w.*b, bytes, "weights (trainer's copy)");
  return c;
}

// Everything the runner and the streams read; the GGUF reader (tokenizer metadata) stays with
// the shared model. A deferred model's Buffers are empty, and so are the copy's; bytes false
// leaves them empty anyway (a skeleton).
std::unique_ptr<Model> copy_model(MemoryTracker* tracker, const Model& m, bool bytes) {
  auto c = std::make_unique<Model>();
  c->cfg = m.cfg;
  c->shapes = m.shapes;
  c->path = m.path;
  c->source_format = m.source_format;
  c->quant_summary = m.quant_summary;
  c->load_options = m.load_options;
  c->hf_dir = m.hf_dir;
  c->deferred_weight_bytes = m.deferred_weight_bytes;
  c->deferred_groups_read = m.deferred_groups_read;
  const char* what = "weights (trainer's copy)";
  c->tok_embd = copy_qweight(tracker, m.tok_embd, bytes);
  c->output_norm = copy_buffer(tracker, m.output_norm, bytes, what);
  c->output = copy_qweight(tracker, m.output, bytes);
  c->layers.resize(m.layers.size());
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const LayerWeights& s = m.layers[l];
    LayerWeights& d = c->layers[l];
    d.attn_norm = copy_buffer(tracker, s.attn_norm, bytes, what);
    d.ffn_norm = copy_buffer(tracker, s.ffn_norm, bytes, what);
    for (int p = 0; p < kProjCount; ++p) d.proj[p] = copy_qweight(tracker, s.proj[p], bytes);
    for (int b = 0; b < 3; ++b) d.bias[b] = copy_buffer(tracker, s.bias[b], bytes, what);
    d.q_norm = copy_buffer(tracker, s.q_norm, bytes, what);
    d.k_norm = copy_buffer(tracker, s.k_norm, bytes, what);
  }
  return c;
}

// The copy is made inside the trainer's constructor, whose host block cache is held; its blocks
// are freed as soon as a stream places them, so they are made as loading makes its blocks
// (page-mapped and unmapped when freed, core/memory.h) and leave no resident heap behind:
// make(), with this trainer's hold on the cache let go meanwhile.
template <class F>
void outside_cache_hold(MemoryTracker* tracker, const F& make) {
  if (tracker) tracker->drop_host_cache();
  // Held again however make() ends (a null tracker is never touched).
  std::unique_ptr<MemoryTracker, void (*)(MemoryTracker*)> again(
      tracker, [](MemoryTracker* t) { t->hold_host_cache(); });
  make();
}

}  // namespace

WeightPlacement::WeightPlacement(const Model& shared, MemoryTracker* tracker, WeightUse use)
    : shared_(shared), tracker_(tracker) {
  if (use == WeightUse::Shared && !shared.stream) return;
  if (shared.stream && !shared.load_options.deferred)
    throw_error(QLFT_ERR_INTERNAL, "%s: a shared model is streamed only when loaded deferred",
                shared.path.c_str());
  if (use == WeightUse::Read) {  // no bytes copied: the stream reads the shared model's
    own_ = copy_model(tracker, shared, /*bytes=*/false);
    skeleton_ = !shared.stream;
  } else {
    outside_cache_hold(tracker, [&] { own_ = copy_model(tracker, shared, /*bytes=*/true); });
  }
  // A deferred load: the copy reads its groups from the file through its own stream (the
  // shared model's stream fills the shared model's Buffers, not these).
  if (shared.stream) own_->stream = std::make_shared<FileUnitStream>(*own_, tracker);
}

WeightPlacement::~WeightPlacement() = default;

Model& WeightPlacement::own() {
  if (!own_)
    throw_error(QLFT_ERR_INTERNAL,
                "%s: the trainer reads the shared model; it has no copy of its own",
                shared_.path.c_str());
  return *own_;
}

const Model& WeightPlacement::make_resident() {
  Model& m = own();
  if (skeleton_) return shared_;
  auto* files = dynamic_cast<FileUnitStream*>(m.stream.get());
  if (!files) return m;
  files->evict();
  const int groups = static_cast<int>(m.layers.size()) + 2;
  outside_cache_hold(tracker_, [&] {
    for (int g = 0; g < groups; ++g) files->source().load(m, g, /*with_head=*/true);
  });
  m.stream.reset();
  return m;
}

}  // namespace qlft
