#!/usr/bin/env bash
# The training report of a real stories260K run (issue 22): `train` writes report.html at its
# end, `report` rewrites it, the drawn points are the metrics.jsonl records (test_report's
# real-run case), and headless Chromium renders it: a PNG of the page's size in which every
# chart's curves are drawn (their colours counted in the pixels), with no console message (the
# page has no script, so any message is an error). A page that logs an error is run through the
# same check first, so the check can fail.
# usage: report_chromium.sh QLFT_FINETUNE SHARED_DIR TEST_REPORT
set -euo pipefail
cli=$(realpath "$1")
shared=$(realpath "$2")
test_report=$(realpath "$3")
model="$shared/models/stories260K.gguf"
text="$shared/data/tinyshakespeare.txt"
# shellcheck source=../support/skip.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/skip.sh"
# Neither reason is in tests/support/expected_skips.txt: under CI=true both fail.
[ -f "$model" ] && [ -f "$text" ] || qlft_skip shared-missing "$model or $text not found"
chromium=$(command -v chromium || command -v chromium-browser || true)
# (scripts/setup.sh installs the Debian package chromium.)
[ -n "$chromium" ] || qlft_skip chromium-missing "chromium not installed (Debian package chromium)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
head -c 20000 "$text" >small.txt

# A real run: 8 steps, evaluations every 4, seq 64.
"$cli" train --model "$model" --data small.txt --quant.type keep --threads 2 --seed 3 \
  --data.seq_len 64 --train.micro_batch 2 --lora.r 4 --train.max_steps 8 \
  --train.eval_every 4 --data.eval_fraction 0.1 --train.output_dir run >train.out 2>train.err ||
  { cat train.err; exit 1; }
grep -q "^report: run/report.html" train.err || { echo "FAIL: train did not write its report"; cat train.err; exit 1; }
[ -s run/report.html ] || { echo "FAIL: no run/report.html"; exit 1; }
grep -q '"mem": {"weights"' run/metrics.jsonl || { echo "FAIL: no memory per category in metrics.jsonl"; exit 1; }
grep -q '"run": {"model"' run/metrics.jsonl || { echo "FAIL: no run record in metrics.jsonl"; exit 1; }
grep -q '<td>finished</td>' run/report.html || { echo "FAIL: report of a finished run does not say so"; exit 1; }

# `report` rewrites it from metrics.jsonl alone; the drawn points are the records.
"$cli" report run >report.out
[ "$(cat report.out)" = run/report.html ] || { echo "FAIL: report printed $(cat report.out)"; exit 1; }
QLFT_REPORT_RUN_DIR="$work/run" "$test_report" --gtest_also_run_disabled_tests \
  --gtest_filter=Report.DISABLED_RealRunDrawnPointsAreItsRecords >points.out 2>&1 ||
  { cat points.out; exit 1; }
grep -q "1 test.*PASSED\|\[  PASSED  \] 1 test" points.out || { cat points.out; exit 1; }
# --watch rewrites it until stopped, as a page that reloads itself.
timeout -s INT 3 "$cli" report run --watch 1 --out live.html 2>watch.err || true
grep -q '<meta http-equiv="refresh" content="1">' live.html ||
  { echo "FAIL: --watch wrote no self-refreshing page"; cat watch.err; exit 1; }
n_svg=$(grep -c '<svg ' run/report.html)
[ "$n_svg" -ge 6 ] || { echo "FAIL: $n_svg charts in the report"; exit 1; }
if grep -qi '<script\|https\?://[^w]\|src=' run/report.html; then
  echo "FAIL: the report loads or runs something"; exit 1
fi

# render PAGE PNG: headless Chromium screenshot with the console on stderr.
render() {
  "$chromium" --headless --disable-gpu --no-sandbox --no-first-run --enable-logging=stderr \
    --v=0 --hide-scrollbars --window-size=1000,2700 --screenshot="$2" "file://$work/$1" \
    >"$2.out" 2>"$2.err" || { cat "$2.err"; return 1; }
  [ -s "$2" ] || { echo "FAIL: no screenshot $2"; cat "$2.err"; return 1; }
}
console_messages() { grep -E ':CONSOLE|Failed to load|Uncaught' "$1.err" || true; }

# The check catches a page that logs an error.
printf '<html><body><script>console.error("broken")</script><p>x</p></body></html>' >bad.html
render bad.html bad.png
[ -n "$(console_messages bad.png)" ] || { echo "FAIL: a console error went unnoticed"; cat bad.png.err; exit 1; }

render run/report.html report.png
msgs=$(console_messages report.png)
[ -z "$msgs" ] || { echo "FAIL: console messages: $msgs"; exit 1; }
# The PNG: the window's size, and each chart's curve colour drawn in it (report_html.cpp).
python3 - report.png <<'PY'
import struct, sys, zlib
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
pos, idat, w = 8, b"", 0
while pos < len(data):
    n, kind = struct.unpack(">I4s", data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    if kind == b"IHDR":
        w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
    elif kind == b"IDAT":
        idat += body
    pos += 12 + n
assert (w, h) == (1000, 2700), f"page rendered as {w}x{h}, not 1000x2700"
assert depth == 8 and ctype in (2, 6) and interlace == 0, (depth, ctype, interlace)
bpp = 3 if ctype == 2 else 4
raw = zlib.decompress(idat)
stride = w * bpp
rows, prev, i = [], bytearray(stride), 0
for y in range(h):
    f = raw[i]; line = bytearray(raw[i + 1:i + 1 + stride]); i += 1 + stride
    for x in range(stride):
        a = line[x - bpp] if x >= bpp else 0
        b = prev[x]; c = prev[x - bpp] if x >= bpp else 0
        if f == 1: line[x] = (line[x] + a) & 255
        elif f == 2: line[x] = (line[x] + b) & 255
        elif f == 3: line[x] = (line[x] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c; pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    rows.append(bytes(line)); prev = line
counts = {}
for row in rows:
    for x in range(0, stride, bpp):
        px = row[x:x + 3]
        counts[px] = counts.get(px, 0) + 1
def near(hexcol, tol=40):
    t = bytes.fromhex(hexcol)
    return sum(n for c, n in counts.items() if all(abs(c[k] - t[k]) <= tol for k in range(3)))
white = counts.get(b"\xff\xff\xff", 0)
assert white < w * h * 0.97, f"page nearly blank ({white} of {w*h} white)"
# smoothed loss, learning rate, tokens/s, gradient norm, memory weights (report_html.cpp)
for name, col in [("loss_smoothed", "1f4e9c"), ("lr", "2a9d8f"), ("tokens_per_s", "264653"),
                  ("grad_norm", "6a4c93"), ("mem_weights", "4c72b0"), ("eval_loss", "d1495b")]:
    n = near(col, 24)
    assert n >= 150, f"{name}: {n} pixels of #{col}: the curve was not drawn (a legend swatch is 36)"
    print(f"{name}: {n} pixels")
print(f"rendered {w}x{h}")
PY
echo "report_chromium: ok"
