// For the CUDA plugin (backend/cuda_plugin_abi.h), which links its own copy of core/threads.cpp:
// there num_threads() must be the count libqlft set on the calling thread (a ThreadScope of the
// C API call), not the copy's own (never set), so the plugin's host loops keep to `threads`.
#pragma once

namespace qlft {

// num_threads() asks `source` when no count was set on the thread in this copy. nullptr (the
// default, libqlft itself): available_cores().
void set_thread_count_source(int (*source)());

}  // namespace qlft
