#!/bin/sh
# Cross-layout resume (doc/checkpoint.md): a checkpoint written under (tp,pp,dp) =
# (2,2,1) resumes under (1,1,4), (1,2,2) and (2,1,2), with ZeRO-1 on and off. The student
# (test-student: 3 layers, uneven over pp = 2; tied embeddings held by the first and the
# last stage; 1 kv head, replicated under tp = 2) is distilled from a briefly trained
# test-teacher. Checks: the next 5 losses match the uninterrupted run within 1e-5
# relative; reloading and re-saving under another layout reproduces /params bit for
# bit; the step-10 checkpoints of the resumed runs agree with the uninterrupted run's
# to float tolerance (different layouts sum in a different order).
set -eu
. "${KD_SRCDIR:?}/validation/lib.sh"
# four ranks share the test machine's cores: one thread each
export OMP_NUM_THREADS=1

cat > base.nml <<EOF2
&run mode = 'distill', steps = 10, seed = 7, out_dir = 'ref' /
&teacher card = 'test-teacher', init = 'teacher/final.h5' /
&student card = 'test-student', init = 'random' /
&parallel micro_batch = 1, global_batch = 4 /
&data format = 'bytes', train = '$KD_SRCDIR/input/corpus/kjv-train.txt', seq_len = 16 /
&optim lr = 1e-2, warmup = 2 /
&precision compute = 'fp32' /
&checkpoint every = 5, keep = 0 /
EOF2

# step,loss,loss_kd,loss_ce,lr,grad_norm of each step >= $2
rows() { awk -F, -v lo="$2" 'NR > 1 && $2 != "" && $1 >= lo { print $1","$2","$3","$4","$5","$6 }' "$1"; }
close_rows() { rows "$1" "$3" > x1; rows "$2" "$3" > x2
  [ "$(wc -l < x1)" -eq "$(wc -l < x2)" ] && [ -s x1 ] || fail "$1 vs $2: different steps"
  paste -d, x1 x2 | awk -F, '{ for (c = 2; c <= 6; c++) { a = $c; b = $(c + 6); d = a - b;
    if (d < 0) d = -d; r = d / (a < 0 ? -a : a); if (r > worst) worst = r
    if (d > 1e-5 * (a < 0 ? -a : a)) { print "step " $1 " column " c ": " a " vs " b; bad = 1 } } }
    END { printf "  losses, lr, grad_norm of steps 6-10: max relative difference %.2e\n", worst; exit bad }' \
    || fail "$1 vs $2 differ beyond 1e-5"; }

# h5diff -d: every dataset of group $3 within $4 absolute; the checksum attributes of
# datasets that differ within the tolerance differ too and do not count
near() { set +e; h5diff -d "$4" "$1" "$2" "$3" "$3" > h5diff.log; st=$?; set -e
  [ $st -le 1 ] && ! grep -q "Not comparable" h5diff.log || { head -20 h5diff.log; return 1; }
  awk '/^dataset:/ { d = 1 } /^attribute:/ { d = 0 } /differences found/ && d { print; bad = 1 }
       END { exit bad }' h5diff.log; }

echo "== teacher: 30 steps of plain training on one rank"
kd 1 run%mode="'train'" student%card="'test-teacher'" run%steps=30 optim%lr=3e-2 \
  run%out_dir="'teacher'" checkpoint%every=0 > teacher.log 2>&1 || { cat teacher.log; fail "teacher"; }

echo "== uninterrupted reference under (tp,pp,dp) = (2,2,1): 10 steps, checkpoints at 5 and 10"
kd 4 parallel%tp=2 parallel%pp=2 > ref.log 2>&1 || { cat ref.log; fail "reference run"; }
c5=ref/checkpoints/step_00000005.h5
c10=ref/checkpoints/step_00000010.h5
[ -f $c5 ] && [ -f $c10 ] || fail "reference checkpoints missing"

for lay in "1 1 4 0" "1 2 2 1" "2 1 2 1"; do
  set -- $lay
  o="l$1$2$3z$4"
  echo "== resume under (tp,pp,dp) = ($1,$2,$3), zero = $4"
  kd 4 parallel%tp=$1 parallel%pp=$2 parallel%zero=$4 run%out_dir="'$o'" \
    checkpoint%resume="'$c5'" > $o.log 2>&1 || { cat $o.log; fail "resume $o"; }
  grep -q "resumed from .*step_00000005.h5 at step 5" $o.log || fail "$o: no resume message"
  close_rows ref/metrics.csv $o/metrics.csv 6
  # re-saved datasets: the same to float tolerance (about 1e-5 of each group's largest value)
  for gd in "/params 1e-5" "/optim/exp_avg 1e-6" "/optim/exp_avg_sq 2e-7"; do
    set -- $gd
    near $c10 $o/checkpoints/step_00000010.h5 $1 $2 || fail "$o: re-saved $1 differs beyond $2"
  done
done

echo "== load under another layout and save at once: /params and /optim bit for bit"
for lay in "1 1 4 1" "2 1 2 0"; do
  set -- $lay
  o="s$1$2$3z$4"
  kd 4 parallel%tp=$1 parallel%pp=$2 parallel%zero=$4 run%out_dir="'$o'" run%steps=5 \
    checkpoint%resume="'$c5'" > $o.log 2>&1 || { cat $o.log; fail "reload $o"; }
  h5diff $c5 $o/final.h5 /params /params > h5diff.log \
    || { head -20 h5diff.log; fail "$o: /params re-saved under ($1,$2,$3) zero=$4 differ"; }
  for g in /params /optim/exp_avg /optim/exp_avg_sq; do
    h5diff $c5 $o/checkpoints/step_00000005.h5 $g $g > h5diff.log \
      || { head -20 h5diff.log; fail "$o: $g re-saved under ($1,$2,$3) zero=$4 differs"; }
  done
done
echo "all cross-layout checkpoint checks passed"
