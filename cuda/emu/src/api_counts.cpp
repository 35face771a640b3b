// What the emulated runtime was asked to do, per stream: kernel launches (by kernel), cuBLASLt
// matmuls, copies and fills. Counted where the runtime accepts the work, independently of the
// backend's own launch counting (cuda/src/launch_count.h), which tests compare with it.
#include <map>
#include <mutex>

#include "emu_internal.h"

namespace qlft_emu {

namespace {

struct All {
  std::mutex m;
  std::map<cudaStream_t, StreamCounts> streams;
  std::map<const void*, uint64_t> kernels;
};
All& all() {
  static All* a = new All;
  return *a;
}

}  // namespace

void count_api(cudaStream_t s, Api a, const void* kernel) {
  if (a != Api::Event) timeline_op(s, a, kernel);  // (timeline.cpp; replays included)
  if (a == Api::Event || replaying()) return;      // a replay's work was counted when captured
  All& x = all();
  std::lock_guard<std::mutex> g(x.m);
  StreamCounts& c = x.streams[s];
  switch (a) {
    case Api::Kernel:
      ++c.kernels;
      ++x.kernels[kernel];
      break;
    case Api::Matmul:
      ++c.matmuls;
      break;
    case Api::Memcpy:
      ++c.memcpys;
      break;
    case Api::Memset:
      ++c.memsets;
      break;
    case Api::Graph:
      ++c.graphs;
      break;
    case Api::Event:
      break;
  }
}

std::map<cudaStream_t, StreamCounts> stream_counts() {
  All& x = all();
  std::lock_guard<std::mutex> g(x.m);
  return x.streams;
}

std::map<const void*, uint64_t> kernel_counts() {
  All& x = all();
  std::lock_guard<std::mutex> g(x.m);
  return x.kernels;
}

}  // namespace qlft_emu
