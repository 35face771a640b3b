# shellcheck shell=bash
# The setup the CLI's end-to-end scripts share, sourced with their arguments
# (SCRIPT QLFT_FINETUNE SHARED_DIR ...): cli and shared as absolute paths, model (stories260K) and
# text (Shakespeare), a skip through skip.sh where they are absent (a failure under CI=true), a
# work directory made, entered and removed at exit (write bits restored first: some checks take
# them away), small.txt (the text's first E2E_SMALL_BYTES bytes, default 40000) and
# check NAME STATUS [FILE], which prints ok/FAIL (FILE's lines on a failure) and counts `fails`.
cli=$(realpath "$1")
shared=$(realpath "$2")
model="$shared/models/stories260K.gguf"
text="$shared/data/tinyshakespeare.txt"
# shellcheck source=../support/skip.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/skip.sh"
[ -f "$model" ] && [ -f "$text" ] || qlft_skip shared-missing "$model or $text not found (set QLFT_SHARED_DIR)"
work=$(mktemp -d)
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
cd "$work" || exit 1
head -c "${E2E_SMALL_BYTES:-40000}" "$text" >small.txt
fails=0
check() {  # check NAME STATUS(0 = pass) [file to show on failure]
  if [ "$2" = 0 ]; then echo "ok   $1"; else
    echo "FAIL $1"; [ -n "${3:-}" ] && sed 's/^/     /' "$3"; fails=$((fails + 1)); fi
}
