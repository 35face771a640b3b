// Numerically stable (online) softmax pieces shared by attention, cross-entropy and CUDA kernels.
#pragma once

#include <cmath>

#include "core/hd.h"

namespace qlft {

// Running state of a softmax over a row seen in pieces: max m and sum s of exp(x - m).
template <class Acc>
struct OnlineSoftmax {
  float m = -INFINITY;
  Acc s = 0;
};

// Merges a piece whose own max is piece_max and whose sum of exp(x - piece_max) is piece_sum.
template <class Acc>
QLFT_HD inline void online_softmax_merge(OnlineSoftmax<Acc>& st, float piece_max, Acc piece_sum) {
  if (piece_max == -INFINITY) return;  // an all-masked piece adds nothing
  if (piece_max > st.m) {
    st.s = st.s * static_cast<Acc>(expf(st.m - piece_max)) + piece_sum;
    st.m = piece_max;
  } else {
    st.s += piece_sum * static_cast<Acc>(expf(piece_max - st.m));
  }
}

// log(sum exp(x)) of the whole row; -inf for an empty row.
template <class Acc>
QLFT_HD inline float online_softmax_lse(const OnlineSoftmax<Acc>& st) {
  if (st.m == -INFINITY) return -INFINITY;
  return st.m + static_cast<float>(log(static_cast<double>(st.s)));
}

// softmax probability of x given the row's log-sum-exp.
QLFT_HD inline float softmax_prob(float x, float lse) {
  return expf(x - lse);
}

}  // namespace qlft
