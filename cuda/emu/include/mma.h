// <mma.h> for the CUDA emulator: the warp matrix API (nvcuda::wmma) for the 16x16x16 bf16 shape
// with fp32 accumulation, the one the attention kernels use (cuda/src/k_attention_tc.cu).
//
// Semantics, as exact as CUDA specifies them and stricter where it leaves things open:
// - A fragment holds 8 elements per lane (num_elements, as CUDA's bf16 and fp32 16x16x16
//   fragments). Which tile element lane l's x[e] is, is unspecified in CUDA; here it is element
//   e * 32 + l of the tile in (row, col) order, row = m (matrix_a, accumulator) or k (matrix_b).
//   Kernels may only apply the same operation to every x[e].
// - A fragment is NaN from construction (CUDA leaves it undefined), so a missing load shows.
// - load_matrix_sync / store_matrix_sync / mma_sync are collective: every lane of the warp must
//   call them (a lane that has exited fails the launch), with one pointer and one ldm for all
//   lanes, the pointer 256-bit aligned, ldm a multiple of 16 bytes. A load reads its lane's
//   elements before the warp meets, a store writes them after: as on hardware, a lane reading
//   (through a load or plainly) what other lanes wrote needs a __syncwarp() in between.
// - mma_sync: d = c + a b with every bf16 product exact in fp32 and the 16 products of an
//   element added to c in k order 0..15, each add rounded to fp32. A tensor core's internal
//   order and rounding are unspecified (and differ by architecture): results agree with a GPU
//   to fp32 summation-order differences, which is why tests hold them to bf16-derived bounds.
// - Each load takes its call site (file, line): QLFT_EMU_SKIP_SITE can switch it off
//   (qlft_emu::skip_site), so a sweep shows the suite fails without any one fragment load.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cuda_bf16.h"

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

namespace detail {

constexpr int kElems = 8;  // per lane: 256 tile elements over 32 lanes

inline float widen(float x) {
  return x;
}
inline float widen(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
inline void poison(float& x) {
  x = std::nanf("");
}
inline void poison(__nv_bfloat16& x) {
  x.__x = 0x7fc0;
}
inline void narrow(float v, float& out) {
  out = v;
}
inline void narrow(float v, __nv_bfloat16& out) {
  out = __float2bfloat16(v);
}

inline int lane() {
  return qlft_emu::lane_id();
}
inline unsigned warp_in_block() {
  const uint3& t = qlft_emu::thread_idx();
  return (t.x + t.y * blockDim.x + t.z * blockDim.x * blockDim.y) / 32;
}

// The collective check: every lane meets here (a __syncwarp) and holds lane 0's pointer and ldm.
inline void meet(const void* p, unsigned ldm, unsigned elem_bytes, const char* op) {
  const uint64_t mine = reinterpret_cast<uintptr_t>(p);
  const uint64_t p0 = qlft_emu::shfl(0xffffffffu, mine, 0);
  const uint64_t l0 = qlft_emu::shfl(0xffffffffu, ldm, 0);
  if (p0 != mine || l0 != ldm) qlft_emu::device_fault(op);
  if (mine % 32 != 0) qlft_emu::device_fault("wmma: matrix pointer not 256-bit aligned");
  if (ldm * elem_bytes % 16 != 0) qlft_emu::device_fault("wmma: ldm not a multiple of 16 bytes");
}

// Where element e of lane l sits in the tile: (row, col).
inline int row_of(int e, int l) {
  return (e * 32 + l) / 16;
}
inline int col_of(int e, int l) {
  return (e * 32 + l) % 16;
}

// Element (r, c) of a fragment given every lane's copy: lane (r*16+c) % 32, x[(r*16+c) / 32].
template <class Frag>
inline float at(const Frag* const* lanes, int r, int c) {
  const int t = r * 16 + c;
  return widen(lanes[t % 32]->x[t / 32]);
}

// mma_sync's exchange: each warp of the block publishes its lanes' fragments here. Blocks and
// kernels run one at a time on one OS thread (launch.cpp), so one table per thread suffices.
struct MmaSlot {
  const void *a, *b, *c;
};
inline MmaSlot (&mma_table())[32][32] {
  static thread_local MmaSlot t[32][32];
  return t;
}

}  // namespace detail

template <class Use, int M, int N, int K, class T, class Layout = void>
class fragment {
  static_assert(M == 16 && N == 16 && K == 16, "the emulator has the 16x16x16 shape only");

 public:
  using element_type = T;
  using storage_element_type = T;
  enum { num_elements = detail::kElems };
  T x[detail::kElems];
  fragment() {
    for (T& v : x) detail::poison(v);
  }
};

template <class Use, class T, class Layout>
inline void fill_fragment(fragment<Use, 16, 16, 16, T, Layout>& f, const T& v) {
  for (T& x : f.x) x = v;
}

// matrix_a / matrix_b: the layout is the fragment's.
template <class Use, class T, class Layout>
inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& f, const T* p, unsigned ldm,
                             const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  if (qlft_emu::skip_site(file, line)) return;  // switched off: the fragment keeps what it held
  constexpr bool row = std::is_same<Layout, row_major>::value;
  static_assert(row || std::is_same<Layout, col_major>::value, "matrix_a/b need a layout");
  const int l = detail::lane();
  T v[detail::kElems];
  for (int e = 0; e < detail::kElems; ++e) {
    const int r = detail::row_of(e, l), c = detail::col_of(e, l);
    v[e] = row ? p[size_t(r) * ldm + c] : p[size_t(c) * ldm + r];
  }
  detail::meet(p, ldm, sizeof(T), "wmma::load_matrix_sync: lanes pass different pointers or ldm");
  for (int e = 0; e < detail::kElems; ++e) f.x[e] = v[e];
}

// accumulator: the memory layout is an argument.
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p,
                             unsigned ldm, layout_t layout, const char* file = __builtin_FILE(),
                             int line = __builtin_LINE()) {
  if (qlft_emu::skip_site(file, line)) return;  // switched off: the fragment keeps what it held
  const int l = detail::lane();
  float v[detail::kElems];
  for (int e = 0; e < detail::kElems; ++e) {
    const int r = detail::row_of(e, l), c = detail::col_of(e, l);
    v[e] = layout == mem_row_major ? p[size_t(r) * ldm + c] : p[size_t(c) * ldm + r];
  }
  detail::meet(p, ldm, 4, "wmma::load_matrix_sync: lanes pass different pointers or ldm");
  for (int e = 0; e < detail::kElems; ++e) f.x[e] = v[e];
}

inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f,
                              unsigned ldm, layout_t layout) {
  detail::meet(p, ldm, 4, "wmma::store_matrix_sync: lanes pass different pointers or ldm");
  const int l = detail::lane();
  for (int e = 0; e < detail::kElems; ++e) {
    const int r = detail::row_of(e, l), c = detail::col_of(e, l);
    (layout == mem_row_major ? p[size_t(r) * ldm + c] : p[size_t(c) * ldm + r]) = f.x[e];
  }
}

// d = c + a b. Lanes publish their fragments, meet, each computes its own 8 elements of d from
// all lanes' a, b and c, meet again (so no lane overwrites d == c before all have read it), write.
template <class T, class LA, class LB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float>& d,
                     const fragment<matrix_a, 16, 16, 16, T, LA>& a,
                     const fragment<matrix_b, 16, 16, 16, T, LB>& b,
                     const fragment<accumulator, 16, 16, 16, float>& c, bool satf = false) {
  using FA = fragment<matrix_a, 16, 16, 16, T, LA>;
  using FB = fragment<matrix_b, 16, 16, 16, T, LB>;
  using FC = fragment<accumulator, 16, 16, 16, float>;
  const int l = detail::lane();
  detail::MmaSlot(&warp)[32] = detail::mma_table()[detail::warp_in_block()];
  warp[l] = {&a, &b, &c};
  qlft_emu::sync_warp(0xffffffffu);
  const FA* as[32];
  const FB* bs[32];
  const FC* cs[32];
  for (int i = 0; i < 32; ++i) {
    as[i] = static_cast<const FA*>(warp[i].a);
    bs[i] = static_cast<const FB*>(warp[i].b);
    cs[i] = static_cast<const FC*>(warp[i].c);
  }
  float out[detail::kElems];
  for (int e = 0; e < detail::kElems; ++e) {
    const int r = detail::row_of(e, l), col = detail::col_of(e, l);
    float acc = detail::at(cs, r, col);
    for (int k = 0; k < 16; ++k) acc += detail::at(as, r, k) * detail::at(bs, k, col);
    out[e] = satf ? (acc != acc ? 0.f : acc < 0.f ? 0.f : acc > 1.f ? 1.f : acc) : acc;
  }
  qlft_emu::sync_warp(0xffffffffu);
  for (int e = 0; e < detail::kElems; ++e) d.x[e] = out[e];
}

}  // namespace nvcuda::wmma
