// libqlft-mpi.so: the MPI communicator (comm_mpi.cpp) behind the C table of mpi_plugin_abi.h.
// Built only as the plugin (never into libqlft), so that libqlft has no link-time dependency on
// libmpi: each qlft::Error thrown inside becomes a status and a message at the boundary.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <string>

#include "core/error.h"
#include "core/communicator.h"
#include "parallel/comm_mpi.h"
#include "parallel/mpi_plugin_abi.h"

namespace {

using qlft::dist::Communicator;
using qlft::dist::PendingCollective;
using qlft::dist::ReduceOp;

void put(char* err, size_t errlen, const char* msg) {
  if (err && errlen) std::snprintf(err, errlen, "%s", msg);
}

// Runs f, mapping what it throws to a status (the core's guard does the same at the C ABI).
template <class F>
int32_t run(char* err, size_t errlen, F&& f) {
  try {
    f();
    return 0;
  } catch (const qlft::Error& e) {
    put(err, errlen, e.what());
    return e.status();
  } catch (const std::bad_alloc&) {
    put(err, errlen, "out of memory in the MPI plugin");
    return QLFT_ERR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    put(err, errlen, e.what());
    return QLFT_ERR_INTERNAL;
  } catch (...) {
    put(err, errlen, "unknown exception in the MPI plugin");
    return QLFT_ERR_INTERNAL;
  }
}

Communicator* C(void* c) {
  return static_cast<Communicator*>(c);
}

struct Pending {
  Communicator* comm;
  std::unique_ptr<PendingCollective> p;
};

std::string mpi_description() {
  char v[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  MPI_Get_library_version(v, &len);
  std::string s(v, static_cast<size_t>(len > 0 ? len : 0));
  const size_t nl = s.find('\n');
  return nl == std::string::npos ? s : s.substr(0, nl);
}

const QlftMpiPlugin* table() {
  static const std::string desc = mpi_description();
  static const QlftMpiPlugin t = {
      QLFT_MPI_PLUGIN_ABI_VERSION,
      desc.c_str(),
      [](double timeout_s, void** comm, char* err, size_t errlen) {
        return run(err, errlen,
                   [&] { *comm = qlft::dist::make_mpi_communicator(timeout_s).release(); });
      },
      [](void* comm) { delete C(comm); },
      [](void* comm, int* rank, int* world, int* local_rank) {
        *rank = C(comm)->rank();
        *world = C(comm)->world();
        *local_rank = C(comm)->local_rank();
      },
      [](void* comm, double timeout_s) { C(comm)->set_timeout(timeout_s); },
      [](void* comm) { return int32_t(C(comm)->broken() ? 1 : 0); },
      [](void* comm, void* data, size_t n, int32_t is_double, int32_t avg, char* err,
         size_t errlen) {
        return run(err, errlen, [&] {
          const ReduceOp op = avg ? ReduceOp::Avg : ReduceOp::Sum;
          if (is_double)
            C(comm)->all_reduce(static_cast<double*>(data), n, op);
          else
            C(comm)->all_reduce(static_cast<float*>(data), n, op);
        });
      },
      [](void* comm, const float* in, float* out, size_t n, int32_t avg, char* err, size_t errlen) {
        return run(err, errlen, [&] {
          C(comm)->reduce_scatter(in, out, n, avg ? ReduceOp::Avg : ReduceOp::Sum);
        });
      },
      [](void* comm, const float* in, float* out, size_t n, char* err, size_t errlen) {
        return run(err, errlen, [&] { C(comm)->all_gather(in, out, n); });
      },
      [](void* comm, const void* in, void* out, size_t bytes, void** pending, char* err,
         size_t errlen) {
        return run(err, errlen, [&] {
          auto p = std::make_unique<Pending>();
          p->comm = C(comm);
          p->p = C(comm)->start_all_gather_raw(in, out, bytes);
          *pending = p.release();
        });
      },
      [](void* pending, char* err, size_t errlen) {
        return run(err, errlen, [&] { static_cast<Pending*>(pending)->p->wait(); });
      },
      [](void* pending) { delete static_cast<Pending*>(pending); },
      [](void* comm, void* data, size_t bytes, int root, char* err, size_t errlen) {
        return run(err, errlen, [&] { C(comm)->broadcast(data, bytes, root); });
      },
      [](void* comm, char* err, size_t errlen) {
        return run(err, errlen, [&] { C(comm)->barrier(); });
      },
      [](void* comm, float* data, size_t n, int root, int32_t avg, char* err, size_t errlen) {
        return run(err, errlen,
                   [&] { C(comm)->reduce(data, n, root, avg ? ReduceOp::Avg : ReduceOp::Sum); });
      },
  };
  return &t;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) const QlftMpiPlugin* qlft_mpi_plugin(void) {
  return table();
}
