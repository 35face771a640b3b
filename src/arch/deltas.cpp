#include "arch/deltas.h"

#include "arch/families.h"

namespace qlft {

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
  const ArchFamily* f = find_family(c.arch);
  if (f && f->fused) add("fused qkv_proj and gate_up_proj (split on load)");
  if (s.tied_head) add("tied head");
  // GGUF's rope_freqs tensor is llama3 scaling in llama.cpp's form.
  if (c.rope.type != RopeType::Default)
    add(std::string("rope scaling ") + rope_type_name(c.rope.type));
  else if (!c.rope.freq_divisors.empty())
    add("rope scaling llama3 (rope_freqs)");
  return out.empty() ? "none" : out;
}

}  // namespace qlft
