// A loaded Llama-family base model: its configuration and shape table (arch/) and its frozen
// (possibly quantized) weights.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "arch/model_shapes.h"
#include "config/run_spec.h"
#include "core/error.h"
#include "core/memory.h"
#include "formats/gguf.h"
#include "quant/qweight.h"
#include "model/moe.h"
#include "model/rope_scaling.h"
#include "model/weight_stream.h"

namespace qlft {

struct LayerWeights {
  Buffer attn_norm, ffn_norm;  // f32 [dim]
  QWeight proj[kProjCount];    // [out, in]
  Buffer bias[3];              // qwen2: f32 q/k/v biases, else empty
  Buffer q_norm, k_norm;       // qwen3: f32 [head_dim] per-head q / k RMSNorm weights, else empty
  // gemma: f32 [dim] norms of the attention and MLP outputs (held as 1 + w), else empty
  Buffer post_attn_norm, post_ffn_norm;
  // A mixture-of-experts layer (LayerShapes::moe()): its router and experts, in place of the
  // dense gate / up / down (those proj entries empty).
  MoeWeights moe;
};

struct LoadOptions {
  QuantType quant_type = QuantType::NF4;  // quant.type
  bool double_quant = true;
  int blocksize = 64;
  // Load no weights for good: each group's shapes and types are taken from the header when its
  // Buffers hold the file's bytes unchanged (gguf_kept_as_stored), else the group is loaded once
  // and freed (the f32 embedding not even once: its shape is known from the header),
  // and the model reads them through a FileUnitStream (model/file_unit_stream.h) until a ZeRO-3
  // trainer shards them straight from the file (dist/zero3_stream.h), so no process ever holds
  // the whole model (train/trainer.h load_into_shards says when).
  bool deferred = false;
};
// The storage a quant.type that quantizes gives linear weights (NF4, INT8); Keep has none.
inline QuantKind quantized_kind(QuantType t) {
  if (t == QuantType::INT8) return QuantKind::INT8;
  QLFT_CHECK_ARG(t == QuantType::NF4, "quant.type %s has no quantized kind", name_of(t));
  return QuantKind::NF4;
}
// The quant.* settings as load options (deferred: false).
inline LoadOptions load_options(const QuantSpec& q) {
  LoadOptions o;
  o.quant_type = q.type;
  o.double_quant = q.double_quant;
  o.blocksize = q.blocksize;
  return o;
}

struct Model {
  ModelConfig cfg;
  ModelShapes shapes;         // model_shapes(cfg), made by load_model; the loaders check by it
  std::string path;           // what was loaded
  std::string source_format;  // "gguf" | "safetensors"
  std::string quant_summary;  // type of the linear weights, "mixed" if several
  LoadOptions load_options;   // what load_model was given (WeightGroupSource loads alike)
  QWeight tok_embd;           // [vocab, dim]
  Buffer output_norm;         // f32 [dim]
  QWeight output;             // [vocab, dim]; empty (rows == 0) when tied to tok_embd
  std::vector<LayerWeights> layers;
  std::unique_ptr<GgufFile> gguf;  // kept open for tokenizer metadata (GGUF sources)
  std::string hf_dir;              // directory of config.json / tokenizer.json (HF sources)
  // Set when the base weights are not all resident (ZeRO-3 shards, NVMe offload): only a
  // LlamaRunner that acquires units through it may read the weights' storage. Generation and
  // merged export refuse such a model (see model/weight_stream.h).
  std::shared_ptr<WeightStream> stream;
  // LoadOptions::deferred: the weight bytes a full load would hold (weight_bytes() reports it),
  // and how many groups the load read whole for their shapes (made on load: quantized or
  // converted; the others' shapes came from the header alone).
  uint64_t deferred_weight_bytes = 0;
  int deferred_groups_read = 0;

  const QWeight& head() const { return output.rows ? output : tok_embd; }
  // Throws QLFT_ERR_UNSUPPORTED naming `what` when the weights are streamed (stream set).
  void require_resident(const char* what) const;
  uint64_t n_params() const;
  uint64_t weight_bytes() const;
};

// Every storage Buffer of m's base weights with its weight group, the one enumeration the weight
// streams and the planner share: group 0 the token embedding; 1..n_layers each layer (attn_norm,
// ffn_norm, the projections, the biases, the q / k norms, gemma's post-block norms, an MoE
// layer's router and experts w1, w3, w2 by expert); n_layers + 1
// the final norm and the untied head. A QWeight gives data, absmax, nested_absmax, code,
// nested_code, scb. Empty Buffers are included (callers skip what they do not keep). f(int group,
// Buffer& b); M is Model or const Model.
template <class M, class F>
void for_each_weight_buffer(M& m, const F& f) {
  auto qweight = [&](int g, auto& w) {
    for (auto* b : {&w.data, &w.absmax, &w.nested_absmax, &w.code, &w.nested_code, &w.scb})
      f(g, *b);
  };
  const int L = static_cast<int>(m.layers.size());
  qweight(0, m.tok_embd);
  for (int l = 0; l < L; ++l) {
    auto& lw = m.layers[static_cast<size_t>(l)];
    f(l + 1, lw.attn_norm);
    f(l + 1, lw.ffn_norm);
    for (auto& w : lw.proj) qweight(l + 1, w);
    for (auto& b : lw.bias) f(l + 1, b);
    f(l + 1, lw.q_norm);
    f(l + 1, lw.k_norm);
    f(l + 1, lw.post_attn_norm);
    f(l + 1, lw.post_ffn_norm);
    if (lw.moe.w1.empty()) continue;
    qweight(l + 1, lw.moe.router);
    for (size_t e = 0; e < lw.moe.w1.size(); ++e) {
      qweight(l + 1, lw.moe.w1[e]);
      qweight(l + 1, lw.moe.w3[e]);
      qweight(l + 1, lw.moe.w2[e]);
    }
  }
  f(L + 1, m.output_norm);
  if (m.output.rows) qweight(L + 1, m.output);
}
// The weight groups unit u reads (model/weight_stream.h units): the head unit also reads the
// embedding's group when the head is tied.
std::vector<std::vector<int>> weight_groups_of_units(const Model& m);
// For each of model's storage Buffers (for_each_weight_buffer's order), the Buffer holding its
// bytes in host: model's own when &host == &model, otherwise host's (a model of the same shapes
// and kinds, model holding no storage: a trainer's skeleton over the loaded model, train/
// weight_placement.h). Throws QLFT_ERR_INTERNAL, naming `what`, when the two do not pair.
std::vector<const Buffer*> weight_bytes_in(const Model& host, const Model& model, const char* what);

// Whether load_model keeps GGUF tensor t's bytes exactly as the file stores them: f32, or (a
// projection, linear) blocks kept with quant.type=keep. A deferred ZeRO-3 load then reads each
// rank's slices of them straight from the file (WeightGroupSource::stored_group); the planner
// follows the same rule (WeightFootprint::kept).
bool gguf_kept_as_stored(const GgufTensorInfo& t, bool linear, const LoadOptions& o);

// A GGUF's tokenizer must have one token per embedding row (when it has a tokenizer).
void check_gguf_vocabulary(const GgufFile& g, int64_t embedding_rows);

// The projection weights as the model's file stores them, before quant.type quantized them
// (dequantized to f32 when the file itself stores them quantized: GGUF blocks), each row-major
// [out, in] in the model's row order, one at a time: f(layer, p, W). LoftQ (model/lora_loftq.h)
// measures the quantization error against them. Opens its own reader of m.path; throws
// QLFT_ERR_IO when the file no longer matches the model.
void for_each_source_projection(MemoryTracker* tracker, const Model& m,
                                const std::function<void(int, Proj, const float*)>& f);

// Single weight groups (for_each_weight_buffer's numbering) loaded again from the file a model
// came from, exactly as load_model made them (same reader, same quantization): a rank-local
// source of streamed weights (ZeRO-3 evaluation and generation, dist/zero3_stream.h). Opens its
// own reader of m.path; throws QLFT_ERR_IO when the file no longer matches the model.
class WeightGroupSource {
 public:
  static std::unique_ptr<WeightGroupSource> open(MemoryTracker* tracker, const Model& m);
  virtual ~WeightGroupSource() = default;
  // Fills group's storage Buffers in m (counted as `weights`), replacing what they held.
  // with_head false: the last group without the untied output head (its shape alone is kept;
  // ZeRO-3 reads it by rows, load_rows).
  virtual void load(Model& m, int group, bool with_head) = 0;
  // The token embedding (head: the untied output head) as the file stores it, without data:
  // kind F32, F16, BF16 or GGML blocks (ggml_type), rows x cols. A type that is not stored row
  // by row that way (f64) is given as F32.
  virtual QWeight stored_rows(bool head) = 0;
  // Its rows [row0, row0 + n) in that format (n x stored_row_bytes bytes) into out: ZeRO-3's
  // row shards, read straight from the file, never the whole matrix. Dequantized, they are
  // the values load_model gives.
  virtual void load_rows(bool head, int64_t row0, int64_t n, void* out) = 0;
  // The group's storage without loading it, when load() would copy each of its Buffers
  // unchanged from the file (gguf_kept_as_stored): the size of each of the group's Buffers in
  // for_each_weight_buffer's order (0 for one load() leaves empty), their bytes to be read by
  // range (read_stored). Empty when a Buffer of the group is made on load (quantized,
  // converted) or the file is not GGUF: load() the group instead. Throws as load() does.
  virtual std::vector<size_t> stored_group(int group, bool with_head) = 0;
  // Bytes [off, off + n) of Buffer i of the last stored_group's list, read from the file.
  virtual void read_stored(size_t i, size_t off, size_t n, void* out) = 0;

  // What this source read from the file so far: weight bytes by range (read_stored,
  // load_rows), and the groups load()ed whole.
  uint64_t bytes_read_by_range() const { return ranged_bytes_; }
  int64_t groups_loaded() const { return groups_loaded_; }

 protected:
  uint64_t ranged_bytes_ = 0;
  int64_t groups_loaded_ = 0;
};

// The configuration of a GGUF file, and of a Hugging Face config.json with its weights (a
// .safetensors file, a shard index or a directory; opened into *st after the JSON is read;
// st == nullptr: config.json alone, whose keys then decide the q/k/v biases and the tied head),
// read and checked as load_model reads them: the planner behind `estimate` reads files with
// them too. Throws naming the file and key.
class JsonFile;
class SafetensorsSet;
ModelConfig read_gguf_config(const GgufFile& g);
ModelConfig read_hf_config(const JsonFile& cj, const std::string& weights,
                           std::unique_ptr<SafetensorsSet>* st);

// The Hugging Face name of a mixture-of-experts tensor of layer l (ModelConfig::moe): the
// router (e < 0) or expert e's w1 gate (which 1), w2 down (2) or w3 up (3), as the family's
// files name them; with ".weight" when weight.
std::string hf_moe_tensor(const ModelConfig& c, int l, int e, int which, bool weight = true);

// Loads a .gguf file, a .safetensors file beside a config.json, or an HF model directory.
// Every weight is counted in tracker as `weights`.
std::unique_ptr<Model> load_model(MemoryTracker* tracker, const std::string& path,
                                  const LoadOptions& opt);

}  // namespace qlft
