// bf16 x bf16 -> fp32 GEMM for the CPU backend, through oneDNN's matmul (brgemm kernels with
// AVX512-BF16 dot products, or AMX where the CPU has it). Products are exact in fp32 and sums
// accumulate in fp32, so the result equals an fp32 GEMM of the bf16 values up to summation
// order.
//
// Primitives are created once per (shape, strides, transposes, alpha, beta) and cached: creating
// one costs far more than running a small GEMM, and per team size. Threads: qlft::num_threads()
// of the calling OS thread (the runtime's), given to oneDNN as that thread's OpenMP ICV for the
// call and restored after; called inside a parallel region it runs on one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/memory.h"

namespace qlft::cpu {

// C[M, N] = alpha * op(A) op(B) + beta * C, all row-major. A and B hold bf16 bit patterns
// (uint16_t, as core/half.h's f32_to_bf16 makes them). op(A) is [M, K]: A is [M, K] with row
// stride lda, or with trans_a [K, M] with row stride lda; likewise op(B) is [K, N] (trans_b: B is
// [N, K]). C is fp32 [M, N] with row stride ldc; beta = 0 ignores C's old contents (NaN too).
// oneDNN's scratchpad: `scratchpad` when given (at least gemm_bf16_scratchpad_size() bytes of
// caller memory, for callers that keep it between calls), else a Workspace Buffer from tracker
// for this call (tracker nullptr: uncounted).
// Throws: QLFT_ERR_INVALID_ARGUMENT for bad sizes/strides, QLFT_ERR_BACKEND for a oneDNN failure
// (the message carries oneDNN's status and text).
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C,
               int64_t ldc, MemoryTracker* tracker = nullptr, void* scratchpad = nullptr);

// gemm_bf16 with beta 0 and C written as bf16 bit patterns [M, N] (row stride ldc): oneDNN rounds
// the fp32 accumulation to nearest even in its kernel (VCVTNEPS2BF16, which flushes subnormal
// results to zero, unlike f32_to_bf16), so a GEMM whose output only enters bf16 operands needs no
// fp32 output and no rounding pass. The sums are fp32 as gemm_bf16's, possibly in another order.
void gemm_bf16_out16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                     const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb, uint16_t* C,
                     int64_t ldc, MemoryTracker* tracker = nullptr, void* scratchpad = nullptr);
size_t gemm_bf16_out16_scratchpad_size(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                                       int64_t lda, int64_t ldb, int64_t ldc, float alpha = 1.f);

// The same GEMM on fp32 A and B through oneDNN's fp32 matmul (brgemm). On AVX-512 CPUs it beats
// OpenBLAS sgemm on the x W^T shapes of the linear layers (see CpuTuning::f32_xwt_onednn).
// Its scratchpad is oneDNN's own (uncounted, like OpenBLAS's packing buffers), so the scratchpad
// size is 0 and `scratchpad` is ignored.
void gemm_f32_onednn(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                     const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                     int64_t ldc, MemoryTracker* tracker = nullptr, void* scratchpad = nullptr);
size_t gemm_f32_onednn_scratchpad_size(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                                       int64_t lda, int64_t ldb, int64_t ldc, float alpha,
                                       float beta);

// The same fp32 GEMM through oneDNN's BLAS-like dnnl_sgemm (its gemm:jit kernels, chosen from
// CPUID features; no primitive to create or cache, so any shape costs nothing extra). Threads: the
// calling thread's OpenMP ICV, one inside a parallel region. CpuTuning::f32_blas says when sgemm()
// uses it. Throws QLFT_ERR_BACKEND for a oneDNN failure.
void sgemm_onednn(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                  const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                  int64_t ldc);

// Bytes of oneDNN scratchpad that gemm_bf16 needs for this shape (creates and caches the
// primitive; 0 for an empty GEMM).
size_t gemm_bf16_scratchpad_size(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                                 int64_t lda, int64_t ldb, int64_t ldc, float alpha, float beta);

// True when the CPU runs bf16 dot products natively (AVX512-BF16 or AMX). Without them oneDNN
// still computes the same values, much more slowly; callers then keep the fp32 path.
bool gemm_bf16_native();

// True when oneDNN has a bf16 matmul on this CPU at all (oneDNN 2.x: AVX-512 or better; none on
// an AVX2-only CPU such as a Zen 3, nor under QLFT_CPU_ISA=avx2). gemm_bf16 throws
// QLFT_ERR_UNSUPPORTED saying so where it is false.
bool gemm_bf16_available();

// oneDNN's name for the kernel it picked for this GEMM shape (e.g. "brg:avx512_core_bf16"), for
// benchmarks and tests. Creates (and caches) the primitive.
std::string gemm_bf16_impl(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, int64_t lda,
                           int64_t ldb, int64_t ldc, float alpha = 1.f, float beta = 0.f);

// Number of cached primitives (tests) and dropping them all (frees their memory).
size_t gemm_bf16_cache_size();
void gemm_bf16_clear_cache();

}  // namespace qlft::cpu
