#include "arch/deltas.h"

#include <algorithm>
#include <cstdio>

#include "arch/families.h"

namespace qlft {

namespace {
std::string fmt_g(float v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.10g", static_cast<double>(v));
  return b;
}
}  // namespace

std::string describe_deltas(const ModelConfig& c, const ModelShapes& s) {
  std::string out;
  auto add = [&out](const std::string& d) { out += (out.empty() ? "" : ", ") + d; };
  if (s.qk_norm()) add("q/k RMSNorm per head");
  if (!s.layers.empty() && s.layers[0].qkv_bias) add("q/k/v bias");
  // The window per layer as the shape table holds it (a family may slide only some layers).
  int sliding = 0, window = 0;
  for (const LayerShapes& l : s.layers)
    if (l.window > 0) ++sliding, window = l.window;
  if (sliding > 0)
    add("sliding window " + std::to_string(window) + " on " + std::to_string(sliding) + " of " +
        std::to_string(s.n_layers) + " layers");
  int moe = 0;
  for (const LayerShapes& l : s.layers) moe += l.moe() ? 1 : 0;
  if (moe > 0) {
    const LayerShapes& l = *std::find_if(s.layers.begin(), s.layers.end(),
                                         [](const LayerShapes& x) { return x.moe(); });
    add("mixture of experts: " + std::to_string(l.n_experts) + " experts of width " +
        std::to_string(l.expert_ffn) + ", top " + std::to_string(l.top_k) +
        (l.norm_topk ? " renormalised" : " (weights not renormalised)") + " on " +
        std::to_string(moe) + " of " + std::to_string(s.n_layers) + " layers");
  }
  const ArchFamily* f = find_family(c.arch);
  if (f && f->fused) add("fused qkv_proj and gate_up_proj (split on load)");
  if (c.gemma)
    add("(1 + w) RMSNorms, post-attention and post-feedforward norms, GeGLU (tanh GELU), "
        "embeddings times sqrt(hidden)");
  if (c.attn_scalar > 0 && c.attn_scalar != float(c.head_dim))
    add("attention scaled by query_pre_attn_scalar " + fmt_g(c.attn_scalar) + "^-0.5");
  if (c.rope_local_theta > 0)
    add("RoPE base " + fmt_g(c.rope_local_theta) + " on sliding layers, " + fmt_g(c.rope_theta) +
        " on full ones");
  if (c.attn_softcap > 0) add("attention logits soft-capped at " + fmt_g(c.attn_softcap));
  if (c.final_softcap > 0) add("final logits soft-capped at " + fmt_g(c.final_softcap));
  if (s.tied_head) add("tied head");
  // GGUF's rope_freqs tensor is llama3 scaling in llama.cpp's form.
  if (c.rope.type != RopeType::Default)
    add(std::string("rope scaling ") + rope_type_name(c.rope.type));
  else if (!c.rope.freq_divisors.empty())
    add("rope scaling llama3 (rope_freqs)");
  if (c.image_text)
    add("the text model of an image-text checkpoint (vision tower and projector not loaded)");
  return out.empty() ? "none" : out;
}

}  // namespace qlft
