// A PEFT adapter's LoRA on an MoE model's experts and routers (LoraAdapter's MoE slots) as PEFT
// 0.21 saves it: target_parameters (experts.gate_up_proj -> "gate_up_proj", experts.down_proj
// -> "down_proj", the router -> "gate.weight"), gate_up at rank 2r and alpha 2 alpha through
// rank_pattern / alpha_pattern {".*\\.gate_up_proj": ...}, and the ParamWrappers' keys: the
// experts' down_proj at mlp.experts.lora_*, gate_up_proj at mlp.experts.base_layer.lora_*
// (mlp.experts.lora_* when down_proj is not adapted), the router at mlp.gate.lora_*; lora_A
// [E r, in] and lora_B [out, r E] (LoraAdapter::get_moe_peft's layouts). Used by adapter_io.cpp.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <nlohmann/json.hpp>

#include "formats/json_file.h"
#include "formats/safetensors.h"
#include "model/lora.h"

namespace qlft {

// PEFT's key of layer l's part p's lora_A (ab "A") or lora_B (ab "B").
std::string peft_moe_key(const LoraAdapter& lora, int layer, MoePart p, const char* ab);

// Every adapted MoE part's two tensors by key: (layer, part), whether B.
struct MoePeftTensor {
  int layer;
  MoePart p;
  bool b;
};
std::map<std::string, MoePeftTensor> peft_moe_tensors(const LoraAdapter& lora);

// target_parameters, rank_pattern and alpha_pattern of adapter_config.json j (left as they are
// without MoE LoRA).
void write_peft_moe_config(const LoraAdapter& lora, nlohmann::json& j);

// adapter_config.json's target_parameters into c (router, and the gate / up / down targets);
// rank_pattern / alpha_pattern must give gate_up_proj 2r and 2 alpha (QLFT_ERR_FORMAT, naming
// them). Nothing without target_parameters.
void read_peft_moe_config(const JsonFile& j, LoraConfig& c);

// Reads and checks every MoE tensor of st; the returned function sets them into lora (a bad
// file throws before anything is set).
std::function<void()> read_peft_moe_tensors(LoraAdapter& lora, const SafetensorsSet& st,
                                            const std::string& dir);

}  // namespace qlft
