// load_model's common part: the walk over weight groups and layers both formats share
// (load_weight_group, by the shape table), load_model itself, and the group source that loads
// single groups again (ZeRO-3). The formats: model_load_gguf.cpp, model_load_hf.cpp.
#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <set>

#include "arch/families.h"
#include "core/error.h"
#include "core/log.h"
#include "model/file_unit_stream.h"
#include "model/model_load_internal.h"

namespace qlft {

uint64_t Model::n_params() const {
  uint64_t n = tok_embd.numel() + output.numel() + cfg.dim;
  for (const LayerWeights& l : layers) {
    n += 2 * static_cast<uint64_t>(cfg.dim);
    for (const QWeight& w : l.proj) n += w.numel();
    for (const Buffer& b : l.bias) n += b.size() / 4;
    n += (l.q_norm.size() + l.k_norm.size()) / 4;
    n += l.moe.router.numel();
    for (const auto* v : {&l.moe.w1, &l.moe.w3, &l.moe.w2})
      for (const QWeight& w : *v) n += w.numel();
  }
  return n;
}

std::vector<std::vector<int>> weight_groups_of_units(const Model& m) {
  const int L = static_cast<int>(m.layers.size());
  std::vector<std::vector<int>> u(static_cast<size_t>(unit_count(L)));
  u[kEmbeddingUnit] = {0};
  for (int l = 0; l < L; ++l) u[static_cast<size_t>(layer_unit(l))] = {l + 1};
  u[static_cast<size_t>(head_unit(L))] = {L + 1};
  if (!m.output.rows) u[static_cast<size_t>(head_unit(L))].push_back(0);
  return u;
}

void Model::require_resident(const char* what) const {
  // Only a deferred load streams a model (trainers stream their own copies,
  // train/weight_placement.h).
  if (stream)
    throw_error(QLFT_ERR_UNSUPPORTED,
                "%s: %s needs all base weights in memory, but the model was loaded deferred (%s: "
                "dist.zero_stage=3 over several MPI ranks, or offload.params=nvme); load it "
                "without those settings for it",
                path.c_str(), what, stream->describe().c_str());
}

uint64_t Model::weight_bytes() const {
  if (load_options.deferred) return deferred_weight_bytes;
  uint64_t n = tok_embd.bytes() + output.bytes() + output_norm.size();
  for (const LayerWeights& l : layers) {
    n += l.attn_norm.size() + l.ffn_norm.size();
    for (const QWeight& w : l.proj) n += w.bytes();
    for (const Buffer& b : l.bias) n += b.size();
    n += l.q_norm.size() + l.k_norm.size();
    n += l.moe.router.bytes();
    for (const auto* v : {&l.moe.w1, &l.moe.w3, &l.moe.w2})
      for (const QWeight& w : *v) n += w.bytes();
  }
  return n;
}

// Quantizing divides each block by its absmax: a NaN or Inf weight would turn every code of its
// block into an out-of-range float-to-int conversion (undefined behaviour) and the model into
// garbage. Refuse it where the file and tensor can still be named.
void require_finite(const float* x, int64_t n, const char* file, const std::string& tensor) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i]))
      throw_error(QLFT_ERR_FORMAT, "%s: tensor '%s' holds a non-finite value (%g) at element %lld",
                  file, tensor.c_str(), static_cast<double>(x[i]), static_cast<long long>(i));
}

QuantKind target_kind(const LoadOptions& o) {
  return quantized_kind(o.quant_type);
}

const ModelConfig& tie_missing_head(ModelConfig& c, bool head_present, bool tie_stated,
                                    const std::string& where, const std::string& head) {
  if (head_present) return c;
  QLFT_CHECK_FORMAT(c.tied_embeddings || !tie_stated,
                    "%s: tensor '%s' is missing and tie_word_embeddings is false", where.c_str(),
                    head.c_str());
  c.tied_embeddings = true;
  return c;
}

void FormatLoader::open(const std::string& path) {
  read_config(path);
  fused_ = find_family(m_.cfg.arch)->fused;
}

void open_model(FormatLoader& f, Model& m, const std::string& path) {
  f.open(path);
  m.shapes = model_shapes(m.cfg);
  m.layers.resize(static_cast<size_t>(m.cfg.n_layers));
}

void load_weight_group(FormatLoader& f, Model& m, int g, bool with_head) {
  const ModelShapes& s = m.shapes;
  if (g == 0) return f.embedding(m.tok_embd, false);
  if (g == s.n_layers + 1) {
    f.norm(m.output_norm, -1, NormRole::Final, s.dim);
    if (!s.tied_head && with_head) f.embedding(m.output, true);
    return;
  }
  const int l = g - 1;
  const LayerShapes& ls = s.layers[static_cast<size_t>(l)];
  LayerWeights& L = m.layers[static_cast<size_t>(l)];
  f.norm(L.attn_norm, l, NormRole::Attn, ls.norm);
  f.norm(L.ffn_norm, l, NormRole::Ffn, ls.norm);
  for (int p = 0; p < kProjCount; ++p)  // (an MoE layer has no dense gate / up / down)
    if (ls.proj[p].out) f.linear(L.proj[p], l, static_cast<Proj>(p), ls.proj[p]);
  if (ls.moe()) {
    for (auto* v : {&L.moe.w1, &L.moe.w3, &L.moe.w2}) {
      v->clear();
      v->resize(size_t(ls.n_experts));
    }
    L.moe.top_k = ls.top_k;
    L.moe.norm_topk = ls.norm_topk;
    f.moe(L.moe, l, ls);
  }
  if (ls.qkv_bias)
    for (int j = 0; j < 3; ++j) f.bias(L.bias[j], l, static_cast<Proj>(j), ls.proj[j].out);
  if (ls.qk_norm) {
    f.norm(L.q_norm, l, NormRole::Q, ls.qk_norm);
    f.norm(L.k_norm, l, NormRole::K, ls.qk_norm);
  }
  if (ls.post_norm) {
    f.norm(L.post_attn_norm, l, NormRole::PostAttn, ls.post_norm);
    f.norm(L.post_ffn_norm, l, NormRole::PostFfn, ls.post_norm);
  }
}

namespace {

// A second loader over the model's file (its own map / reader), handing single groups' storage
// to the model.
class LoaderGroupSource final : public WeightGroupSource {
 public:
  LoaderGroupSource(MemoryTracker* t, const Model& m) : opt_(m.load_options) {
    loader_ = m.source_format == "gguf" ? make_gguf_loader(t, opt_, scratch_)
                                        : make_hf_loader(t, opt_, scratch_);
    open_model(*loader_, scratch_, m.path);
    if (!(scratch_.shapes == m.shapes))
      throw_error(QLFT_ERR_IO, "%s: the model file changed since it was loaded", m.path.c_str());
  }
  QWeight stored_rows(bool head) override { return loader_->stored_rows(head); }
  void load_rows(bool head, int64_t row0, int64_t n, void* out) override {
    loader_->stored_row_bytes_of(head, row0, n, out);
    ranged_bytes_ += uint64_t(n) * stored_row_bytes(loader_->stored_rows(head));
    if (scratch_.gguf) scratch_.gguf->drop_tensor_pages();
  }
  std::vector<size_t> stored_group(int group, bool with_head) override {
    spans_.clear();
    if (!loader_->plan_group(group, with_head)) return {};
    if (!with_head && !scratch_.cfg.tied_embeddings) {
      // The head's shape, so that the list has its (empty) Buffers as the model lists them.
      scratch_.output = QWeight{};
      scratch_.output.rows = scratch_.cfg.vocab;
      scratch_.output.cols = scratch_.cfg.dim;
    }
    std::vector<size_t> sizes;
    for_each_weight_buffer(scratch_, [&](int g, Buffer& b) {
      if (g != group) return;
      spans_.push_back(loader_->span(&b));
      sizes.push_back(spans_.back().second);
    });
    return sizes;
  }
  void read_stored(size_t i, size_t off, size_t n, void* out) override {
    QLFT_CHECK_ARG(i < spans_.size() && off <= spans_[i].second && n <= spans_[i].second - off,
                   "read_stored: bytes [%zu, %zu) of stored Buffer %zu (of %zu) are not there", off,
                   off + n, i, spans_.size());
    std::memcpy(out, spans_[i].first + off, n);
    ranged_bytes_ += n;
    if (scratch_.gguf) scratch_.gguf->drop_tensor_pages();
  }
  void load(Model& m, int group, bool with_head) override {
    ++groups_loaded_;
    load_weight_group(*loader_, scratch_, group, with_head);
    if (scratch_.gguf) scratch_.gguf->drop_tensor_pages();
    if (!with_head && m.output.rows) {
      // The head's shape, so that both models list its (empty) buffers alike.
      scratch_.output.kind = m.output.kind;
      scratch_.output.rows = m.output.rows;
      scratch_.output.cols = m.output.cols;
    }
    std::vector<Buffer*> from, to;
    for_each_weight_buffer(scratch_, [&](int g, Buffer& b) {
      if (g == group) from.push_back(&b);
    });
    for_each_weight_buffer(m, [&](int g, Buffer& b) {
      if (g == group) to.push_back(&b);
    });
    if (from.size() != to.size())
      throw_error(QLFT_ERR_INTERNAL, "weight group %d: %zu vs %zu buffers", group, from.size(),
                  to.size());
    for (size_t i = 0; i < from.size(); ++i) *to[i] = std::move(*from[i]);
  }

 private:
  LoadOptions opt_;
  Model scratch_;
  std::unique_ptr<FormatLoader> loader_;
  std::vector<std::pair<const uint8_t*, size_t>> spans_;  // of the last stored_group
};

bool has_gguf_magic(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;  // no FIFO reads
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return false;
  char m[4] = {0, 0, 0, 0};
  size_t n = std::fread(m, 1, 4, f);
  std::fclose(f);
  return n == 4 && std::memcmp(m, "GGUF", 4) == 0;
}

}  // namespace

std::unique_ptr<WeightGroupSource> WeightGroupSource::open(MemoryTracker* tracker, const Model& m) {
  return std::make_unique<LoaderGroupSource>(tracker, m);
}

void for_each_source_projection(MemoryTracker* tracker, const Model& m,
                                const std::function<void(int, Proj, const float*)>& f) {
  LoadOptions keep = m.load_options;
  keep.quant_type = QuantType::Keep;
  keep.deferred = false;
  Model scratch;
  std::unique_ptr<FormatLoader> loader = m.source_format == "gguf"
                                             ? make_gguf_loader(tracker, keep, scratch)
                                             : make_hf_loader(tracker, keep, scratch);
  open_model(*loader, scratch, m.path);
  if (!(scratch.shapes == m.shapes))
    throw_error(QLFT_ERR_IO, "%s: the model file changed since it was loaded", m.path.c_str());
  std::vector<float> w;
  for (int l = 0; l < m.shapes.n_layers; ++l)
    for (int p = 0; p < kProjCount; ++p) {
      const ProjShape& s = m.shapes.layers[static_cast<size_t>(l)].proj[p];
      if (!s.out) continue;  // (an MoE layer's dense MLP)
      QWeight q;
      loader->linear(q, l, static_cast<Proj>(p), s);
      w.resize(static_cast<size_t>(q.numel()));
      q.dequantize_rows(0, q.rows, w.data());
      q = QWeight{};
      if (scratch.gguf) scratch.gguf->drop_tensor_pages();
      f(l, static_cast<Proj>(p), w.data());
    }
}

std::unique_ptr<Model> load_model(MemoryTracker* tracker, const std::string& path,
                                  const LoadOptions& opt) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    throw_error(QLFT_ERR_IO, "%s: no such file or directory", path.c_str());
  auto m = std::make_unique<Model>();
  m->path = path;
  const char* prev_phase = "setup";
  tracker->set_phase("load");
  try {
    // The file's order (embedding, final norm and head, layers): the planner's load peak
    // (weight_footprint_of_file) follows it.
    auto all = [&](FormatLoader& loader) {
      open_model(loader, *m, path);
      const int L = m->cfg.n_layers;
      // Deferred: each group is freed once loaded (its shapes and types stay).
      auto group = [&](int g) {
        // The f32 embedding and an untied head: their shapes alone, never whole here (ZeRO-3
        // shards them by rows from the file, WeightGroupSource::load_rows, or loads the group
        // when it needs it).
        auto shape_only = [&](QWeight& w) {
          w.kind = QuantKind::F32;
          w.rows = m->cfg.vocab;
          w.cols = m->cfg.dim;
          m->deferred_weight_bytes += uint64_t(m->cfg.vocab) * uint64_t(m->cfg.dim) * 4;
        };
        if (opt.deferred && g == 0) return shape_only(m->tok_embd);
        const bool head_by_shape = opt.deferred && g == L + 1 && !m->cfg.tied_embeddings;
        if (opt.deferred && loader.plan_group(g, !head_by_shape)) {
          // Kept as the file stores it: the header gave the shapes; nothing read.
          for_each_weight_buffer(*m, [&](int bg, Buffer& b) {
            if (bg == g) m->deferred_weight_bytes += loader.span(&b).second;
          });
          if (head_by_shape) shape_only(m->output);
          return;
        }
        load_weight_group(loader, *m, g, !head_by_shape);
        if (head_by_shape) shape_only(m->output);
        if (!opt.deferred) return;
        ++m->deferred_groups_read;
        for_each_weight_buffer(*m, [&](int bg, Buffer& b) {
          if (bg != g) return;
          m->deferred_weight_bytes += b.size();
          b.reset();
        });
        if (m->gguf) m->gguf->drop_tensor_pages();
      };
      group(0);
      group(L + 1);
      for (int g = 1; g <= L; ++g) group(g);
      // The weights were copied out: the file's pages leave the resident set (the map stays
      // for the tokenizer's metadata; every rank of a ZeRO-3 run would otherwise keep them).
      if (m->gguf) m->gguf->drop_tensor_pages();
    };
    m->load_options = opt;
    // A regular file that is neither GGUF (by its magic) nor .safetensors / a shard index is not
    // a model: the HF loader would look for a config.json beside it (any, not the user's).
    const bool gguf = has_gguf_magic(path);
    QLFT_CHECK_FORMAT(gguf || S_ISDIR(st.st_mode) || ends_with(path, ".safetensors") ||
                          ends_with(path, ".json") || ends_with(path, ".gguf"),
                      "%s: not a model (expected a .gguf file, a .safetensors file beside its "
                      "config.json, or a Hugging Face model directory)",
                      path.c_str());
    if (ends_with(path, ".gguf") || gguf) {
      m->source_format = "gguf";
      all(*make_gguf_loader(tracker, opt, *m));
    } else {
      m->source_format = "safetensors";
      all(*make_hf_loader(tracker, opt, *m));
    }
  } catch (...) {
    tracker->set_phase(prev_phase);
    throw;
  }
  tracker->set_phase(prev_phase);
  if (opt.deferred) m->stream = std::make_shared<FileUnitStream>(*m, tracker);
  std::set<std::string> kinds;
  for (const LayerWeights& l : m->layers)
    for (const QWeight& w : l.proj)
      if (w.rows) kinds.insert(w.type_name());
  m->quant_summary = kinds.size() == 1 ? *kinds.begin() : "mixed";
  QLFT_LOG_I("loaded %s model %s (%s): %d layers, dim %d, vocab %d, %s weights, %s",
             m->cfg.arch.c_str(), path.c_str(), m->source_format.c_str(), m->cfg.n_layers,
             m->cfg.dim, m->cfg.vocab, m->quant_summary.c_str(),
             format_bytes(m->weight_bytes()).c_str());
  return m;
}

}  // namespace qlft
