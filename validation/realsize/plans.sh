#!/bin/sh
# The --dry-run memory plans of the real distillation pairs, from the cards of mod/
# (doc/models.md) alone: nothing is downloaded, one process plans every layout.
#   Qwen3-8B -> Qwen3-0.6B, Llama-3.1-8B -> Llama-3.2-1B and Gemma-3-4B -> Gemma-3-1B, BF16,
#   on one rank and on
#   tp 2 x pp 2 (--ranks 4), micro-batch 1 x SEQ tokens, global batch 16, ZeRO-1,
#   selective recompute.
# Prints one markdown row per rank (doc/realsize.md, "Plans of the real pairs").
#
#   validation/realsize/plans.sh [SEQ]          (from a built tree; SEQ default 4096)
# Environment: KD_BUILDDIR (where src/kdtrain was built; default: the source tree).
set -eu
SRC=$(cd "$(dirname "$0")/../.." && pwd)
KDTRAIN=${KD_BUILDDIR:-$SRC}/src/kdtrain
SEQ=${1:-4096}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
export KDTRAIN_MOD_PATH="$SRC/mod"
cat > "$W/plan.nml" <<EOF2
&run mode = 'distill', steps = 1, out_dir = '$W/o' /
&teacher card = 'qwen3-8b' /
&student card = 'qwen3-0.6b', init = 'random' /
&parallel micro_batch = 1, global_batch = 16, zero = 1 /
&data train = '$SRC/input/corpus/kjv-train.txt', format = 'bytes', seq_len = $SEQ /
&loss kind = 'fkl', temperature = 1.0, alpha = 0.5 /
&optim lr = 1e-5, min_lr = 1e-6 /
&precision compute = 'bf16' /
&memory recompute = 'selective' /
EOF2

gib() { awk -v b="$1" 'BEGIN { printf "%.2f", b / 1073741824 }'; }
echo "| pair | layout | rank | weights | gradients | optimizer | activations | loss chunk | communication | total (GiB) |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
for pair in "qwen3-8b qwen3-0.6b" "llama3.1-8b llama3.2-1b" "gemma3-4b gemma3-1b"; do
  set -- $pair
  for layout in "1 1 1" "4 2 2"; do
    set -- "$1" "$2" $layout
    "$KDTRAIN" --dry-run --bytes --ranks "$3" "$W/plan.nml" teacher%card="'$1'" student%card="'$2'" \
      parallel%tp="$4" parallel%pp="$5" > "$W/plan.txt" 2>&1 || { cat "$W/plan.txt"; exit 1; }
    awk '/^  rank / { on = 1; next } on && $1 ~ /^[0-9]+$/ { print } /^  per pipeline/ { on = 0 }' \
      "$W/plan.txt" | while read -r r wt gr op ac lc cm ho tot mib; do
      printf "| %s -> %s | %s rank(s), tp %s pp %s | %s | %s | %s | %s | %s | %s | %s | %s |\n" \
        "$1" "$2" "$3" "$4" "$5" "$r" "$(gib "$wt")" "$(gib "$gr")" "$(gib "$op")" "$(gib "$ac")" \
        "$(gib "$lc")" "$(gib "$cm")" "$(gib "$tot")"
    done
  done
done
