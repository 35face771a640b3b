// The NCCL communicator (src/backend/nccl_entry.h): collectives between GPU ranks on device
// buffers. Rank 0 makes NCCL's unique id and sends it to the others through the bootstrap
// communicator (MPI); each rank drives CUDA device local_rank % device count.
//
// Host buffers (scalars, settings checks, gathered optimizer state) go to the bootstrap
// communicator (host()). A device backend's work is ordered before each collective by an event
// on its stream (follow_stream), so a gradient the backward pass is still writing is never sent.
//
// Timeouts as in the MPI communicator: the communicator is created non-blocking, every
// collective is enqueued on the communicator's stream and then polled (cudaStreamQuery and
// ncclCommGetAsyncError) until done, failed or past dist.timeout_s; a failure aborts the NCCL
// communicator (ncclCommAbort frees the GPU from the stuck kernels) and throws
// QLFT_ERR_DISTRIBUTED.
#include <cuda_runtime.h>
#include <nccl.h>
#include <sched.h>
#include <time.h>

#include <chrono>
#include <memory>
#include <string>

#include "check.h"
#include "core/error.h"
#include "backend/nccl_entry.h"

namespace qlft::dist {

namespace {

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::unique_ptr<Communicator> boot, double timeout_s) : boot_(std::move(boot)) {
    set_timeout(timeout_s);
    rank_ = boot_->rank();
    world_ = boot_->world();
    local_rank_ = boot_->local_rank();
    int count = 0;
    cudaError_t ce = cudaGetDeviceCount(&count);
    if (ce != cudaSuccess || count == 0)
      throw_error(QLFT_ERR_BACKEND, "dist.backend=nccl on rank %d: no CUDA device (%s)", rank_,
                  ce != cudaSuccess ? cudaGetErrorString(ce) : "device count 0");
    device_ = local_rank_ % count;
    cuda(cudaSetDevice(device_), "cudaSetDevice");
    cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    cuda(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreate");

    ncclUniqueId id{};
    if (rank_ == 0) nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    boot_->broadcast(&id, sizeof id, 0);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // init and collectives return at once; wait() polls them
    nccl_start(ncclCommInitRankConfig(&comm_, world_, id, rank_, &config), "ncclCommInitRank");
    wait_comm("ncclCommInitRank");
  }

  ~NcclCommunicator() override {
    if (comm_) {
      if (broken_)
        ncclCommAbort(comm_);
      else
        ncclCommDestroy(comm_);
    }
    if (ready_) QLFT_CUDA_WARN(cudaEventDestroy(ready_));
    if (stream_) QLFT_CUDA_WARN(cudaStreamDestroy(stream_));
  }

  const char* backend() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int world() const override { return world_; }
  int local_rank() const override { return local_rank_; }

  void all_reduce(float* data, size_t n, ReduceOp op) override {
    after_compute();
    nccl_start(ncclAllReduce(data, data, n, ncclFloat, red(op), comm_, stream_), "all_reduce");
    wait_stream("all_reduce", n * sizeof(float));
  }
  void all_reduce(double* data, size_t n, ReduceOp op) override {
    after_compute();
    nccl_start(ncclAllReduce(data, data, n, ncclDouble, red(op), comm_, stream_), "all_reduce");
    wait_stream("all_reduce", n * sizeof(double));
  }
  void reduce_scatter(const float* in, float* out, size_t n, ReduceOp op) override {
    after_compute();
    nccl_start(ncclReduceScatter(in, out, n, ncclFloat, red(op), comm_, stream_), "reduce_scatter");
    wait_stream("reduce_scatter", n * world_ * sizeof(float));
  }
  void all_gather(const float* in, float* out, size_t n) override {
    after_compute();
    nccl_start(ncclAllGather(in, out, n, ncclFloat, comm_, stream_), "all_gather");
    wait_stream("all_gather", n * world_ * sizeof(float));
  }
  void broadcast(void* data, size_t bytes, int root) override {
    QLFT_CHECK_ARG(root >= 0 && root < world_, "broadcast: root %d is not a rank (world %d)", root,
                   world_);
    after_compute();
    nccl_start(ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, stream_), "broadcast");
    wait_stream("broadcast", bytes);
  }
  // ZeRO-3's unit gathers: started on the stream, waited for by polling (bounded as above).
  std::unique_ptr<PendingCollective> start_all_gather_raw(const void* in, void* out,
                                                          size_t bytes) override;
  // Host-side: the bootstrap's barrier (no device buffer needed).
  void barrier() override { boot_->barrier(); }

  bool device_buffers() const override { return true; }
  Communicator& host() override { return *boot_; }
  void follow_stream(void* stream) override { compute_ = static_cast<cudaStream_t>(stream); }
  int device() const { return device_; }

 private:
  static ncclRedOp_t red(ReduceOp op) { return op == ReduceOp::Avg ? ncclAvg : ncclSum; }

  // The device backend's queued work (the gradients it is writing) before the next collective.
  void after_compute() {
    if (!compute_) return;
    cuda(cudaEventRecord(ready_, compute_), "cudaEventRecord");
    cuda(cudaStreamWaitEvent(stream_, ready_, 0), "cudaStreamWaitEvent");
  }

  [[noreturn]] void fail(const std::string& msg) {
    broken_ = true;
    throw_error(QLFT_ERR_DISTRIBUTED, "%s", msg.c_str());
  }
  void cuda(cudaError_t e, const char* what) {
    if (e != cudaSuccess)
      throw_error(QLFT_ERR_BACKEND, "%s on rank %d (device %d): %s", what, rank_, device_,
                  cudaGetErrorString(e));
  }
  void nccl(ncclResult_t r, const char* what) {
    if (r != ncclSuccess) fail(strf("%s on rank %d: %s", what, rank_, ncclGetErrorString(r)));
  }
  void nccl_start(ncclResult_t r, const char* what) {
    if (broken_)
      throw_error(QLFT_ERR_DISTRIBUTED,
                  "%s on rank %d: the communicator failed earlier; resume from the last checkpoint",
                  what, rank_);
    if (r != ncclSuccess && r != ncclInProgress) nccl(r, what);
  }

  template <class Done>
  void poll(const char* what, size_t bytes, Done done) {
    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    long sleep_ns = 0;
    for (int polls = 0;; ++polls) {
      if (done()) return;
      ncclResult_t async = ncclSuccess;
      if (comm_) ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress)
        fail(strf("%s (%zu bytes) failed on rank %d of %d: %s", what, bytes, rank_, world_,
                  ncclGetErrorString(async)));
      const double waited = std::chrono::duration<double>(clock::now() - t0).count();
      if (waited > timeout_s_)
        fail(
            strf("%s (%zu bytes) timed out after %.1f s (dist.timeout_s) on rank %d of %d: a "
                 "peer died or hangs; resume from the last checkpoint",
                 what, bytes, waited, rank_, world_));
      if (polls < 256) {
        sched_yield();
      } else {
        sleep_ns = sleep_ns ? (sleep_ns * 2 > 1000000L ? 1000000L : sleep_ns * 2) : 20000L;
        timespec ts{0, sleep_ns};
        nanosleep(&ts, nullptr);
      }
    }
  }
  void wait_comm(const char* what) {
    poll(what, 0, [&] {
      ncclResult_t s = ncclInProgress;
      ncclCommGetAsyncError(comm_, &s);
      return s == ncclSuccess;
    });
  }

 public:
  void wait_stream(const char* what, size_t bytes) {
    poll(what, bytes, [&] {
      cudaError_t e = cudaStreamQuery(stream_);
      if (e == cudaErrorNotReady) return false;
      if (e != cudaSuccess)
        fail(strf("%s on rank %d: CUDA error %s", what, rank_, cudaGetErrorString(e)));
      return true;
    });
  }

 private:
  std::unique_ptr<Communicator> boot_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaStream_t compute_ = nullptr;  // follow_stream
  cudaEvent_t ready_ = nullptr;
  int rank_ = 0, world_ = 1, local_rank_ = 0, device_ = 0;
};

// A started gather: waiting polls the communicator's stream (which also finishes any gather
// started after it: they are queued behind).
class NcclPending final : public PendingCollective {
 public:
  NcclPending(NcclCommunicator* c, size_t bytes) : c_(c), bytes_(bytes) {}
  ~NcclPending() override {
    if (waited_ || c_->broken()) return;
    try {
      wait();
    } catch (...) {  // reported by the next collective, which finds the communicator broken
    }
  }
  void wait() override {
    if (waited_) return;
    waited_ = true;
    c_->wait_stream("all_gather (bytes)", bytes_);
  }

 private:
  NcclCommunicator* c_;
  size_t bytes_;
  bool waited_ = false;
};

std::unique_ptr<PendingCollective> NcclCommunicator::start_all_gather_raw(const void* in, void* out,
                                                                          size_t bytes) {
  after_compute();
  nccl_start(ncclAllGather(in, out, bytes, ncclUint8, comm_, stream_), "all_gather (bytes)");
  return std::make_unique<NcclPending>(this, bytes * world_);
}

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator> bootstrap,
                                                     double timeout_s) {
  QLFT_CHECK_ARG(bootstrap, "make_nccl_communicator: no bootstrap communicator");
  return std::make_unique<NcclCommunicator>(std::move(bootstrap), timeout_s);
}

}  // namespace qlft::dist
