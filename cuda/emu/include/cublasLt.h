// The cuBLASLt subset qlft's GEMM wrapper (cuda/src/gemm.cu) calls, served by a host GEMM
// (cuda/emu/src/cublaslt.cpp) that honours every attribute it accepts and answers
// CUBLAS_STATUS_NOT_SUPPORTED for anything else. Enum values mirror CUDA 13's cublasLt.h.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

enum cublasStatus_t {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_ALLOC_FAILED = 3,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_ARCH_MISMATCH = 8,
  CUBLAS_STATUS_MAPPING_ERROR = 11,
  CUBLAS_STATUS_EXECUTION_FAILED = 13,
  CUBLAS_STATUS_INTERNAL_ERROR = 14,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
  CUBLAS_STATUS_LICENSE_ERROR = 16
};

enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 };

enum cublasComputeType_t {
  CUBLAS_COMPUTE_16F = 64,
  CUBLAS_COMPUTE_32F = 68,
  CUBLAS_COMPUTE_32F_PEDANTIC = 69,
  CUBLAS_COMPUTE_32F_FAST_16F = 74,
  CUBLAS_COMPUTE_32F_FAST_16BF = 75,
  CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
  CUBLAS_COMPUTE_64F = 70
};

enum cublasLtMatmulDescAttributes_t {
  CUBLASLT_MATMUL_DESC_COMPUTE_TYPE = 0,
  CUBLASLT_MATMUL_DESC_SCALE_TYPE = 1,
  CUBLASLT_MATMUL_DESC_POINTER_MODE = 2,
  CUBLASLT_MATMUL_DESC_TRANSA = 3,
  CUBLASLT_MATMUL_DESC_TRANSB = 4,
  CUBLASLT_MATMUL_DESC_TRANSC = 5,
  CUBLASLT_MATMUL_DESC_EPILOGUE = 7
};

enum cublasLtMatmulPreferenceAttributes_t {
  CUBLASLT_MATMUL_PREF_SEARCH_MODE = 0,
  CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8
};

struct qlft_emu_lt_handle;
struct qlft_emu_lt_desc;
struct qlft_emu_lt_layout;
struct qlft_emu_lt_pref;
typedef qlft_emu_lt_handle* cublasLtHandle_t;
typedef qlft_emu_lt_desc* cublasLtMatmulDesc_t;
typedef qlft_emu_lt_layout* cublasLtMatrixLayout_t;
typedef qlft_emu_lt_pref* cublasLtMatmulPreference_t;

struct cublasLtMatmulAlgo_t {
  uint64_t data[8];
};

struct cublasLtMatmulHeuristicResult_t {
  cublasLtMatmulAlgo_t algo;
  size_t workspaceSize;
  cublasStatus_t state;
  float wavesCount;
  int reserved[4];
};

cublasStatus_t cublasLtCreate(cublasLtHandle_t* h);
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h);
const char* cublasLtGetStatusString(cublasStatus_t s);
const char* cublasLtGetStatusName(cublasStatus_t s);
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t compute,
                                        cudaDataType_t scale);
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d);
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d,
                                              cublasLtMatmulDescAttributes_t a, const void* buf,
                                              size_t size);
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld);
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l);
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p);
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p);
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t a,
                                                    const void* buf, size_t size);
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t op,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t* results,
                                              int* returned);
cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t op, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t Adesc, const void* B,
                              cublasLtMatrixLayout_t Bdesc, const void* beta, const void* C,
                              cublasLtMatrixLayout_t Cdesc, void* D, cublasLtMatrixLayout_t Ddesc,
                              const cublasLtMatmulAlgo_t* algo, void* workspace,
                              size_t workspace_bytes, cudaStream_t stream);
