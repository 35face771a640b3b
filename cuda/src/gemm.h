// Row-major GEMMs through cuBLASLt: C[M, N] = alpha * op(A) op(B) + beta * C with fp32
// accumulation (CUBLAS_COMPUTE_32F: no TF32), A and B both fp32, bf16 or fp16; C fp32, or of
// A and B's 16-bit type (the fp32 result rounded to nearest even in cuBLASLt's epilogue: a
// GEMM that writes the bf16 operand its consumer reads, with no conversion kernel after it).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <array>
#include <map>
#include <memory>

#include "backend/cuda_entry.h"
#include "kernels.h"

namespace qlft::cu {

struct GemmOperand {
  const void* ptr;
  TileType type;
  int64_t ld;  // row-major leading dimension (elements)
  bool trans;  // use the transpose of the stored matrix
};

class LtGemm {
 public:
  // tf32: fp32 operands multiply on TF32 tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32).
  LtGemm(MemoryTracker* tracker, cudaStream_t stream, bool tf32 = false);
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // op(A) is [M, K], op(B) is [K, N]; C is [M, N] fp32 with leading dimension ldc.
  void run(int64_t M, int64_t N, int64_t K, float alpha, const GemmOperand& A, const GemmOperand& B,
           float beta, float* C, int64_t ldc) {
    run(M, N, K, alpha, A, B, beta, C, TileType::F32, ldc);
  }
  // C of type ct: F32, or A and B's type when that is 16-bit (C read in it when beta != 0).
  void run(int64_t M, int64_t N, int64_t K, float alpha, const GemmOperand& A, const GemmOperand& B,
           float beta, void* C, TileType ct, int64_t ldc);

 private:
  // The descriptors and the heuristic's algorithm of one GEMM shape (sizes, types, transposes,
  // leading dimensions and pointer alignments), made on its first use and reused: asking the
  // heuristic costs more host time than launching the GEMM.
  struct Plan;
  using PlanKey = std::array<int64_t, 13>;
  std::unique_ptr<Plan> make_plan(int64_t M, int64_t N, int64_t K, const GemmOperand& A,
                                  const GemmOperand& B, TileType ct, int64_t ldc, uint32_t al_a,
                                  uint32_t al_b, uint32_t al_c);

  cublasLtHandle_t handle_ = nullptr;
  cudaStream_t stream_;
  bool tf32_;
  DeviceMemory workspace_;
  std::map<PlanKey, std::unique_ptr<Plan>> plans_;
};

}  // namespace qlft::cu
