// cuBLASLt wrapper. cuBLASLt is column-major: a row-major [R, C] matrix with leading dimension ld
// is the column-major [C, R] matrix with the same ld, so row-major C = op(A) op(B) is computed as
// column-major C^T = op(B)^T op(A)^T (B passed first). Every cuBLASLt call is checked.
#include <cstdint>

#include "backend/cuda_sizes.h"
#include "check.h"
#include "gemm.h"

namespace qlft::cu {

namespace {

constexpr size_t kWorkspaceBytes = kCudaLtWorkspaceBytes;  // (the planner predicts with it)
constexpr size_t kMaxPlans = 4096;

cudaDataType_t data_type(TileType t) {
  switch (t) {
    case TileType::F32:
      return CUDA_R_32F;
    case TileType::BF16:
      return CUDA_R_16BF;
    case TileType::F16:
      return CUDA_R_16F;
  }
  return CUDA_R_32F;
}

// Largest power of two (<= 256) dividing the address: cuBLASLt's heuristics assume 256-byte
// aligned pointers unless told otherwise, and panels start at arbitrary offsets.
uint32_t alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && (a % al) != 0) al >>= 1;
  return al;
}

// Destroys cuBLASLt descriptors on every path (checked calls may throw in between).
struct Descs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Descs() {
    if (pref) QLFT_CUBLAS_WARN(cublasLtMatmulPreferenceDestroy(pref));
    if (c) QLFT_CUBLAS_WARN(cublasLtMatrixLayoutDestroy(c));
    if (b) QLFT_CUBLAS_WARN(cublasLtMatrixLayoutDestroy(b));
    if (a) QLFT_CUBLAS_WARN(cublasLtMatrixLayoutDestroy(a));
    if (op) QLFT_CUBLAS_WARN(cublasLtMatmulDescDestroy(op));
  }
};

}  // namespace

struct LtGemm::Plan {
  Descs d;
  cublasLtMatmulAlgo_t algo{};
};

LtGemm::LtGemm(MemoryTracker* tracker, cudaStream_t stream, bool tf32)
    : stream_(stream),
      tf32_(tf32),
      workspace_(tracker, MemCategory::Workspace, kWorkspaceBytes, "cuBLASLt workspace") {
  QLFT_CUBLAS_CHECK(cublasLtCreate(&handle_));
}

LtGemm::~LtGemm() {
  plans_.clear();
  if (handle_) QLFT_CUBLAS_WARN(cublasLtDestroy(handle_));
}

void LtGemm::run(int64_t M, int64_t N, int64_t K, float alpha, const GemmOperand& A,
                 const GemmOperand& B, float beta, void* C, TileType ct, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  QLFT_CHECK_ARG(A.type == B.type, "cuda gemm: operand types differ");
  QLFT_CHECK_ARG(ct == TileType::F32 || ct == A.type,
                 "cuda gemm: a 16-bit C must have the operands' type");
  if (K <= 0) {  // C = beta * C
    QLFT_CHECK_ARG(beta == 0.f || beta == 1.f, "cuda gemm: empty K needs beta 0 or 1");
    const size_t eb = tile_elem_bytes(ct);
    if (beta == 0.f)
      QLFT_CUDA_CHECK(
          cudaMemset2DAsync(C, size_t(ldc) * eb, 0, size_t(N) * eb, size_t(M), stream_));
    return;
  }
  const uint32_t al_a = alignment(B.ptr), al_b = alignment(A.ptr), al_c = alignment(C);
  const PlanKey key = {M,    N,    K,    int64_t(A.type), A.trans, B.trans, A.ld, B.ld, ldc,
                       al_a, al_b, al_c, int64_t(ct)};
  auto it = plans_.find(key);
  if (it == plans_.end() && plans_.size() >= kMaxPlans) plans_.clear();  // (generation: M grows)
  if (it == plans_.end())
    it = plans_.emplace(key, make_plan(M, N, K, A, B, ct, ldc, al_a, al_b, al_c)).first;
  const Plan& p = *it->second;
  count_library_launch("cublasLtMatmul", graph_capturing(stream_));
  QLFT_CUBLAS_CHECK(cublasLtMatmul(handle_, p.d.op, &alpha, B.ptr, p.d.a, A.ptr, p.d.b, &beta, C,
                                   p.d.c, C, p.d.c, &p.algo, workspace_.data(), workspace_.size(),
                                   stream_));
}

std::unique_ptr<LtGemm::Plan> LtGemm::make_plan(int64_t M, int64_t N, int64_t K,
                                                const GemmOperand& A, const GemmOperand& B,
                                                TileType ct, int64_t ldc, uint32_t al_a,
                                                uint32_t al_b, uint32_t al_c) {
  const cudaDataType_t dt = data_type(A.type);
  auto plan = std::make_unique<Plan>();
  Descs& d = plan->d;
  const cublasComputeType_t compute =
      tf32_ && A.type == TileType::F32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  QLFT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&d.op, compute, CUDA_R_32F));
  // First operand: our B (op(B)^T is [N, K]); second: our A (op(A)^T is [K, M]).
  const cublasOperation_t opa = B.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t opb = A.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  QLFT_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
  QLFT_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
  QLFT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.a, dt, B.trans ? K : N, B.trans ? N : K, B.ld));
  QLFT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.b, dt, A.trans ? M : K, A.trans ? K : M, A.ld));
  QLFT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.c, data_type(ct), N, M, ldc));

  QLFT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&d.pref));
  const uint64_t ws = workspace_.size();
  QLFT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  QLFT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a));
  QLFT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b));
  QLFT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c));
  QLFT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof al_c));

  cublasLtMatmulHeuristicResult_t h{};
  int found = 0;
  // clang-format off
  QLFT_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(handle_, d.op, d.a, d.b, d.c, d.c, d.pref, 1, &h, &found));
  // clang-format on
  if (found == 0)
    throw_error(QLFT_ERR_BACKEND, "cuBLASLt has no algorithm for a %lldx%lldx%lld GEMM",
                static_cast<long long>(M), static_cast<long long>(N), static_cast<long long>(K));
  plan->algo = h.algo;
  return plan;
}

}  // namespace qlft::cu
