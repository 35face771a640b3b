// What the CPU backend's two attention paths share (cpu_attention.cpp on oneDNN / sgemm tile
// GEMMs, cpu_attention_amx.cpp on AMX tiles): the task geometry, the document starts and the
// softmax passes over a tile's score rows.
#pragma once

#include <cstddef>
#include <cmath>
#include <cstdint>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "core/fp_env.h"
#include "core/profile.h"

namespace qlft::cpu::attn {

int thread_id();

// Scratch for a team of nt threads, one slab of `per` bytes each: team thread t owns the slab at
// t * per, so the threads' tiles never share bytes.
class ThreadSlabs {
 public:
  ThreadSlabs(const CpuBackend& be, int nt, size_t per, const char* what)
      : buf_(be.scratch_buffer(per * size_t(nt), what)), per_(per) {}
  // The calling team thread's slab (inside the team's parallel region).
  char* mine() { return static_cast<char*>(buf_.data()) + per_ * size_t(thread_id()); }

 private:
  Buffer buf_;
  size_t per_;
};

// The team a tile loop runs on: nt threads in one parallel region, each with its slab of `per`
// bytes (ThreadSlabs) and subnormals flushed when `flush` (core/fp_env.h: subnormal products
// cost Intel cores), calling body(slab, errs, times); body's own `omp for` loops share out the
// tasks, each run through errs (a oneDNN scratchpad past memory.limit throws inside the region).
// After the region: the first task's exception rethrown, the tile products' times reported
// (op profile).
template <class Times, class Body>
void run_tile_team(const CpuBackend& be, int nt, size_t per, const char* what, bool flush,
                   Body&& body) {
  ThreadSlabs slabs(be, nt, per, what);
  TaskErrors errs;
  Times times(nt);
#pragma omp parallel num_threads(nt)
  {
    const ScopedFlushDenormals flushed(flush);
    body(slabs.mine(), errs, times);
  }
  errs.rethrow();
  times.report();
}

// first[row] = the first position j of the same batch element with doc[j] == doc[row]: no key
// before it can be attended by this row, which bounds each tile's key range.
Buffer first_same_doc(const CpuBackend& be, const AttnShape& s);

// One task's geometry: batch element b, head h, queries [q0, q0 + nq), keys [k0, k1). Its score
// tile is [nq, k1 - k0]; the keys from q0 on are its diagonal block, masked above the diagonal.
struct Tile {
  int b, h, kh;
  int64_t q0, nq, k0, k1;
  int64_t diag() const { return q0 - k0; }  // the tile column where the diagonal block starts
  // The columns of row i that the products compute and read: to its stair's end (for_stairs).
  int64_t row_width(int64_t i, int64_t step) const {
    return diag() + std::min(nq, (i / step + 1) * step);
  }
};

// The tile of query block qb (rows of bq) of head h in batch element b; its first key is the
// earliest of its rows' first visible keys (document start, sliding window's start), rounded
// down to a multiple of key_align.
Tile make_tile(const AttnShape& s, const int32_t* first, int64_t bq, int b, int h, int64_t qb,
               int64_t key_align);

// The softmax passes over a tile's scores S (nq rows, row stride ld) after its Q K^T product:
// each row i times `prescale` (when not 1), masked (other documents, keys past the diagonal,
// keys before the sliding window),
// then probabilities exp(S - lse) (lse_in given) or, with lse_in null, its log-sum-exp computed
// (stored in lse_out when given) and exp(S - lse). Row i is written to width(i) =
// row_width(i, step) when pad_to is 0, else pad_to columns, the masked ones 0. With pbf the
// probabilities are also written there as bf16 bits (row stride ld), in the same pass; the
// forward (lse_in null) then leaves S as exp(S - max), unnormalized.
// AttnShape::softcap caps the scaled scores (cap * tanh(S / cap)) before the mask.
void tile_softmax_rows(const AttnShape& s, const Tile& t, int64_t step, int64_t pad_to,
                       float prescale, float* S, int64_t ld, const float* lse_in, float* lse_out,
                       uint16_t* pbf);

// The soft-cap's backward on one row of dS (after the softmax backward): dS[j] times
// 1 - tanh^2 of its score, the capped score recovered from the probability as log(P) + lse
// (no tanh kept between the passes); P = 0 rows have dS = 0 already.
inline void softcap_bwd_row(float* dS, const float* P, float lse, float cap, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    if (!(P[j] > 0.f)) continue;
    const float th = (std::log(P[j]) + lse) / cap;
    dS[j] *= 1.f - th * th;
  }
}

// The tile products' times for the op profile (per-thread time over the team size): the
// forward's Q K^T and P V; the backward's Q K^T recomputed, dO V^T, dS K, and dS^T Q with P^T dO.
struct FwdTileTimes {
  prof::TeamTimes qk, pv;
  explicit FwdTileTimes(int nt) : qk(nt), pv(nt) {}
  void report() const {
    qk.report("tile_qk");
    pv.report("tile_pv");
  }
};
struct BwdTileTimes {
  prof::TeamTimes qk, dp, dq, dkdv;
  explicit BwdTileTimes(int nt) : qk(nt), dp(nt), dq(nt), dkdv(nt) {}
  void report() const {
    qk.report("tile_qk");
    dp.report("tile_dp");
    dq.report("tile_dq");
    dkdv.report("tile_dkdv");
  }
};

}  // namespace qlft::cpu::attn
