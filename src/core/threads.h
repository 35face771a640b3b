// Thread control owned by the runtime, per calling OS thread.
//
// Each OS thread carries its own "current thread count": the C API sets it from the runtime's
// `threads` for the length of every call that computes (ThreadScope), every OpenMP region takes it
// through a num_threads(qlft::num_threads()) clause, and the GEMM wrappers hand it to OpenBLAS /
// oneDNN per call (backend/cpu). Nothing process-wide is changed: no omp_set_num_threads on the
// caller's behalf (except set-and-restore around one library call, OmpIcvScope), no
// openblas_set_num_threads. So two runtimes with different `threads` in one process each get
// theirs, whichever OS thread (pthread, Go goroutine's M) calls, and the host program's own OpenMP
// and BLAS settings stay as it set them.
#pragma once

namespace qlft {

// The thread count for compute on this OS thread: the innermost ThreadScope's, else the last
// set_num_threads on this thread, else available_cores(). Always >= 1. A thread_local read.
int num_threads();

// Sets this OS thread's count outside any scope (tests, tools that drive the library below the C
// API). n <= 0 means available_cores(). Other threads are not affected.
void set_num_threads(int n);

// The number of cores the process may run on (its CPU affinity mask).
int available_cores();

// A per-thread count set for a scope's lifetime and restored after it (nesting: a callback that
// calls into another runtime gets that runtime's count, then the outer one's again). Count has
// static get() (the raw value, so restoring puts back exactly what was there), set(n) and
// restore(prev).
template <class Count>
class CountScope {
 public:
  explicit CountScope(int n) : prev_(Count::get()) { Count::set(n); }
  ~CountScope() { Count::restore(prev_); }
  CountScope(const CountScope&) = delete;
  CountScope& operator=(const CountScope&) = delete;

 private:
  int prev_;
};

// This OS thread's count (num_threads); n <= 0 means available_cores().
struct ThreadCount {
  static int get();
  static void set(int n);
  static void restore(int prev);
};
using ThreadScope = CountScope<ThreadCount>;

// The calling thread's OpenMP nthreads ICV (what omp_get_max_threads returns there, and what
// OpenBLAS's OpenMP build and oneDNN's OpenMP runtime read per call): the ICV is per thread
// (OpenMP 5.2, 2.4.1: nthreads-var has data environment scope), so no other thread sees the
// change.
struct OmpIcv {
  static int get();
  static void set(int n);
  static void restore(int prev) { set(prev); }
};
using OmpIcvScope = CountScope<OmpIcv>;

// The team size a library call made here should use: 1 inside an active OpenMP region (nested
// regions are inactive anyway, and BLAS/oneDNN run sequentially there), else num_threads().
int call_threads();

}  // namespace qlft
