// How a model differs from plain Llama, in words, for `qlft-finetune inspect` (through
// qlft_model_describe): read from its config and its shape table, so it says what the loaders
// and the runner will actually do with the file.
#pragma once

#include <string>

#include "arch/model_config.h"
#include "arch/model_shapes.h"

namespace qlft {

// The deltas joined by ", " in a fixed order, e.g. "q/k RMSNorm per head, tied head",
// "sliding window 4096 on 28 of 36 layers", "fused qkv_proj and gate_up_proj (split on load)";
// "none" for plain Llama.
std::string describe_deltas(const ModelConfig& c, const ModelShapes& s);

}  // namespace qlft
