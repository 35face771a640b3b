#!/usr/bin/env bash
# The MPI communicator's collectives on 2 ranks, against closed-form sums (dist_worker comm).
no_data=1
source "$(dirname "$0")/common.sh"
timeout 120 "${mpi[@]}" "$worker" comm "$work/comm" || { cat "$work"/comm.* 2>/dev/null; exit 1; }
cat "$work/comm.0" "$work/comm.1"
grep -q "rank 0 world 2 local 0 errors 0" "$work/comm.0"
grep -q "rank 1 world 2 local 1 errors 0" "$work/comm.1"
echo "collectives: ok"
# A peer that is slow but alive (arrives inside the liveness-probe window) is not a failure.
timeout 120 "${mpi[@]}" "$worker" slow "$work/slow" || { cat "$work"/slow.* 2>/dev/null; exit 1; }
grep -qx ok "$work/slow.0" && grep -qx ok "$work/slow.1"
echo "slow peer: ok"
