#!/bin/sh
# Real-size proof (not in make check: about 20 GB of disk, 15 GB of memory, tens of
# minutes on 2 cores). Random-weight models with the real Qwen2.5-1.5B (teacher; also
# its variant padded to 152064 ids, as Qwen2.5-7B is) and Qwen2.5-0.5B configurations
# (--pair qwen2.5, the default) or the real Qwen3-1.7B (teacher) and Qwen3-0.6B
# configurations (--pair qwen3) written by transformers, a BPE tokenizer trained on
# the embedded corpus, then
#   kdconvert from-hf -> kdprep -> kdtrain --dry-run -> 2 distillation steps (BF16)
#   -> mode='eval' -> kdconvert to-hf -> transformers loads the directory with its
#   tokenizer and generates.
# Prints for each stage its wall time and peak RSS next to the planned figure.
#
#   validation/realsize/run.sh [--pair qwen2.5|qwen3] [WORKDIR]   (from a built tree)
# Environment: KD_PYTHON (a Python with torch, transformers, tokenizers, h5py),
# KD_BUILDDIR (where src/kdtrain was built; default: the source tree), MPIEXEC.
set -eu
SRC=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${KD_BUILDDIR:-$SRC}
PAIR=qwen2.5
if [ "${1:-}" = --pair ]; then PAIR=${2:-}; shift; [ $# -eq 0 ] || shift; fi
# the models written, the teacher and the student of the distillation, the work directory
case $PAIR in
  qwen2.5) MODELS="qwen2.5-1.5b qwen2.5-1.5b-v152064 qwen2.5-0.5b" TEACHER=qwen2.5-1.5b-v152064
    STUDENT=qwen2.5-0.5b W=${1:-/tmp/kd-realsize} ;;
  qwen3) MODELS="qwen3-1.7b qwen3-0.6b" TEACHER=qwen3-1.7b STUDENT=qwen3-0.6b
    W=${1:-/tmp/kd-realsize-qwen3} ;;
  *) echo "run.sh: --pair '$PAIR': expected qwen2.5 or qwen3" >&2; exit 2 ;;
esac
PY=${KD_PYTHON:-python3}
MPIEXEC=${MPIEXEC:-mpiexec}
KDTRAIN=$BUILD/src/kdtrain KDCONVERT=$BUILD/src/tools/kdconvert
KDPREP="$PY $SRC/src/tools/kdprep.py"
export OMP_WAIT_POLICY=passive
mkdir -p "$W"
cd "$W"
: > table.txt

# stage NAME PLANNED_MIB CMD...: run CMD under GNU time, record wall time and peak RSS
stage() {
  name=$1 plan=$2; shift 2
  echo "== $name: $*"
  if [ -s "$name.time" ] && [ -z "${REALSIZE_REDO:-}" ]; then
    echo "(done in an earlier run of this script in $W: kept; REALSIZE_REDO=1 redoes it)"
  else
    /usr/bin/time -f '%e %M' -o "$name.time" "$@" > "$name.log" 2>&1 || { cat "$name.log"; rm -f "$name.time"; echo "FAIL: $name"; exit 1; }
  fi
  tail -n 3 "$name.log"
  read -r wall rss < "$name.time"
  printf "| %-28s | %9.1f | %14.0f | %13s |\n" "$name" "$wall" "$((rss / 1024))" "$plan" >> table.txt
}
# mib BYTES: bytes as MiB
mib() { awk -v b="$1" 'BEGIN { printf "%.0f", b / 1048576 }'; }
# fp32 bytes of a model's weights: 4 x the parameter count printed by make_models.py
fp32_bytes() { awk -v n="$1" '$1 == n":" { printf "%.0f", $2 * 4e9 }' models.txt; }

[ -d "hf/$STUDENT" ] || "$PY" "$SRC/validation/realsize/make_models.py" hf \
  "$SRC/input/corpus/kjv-train.txt" "$PAIR" | tee models.txt

# import: the plan is the weights alone plus a bounded working set (target <= 1.3 x fp32)
for m in $MODELS; do
  b=$(fp32_bytes "$m")
  stage "import $m" "$(mib "$(awk -v b="$b" 'BEGIN { printf "%.0f", 1.3 * b }')")" \
    "$KDCONVERT" from-hf "hf/$m" "$m.h5" "$m.nml"
done

# tokens: the corpus through the student's tokenizer, read from its weights file
stage "kdprep (megatron)" "-" $KDPREP --weights "$STUDENT.h5" --input "$SRC/input/corpus/kjv-train.txt" \
  --output-prefix kjv --append-eod --workers 2
stage "kdprep valid" "-" $KDPREP --weights "$STUDENT.h5" --input "$SRC/input/corpus/kjv-valid.txt" \
  --output-prefix kjv-valid --append-eod --workers 1

cat > distill.nml <<EOF2
&run mode = 'distill', steps = 2, seed = 1, out_dir = 'out' /
&teacher card = '$TEACHER.nml', init = '$TEACHER.h5' /
&student card = '$STUDENT.nml', init = '$STUDENT.h5' /
&parallel micro_batch = 1, global_batch = 2 /
&data train = 'kjv', valid = 'kjv-valid', format = 'megatron', seq_len = 256, valid_batches = 2 /
&loss kind = 'fkl', temperature = 1.0, alpha = 0.5 /
&optim lr = 1e-5, min_lr = 1e-6, warmup = 1 /
&precision compute = 'bf16' /
&checkpoint every = 0 /
&log every = 1 /
EOF2

"$KDTRAIN" --dry-run --bytes distill.nml > plan.txt 2>&1 || { cat plan.txt; exit 1; }
cat plan.txt
planned=$(awk '/^  rank/ { on = 1; next } on && $1 == 0 { print $(NF - 1); exit }' plan.txt)
stage "dry-run" "-" "$KDTRAIN" --dry-run --bytes distill.nml
stage "distill 2 steps (bf16)" "$(mib "$planned")" "$KDTRAIN" distill.nml
stage "eval (bf16)" "-" "$KDTRAIN" distill.nml run%mode="'eval'" student%init="'out/final.h5'" run%out_dir="'ev'"
stage "export to-hf" "-" "$KDCONVERT" to-hf out/final.h5 student-hf

cat > generate.py <<'EOF2'
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
ids = tok("In the beginning God created", return_tensors="pt")
out = model.generate(**ids, max_new_tokens=8, do_sample=False)
print("generated:", repr(tok.decode(out[0])))
EOF2
stage "transformers generate" "-" "$PY" generate.py student-hf

echo
echo "realsize $PAIR ($(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores):"
echo "| stage                        |  wall (s) | peak RSS (MiB) | planned (MiB) |"
echo "| ---------------------------- | --------- | -------------- | ------------- |"
cat table.txt
