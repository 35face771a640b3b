// A Llama-family model's hyperparameters as its file states them (ModelConfig), the RoPE
// scaling it declares, and the names of its seven linear projections. The loaders (model/)
// and the planner read these from GGUF metadata or config.json; everything derived from them
// (every tensor's shape) is in arch/model_shapes.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace qlft {

enum class RopeType : int { Default = 0, Linear, Dynamic, Llama3, Yarn, LongRope };
const char* rope_type_name(RopeType t);  // transformers' rope_type string

// RoPE scaling as transformers declares it (parsed and turned into frequencies by
// model/rope_scaling.h).
struct RopeScaling {
  RopeType type = RopeType::Default;
  double factor = 1.0;                                   // linear, dynamic, llama3, yarn
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3
  int original_context = 0;                  // original_max_position_embeddings (llama3, yarn)
  double beta_fast = 32.0, beta_slow = 1.0;  // yarn
  // yarn: the cos / sin factor as given (attention_factor), else derived from factor and
  // mscale / mscale_all_dim (0: absent), as transformers does.
  double attention_factor = 0.0, mscale = 0.0, mscale_all_dim = 0.0;
  bool has_attention_factor = false;
  bool truncate = true;  // yarn: floor / ceil the correction range
  // GGUF rope_freqs.weight (llama.cpp's form of llama3 scaling): inv_freq[i] is divided by
  // freq_divisors[i]. Empty otherwise.
  std::vector<float> freq_divisors;
  // longrope (Phi-3): per-pair divisors of the frequencies, short_factor for calls up to
  // original_context positions and long_factor past it (head_dim / 2 each); its cos / sin factor
  // is attention_factor (has_attention_factor) or derived from factor.
  std::vector<float> short_factor, long_factor;

  bool scaled() const { return type != RopeType::Default || !freq_divisors.empty(); }
};

// Attention's head geometry: n_heads query heads of head_dim share n_kv_heads key / value heads
// (GQA: query head h reads KV head h / group()). q is [rows, q_dim()], k and v [rows, kv_dim()].
struct HeadGeometry {
  int n_heads = 1, n_kv_heads = 1, head_dim = 1;
  // In 64 bits: products of them with row counts pass 2^31.
  int64_t q_dim() const { return int64_t{1} * n_heads * head_dim; }
  int64_t kv_dim() const { return int64_t{1} * n_kv_heads * head_dim; }
  int group() const { return n_heads / n_kv_heads; }
  bool operator==(const HeadGeometry&) const = default;
};

// A model's dimensions: its head geometry, depth, width, MLP width and vocabulary. ModelConfig
// states them and ModelShapes (arch/model_shapes.h) carries the same struct, so each lives in
// one place.
struct ModelDims : HeadGeometry {
  int n_layers = 0, dim = 0, ffn_dim = 0, vocab = 0;
  bool operator==(const ModelDims&) const = default;
};

struct ModelConfig : ModelDims {
  std::string arch;        // "llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3_text"
  int context_length = 0;  // max_position_embeddings (dynamic NTK scales beyond it)
  float rope_theta = 10000.f, rms_eps = 1e-5f;
  RopeScaling rope;  // RoPE scaling (model/rope_scaling.h); rope_freqs() makes the table
  bool tied_embeddings = false;
  // true: q/k rows are in GGUF llama order (RoPE rotates adjacent pairs); false: Hugging Face
  // order (rotate-half). Kept as the source has it.
  bool rope_adjacent = false;
  bool qkv_bias = false;
  bool qk_norm = false;  // q_norm / k_norm per head before RoPE (ArchFamily::qk_norm)
  // Sliding-window attention: the window (0: none) and which layers use it (empty: all of them
  // when the window is set). Query i attends key j only when j > i - sliding_window.
  int sliding_window = 0;
  std::vector<bool> sliding_layers;
  // Gemma (ArchFamily::gemma): Gemma's block, the scores' scale query_pre_attn_scalar^-0.5
  // (attn_scalar; 0: head_dim) and tanh soft-capping of the attention scores and of the final
  // logits, cap * tanh(x / cap) (0: none).
  bool gemma = false;
  float attn_scalar = 0.f, attn_softcap = 0.f, final_softcap = 0.f;
  // The sliding layers' own RoPE base, plain (gemma3: rope_local_base_freq, 10000); 0: every
  // layer rotates with rope_theta and rope.
  float rope_local_theta = 0.f;
  bool layer_slides(int l) const {
    return sliding_window > 0 && (sliding_layers.empty() || sliding_layers[static_cast<size_t>(l)]);
  }
  // Mixture-of-experts MLPs (mixtral): n_experts SwiGLU experts of expert_ffn rows each, the
  // router's top_k per row (their weights renormalised to sum 1 when norm_topk), on the layers
  // moe_layers marks (empty: all). 0 experts: dense MLPs. The load-balancing loss
  // (router_aux_loss_coef) enters the loss with output_router_logits, as in transformers (what
  // moe.aux_loss=auto follows).
  struct Moe {
    int n_experts = 0, top_k = 0;
    int64_t expert_ffn = 0;
    bool norm_topk = true;
    float aux_coef = 0.f;
    bool aux_loss = false;  // output_router_logits
    std::vector<bool> layers;
  } moe;
  bool layer_moe(int l) const {
    return moe.n_experts > 0 && (moe.layers.empty() || moe.layers[static_cast<size_t>(l)]);
  }
  // Hugging Face tensor names: the decoder's under hf_prefix ("model.": model.layers.N.,
  // model.embed_tokens, model.norm), the untied head hf_head. An image-text checkpoint
  // (image_text: Gemma3ForConditionalGeneration) trains its language model, under
  // "model.language_model." as transformers 5 saves it ("language_model.model." with the head
  // "language_model.lm_head.weight" in older files); its vision tower and projector are not
  // loaded.
  std::string hf_prefix = "model.", hf_head = "lm_head.weight";
  bool image_text = false;
};

// The shape sanity every reader of a model's hyperparameters applies (the loaders, the planner
// behind `estimate`): positive dimensions, heads a multiple of KV heads, an even head
// dimension, finite rms eps and rope theta > 0. Throws QLFT_ERR_FORMAT naming path.
void check_model_config(const ModelConfig& c, const std::string& path);

// The seven LoRA-targetable projections, in PEFT names.
enum class Proj : int { Q = 0, K, V, O, Gate, Up, Down };
constexpr int kProjCount = 7;
const char* proj_peft_name(Proj p);  // "q_proj"
const char* proj_gguf_name(Proj p);  // "attn_q"

}  // namespace qlft
