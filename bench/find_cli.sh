# Sourced by the bench scripts: sets qlft to the qlft-finetune binary when --qlft did not (build/
# first, then the other build directories), or exits naming the problem. Needs $root.
if [ -z "${qlft:-}" ]; then
  for b in "$root"/build/tools/qlft-finetune/qlft-finetune \
           "$root"/build*/tools/qlft-finetune/qlft-finetune; do
    if [ -x "$b" ]; then qlft=$b; break; fi
  done
fi
[ -x "${qlft:-}" ] || { echo "qlft-finetune not found: pass --qlft" >&2; exit 1; }
