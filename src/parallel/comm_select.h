// dist.backend -> a communicator (comm_select.cpp).
#pragma once

#include <memory>

#include "config/run_spec.h"
#include "core/communicator.h"

namespace qlft::dist {

// None: the single-rank communicator (refused when a launcher started several ranks); Mpi and
// Nccl load the MPI plugin (QLFT_ERR_UNSUPPORTED naming the file and the loader's reason when it
// cannot be opened); Nccl also needs the CUDA plugin. timeout_s bounds every collective (0: no
// bound).
std::unique_ptr<Communicator> make_communicator(DistBackend backend, double timeout_s);

}  // namespace qlft::dist
