// cuBLASLt served by a host GEMM. What it accepts it honours: operand types (fp32, bf16, fp16
// in; fp32 out, or C / D of the operands' 16-bit type), transposes of A and B, leading
// dimensions, alpha/beta (host scalars), compute type 32F (no TF32), the caller's
// minimum-alignment promises (checked against the pointers at
// matmul time, since a real algorithm chosen for them may fault otherwise) and the workspace
// limit. Anything else is CUBLAS_STATUS_NOT_SUPPORTED (or INVALID_VALUE for bad values).
// Accumulation is in double, then rounded once: cuBLASLt sums fp32 products in an
// algorithm-dependent order, so a GPU result differs by O(sqrt(K) * eps_fp32) relative. A 16-bit
// D is that fp32 result (alpha * sum + beta * C in the fp32 epilogue) rounded to nearest even,
// as cuBLASLt's epilogue converts it: subnormals kept, NaN stays NaN, overflow goes to inf.
#include <cublasLt.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "emu_internal.h"

struct qlft_emu_lt_handle {
  int magic = 0x4c54;
};
struct qlft_emu_lt_desc {
  cublasComputeType_t compute;
  cudaDataType_t scale;
  int32_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N;
};
struct qlft_emu_lt_layout {
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
};
struct qlft_emu_lt_pref {
  uint64_t max_ws = 0;
  uint32_t align[4] = {256, 256, 256, 256};  // A, B, C, D: cuBLASLt's default assumption
};

namespace {

cublasStatus_t refuse(cublasStatus_t s, const std::string& why) {
  std::fprintf(stderr, "qlft CUDA emulator: cuBLASLt %s: %s\n", cublasLtGetStatusName(s),
               why.c_str());
  return s;
}

size_t elem_bytes(cudaDataType_t t) {
  return t == CUDA_R_32F ? 4 : 2;
}

// fp32 rounded to TF32 (10 mantissa bits, to nearest even): what the tensor cores multiply
// under CUBLAS_COMPUTE_32F_FAST_TF32. Inf and NaN pass unchanged.
float to_tf32(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0xfffu + ((u >> 13) & 1u)) & ~0x1fffu;
  std::memcpy(&x, &u, 4);
  return x;
}

// A 16-bit operand widened to fp32 (exact; the emulator keeps its own decoding rather than the
// library's, so the GEMM reference does not share code with what it checks): bf16 is the top half
// of an fp32; an IEEE half is (1024 + m) * 2^(e - 25), a subnormal m * 2^-24, e = 31 inf or NaN.
float widen16(uint16_t h, bool bf16) {
  uint32_t u = uint32_t(h) << 16;
  float v;
  if (bf16) {
    std::memcpy(&v, &u, 4);
    return v;
  }
  const int e = (h >> 10) & 31, m = h & 1023;
  if (e == 31) {  // the payload kept, NaN made quiet
    u = 0x7f800000u | (m ? 0x400000u | (uint32_t(m) << 13) : 0u);
    std::memcpy(&v, &u, 4);
  } else {
    v = e == 0 ? std::ldexp(float(m), -24) : std::ldexp(float(1024 + m), e - 25);
  }
  return (h & 0x8000) ? -v : v;
}

// fp32 to a 16-bit type, rounded to nearest even (the inverse of widen16, written out
// independently of the library's conversions). bf16: the top half of the fp32 after adding the
// rounding bias; NaN kept quiet with its sign. IEEE half: exponent rebased, the mantissa rounded
// at its 10th bit (or at the subnormal's position), carries rippling into the exponent.
uint16_t narrow16(float v, bool bf16) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  if (bf16) {
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);
    return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint16_t(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // >= 65520: rounds to inf
  if (a < 0x38800000u) {  // below 2^-14: a subnormal half, m * 2^-24
    const float m = std::nearbyint(std::fabs(v) * 16777216.f);  // exact, ties to even
    return uint16_t(sign | uint16_t(m));
  }
  const uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
  return uint16_t(sign | (((r >> 13) - (112u << 10)) & 0x7fffu));
}

float load(const void* p, cudaDataType_t t, size_t i) {
  if (t == CUDA_R_32F) return static_cast<const float*>(p)[i];
  const uint16_t h = static_cast<const uint16_t*>(p)[i];
  return widen16(h, t == CUDA_R_16BF);
}

// The problem an algorithm was chosen for, checked again at matmul time.
struct Problem {
  uint64_t m, n, k;
  int32_t ta, tb;
  int32_t type;
};

cublasStatus_t problem(const qlft_emu_lt_desc* op, const qlft_emu_lt_layout* a,
                       const qlft_emu_lt_layout* b, const qlft_emu_lt_layout* c,
                       const qlft_emu_lt_layout* d, Problem* pr) {
  if (!op || !a || !b || !c || !d) return refuse(CUBLAS_STATUS_INVALID_VALUE, "null descriptor");
  if (op->compute != CUBLAS_COMPUTE_32F && op->compute != CUBLAS_COMPUTE_32F_PEDANTIC &&
      op->compute != CUBLAS_COMPUTE_32F_FAST_TF32)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "compute type " + std::to_string(op->compute));
  if (op->scale != CUDA_R_32F) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "scale type");
  if (a->type != b->type) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "A and B types differ");
  if (a->type != CUDA_R_32F && a->type != CUDA_R_16F && a->type != CUDA_R_16BF)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "A/B type");
  // C and D of one type: fp32, or the 16-bit operand type (bf16 / fp16 in, same out).
  if (c->type != d->type || (d->type != CUDA_R_32F && d->type != a->type))
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "C/D type: fp32, or that of 16-bit A and B (C " +
                                                   std::to_string(int(c->type)) + ", D " +
                                                   std::to_string(int(d->type)) + ", A/B " +
                                                   std::to_string(int(a->type)) + ")");
  if (c->rows != d->rows || c->cols != d->cols || c->ld != d->ld)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "C and D layouts differ");
  const uint64_t m = op->transa == CUBLAS_OP_N ? a->rows : a->cols;
  const uint64_t ka = op->transa == CUBLAS_OP_N ? a->cols : a->rows;
  const uint64_t kb = op->transb == CUBLAS_OP_N ? b->rows : b->cols;
  const uint64_t n = op->transb == CUBLAS_OP_N ? b->cols : b->rows;
  if (ka != kb || m != c->rows || n != c->cols)
    return refuse(CUBLAS_STATUS_INVALID_VALUE,
                  "shapes: op(A) " + std::to_string(m) + "x" + std::to_string(ka) + ", op(B) " +
                      std::to_string(kb) + "x" + std::to_string(n) + ", C " +
                      std::to_string(c->rows) + "x" + std::to_string(c->cols));
  *pr = Problem{m, n, ka, op->transa, op->transb, int32_t(a->type)};
  return CUBLAS_STATUS_SUCCESS;
}

size_t extent(const qlft_emu_lt_layout* l) {
  return (size_t(l->ld) * (l->cols - 1) + l->rows) * elem_bytes(l->type);
}

}  // namespace

cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) {
  if (!h) return CUBLAS_STATUS_INVALID_VALUE;
  *h = new qlft_emu_lt_handle;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasLtGetStatusName(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}
const char* cublasLtGetStatusString(cublasStatus_t s) {
  return cublasLtGetStatusName(s);
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
  if (!d) return CUBLAS_STATUS_INVALID_VALUE;
  *d = new qlft_emu_lt_desc{compute, scale};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
  delete d;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d,
                                              cublasLtMatmulDescAttributes_t a, const void* buf,
                                              size_t size) {
  if (!d || !buf) return CUBLAS_STATUS_INVALID_VALUE;
  int32_t v = 0;
  if (size != sizeof v) return refuse(CUBLAS_STATUS_INVALID_VALUE, "attribute size");
  std::memcpy(&v, buf, sizeof v);
  switch (a) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
    case CUBLASLT_MATMUL_DESC_TRANSB:
      if (v != CUBLAS_OP_N && v != CUBLAS_OP_T)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "transpose mode " + std::to_string(v));
      (a == CUBLASLT_MATMUL_DESC_TRANSA ? d->transa : d->transb) = v;
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE:
      d->compute = cublasComputeType_t(v);
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE:
      d->scale = cudaDataType_t(v);
      return CUBLAS_STATUS_SUCCESS;
    default:
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                    "matmul descriptor attribute " + std::to_string(int(a)) + " not emulated");
  }
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  if (!l) return CUBLAS_STATUS_INVALID_VALUE;
  if (type != CUDA_R_32F && type != CUDA_R_16F && type != CUDA_R_16BF)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "layout type " + std::to_string(int(type)));
  if (rows == 0 || cols == 0 || ld < int64_t(rows))
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "layout " + std::to_string(rows) + "x" +
                                                   std::to_string(cols) + " ld " +
                                                   std::to_string(ld));
  *l = new qlft_emu_lt_layout{type, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
  delete l;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) {
  if (!p) return CUBLAS_STATUS_INVALID_VALUE;
  *p = new qlft_emu_lt_pref;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
  delete p;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t a,
                                                    const void* buf, size_t size) {
  if (!p || !buf) return CUBLAS_STATUS_INVALID_VALUE;
  if (a == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) {
    if (size != sizeof(uint64_t)) return refuse(CUBLAS_STATUS_INVALID_VALUE, "workspace size");
    std::memcpy(&p->max_ws, buf, size);
    return CUBLAS_STATUS_SUCCESS;
  }
  if (a >= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES &&
      a <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES) {
    uint32_t v;
    if (size != sizeof v) return refuse(CUBLAS_STATUS_INVALID_VALUE, "alignment size");
    std::memcpy(&v, buf, size);
    if (v == 0 || (v & (v - 1))) return refuse(CUBLAS_STATUS_INVALID_VALUE, "alignment");
    p->align[a - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES] = v;
    return CUBLAS_STATUS_SUCCESS;
  }
  return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                "preference attribute " + std::to_string(int(a)) + " not emulated");
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t op,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t* results,
                                              int* returned) {
  if (!h || !pref || !results || !returned || requested < 1) return CUBLAS_STATUS_INVALID_VALUE;
  *returned = 0;
  Problem pr;
  const cublasStatus_t s = problem(op, a, b, c, d, &pr);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  std::memset(&results[0], 0, sizeof results[0]);
  // The "algorithm" remembers its problem and the alignments it was chosen under.
  results[0].algo.data[0] = pr.m;
  results[0].algo.data[1] = pr.n;
  results[0].algo.data[2] = pr.k;
  results[0].algo.data[3] = uint64_t(pr.ta) | uint64_t(pr.tb) << 8 | uint64_t(pr.type) << 16;
  results[0].algo.data[4] = uint64_t(pref->align[0]) | uint64_t(pref->align[1]) << 16 |
                            uint64_t(pref->align[2]) << 32 | uint64_t(pref->align[3]) << 48;
  results[0].algo.data[5] = 0x51464c54;  // "QLFT": made here
  results[0].workspaceSize = 0;
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].wavesCount = 1.f;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t op, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t Ad, const void* B,
                              cublasLtMatrixLayout_t Bd, const void* beta, const void* C,
                              cublasLtMatrixLayout_t Cd, void* D, cublasLtMatrixLayout_t Dd,
                              const cublasLtMatmulAlgo_t* algo, void* workspace,
                              size_t workspace_bytes, cudaStream_t stream) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!alpha || !beta || !A || !B || !D) return CUBLAS_STATUS_INVALID_VALUE;
  Problem pr;
  cublasStatus_t s = problem(op, Ad, Bd, Cd, Dd, &pr);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  if (algo) {
    if (algo->data[5] != 0x51464c54 || algo->data[0] != pr.m || algo->data[1] != pr.n ||
        algo->data[2] != pr.k ||
        algo->data[3] != (uint64_t(pr.ta) | uint64_t(pr.tb) << 8 | uint64_t(pr.type) << 16))
      return refuse(CUBLAS_STATUS_INVALID_VALUE, "algorithm was chosen for another problem");
    const void* ptrs[4] = {A, B, C ? C : D, D};
    for (int i = 0; i < 4; ++i) {
      const uint64_t al = (algo->data[4] >> (16 * i)) & 0xffff;
      if (reinterpret_cast<uintptr_t>(ptrs[i]) % al != 0)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, std::string("operand ") + "ABCD"[i] +
                                                       " is not aligned to the promised " +
                                                       std::to_string(al) + " bytes");
    }
  }
  std::lock_guard<std::recursive_mutex> g(qlft_emu::device_lock());
  const std::string ea = qlft_emu::check_device_range(A, extent(Ad));
  const std::string eb = qlft_emu::check_device_range(B, extent(Bd));
  const std::string ed = qlft_emu::check_device_range(D, extent(Dd));
  const std::string ec = C ? qlft_emu::check_device_range(C, extent(Cd)) : "";
  if (!ea.empty() || !eb.empty() || !ec.empty() || !ed.empty())
    return refuse(CUBLAS_STATUS_INVALID_VALUE,
                  "operands must be live device ranges: A " + (ea.empty() ? "ok" : ea) + "; B " +
                      (eb.empty() ? "ok" : eb) + "; C " + (ec.empty() ? "ok" : ec) + "; D " +
                      (ed.empty() ? "ok" : ed));
  if (workspace_bytes > 0 && !qlft_emu::check_device_range(workspace, workspace_bytes).empty())
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "workspace is not a live device range");
  // Under capture the matmul is recorded with copies of its descriptors and of alpha / beta
  // (host scalars, read when the call is made), re-issued on the replaying stream.
  cudaError_t ce = cudaSuccess;
  const float cap_al = *static_cast<const float*>(alpha), cap_be = *static_cast<const float*>(beta);
  if (qlft_emu::captured(
          stream, qlft_emu::Api::Matmul, nullptr,
          [h, o = *op, a = *Ad, b = *Bd, c = Cd ? *Cd : *Dd, d = *Dd, cap_al, cap_be, A, B, C, D,
           workspace, workspace_bytes](cudaStream_t r) mutable {
            const cublasStatus_t st = cublasLtMatmul(h, &o, &cap_al, A, &a, B, &b, &cap_be, C, &c,
                                                     D, &d, nullptr, workspace, workspace_bytes, r);
            return st == CUBLAS_STATUS_SUCCESS ? cudaSuccess : cudaErrorLaunchFailure;
          },
          &ce))
    return ce == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
  qlft_emu::count_api(stream, qlft_emu::Api::Matmul);
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  qlft_emu::DeviceOpen open;
  const cudaDataType_t t = Ad->type;
  const bool tf32 = op->compute == CUBLAS_COMPUTE_32F_FAST_TF32 && t == CUDA_R_32F;
  auto in = [&](const void* p, size_t i) { return tf32 ? to_tf32(load(p, t, i)) : load(p, t, i); };
  std::vector<float> out(pr.m * pr.n);
  for (uint64_t j = 0; j < pr.n; ++j)
    for (uint64_t i = 0; i < pr.m; ++i) {
      double acc = 0;
      for (uint64_t p = 0; p < pr.k; ++p) {
        const size_t ia = pr.ta == CUBLAS_OP_N ? i + p * Ad->ld : p + i * Ad->ld;
        const size_t ib = pr.tb == CUBLAS_OP_N ? p + j * Bd->ld : j + p * Bd->ld;
        acc += double(in(A, ia)) * double(in(B, ib));
      }
      double r = double(al) * acc;
      // beta == 0: C is not read (it may hold NaN), as in BLAS.
      if (be != 0.f) r += double(be) * load(C, Cd->type, i + j * Cd->ld);
      out[i + j * pr.m] = float(r);
    }
  const cudaDataType_t dt = Dd->type;
  for (uint64_t j = 0; j < pr.n; ++j)
    for (uint64_t i = 0; i < pr.m; ++i) {
      const size_t at = i + j * Dd->ld;
      if (dt == CUDA_R_32F)
        static_cast<float*>(D)[at] = out[i + j * pr.m];
      else
        static_cast<uint16_t*>(D)[at] = narrow16(out[i + j * pr.m], dt == CUDA_R_16BF);
    }
  return CUBLAS_STATUS_SUCCESS;
}
