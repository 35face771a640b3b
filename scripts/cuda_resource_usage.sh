#!/usr/bin/env bash
# Per-kernel resource usage of the CUDA backend on sm_80 and sm_90, read offline from ptxas
# (`nvcc -cubin -Xptxas -v`, the same report the build prints), and the theoretical occupancy it
# allows. Prints a Markdown table (docs/PERFORMANCE.md, "CUDA kernels: resource usage").
#
#   scripts/cuda_resource_usage.sh > /tmp/table.md
#
# Occupancy = resident warps per SM / 64, with resident blocks per SM the minimum of
#   - the block limit (32 on sm_80 and sm_90),
#   - the warp limit: floor(64 / warps per block),
#   - registers: floor(floor(65536 / regs per warp) / warps per block), regs per warp =
#     ceil(regs per thread * 32 / 256) * 256 (allocation unit 256, per warp),
#   - shared memory: floor(smem per SM / (ceil((static + dynamic) / 128) * 128 + 1024)), with
#     164 KiB (sm_80) or 228 KiB (sm_90) per SM and the 1 KiB the runtime reserves per block,
# as the CUDA occupancy calculator computes it. Threads per block come from each kernel's
# __launch_bounds__; dynamic shared memory from the launch code's formulas (attention: the
# variant's largest head dim; ggml dequantization: threads x block elements x 4).
set -euo pipefail
cd "$(dirname "$0")/.."
nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# kernel base name -> threads per block, from the sources.
perl -0777 -ne 'while (/__launch_bounds__\((\d+)\)\s+(k_\w+)/g) { print "$2 $1\n" }' cuda/src/*.cu \
  > "$tmp/bounds"

for arch in 80 90; do
  for f in cuda/src/*.cu; do
    "$nvcc" -std=c++17 --expt-relaxed-constexpr -Isrc -Iinclude -cubin -arch=sm_$arch \
      -Xptxas -v -o /dev/null "$f" 2>&1 | grep -E "Compiling entry|bytes stack frame|Used [0-9]+ registers" \
      | sed "s/^/$arch /" >> "$tmp/ptxas" || true
  done
done

# One line per (arch, mangled name): arch name regs static_smem stack spill_st spill_ld
awk '
  / Compiling entry function / { match($0, /\047[^\047]+\047/); name = substr($0, RSTART + 1, RLENGTH - 2); arch = $1; next }
  /bytes stack frame/ { stack = $2; spst = $6; spld = $10; next }
  /Used [0-9]+ registers/ {
    regs = 0; smem = 0
    for (i = 1; i <= NF; i++) { if ($(i+1) == "registers,") regs = $i; if ($(i+1) == "bytes" && $(i+2) ~ /^smem/) smem = $i }
    print arch, name, regs, smem, stack, spst, spld
  }' "$tmp/ptxas" > "$tmp/raw"

# Demangle and shorten: k_attn_bwd<4>, k_dequant_elem<BF16>, ...
cut -d" " -f2 "$tmp/raw" | c++filt | sed -E \
  -e 's/\(qlft::cu::TileType\)0/F32/g; s/\(qlft::cu::TileType\)1/BF16/g; s/\(qlft::cu::TileType\)2/F16/g' \
  -e 's/^.*::(k_[A-Za-z0-9_]+(<[^>]*>)?)\(.*$/\1/' -e 's/, /,/g' > "$tmp/names"
paste -d" " "$tmp/raw" "$tmp/names" > "$tmp/rows"

echo "| kernel | threads | dyn smem (B) | sm_80 regs | sm_80 smem (B) | sm_80 spill st/ld (B) | sm_80 occupancy | sm_90 regs | sm_90 smem (B) | sm_90 spill st/ld (B) | sm_90 occupancy |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
awk -v bounds="$tmp/bounds" '
  BEGIN { while ((getline l < bounds) > 0) { split(l, a, " "); threads[a[1]] = a[2] } }
  function dyn(k,   nc, d) {
    if (k ~ /^k_attn_fwd</) { nc = k; gsub(/[^0-9]/, "", nc); d = 32 * nc; return (16 + 64) * (d + 1) * 4 }
    if (k ~ /^k_attn_bwd</) { nc = k; gsub(/[^0-9]/, "", nc); d = 32 * nc; return (128 * (d + 1) + 64 * 33) * 4 }
    if (k ~ /^k_dequant_ggml<.*, *32>/) return 128 * 32 * 4
    if (k ~ /^k_dequant_ggml<.*, *256>/) return 32 * 256 * 4
    return 0
  }
  function occ(arch, regs, smem, t,   wpb, rpw, br, bs, bw, b, smsm) {
    wpb = int((t + 31) / 32)
    rpw = int((regs * 32 + 255) / 256) * 256
    br = rpw > 0 ? int(int(65536 / rpw) / wpb) : 32
    smsm = arch == 80 ? 167936 : 233472
    bs = int(smsm / (int((smem + 127) / 128) * 128 + 1024))
    bw = int(64 / wpb)
    b = 32; if (br < b) b = br; if (bs < b) b = bs; if (bw < b) b = bw
    return sprintf("%d%% (%d blk)", int(100 * b * wpb / 64 + 0.5), b)
  }
  {
    arch = $1; regs = $3; smem = $4; st = $6; ld = $7; k = $8
    base = k; sub(/<.*/, "", base)
    t = (base in threads) ? threads[base] : 0
    if (k ~ /^k_dequant_ggml<.*,256>/) t = 32  # launched with 32 threads (launch bounds 128)
    d = dyn(k)
    key = k
    if (!(key in seen)) { seen[key] = 1; order[++n] = key; thr[key] = t; dy[key] = d }
    cell[key, arch] = sprintf("%s | %d | %s/%s | %s", regs, smem + d, st, ld, t ? occ(arch, regs, smem + d, t) : "?")
  }
  END {
    for (i = 1; i <= n; i++) {
      k = order[i]
      printf "| `%s` | %d | %d | %s | %s |\n", k, thr[k], dy[k], cell[k, 80], cell[k, 90]
    }
  }' "$tmp/rows" | sort
