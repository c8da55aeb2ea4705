#!/bin/sh
# End-to-end runs of the kdtrain binary on the small test cards: train a teacher,
# distil with every loss kind and precision, evaluate, data-parallel equivalence,
# the metrics file contract, and the divergence exit status.
set -eu
. "${KD_SRCDIR:?}/validation/lib.sh"

cat > base.nml <<EOF2
&run mode = 'train', steps = 6, seed = 3, out_dir = 'teacher' /
&teacher card = 'test-teacher', init = 'teacher/final.h5' /
&student card = 'test-teacher', init = 'random' /
&parallel micro_batch = 2, global_batch = 4 /
&data format = 'bytes', train = '$KD_SRCDIR/input/corpus/kjv-train.txt', valid = '$KD_SRCDIR/input/corpus/kjv-valid.txt',
      seq_len = 32, valid_batches = 4 /
&optim lr = 1e-2, warmup = 2 /
&precision compute = 'fp32' /
EOF2

echo "== train a teacher"
kd 1 > log.txt 2>&1 || { cat log.txt; fail "teacher training"; }
[ -f teacher/final.h5 ] || fail "no teacher/final.h5"
head -1 teacher/metrics.csv | grep -qx 'step,loss,loss_kd,loss_ce,lr,grad_norm,skipped,tokens,tok_per_s,mfu,mem_peak_bytes,val_loss,loss_aux,gen_tok_per_s,gen_len,gen_eos_frac,moe_imbalance,a2a_bytes,moe_gemm_flop_per_s,docs,pack_eff' \
  || fail "metrics header"
[ "$(grep -c '^[1-6],[0-9]' teacher/metrics.csv)" -eq 6 ] || fail "expected 6 step rows"
tail -1 teacher/metrics.csv | grep -q '^6,,,,,,,,,,,[0-9]' || fail "final validation row"
h5dump -A teacher/final.h5 | grep -q kdtrain || fail "final.h5 lacks the format attribute"

echo "== the loss goes down"
kd 1 run%steps=40 run%out_dir="'longer'" optim%lr=3e-3 > log.txt 2>&1 || { cat log.txt; fail "longer run"; }
first=$(awk -F, 'NR == 2 { print $2 }' longer/metrics.csv)
last=$(awk -F, '$1 == 40 && $2 != "" { print $2 }' longer/metrics.csv)
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.5) }' || fail "loss $first -> $last did not fall"

echo "== distil with every kind and precision"
for kind in fkl rkl jsd; do
  for prec in fp32 bf16; do
    kd 1 run%mode=distill student%card=test-student run%out_dir="'d_${kind}_$prec'" \
      loss%kind=$kind loss%alpha=0.5 loss%temperature=2.0 precision%compute=$prec run%steps=3 \
      > log.txt 2>&1 || { cat log.txt; fail "distill $kind $prec"; }
    awk -F, 'NR > 1 && $3 != "" && !($3 + 0 > 0) { exit 1 }' "d_${kind}_$prec/metrics.csv" \
      || fail "loss_kd not positive for $kind $prec"
  done
done

echo "== eval mode"
kd 1 run%mode=eval student%init="'teacher/final.h5'" run%out_dir="'ev'" > log.txt 2>&1 \
  || { cat log.txt; fail "eval"; }
v_eval=$(awk -F, 'NR > 1 && $12 != "" { print $12 }' ev/metrics.csv)
v_train=$(awk -F, 'NR > 1 && $12 != "" { v = $12 } END { print v }' teacher/metrics.csv)
[ "$v_eval" = "$v_train" ] || fail "eval val_loss $v_eval != end-of-training val_loss $v_train"

echo "== data parallel (2 ranks) gives the single-rank losses"
kd 1 run%mode=distill student%card=test-student run%out_dir="'dp1'" run%steps=4 > log.txt 2>&1 \
  || { cat log.txt; fail "dp1"; }
kd 2 run%mode=distill student%card=test-student run%out_dir="'dp2'" run%steps=4 > log.txt 2>&1 \
  || { cat log.txt; fail "dp2"; }
paste -d, dp1/metrics.csv dp2/metrics.csv | awk -F, 'NR > 1 && $2 != "" {
  for (c = 2; c <= 6; c++) { a = $c; b = $(c + NF / 2); d = a - b; if (d < 0) d = -d;
    if (d > 1e-5 * (a < 0 ? -a : a) + 1e-7) { print "step " $1 " column " c ": " a " vs " b; bad = 1 } } }
  END { exit bad }' || fail "dp=2 differs from dp=1"

echo "== divergence: exit status 4"
set +e
kd 1 run%steps=5 optim%lr=1e30 optim%clip=0 precision%max_skipped=0 run%out_dir="'div'" > log.txt 2>&1
st=$?
set -e
[ "$st" -eq 4 ] || { cat log.txt; fail "expected exit 4 on divergence, got $st"; }
grep -q diverged log.txt || fail "no divergence message"
echo "all end-to-end checks passed"
