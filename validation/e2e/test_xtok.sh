#!/bin/sh
# Cross-tokenizer distillation (loss%kind = 'uld'; src/loss_uld.c, src/uld.c, src/data_xtok.c):
# a random Qwen3 teacher and a random Llama student written by transformers with two different
# tokenizers trained by `tokenizers` (6,000 and 1,200 tokens, each with its own chat template:
# ref/xtok_ref.py), conversations of many lengths prepared by kdprep --teacher-tokenizer:
#  - the first step's loss_kd and grad_norm equal TRL's GOLD ULDLoss at its defaults (token
#    merge 'observed', extended ULD, skip-eos on both sides, temperatures 1) on the same
#    documents with the models' own logits, each document one sample, within 1e-4; the hybrid
#    (loss%matched_weight 0.7, unmatched_weight 0.3: GOLD's JSD with beta 0.5 on the ids both
#    tokenizers spell alike, ULD on the rest) likewise;
#  - on-policy (loss%onpolicy 1): each continuation decoded by the student's tokenizer and
#    re-encoded by the teacher's inside the run (the C tokenizer) after the teacher's prompt of
#    the document equals GOLD's own path (skip_special_tokens=False decode, its
#    encode_with_byte_offsets and piece_byte_len) on the rows of rollouts.h5, within 1e-4; half
#    on-policy on packed multi-turn data: tp 2, pp 2, dp 2 equal 1 rank;
#  - multi-turn conversations packed several to a window: tp 2, pp 2 and dp 2 equal 1 rank
#    (loss and grad_norm within 1e-5) over 3 steps, plain ULD and the hybrid;
#  - refusals (exit 2, the keys named): a teacher with another tokenizer and loss%kind 'fkl';
#    'uld' with a teacher cache; the hybrid with one weight; the hybrid and on-policy with a
#    student file without /tokenizer; data without the teacher's files.
set -eu
. "${KD_SRCDIR:?}/validation/lib.sh"
kd_python_or_skip torch transformers tokenizers trl megatron.core
export OMP_NUM_THREADS=1 KD_SRCDIR
ref() { "$KD_PYTHON" "$KD_SRCDIR/validation/ref/xtok_ref.py" "$@"; }
prep() { "$KD_PYTHON" "$KD_SRCDIR/src/tools/kdprep.py" --no-progress "$@"; }

ref make "$PWD" || fail "reference models and tokenizers"
kd_convert_roles
for d in chat multi; do
  prep --input "$d.jsonl" --chat --tokenizer hf_student --teacher-tokenizer hf_teacher \
    --output-prefix "$d" > "prep_$d.txt" 2>&1 || { cat "prep_$d.txt"; fail "kdprep $d"; }
done
cat > base.nml <<EOF
&run mode = 'distill', steps = 1, seed = 7, out_dir = 'r1' /
&teacher card = 'teacher.nml', init = 'teacher.h5' /
&student card = 'student.nml', init = 'student.h5' /
&parallel micro_batch = 2, global_batch = 12 /
&data train = 'chat', seq_len = 96, samples = 'documents', pack = .false. /
&loss kind = 'uld' /
&optim lr = 1e-3, warmup = 1 /
&precision compute = 'fp32' /
EOF
kd_log=log.txt
# layouts NAME ROWS OVERRIDES...: 1 rank into l1, then tp 2, pp 2 and dp 2 into l2, each equal
# to it (loss and grad_norm within 1e-5, ROWS steps)
layouts() {
  name=$1 rows=$2
  shift 2
  kd 1 run%out_dir="'l1'" "$@"
  for lay in "parallel%tp=2" "parallel%pp=2" "parallel%dp=2"; do
    kd 2 run%out_dir="'l2'" "$lay" "$@"
    kd_same_metrics l1 l2 "$name$lay" "$rows" || fail "$name$lay differs from 1 rank"
    echo "ok $name$lay equals 1 rank"
  done
}

echo "== the first step against TRL's GOLD ULDLoss"
kd 1
ref check "$PWD" chat r1 || fail "ULD against GOLD"
kd 1 run%out_dir="'r1h'" loss%matched_weight=0.7 loss%unmatched_weight=0.3
ref check "$PWD" chat r1h 0.7 0.3 || fail "the hybrid against GOLD"

echo "== on-policy: the continuations re-encoded by the teacher's tokenizer (C) against GOLD"
kd 1 run%out_dir="'op'" loss%onpolicy=1.0 generate%max_new_tokens=12 generate%save=.true.
ref onpolicy "$PWD" chat op || fail "on-policy ULD against GOLD"
layouts "on-policy " 2 loss%onpolicy=0.5 generate%max_new_tokens=12 run%steps=2 \
  parallel%global_batch=4 parallel%micro_batch=1 data%pack=.true. data%seq_len=64 \
  data%train="'multi'"

echo "== memory: the measured peaks against --dry-run's plan (data%teacher_seq_len fixed)"
kd 1 run%out_dir="'rp'" data%teacher_seq_len=64
awk '/^memory peaks per rank/ { on = 1; next } on && $1 ~ /^[0-9]+$/ { print $3, $4, $5, $6, $7, $8 }' \
  log.txt > measured.txt
"$KDTRAIN" --dry-run --bytes --ranks 1 base.nml data%teacher_seq_len=64 > plan.txt 2>&1 \
  || { cat plan.txt; fail "dry run"; }
grep -q "cross-tokenizer loss (loss%kind 'uld'), rank 0: the teacher's windows of 64 tokens" \
  plan.txt || { cat plan.txt; fail "the dry run has no cross-tokenizer line"; }
awk '/^  rank/ { on = 1; next } on && $1 ~ /^[0-9]+$/ { print $2, $3, $4, $5, $6, $7; exit }' \
  plan.txt > planned.txt
paste -d' ' measured.txt planned.txt | awk '{ for (k = 1; k <= 6; k++) {
    if (k == 5 ? $k > $(k + 6) : $k != $(k + 6)) { print "column " k ": measured " $k ", planned " $(k + 6); bad = 1 } }
    print "ok plan: measured " $1, $2, $3, $4, $5, $6 "; planned " $7, $8, $9, $10, $11, $12 }
    END { exit bad }' \
  || fail "measured peaks against the plan (the loss column at most the plan's bound)"

echo "== layouts: tp 2, pp 2, dp 2 against 1 rank (multi-turn conversations, packed)"
for h in "" "loss%matched_weight=0.7 loss%unmatched_weight=0.3"; do
  # shellcheck disable=SC2086 # $h: zero or two words
  layouts "${h:+hybrid }" 3 data%train="'multi'" data%pack=.true. data%seq_len=128 run%steps=3 \
    parallel%global_batch=4 parallel%micro_batch=1 $h
done

echo "== refusals"
refuse() { # WHAT PATTERN OVERRIDES...: exit 2 and PATTERN in the message
  what=$1 pat=$2
  shift 2
  set +e
  $MPIEXEC -n 1 "$KDTRAIN" base.nml run%out_dir="'rx'" "$@" > refuse.txt 2>&1
  st=$?
  set -e
  [ "$st" -eq 2 ] || { cat refuse.txt; fail "$what: exit $st, expected 2"; }
  grep -q -- "$pat" refuse.txt || { cat refuse.txt; fail "$what: no '$pat' in the message"; }
  echo "ok refused: $what"
}
refuse "another tokenizer with fkl" "loss%kind = 'uld'" loss%kind="'fkl'"
refuse "uld with a teacher cache" "teacher%source" teacher%source="'cache'" teacher%cache="'tc.h5'"
refuse "the hybrid with one weight" "unmatched_weight" loss%matched_weight=0.5
"$KD_PYTHON" -c "import shutil, h5py
shutil.copy('student.h5', 'notok.h5')
with h5py.File('notok.h5', 'a') as f: del f['tokenizer']" || fail "a student file without /tokenizer"
refuse "the hybrid without the student's tokenizer.json" "student's weights file has no tokenizer.json" \
  student%init="'notok.h5'" loss%matched_weight=0.5 loss%unmatched_weight=0.5
refuse "on-policy without the student's tokenizer.json" "re-encodes the student's text" \
  student%init="'notok.h5'" loss%onpolicy=1.0
mkdir -p alone && cp chat.bin chat.idx chat_mask.bin chat_mask.idx alone/
refuse "data without the teacher's files" "_teacher" data%train="'alone/chat'"
echo "all cross-tokenizer checks passed"
