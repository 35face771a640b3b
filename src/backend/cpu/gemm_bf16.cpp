#include "backend/cpu/gemm_bf16.h"

#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/cpu_isa.h"
#include "core/error.h"
#include "core/profile.h"
#include "core/threads.h"

namespace qlft::cpu {

namespace {

struct Key {
  int64_t M, N, K, lda, ldb, ldc;
  uint32_t alpha, beta;  // bit patterns
  bool ta, tb;
  bool f32 = false;  // fp32 A and B instead of bf16
  bool c16 = false;  // bf16 C instead of fp32 (gemm_bf16_out16)
  // fp32 primitives use oneDNN's library-managed scratchpad, which one primitive cannot share
  // between concurrent executions: each calling thread gets its own (0 for bf16, whose
  // scratchpad the caller passes).
  uint64_t thread = 0;
  // The team size: oneDNN's OpenMP runtime reads the caller's omp_get_max_threads() when it
  // creates a primitive (its blocking and its parallel(nthr, ...) count are fixed then) and when
  // it runs one, so a primitive is made and run under one count (the calling runtime's, set as
  // the caller's ICV for the call: OmpIcvScope) and cached per count.
  int threads = 1;
  bool operator==(const Key& o) const {
    return M == o.M && N == o.N && K == o.K && lda == o.lda && ldb == o.ldb && ldc == o.ldc &&
           alpha == o.alpha && beta == o.beta && ta == o.ta && tb == o.tb && f32 == o.f32 &&
           c16 == o.c16 && thread == o.thread && threads == o.threads;
  }
};

struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = 1469598103934665603ull;
    auto mix = [&](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
    mix(uint64_t(k.M));
    mix(uint64_t(k.N));
    mix(uint64_t(k.K));
    mix(uint64_t(k.lda));
    mix(uint64_t(k.ldb));
    mix(uint64_t(k.ldc));
    mix((uint64_t(k.alpha) << 32) | k.beta);
    mix(uint64_t(k.c16) * 8 + uint64_t(k.f32) * 4 + uint64_t(k.ta) * 2 + uint64_t(k.tb));
    mix(k.thread);
    mix(uint64_t(k.threads));
    return size_t(h);
  }
};

// The memory objects of one execution, pointed at each call's data.
struct Args {
  dnnl::memory a, b, c, scratch;
};

struct Entry {
  dnnl::matmul prim;
  dnnl::memory::desc a_md, b_md, c_md, scratch_md;
  size_t scratch_bytes = 0;
  std::string impl;
  // Args made once and reused: making them per call (memory objects and an argument map) was a
  // third of a small attention tile's time (M 32, N 32, K 64 fp32: 3.6 against 2.4 us on a
  // Zen 3). A free list, since the threads of a team may run one bf16 primitive at once.
  std::mutex args_mu;
  std::vector<std::unique_ptr<Args>> idle;
};

// Past this many shapes the cache is dropped and refilled: shapes come from a model's fixed
// layer sizes and chunking, so a real run stays far below it.
constexpr size_t kMaxEntries = 512;

struct Cache {
  std::mutex mu;
  std::unordered_map<Key, std::shared_ptr<Entry>, KeyHash> map;
};

Cache& cache() {
  static Cache c;
  return c;
}

// oneDNN's own ISA limit follows QLFT_CPU_ISA, so a capped run exercises the kernels a CPU of
// that level would get. oneDNN accepts the limit only before it dispatches its first kernel,
// hence here, where every use of oneDNN starts (engine creation and the ISA query).
void cap_onednn_isa() {
  static const bool done = [] {
    using isa = dnnl::cpu_isa;
    const CpuIsa level = cpu_isa();
    if (level >= cpu_isa_detected()) return true;  // not capped: oneDNN takes what it finds
    const isa cap = level == CpuIsa::Baseline ? isa::sse41
                    : level == CpuIsa::Avx2   ? isa::avx2
                    : level == CpuIsa::Avx512 ? isa::avx512_core_vnni
                                              : isa::avx512_core_bf16;
    try {
      dnnl::set_max_cpu_isa(cap);
    } catch (const dnnl::error&) {
      // Already dispatched, or ONEDNN_MAX_CPU_ISA set: oneDNN keeps its own limit, and
      // gemm_bf16_native() still follows cpu_isa().
    }
    return true;
  }();
  (void)done;
}

dnnl::engine& engine() {
  cap_onednn_isa();
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// A small id per thread that ever calls (never reused, so a cached primitive is never shared).
uint64_t calling_thread_id() {
  static std::atomic<uint64_t> next{1};
  thread_local const uint64_t id = next.fetch_add(1);
  return id;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

[[noreturn]] void rethrow_dnnl(const dnnl::error& e, const Key& k) {
  throw_error(QLFT_ERR_BACKEND,
              "oneDNN %s matmul [M %lld, N %lld, K %lld, trans_a %d, trans_b %d] failed: %s "
              "(dnnl status %d)",
              k.f32 ? "fp32" : "bf16", (long long)k.M, (long long)k.N, (long long)k.K, int(k.ta),
              int(k.tb), e.what(), int(e.status));
}

std::shared_ptr<Entry> get_entry(const Key& k, float alpha, float beta) {
  Cache& c = cache();
  {
    std::lock_guard<std::mutex> lock(c.mu);
    auto it = c.map.find(k);
    if (it != c.map.end()) return it->second;
  }
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  auto e = std::make_shared<Entry>();
  try {
    // Row-major op(A) [M, K]: element (m, k) at m * lda + k, or (trans_a) k * lda + m.
    const dt in = k.f32 ? dt::f32 : dt::bf16;
    e->a_md = dnnl::memory::desc(dims{k.M, k.K}, in, k.ta ? dims{1, k.lda} : dims{k.lda, 1});
    e->b_md = dnnl::memory::desc(dims{k.K, k.N}, in, k.tb ? dims{1, k.ldb} : dims{k.ldb, 1});
    e->c_md = dnnl::memory::desc(dims{k.M, k.N}, k.c16 ? dt::bf16 : dt::f32, dims{k.ldc, 1});
    dnnl::primitive_attr attr;
    // fp32: oneDNN keeps its own scratchpad (B packing, a few hundred KB per primitive), as
    // OpenBLAS keeps its packing buffers: the workspace the planner models is unchanged.
    if (!k.f32) attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (alpha != 1.f) attr.set_output_scales(0, {alpha});
    if (beta != 0.f) {
      dnnl::post_ops po;
      po.append_sum(beta);
      attr.set_post_ops(po);
    }
    dnnl::matmul::desc d(e->a_md, e->b_md, e->c_md);
    OmpIcvScope team(k.threads);
    dnnl::matmul::primitive_desc pd(d, attr, engine());
    e->scratch_md = pd.scratchpad_desc();
    e->scratch_bytes = e->scratch_md.get_size();
    e->impl = pd.impl_info_str();
    e->prim = dnnl::matmul(pd);
  } catch (const dnnl::error& err) {
    rethrow_dnnl(err, k);
  }
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.map.size() >= kMaxEntries) c.map.clear();
  auto ins = c.map.emplace(k, e);
  return ins.first->second;  // another thread may have made the same one first
}

Key make_key(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
             int64_t ldc, float alpha, float beta) {
  QLFT_CHECK_ARG(M >= 0 && N >= 0 && K >= 0, "gemm_bf16: negative size M %lld, N %lld, K %lld",
                 (long long)M, (long long)N, (long long)K);
  const int64_t a_cols = trans_a ? M : K, b_cols = trans_b ? K : N;
  QLFT_CHECK_ARG(lda >= std::max<int64_t>(1, a_cols) && ldb >= std::max<int64_t>(1, b_cols) &&
                     ldc >= std::max<int64_t>(1, N),
                 "gemm_bf16: leading dimensions lda %lld, ldb %lld, ldc %lld too small for "
                 "M %lld, N %lld, K %lld (trans_a %d, trans_b %d)",
                 (long long)lda, (long long)ldb, (long long)ldc, (long long)M, (long long)N,
                 (long long)K, int(trans_a), int(trans_b));
  Key k{M, N, K, lda, ldb, ldc, bits(alpha), bits(beta), trans_a, trans_b};
  k.threads = call_threads();
  return k;
}

}  // namespace

namespace {

void run(const Key& k, float alpha, float beta, const void* A, const void* B, void* Cv,
         MemoryTracker* tracker, void* scratchpad) {
  if (k.M == 0 || k.N == 0) return;
  // Every oneDNN matmul of the backend runs here: the op profile's GEMM engines (core/profile.h).
  QLFT_PROFILE_SCOPE(k.f32 ? "gemm.f32_onednn" : "gemm.bf16");
  if (k.K == 0) {  // op(A) op(B) is empty: C = beta * C (bf16 C: beta is 0)
    for (int64_t i = 0; i < k.M; ++i)
      for (int64_t j = 0; j < k.N; ++j) {
        if (k.c16) {
          static_cast<uint16_t*>(Cv)[i * k.ldc + j] = 0;
          continue;
        }
        float* C = static_cast<float*>(Cv);
        C[i * k.ldc + j] = beta == 0.f ? 0.f : beta * C[i * k.ldc + j];
      }
    return;
  }
  std::shared_ptr<Entry> e = get_entry(k, alpha, beta);
  Buffer scratch;
  if (e->scratch_bytes && !scratchpad) {
    scratch = Buffer(tracker, MemCategory::Workspace, e->scratch_bytes, "oneDNN matmul scratchpad");
    scratchpad = scratch.data();
  }
  try {
    dnnl::engine& eng = engine();
    // A stream per thread: a stream is not meant to be shared by concurrent callers.
    thread_local dnnl::stream stream(eng);
    std::unique_ptr<Args> m;
    {
      std::lock_guard<std::mutex> lock(e->args_mu);
      if (!e->idle.empty()) {
        m = std::move(e->idle.back());
        e->idle.pop_back();
      }
    }
    if (!m) {
      m = std::make_unique<Args>();
      m->a = dnnl::memory(e->a_md, eng, DNNL_MEMORY_NONE);
      m->b = dnnl::memory(e->b_md, eng, DNNL_MEMORY_NONE);
      m->c = dnnl::memory(e->c_md, eng, DNNL_MEMORY_NONE);
      if (e->scratch_bytes) m->scratch = dnnl::memory(e->scratch_md, eng, DNNL_MEMORY_NONE);
    }
    m->a.set_data_handle(const_cast<void*>(A));
    m->b.set_data_handle(const_cast<void*>(B));
    m->c.set_data_handle(Cv);
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, m->a.get()},
                               {DNNL_ARG_WEIGHTS, m->b.get()},
                               {DNNL_ARG_DST, m->c.get()},
                               {DNNL_ARG_SCRATCHPAD, nullptr}};
    int nargs = 3;
    if (e->scratch_bytes) {
      m->scratch.set_data_handle(scratchpad);
      args[nargs++].memory = m->scratch.get();
    }
    OmpIcvScope team(k.threads);
    dnnl::error::wrap_c_api(dnnl_primitive_execute(e->prim.get(), stream.get(), nargs, args),
                            "could not execute a matmul");
    stream.wait();
    std::lock_guard<std::mutex> lock(e->args_mu);
    e->idle.push_back(std::move(m));
  } catch (const dnnl::error& err) {
    rethrow_dnnl(err, k);
  }
}

Key make_key_f32(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, int64_t lda,
                 int64_t ldb, int64_t ldc, float alpha, float beta) {
  Key k = make_key(trans_a, trans_b, M, N, K, lda, ldb, ldc, alpha, beta);
  k.f32 = true;
  k.thread = calling_thread_id();
  return k;
}

}  // namespace

// The bf16 entry points refuse clearly where oneDNN has no bf16 matmul (rather than failing in
// primitive creation with oneDNN's "could not create a primitive descriptor iterator").
static void require_bf16_matmul() {
  if (!gemm_bf16_available())
    throw_error(QLFT_ERR_UNSUPPORTED,
                "oneDNN has no bf16 matmul on this CPU (isa %s, found %s): it needs AVX-512; use "
                "the sgemm engine for bf16 (CpuTuning::Bf16Gemm::Sgemm, the default there)",
                cpu_isa_name(cpu_isa()), cpu_isa_name(cpu_isa_detected()));
}

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C,
               int64_t ldc, MemoryTracker* tracker, void* scratchpad) {
  require_bf16_matmul();
  run(make_key(trans_a, trans_b, M, N, K, lda, ldb, ldc, alpha, beta), alpha, beta, A, B, C,
      tracker, scratchpad);
}

void gemm_f32_onednn(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                     const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                     int64_t ldc, MemoryTracker* tracker, void* scratchpad) {
  run(make_key_f32(trans_a, trans_b, M, N, K, lda, ldb, ldc, alpha, beta), alpha, beta, A, B, C,
      tracker, scratchpad);
}

size_t gemm_f32_onednn_scratchpad_size(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                                       int64_t lda, int64_t ldb, int64_t ldc, float alpha,
                                       float beta) {
  const Key k = make_key_f32(trans_a, trans_b, M, N, K, lda, ldb, ldc, alpha, beta);
  if (M == 0 || N == 0 || K == 0) return 0;
  return get_entry(k, alpha, beta)->scratch_bytes;
}

void sgemm_onednn(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                  const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                  int64_t ldc) {
  cap_onednn_isa();  // before its first kernel, as for the matmul primitives
  const dnnl_status_t st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, A,
                                      lda, B, ldb, beta, C, ldc);
  if (st != dnnl_success)
    throw_error(QLFT_ERR_BACKEND,
                "oneDNN sgemm [M %lld, N %lld, K %lld, trans_a %d, trans_b %d] failed (dnnl "
                "status %d)",
                (long long)M, (long long)N, (long long)K, int(trans_a), int(trans_b), int(st));
}

bool gemm_bf16_native() {
  static const bool native = [] {
    try {
      // oneDNN's ISA values are bit sets, each a superset of the ones below it (AMX includes
      // AVX512-BF16). Without AVX512-BF16 oneDNN falls back to gemm:jit, which converts bf16 to
      // fp32 in software: measured 4x slower than OpenBLAS sgemm on a Cascade Lake.
      if (cpu_isa() < CpuIsa::Avx512Bf16) return false;
      cap_onednn_isa();
      const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
      const auto bf16 = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
      return (isa & bf16) == bf16;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return native;
}

bool gemm_bf16_available() {
  // oneDNN 2.x implements bf16 matmul from avx512_core up (gemm:jit converting in software,
  // brgemm with AVX512-BF16 or AMX); below that no implementation accepts bf16 inputs.
  static const bool available = [] {
    if (cpu_isa() < CpuIsa::Avx512) return false;
    try {
      get_entry(make_key(false, false, 4, 4, 4, 4, 4, 4, 1.f, 0.f), 1.f, 0.f);
      return true;
    } catch (const Error&) {
      return false;
    }
  }();
  return available;
}

std::string gemm_bf16_impl(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, int64_t lda,
                           int64_t ldb, int64_t ldc, float alpha, float beta) {
  const Key k = make_key(trans_a, trans_b, M, N, K, lda, ldb, ldc, alpha, beta);
  QLFT_CHECK_ARG(M > 0 && N > 0 && K > 0, "gemm_bf16_impl: empty GEMM");
  require_bf16_matmul();
  return get_entry(k, alpha, beta)->impl;
}

size_t gemm_bf16_scratchpad_size(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                                 int64_t lda, int64_t ldb, int64_t ldc, float alpha, float beta) {
  const Key k = make_key(trans_a, trans_b, M, N, K, lda, ldb, ldc, alpha, beta);
  if (M == 0 || N == 0 || K == 0) return 0;
  require_bf16_matmul();
  return get_entry(k, alpha, beta)->scratch_bytes;
}

void gemm_bf16_out16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                     const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb, uint16_t* C,
                     int64_t ldc, MemoryTracker* tracker, void* scratchpad) {
  require_bf16_matmul();
  Key k = make_key(trans_a, trans_b, M, N, K, lda, ldb, ldc, alpha, 0.f);
  k.c16 = true;
  run(k, alpha, 0.f, A, B, C, tracker, scratchpad);
}

size_t gemm_bf16_out16_scratchpad_size(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                                       int64_t lda, int64_t ldb, int64_t ldc, float alpha) {
  Key k = make_key(trans_a, trans_b, M, N, K, lda, ldb, ldc, alpha, 0.f);
  k.c16 = true;
  if (M == 0 || N == 0 || K == 0) return 0;
  require_bf16_matmul();
  return get_entry(k, alpha, 0.f)->scratch_bytes;
}

size_t gemm_bf16_cache_size() {
  std::lock_guard<std::mutex> lock(cache().mu);
  return cache().map.size();
}

void gemm_bf16_clear_cache() {
  std::lock_guard<std::mutex> lock(cache().mu);
  cache().map.clear();
}

}  // namespace qlft::cpu
