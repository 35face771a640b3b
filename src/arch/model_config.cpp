#include "arch/model_config.h"

#include <cmath>

#include "core/enum_names.h"
#include "core/error.h"

namespace qlft {

const char* rope_type_name(RopeType t) {
  // transformers' rope_type strings.
  static const char* const names[] = {"default", "linear", "dynamic", "llama3", "yarn", "longrope"};
  return enum_name(names, t);
}

void check_model_config(const ModelConfig& c, const std::string& path) {
  QLFT_CHECK_FORMAT(c.n_layers > 0 && c.n_layers <= 1024, "%s: layer count %d is invalid",
                    path.c_str(), c.n_layers);
  QLFT_CHECK_FORMAT(c.dim > 0 && c.n_heads > 0 && c.n_kv_heads > 0 && c.ffn_dim > 0,
                    "%s: dimensions must be positive (dim %d, heads %d, kv heads %d, ffn %d)",
                    path.c_str(), c.dim, c.n_heads, c.n_kv_heads, c.ffn_dim);
  QLFT_CHECK_FORMAT(c.n_heads % c.n_kv_heads == 0,
                    "%s: head count %d is not a multiple of the KV head count %d", path.c_str(),
                    c.n_heads, c.n_kv_heads);
  QLFT_CHECK_FORMAT(c.head_dim > 0 && c.head_dim % 2 == 0, "%s: head dimension %d must be even",
                    path.c_str(), c.head_dim);
  QLFT_CHECK_FORMAT(
      c.rms_eps > 0 && std::isfinite(c.rms_eps) && c.rope_theta > 0 && std::isfinite(c.rope_theta),
      "%s: rms eps (%g) and rope theta (%g) must be finite and > 0", path.c_str(),
      static_cast<double>(c.rms_eps), static_cast<double>(c.rope_theta));
  QLFT_CHECK_FORMAT(c.sliding_window >= 0 &&
                        (c.sliding_layers.empty() || c.sliding_layers.size() == size_t(c.n_layers)),
                    "%s: sliding window %d over %zu layer types does not fit %d layers",
                    path.c_str(), c.sliding_window, c.sliding_layers.size(), c.n_layers);
  QLFT_CHECK_FORMAT(c.rope_local_theta >= 0 && std::isfinite(c.rope_local_theta),
                    "%s: the sliding layers' rope theta %g is invalid", path.c_str(),
                    static_cast<double>(c.rope_local_theta));
  QLFT_CHECK_FORMAT(c.attn_scalar >= 0 && std::isfinite(c.attn_scalar) && c.attn_softcap >= 0 &&
                        std::isfinite(c.attn_softcap) && c.final_softcap >= 0 &&
                        std::isfinite(c.final_softcap),
                    "%s: query_pre_attn_scalar (%g) and the soft-caps (attention %g, final %g) "
                    "must be finite and >= 0",
                    path.c_str(), static_cast<double>(c.attn_scalar),
                    static_cast<double>(c.attn_softcap), static_cast<double>(c.final_softcap));
  QLFT_CHECK_FORMAT(
      c.moe.n_experts == 0 ||
          (c.moe.top_k > 0 && c.moe.top_k <= c.moe.n_experts && c.moe.expert_ffn > 0 &&
           (c.moe.layers.empty() || c.moe.layers.size() == size_t(c.n_layers))),
      "%s: %d experts, %d per token, expert width %lld over %zu layer flags do not "
      "fit %d layers",
      path.c_str(), c.moe.n_experts, c.moe.top_k, static_cast<long long>(c.moe.expert_ffn),
      c.moe.layers.size(), c.n_layers);
}

const char* proj_peft_name(Proj p) {
  static const char* n[] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                            "gate_proj", "up_proj", "down_proj"};
  return n[static_cast<int>(p)];
}
const char* proj_gguf_name(Proj p) {
  static const char* n[] = {"attn_q",   "attn_k", "attn_v",  "attn_output",
                            "ffn_gate", "ffn_up", "ffn_down"};
  return n[static_cast<int>(p)];
}

}  // namespace qlft
