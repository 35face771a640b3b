// Dequantization of frozen weights into fp32 / bf16 / fp16 tiles (the dequantize half of the
// dequantize + cuBLASLt GEMM linear), activation conversion, bias, and the LoRA dropout mask.
// Per-element arithmetic is the CPU's: nf4_math.h, ggml_math.h, half.h, dropout.h.
#include "check.h"
#include "core/half.h"
#include "backend/dropout.h"
#include "kernels.h"
#include "quant/ggml_math.h"
#include "quant/ggml_types.h"
#include "quant/nf4_math.h"

namespace qlft::cu {

namespace {

template <TileType T>
__device__ __forceinline__ void store(void* out, int64_t i, float v) {
  if constexpr (T == TileType::F32) {
    static_cast<float*>(out)[i] = v;
  } else if constexpr (T == TileType::BF16) {
    static_cast<uint16_t*>(out)[i] = f32_to_bf16(v);
  } else {
    static_cast<uint16_t*>(out)[i] = f32_to_f16(v);
  }
}

// Element-wise formats (F32, F16, BF16, NF4, INT8): one element per thread iteration.
template <TileType T>
__global__ void __launch_bounds__(256)
    k_dequant_elem(DevWeight w, const int32_t* row_ids, int64_t r0, int64_t n, void* out) {
  const int64_t total = n * w.cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / w.cols, c = i - r * w.cols;
    const int64_t src = row_ids ? row_ids[r] : r0 + r;
    const int64_t e = src * w.cols + c;
    float v;
    switch (w.kind) {
      case QuantKind::F32:
        v = static_cast<const float*>(w.data)[e];
        break;
      case QuantKind::F16:
        v = f16_to_f32(static_cast<const uint16_t*>(w.data)[e]);
        break;
      case QuantKind::BF16:
        v = bf16_to_f32(static_cast<const uint16_t*>(w.data)[e]);
        break;
      case QuantKind::NF4: {
        const int64_t b = e / w.blocksize;
        const float am = w.absmax_q ? nested_absmax_decode(w.nested_code, w.absmax_q[b],
                                                           w.nested_absmax[b / w.nested_blocksize],
                                                           w.nested_offset)
                                    : w.scales[b];
        v = nf4_decode(nf4_nibble(static_cast<const uint8_t*>(w.data), e), am);
        break;
      }
      case QuantKind::INT8:
        v = int8_decode(static_cast<const int8_t*>(w.data)[e], w.scales[src]);
        break;
      default:
        v = 0.f;
        break;
    }
    store<T>(out, i, v);
  }
}

// GGUF block formats: each thread expands one ggml block into shared memory with the shared
// helper, then the CUDA block copies its contiguous run of outputs out coalesced.
template <TileType T, int QK>
__global__ void __launch_bounds__(128)
    k_dequant_ggml(DevWeight w, const int32_t* row_ids, int64_t r0, int64_t n, void* out,
                   uint32_t block_bytes) {
  QLFT_DYNAMIC_SHARED(float, scratch);  // blockDim.x * QK floats
  const int64_t bpr = w.cols / QK;      // ggml blocks per row
  const int64_t total = n * bpr;
  for (int64_t base = int64_t(blockIdx.x) * blockDim.x; base < total;
       base += int64_t(gridDim.x) * blockDim.x) {
    const int64_t ib = base + threadIdx.x;
    if (ib < total) {
      const int64_t r = ib / bpr, jb = ib - r * bpr;
      const int64_t src = row_ids ? row_ids[r] : r0 + r;
      const uint8_t* blk = static_cast<const uint8_t*>(w.data) + (src * bpr + jb) * block_bytes;
      float* y = scratch + threadIdx.x * QK;
      switch (static_cast<GgmlType>(w.ggml_type)) {
        case GgmlType::Q4_0:
          ggml_dequant_q4_0(blk, y);
          break;
        case GgmlType::Q4_1:
          ggml_dequant_q4_1(blk, y);
          break;
        case GgmlType::Q8_0:
          ggml_dequant_q8_0(blk, y);
          break;
        case GgmlType::Q4_K:
          ggml_dequant_q4_k(blk, y);
          break;
        case GgmlType::Q5_K:
          ggml_dequant_q5_k(blk, y);
          break;
        case GgmlType::Q6_K:
          ggml_dequant_q6_k(blk, y);
          break;
        default:
          break;
      }
    }
    __syncthreads();
    const int64_t nb = min(int64_t(blockDim.x), total - base);
    for (int64_t j = threadIdx.x; j < nb * QK; j += blockDim.x)
      store<T>(out, base * QK + j, scratch[j]);
    __syncthreads();
  }
}

template <TileType T>
__global__ void __launch_bounds__(256)
    k_convert(const float* x, int64_t rows, int64_t cols, int64_t ld, void* out) {
  const int64_t total = rows * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i - r * cols;
    store<T>(out, i, x[r * ld + c]);
  }
}

// out = 16-bit values (T = BF16 / F16) widened to fp32.
template <TileType T>
__global__ void __launch_bounds__(256) k_widen(const uint16_t* x, int64_t n, float* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = T == TileType::BF16 ? bf16_to_f32(x[i]) : f16_to_f32(x[i]);
}

// out = x rounded through T (to nearest even) and back: the value a 16-bit store keeps.
template <TileType T>
__global__ void __launch_bounds__(256) k_round16(const float* x, int64_t n, float* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = T == TileType::BF16 ? bf16_to_f32(f32_to_bf16(x[i])) : f16_to_f32(f32_to_f16(x[i]));
}

__global__ void __launch_bounds__(256)
    k_add_bias(float* y, int64_t rows, int64_t cols, int64_t ld, const float* bias) {
  const int64_t total = rows * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i - r * cols;
    y[r * ld + c] += bias[c];
  }
}

__global__ void __launch_bounds__(256)
    k_dropout_apply(const float* x, int64_t rows, int64_t cols, int64_t ld, int64_t row0, float p,
                    uint64_t seed, float* out) {
  const float inv = 1.f / (1.f - p);
  const int64_t total = rows * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i - r * cols;
    out[i] = lora_dropout_keep(seed, row0 + r, c, p) ? x[r * ld + c] * inv : 0.f;
  }
}

__global__ void __launch_bounds__(256)
    k_dropout_masked_add(float* dx, int64_t ld, const float* t, int64_t rows, int64_t cols,
                         int64_t row0, float p, uint64_t seed, float scale) {
  const int64_t total = rows * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i - r * cols;
    if (lora_dropout_keep(seed, row0 + r, c, p)) dx[r * ld + c] += scale * t[i];
  }
}

__global__ void __launch_bounds__(256) k_accumulate(float* dst, const float* src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    dst[i] += src[i];
}

template <TileType T>
void dequant_typed(const DevWeight& w, const int32_t* row_ids, int64_t r0, int64_t n, void* out,
                   cudaStream_t s) {
  if (w.kind != QuantKind::GGML) {
    launch(k_dequant_elem<T>, grid_for(n * w.cols, 256), 256, 0, s, w, row_ids, r0, n, out);
    return;
  }
  const GgmlTypeTraits* tr = ggml_type_traits(w.ggml_type);
  QLFT_CHECK_ARG(tr && tr->block > 0 && w.cols % tr->block == 0,
                 "cuda dequantize: ggml type %u rows of %lld do not split into blocks", w.ggml_type,
                 static_cast<long long>(w.cols));
  switch (static_cast<GgmlType>(w.ggml_type)) {
    case GgmlType::Q4_0:
    case GgmlType::Q4_1:
    case GgmlType::Q8_0: {
      const int64_t nb = n * (w.cols / 32);
      launch(k_dequant_ggml<T, 32>, grid_for(nb, 128), 128, 128 * 32 * sizeof(float), s, w, row_ids,
             r0, n, out, tr->bytes);
      return;
    }
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
    case GgmlType::Q6_K: {
      const int64_t nb = n * (w.cols / 256);
      launch(k_dequant_ggml<T, 256>, grid_for(nb, 32), 32, 32 * 256 * sizeof(float), s, w, row_ids,
             r0, n, out, tr->bytes);
      return;
    }
    default:
      throw_error(QLFT_ERR_UNSUPPORTED, "cuda backend: GGUF type %s has no device dequantizer",
                  tr->name);
  }
}

}  // namespace

void dequant_rows(const DevWeight& w, const int32_t* row_ids, int64_t r0, int64_t n, void* out,
                  TileType t, cudaStream_t s) {
  if (n <= 0 || w.cols <= 0) return;
  switch (t) {
    case TileType::F32:
      return dequant_typed<TileType::F32>(w, row_ids, r0, n, out, s);
    case TileType::BF16:
      return dequant_typed<TileType::BF16>(w, row_ids, r0, n, out, s);
    case TileType::F16:
      return dequant_typed<TileType::F16>(w, row_ids, r0, n, out, s);
  }
}

void convert_tile(const float* x, int64_t rows, int64_t cols, int64_t ld, void* out, TileType t,
                  cudaStream_t s) {
  const unsigned g = grid_for(rows * cols, 256);
  switch (t) {
    case TileType::F32:
      return launch(k_convert<TileType::F32>, g, 256, 0, s, x, rows, cols, ld, out);
    case TileType::BF16:
      return launch(k_convert<TileType::BF16>, g, 256, 0, s, x, rows, cols, ld, out);
    case TileType::F16:
      return launch(k_convert<TileType::F16>, g, 256, 0, s, x, rows, cols, ld, out);
  }
}

void widen_tile(const void* x, TileType t, int64_t n, float* out, cudaStream_t s) {
  const uint16_t* h = static_cast<const uint16_t*>(x);
  if (t == TileType::BF16)
    return launch(k_widen<TileType::BF16>, grid_for(n, 256), 256, 0, s, h, n, out);
  launch(k_widen<TileType::F16>, grid_for(n, 256), 256, 0, s, h, n, out);
}

void round_through(const float* x, int64_t n, TileType t, float* out, cudaStream_t s) {
  if (t == TileType::BF16)
    return launch(k_round16<TileType::BF16>, grid_for(n, 256), 256, 0, s, x, n, out);
  launch(k_round16<TileType::F16>, grid_for(n, 256), 256, 0, s, x, n, out);
}

void add_bias(float* y, int64_t rows, int64_t cols, int64_t ld, const float* bias, cudaStream_t s) {
  launch(k_add_bias, grid_for(rows * cols, 256), 256, 0, s, y, rows, cols, ld, bias);
}

void dropout_apply(const float* x, int64_t rows, int64_t cols, int64_t ld, int64_t row0, float p,
                   uint64_t seed, float* out, cudaStream_t s) {
  launch(k_dropout_apply, grid_for(rows * cols, 256), 256, 0, s, x, rows, cols, ld, row0, p, seed,
         out);
}

void dropout_masked_add(float* dx, int64_t ld, const float* t, int64_t rows, int64_t cols,
                        int64_t row0, float p, uint64_t seed, float scale, cudaStream_t s) {
  launch(k_dropout_masked_add, grid_for(rows * cols, 256), 256, 0, s, dx, ld, t, rows, cols, row0,
         p, seed, scale);
}

void accumulate(float* dst, const float* src, int64_t n, cudaStream_t s) {
  launch(k_accumulate, grid_for(n, 256), 256, 0, s, dst, src, n);
}

}  // namespace qlft::cu
