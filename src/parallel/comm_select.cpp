// dist.backend -> a communicator: the single-rank one, MPI through its plugin
// (mpi_plugin_loader.h), or NCCL (the CUDA plugin, backend/cuda_plugin.h) bootstrapped over MPI.
// Only in libqlft, never in the MPI plugin (which compiles communicator.cpp for the base class).
#include "core/error.h"
#include "parallel/comm_select.h"
#include "parallel/mpi_plugin_loader.h"
#include "backend/cuda_plugin.h"

namespace qlft::dist {

std::unique_ptr<Communicator> make_communicator(DistBackend backend, double timeout_s) {
  std::unique_ptr<Communicator> c;
  switch (backend) {
    case DistBackend::None: {
      LaunchInfo li = detect_launch();
      if (li.world > 1)
        throw_error(QLFT_ERR_INVALID_ARGUMENT,
                    "this process was launched as rank %d of %d (%s) but dist.backend is none: "
                    "set dist.backend=mpi (or nccl), or launch one process",
                    li.rank, li.world, li.source.c_str());
      c = make_single_communicator();
      break;
    }
    case DistBackend::Mpi:
      c = make_mpi_communicator_from_plugin(timeout_s);
      break;
    case DistBackend::Nccl: {
      // NCCL lives in the CUDA plugin; its unique id travels over MPI, and the MPI communicator
      // stays as NCCL's bootstrap.
      const CudaPlugin& cuda = cuda_plugin::get("dist.backend=nccl");
      c = cuda.make_nccl_communicator(make_mpi_communicator_from_plugin(timeout_s), timeout_s);
      break;
    }
  }
  QLFT_CHECK_ARG(c, "dist.backend: unknown backend %d", static_cast<int>(backend));
  c->set_timeout(timeout_s);
  return c;
}

}  // namespace qlft::dist
