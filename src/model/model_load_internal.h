// load_model's parts (model_load.cpp: the walk over weight groups, load_model, the group source;
// model_load_gguf.cpp, model_load_hf.cpp: one format each). Only those files include it.
//
// A format supplies a FormatLoader: the configuration from its header, and each tensor by its
// role (embedding, norm, projection, bias) under the format's names. The walk over the groups
// and layers (load_weight_group) is written once, from the model's shape table (Model::shapes),
// so both formats check and load the same shapes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "core/path.h"  // is_dir, dirname_of, ends_with
#include "model/model.h"

namespace qlft {

// Sanity bounds for shape settings read from files: generous for real models, small enough that
// products of them never overflow.
constexpr int64_t kMaxLayers = 1024, kMaxDim = int64_t(1) << 20, kMaxHeads = 4096,
                  kMaxHeadDim = 4096, kMaxVocab = int64_t(1) << 24, kMaxContext = int64_t(1) << 26;

// Refuses a NaN or Inf weight before it is quantized (it would turn its block's codes into
// out-of-range conversions), naming file and tensor.
void require_finite(const float* x, int64_t n, const char* file, const std::string& tensor);
// The quantized kind of LoadOptions::quant_type (nf4, int8).
QuantKind target_kind(const LoadOptions& o);

// Q, K: the per-head q / k norms (qwen3); PostAttn, PostFfn: the norms after attention and after
// the MLP (gemma, LayerShapes::post_norm).
enum class NormRole { Attn, Ffn, Final, Q, K, PostAttn, PostFfn };

// Gemma's RMSNorm scales by (1 + w): Hugging Face files store w, so their norms are held as
// 1 + w (what llama.cpp's converter stores in GGUF) and the runner's plain RMSNorm applies them.
inline void gemma_norm_weights(Buffer& w, int64_t n) {
  float* p = w.as<float>();
  for (int64_t i = 0; i < n; ++i) p[i] += 1.f;
}

// How both formats' configuration readers settle the output head: a file without it (`head`,
// the format's name for it) ties the head to the token embedding, unless the configuration states
// untied (tie_stated: it names tie_word_embeddings, and c is untied), which is refused naming
// `where` and the tensor. A configuration that ties the head keeps it tied. Returns c.
const ModelConfig& tie_missing_head(ModelConfig& c, bool head_present, bool tie_stated,
                                    const std::string& where, const std::string& head);

class FormatLoader {
 public:
  FormatLoader(MemoryTracker* t, const LoadOptions& o, Model& m) : tracker_(t), opt_(o), m_(m) {}
  virtual ~FormatLoader() = default;
  // Reads the configuration into the model (Model::cfg: read_config) and checks the tensors it
  // can check from the header; no weight storage.
  void open(const std::string& path);
  // The tensors by role, layer l (norm: any l for Final), shapes from Model::shapes.
  virtual void embedding(QWeight& w, bool head) = 0;  // head: the untied output head
  virtual void norm(Buffer& dst, int l, NormRole r, int64_t n) = 0;
  virtual void linear(QWeight& w, int l, Proj p, const ProjShape& s) = 0;
  virtual void bias(Buffer& dst, int l, Proj p, int64_t n) = 0;
  // A mixture-of-experts layer's router and experts (LayerShapes::moe()), w.w1 / w3 / w2
  // sized n_experts; the format's names. A format without them refuses the model.
  virtual void moe(MoeWeights& w, int l, const LayerShapes& s) {
    (void)w, (void)s;
    throw_error(QLFT_ERR_UNSUPPORTED,
                "layer %d: this format's mixture-of-experts tensors are not read", l);
  }

  // load_weight_group without reading a weight (GGUF): the group's shapes and types set and each
  // Buffer's bytes in the map (span). False when a Buffer is made on load: load it instead.
  virtual bool plan_group(int, bool) { return false; }
  virtual std::pair<const uint8_t*, size_t> span(const Buffer*) const { return {nullptr, 0}; }
  // The embedding (head: the untied head) as stored (WeightGroupSource::stored_rows), and its
  // rows [r0, r0 + n) in that format.
  virtual QWeight stored_rows(bool head) = 0;
  virtual void stored_row_bytes_of(bool head, int64_t r0, int64_t n, void* out) = 0;

 protected:
  // The format's part of open().
  virtual void read_config(const std::string& path) = 0;

  // What every format's loader works with: the tracker its buffers count against, the options,
  // the model it fills, and its family's ArchFamily::fused (phi3; set by open()).
  MemoryTracker* tracker_;
  const LoadOptions& opt_;
  Model& m_;
  bool fused_ = false;
};

std::unique_ptr<FormatLoader> make_gguf_loader(MemoryTracker* t, const LoadOptions& o, Model& m);
std::unique_ptr<FormatLoader> make_hf_loader(MemoryTracker* t, const LoadOptions& o, Model& m);

// Opens the file with f and makes the model's shape table (Model::shapes) and layers.
void open_model(FormatLoader& f, Model& m, const std::string& path);
// The storage of weight group g (for_each_weight_buffer's numbering) into the model, each
// tensor of the shape Model::shapes gives it: the one walk of both formats.
void load_weight_group(FormatLoader& f, Model& m, int g, bool with_head);

}  // namespace qlft
