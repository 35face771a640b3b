#include "core/communicator.h"

#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace qlft::dist {

namespace {

// A non-negative integer from the environment, or -1 when unset; malformed values are errors
// (a launcher that set RANK=abc would otherwise make every process rank 0).
int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return -1;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < 0 || x > (1 << 24))
    throw_error(QLFT_ERR_INVALID_ARGUMENT, "environment variable %s='%s' is not a rank count", name,
                v);
  return static_cast<int>(x);
}

class DonePending final : public PendingCollective {
 public:
  void wait() override {}
};

class SingleCommunicator final : public Communicator {
 public:
  const char* backend() const override { return "none"; }
  int rank() const override { return 0; }
  int world() const override { return 1; }
  int local_rank() const override { return 0; }
  void all_reduce(float*, size_t, ReduceOp) override {}
  void all_reduce(double*, size_t, ReduceOp) override {}
  void reduce_scatter(const float* in, float* out, size_t n, ReduceOp) override {
    if (n && in != out) std::memmove(out, in, n * sizeof(float));
  }
  void all_gather(const float* in, float* out, size_t n) override {
    if (n && in != out) std::memmove(out, in, n * sizeof(float));
  }
  std::unique_ptr<PendingCollective> start_all_gather_raw(const void* in, void* out,
                                                          size_t bytes) override {
    if (bytes && in != out) std::memmove(out, in, bytes);
    return std::make_unique<DonePending>();
  }
  void broadcast(void*, size_t, int root) override {
    QLFT_CHECK_ARG(root == 0, "broadcast: root %d is not a rank of a 1-rank world", root);
  }
  void barrier() override {}
};

}  // namespace

LaunchInfo detect_launch() {
  LaunchInfo li;
  struct Names {
    const char *rank, *world, *local, *source;
  };
  const Names kLaunchers[] = {
      {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "openmpi"},
      {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "pmi"},
      {"RANK", "WORLD_SIZE", "LOCAL_RANK", "env"},
  };
  for (const Names& n : kLaunchers) {
    int r = env_int(n.rank), w = env_int(n.world);
    if (r < 0 && w < 0) continue;
    if (r < 0 || w < 1 || r >= w)
      throw_error(QLFT_ERR_INVALID_ARGUMENT,
                  "launcher environment is inconsistent: %s=%d %s=%d (need 0 <= rank < size)",
                  n.rank, r, n.world, w);
    li.rank = r;
    li.world = w;
    int l = env_int(n.local);
    li.local_rank = l >= 0 ? l : r;
    li.source = n.source;
    return li;
  }
  li.source = "none";
  return li;
}

void Communicator::reduce(float* data, size_t n, int root, ReduceOp op) {
  QLFT_CHECK_ARG(root >= 0 && root < world(), "reduce: root %d is not a rank of %d", root, world());
  all_reduce(data, n, op);
}

std::unique_ptr<PendingCollective> Communicator::start_all_gather_raw(const void*, void*,
                                                                      size_t bytes) {
  throw_error(QLFT_ERR_UNSUPPORTED,
              "the %s communicator has no byte all-gather (%zu bytes per rank asked): ZeRO-3 "
              "needs dist.backend=mpi",
              backend(), bytes);
}

// The helpers below pass host buffers: a device communicator hands them to its host one.
double Communicator::sum(double v) {
  host().all_reduce(&v, 1, ReduceOp::Sum);
  return v;
}

int64_t Communicator::sum(int64_t v) {
  double d = static_cast<double>(v);
  host().all_reduce(&d, 1, ReduceOp::Sum);
  return static_cast<int64_t>(d);
}

void Communicator::check_same(uint64_t value, const char* what) {
  if (world() == 1) return;
  if (&host() != this) return host().check_same(value, what);
  // Two 32-bit halves as doubles (exact): compare each rank's with the sum / world.
  double v[2] = {static_cast<double>(value >> 32), static_cast<double>(value & 0xffffffffu)};
  double s[2] = {v[0], v[1]};
  all_reduce(s, 2, ReduceOp::Sum);
  bool same = s[0] == v[0] * world() && s[1] == v[1] * world();
  double bad = same ? 0.0 : 1.0;
  all_reduce(&bad, 1, ReduceOp::Sum);
  if (bad > 0)
    throw_error(QLFT_ERR_DISTRIBUTED,
                "ranks disagree on %s (rank %d has %llu): every rank must run the same settings",
                what, rank(), static_cast<unsigned long long>(value));
}

void Communicator::each_rank_bytes(const std::string& mine,
                                   const std::function<void(int, std::string&)>& f) {
  if (&host() != this) return host().each_rank_bytes(mine, f);
  const int w = world();
  if (w == 1) {
    std::string b = mine;
    return f(0, b);
  }
  // Sizes first (as floats they would lose bits: gather them as doubles via a summed table).
  std::vector<double> sizes(w, 0.0);
  sizes[rank()] = static_cast<double>(mine.size());
  all_reduce(sizes.data(), sizes.size(), ReduceOp::Sum);
  for (int r = 0; r < w; ++r) {
    std::string b = r == rank() ? mine : std::string(static_cast<size_t>(sizes[r]), '\0');
    if (!b.empty()) broadcast(b.data(), b.size(), r);
    f(r, b);
  }
}

std::vector<std::string> Communicator::all_gather_bytes(const std::string& mine) {
  std::vector<std::string> out(static_cast<size_t>(world()));
  each_rank_bytes(mine, [&](int r, std::string& b) { out[static_cast<size_t>(r)] = std::move(b); });
  return out;
}

std::unique_ptr<Communicator> make_single_communicator() {
  return std::make_unique<SingleCommunicator>();
}

}  // namespace qlft::dist
