// One rank of the emulated NCCL communicator's check (issue 17, Done-when 4; run by
// nccl_emu_mpirun.sh under mpirun -np 2). The NCCL communicator (cuda/src/comm_nccl.cu on the
// emulator's NCCL, cuda/emu/src/nccl.cpp) runs every collective on device buffers, the MPI
// communicator the same collective on host buffers with the same inputs; the results must be
// bit-identical, and for integer-valued inputs equal to the closed-form sums as well. Sizes are
// odd (1, 7, 1001, 4099 elements; broadcasts of 4n+3 bytes). A host pointer handed to the NCCL
// communicator must be refused (a GPU would fault on it). usage: nccl_emu_worker OUT; rank R
// writes OUT.R, ending with the line "rank R world W errors E"; exits 1 when E > 0.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/communicator.h"
#include "parallel/comm_select.h"
#include "backend/nccl_entry.h"

using namespace qlft;

namespace {

int errors = 0;

void check(bool ok, const char* what, size_t n) {
  if (!ok) {
    ++errors;
    std::printf("MISMATCH %s n=%zu\n", what, n);
  }
}

template <class T>
T* to_dev(const std::vector<T>& h) {
  T* d = nullptr;
  if (cudaMalloc(&d, std::max<size_t>(h.size(), 1) * sizeof(T)) != cudaSuccess) std::abort();
  if (!h.empty() && cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice))
    std::abort();
  return d;
}
template <class T>
std::vector<T> from_dev(const T* d, size_t n) {
  std::vector<T> h(n);
  if (n && cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost)) std::abort();
  return h;
}
template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: nccl_emu_worker OUT\n");
    return 2;
  }
  try {
    auto mpi = dist::make_communicator(qlft::DistBackend::Mpi, 120);
    const int r = mpi->rank(), w = mpi->world();
    const std::string out = std::string(argv[1]) + "." + std::to_string(r);
    if (!std::freopen(out.c_str(), "w", stdout)) return 2;
    // This process's emulator made the device buffers below: the NCCL communicator must be its
    // own (qlft_cuda linked in), not the CUDA plugin's, whose emulator is another instance.
    auto nccl =
        dist::make_nccl_communicator(dist::make_communicator(qlft::DistBackend::Mpi, 120), 120);
    nccl->set_timeout(120);
    check(std::strcmp(nccl->backend(), "nccl") == 0, "backend name", 0);
    check(nccl->rank() == r && nccl->world() == w, "rank/world", 0);
    std::mt19937 rng(1234u + unsigned(r));
    std::normal_distribution<float> nd;
    for (size_t n : {size_t(1), size_t(7), size_t(1001), size_t(4099)}) {
      // all_reduce float (sum, avg) on random values: bit-identical to MPI's.
      for (auto op : {dist::ReduceOp::Sum, dist::ReduceOp::Avg}) {
        std::vector<float> h(n);
        for (auto& x : h) x = nd(rng);
        float* d = to_dev(h);
        nccl->all_reduce(d, n, op);
        mpi->all_reduce(h.data(), n, op);
        check(same_bits(from_dev(d, n), h), "all_reduce float", n);
        cudaFree(d);
      }
      // all_reduce float on integers: the closed-form sum as well.
      {
        std::vector<float> h(n);
        for (size_t i = 0; i < n; ++i) h[i] = float((r + 1) * int(i % 97));
        float* d = to_dev(h);
        nccl->all_reduce(d, n, dist::ReduceOp::Sum);
        const auto g = from_dev(d, n);
        const float ranks = float(w) * float(w + 1) / 2;
        bool ok = true;
        for (size_t i = 0; i < n; ++i) ok &= g[i] == ranks * float(i % 97);
        check(ok, "all_reduce closed form", n);
        cudaFree(d);
      }
      // all_reduce double.
      {
        std::vector<double> h(n);
        for (auto& x : h) x = double(nd(rng)) * 1e-3;
        double* d = to_dev(h);
        nccl->all_reduce(d, n, dist::ReduceOp::Sum);
        mpi->all_reduce(h.data(), n, dist::ReduceOp::Sum);
        check(same_bits(from_dev(d, n), h), "all_reduce double", n);
        cudaFree(d);
      }
      // reduce_scatter: w * n in, n out.
      for (auto op : {dist::ReduceOp::Sum, dist::ReduceOp::Avg}) {
        std::vector<float> in(n * size_t(w)), out(n);
        for (auto& x : in) x = nd(rng);
        float* din = to_dev(in);
        float* dout = to_dev(std::vector<float>(n, -1.f));
        nccl->reduce_scatter(din, dout, n, op);
        mpi->reduce_scatter(in.data(), out.data(), n, op);
        check(same_bits(from_dev(dout, n), out), "reduce_scatter", n);
        cudaFree(din);
        cudaFree(dout);
      }
      // all_gather: n in, w * n out, block q from rank q.
      {
        std::vector<float> in(n), out(n * size_t(w));
        for (size_t i = 0; i < n; ++i) in[i] = float(r * 100000 + int(i));
        float* din = to_dev(in);
        float* dout = to_dev(std::vector<float>(n * size_t(w), -1.f));
        nccl->all_gather(din, dout, n);
        mpi->all_gather(in.data(), out.data(), n);
        const auto g = from_dev(dout, n * size_t(w));
        check(same_bits(g, out), "all_gather", n);
        bool ok = true;
        for (int q = 0; q < w; ++q)
          for (size_t i = 0; i < n; ++i) ok &= g[size_t(q) * n + i] == float(q * 100000 + int(i));
        check(ok, "all_gather closed form", n);
        cudaFree(din);
        cudaFree(dout);
      }
      // broadcast of an odd number of bytes from the first and the last rank.
      for (int root : {0, w - 1}) {
        const size_t bytes = 4 * n + 3;
        std::vector<uint8_t> h(bytes);
        for (size_t i = 0; i < bytes; ++i) h[i] = uint8_t(r * 31 + int(i) * 7);
        uint8_t* d = to_dev(h);
        nccl->broadcast(d, bytes, root);
        mpi->broadcast(h.data(), bytes, root);
        const auto g = from_dev(d, bytes);
        check(same_bits(g, h), "broadcast", bytes);
        bool ok = true;
        for (size_t i = 0; i < bytes; ++i) ok &= g[i] == uint8_t(root * 31 + int(i) * 7);
        check(ok, "broadcast closed form", bytes);
        cudaFree(d);
      }
    }
    // A host buffer is not device memory: the emulated NCCL refuses it (every rank makes the
    // same call, so no peer waits), and the communicator is broken afterwards.
    std::vector<float> host(8, 1.f);
    bool refused = false;
    try {
      nccl->all_reduce(host.data(), host.size(), dist::ReduceOp::Sum);
    } catch (const Error& e) {
      refused = e.status() == QLFT_ERR_DISTRIBUTED;
      std::printf("host buffer refused: %s\n", e.what());
    }
    check(refused, "host buffer refused", 8);
    mpi->barrier();
    std::printf("rank %d world %d errors %d\n", r, w, errors);
    std::fflush(stdout);
  } catch (const std::exception& e) {
    std::printf("error: %s\n", e.what());
    return 2;
  }
  return errors ? 1 : 0;
}
