#include "model/moe.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace qlft {

namespace {

// The router's softmax of one row and its top k, largest first (ties: the lower expert, as a
// stable sort gives), renormalised to sum 1 as MixtralTopKRouter does.
// Without norm (Qwen3-MoE's norm_topk_prob false) the weights are the probabilities as they are.
void route_row(const float* logits, int E, int K, bool norm, float* probs, int32_t* index,
               float* weight) {
  float mx = logits[0];
  for (int e = 1; e < E; ++e) mx = std::max(mx, logits[e]);
  double sum = 0;
  for (int e = 0; e < E; ++e) sum += std::exp(double(logits[e]) - mx);
  for (int e = 0; e < E; ++e) probs[e] = static_cast<float>(std::exp(double(logits[e]) - mx) / sum);
  std::vector<int32_t> order(static_cast<size_t>(E));
  for (int e = 0; e < E; ++e) order[static_cast<size_t>(e)] = e;
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return probs[a] > probs[b]; });
  double top = 0;
  for (int k = 0; k < K; ++k) top += probs[order[static_cast<size_t>(k)]];
  if (!norm) top = 1;
  for (int k = 0; k < K; ++k) {
    index[k] = order[static_cast<size_t>(k)];
    weight[k] = static_cast<float>(probs[index[k]] / top);
  }
}

}  // namespace

void moe_fwd(Backend& be, const MoeWeights& w, CMatF x, MatF out, MoeSaved& s) {
  const int E = w.n_experts(), K = w.top_k;
  QLFT_CHECK_ARG(E > 0 && K > 0 && K <= E, "MoE: top_k %d of %d experts", K, E);
  QLFT_CHECK_ARG(w.router.rows == E && w.router.cols == x.cols,
                 "MoE: router [%lld, %lld] for %d experts of dim %lld", (long long)w.router.rows,
                 (long long)w.router.cols, E, (long long)x.cols);
  const int64_t R = x.rows, D = x.cols, F = w.w1[0].rows;
  QLFT_CHECK_ARG(static_cast<int>(w.w3.size()) == E && static_cast<int>(w.w2.size()) == E,
                 "MoE: %d w1, %zu w3 and %zu w2 experts", E, w.w3.size(), w.w2.size());
  QLFT_CHECK_ARG(out.rows == R && out.cols == D, "MoE: output [%lld, %lld] for input [%lld, %lld]",
                 (long long)out.rows, (long long)out.cols, (long long)R, (long long)D);
  for (int e = 0; e < E; ++e) {
    const QWeight &a = w.w1[static_cast<size_t>(e)], &b = w.w3[static_cast<size_t>(e)],
                  &c = w.w2[static_cast<size_t>(e)];
    QLFT_CHECK_ARG(
        a.rows == F && a.cols == D && b.rows == F && b.cols == D && c.rows == D && c.cols == F,
        "MoE: expert %d has w1 [%lld, %lld], w3 [%lld, %lld], w2 [%lld, %lld]; "
        "expected [%lld, %lld], [%lld, %lld], [%lld, %lld]",
        e, (long long)a.rows, (long long)a.cols, (long long)b.rows, (long long)b.cols,
        (long long)c.rows, (long long)c.cols, (long long)F, (long long)D, (long long)F,
        (long long)D, (long long)D, (long long)F);
  }
  s.rows = R, s.dim = D, s.ffn = F, s.n_experts = E, s.top_k = K;
  s.probs.assign(static_cast<size_t>(R * E), 0.f);
  s.index.assign(static_cast<size_t>(R * K), 0);
  s.weight.assign(static_cast<size_t>(R * K), 0.f);
  std::vector<float> logits(static_cast<size_t>(R * E));
  be.linear_fwd(w.router, nullptr, nullptr, x, MatF(logits.data(), R, E), nullptr);
  for (int64_t r = 0; r < R; ++r)
    route_row(&logits[static_cast<size_t>(r * E)], E, K, w.norm_topk,
              &s.probs[static_cast<size_t>(r * E)], &s.index[static_cast<size_t>(r * K)],
              &s.weight[static_cast<size_t>(r * K)]);

  // Each expert over the rows routed to it, gathered. One expert at a time through the
  // backend's linear: a grouped GEMM over all experts' row groups (one launch, the experts'
  // weights side by side) would replace this loop where the routing leaves experts small.
  s.experts.assign(static_cast<size_t>(E), {});
  for (int64_t r = 0; r < R; ++r)
    for (int k = 0; k < K; ++k) {
      auto& ex = s.experts[static_cast<size_t>(s.index[static_cast<size_t>(r * K + k)])];
      ex.token.push_back(static_cast<int32_t>(r));
      ex.slot.push_back(k);
    }
  for (int64_t i = 0; i < R; ++i) std::fill(out.row(i), out.row(i) + D, 0.f);
  for (int e = 0; e < E; ++e) {
    auto& ex = s.experts[static_cast<size_t>(e)];
    const int64_t n = static_cast<int64_t>(ex.token.size());
    if (n == 0) continue;
    ex.x.resize(static_cast<size_t>(n * D));
    for (int64_t i = 0; i < n; ++i)
      std::copy(x.row(ex.token[static_cast<size_t>(i)]),
                x.row(ex.token[static_cast<size_t>(i)]) + D, &ex.x[static_cast<size_t>(i * D)]);
    ex.gate.resize(static_cast<size_t>(n * F));
    ex.up.resize(static_cast<size_t>(n * F));
    ex.hact.resize(static_cast<size_t>(n * F));
    ex.y.resize(static_cast<size_t>(n * D));
    const CMatF xe(ex.x.data(), n, D);
    be.linear_fwd(w.w1[static_cast<size_t>(e)], nullptr, nullptr, xe, MatF(ex.gate.data(), n, F),
                  nullptr);
    be.linear_fwd(w.w3[static_cast<size_t>(e)], nullptr, nullptr, xe, MatF(ex.up.data(), n, F),
                  nullptr);
    be.swiglu_fwd(CMatF(ex.gate.data(), n, F), CMatF(ex.up.data(), n, F),
                  MatF(ex.hact.data(), n, F));
    be.linear_fwd(w.w2[static_cast<size_t>(e)], nullptr, nullptr, CMatF(ex.hact.data(), n, F),
                  MatF(ex.y.data(), n, D), nullptr);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = ex.token[static_cast<size_t>(i)];
      const float wt = s.weight[static_cast<size_t>(r * K + ex.slot[static_cast<size_t>(i)])];
      const float* y = &ex.y[static_cast<size_t>(i * D)];
      float* o = out.row(r);
      for (int64_t d = 0; d < D; ++d) o[d] += wt * y[d];
    }
  }
}

void moe_bwd(Backend& be, const MoeWeights& w, const MoeSaved& s, CMatF x, CMatF dout, MatF dx) {
  const int64_t R = s.rows, D = s.dim, F = s.ffn;
  const int E = s.n_experts, K = s.top_k;
  QLFT_CHECK_ARG(dout.rows == R && dout.cols == D && dx.rows == R && dx.cols == D,
                 "MoE backward: gradients [%lld, %lld] for rows %lld of dim %lld",
                 (long long)dout.rows, (long long)dout.cols, (long long)R, (long long)D);
  // g[r, k] = <dout_r, y of expert index[r, k] at r>: the gradient of the routing weight.
  std::vector<float> g(static_cast<size_t>(R * K), 0.f);
  for (int e = 0; e < E; ++e) {
    const auto& ex = s.experts[static_cast<size_t>(e)];
    const int64_t n = static_cast<int64_t>(ex.token.size());
    if (n == 0) continue;
    // dy = weight * dout over the gathered rows, then back through w2, SwiGLU, w1 and w3.
    std::vector<float> dy(static_cast<size_t>(n * D)), dh(static_cast<size_t>(n * F), 0.f),
        dg(static_cast<size_t>(n * F)), du(static_cast<size_t>(n * F)),
        dxe(static_cast<size_t>(n * D), 0.f);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = ex.token[static_cast<size_t>(i)];
      const int64_t rk = r * K + ex.slot[static_cast<size_t>(i)];
      const float wt = s.weight[static_cast<size_t>(rk)];
      const float* go = dout.row(r);
      const float* y = &ex.y[static_cast<size_t>(i * D)];
      double dot = 0;
      for (int64_t d = 0; d < D; ++d) {
        dy[static_cast<size_t>(i * D + d)] = wt * go[d];
        dot += double(go[d]) * y[d];
      }
      g[static_cast<size_t>(rk)] = static_cast<float>(dot);
    }
    be.linear_bwd(w.w2[static_cast<size_t>(e)], nullptr, CMatF(ex.hact.data(), n, F), nullptr,
                  CMatF(dy.data(), n, D), MatF(dh.data(), n, F), nullptr, nullptr);
    be.swiglu_bwd(CMatF(ex.gate.data(), n, F), CMatF(ex.up.data(), n, F), CMatF(dh.data(), n, F),
                  MatF(dg.data(), n, F), MatF(du.data(), n, F));
    const CMatF xe(ex.x.data(), n, D);
    be.linear_bwd(w.w1[static_cast<size_t>(e)], nullptr, xe, nullptr, CMatF(dg.data(), n, F),
                  MatF(dxe.data(), n, D), nullptr, nullptr);
    be.linear_bwd(w.w3[static_cast<size_t>(e)], nullptr, xe, nullptr, CMatF(du.data(), n, F),
                  MatF(dxe.data(), n, D), nullptr, nullptr);
    for (int64_t i = 0; i < n; ++i) {
      float* o = dx.row(ex.token[static_cast<size_t>(i)]);
      const float* a = &dxe[static_cast<size_t>(i * D)];
      for (int64_t d = 0; d < D; ++d) o[d] += a[d];
    }
  }
  // The routing path: weight_k = p_k / S over the top k (S their sum), so
  // dp_k = (g_k - sum_m weight_m g_m) / S for a chosen expert and 0 for the others; the softmax
  // gives dz_e = p_e (dp_e - sum_j p_j dp_j); the router's linear gives dx += dz W_router.
  // Without renormalisation weight_k = p_k and dp_k = g_k.
  std::vector<float> dz(static_cast<size_t>(R * E), 0.f);
  for (int64_t r = 0; r < R; ++r) {
    const float* p = &s.probs[static_cast<size_t>(r * E)];
    const int32_t* idx = &s.index[static_cast<size_t>(r * K)];
    const float* wt = &s.weight[static_cast<size_t>(r * K)];
    const float* gr = &g[static_cast<size_t>(r * K)];
    double S = 0, wg = 0;
    for (int k = 0; k < K; ++k) S += p[idx[k]], wg += double(wt[k]) * gr[k];
    std::vector<double> dp(static_cast<size_t>(E), 0.0);
    double pdp = 0;
    for (int k = 0; k < K; ++k) {
      dp[static_cast<size_t>(idx[k])] = w.norm_topk ? (gr[k] - wg) / S : gr[k];
      pdp += p[idx[k]] * dp[static_cast<size_t>(idx[k])];
    }
    for (int e = 0; e < E; ++e)
      dz[static_cast<size_t>(r * E + e)] =
          static_cast<float>(p[e] * (dp[static_cast<size_t>(e)] - pdp));
  }
  be.linear_bwd(w.router, nullptr, x, nullptr, CMatF(dz.data(), R, E), dx, nullptr, nullptr);
}

}  // namespace qlft
