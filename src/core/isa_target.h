// Function attributes that compile one function for a higher ISA level than the build's
// baseline (-march=x86-64-v3 by default), for kernels that carry a path per level and pick one at
// run time from cpu_isa() (core/cpu_isa.h). A function with such an attribute may inline the
// baseline helpers it calls (a subset of its ISA); out-of-line copies of shared inline functions
// stay baseline code, so nothing compiled for a higher level leaks into code every CPU runs (which
// compiling whole translation units with -mavx2 would risk through the linker's choice of one
// copy of each inline function). Lambdas do not inherit the attribute: kernels use none.
#pragma once

#include "core/cpu_isa.h"

#define QLFT_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define QLFT_TARGET_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define QLFT_TARGET_AVX512BF16 \
  __attribute__((target("avx512bf16,avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))

namespace qlft {

// The kernel sets compiled from one source per level (quant/quant_kernels.h,
// backend/cpu/vec_kernels.h) are kept in the order baseline, AVX2, AVX-512: the index of the set
// that runs at level isa (the best one at or below it).
inline int kernel_set_index(CpuIsa isa) {
  return isa >= CpuIsa::Avx512 ? 2 : isa >= CpuIsa::Avx2 ? 1 : 0;
}

// kernel_set_index(cpu_isa()), found once per process: the index of the set every family runs.
inline int cpu_kernel_set_index() {
  static const int i = kernel_set_index(cpu_isa());
  return i;
}

// A family's table of its three sets, in that order, from the namespaces core/isa_sets.inc
// compiled its source into: SET(level, ns) writes one Set of the kernels in namespace ns.
#define QLFT_KERNEL_SETS(Set, name, SET)                                                 \
  const Set name[3] = {SET(CpuIsa::Baseline, isa_baseline), SET(CpuIsa::Avx2, isa_avx2), \
                       SET(CpuIsa::Avx512, isa_avx512)}

// Such a table of sets: the one this CPU runs, and the one of level isa, or nullptr when this CPU
// cannot run it (what a test that expects a level's path asks).
template <class Set>
const Set& kernel_set_for_cpu(const Set (&sets)[3]) {
  return sets[cpu_kernel_set_index()];
}
template <class Set>
const Set* kernel_set_at(const Set (&sets)[3], CpuIsa isa) {
  return isa > cpu_isa() ? nullptr : &sets[kernel_set_index(isa)];
}

}  // namespace qlft
