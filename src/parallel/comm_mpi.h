// The MPI communicator's factory (comm_mpi.cpp), compiled into the MPI plugin only: libqlft
// reaches it through the plugin table (mpi_plugin_abi.h, mpi_plugin_loader.h).
#pragma once

#include <memory>

#include "core/communicator.h"

namespace qlft::dist {

std::unique_ptr<Communicator> make_mpi_communicator(double timeout_s);

}  // namespace qlft::dist
