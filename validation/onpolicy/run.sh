#!/bin/sh
# validation/onpolicy/run.sh: on-policy (lambda = 1) against off-policy (lambda = 0)
# distillation on the quickstart pair, equal training tokens, judged by the reverse KL
# from teacher to student on fresh student samples of held-out prompts (rkl_eval.py).
#
# Needs the quickstart's teacher and distilled student (input/quickstart/run.sh): both
# runs continue that student for STEPS steps from the same start on records of the
# training corpus (32-byte prompt, 96-byte continuation): lambda = 0 trains on the
# corpus' continuations, lambda = 1 on the student's own (the teacher scores them), with
# the same loss (reverse KL), batch, steps and learning rate. Run from the build tree root.
set -eu
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
KDTRAIN=${KDTRAIN:-./src/kdtrain}
STEPS=${STEPS:-150}
N=${N:-256} # held-out prompts of the evaluation
W=${W:-out/onpolicy}
T=out/qs-teacher/final.h5
S0=out/qs-distill/final.h5
for f in "$T" "$S0"; do
  [ -f "$f" ] || { echo "run.sh: $f missing: run input/quickstart/run.sh first" >&2; exit 2; }
done
mkdir -p "$W"
$PY validation/onpolicy/make_data.py input/corpus/kjv-train.txt "$W/train.h5"
$PY validation/onpolicy/make_data.py input/corpus/kjv-valid.txt "$W/prompts.txt" --prompts-only --count "$N"

for lam in 0 1; do
  cat > "$W/lambda$lam.nml" <<NML
&run mode = 'distill', steps = $STEPS, seed = 3, out_dir = '$W/lambda$lam' /
&teacher card = 'qs-teacher', init = '$T' /
&student card = 'qs-student', init = '$S0' /
&parallel micro_batch = 8, global_batch = 16 /
&data train = '$W/train.h5', format = 'h5', seq_len = 128 /
&loss kind = 'rkl', temperature = 1.0, alpha = 1.0, onpolicy = $lam /
&generate max_new_tokens = 96, temperature = 1.0 /
&optim lr = 3e-4, min_lr = 3e-4, warmup = 0, decay = 'constant', weight_decay = 0.0, clip = 1.0 /
&precision compute = 'fp32' /
&log every = 10 /
NML
  start=$(date +%s)
  OMP_WAIT_POLICY=passive $KDTRAIN "$W/lambda$lam.nml" > "$W/lambda$lam.log" 2>&1
  echo "lambda = $lam: $STEPS steps in $(($(date +%s) - start)) s ($W/lambda$lam.log)"
done

echo "reverse KL(student || teacher) on the student's samples of $N held-out prompts:"
for s in "$S0" "$W/lambda0/final.h5" "$W/lambda1/final.h5"; do
  $PY validation/onpolicy/rkl_eval.py --student "$s" --teacher "$T" --prompts "$W/prompts.txt"
done
