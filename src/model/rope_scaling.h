// RoPE scaling as Hugging Face transformers computes it (modeling_rope_utils.py): linear,
// dynamic NTK, llama3 and yarn, read from config.json (rope_scaling / rope_parameters) or GGUF
// (<arch>.rope.scaling.* and llama.cpp's rope_freqs.weight). rope_freqs() is the one place that
// turns a model's configuration into the table every backend rotates with (backend/rope_freqs.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "arch/model_config.h"
#include "backend/rope_freqs.h"

namespace qlft {

class GgufFile;

// The scaling of a config.json (root): rope_scaling (legacy, which transformers prefers when both
// are present) or rope_parameters, its type under rope_type or type. max_pos:
// max_position_embeddings. Unknown types and bad values throw QLFT_ERR_UNSUPPORTED /
// QLFT_ERR_FORMAT naming the file and key.
RopeScaling rope_scaling_from_hf(const nlohmann::json& root, const std::string& path, int max_pos);

// The scaling keys of a GGUF (prefix "<arch>."): rope.scaling.type (none, linear, yarn),
// .factor, .original_context_length, .attn_factor, .yarn_beta_fast / _slow. rope_freqs.weight
// is read by the loader into freq_divisors.
RopeScaling rope_scaling_from_gguf(const GgufFile& g, const std::string& prefix);

// yarn's cos / sin factor (transformers' attention_factor); 1 for the other types.
double rope_attention_factor(const RopeScaling& s);

// The rotation table of c for a call whose largest position is seq_len - 1 (only dynamic NTK
// depends on it: transformers rescales the base from max(position_ids) + 1 when that exceeds
// max_position_embeddings).
RopeFreqs rope_freqs(const ModelConfig& c, int64_t seq_len);

// Whether c's table depends on the sequence length (dynamic NTK; longrope's short / long
// factors): a device backend then holds
// up to kRopeDeviceTables of them.
inline bool rope_varies(const RopeScaling& s) {
  return s.type == RopeType::Dynamic || s.type == RopeType::LongRope;
}

// The longest context c's positions are meant for: max_position_embeddings, times the factor for
// dynamic NTK (whose config keeps the pretraining length and scales past it); 2048 when unknown.
int rope_context_length(const ModelConfig& c);

// What a merged Hugging Face export writes as config.json's rope_parameters (rope_theta and
// rope_type included), and the legacy rope_scaling object (null when unscaled).
nlohmann::json rope_parameters_json(const ModelConfig& c);
nlohmann::json rope_scaling_json(const ModelConfig& c);

}  // namespace qlft
