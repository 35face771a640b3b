#include "model/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>

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

// b holding `elems` 4-byte elements of the backend's memory (kept when it already does).
void hold(Backend& be, Buffer& b, int64_t elems, MemCategory c, const char* what) {
  const size_t bytes = size_t(elems) * 4;
  if (b.size() == bytes) return;
  b.reset();  // before the new one: a recomputed layer does not hold both
  b = be.alloc(c, bytes, what, BufferInit::Uninit);
}

// Zeroes bytes at p in the backend's memory.
void zero_at(Backend& be, void* p, size_t bytes) {
  if (!bytes) return;
  if (DeviceAllocator* d = be.device_memory())
    d->fill(p, 0, bytes);
  else
    std::memset(p, 0, bytes);
}

// The rows * top_k 4-byte values of the routing's field `field` (moe_route_layout), read back
// to the host.
template <class T>
std::vector<T> route_field(const MoeSaved& s, int64_t MoeRouteLayout::*field) {
  static_assert(sizeof(T) == 4, "the routing holds 4-byte elements");
  const int64_t at = moe_route_layout(s.rows, s.n_experts, s.top_k).*field;
  std::vector<T> v(static_cast<size_t>(s.rows * s.top_k));
  std::vector<char> h((size_t(at) + v.size()) * 4);
  if (!h.empty()) s.route.copy_to_host(h.data(), h.size());
  if (!v.empty()) std::memcpy(v.data(), &h[size_t(at) * 4], v.size() * 4);
  return v;
}

// Expert e's LoRA refs (model/moe_lora.h): gate / up, the fused gate_up's row blocks of one A,
// and down; gu / dn whether they are adapted.
struct ExpertLora {
  LoraRef gate, up, down;
  bool gu = false, dn = false;
};
ExpertLora expert_lora(const MoeLora* lora, int e, int64_t D, int64_t F) {
  ExpertLora l;
  if (!lora) return l;
  l.gu = lora->gate_up.active(), l.dn = lora->down.active();
  if (l.gu) l.gate = lora->gate_up.ref(e, D, 2 * F), l.up = lora->gate_up.ref(e, D, 2 * F, F);
  if (l.dn) l.down = lora->down.ref(e, F, D);
  return l;
}

}  // namespace

std::vector<int32_t> moe_routed_experts(const MoeSaved& s) {
  return route_field<int32_t>(s, &MoeRouteLayout::index);
}

std::vector<float> moe_routing_weights(const MoeSaved& s) {
  return route_field<float>(s, &MoeRouteLayout::weight);
}

void moe_fwd(Backend& be, const MoeWeights& w, CMatF x, MatF out, MoeSaved& s,
             const MoeLora* lora) {
  const int E = w.n_experts(), K = w.top_k;
  QLFT_CHECK_ARG(E > 0 && K > 0 && K <= E, "MoE: top_k %d of %d experts", K, E);
  QLFT_CHECK_ARG(w.router.rows == E && w.router.cols == x.cols,
                 "MoE: router [%lld, %lld] for %d experts of dim %lld", (long long)w.router.rows,
                 (long long)w.router.cols, E, (long long)x.cols);
  const int64_t R = x.rows, D = x.cols, F = w.w1[0].rows, N = R * K;
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
  const MoeRouteLayout rl = moe_route_layout(R, E, K);
  const MoeActsLayout al = moe_acts_layout(R, D, F, K);
  hold(be, s.route, rl.total, MemCategory::Activations, "MoE routing");
  hold(be, s.acts, al.total, MemCategory::Activations, "MoE expert rows");
  float* route = s.route.as<float>();
  float* acts = s.acts.as<float>();
  s.ranks = moe_lora_ranks(lora);
  const MoeLoraLayout ll = moe_lora_layout(R, K, s.ranks);
  if (ll.total)
    hold(be, s.lora, ll.total, MemCategory::Activations, "MoE LoRA inputs");
  else
    s.lora.reset();
  float* xa = s.lora.as<float>();

  // The router's logits into the probabilities' place, to the host, routed there.
  const LoraRef rref = lora ? lora->router.ref(0, D, E) : LoraRef();
  be.linear_fwd(w.router, nullptr, rref.r ? &rref : nullptr, x, MatF(route + rl.probs, R, E),
                rref.r ? xa + ll.router : nullptr);
  std::vector<float> logits(static_cast<size_t>(R * E));
  s.route.copy_to_host(logits.data(), logits.size() * 4);
  std::vector<float> probs(static_cast<size_t>(R * E)), weight(static_cast<size_t>(N)),
      wpk(static_cast<size_t>(N));
  std::vector<int32_t> index(static_cast<size_t>(N)), pos(static_cast<size_t>(N)),
      token(static_cast<size_t>(N));
  for (int64_t r = 0; r < R; ++r)
    route_row(&logits[static_cast<size_t>(r * E)], E, K, w.norm_topk, &probs[size_t(r * E)],
              &index[size_t(r * K)], &weight[size_t(r * K)]);
  // The load-balancing loss's statistics (moe_aux_loss), over the weighted rows.
  MoeSaved::MoeAux& aux = s.aux;
  aux.count.assign(size_t(E), 0.0);
  aux.prob.assign(size_t(E), 0.0);
  aux.rows = 0;
  for (int64_t r = 0; r < R; ++r) {
    const double m = aux.row_weight ? aux.row_weight[r] : 1.0;
    aux.rows += m;
    for (int k = 0; k < K; ++k) aux.count[size_t(index[size_t(r * K + k)])] += m;
    for (int e = 0; e < E; ++e) aux.prob[size_t(e)] += m * probs[size_t(r * E + e)];
  }
  // Packed expert by expert, each expert's rows in row order.
  s.offset.assign(static_cast<size_t>(E + 1), 0);
  for (int64_t i = 0; i < N; ++i) ++s.offset[static_cast<size_t>(index[size_t(i)]) + 1];
  for (int e = 0; e < E; ++e) s.offset[size_t(e) + 1] += s.offset[size_t(e)];
  std::vector<int64_t> next(s.offset.begin(), s.offset.end() - 1);
  for (int64_t i = 0; i < N; ++i) {  // i = r K + k
    const int64_t p = next[static_cast<size_t>(index[size_t(i)])]++;
    pos[size_t(i)] = static_cast<int32_t>(p);
    token[size_t(p)] = static_cast<int32_t>(i / K);
    wpk[size_t(p)] = weight[size_t(i)];
  }
  std::vector<char> h(size_t(rl.total) * 4, 0);  // the route as moe_route_layout lays it out
  auto put = [&](int64_t at, const void* src, size_t n) {
    std::memcpy(&h[size_t(at) * 4], src, n * 4);
  };
  put(rl.probs, probs.data(), probs.size());
  put(rl.weight, weight.data(), weight.size());
  put(rl.index, index.data(), index.size());
  put(rl.pos, pos.data(), pos.size());
  put(rl.token, token.data(), token.size());
  put(rl.wpk, wpk.data(), wpk.size());
  s.route.copy_from_host(h.data(), h.size());

  // Each expert over its packed rows. One expert at a time through the backend's linear: a
  // grouped GEMM over all experts' row groups (one launch, the experts' weights side by side)
  // would replace this loop where the routing leaves experts small.
  const int32_t* dtoken = reinterpret_cast<const int32_t*>(route + rl.token);
  be.gather_rows(x, dtoken, nullptr, MatF(acts + al.x, N, D));
  for (int e = 0; e < E; ++e) {
    const int64_t o = s.offset[size_t(e)], n = s.offset[size_t(e) + 1] - o;
    if (n == 0) continue;
    const CMatF xe(acts + al.x + o * D, n, D);
    const MatF gate(acts + al.gate + o * F, n, F), up(acts + al.up + o * F, n, F),
        hact(acts + al.hact + o * F, n, F);
    // The fused gate_up LoRA: gate's and up's B rows over one A (x A^T kept once; up's call
    // recomputes it).
    const ExpertLora l = expert_lora(lora, e, D, F);
    be.linear_fwd(w.w1[static_cast<size_t>(e)], nullptr, l.gu ? &l.gate : nullptr, xe, gate,
                  l.gu ? xa + ll.gate_up + o * l.gate.r : nullptr);
    be.linear_fwd(w.w3[static_cast<size_t>(e)], nullptr, l.gu ? &l.up : nullptr, xe, up, nullptr);
    be.swiglu_fwd(gate.as_const(), up.as_const(), hact);
    be.linear_fwd(w.w2[static_cast<size_t>(e)], nullptr, l.dn ? &l.down : nullptr, hact.as_const(),
                  MatF(acts + al.y + o * D, n, D), l.dn ? xa + ll.down + o * l.down.r : nullptr);
  }
  // out[r] = sum over k of weight[r, k] y[pos[r, k]].
  be.combine_rows(CMatF(acts + al.y, N, D), reinterpret_cast<const int32_t*>(route + rl.pos),
                  route + rl.weight, K, out, false);
}

void moe_bwd(Backend& be, const MoeWeights& w, const MoeSaved& s, CMatF x, CMatF dout, MatF dx,
             const MoeLora* lora) {
  const int64_t R = s.rows, D = s.dim, F = s.ffn;
  const int E = s.n_experts, K = s.top_k;
  const int64_t N = R * K;
  QLFT_CHECK_ARG(dout.rows == R && dout.cols == D && dx.rows == R && dx.cols == D,
                 "MoE backward: gradients [%lld, %lld] for rows %lld of dim %lld",
                 (long long)dout.rows, (long long)dout.cols, (long long)R, (long long)D);
  QLFT_CHECK_ARG(!s.route.empty() && !s.acts.empty(), "MoE backward: no forward pass saved");
  const MoeLoraRanks lr = moe_lora_ranks(lora);
  QLFT_CHECK_ARG(
      lr.gate_up == s.ranks.gate_up && lr.down == s.ranks.down && lr.router == s.ranks.router,
      "MoE backward: LoRA ranks (gate_up %d, down %d, router %d) differ from the "
      "forward's (%d, %d, %d)",
      lr.gate_up, lr.down, lr.router, s.ranks.gate_up, s.ranks.down, s.ranks.router);
  const MoeLoraLayout ll = moe_lora_layout(R, K, lr);
  const float* xa = s.lora.as<float>();
  const MoeRouteLayout rl = moe_route_layout(R, E, K);
  const MoeActsLayout al = moe_acts_layout(R, D, F, K);
  // (g is moe_bwd's room in the saved routing: written here, read back below.)
  float* route = const_cast<float*>(s.route.as<float>());
  const float* acts = s.acts.as<float>();
  const int32_t* dtoken = reinterpret_cast<const int32_t*>(route + rl.token);
  Buffer ws = be.alloc(MemCategory::Workspace, size_t(moe_bwd_elems(R, D, F, K)) * 4,
                       "MoE backward", BufferInit::Uninit);
  float* dy = ws.as<float>();  // [N, D]
  float* dxe = dy + N * D;     // [N, D]
  float* dh = dxe + N * D;     // [R, F] each: one expert's rows at a time
  float* dg = dh + R * F;
  float* du = dg + R * F;
  // g[p] = <dout of p's row, y[p]>: the gradient of p's routing weight; dy = weight * dout.
  be.row_dots(dout, dtoken, CMatF(acts + al.y, N, D), route + rl.g);
  be.gather_rows(dout, dtoken, route + rl.wpk, MatF(dy, N, D));
  zero_at(be, dxe, size_t(N * D) * 4);
  // Back through w2, SwiGLU, w1 and w3, expert by expert.
  for (int e = 0; e < E; ++e) {
    const int64_t o = s.offset[size_t(e)], n = s.offset[size_t(e) + 1] - o;
    if (n == 0) continue;
    zero_at(be, dh, size_t(n * F) * 4);
    const ExpertLora l = expert_lora(lora, e, D, F);
    be.linear_bwd(w.w2[static_cast<size_t>(e)], l.dn ? &l.down : nullptr,
                  CMatF(acts + al.hact + o * F, n, F), l.dn ? xa + ll.down + o * l.down.r : nullptr,
                  CMatF(dy + o * D, n, D), MatF(dh, n, F), l.dn ? lora->down.d_a(e, F) : nullptr,
                  l.dn ? lora->down.d_b(e, D) : nullptr);
    be.swiglu_bwd(CMatF(acts + al.gate + o * F, n, F), CMatF(acts + al.up + o * F, n, F),
                  CMatF(dh, n, F), MatF(dg, n, F), MatF(du, n, F));
    const CMatF xe(acts + al.x + o * D, n, D);
    // gate's and up's calls both add into the one dA.
    const float* xg = l.gu ? xa + ll.gate_up + o * l.gate.r : nullptr;
    float* dA = l.gu ? lora->gate_up.d_a(e, D) : nullptr;
    be.linear_bwd(w.w1[static_cast<size_t>(e)], l.gu ? &l.gate : nullptr, xe, xg, CMatF(dg, n, F),
                  MatF(dxe + o * D, n, D), dA, l.gu ? lora->gate_up.d_b(e, 2 * F) : nullptr);
    be.linear_bwd(w.w3[static_cast<size_t>(e)], l.gu ? &l.up : nullptr, xe, xg, CMatF(du, n, F),
                  MatF(dxe + o * D, n, D), dA, l.gu ? lora->gate_up.d_b(e, 2 * F, F) : nullptr);
  }
  // dx[r] += sum over k of dxe[pos[r, k]].
  be.combine_rows(CMatF(dxe, N, D), reinterpret_cast<const int32_t*>(route + rl.pos), nullptr, K,
                  dx, true);

  // The routing path, on the host: weight_k = p_k / S over the top k (S their sum), so
  // dp_k = (g_k - sum_m weight_m g_m) / S for a chosen expert and 0 for the others; the softmax
  // gives dz_e = p_e (dp_e - sum_j p_j dp_j); the router's linear gives dx += dz W_router.
  // Without renormalisation weight_k = p_k and dp_k = g_k.
  std::vector<char> h(size_t(rl.token) * 4);  // probs, weight, g, index, pos
  s.route.copy_to_host(h.data(), h.size());
  std::vector<float> probs(static_cast<size_t>(R * E)), weight(static_cast<size_t>(N)),
      gpk(static_cast<size_t>(N));
  std::vector<int32_t> index(static_cast<size_t>(N)), pos(static_cast<size_t>(N));
  auto get = [&](int64_t at, void* dst, size_t n) { std::memcpy(dst, &h[size_t(at) * 4], n * 4); };
  get(rl.probs, probs.data(), probs.size());
  get(rl.weight, weight.data(), weight.size());
  get(rl.g, gpk.data(), gpk.size());
  get(rl.index, index.data(), index.size());
  get(rl.pos, pos.data(), pos.size());
  std::vector<float> dz(static_cast<size_t>(R * E), 0.f);
  std::vector<double> dp(static_cast<size_t>(E));
  const bool aux = !s.aux.dprob.empty();
  QLFT_CHECK_ARG(!aux || s.aux.dprob.size() == size_t(E),
                 "MoE backward: the auxiliary loss's gradient has %zu of %d experts",
                 s.aux.dprob.size(), E);
  for (int64_t r = 0; r < R; ++r) {
    const float* p = &probs[size_t(r * E)];
    const int32_t* idx = &index[size_t(r * K)];
    const float* wt = &weight[size_t(r * K)];
    double S = 0, wg = 0;
    for (int k = 0; k < K; ++k)
      S += p[idx[k]], wg += double(wt[k]) * gpk[size_t(pos[size_t(r * K + k)])];
    // The load-balancing loss's gradient (moe_aux_loss) reaches every probability of the row.
    const double m = aux ? (s.aux.row_weight ? s.aux.row_weight[r] : 1.0) : 0.0;
    for (int e = 0; e < E; ++e) dp[size_t(e)] = aux ? m * s.aux.dprob[size_t(e)] : 0.0;
    for (int k = 0; k < K; ++k) {
      const double gk = gpk[size_t(pos[size_t(r * K + k)])];
      dp[static_cast<size_t>(idx[k])] += w.norm_topk ? (gk - wg) / S : gk;
    }
    double pdp = 0;
    for (int e = 0; e < E; ++e) pdp += p[e] * dp[size_t(e)];
    for (int e = 0; e < E; ++e)
      dz[static_cast<size_t>(r * E + e)] =
          static_cast<float>(p[e] * (dp[static_cast<size_t>(e)] - pdp));
  }
  const LoraRef rref = lora ? lora->router.ref(0, D, E) : LoraRef();
  be.linear_bwd(w.router, rref.r ? &rref : nullptr, x, rref.r ? xa + ll.router : nullptr,
                CMatF(dz.data(), R, E), dx, rref.r ? lora->router.d_a(0, D) : nullptr,
                rref.r ? lora->router.d_b(0, E) : nullptr);
}

double moe_aux_loss(const std::vector<MoeSaved*>& layers, double scale) {
  if (layers.empty()) return 0.0;
  const size_t E = static_cast<size_t>(layers[0]->n_experts);
  std::vector<double> count(E, 0.0), prob(E, 0.0);
  double T = 0;
  for (const MoeSaved* s : layers) {
    QLFT_CHECK_ARG(s->aux.count.size() == E && s->aux.prob.size() == E,
                   "MoE auxiliary loss: a layer of %zu experts among layers of %zu",
                   s->aux.count.size(), E);
    for (size_t e = 0; e < E; ++e) count[e] += s->aux.count[e], prob[e] += s->aux.prob[e];
    T += s->aux.rows;
  }
  std::vector<double> dprob(E, 0.0);
  double loss = 0;
  if (T > 0)
    for (size_t e = 0; e < E; ++e) {
      loss += double(E) * (count[e] / T) * (prob[e] / T);
      dprob[e] = scale * double(E) * (count[e] / T) / T;
    }
  for (MoeSaved* s : layers) s->aux.dprob = dprob;
  return loss;
}

}  // namespace qlft
