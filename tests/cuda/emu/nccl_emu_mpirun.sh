#!/usr/bin/env bash
# The emulated NCCL communicator under mpirun -np 2 against the MPI communicator (issue 17,
# Done-when 4). usage: nccl_emu_mpirun.sh WORKER
set -euo pipefail
worker=$1
source "$(dirname "${BASH_SOURCE[0]}")/../../support/skip.sh"
command -v mpirun >/dev/null 2>&1 ||
  qlft_skip toolchain-missing "mpirun not found (apt-get install openmpi-bin)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
# As tests/dist/common.sh: root in containers, 2 ranks on however few cores, no binding, the
# shared-memory and self transports only.
timeout 240 mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 --mca btl self,vader \
  -x OMP_NUM_THREADS -x OMP_WAIT_POLICY -x QLFT_MPI_PLUGIN "$worker" "$work/nccl" || {
  cat "$work"/nccl.* 2>/dev/null
  exit 1
}
cat "$work/nccl.0" "$work/nccl.1"
grep -q "rank 0 world 2 errors 0" "$work/nccl.0"
grep -q "rank 1 world 2 errors 0" "$work/nccl.1"
echo "nccl (emulated) equals mpi: ok"
