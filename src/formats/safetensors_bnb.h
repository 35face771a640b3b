// Loading of bitsandbytes-prequantized linear weights from safetensors (as saved by
// transformers with BitsAndBytesConfig): NF4 (`weight` packed uint8 + `weight.absmax`,
// `weight.quant_map`, `weight.nested_absmax`, `weight.nested_quant_map`,
// `weight.quant_state.bitsandbytes__nf4`) and INT8 (`weight` int8 + `SCB`).
#pragma once

#include <string>

#include "formats/safetensors.h"
#include "quant/qweight.h"

namespace qlft {

// prefix: "model.layers.0.self_attn.q_proj". Returns false if the tensors under prefix are not
// bitsandbytes-quantized (a plain weight); throws QLFT_ERR_FORMAT naming the tensor if they are
// but are inconsistent. rows/cols: the expected [out, in] shape.
bool load_bnb_weight(MemoryTracker* tracker, const SafetensorsSet& st, const std::string& prefix,
                     int64_t rows, int64_t cols, QWeight* out);

}  // namespace qlft
