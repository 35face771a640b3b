// Thread control: one count for OpenMP regions and BLAS, so the two never oversubscribe.
#pragma once

namespace qlft {

// n <= 0 means the number of cores the process may use.
void set_num_threads(int n);
int num_threads();
int available_cores();

}  // namespace qlft
