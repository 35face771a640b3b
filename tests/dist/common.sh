# Shared by the tests/dist scripts: arguments, skip rules, the data subset, mpirun flags.
# usage (sourced): common.sh WORKER SHARED_DIR
set -euo pipefail
worker=$1
shared=$2
model="$shared/models/stories260K.gguf"
text="$shared/data/tinyshakespeare.txt"
source "$(dirname "${BASH_SOURCE[0]}")/../support/skip.sh"
# A build configured without MPI skips even in CI (a deliberate choice, e.g. the sanitizer builds).
case "${QLFT_MPI_BUILD:-ON}" in
  ON | 1 | TRUE | true) ;;
  *) qlft_skip mpi-off-build "built without MPI (QLFT_MPI=OFF)" ;;
esac
if [ "${no_data:-0}" != 1 ]; then
  [ -f "$model" ] && [ -f "$text" ] || qlft_skip shared-missing "shared data not found ($model, $text)"
fi
command -v mpirun >/dev/null 2>&1 ||
  qlft_skip toolchain-missing "mpirun not found (apt-get install openmpi-bin)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# A small slice of the text keeps tokenizing fast; seq_len 64 gives a few hundred rows.
[ "${no_data:-0}" = 1 ] || head -c 40000 "$text" >"$work/data.txt"
data="$work/data.txt"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
# Root in containers, 2 ranks on however few cores; no CPU binding (cores are shared); the
# shared-memory and self transports only (one machine). mpi4: the same with 4 ranks.
mpi_opts=(--allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader
          -x OMP_NUM_THREADS -x OMP_WAIT_POLICY)
mpi=(mpirun "${mpi_opts[@]}" -np 2)
mpi4=(mpirun "${mpi_opts[@]}" -np 4)
