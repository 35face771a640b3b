# Shared by the tests/dist scripts: arguments, skip rules, the data subset, mpirun flags.
# usage (sourced): common.sh WORKER SHARED_DIR
set -euo pipefail
worker=$1
shared=$2
model="$shared/models/stories260K.gguf"
text="$shared/data/tinyshakespeare.txt"
require=0
if [ "${QLFT_REQUIRE_SHARED:-0}" = 1 ] || [ "${CI:-}" = true ]; then require=1; fi
skip() {
  if [ "$require" = 1 ]; then echo "FAIL (required in CI): $1"; exit 1; fi
  echo "SKIP: $1"; exit 77
}
# A build configured without MPI skips even in CI (a deliberate choice, e.g. the sanitizer builds).
case "${QLFT_MPI_BUILD:-ON}" in
  ON | 1 | TRUE | true) ;;
  *) echo "SKIP: built without MPI (QLFT_MPI=OFF)"; exit 77 ;;
esac
if [ "${no_data:-0}" != 1 ]; then
  [ -f "$model" ] && [ -f "$text" ] || skip "shared data not found ($model, $text)"
fi
command -v mpirun >/dev/null 2>&1 || skip "mpirun not found (apt-get install openmpi-bin)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# A small slice of the text keeps tokenizing fast; seq_len 64 gives a few hundred rows.
[ "${no_data:-0}" = 1 ] || head -c 40000 "$text" >"$work/data.txt"
data="$work/data.txt"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
# Root in containers, 2 ranks on however few cores; no CPU binding (cores are shared); the
# shared-memory and self transports only (one machine).
mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2
     --mca btl self,vader -x OMP_NUM_THREADS -x OMP_WAIT_POLICY)
