// Non-owning views of row-major 2-D data: what the kernels take. Ownership stays with Buffer.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace qlft {

// rows x cols, element (r, c) at data[r * stride + c] (stride in elements).
template <class T>
struct View2 {
  T* data = nullptr;
  int64_t rows = 0, cols = 0, stride = 0;

  View2() = default;
  View2(T* d, int64_t r, int64_t c) : data(d), rows(r), cols(c), stride(c) {}
  View2(T* d, int64_t r, int64_t c, int64_t s) : data(d), rows(r), cols(c), stride(s) {}
  T* row(int64_t r) const { return data + r * stride; }
  T& at(int64_t r, int64_t c) const { return data[r * stride + c]; }
  int64_t numel() const { return rows * cols; }
  View2<const T> as_const() const { return {data, rows, cols, stride}; }
  // Rows [r0, r0 + n).
  View2 row_slice(int64_t r0, int64_t n) const { return {data + r0 * stride, n, cols, stride}; }
};

using MatF = View2<float>;
using CMatF = View2<const float>;

}  // namespace qlft
