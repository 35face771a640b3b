// The trainer's own copy of a shared model (train/weight_placement.h).
#include "train/weight_placement.h"

#include "core/error.h"
#include "model/file_unit_stream.h"

namespace qlft {

namespace {

Buffer copy_buffer(MemoryTracker* tracker, const Buffer& b, const char* what) {
  if (b.empty()) return Buffer();
  if (b.on_device())
    throw_error(QLFT_ERR_INTERNAL, "%s: a shared model's base weights are in host memory", what);
  Buffer out(tracker, b.category(), b.size(), what, BufferInit::Uninit);
  out.copy_from(b, 0, b.size());
  return out;
}

QWeight copy_qweight(MemoryTracker* tracker, const QWeight& w) {
  QWeight c;
  c.kind = w.kind;
  c.ggml_type = w.ggml_type;
  c.rows = w.rows;
  c.cols = w.cols;
  c.blocksize = w.blocksize;
  c.double_quant = w.double_quant;
  c.nested_blocksize = w.nested_blocksize;
  c.nested_offset = w.nested_offset;
  c.data = copy_buffer(tracker, w.data, "weights (trainer's copy)");
  c.absmax = copy_buffer(tracker, w.absmax, "weights (trainer's copy)");
  c.nested_absmax = copy_buffer(tracker, w.nested_absmax, "weights (trainer's copy)");
  c.code = copy_buffer(tracker, w.code, "weights (trainer's copy)");
  c.nested_code = copy_buffer(tracker, w.nested_code, "weights (trainer's copy)");
  c.scb = copy_buffer(tracker, w.scb, "weights (trainer's copy)");
  return c;
}

// Everything the runner and the streams read; the GGUF reader (tokenizer metadata) stays with
// the shared model. A deferred model's Buffers are empty, and so are the copy's.
std::unique_ptr<Model> copy_model(MemoryTracker* tracker, const Model& m) {
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
  c->tok_embd = copy_qweight(tracker, m.tok_embd);
  c->output_norm = copy_buffer(tracker, m.output_norm, "weights (trainer's copy)");
  c->output = copy_qweight(tracker, m.output);
  c->layers.resize(m.layers.size());
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const LayerWeights& s = m.layers[l];
    LayerWeights& d = c->layers[l];
    d.attn_norm = copy_buffer(tracker, s.attn_norm, "weights (trainer's copy)");
    d.ffn_norm = copy_buffer(tracker, s.ffn_norm, "weights (trainer's copy)");
    for (int p = 0; p < kProjCount; ++p) d.proj[p] = copy_qweight(tracker, s.proj[p]);
    for (int b = 0; b < 3; ++b)
      d.bias[b] = copy_buffer(tracker, s.bias[b], "weights (trainer's copy)");
  }
  return c;
}

// The copy is made inside the trainer's constructor, whose host block cache is held; its blocks
// are freed as soon as a stream places them, so they are made as loading makes its blocks
// (page-mapped and unmapped when freed, core/memory.h) and leave no resident heap behind.
class CacheReleased {
 public:
  explicit CacheReleased(MemoryTracker* t) : t_(t) {
    if (t_) t_->drop_host_cache();
  }
  ~CacheReleased() {
    if (t_) t_->hold_host_cache();
  }
  CacheReleased(const CacheReleased&) = delete;
  CacheReleased& operator=(const CacheReleased&) = delete;

 private:
  MemoryTracker* t_;
};

}  // namespace

WeightPlacement::WeightPlacement(const Model& shared, MemoryTracker* tracker, bool own)
    : shared_(shared), tracker_(tracker) {
  if (!own && !shared.stream) return;
  if (shared.stream && !shared.load_options.deferred)
    throw_error(QLFT_ERR_INTERNAL, "%s: a shared model is streamed only when loaded deferred",
                shared.path.c_str());
  CacheReleased unheld(tracker);
  own_ = copy_model(tracker, shared);
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

void WeightPlacement::make_resident() {
  Model& m = own();
  auto* files = dynamic_cast<FileUnitStream*>(m.stream.get());
  if (!files) return;
  files->evict();
  CacheReleased unheld(tracker_);
  const int groups = static_cast<int>(m.layers.size()) + 2;
  for (int g = 0; g < groups; ++g) files->source().load(m, g, /*with_head=*/true);
  m.stream.reset();
}

}  // namespace qlft
