#include "model/lora_extras.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/threads.h"
#include "model/lora_init_factors.h"

namespace qlft {

namespace {

// ||W_o||^2 of every row of w (dequantized in panels of rows).
std::vector<double> row_norms2(const QWeight& w) {
  std::vector<double> n2(static_cast<size_t>(w.rows));
  const int64_t panel = std::max<int64_t>(1, (int64_t(1) << 20) / std::max<int64_t>(1, w.cols));
  std::vector<float> rows(static_cast<size_t>(std::min(panel, w.rows) * w.cols));
  for (int64_t r0 = 0; r0 < w.rows; r0 += panel) {
    const int64_t n = std::min(panel, w.rows - r0);
    w.dequantize_rows(r0, n, rows.data());
    for (int64_t i = 0; i < n; ++i) {
      double s = 0;
      const float* x = rows.data() + i * w.cols;
      for (int64_t k = 0; k < w.cols; ++k) s += static_cast<double>(x[k]) * x[k];
      n2[static_cast<size_t>(r0 + i)] = s;
    }
  }
  return n2;
}

// n[o]^2 = ||W_o||^2 + 2 s B_o . P[:, o] + s^2 B_o G B_o^T (see the header), P = W A^T as [r, out]
// (A's rows through the projection), G = A A^T.
std::vector<double> adapted_norms2(Backend& be, const QWeight& w, const LoraSlot& s, float scale,
                                   const std::vector<double>& w_norm2) {
  const int r = s.r;
  const float* A = s.A.as<float>();
  const float* B = s.B.as<float>();
  std::vector<float> P(static_cast<size_t>(r) * s.out);
  be.linear_fwd(w, nullptr, nullptr, CMatF(A, r, s.in), MatF(P.data(), r, s.out), nullptr);
  std::vector<double> G(static_cast<size_t>(r) * r);
  for (int i = 0; i < r; ++i)
    for (int j = 0; j <= i; ++j) {
      double d = 0;
      for (int k = 0; k < s.in; ++k)
        d += static_cast<double>(A[int64_t(i) * s.in + k]) * A[int64_t(j) * s.in + k];
      G[size_t(i) * r + j] = G[size_t(j) * r + i] = d;
    }
  std::vector<double> n2(static_cast<size_t>(s.out));
#pragma omp parallel for num_threads(qlft::num_threads()) schedule(static) if (s.out >= 256)
  for (int o = 0; o < s.out; ++o) {
    const float* b = B + static_cast<int64_t>(o) * r;
    double cross = 0, quad = 0;
    for (int i = 0; i < r; ++i) {
      cross += static_cast<double>(b[i]) * P[size_t(i) * s.out + o];
      double gi = 0;
      for (int j = 0; j < r; ++j) gi += G[size_t(i) * r + j] * b[j];
      quad += b[i] * gi;
    }
    n2[size_t(o)] =
        std::max(0.0, w_norm2[size_t(o)] + 2.0 * scale * cross + double(scale) * scale * quad);
  }
  return n2;
}

}  // namespace

LoraExtras::LoraExtras(Backend& be, const Model& model, const LoraAdapter& lora)
    : be_(be), model_(model), lora_(lora) {
  slots_.resize(static_cast<size_t>(lora.n_layers()) * kProjCount);
  const float s = lora.config().scale();
  for (int l = 0; l < lora.n_layers(); ++l)
    for (int p = 0; p < kProjCount; ++p) {
      if (!lora.active(l, static_cast<Proj>(p))) continue;
      const LoraSlot& ls = lora.slot(l, static_cast<Proj>(p));
      Slot& x = slot(l, static_cast<Proj>(p));
      x.dora = lora.config().use_dora;
      x.start = ls.has_start();
      any_ = any_ || x.dora || x.start;
      if (!x.start) continue;
      QLFT_CHECK_ARG(!be.device_memory(),
                     "a PiSSA / OLoRA start runs on a host backend; %s keeps its weights on the "
                     "device",
                     be.name());
      MemoryTracker* t = be.tracker();  // (counted with the frozen weights)
      x.a0 = qweight_from_f32(t, ls.A0.as<float>(), ls.r, ls.in, QuantKind::F32);
      std::vector<float> nb(ls.B0.as<float>(), ls.B0.as<float>() + size_t(ls.out) * ls.r);
      for (float& v : nb) v *= -s;
      x.b0 = qweight_from_f32(t, nb.data(), ls.out, ls.r, QuantKind::F32);
    }
  QLFT_CHECK_ARG(!any_ || !be.device_memory(),
                 "lora.use_dora runs on a host backend; %s keeps its activations on the device",
                 be.name());
}

float* LoraExtras::scratch(size_t i, int64_t n) {
  const size_t bytes = static_cast<size_t>(n) * 4;
  if (scratch_[i].size() < bytes)
    scratch_[i] =
        be_.alloc(MemCategory::Workspace, bytes, "lora extras scratch", BufferInit::Uninit);
  return scratch_[i].as<float>();
}

void LoraExtras::prepare_layer(int l) {
  if (!any_) return;
  const float s = lora_.config().scale();
  for (int p = 0; p < kProjCount; ++p) {
    Slot& x = slot(l, static_cast<Proj>(p));
    if (!x.dora) continue;
    const QWeight& w = model_.layers[l].proj[p];
    if (x.w_norm2.empty()) x.w_norm2 = row_norms2(w);
    const LoraSlot& ls = lora_.slot(l, static_cast<Proj>(p));
    const std::vector<double> n2 = adapted_norms2(be_, w, ls, s, x.w_norm2);
    x.c.resize(n2.size());
    x.inv_n.resize(n2.size());
    const float* M = ls.M.as<float>();
    for (size_t o = 0; o < n2.size(); ++o) {
      // (a zero row with a zero update has no direction: PEFT divides by zero there too; keep
      // the output zero rather than NaN)
      const double inv = n2[o] > 0 ? 1.0 / std::sqrt(n2[o]) : 0.0;
      x.inv_n[o] = static_cast<float>(inv);
      x.c[o] = static_cast<float>(M[o] * inv);
    }
  }
}

void LoraExtras::after_fwd(int l, Proj p, CMatF x, MatF y, const float* bias) {
  if (!any_) return;
  Slot& e = slot(l, p);
  if (e.dora) {
    const float* c = e.c.data();
#pragma omp parallel for num_threads(qlft::num_threads()) schedule(static) if (y.rows >= 8)
    for (int64_t t = 0; t < y.rows; ++t) {
      float* row = y.row(t);
      for (int64_t o = 0; o < y.cols; ++o) {
        const float b = bias ? bias[o] : 0.f;
        row[o] = c[o] * (row[o] - b) + b;
      }
    }
  }
  if (e.start) {  // y += x A0^T (-s B0)^T
    const int r = e.a0.rows;
    float* t = scratch(0, x.rows * r);
    float* u = scratch(1, x.rows * y.cols);
    be_.linear_fwd(e.a0, nullptr, nullptr, x, MatF(t, x.rows, r), nullptr);
    be_.linear_fwd(e.b0, nullptr, nullptr, CMatF(t, x.rows, r), MatF(u, x.rows, y.cols), nullptr);
    for (int64_t i = 0; i < y.rows; ++i) be_.add(y.row(i), u + i * y.cols, y.cols);
  }
}

CMatF LoraExtras::before_bwd(int l, Proj p, const LoraRef* ref, CMatF x, CMatF dy, float* dM) {
  if (!any_) return dy;
  Slot& e = slot(l, p);
  if (!e.dora) return dy;
  const int64_t R = dy.rows, out = dy.cols;
  float* z = scratch(0, R * out);
  float* dyc = scratch(1, R * out);
  be_.linear_fwd(model_.layers[l].proj[static_cast<int>(p)], nullptr, ref, x, MatF(z, R, out),
                 nullptr);
  const float* c = e.c.data();
  const float* inv_n = e.inv_n.data();
#pragma omp parallel for num_threads(qlft::num_threads()) schedule(static) if (out >= 256)
  for (int64_t o = 0; o < out; ++o) {
    double g = 0;
    for (int64_t t = 0; t < R; ++t) {
      const float d = dy.at(t, o);
      g += static_cast<double>(d) * z[t * out + o];
      dyc[t * out + o] = c[o] * d;
    }
    if (dM) dM[o] += static_cast<float>(g * inv_n[o]);
  }
  return CMatF(dyc, R, out);
}

void LoraExtras::after_bwd(int l, Proj p, CMatF dy, MatF dx) {
  if (!any_ || !dx.data) return;
  Slot& e = slot(l, p);
  if (!e.start) return;
  const int r = e.a0.rows;
  float* t = scratch(0, dy.rows * r);
  std::memset(t, 0, static_cast<size_t>(dy.rows) * r * 4);
  // dt = dy (-s B0), then dx += dt A0
  be_.linear_bwd(e.b0, nullptr, CMatF(nullptr, dy.rows, r), nullptr, dy, MatF(t, dy.rows, r),
                 nullptr, nullptr);
  be_.linear_bwd(e.a0, nullptr, CMatF(nullptr, dy.rows, dx.cols), nullptr, CMatF(t, dy.rows, r), dx,
                 nullptr, nullptr);
}

void dora_init_magnitude(LoraAdapter& lora, const Model& model) {
  QLFT_CHECK_ARG(lora.config().use_dora, "dora_init_magnitude: the adapter has no use_dora");
  const float s = lora.config().scale();
  for (int l = 0; l < lora.n_layers(); ++l)
    for (int p = 0; p < kProjCount; ++p) {
      if (!lora.active(l, static_cast<Proj>(p))) continue;
      const QWeight& w = model.layers[l].proj[p];
      LoraSlot& ls = lora.slot(l, static_cast<Proj>(p));
      const float* A = ls.A.as<float>();
      const float* B = ls.B.as<float>();
      std::vector<float> wr(static_cast<size_t>(ls.in));
      for (int o = 0; o < ls.out; ++o) {
        w.dequantize_rows(o, 1, wr.data());
        double n = 0;
        for (int k = 0; k < ls.in; ++k) {
          double v = wr[size_t(k)];
          for (int j = 0; j < ls.r; ++j)
            v += double(s) * B[int64_t(o) * ls.r + j] * A[int64_t(j) * ls.in + k];
          n += v * v;
        }
        ls.M.as<float>()[o] = static_cast<float>(std::sqrt(n));
      }
    }
}

void start_from_base(LoraAdapter& lora, const Model& model, LoraInit init) {
  QLFT_CHECK_ARG(init == LoraInit::Pissa || init == LoraInit::Olora,
                 "start_from_base: lora.init must be pissa or olora");
  const float s = lora.config().scale();
  const ModelShapes& sh = lora.model_shapes();
  for (int l = 0; l < lora.n_layers(); ++l)
    for (int p = 0; p < kProjCount; ++p) {
      const Proj pr = static_cast<Proj>(p);
      if (!lora.active(l, pr)) continue;
      const QWeight& w = model.layers[l].proj[p];
      const int r = lora.config().r;
      QLFT_CHECK_ARG(r <= std::min(w.rows, w.cols),
                     "lora.init=%s: lora.r %d exceeds min(out, in) = %lld of layer %d %s",
                     init == LoraInit::Pissa ? "pissa" : "olora", r,
                     static_cast<long long>(std::min(w.rows, w.cols)), l, proj_peft_name(pr));
      std::vector<float> W(static_cast<size_t>(w.rows * w.cols));
      w.dequantize_rows(0, w.rows, W.data());
      if (sh.qk_adjacent && (pr == Proj::Q || pr == Proj::K)) {  // PEFT factors HF-order rows
        std::vector<float> hf(W.size());
        permute_rows_adjacent_to_hf(W.data(), hf.data(), sh.heads_of(pr), sh.head_dim, w.cols);
        W.swap(hf);
      }
      std::vector<float> A(static_cast<size_t>(r * w.cols)), B(static_cast<size_t>(w.rows * r));
      if (init == LoraInit::Pissa)
        pissa_factors(W.data(), w.rows, w.cols, r, s, A.data(), B.data());
      else
        olora_factors(W.data(), w.rows, w.cols, r, A.data(), B.data());
      lora.set_hf(l, pr, A.data(), int64_t(A.size()), B.data(), int64_t(B.size()));
      lora.set_start_hf(l, pr, A.data(), int64_t(A.size()), B.data(), int64_t(B.size()));
    }
}

}  // namespace qlft
