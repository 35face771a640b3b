// CpuBackend::attention_decode: generation's attention of a few new rows over its KV cache.
// A plain loop per (new row, head): a decode step has one query row, whose scores fit one vector,
// so the blocked tiles of cpu_attention.cpp buy nothing here. fp32 throughout; the softmax sum in
// double.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/op_checks.h"
#include "core/threads.h"

namespace qlft::cpu {

void CpuBackend::attention_decode(const HeadGeometry& g, int window, int past, CMatF q,
                                  const float* k_cache, const float* v_cache, MatF out) {
  attention_decode_capped(g, window, 0.f, 0.f, past, q, k_cache, v_cache, out);
}

void CpuBackend::attention_decode_capped(const HeadGeometry& g, int window, float scale_in,
                                         float softcap, int past, CMatF q, const float* k_cache,
                                         const float* v_cache, MatF out) {
  op_checks::attention_decode(g, window, past, q, k_cache, v_cache, out.as_const());
  const int n = static_cast<int>(q.rows), hd = g.head_dim, group = g.group();
  const int64_t kvd = g.kv_dim();
  const float scale = scale_in > 0 ? scale_in : 1.f / std::sqrt(static_cast<float>(hd));
  const int total = past + n;
  // Threads only when there is enough work: a parallel region costs more than one token's
  // attention on a small model.
  const bool par = static_cast<int64_t>(n) * g.n_heads * total * hd >= (1 << 16);
#pragma omp parallel for num_threads(qlft::num_threads()) schedule(static) collapse(2) if (par)
  for (int i = 0; i < n; ++i)
    for (int h = 0; h < g.n_heads; ++h) {
      std::vector<float> s(static_cast<size_t>(total));
      const float* qr = q.data + i * q.stride + static_cast<int64_t>(h) * hd;
      const int64_t koff = static_cast<int64_t>(h / group) * hd;
      const int upto = past + i + 1;
      const int from = window > 0 ? std::max(0, upto - window) : 0;
      float mx = -INFINITY;
      for (int j = from; j < upto; ++j) {
        const float* kr = k_cache + j * kvd + koff;
        float d = 0;
        for (int e = 0; e < hd; ++e) d += qr[e] * kr[e];
        s[j] = d * scale;
        if (softcap > 0) s[j] = softcap * std::tanh(s[j] / softcap);  // gemma2
        mx = std::max(mx, s[j]);
      }
      double sum = 0;
      for (int j = from; j < upto; ++j) {
        s[j] = std::exp(s[j] - mx);
        sum += s[j];
      }
      float* o = out.data + i * out.stride + static_cast<int64_t>(h) * hd;
      std::fill(o, o + hd, 0.f);
      const float inv = static_cast<float>(1.0 / sum);
      for (int j = from; j < upto; ++j) {
        const float* vr = v_cache + j * kvd + koff;
        const float w = s[j] * inv;
        for (int e = 0; e < hd; ++e) o[e] += w * vr[e];
      }
    }
}

}  // namespace qlft::cpu
