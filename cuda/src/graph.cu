// Stream graphs (graph.h).
#include "graph.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "check.h"
#include "launch_count.h"

namespace qlft::cu {

namespace {

// The recorded streams of this process (one per CudaBackend with graphs on).
struct Registry {
  std::mutex m;
  std::vector<StreamGraphs*> all;
  std::atomic<int> n{0};  // the launch path's fast check
};
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

StreamGraphs* find(cudaStream_t s) {
  Registry& r = registry();
  if (r.n.load(std::memory_order_relaxed) == 0) return nullptr;
  std::lock_guard<std::mutex> g(r.m);
  for (StreamGraphs* x : r.all)
    if (x->stream() == s) return x;
  return nullptr;
}

}  // namespace

bool graphs_requested() {
  const char* e = std::getenv("QLFT_CUDA_GRAPHS");
  return e && std::strcmp(e, "1") == 0;
}

StreamGraphs::StreamGraphs(cudaStream_t s) : s_(s) {
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.m);
  r.all.push_back(this);
  r.n.store(int(r.all.size()));
}

StreamGraphs::~StreamGraphs() {
  try {
    flush();
  } catch (...) {  // a destructor must not throw; the stream's owner reports its errors
  }
  for (auto& [n, x] : execs_) QLFT_CUDA_WARN(cudaGraphExecDestroy(x));
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.m);
  r.all.erase(std::remove(r.all.begin(), r.all.end(), this), r.all.end());
  r.n.store(int(r.all.size()));
}

void StreamGraphs::open() {
  if (open_) return;
  QLFT_CUDA_CHECK(cudaStreamBeginCapture(s_, cudaStreamCaptureModeThreadLocal));
  open_ = true;
}

void StreamGraphs::flush() {
  if (!open_) return;
  open_ = false;
  cudaGraph_t g = nullptr;
  QLFT_CUDA_CHECK(cudaStreamEndCapture(s_, &g));
  size_t nodes = 0;
  QLFT_CUDA_CHECK(cudaGraphGetNodes(g, nullptr, &nodes));
  cudaGraphExec_t& x = execs_[nodes];
  if (x) {  // same node count: try taking the new parameters into the executable graph
    cudaGraphExecUpdateResultInfo info{};
    const cudaError_t e = cudaGraphExecUpdate(x, g, &info);  // may fail: then instantiate
    if (e == cudaSuccess) {
      ++updated_;
    } else {
      (void)cudaGetLastError();  // a topology or kernel change: instantiate anew
      QLFT_CUDA_WARN(cudaGraphExecDestroy(x));
      x = nullptr;
    }
  }
  if (!x) {
    QLFT_CUDA_CHECK(cudaGraphInstantiate(&x, g, 0));
    ++instantiated_;
  }
  QLFT_CUDA_CHECK(cudaGraphDestroy(g));
  if (nodes == 0) return;
  count_graph_launch();
  QLFT_CUDA_CHECK(cudaGraphLaunch(x, s_));
}

void graph_before_launch(cudaStream_t s) {
  if (StreamGraphs* x = find(s)) x->open();
}

bool graph_capturing(cudaStream_t s) {
  StreamGraphs* x = find(s);
  return x && x->capturing();
}

void graph_flush(cudaStream_t s) {
  if (StreamGraphs* x = find(s)) x->flush();
}

void graph_flush_all() {
  Registry& r = registry();
  if (r.n.load(std::memory_order_relaxed) == 0) return;
  std::vector<StreamGraphs*> all;
  {
    std::lock_guard<std::mutex> g(r.m);
    all = r.all;
  }
  for (StreamGraphs* x : all) x->flush();
}

}  // namespace qlft::cu
