// The gated MLP's pointwise walk, shared by SwiGLU (cpu_pointwise.cpp) and GeGLU
// (cpu_gemma.cpp): the shape checks, then one row per task (results do not depend on the thread
// count), the activation given as a row function.
#pragma once

#include <cstdint>

#include "backend/op_checks.h"
#include "core/tensor.h"
#include "core/threads.h"

namespace qlft::cpu {

// out = act(gate) * up; row(g, u, o, cols) does one row.
template <class Row>
void glu_fwd_rows(const char* op, CMatF gate, CMatF up, MatF out, Row row) {
  op_checks::same_shape(gate, up, op, "gate", "up");
  op_checks::same_shape(gate, out.as_const(), op, "gate", "out");
  const int64_t C = gate.cols;
#pragma omp parallel for num_threads(qlft::num_threads()) schedule(static)
  for (int64_t i = 0; i < gate.rows; ++i) row(gate.row(i), up.row(i), out.row(i), C);
}

// dgate = dout * up * act'(gate), dup = dout * act(gate); row(g, u, d, dg, du, cols) does one row.
template <class Row>
void glu_bwd_rows(const char* op, CMatF gate, CMatF up, CMatF dout, MatF dgate, MatF dup, Row row) {
  op_checks::same_shape(gate, up, op, "gate", "up");
  op_checks::same_shape(gate, dout, op, "gate", "dout");
  op_checks::same_shape(gate, dgate.as_const(), op, "gate", "dgate");
  op_checks::same_shape(gate, dup.as_const(), op, "gate", "dup");
  const int64_t C = gate.cols;
#pragma omp parallel for num_threads(qlft::num_threads()) schedule(static)
  for (int64_t i = 0; i < gate.rows; ++i)
    row(gate.row(i), up.row(i), dout.row(i), dgate.row(i), dup.row(i), C);
}

}  // namespace qlft::cpu
