// The AMX attention path's padded geometry and scratch sizes (cpu_attention_amx.cpp), in one
// place for its kernels and the memory planner's workspace model.
#pragma once

#include <cstddef>
#include <cstdint>

namespace qlft::cpu {

struct AmxAttnGeometry {
  int64_t Tp = 0;   // rows of a head's packed operands: seq rounded up to 32, plus 32 when the
                    // query block is not a multiple of 32 (a tile's padded rows stay inside)
  int64_t Dp = 0;   // head_dim rounded up to 32 (a tile row's k step)
  int64_t nqp = 0;  // rows of a tile's buffers: the query block rounded up to 32
  int64_t heads = 0, kv_heads = 0, batch = 0;
  int64_t q_blocks = 0;  // query blocks per head

  // Threads of each direction's parallel region, out of `threads`: the forward's tasks (one per
  // query block of a head) or packs (one per head), the backward's tasks (one per KV head).
  int fwd_team(int threads) const;
  int bwd_team(int threads) const;

  // Forward: Q as rows, K^T and V in the tiles' pair layout, for every head (one buffer).
  size_t fwd_operands() const;
  // Forward, per thread: the fp32 scores (at least a head's rows, the packing's staging), the
  // bf16 probabilities, the fp32 output tile.
  size_t fwd_thread() const;
  // Backward, per thread: one KV head's K^T, V^T, K packs and one head's Q, dO rows and
  // transposes; P and dS in fp32, bf16 and pair layouts; D; the dQ tile; dK^T and dV^T.
  size_t bwd_thread() const;
};

AmxAttnGeometry amx_attn_geometry(int batch, int seq, int n_heads, int n_kv_heads, int head_dim,
                                  int64_t block_q);

}  // namespace qlft::cpu
