#!/usr/bin/env bash
# ZeRO-3 across ranks that talk over TCP as they would across hosts: each rank in its own
# network namespace, joined to the others by veth pairs on one bridge (10.77.0.0/24), Open MPI
# on its TCP transports only (no shared memory). Prints each rank's peak RSS, the step time,
# and the bytes each rank sent (its veth's counters), beside the same run on 1 rank.
#
#   sudo bench/zero3_netns.sh [--qlft path/to/qlft-finetune] [--ranks N] [--model M.gguf]
#                             [--data D.txt] [--steps S] [--batch E] [--local]
#                             [-- extra --key value settings]
#
# --local: the ranks on this machine as mpirun starts them (shared memory; no root needed, no
# byte counts).
#
# Defaults: 4 ranks, SmolLM2-135M-Instruct Q4_1 (quant.type keep), tinyshakespeare (first
# 200 kB), seq 256, micro-batch 1, effective batch E = 4 (accumulation 4 on 1 rank, 4 / N on
# N ranks), 2 steps,
# 1 thread per rank, gradient checkpointing, dist.zero_stage 3. Needs root (ip netns) and
# mpirun; everything it makes (namespaces qlftns*, bridge qlftbr0) is removed on exit.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
qlft=""
ranks=4
batch=4
steps=2
model=/opt/qlft-models/smollm2-135m-instruct-q4_1.gguf
data=${QLFT_SHARED_DIR:-$root/../shared}/data/tinyshakespeare.txt
extra=()
local=0
while (($#)); do
  case "$1" in
    --qlft) qlft=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --local) local=1; shift ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n 2,19p "$0"; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
source "$here/find_cli.sh"
((batch % ranks == 0)) || { echo "--batch $batch is not a multiple of --ranks $ranks" >&2; exit 2; }
[ "$local" = 1 ] || [ "$(id -u)" = 0 ] || { echo "needs root (ip netns), or --local" >&2; exit 1; }
command -v mpirun >/dev/null || { echo "mpirun not found" >&2; exit 1; }

work=$(mktemp -d)
cleanup() {
  if [ "$local" = 0 ]; then
    for ((i = 0; i < ranks; ++i)); do ip netns del "qlftns$i" 2>/dev/null || true; done
    ip link del qlftbr0 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
# Where the ranks run: one network namespace each (TCP), or this machine (--local).
where=(--mca btl self,vader)
if [ "$local" = 0 ]; then
  ip link add qlftbr0 type bridge
  ip addr add 10.77.0.1/24 dev qlftbr0
  ip link set qlftbr0 up
  hosts=()
  for ((i = 0; i < ranks; ++i)); do
    ip netns add "qlftns$i"
    ip link add "qlftv$i" type veth peer name eth0 netns "qlftns$i"
    ip link set "qlftv$i" master qlftbr0 up
    ip -n "qlftns$i" addr add "10.77.0.$((11 + i))/24" dev eth0
    ip -n "qlftns$i" link set eth0 up
    ip -n "qlftns$i" link set lo up
    hosts+=("10.77.0.$((11 + i))")
  done
  # Open MPI's remote launcher: "agent HOST COMMAND..." runs COMMAND in HOST's namespace.
  cat >"$work/agent" <<'AGENT'
#!/bin/sh
host=$1; shift
exec ip netns exec "qlftns$(( ${host##*.} - 11 ))" sh -c "$*"
AGENT
  chmod +x "$work/agent"
  where=(--host "$(IFS=,; echo "${hosts[*]}")" --mca plm_rsh_agent "$work/agent"
         --mca routed direct --mca oob_tcp_if_include 10.77.0.0/24 --mca btl self,tcp
         --mca btl_tcp_if_include 10.77.0.0/24)
fi
# Bytes each rank's namespace sent (its veth's host end received them).
sent_bytes() { [ "$local" = 1 ] && echo 0 || cat "/sys/class/net/qlftv$1/statistics/rx_bytes"; }

head -c 200000 "$data" >"$work/data.txt"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
args=(train --model "$model" --data "$work/data.txt" --quant.type keep --threads 1
      --data.seq_len 256 --train.micro_batch 1 --train.max_steps "$steps"
      --train.grad_checkpointing 1 "${extra[@]}")
/usr/bin/time -f "%M" -o "$work/one.rss" "$qlft" "${args[@]}" --train.accumulation "$batch" \
  --train.output_dir "$work/one" >"$work/one.out" 2>"$work/one.err" ||
  { cat "$work/one.err" >&2; exit 1; }
tx0=(); for ((i = 0; i < ranks; ++i)); do tx0+=("$(sent_bytes "$i")"); done
start=$(date +%s.%N)
mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$ranks" "${where[@]}" \
  -x OMP_NUM_THREADS -x OMP_WAIT_POLICY ${GLIBC_TUNABLES:+-x GLIBC_TUNABLES} \
  sh -c 'exec /usr/bin/time -f "%M" -o "$0.$OMPI_COMM_WORLD_RANK" "$@"' "$work/rank.rss" \
  "$qlft" "${args[@]}" --train.accumulation $((batch / ranks)) --dist.backend mpi --dist.zero_stage 3 \
  --train.output_dir "$work/many" >"$work/many.out" 2>"$work/many.err" ||
  { cat "$work/many.err" >&2; exit 1; }
wall=$(echo "$(date +%s.%N) - $start" | bc)
losses() { sed -n 's/.*"loss": \([0-9.e+-]*\).*/\1/p' "$1/metrics.jsonl" | tr '\n' ' '; }
step_s() { sed -n 's/.*"tokens": \([0-9]*\), "tokens_per_s": \([0-9.]*\).*/\1 \2/p' "$1/metrics.jsonl" |
  awk '{ s += $1 / $2; n++ } END { printf "%.2f", s / n }'; }
one=$(awk '{ printf "%.1f", $1 / 1024 }' "$work/one.rss")
echo "model $model, seq 256, micro-batch 1, effective batch $batch, $steps steps, ZeRO-3 $([ "$local" = 1 ] && echo "on this machine (shared memory)" || echo "over TCP (network namespaces)")"
echo "1 rank:  peak RSS $one MiB, step $(step_s "$work/one") s, losses $(losses "$work/one")"
echo "$ranks ranks: step $(step_s "$work/many") s, losses $(losses "$work/many"), wall $wall s (setup included)"
for ((i = 0; i < ranks; ++i)); do
  rss=$(awk '{ printf "%.1f", $1 / 1024 }' "$work/rank.rss.$i")
  sent=$(( $(sent_bytes "$i") - ${tx0[$i]} ))
  awk -v r="$i" -v m="$rss" -v o="$one" -v b="$sent" -v s="$steps" 'BEGIN {
    printf "  rank %s: peak RSS %.1f MiB (%.3fx of 1 rank), sent %.1f MiB (%.1f MiB per step)\n",
           r, m, m / o, b / 1048576, b / 1048576 / s }'
done
grep -h -E "^(total peak|untracked|peak RSS)" "$work/one.out" "$work/many.out" | sed 's/^/  tracker (1 rank, then rank 0): /'
