#!/bin/sh
# Memory techniques (doc/memory.md) through the kdtrain binary, at odd sizes:
# seq_len 37 (MLP tiles of 13, 13, 11 rows), a 3-layer student (recompute_every 1:
# one layer per segment, 2: a short last segment, 5: longer than the stage).
#  - recompute full/selective and offload give bitwise the same losses and gradient
#    norms as recompute 'none' (fp32); the tiled MLP within 1e-6 relative (its
#    GEMMs run on row tiles, so BLAS rounds differently);
#  - each technique lowers the measured activation peak; offload moves bytes to host;
#  - --dry-run predicts the measured peaks (weights .. host) within 10%;
#  - a bf16 distillation holds the teacher in BF16 (about half the bytes), as planned;
#  - the same with tp=2 and with pp=2 on 2 ranks.
set -eu
. "${KD_SRCDIR:?}/validation/lib.sh"

cat > base.nml <<EOF2
&run mode = 'train', steps = 3, seed = 5, out_dir = 'o' /
&teacher card = 'test-teacher', init = 't/final.h5' /
&student card = 'test-student', init = 'random' /
&parallel micro_batch = 2, global_batch = 4 /
&data format = 'bytes', train = '$KD_SRCDIR/input/corpus/kjv-train.txt', seq_len = 37 /
&optim lr = 1e-2, warmup = 1 /
&precision compute = 'fp32' /
EOF2

echo "== a teacher to distil from"
$MPIEXEC -n 1 "$KDTRAIN" base.nml student%card=test-teacher run%out_dir="'t'" run%steps=2 \
  > log.txt 2>&1 || { cat log.txt; fail "teacher"; }

# run NAME NP ARGS...: a run into directory NAME, its log in NAME.log, its
# --dry-run plan in NAME.plan (one rank runs without $MPIEXEC: a singleton is quicker)
run() {
  name=$1 np=$2; shift 2
  [ "$np" -eq 1 ] || export OMP_NUM_THREADS=1 # 2 ranks on 2 cores: no spin-waiting threads
  $MPIEXEC -n "$np" "$KDTRAIN" base.nml run%out_dir="'$name'" "$@" > "$name.log" 2>&1 \
    || { cat "$name.log"; fail "run $name"; }
  if [ "$np" -eq 1 ]; then launch=""; else launch="$MPIEXEC -n $np"; fi
  $launch "$KDTRAIN" --dry-run --bytes base.nml "$@" > "$name.plan" 2>&1 \
    || { cat "$name.plan"; fail "dry run $name"; }
}
# same A B TOL: losses and gradient norms equal (TOL 0: bitwise, else relative)
same() {
  kd_cols "$1" > a.txt
  kd_cols "$2" > b.txt
  [ -s a.txt ] || fail "$1: no step rows"
  paste a.txt b.txt | awk -v tol="$3" -v what="$2 vs $1" '
    function bad(x, y) { d = x - y; if (d < 0) d = -d; m = x < 0 ? -x : x;
                         return tol == 0 ? x != y : d > tol * m }
    { if ($1 != $4 || bad($2, $5) || bad($3, $6)) { print "FAIL: " what ": step " $1 ": loss " $2 " vs " $5 ", grad_norm " $3 " vs " $6; exit 1 } }' \
    || fail "$2 differs from $1"
}
# peak NAME RANK FIELD: measured arena peak (fields 3.. weights grads optim acts loss comm host)
peak() { awk -v r="$2" -v f="$3" '/^memory peaks per rank/ { on = 1; next } on && $1 == r { print $f }' "$1.log"; }
# plan_ok NAME NP: every rank's predictions within 10% of the measured peaks
plan_ok() {
  r=0
  while [ "$r" -lt "$2" ]; do
    for k in 0 1 2 3 4 5 6; do
      m=$(peak "$1" "$r" $((k + 3)))
      p=$(awk -v r="$r" -v f=$((k + 2)) '/^  rank/ { on = 1; next } on && $1 == r { print $f }' "$1.plan")
      [ -n "$m" ] && [ -n "$p" ] || { cat "$1.log" "$1.plan"; fail "$1: no peak/plan for rank $r"; }
      awk -v m="$m" -v p="$p" 'BEGIN { d = m - p; if (d < 0) d = -d; exit !(d <= 0.1 * m) }' \
        || { cat "$1.plan"; fail "$1 rank $r column $k: predicted $p, measured $m"; }
    done
    r=$((r + 1))
  done
}
lower() { # lower A B: B's activation peak below A's (rank 0)
  a=$(peak "$1" 0 6) b=$(peak "$2" 0 6)
  [ "$b" -lt "$a" ] || fail "$2: activation peak $b not below $1's $a"
}

echo "== train, single rank"
m="run%mode=train"
run none 1 $m
run full1 1 $m memory%recompute="'full'"
run full2 1 $m memory%recompute="'full'" memory%recompute_every=2
run full5 1 $m memory%recompute="'full'" memory%recompute_every=5
run sel 1 $m memory%recompute="'selective'"
run off 1 $m memory%offload=.true.
run offfull 1 $m memory%offload=.true. memory%recompute="'full'"
run tiled 1 $m memory%tiled_mlp=.true.
run all 1 $m memory%recompute="'full'" memory%recompute_every=2 memory%offload=.true. \
  memory%tiled_mlp=.true.
for v in full1 full2 full5 sel off offfull; do same none $v 0; done
same none tiled 1e-6
same full2 all 1e-6
for v in full1 full2 sel off tiled; do lower none $v; done
lower full1 offfull
lower full2 all
[ "$(peak full5 0 6)" -le "$(peak none 0 6)" ] || fail "full5: activation peak above none's"
[ "$(peak off 0 9)" -gt 0 ] || fail "offload: no host bytes"
[ "$(peak none 0 9)" -eq 0 ] || fail "no offload: host bytes"
for v in none full1 full2 full5 sel off offfull tiled all; do plan_ok $v 1; done

echo "== distill, single rank"
# the KD term is a small difference of large logits: the tiled MLP's rounding
# differences are compared at the scale of the CE term
m="run%mode=distill"
run dnone 1 $m
run dfull 1 $m memory%recompute="'full'" memory%recompute_every=2 memory%offload=.true.
run dsel 1 $m memory%recompute="'selective'" memory%offload=.true.
run dall 1 $m memory%recompute="'full'" memory%offload=.true. memory%tiled_mlp=.true.
same dnone dfull 0
same dnone dsel 0
same dnone dall 1e-4
for v in dfull dsel dall; do lower dnone $v; done
for v in dnone dfull dsel dall; do plan_ok $v 1; done

echo "== distill in bf16: the teacher held in BF16 (2 bytes per element), as planned"
run dbf16 1 run%mode=distill precision%compute="'bf16'"
run dbf16f 1 run%mode=distill precision%compute="'bf16'" memory%recompute="'full'"
same dbf16 dbf16f 0
plan_ok dbf16 1
plan_ok dbf16f 1
grep -q "teacher held in BF16" dbf16.log || fail "dbf16: no 'teacher held in BF16' line"
grep -q "held in BF16" dbf16.plan || fail "dbf16: --dry-run does not say the teacher is BF16"
# teacher weight bytes: fp32 distill minus fp32 train (student w); bf16 distill minus the
# student's FP32 master and working copy (2x the fp32 train run's): half, plus the FP32
# norms and biases
t32=$(( $(peak dnone 0 3) - $(peak none 0 3) ))
t16=$(( $(peak dbf16 0 3) - 2 * $(peak none 0 3) ))
echo "teacher weights: $t32 bytes in fp32 runs, $t16 bytes in bf16 runs"
[ $((2 * t16)) -ge "$t32" ] && [ $((20 * t16)) -le $((11 * t32)) ] \
  || fail "bf16 distill: teacher weights $t16 bytes, expected about half of $t32"

echo "== eval holds weights only (no gradients, no optimizer state), as planned"
run eval 1 run%mode=eval student%card=test-teacher student%init="'t/final.h5'" \
  data%valid="'$KD_SRCDIR/input/corpus/kjv-valid.txt'"
plan_ok eval 1
[ "$(peak eval 0 4)" -eq 0 ] && [ "$(peak eval 0 5)" -eq 0 ] \
  || fail "eval: gradient/optimizer bytes $(peak eval 0 4)/$(peak eval 0 5), expected 0"
w_eval=$(peak eval 0 3) w_train=$(peak none 0 3)
echo "eval weights peak $w_eval bytes"

echo "== mode 'cache' holds the teacher alone (forward only), as planned"
head -c 8000 "$KD_SRCDIR/input/corpus/kjv-train.txt" > small.txt # a cache covers the whole file
cw="data%train='small.txt'"
run cache 1 run%mode=cache teacher%cache="'c1.h5'" "$cw"
plan_ok cache 1
grep -q "teacher layers 2" cache.plan && grep -q "student layers 0" cache.plan \
  || { cat cache.plan; fail "cache: --dry-run does not plan the teacher's layers"; }
[ "$(peak cache 0 4)" -eq 0 ] && [ "$(peak cache 0 5)" -eq 0 ] \
  || fail "cache: gradient/optimizer bytes, expected none"
run cachebf 1 run%mode=cache teacher%cache="'c2.h5'" precision%compute="'bf16'" \
  memory%tiled_mlp=.true. "$cw"
plan_ok cachebf 1

for par in "parallel%tp=2" "parallel%pp=2"; do
  echo "== 2 ranks, $par"
  n=$(echo "$par" | tr -cd 'tp')
  run ${n}none 2 run%mode=distill $par
  run ${n}full 2 run%mode=distill $par memory%recompute="'full'" memory%offload=.true.
  run ${n}all 2 run%mode=distill $par memory%recompute="'selective'" memory%tiled_mlp=.true.
  run ${n}bf16 2 run%mode=distill $par precision%compute="'bf16'"
  same ${n}none ${n}full 0
  same ${n}none ${n}all 1e-4
  run ${n}cache 2 run%mode=cache teacher%cache="'${n}c.h5'" "$cw" $par
  for v in none full all bf16 cache; do plan_ok ${n}$v 2; done
done
echo "PASS"
