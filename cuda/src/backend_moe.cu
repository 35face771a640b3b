// CudaBackend's mixture-of-experts row ops (Backend's "mixture-of-experts rows"; model/moe.cpp):
// gather rows by an index list into a packed buffer, combine packed rows back with per-row
// weights, per-row dot products; kernels in k_moe.cu. Index and weight arrays in this backend's
// memory are used in place (their indices unchecked: the caller made them); host arrays are
// checked (op_checks::row_indices) and staged.
// (CudaBackend is declared in cuda_backend.h, which lists where each operation family lives.)
#include "backend/op_checks.h"
#include "cuda_backend.h"
#include "k_moe.h"

namespace qlft::cu {

void CudaBackend::gather_rows(CMatF x, const int32_t* rows, const float* scale, MatF out_) {
  op_checks::gather_rows(x, out_.as_const());
  const int64_t n = out_.rows, C = x.cols;
  if (n == 0 || C == 0) return;
  QLFT_CHECK_ARG(rows, "gather_rows: no row indices");
  if (!mine(rows, n * 4)) op_checks::row_indices(rows, n, x.rows, "gather_rows", "rows");
  Dev X = in(x, C, MemCategory::Activations, "gather_rows x");
  Dev I = in_raw(rows, n * 4, "gather_rows indices");
  Dev S = scale ? in_raw(scale, n * 4, "gather_rows scale") : Dev{};
  Dev O = out(out_, C, MemCategory::Activations, "gather_rows out");
  cu::gather_rows(X.as<float>(), C, I.as<int32_t>(), S.as<float>(), O.as<float>(), C, n, C,
                  stream_);
  finish(O, C, out_);
}

void CudaBackend::combine_rows(CMatF src, const int32_t* pos, const float* w, int k, MatF out_,
                               bool accumulate) {
  op_checks::combine_rows(src, k, out_.as_const());
  const int64_t n = out_.rows, C = out_.cols;
  if (n == 0 || C == 0) return;
  QLFT_CHECK_ARG(pos, "combine_rows: no row positions");
  if (!mine(pos, n * k * 4)) op_checks::row_indices(pos, n * k, src.rows, "combine_rows", "pos");
  Dev S = in(src, C, MemCategory::Activations, "combine_rows src");
  Dev P = in_raw(pos, n * k * 4, "combine_rows positions");
  Dev W = w ? in_raw(w, n * k * 4, "combine_rows weights") : Dev{};
  Dev O = accumulate ? inout(out_, C, MemCategory::Activations, "combine_rows out")
                     : out(out_, C, MemCategory::Activations, "combine_rows out");
  cu::combine_rows(S.as<float>(), C, P.as<int32_t>(), W.as<float>(), k, O.as<float>(), C, n, C,
                   accumulate, stream_);
  finish(O, C, out_);
}

void CudaBackend::row_dots(CMatF a, const int32_t* rows, CMatF b, float* out_) {
  op_checks::row_dots(a, b);
  const int64_t n = b.rows, C = b.cols;
  if (n == 0) return;
  if (rows && !mine(rows, n * 4)) op_checks::row_indices(rows, n, a.rows, "row_dots", "rows");
  if (!rows)
    QLFT_CHECK_ARG(n <= a.rows, "row_dots: b has %lld rows, a only %lld", (long long)n,
                   (long long)a.rows);
  Dev A = in(a, C, MemCategory::Activations, "row_dots a");
  Dev I = rows ? in_raw(rows, n * 4, "row_dots indices") : Dev{};
  Dev B = in(b, C, MemCategory::Activations, "row_dots b");
  Dev O = out_raw(out_, n * 4, MemCategory::Activations, "row_dots out");
  cu::row_dots(A.as<float>(), C, I.as<int32_t>(), B.as<float>(), C, n, C, O.as<float>(), stream_);
  finish_raw(O, out_, n * 4);
}

}  // namespace qlft::cu
