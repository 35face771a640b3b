// The host table the plugin was opened with (plugin_entry.cpp sets it before anything runs).
#pragma once

#include "backend/cuda_plugin_abi.h"

namespace qlft {
void set_plugin_host(const CudaPluginHost* host);
}
