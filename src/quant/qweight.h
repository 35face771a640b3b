// A frozen base weight matrix [rows = out_features, cols = in_features] in its storage format.
// Kernels never dequantize it whole: they ask for row panels into a cache-sized buffer.
#pragma once

#include <cstdint>
#include <string>

#include "core/memory.h"

namespace qlft {

enum class QuantKind : uint8_t {
  F32,   // plain float
  F16,   // IEEE half
  BF16,  // bfloat16
  NF4,   // bitsandbytes NF4: packed codes (element 2i in the high nibble) + blockwise absmax
  INT8,  // bitsandbytes LLM.int8 storage: int8 codes + per-row absmax (SCB)
  GGML,  // a GGUF block type kept as in the file (ggml_type says which)
};
const char* quant_kind_name(QuantKind k);

struct QWeight {
  QuantKind kind = QuantKind::F32;
  uint32_t ggml_type = 0;  // for GGML
  int64_t rows = 0, cols = 0;
  Buffer data;  // F32/F16/BF16 values, NF4 packed codes, INT8 codes, or GGML blocks

  // NF4: blocks of `blocksize` consecutive elements of the row-major flattened matrix.
  int32_t blocksize = 64;
  bool double_quant = false;
  Buffer absmax;         // float per block, or (double_quant) uint8 code per block
  Buffer nested_absmax;  // double_quant: float per group of nested_blocksize absmax codes
  int32_t nested_blocksize = 256;
  float nested_offset = 0;  // double_quant: mean absmax subtracted before quantizing it
  Buffer code;              // NF4: the 16-entry float code book; double_quant: the 256-entry
  Buffer nested_code;       // dynamic map used for absmax

  // INT8: absmax of each row (bitsandbytes SCB).
  Buffer scb;

  int64_t numel() const { return rows * cols; }
  // Bytes held for this weight (codes + scales).
  uint64_t bytes() const;
  // Dequantizes rows [r0, r0 + n) into out (n * cols floats, row-major). NF4 blocks run over the
  // flattened matrix, so a row range may start or end inside a block. Bit-identical to
  // bitsandbytes' dequantize_4bit / int8_vectorwise_dequant and gguf-py's dequantize.
  void dequantize_rows(int64_t r0, int64_t n, float* out) const;
  // The same rows rounded to bf16 (round to nearest even): bf16_to_f32 of each output equals
  // f32_to_bf16 of what dequantize_rows gives. For the bf16 GEMMs of the CPU backend.
  void dequantize_rows_bf16(int64_t r0, int64_t n, uint16_t* out) const;
  // NF4: the absmax (scale) of block b, decoding the double-quantized statistics if needed.
  float nf4_block_absmax(int64_t b) const;
  // Type name for reports: "nf4", "int8", "f32", "q4_0", ...
  std::string type_name() const;
};

// Builders. src holds rows*cols floats, row-major. Storage is counted as weights in tracker.
QWeight qweight_from_f32(MemoryTracker* tracker, const float* src, int64_t rows, int64_t cols,
                         QuantKind kind, int32_t blocksize = 64, bool double_quant = true);
// Keeps GGUF blocks as they are (a copy of the bytes, counted as weights).
// Bytes of one row of w's kind (F32, F16, BF16, GGML blocks) for a matrix of w.cols columns
// stored row by row with nothing beside its data; 0 for the kinds with scales elsewhere (NF4,
// INT8). Only w's kind, ggml_type and cols are read.
uint64_t stored_row_bytes(const QWeight& w);

QWeight qweight_from_ggml(MemoryTracker* tracker, uint32_t ggml_type, const void* blocks,
                          int64_t rows, int64_t cols);
// The same weight's kind and shape without its data (checked as qweight_from_ggml checks them),
// and in *bytes the size its data would have.
QWeight qweight_ggml_shape(uint32_t ggml_type, int64_t rows, int64_t cols, uint64_t* bytes);

}  // namespace qlft
