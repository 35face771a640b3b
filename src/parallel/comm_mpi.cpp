// The MPI communicator (OpenMPI; any MPI-3 library works). Compiled only with QLFT_MPI=ON.
//
// Why nonblocking collectives polled with MPI_Test: a blocking MPI_Allreduce waits forever for a
// dead peer (and busy-spins a core meanwhile, which on a shared machine starves the ranks that
// are computing). Polling lets every collective end at dist.timeout_s, and sleeping between
// polls leaves the cores to the computing ranks. MPI_ERRORS_RETURN replaces MPI's default
// handler, which would abort the whole job from inside the library.
// Only MPI's C API: the deprecated C++ bindings would need libmpi_cxx.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <sched.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "core/communicator.h"
#include "parallel/comm_mpi.h"

namespace qlft::dist {

namespace {

// Set once a communicator failed: MPI_Finalize would wait for peers that are gone.
bool g_any_broken = false;

void finalize_at_exit() {
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin && !g_any_broken) MPI_Finalize();
}

void ensure_mpi_initialized() {
  int inited = 0;
  MPI_Initialized(&inited);
  if (inited) return;
  int provided = 0;
  // SERIALIZED: a trainer may move between threads (one at a time), never concurrent calls.
  if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
    throw_error(QLFT_ERR_DISTRIBUTED, "MPI_Init_thread failed (is this process under mpirun?)");
  std::atexit(finalize_at_exit);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
}

std::string mpi_error_text(int rc) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, buf, &len) != MPI_SUCCESS) return strf("MPI error %d", rc);
  return std::string(buf, static_cast<size_t>(len));
}

// MPI counts are int: large buffers go in chunks of this many elements.
constexpr size_t kMaxChunk = size_t{1} << 28;
constexpr int kDiagTag = 7301;
// Byte gathers move 64-byte units (a contiguous datatype) so that an int count reaches 128 GiB.
constexpr size_t kGatherUnit = 64;

class MpiCommunicator;

class MpiPending final : public PendingCollective {
 public:
  MpiPending(MpiCommunicator* c, MPI_Request r, size_t bytes) : comm_(c), req_(r), bytes_(bytes) {}
  ~MpiPending() override;
  void wait() override;

 private:
  MpiCommunicator* comm_;
  MPI_Request req_;
  size_t bytes_;
};

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(double timeout_s) {
    set_timeout(timeout_s);
    ensure_mpi_initialized();
    check(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup");
    check(MPI_Comm_dup(MPI_COMM_WORLD, &ctl_), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(ctl_, MPI_ERRORS_RETURN);
    check(MPI_Type_contiguous(static_cast<int>(kGatherUnit), MPI_BYTE, &unit_type_),
          "MPI_Type_contiguous");
    check(MPI_Type_commit(&unit_type_), "MPI_Type_commit");
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &world_);
    LaunchInfo li = detect_launch();
    if (li.world != world_)
      throw_error(QLFT_ERR_DISTRIBUTED,
                  "the launcher (%s) says %d ranks but MPI sees %d: start the ranks with mpirun",
                  li.source.c_str(), li.world, world_);
    if (li.source == "openmpi" || li.source == "pmi") {
      local_rank_ = li.local_rank;
    } else {
      MPI_Comm node;
      check(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node),
            "MPI_Comm_split_type");
      MPI_Comm_rank(node, &local_rank_);
      MPI_Comm_free(&node);
    }
  }

  ~MpiCommunicator() override {
    // After a failure the peers may be gone: freeing would be a collective with them.
    if (broken_) return;
    int fin = 0;
    MPI_Finalized(&fin);
    if (fin) return;
    for (MPI_Request& r : probe_req_)
      if (r != MPI_REQUEST_NULL) {
        MPI_Cancel(&r);
        MPI_Request_free(&r);
      }
    MPI_Type_free(&unit_type_);
    MPI_Comm_free(&ctl_);
    MPI_Comm_free(&comm_);
  }

  const char* backend() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int world() const override { return world_; }
  int local_rank() const override { return local_rank_; }

  void all_reduce(float* data, size_t n, ReduceOp op) override {
    all_reduce_sum(data, n, MPI_FLOAT);
    if (op == ReduceOp::Avg) average(data, n);
  }

  void all_reduce(double* data, size_t n, ReduceOp op) override {
    all_reduce_sum(data, n, MPI_DOUBLE);
    if (op == ReduceOp::Avg)
      for (size_t i = 0; i < n; ++i) data[i] /= world_;
  }

  void reduce(float* data, size_t n, int root, ReduceOp op) override {
    QLFT_CHECK_ARG(root >= 0 && root < world_, "reduce: root %d is not a rank of %d", root, world_);
    for (size_t o = 0; o < n; o += kMaxChunk) {
      const int c = static_cast<int>(std::min(kMaxChunk, n - o));
      MPI_Request req;
      // The root reduces in place; the others' buffers are only read.
      start(MPI_Ireduce(rank_ == root ? MPI_IN_PLACE : data + o, rank_ == root ? data + o : nullptr,
                        c, MPI_FLOAT, MPI_SUM, root, comm_, &req),
            "reduce");
      wait(&req, "reduce", n * sizeof(float));
    }
    if (op == ReduceOp::Avg && rank_ == root) average(data, n);
  }

  void reduce_scatter(const float* in, float* out, size_t n, ReduceOp op) override {
    QLFT_CHECK_ARG(n <= kMaxChunk, "reduce_scatter: %zu values per rank is too many for one call",
                   n);
    if (n == 0) return;
    std::vector<float> copy;
    if (out >= in && out < in + n * world_) {  // MPI forbids aliasing here
      copy.assign(in, in + n * world_);
      in = copy.data();
    }
    MPI_Request req;
    start(MPI_Ireduce_scatter_block(in, out, static_cast<int>(n), MPI_FLOAT, MPI_SUM, comm_, &req),
          "reduce_scatter");
    wait(&req, "reduce_scatter", n * world_ * sizeof(float));
    if (op == ReduceOp::Avg) average(out, n);
  }

  void all_gather(const float* in, float* out, size_t n) override {
    QLFT_CHECK_ARG(n <= kMaxChunk, "all_gather: %zu values per rank is too many for one call", n);
    if (n == 0) return;
    MPI_Request req;
    const bool in_place = in == out + n * static_cast<size_t>(rank_);
    start(MPI_Iallgather(in_place ? MPI_IN_PLACE : in, static_cast<int>(n), MPI_FLOAT, out,
                         static_cast<int>(n), MPI_FLOAT, comm_, &req),
          "all_gather");
    wait(&req, "all_gather", n * world_ * sizeof(float));
  }

  std::unique_ptr<PendingCollective> start_all_gather_raw(const void* in, void* out,
                                                          size_t bytes) override {
    MPI_Datatype type = MPI_BYTE;
    size_t count = bytes;
    if (bytes % kGatherUnit == 0) {
      type = unit_type_;
      count = bytes / kGatherUnit;
    }
    QLFT_CHECK_ARG(count <= static_cast<size_t>(INT_MAX),
                   "all_gather_raw: %zu bytes per rank is too many for one call (a multiple of "
                   "%zu goes up to 128 GiB)",
                   bytes, kGatherUnit);
    MPI_Request req = MPI_REQUEST_NULL;
    if (bytes) {
      const bool in_place = in == static_cast<const char*>(out) + bytes * rank_;
      start(MPI_Iallgather(in_place ? MPI_IN_PLACE : in, static_cast<int>(count), type, out,
                           static_cast<int>(count), type, comm_, &req),
            "all_gather (bytes)");
    }
    return std::make_unique<MpiPending>(this, req, bytes * world_);
  }

  void broadcast(void* data, size_t bytes, int root) override {
    QLFT_CHECK_ARG(root >= 0 && root < world_, "broadcast: root %d is not a rank (world %d)", root,
                   world_);
    char* p = static_cast<char*>(data);
    for (size_t o = 0; o < bytes; o += kMaxChunk) {
      const int c = static_cast<int>(std::min(kMaxChunk, bytes - o));
      MPI_Request req;
      start(MPI_Ibcast(p + o, c, MPI_BYTE, root, comm_, &req), "broadcast");
      wait(&req, "broadcast", bytes);
    }
  }

  void barrier() override {
    MPI_Request req;
    start(MPI_Ibarrier(comm_, &req), "barrier");
    wait(&req, "barrier", 0);
  }

 private:
  friend class MpiPending;
  // Sums data over the ranks in place, in chunks whose counts fit MPI's int.
  template <class T>
  void all_reduce_sum(T* data, size_t n, MPI_Datatype type) {
    for (size_t o = 0; o < n; o += kMaxChunk) {
      const int c = static_cast<int>(std::min(kMaxChunk, n - o));
      MPI_Request req;
      start(MPI_Iallreduce(MPI_IN_PLACE, data + o, c, type, MPI_SUM, comm_, &req), "all_reduce");
      wait(&req, "all_reduce", n * sizeof(T));
    }
  }
  // ReduceOp::Avg of a float sum: times 1 / world.
  void average(float* data, size_t n) const {
    const float s = 1.0f / static_cast<float>(world_);
    for (size_t i = 0; i < n; ++i) data[i] *= s;
  }
  void check(int rc, const char* what) {
    if (rc != MPI_SUCCESS)
      fail(strf("%s failed on rank %d: %s", what, rank_, mpi_error_text(rc).c_str()));
  }
  void start(int rc, const char* what) {
    if (broken_)
      throw_error(QLFT_ERR_DISTRIBUTED,
                  "%s on rank %d: the communicator failed earlier; resume from the last checkpoint",
                  what, rank_);
    check(rc, what);
  }
  [[noreturn]] void fail(const std::string& msg) {
    broken_ = true;
    g_any_broken = true;
    throw_error(QLFT_ERR_DISTRIBUTED, "%s", msg.c_str());
  }

  // Polls req until it completes, an error comes back, or dist.timeout_s passes. The first
  // polls only yield (small collectives finish in microseconds); later ones sleep up to 1 ms.
  //
  // Naming the culprit: at 80% of the timeout this rank starts a liveness probe (below) and
  // keeps polling the collective, which may still complete; at the timeout the ranks that sent
  // no probe for this collective are named. A peer stuck in the same collective probes at about
  // the same moment; a dead one never does. The whole failure stays within dist.timeout_s.
  // max_sleep_ns: bulk transfers (ZeRO-3 weight gathers) progress only while this rank polls
  // (OpenMPI moves a large message fragment by fragment inside MPI calls), so they poll at
  // least every 50 us instead of every 1 ms.
  void wait(MPI_Request* req, const char* what, size_t bytes, long max_sleep_ns = 1000000L) {
    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    const uint64_t seq = ++seq_;
    long sleep_ns = 0;
    bool probing = false;
    for (int polls = 0;; ++polls) {
      int done = 0;
      int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS)
        fail(strf("%s (%zu bytes) failed on rank %d of %d: %s", what, bytes, rank_, world_,
                  mpi_error_text(rc).c_str()));
      if (done) return;
      const double waited = std::chrono::duration<double>(clock::now() - t0).count();
      if (!probing && waited > 0.8 * timeout_s_) {
        start_probe(seq);
        probing = true;
      }
      if (probing) poll_probes(seq);
      if (waited > timeout_s_) fail(timeout_message(what, bytes, waited, seq));
      if (polls < 256) {
        sched_yield();
      } else {
        sleep_ns = std::min(max_sleep_ns, sleep_ns ? sleep_ns * 2 : 20000L);
        timespec ts{0, sleep_ns};
        nanosleep(&ts, nullptr);
      }
    }
  }

  // Sends this collective's sequence number to every peer on the control communicator and
  // makes sure a receive is posted from each. Probes of earlier collectives that completed in
  // the end are still in flight; poll_probes skips them by their older number.
  void start_probe(uint64_t seq) {
    if (probe_in_.empty()) {
      probe_in_.assign(world_, 0);
      probe_req_.assign(world_, MPI_REQUEST_NULL);
      alive_seq_.assign(world_, 0);
    }
    // Sends may never complete (a dead peer): their buffers live as long as the communicator.
    probe_out_.push_back(seq);
    const uint64_t* buf = &probe_out_.back();
    for (int p = 0; p < world_; ++p) {
      if (p == rank_) continue;
      MPI_Request s;
      if (MPI_Isend(buf, 1, MPI_UINT64_T, p, kDiagTag, ctl_, &s) == MPI_SUCCESS)
        MPI_Request_free(&s);
      if (probe_req_[p] == MPI_REQUEST_NULL)
        MPI_Irecv(&probe_in_[p], 1, MPI_UINT64_T, p, kDiagTag, ctl_, &probe_req_[p]);
    }
  }

  void poll_probes(uint64_t seq) {
    for (int p = 0; p < world_; ++p) {
      // Drain what has arrived: each completed receive is re-posted for the next probe.
      while (p != rank_ && alive_seq_[p] < seq && probe_req_[p] != MPI_REQUEST_NULL) {
        int done = 0;
        if (MPI_Test(&probe_req_[p], &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || !done) break;
        alive_seq_[p] = std::max(alive_seq_[p], probe_in_[p]);
        MPI_Irecv(&probe_in_[p], 1, MPI_UINT64_T, p, kDiagTag, ctl_, &probe_req_[p]);
      }
    }
  }

  std::string timeout_message(const char* what, size_t bytes, double waited, uint64_t seq) {
    std::string who;
    size_t silent = 0;
    for (int p = 0; p < world_; ++p)
      if (p != rank_ && alive_seq_[p] < seq) {
        who += (who.empty() ? "" : ", ") + std::to_string(p);
        ++silent;
      }
    if (silent == 0)
      return strf(
          "%s (%zu bytes) timed out after %.1f s (dist.timeout_s) on rank %d of %d; every rank "
          "is alive, so the ranks are out of step (they called different collectives)",
          what, bytes, waited, rank_, world_);
    return strf(
        "%s (%zu bytes) timed out after %.1f s (dist.timeout_s) on rank %d of %d: rank%s %s did "
        "not reach it (died or hangs); resume from the last checkpoint",
        what, bytes, waited, rank_, world_, silent > 1 ? "s" : "", who.c_str());
  }

  MPI_Comm comm_ = MPI_COMM_NULL, ctl_ = MPI_COMM_NULL;
  MPI_Datatype unit_type_ = MPI_DATATYPE_NULL;
  int rank_ = 0, world_ = 1, local_rank_ = 0;
  uint64_t seq_ = 0;  // collectives started: the same sequence on every rank
  // Liveness probes (see wait): per peer the posted receive, its buffer and the newest
  // collective it was seen waiting in; the numbers this rank sent.
  std::vector<uint64_t> probe_in_, alive_seq_;
  std::vector<MPI_Request> probe_req_;
  std::deque<uint64_t> probe_out_;
};

void MpiPending::wait() {
  if (req_ == MPI_REQUEST_NULL) return;
  // The same polling and timeout as the blocking collectives; on failure the request is left
  // to MPI (the communicator is broken and never freed).
  MPI_Request r = req_;
  req_ = MPI_REQUEST_NULL;
  comm_->wait(&r, "all_gather (bytes)", bytes_, bytes_ >= (size_t{1} << 20) ? 50000L : 1000000L);
}

MpiPending::~MpiPending() {
  if (req_ == MPI_REQUEST_NULL || comm_->broken()) return;
  try {
    wait();
  } catch (...) {
    // Destructors do not throw; the communicator is broken now and the next call says so.
  }
}

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(double timeout_s) {
  return std::make_unique<MpiCommunicator>(timeout_s);
}

}  // namespace qlft::dist
