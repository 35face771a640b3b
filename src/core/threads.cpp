#include "core/threads.h"

#include <sched.h>

#include <atomic>

#ifdef _OPENMP
#include <omp.h>
#endif

extern "C" void openblas_set_num_threads(int num_threads);

namespace qlft {

namespace {
std::atomic<int> g_threads{0};
}

int available_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  return 1;
}

void set_num_threads(int n) {
  if (n <= 0) n = available_cores();
  g_threads.store(n);
#ifdef _OPENMP
  omp_set_num_threads(n);
#endif
  openblas_set_num_threads(n);
}

int num_threads() {
  int n = g_threads.load();
  return n > 0 ? n : available_cores();
}

}  // namespace qlft
