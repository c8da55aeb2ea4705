#!/bin/sh
# On-policy distillation (loss%onpolicy, &generate; src/onpolicy.c, src/rollouts.c) with a
# random Qwen2 teacher and student written by transformers (ref/onpolicy_ref.py), a masked
# token file of two windows (prompts of 5 and 11 tokens) and a global batch of both:
#  - lambda = 1: the step's loss and gradient norm equal TRL's GKDTrainer.generalized_jsd_loss
#    (completion mask) on the sequences kdtrain generated (read back from rollouts.h5), for
#    TRL's beta = 0 (loss%kind 'fkl'), 0.5 ('jsd', beta 0.5) and 1 ('rkl'), within 1e-4; the
#    three runs generated the same rows; each row is prompt + continuation + padding with the
#    mask on the continuation; gen_len and gen_eos_frac agree with the file;
#  - replay: data%format = 'rollouts' on that rollouts.h5 (loss%onpolicy = 0) gives the same
#    loss and gradient norm;
#  - greedy (generate%temperature = 0): the continuations are transformers' generate();
#  - the same rows and losses on tp 2, pp 2 and dp 2 (ZeRO-1 too) as on 1 rank (lambda 1 and 0.5), and after
#    a checkpoint and resume (the resumed run cuts rollouts.h5 after its step and appends);
#  - loss%onpolicy = 0 writes no rollouts.h5 and leaves the gen_* columns empty;
#  - memory: the measured peaks of the lambda = 1 runs on 1 rank, tp 2 and pp 2 equal --dry-run's
#    plan in every column but the activations, which stay within the plan's bound (prompts of
#    seq_len) and equal its terms (KV cache, generation working set) at the data's prompts;
#  - refusals (exit 2, the key named): a teacher cache, parallel%ep > 1, data without a loss mask,
#    mode 'train', a rollouts file read with another seq_len.
set -eu
. "${KD_SRCDIR:?}/validation/lib.sh"
kd_python_or_skip torch transformers safetensors h5py numpy trl
export OMP_NUM_THREADS=1
conv="${KD_BUILDDIR:-$KD_SRCDIR}/src/tools/kdconvert"
ref() { "$KD_PYTHON" "$KD_SRCDIR/validation/ref/onpolicy_ref.py" "$@"; }
T=32

ref make "$PWD" $T || fail "reference models"
kd_convert_roles
cat > base.nml <<EOF
&run mode = 'distill', steps = 1, seed = 7, out_dir = 'r1' /
&teacher card = 'teacher.nml', init = 'teacher.h5' /
&student card = 'student.nml', init = 'student.h5' /
&parallel micro_batch = 1, global_batch = 2 /
&data train = 'tokens.h5', format = 'h5', seq_len = $T /
&loss kind = 'rkl', onpolicy = 1.0 /
&generate max_new_tokens = 24, temperature = 1.0, top_p = 0.95, save = .true.,
          eos = 3, 17, 29, 41, 53, 65, 77, 89 /
&optim lr = 1e-2, warmup = 1 /
&precision compute = 'fp32' /
EOF
kd_log=log.txt

# plan_bound NP NAME OVERRIDES...: the run just made (log.txt) against --dry-run of the same
# input: weights .. communication equal; activations within the plan's bound (prompts of
# seq_len) and equal to the plan's terms at the data's prompts: with micro_batch 1 the peak is
# the 11-token prompt's, a KV cache of 11 + min(32 + 1 - 11, 24) = 33 positions beside the
# prefill of 11 rows. The plan's generation terms are k x positions + w x rows + 8 (k, w from
# the plans of max_new_tokens 24 and 1: 56 and 33 positions, 32 rows), so the peak must be the
# lambda = 0 plan + 33 k + 11 w + 8.
plan_rows() { # FILE OVERRIDES...: --dry-run on $np ranks into FILE, its per-rank rows into FILE.rows
  f=$1; shift
  "$KDTRAIN" --dry-run --bytes --ranks "$np" base.nml "$@" > "$f" 2>&1 || { cat "$f"; fail "$f: dry run"; }
  awk '/^  rank/ { on = 1; next } on && $1 ~ /^[0-9]+$/ { print $1, $2, $3, $4, $5, $6, $7 }' \
    "$f" > "$f.rows"
}
plan_bound() {
  np=$1 name=$2; shift 2
  awk '/^memory peaks per rank/ { on = 1; next } on && $1 ~ /^[0-9]+$/ { print $1, $3, $4, $5, $6, $7, $8 }' \
    log.txt > "$name.measured"
  [ "$(wc -l < "$name.measured")" -eq "$np" ] || { cat log.txt; fail "$name: no per-rank memory table"; }
  plan_rows "$name.plan124" "$@" loss%onpolicy=1 generate%max_new_tokens=24
  plan_rows "$name.plan024" "$@" loss%onpolicy=0 generate%max_new_tokens=24
  plan_rows "$name.plan11" "$@" loss%onpolicy=1 generate%max_new_tokens=1
  grep -q "on-policy generation (loss%onpolicy = 1), rank .*: KV cache" "$name.plan124" \
    || { cat "$name.plan124"; fail "$name: the dry run printed no KV cache line"; }
  paste "$name.measured" "$name.plan124.rows" "$name.plan024.rows" "$name.plan11.rows" | awk -v n="$name" '
    { for (k = 2; k <= 7; k++) if (k != 5 && $k != $(k + 7)) { print n ": rank " $1 " column " k - 1 ": measured " $k ", planned " $(k + 7); bad = 1 }
      kv = ($12 - $26) / 23; w = ($26 - $19 - 33 * kv - 8) / 32; want = $19 + 33 * kv + 11 * w + 8
      if (!($5 <= $12 && $5 == want)) { print n ": rank " $1 " activations " $5 ": planned " want " at the prompts, " $12 " at the bound"; bad = 1 }
      printf "ok plan %s rank %s: activations %s (lambda 0 plan %s; bound %s)\n", n, $1, $5, $19, $12 }
    END { exit bad }' || fail "$name: measured peaks against the plan"
}

echo "== lambda 1: kdtrain's step against TRL's generalized JSD on the generated rows"
for kind in fkl jsd rkl; do
  kd 1 loss%kind="'$kind'" loss%beta=0.5 run%out_dir="'a_$kind'"
done
plan_bound 1 a_rkl loss%kind="'rkl'" loss%beta=0.5
ref check "$PWD" a_fkl 0 a_jsd 0.5 a_rkl 1 || fail "not TRL's loss"
ref same a_fkl a_rkl > /dev/null || fail "the loss kind changed the generated rows"
ref same a_fkl a_jsd > /dev/null || fail "the loss kind changed the generated rows"

echo "== replay: data%format = 'rollouts' gives the on-policy step's loss and gradient norm"
kd 1 data%train="'a_rkl/rollouts.h5'" data%format="'rollouts'" loss%onpolicy=0 run%out_dir="'replay'"
kd_same_metrics a_rkl replay "replay of a_rkl's rows" 1 || fail "replay of rollouts.h5"

echo "== greedy continuations against transformers' generate"
kd 1 generate%temperature=0 run%out_dir="'greedy'"
ref greedy "$PWD" greedy || fail "greedy continuations"

echo "== layouts and resume: the same generated rows and losses"
kd 2 parallel%tp=2 run%out_dir="'tp2'"
plan_bound 2 tp2 parallel%tp=2
ref same a_rkl tp2 || fail "tp 2 generated other rows"
kd_same_metrics a_rkl tp2 "tp 2" 1 || fail "tp 2: other loss or gradient norm"
kd 2 run%out_dir="'dp2'"
ref same a_rkl dp2 || fail "dp 2 generated other rows"
kd_same_metrics a_rkl dp2 "dp 2" 1 || fail "dp 2: other loss or gradient norm"
kd 2 parallel%pp=2 run%out_dir="'pp2'"
plan_bound 2 pp2 parallel%pp=2
ref same a_rkl pp2 || fail "pp 2 generated other rows"
kd_same_metrics a_rkl pp2 "pp 2" 1 || fail "pp 2: other loss or gradient norm"
kd 2 parallel%zero=1 run%out_dir="'z2'"
ref same a_rkl z2 || fail "dp 2 with ZeRO-1 generated other rows"
kd 1 loss%onpolicy=0.5 run%out_dir="'h1'"
kd 2 loss%onpolicy=0.5 run%out_dir="'h2'"
ref same h1 h2 || fail "lambda 0.5: dp 2 generated other rows"
kd_same_metrics h1 h2 "lambda 0.5 dp 2" 1 || fail "lambda 0.5: dp 2 differs"
[ "$("$KD_PYTHON" -c "import h5py; print(h5py.File('h1/rollouts.h5')['step'].shape[0])")" = 1 ] \
  || fail "lambda 0.5 of a batch of 2 did not generate 1 row"
# resume at step 1 with the 2-step run's rollouts.h5: its step-2 rows are dropped, then
# written again by the resumed step 2
kd 1 run%steps=2 checkpoint%every=1 run%out_dir="'full'"
mkdir res && cp full/rollouts.h5 res/
kd 1 run%steps=2 run%out_dir="'res'" checkpoint%resume="'full/checkpoints/step_00000001.h5'"
ref same full res || fail "the resumed run generated other rows"
# col FILE NAME: the column number of NAME in a metrics.csv (columns are appended over time)
col() { head -1 "$1" | tr , '\n' | grep -nx "$2" | cut -d: -f1; }
step2() { awk -F, -v g="$(col "$1/metrics.csv" gen_len)" '$1 == 2 && $2 != "" { print $2, $6, $g }' "$1/metrics.csv"; }
[ -n "$(step2 full)" ] && [ "$(step2 full)" = "$(step2 res)" ] \
  || fail "resumed step 2: $(step2 res), not $(step2 full)"

echo "== loss%onpolicy = 0: no generation"
kd 1 loss%onpolicy=0 run%out_dir="'off'"
[ ! -e off/rollouts.h5 ] || fail "onpolicy 0 wrote rollouts.h5"
g=$(col off/metrics.csv gen_tok_per_s)
awk -F, -v g="$g" 'NR > 1 && $2 != "" && $g $(g + 1) $(g + 2) != "" { exit 1 }' off/metrics.csv || fail "gen_* columns filled"

echo "== generate%eos = -2 (the default): the end ids of the student's generation_config.json"
rm -rf hf_eos && "$conv" to-hf student.h5 hf_eos > conv_eos.txt 2>&1 || { cat conv_eos.txt; fail "to-hf"; }
printf '{"bos_token_id": 1, "eos_token_id": [3, 17, 29, 41, 53, 65, 77, 89]}' > hf_eos/generation_config.json
"$conv" from-hf hf_eos student_eos.h5 student_eos.nml > conv_eos.txt 2>&1 || { cat conv_eos.txt; fail "from-hf"; }
kd 1 loss%kind="'rkl'" loss%beta=0.5 generate%eos=-2 student%init="'student_eos.h5'" \
  run%out_dir="'eos_model'"
grep -q "8 end id(s) (3, 17, 29, 41, 53, 65, 77, 89) from the student's generation_config.json" \
  log.txt || { cat log.txt; fail "the start line does not list the model's end ids"; }
ref same a_rkl eos_model > /dev/null || fail "the model's end ids generated other rows"
kd 1 loss%kind="'rkl'" loss%beta=0.5 generate%eos=-2 run%out_dir="'eos_none'"
grep -q "0 end id(s); generate%eos = -2 (the model's) but the student has no tokenizer files" \
  log.txt || { cat log.txt; fail "no note that the student names no end id"; }

echo "== refusals"
refused() { # WHAT PATTERN OVERRIDES...: exit 2 and PATTERN in the message
  what=$1 pat=$2; shift 2
  rc=0; $MPIEXEC -n 1 "$KDTRAIN" base.nml run%out_dir="'bad'" "$@" > bad.txt 2>&1 || rc=$?
  [ "$rc" -eq 2 ] && grep -q "$pat" bad.txt || { cat bad.txt; fail "$what: exit $rc"; }
  [ ! -e bad ] || fail "$what: out_dir created"
  echo "ok $what: $(grep -m1 "$pat" bad.txt)"
}
refused "teacher cache" "&teacher source: 'cache' with loss%onpolicy" \
  teacher%source="'cache'" teacher%cache="'none.h5'"
refused "unmasked data" "&loss onpolicy: 1 with training data without a loss mask" data%train="'plain.h5'"
refused "mode train" "&loss onpolicy: 1 with mode 'train'" run%mode="'train'"
refused "expert parallelism" "&parallel ep: 2 with loss%onpolicy" parallel%ep=2
refused "rollouts seq_len" "rows of 33 tokens.*expected data%seq_len = 32" \
  data%train="'a_rkl/rollouts.h5'" data%format="'rollouts'" data%seq_len=16
