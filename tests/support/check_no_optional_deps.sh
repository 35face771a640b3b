#!/usr/bin/env bash
# libqlft has no link-time dependency on MPI, CUDA or NCCL: they live in plugins opened at run
# time (libqlft-mpi.so, issue 20; libqlft-cuda.so, issue 43). Lists the library's DT_NEEDED
# entries and fails on any of those libraries (and their runtimes: OpenMPI's
# open-pal/open-rte/pmix, hwloc, cuBLAS, cuDNN).
#   check_no_optional_deps.sh LIB               pass when LIB needs none of them
#   check_no_optional_deps.sh LIB --must-find   pass when LIB needs one (shows the check can fail:
#                                                run on the MPI plugin, which links libmpi,
#                                                and on the CUDA plugin)
set -euo pipefail
lib=$1 mode=${2:-}
needed=$(readelf -d "$lib" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
[ -n "$needed" ] || { echo "no NEEDED entries read from $lib" >&2; exit 2; }
optional='^lib(mpi|mpi_cxx|open-pal|open-rte|pmix|hwloc|cudart|cuda|nccl|cublas|cublasLt|cudnn[a-z_]*)[.-]'
found=$(printf '%s\n' "$needed" | grep -E "$optional" || true)
if [ "$mode" = --must-find ]; then
  [ -n "$found" ] || { echo "expected an MPI/CUDA/NCCL library among: $needed" >&2; exit 1; }
  echo "$lib needs: $found (the check sees them)"
  exit 0
fi
if [ -n "$found" ]; then
  echo "$lib links optional components at link time: $found" >&2
  exit 1
fi
echo "$lib needs only:" $needed
