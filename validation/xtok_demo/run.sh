#!/bin/sh
# validation/xtok_demo/run.sh: distillation between a teacher and a student with different
# tokenizers, end to end, with its numbers (doc/user-guide.md, "Teacher and student with
# different tokenizers").
#
#  1. Two byte-level BPE tokenizers trained by Hugging Face `tokenizers` on the training
#     corpus: Qwen2/Qwen3-style (TEACHER_TOKENS) for the teacher, Llama-3-style
#     (STUDENT_TOKENS) for the student; a random Qwen3 teacher (4 layers, hidden 256) and a
#     random Llama student (2 layers, hidden 128) written by transformers; both through
#     kdconvert from-hf (weights file with /tokenizer, card). (xtok_demo.py prepare)
#  2. The teacher trained by kdtrain (mode 'train') on input/corpus/kjv-train.txt in its own
#     tokens (kdprep), TEACHER_STEPS steps.
#  3. The student, from the same random start, seed, data and steps (STEPS), three ways:
#     (a) without the teacher (mode 'train'), (b) distilled with loss%kind = 'uld',
#     (c) with the hybrid (loss%matched_weight, loss%unmatched_weight), (b) and (c) mixed
#     with the hard-label CE by loss%alpha = ALPHA; data by kdprep --tokenizer (student)
#     --teacher-tokenizer (teacher). STUDENT_SHARE < 1 gives the students only the first
#     part of the training paragraphs (the teacher keeps them all): a teacher that has seen
#     more text than the distillation set, the usual case.
#  4. Held out: every run's final validation on input/corpus/kjv-valid.txt (the Gospel of
#     John, which training never sees), the cross entropy per token and per byte.
#
# Run from the top of the (built) source tree: sh validation/xtok_demo/run.sh. 11 to 15
# minutes on 2 shared cores. Needs the Python of `make check` (.venv: torch, transformers,
# tokenizers, h5py) and a kdprep with --teacher-tokenizer. Environment: PY, KDTRAIN,
# KDCONVERT, KDPREP (kdprep.py), MPIEXEC, NP (ranks, default 2), W (work directory, default
# out/xtok_demo), TEACHER_STEPS, STEPS, ALPHA, MATCHED, UNMATCHED (the hybrid's weights),
# TEACHER_TOKENS, STUDENT_TOKENS, STUDENT_SHARE (default 1). Exit 0 with the table, whichever
# student is ahead; 1 when a step fails (its log named and its end printed).
set -eu
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
KDTRAIN=${KDTRAIN:-./src/kdtrain}
KDCONVERT=${KDCONVERT:-./src/tools/kdconvert}
KDPREP=${KDPREP:-src/tools/kdprep.py}
MPIEXEC=${MPIEXEC:-mpiexec}
NP=${NP:-2}
W=${W:-out/xtok_demo}
TEACHER_STEPS=${TEACHER_STEPS:-250}
STEPS=${STEPS:-200}
ALPHA=${ALPHA:-0.5}
MATCHED=${MATCHED:-1.0}
UNMATCHED=${UNMATCHED:-1.0}
TEACHER_TOKENS=${TEACHER_TOKENS:-4096}
STUDENT_TOKENS=${STUDENT_TOKENS:-2048}
STUDENT_SHARE=${STUDENT_SHARE:-1}
SEQ=256
OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export OMP_NUM_THREADS

die() {
  echo "run.sh: $*" >&2
  exit 1
}
helper() { "$PY" validation/xtok_demo/xtok_demo.py "$@"; }
# step NAME COMMAND...: the command's output to $W/NAME.log; its end printed if it fails
step() {
  name=$1
  shift
  echo "== $name: $*"
  if ! "$@" > "$W/$name.log" 2>&1; then
    tail -n 25 "$W/$name.log" >&2
    die "$name failed: see $W/$name.log"
  fi
}
# train NAME NAMELIST [WORDS...]: kdtrain on NP ranks; its wall time (s) into $W/NAME.secs
train() {
  name=$1
  shift
  t0=$(date +%s)
  step "$name" "$MPIEXEC" -n "$NP" "$KDTRAIN" "$@"
  echo $(($(date +%s) - t0)) > "$W/$name.secs"
  [ -f "$W/$name/final.h5" ] || die "$name: no $W/$name/final.h5 (see $W/$name.log)"
}
# the last validation cross entropy and the tokens of a run's metrics.csv
val() { awk -F, 'NR > 1 && $12 != "" { v = $12 } END { print v }' "$W/$1/metrics.csv"; }
tokens() { awk -F, 'NR > 1 && $8 != "" { v = $8 } END { print v }' "$W/$1/metrics.csv"; }

for f in "$KDTRAIN" "$KDCONVERT"; do
  [ -x "$f" ] || die "no $f: build first (./configure && make), or set KDTRAIN / KDCONVERT"
done
[ -x "$PY" ] \
  || die "no Python at $PY: make check creates .venv (validation/python-env.sh), or set PY"
"$PY" -c 'import torch, transformers, tokenizers, h5py' 2> /dev/null \
  || die "$PY lacks torch, transformers, tokenizers or h5py (validation/requirements.txt)"
[ -f "$KDPREP" ] || die "no kdprep at $KDPREP: set KDPREP=/path/to/kdprep.py"
"$PY" "$KDPREP" --help 2> /dev/null | grep -q -- --teacher-tokenizer \
  || die "$KDPREP has no --teacher-tokenizer: set KDPREP to a kdprep.py that has it"
mkdir -p "$W"
start=$(date +%s)

echo "== tokenizers and random models (xtok_demo.py prepare $W)"
helper prepare "$W" "$TEACHER_TOKENS" "$STUDENT_TOKENS" > "$W/prepare.log" 2>&1 \
  || { tail -n 25 "$W/prepare.log" >&2; die "prepare failed: see $W/prepare.log"; }
cat "$W/prepare.log"
for role in teacher student; do
  step "convert_$role" "$KDCONVERT" from-hf "$W/hf_$role" "$W/$role.h5" "$W/$role.nml"
done
prep() { # NAME KDPREP_ARGS...
  name=$1
  shift
  step "$name" "$PY" "$KDPREP" --no-progress "$@"
}
prep kdprep_teacher --input "$W/train.txt" --output-prefix "$W/teacher_train" \
  --tokenizer "$W/hf_teacher"
prep kdprep_teacher_valid --input "$W/valid.txt" --output-prefix "$W/teacher_valid" \
  --tokenizer "$W/hf_teacher"
ndocs=$(helper head "$W/train.txt" "$STUDENT_SHARE" "$W/student_train.txt")
echo "   the students' data: $ndocs paragraphs of train.txt (STUDENT_SHARE $STUDENT_SHARE)"
prep kdprep_pair --input "$W/student_train.txt" --output-prefix "$W/train" \
  --tokenizer "$W/hf_student" --teacher-tokenizer "$W/hf_teacher"
prep kdprep_valid --input "$W/valid.txt" --output-prefix "$W/valid" --tokenizer "$W/hf_student"
tail -n 1 "$W/kdprep_pair.log"

# the keys every run shares (the student's: same seed, batch, schedule, validation)
common() {
  cat << EOF
&parallel micro_batch = 8, global_batch = 16 /
&data train = '$W/$1', valid = '$W/$2', samples = 'documents', seq_len = $SEQ,
      valid_every = 0, valid_batches = 0 /
&precision compute = 'fp32' /
&log every = 25 /
EOF
}
{
  echo "&run mode = 'train', steps = $TEACHER_STEPS, seed = 1, out_dir = '$W/teacher' /"
  echo "&student card = '$W/teacher.nml', init = '$W/teacher.h5' /"
  common teacher_train teacher_valid
  echo "&optim lr = 2e-3, min_lr = 2e-4, warmup = 20, decay = 'cosine', weight_decay = 0.1 /"
} > "$W/teacher_run.nml"
student() { # MODE OUT_DIR
  echo "&run mode = '$1', steps = $STEPS, seed = 2, out_dir = '$W/$2' /"
  echo "&student card = '$W/student.nml', init = '$W/student.h5' /"
  common train valid
  echo "&optim lr = 3e-3, min_lr = 3e-4, warmup = 20, decay = 'cosine', weight_decay = 0.1 /"
  if [ "$1" = distill ]; then
    echo "&teacher card = '$W/teacher.nml', init = '$W/teacher/final.h5' /"
  fi
}
student train baseline > "$W/baseline.nml"
{
  student distill uld
  echo "&loss kind = 'uld', alpha = $ALPHA /"
} > "$W/uld.nml"
{
  student distill hybrid
  echo "&loss kind = 'uld', alpha = $ALPHA, matched_weight = $MATCHED,"
  echo "      unmatched_weight = $UNMATCHED /"
} > "$W/hybrid.nml"

train teacher "$W/teacher_run.nml"
"$PY" -c 'import h5py, sys
with h5py.File(sys.argv[1], "r") as f:
    sys.exit(0 if "tokenizer" in f and "tokenizer.json" in f["tokenizer"] else 1)' \
  "$W/teacher/final.h5" || die "$W/teacher/final.h5 carries no /tokenizer/tokenizer.json"
echo "   $W/teacher/final.h5 carries the teacher's tokenizer (/tokenizer)"
train baseline "$W/baseline.nml"
train uld "$W/uld.nml"
train hybrid "$W/hybrid.nml"
grep "spelt alike" "$W/hybrid.log" || true
end=$(date +%s)

# per byte: nats per token x the labels the validation counts / the bytes of its documents
bytes=$(helper bytes "$W/valid.txt")
labels=$(helper labels "$W/valid" "$SEQ")         # LABELS DOCUMENTS CUT
tlabels=$(helper labels "$W/teacher_valid" "$SEQ")
if [ "${labels##* }" != 0 ] || [ "${tlabels##* }" != 0 ]; then
  die "validation documents longer than seq_len $SEQ were cut: not comparable per byte"
fi
labels=${labels%% *}
tlabels=${tlabels%% *}
row() { # NAME RUN LABELS
  ce=$(val "$2")
  [ -n "$ce" ] || die "$2: no validation loss in $W/$2/metrics.csv"
  awk -v n="$1" -v ce="$ce" -v l="$3" -v b="$bytes" -v t="$(tokens "$2")" \
    -v s="$(cat "$W/$2.secs")" \
    'BEGIN { printf "  %-34s %8.4f %9.4f %10d %6d s\n", n, ce, ce * l / b, t, s }'
}
echo
echo "held-out cross entropy (kjv-valid, the Gospel of John: $bytes bytes, $labels student"
echo "labels, $tlabels teacher labels); the students: $STEPS steps of 16 windows of $((SEQ + 1))"
echo "tokens on $ndocs paragraphs (STUDENT_SHARE $STUDENT_SHARE), alpha $ALPHA:"
echo "  run                                nats/tok  nats/byte     tokens   wall"
row "teacher (Qwen3, $TEACHER_STEPS steps)" teacher "$tlabels"
row "(a) student, no teacher" baseline "$labels"
row "(b) student, ULD" uld "$labels"
row "(c) student, hybrid $MATCHED/$UNMATCHED" hybrid "$labels"
a=$(val baseline)
for r in uld hybrid; do
  awk -v r="$r" -v a="$a" -v x="$(val "$r")" -v l="$labels" -v b="$bytes" 'BEGIN {
    printf "  => %s: %s the student without the teacher by %.4f nats/token (%.4f nats/byte)\n",
      r, x < a ? "ahead of" : "behind", (x < a ? a - x : x - a), (x < a ? a - x : x - a) * l / b }'
done
echo "  wall time $((end - start)) s, $NP ranks x $OMP_NUM_THREADS thread(s), CPU:" \
  "$(lscpu | sed -n 's/^Model name: *//p')"
