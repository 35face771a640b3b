// Finds, opens and wraps the MPI plugin (libqlft-mpi.so, mpi_plugin_abi.h), so libqlft carries
// no link-time dependency on libmpi.
#pragma once

#include <memory>
#include <string>

#include "core/communicator.h"

namespace qlft::dist {

// The file the library opens: $QLFT_MPI_PLUGIN when set (a path), else libqlft-mpi.so in the
// directory of the file that holds this code (libqlft.so.0, or the executable a test links the
// static core into).
std::string mpi_plugin_path();

// An MPI communicator from the plugin. A plugin that cannot be opened (absent, or its libmpi
// missing) or that is not one (no qlft_mpi_plugin, another ABI version) throws
// QLFT_ERR_UNSUPPORTED naming the file and dlerror()'s text; MPI failures are the plugin's
// (QLFT_ERR_DISTRIBUTED). The plugin stays loaded for the life of the process (MPI finalizes at
// exit from inside it).
std::unique_ptr<Communicator> make_mpi_communicator_from_plugin(double timeout_s);

// Opens the plugin (as above) without starting MPI: qlft_runtime_create's check, so
// dist.backend=mpi without a plugin fails before the model and data load.
void require_mpi_plugin();

}  // namespace qlft::dist
