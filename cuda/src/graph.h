// CUDA graphs for the backend's stream (issue 45, "few launches"): with graphs on (cuda.graphs,
// or QLFT_CUDA_GRAPHS=1 when a CudaBackend is made), the stream's work between two points
// where the host needs it done is recorded by stream capture and submitted as one graph launch.
//
// A capture opens at the first kernel launched on the stream (cu::launch, check.h); everything
// queued on the stream after it (kernels, cuBLASLt matmuls, device copies and fills) is recorded
// in order. It is closed, instantiated (or an earlier executable graph of the same nodes takes
// the new parameters: cudaGraphExecUpdate) and launched where the host would otherwise wait for
// the stream or hand it host memory: before a copy to or from the host, a stream
// synchronization, and before a driver call that synchronizes the device (cudaMalloc /
// cudaFree / synchronous copies in allocator.cu). So the work runs in the order and with the
// arguments and addresses it was issued with, as eager launches do; only the submissions
// differ: per training step a few graph launches (one per host wait) instead of hundreds of
// kernel launches. The capture is thread-local mode: a synchronizing call this file does not
// know about fails loudly (cudaErrorStreamCaptureUnsupported) instead of reading unfinished work.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>

namespace qlft::cu {

class StreamGraphs {
 public:
  explicit StreamGraphs(cudaStream_t s);  // records s from now on
  ~StreamGraphs();                        // launches what is recorded; stops recording
  StreamGraphs(const StreamGraphs&) = delete;
  StreamGraphs& operator=(const StreamGraphs&) = delete;

  void open();   // begins a capture unless one is open
  void flush();  // ends the open capture (if any) and launches it
  bool capturing() const { return open_; }
  cudaStream_t stream() const { return s_; }
  uint64_t instantiated() const { return instantiated_; }  // new executable graphs made
  uint64_t updated() const { return updated_; }            // executable graphs reused

 private:
  cudaStream_t s_;
  bool open_ = false;
  std::map<size_t, cudaGraphExec_t> execs_;  // by node count: the last one of that size
  uint64_t instantiated_ = 0, updated_ = 0;
};

bool graphs_requested();                   // QLFT_CUDA_GRAPHS=1
void graph_before_launch(cudaStream_t s);  // opens a capture where s is recorded
bool graph_capturing(cudaStream_t s);      // s records into an open capture now
void graph_flush(cudaStream_t s);          // before the host waits on s or copies with it
void graph_flush_all();                    // before a driver call that synchronizes the device

}  // namespace qlft::cu
