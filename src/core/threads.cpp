#include "core/threads.h"

#include <sched.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/thread_count_source.h"

namespace qlft {

namespace {
// 0: no count set on this thread (the default, available_cores(), applies).
thread_local int t_threads = 0;
// Where num_threads() looks when t_threads is 0 (the CUDA plugin: libqlft's num_threads).
int (*g_source)() = nullptr;

int normalized(int n) {
  return n > 0 ? n : available_cores();
}
}  // namespace

int available_cores() {
  static const int cores = [] {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
      int n = CPU_COUNT(&set);
      if (n > 0) return n;
    }
    return 1;
  }();
  return cores;
}

void set_num_threads(int n) {
  t_threads = normalized(n);
}

void set_thread_count_source(int (*source)()) {
  g_source = source;
}

int num_threads() {
  const int n = t_threads;
  if (n > 0) return n;
  return g_source ? g_source() : available_cores();
}

int ThreadCount::get() {
  return t_threads;
}
void ThreadCount::set(int n) {
  t_threads = normalized(n);
}
void ThreadCount::restore(int prev) {
  t_threads = prev;
}

#ifdef _OPENMP
int OmpIcv::get() {
  return omp_get_max_threads();
}
void OmpIcv::set(int n) {
  if (n != omp_get_max_threads()) omp_set_num_threads(n);
}

int call_threads() {
  return omp_in_parallel() ? 1 : num_threads();
}
#else
int OmpIcv::get() {
  return 1;
}
void OmpIcv::set(int) {}
int call_threads() {
  return 1;
}
#endif

}  // namespace qlft
