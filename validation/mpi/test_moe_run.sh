#!/bin/sh
# Mixtures of experts through the kdtrain binary: a Mixtral teacher (mod/test-moe-teacher,
# trained 2 steps from random with its load-balancing loss) distilled into a Qwen3-MoE
# student (mod/test-moe-student: a dense layer between two sparse ones, uneven over pp 2):
#  - the teacher's metrics hold its load-balancing loss (about 2: top-2 under an even
#    router), its console line the experts' load (busiest / mean);
#  - tp 2, pp 2 and tp 2 x pp 2 with ZeRO-1 give the one-rank loss, gradient norm (and
#    loss_aux) within 1e-5 at each of 3 steps;
#  - a checkpoint written at tp 2 x pp 2 resumes on one rank with the same step 3;
#  - --dry-run equals the measured peaks to the byte (the routed activations counted) on
#    1, 2 and 4 ranks, fp32 and bf16 (the teacher held in BF16);
#  - the simulated device gives the CPU's metrics and final weights bit for bit;
#  - what is not computed for an MoE model is refused by key (exit 2).
set -eu
export OMP_NUM_THREADS=1 # tiny models; up to 4 ranks share the cores
. "${KD_SRCDIR:?}/validation/lib.sh"

kd_family_nml test-moe-teacher test-moe-student

echo "== a Mixtral teacher (2 steps)"
kd 1 run%mode=train student%card=test-moe-teacher run%steps=2 run%out_dir="'teacher'"
awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "loss_aux") c = i; next }
  $2 != "" { n++; if (!c || !($c > 1.5 && $c < 4)) bad = 1 } END { exit bad || n != 2 }' \
  teacher/metrics.csv || { cat teacher/metrics.csv; fail "teacher: no loss_aux near 2 (top-2 under an even router)"; }
grep -q "experts load [0-9.]*" log.txt || { cat log.txt; fail "no load imbalance"; }
echo "ok the teacher logs its load-balancing loss and its experts' load"

echo "== layouts: the one-rank losses, gradient norms and load-balancing losses"
kd 1
for layout in "2 1 0" "1 2 0" "2 2 1"; do
  set -- $layout
  out="l_$1$2_z$3"
  kd $(($1 * $2)) parallel%tp=$1 parallel%pp=$2 parallel%zero=$3 run%out_dir="'$out'"
  kd_same_metrics ref "$out" "tp=$1 pp=$2 zero=$3" 3 || fail "layout tp=$1 pp=$2 zero=$3"
  paste -d, ref/metrics.csv "$out/metrics.csv" | awk -F, 'NR > 1 && $2 != "" {
    a = $13; b = $(13 + NF / 2); d = a - b; if (d < 0) d = -d
    if (a == "" || d > 1e-5 * a) { print "loss_aux " a " vs " b; bad = 1 } } END { exit bad }' \
    || fail "loss_aux of tp=$1 pp=$2"
  echo "ok tp=$1 pp=$2 zero=$3"
done

echo "== a checkpoint of tp 2 x pp 2 resumes on one rank: the same step 3"
kd 4 parallel%tp=2 parallel%pp=2 checkpoint%every=2 run%out_dir="'ck'"
kd 1 checkpoint%resume="'ck/checkpoints/step_00000002.h5'" run%out_dir="'rs'"
grep -q "resumed from .*step_00000002.h5 at step 2" log.txt || { cat log.txt; fail "no resume"; }
awk -F, 'FNR == 1 || $2 == "" { next } NR == FNR { for (c = 2; c <= 13; c++) v[$1, c] = $c; next }
  $1 == 3 { n++; for (c = 2; c <= 13; c += (c == 2 ? 4 : 7)) { a = v[3, c]; b = $c; d = a - b
      if (d < 0) d = -d; if (a == "" || d > 1e-5 * (a < 0 ? -a : a)) { print c ": " a " vs " b; bad = 1 } } }
  END { exit bad || n != 1 }' ck/metrics.csv rs/metrics.csv || { cat ck/metrics.csv rs/metrics.csv; fail "the resumed step 3 differs"; }
echo "ok resumed on one rank: step 3's loss, gradient norm and loss_aux"

echo "== the plan to the byte"
kd_plan_exact 1 none
kd_plan_exact 1 bnone precision%compute="'bf16'"
kd_plan_exact 2 tpbf16 parallel%tp=2 precision%compute="'bf16'"
kd_plan_exact 2 pp parallel%pp=2
kd_plan_exact 4 tpppzero parallel%tp=2 parallel%pp=2 parallel%zero=1 precision%compute="'bf16'"

echo "== the simulated device, bit for bit"
kd_family_devsim

echo "== refused for a mixture of experts"
for o in "memory%recompute='full'" "memory%offload=.true." "memory%tiled_mlp=.true."; do
  rc=0
  $MPIEXEC -n 1 "$KDTRAIN" base.nml "$o" run%out_dir="'refused'" > err.txt 2>&1 || rc=$?
  key=${o%%=*}
  [ "$rc" -eq 2 ] && grep -q "&memory ${key#memory%}.*mixture-of-experts" err.txt \
    || { cat err.txt; fail "$o: exit $rc"; }
  echo "ok refused: $o"
done
echo "all moe checks passed"
