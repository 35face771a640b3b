// Collective communication between training ranks: the one interface data parallelism and ZeRO
// are written against. Implementations: a single-rank one (every collective is the identity),
// MPI (src/parallel/comm_mpi.cpp, compiled only into the plugin libqlft-mpi.so, which libqlft
// opens at run time: parallel/mpi_plugin_loader.h) and NCCL (cuda/src/comm_nccl.cu). It lives in
// core/, below the backends, because the NCCL communicator is the CUDA plugin's
// (backend/nccl_entry.h, backend/cuda_plugin_abi.h).
//
// Every collective is bounded by timeout_s: a peer that died or hangs ends the call with
// QLFT_ERR_DISTRIBUTED naming the ranks that did not answer, never a silent hang and never an
// abort of the process. After such a failure the communicator is broken: every later call throws
// at once (the peers' state is unknown; the only way on is the last checkpoint).
//
// Collectives are called by every rank in the same order with the same sizes (the caller's
// contract, as in MPI). Buffers are host memory for the single and MPI implementations.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace qlft::dist {

enum class ReduceOp { Sum, Avg };

// A collective that was started and not yet waited for (Communicator::start_all_gather_raw).
// Its buffers must stay valid until wait() returns or the object is destroyed. Destroying it
// unwaited waits for it (bounded by timeout_s; an error is then swallowed) unless the
// communicator is already broken.
class PendingCollective {
 public:
  virtual ~PendingCollective() = default;
  // Blocks until the collective completed, bounded by the communicator's timeout_s
  // (QLFT_ERR_DISTRIBUTED past it, or when a peer failed). A second call returns at once.
  virtual void wait() = 0;
};

// Where this process sits, as the launcher says: mpirun (OMPI_COMM_WORLD_*, PMI_*), or
// RANK / WORLD_SIZE / LOCAL_RANK for other launchers. world = 1 when nothing is set.
struct LaunchInfo {
  int rank = 0, world = 1, local_rank = 0;
  std::string source;  // "openmpi", "pmi", "env" or "none"
};
LaunchInfo detect_launch();

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual const char* backend() const = 0;  // "none", "mpi", "nccl"
  virtual int rank() const = 0;
  virtual int world() const = 0;
  virtual int local_rank() const = 0;

  // In place over n values: every rank ends with the elementwise sum (or mean).
  virtual void all_reduce(float* data, size_t n, ReduceOp op) = 0;
  virtual void all_reduce(double* data, size_t n, ReduceOp op) = 0;
  // In place over n values to one rank: root ends with the elementwise sum (or mean) of every
  // rank's data; the others' data is left unspecified. Half an all-reduce's traffic (ZeRO-2
  // sends each gradient to its owner). The default is an all-reduce.
  virtual void reduce(float* data, size_t n, int root, ReduceOp op);
  // in holds world * n_per_rank values; rank r receives in out the reduction of block r.
  virtual void reduce_scatter(const float* in, float* out, size_t n_per_rank, ReduceOp op) = 0;
  // in holds n_per_rank values; out receives world * n_per_rank, block r from rank r.
  virtual void all_gather(const float* in, float* out, size_t n_per_rank) = 0;
  // Bytes: in holds bytes_per_rank bytes; out receives world * bytes_per_rank, block r from
  // rank r. The start form returns at once so that the transfer overlaps computation (ZeRO-3
  // prefetches the next unit's weights with it); nothing may touch in or out until wait().
  // Every rank starts the same gathers in the same order, interleaved with the other
  // collectives in the same order. Implementations without it throw QLFT_ERR_UNSUPPORTED.
  virtual std::unique_ptr<PendingCollective> start_all_gather_raw(const void* in, void* out,
                                                                  size_t bytes_per_rank);
  void all_gather_raw(const void* in, void* out, size_t bytes_per_rank) {
    start_all_gather_raw(in, out, bytes_per_rank)->wait();
  }
  // bytes from root to every rank.
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  virtual void barrier() = 0;

  // Where the buffers of the collectives above live: host memory (none, mpi) or device memory
  // (nccl). A device communicator has a host one beside it for host buffers (scalars, settings
  // checks, gathered optimizer state): host() (itself for host communicators).
  virtual bool device_buffers() const { return false; }
  virtual Communicator& host() { return *this; }
  // A device communicator orders every later collective after the work already queued on
  // `stream` (a cudaStream_t of the device backend, Backend::native_stream) when it starts, and
  // the host waits for the collective to end, so work queued afterwards sees its result.
  virtual void follow_stream(void* stream) { (void)stream; }

  double timeout_s() const { return timeout_s_; }
  void set_timeout(double seconds) { timeout_s_ = seconds > 0 ? seconds : 1e9; }
  bool broken() const { return broken_; }

  // Built on the primitives above.
  double sum(double v);
  int64_t sum(int64_t v);  // exact below 2^53
  // Every rank's blob, in rank order, on every rank.
  std::vector<std::string> all_gather_bytes(const std::string& mine);
  // The same bytes one rank at a time: f(r, rank r's bytes) on every rank, in rank order; only
  // one other rank's bytes are alive at once, where a caller keeps only what it needs.
  void each_rank_bytes(const std::string& mine, const std::function<void(int, std::string&)>& f);
  // Throws QLFT_ERR_DISTRIBUTED unless every rank passes the same value (a cheap guard that the
  // ranks agree on sizes and settings before a collective whose sizes must match).
  void check_same(uint64_t value, const char* what);

 protected:
  double timeout_s_ = 300;
  bool broken_ = false;
};

// The identity communicator of a single process (world 1).
std::unique_ptr<Communicator> make_single_communicator();

// make_communicator (dist.backend -> a communicator): parallel/comm_select.h.

// The MPI communicator: parallel/comm_mpi.h (the MPI plugin's).

}  // namespace qlft::dist
