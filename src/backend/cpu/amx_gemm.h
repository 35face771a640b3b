// A bf16 GEMM on AMX tiles, for attention's tile products (cpu_attention_amx.cpp), with an
// emulated execution mode that runs the same blocking on any CPU.
//
// Why not oneDNN: at attention's shapes (M 128 query rows, K 64 or a few hundred keys) oneDNN's
// AMX matmul repacks B on every call and costs tens of microseconds a call on an Emerald Rapids
// host (session 17: the bf16 attention ran at about a quarter of the GEMM peak). Here the caller
// packs B once per head, in the VNNI pair layout the tiles read, and reuses it for every query
// block.
//
// Emulated: each tile instruction done in C++ after the Intel SDM's pseudocode (TDPBF16PS: the
// two products of a pair added to the fp32 accumulator one after the other, bf16 inputs
// subnormal-as-zero, fp32 results flushed). The blocking, the packing, the causal skipping and the
// tile offsets are the hardware path's own code: only the six tile operations differ, so the test
// suite checks the kernel's logic on CPUs without AMX.
#pragma once

#include <cstdint>

namespace qlft::cpu {

enum class AmxExec : uint8_t { Hardware, Emulated };

// True when cpu_isa() is Amx (AMX-BF16 tiles, the OS's permission given).
bool amx_hardware();

// Which parts of C = A B a call computes, for causal tiles: row i of the attention tile sees
// columns (keys) up to d + i.
//  ColsUpToRow (S = Q K^T, dP = dO V^T; C [rows, keys]): 32 x 32 blocks of C whose first column
//    is past d + their last row are not computed (left as they were).
//  KUpToRow (P V, dS K; K runs over keys): block row r0 sums k < d + its last row + 1 only (the
//    operands are 0 past it), rounded up to the k step.
//  KFromCol (dK^T = Q^T dS, dV^T = dO^T P; K runs over query rows, C [dims, keys]): block column
//    c0 sums k >= c0 - d only, rounded down to the k step.
struct AmxCausal {
  enum Kind : uint8_t { None, ColsUpToRow, KUpToRow, KFromCol } kind = None;
  int64_t d = 0;
};

// The k step of one tile product: 32 bf16 values (a tile row's 64 bytes); also the side of the
// blocks of C (2 x 2 tiles of 16) that AmxCausal skips.
constexpr int64_t kAmxK = 32;

// x rounded up to a multiple of kAmxK: how callers pad every dimension the tiles step over (0 for
// x <= 0).
inline int64_t amx_pad(int64_t x) {
  return x <= 0 ? 0 : (x + kAmxK - 1) / kAmxK * kAmxK;
}

// B's VNNI pair layout: element (k, n) of a [K, N] operand at b[(k / 2) * ldb + 2 n + k % 2].
inline int64_t amx_vnni_at(int64_t k, int64_t n, int64_t ldb) {
  return (k / 2) * ldb + 2 * n + (k & 1);
}

// C[M, N] = A B (accumulate: C += A B). A: bf16 bits row-major, row stride lda elements. B: bf16
// bits in the VNNI pair layout above, ldb elements per pair row (at least 2N). C: fp32 row-major,
// row stride ldc. M and N multiples of 16, K a multiple of kAmxK. A block of C that `causal`
// leaves without any k is written 0 (not accumulate) or left as it was.
// Hardware: the calling thread's tiles (configured, then released); throws QLFT_ERR_UNSUPPORTED
// where amx_hardware() is false.
void amx_gemm_bf16(AmxExec ex, int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda,
                   const uint16_t* B, int64_t ldb, float* C, int64_t ldc, bool accumulate,
                   AmxCausal causal = {});

}  // namespace qlft::cpu
