#!/bin/sh
# Checkpoints end to end (doc/checkpoint.md): bitwise-identical same-layout resume and
# identical re-saved datasets, resume on a different data-parallel size, keep pruning,
# SIGKILL during a save, SIGTERM -> checkpoint + exit 5 -> resume, refused files.
# Signal tests start kdtrain as an MPI singleton so that the signal reaches it directly.
set -eu
. "${KD_SRCDIR:?}/validation/lib.sh"

cat > base.nml <<EOF2
&run mode = 'train', steps = 10, seed = 5, out_dir = 'ref' /
&student card = 'test-student', init = 'random' /
&parallel micro_batch = 2, global_batch = 4 /
&data format = 'bytes', train = '$KD_SRCDIR/input/corpus/kjv-train.txt', seq_len = 32 /
&optim lr = 1e-2, warmup = 2 /
&precision compute = 'fp32', loss_scale = 0 /
&checkpoint every = 5, keep = 2 /
EOF2

# step,loss,loss_kd,loss_ce,lr,grad_norm,skipped,tokens of the last row of each step
rows() { awk -F, -v lo="$2" 'NR > 1 && $2 != "" && $1 >= lo { r[$1] = $1","$2","$3","$4","$5","$6","$7","$8 }
  END { for (s in r) print r[s] }' "$1" | sort -n; }
# fail unless two metrics files agree on steps >= $3 within 1e-5 relative
close_rows() { rows "$1" "$3" > x1; rows "$2" "$3" > x2
  [ "$(wc -l < x1)" -eq "$(wc -l < x2)" ] && [ -s x1 ] || fail "$1 vs $2: different steps"
  paste -d, x1 x2 | awk -F, '{ for (c = 2; c <= 6; c++) { a = $c; b = $(c + 8); d = a - b;
    if (d < 0) d = -d; if (d > 1e-5 * (a < 0 ? -a : a) + 1e-7) { print "step " $1 " column " c ": " a " vs " b; bad = 1 } } }
    END { exit bad }' || fail "$1 vs $2 differ beyond 1e-5"; }
state_same() { for ds in step consumed updates loss_scale good_steps skipped seed; do
    h5diff "$1" "$2" /state/$ds /state/$ds > /dev/null || fail "/state/$ds differs: $1 $2"; done; }

echo "== uninterrupted reference: 10 steps, checkpoints at 5 and 10"
kd 1 > ref.log 2>&1 || { cat ref.log; fail "reference run"; }
[ "$(cat ref/checkpoints/latest)" = step_00000010.h5 ] || fail "latest does not name step 10"
ls ref/checkpoints/step_00000005.h5 > /dev/null || fail "no step 5 checkpoint"
h5dump -d /state/step ref/checkpoints/step_00000005.h5 | grep -q '(0): 5$' || fail "/state/step is not 5"
h5dump -d /state/consumed ref/checkpoints/step_00000005.h5 | grep -q '(0): 20$' || fail "/state/consumed is not 20"

echo "== same-layout resume from step 5: rows 6-10 bitwise identical, re-saved datasets identical"
kd 1 run%out_dir="'same'" checkpoint%resume="'ref/checkpoints/step_00000005.h5'" > same.log 2>&1 \
  || { cat same.log; fail "resume"; }
grep -q "resumed from .*step_00000005.h5 at step 5" same.log || fail "no resume message"
rows ref/metrics.csv 6 > r1; rows same/metrics.csv 1 > r2
[ "$(wc -l < r2)" -eq 5 ] || fail "resumed run should log steps 6-10 only"
cmp -s r1 r2 || { diff r1 r2; fail "resumed losses are not bitwise identical"; }
for g in /params /optim; do
  h5diff ref/checkpoints/step_00000010.h5 same/checkpoints/step_00000010.h5 $g $g \
    || fail "re-saved $g differs from the uninterrupted run's"
done
state_same ref/checkpoints/step_00000010.h5 same/checkpoints/step_00000010.h5

echo "== resume on 2 data-parallel ranks: same batches, losses within 1e-5"
kd 2 run%out_dir="'dp2'" checkpoint%resume="'ref/checkpoints'" checkpoint%every=0 \
  > dp2.log 2>&1 || { cat dp2.log; fail "dp=2 resume"; }
grep -q "resumed from .*step_00000010.h5" dp2.log || fail "directory resume did not take latest"
kd 2 run%out_dir="'dp2b'" checkpoint%resume="'ref/checkpoints/step_00000005.h5'" \
  checkpoint%every=0 > dp2.log 2>&1 || { cat dp2.log; fail "dp=2 resume"; }
close_rows ref/metrics.csv dp2b/metrics.csv 6

echo "== keep: only the newest checkpoint%keep survive"
kd 1 run%out_dir="'keep'" run%steps=4 checkpoint%every=1 checkpoint%keep=2 > keep.log 2>&1 \
  || { cat keep.log; fail "keep run"; }
[ "$(cd keep/checkpoints && echo step_*)" = "step_00000003.h5 step_00000004.h5" ] \
  || fail "keep=2 left: $(ls keep/checkpoints)"

echo "== SIGKILL while writing a checkpoint: the previous one stays latest and resumes"
KDTRAIN_TEST_SAVE_DELAY_MS=800 "$KDTRAIN" base.nml run%out_dir="'crash'" checkpoint%every=2 \
  > crash.log 2>&1 &
kd_bg=$!
i=0
until [ -f crash/checkpoints/step_00000004.h5.tmp ]; do
  i=$((i + 1)); [ $i -lt 600 ] || fail "no step 4 .tmp appeared"; sleep 0.05
done
kill -9 $kd_bg; wait $kd_bg 2>/dev/null || true; kd_bg=""
[ "$(cat crash/checkpoints/latest)" = step_00000002.h5 ] || fail "latest changed by a killed save"
[ ! -f crash/checkpoints/step_00000004.h5 ] || fail "an unfinished checkpoint was published"
set +e
kd 1 run%out_dir="'crash'" checkpoint%resume="'crash/checkpoints/step_00000004.h5.tmp'" \
  > tmpload.log 2>&1; st=$?
set -e
[ $st -eq 2 ] && grep -q "unfinished checkpoint (.tmp" tmpload.log || { cat tmpload.log; fail ".tmp loaded ($st)"; }
kd 1 run%out_dir="'crash'" checkpoint%every=2 > crash2.log 2>&1 || { cat crash2.log; fail "resume after kill"; }
grep -q "resumed from .*step_00000002.h5 at step 2" crash2.log || fail "did not resume from step 2"
[ ! -f crash/checkpoints/step_00000004.h5.tmp ] || fail "the stale .tmp was not removed"
rows ref/metrics.csv 3 > r1; rows crash/metrics.csv 3 > r2
cmp -s r1 r2 || { diff r1 r2; fail "run resumed after SIGKILL does not continue the curve"; }

echo "== SIGTERM mid-run: checkpoint, exit 5, the resumed run continues the curve"
KDTRAIN_TEST_STEP_DELAY_MS=250 "$KDTRAIN" base.nml run%out_dir="'term'" checkpoint%every=0 \
  > term.log 2>&1 &
kd_bg=$!
i=0
until grep -q '^3,' term/metrics.csv 2>/dev/null; do
  i=$((i + 1)); [ $i -lt 600 ] || fail "run did not reach step 3"; sleep 0.05
done
kill -TERM $kd_bg
set +e
wait $kd_bg; st=$?
set -e
kd_bg=""
[ $st -eq 5 ] || { cat term.log; fail "SIGTERM: exit status $st, expected 5"; }
grep -q "stopped by signal 15" term.log || fail "no signal message"
k=$(sed -n 's/^step_0*\([0-9]*\)\.h5$/\1/p' term/checkpoints/latest)
[ -n "$k" ] && [ "$k" -ge 3 ] && [ "$k" -lt 10 ] || fail "signal checkpoint at step '$k'"
[ ! -f term/final.h5 ] || fail "a stopped run wrote final.h5"
kd 1 run%out_dir="'term'" checkpoint%every=5 > term2.log 2>&1 || { cat term2.log; fail "resume after SIGTERM"; }
rows ref/metrics.csv 1 > r1; rows term/metrics.csv 1 > r2
cmp -s r1 r2 || { diff r1 r2; fail "the resumed run does not continue the loss curve"; }
for g in /params /optim; do
  h5diff ref/checkpoints/step_00000010.h5 term/checkpoints/step_00000010.h5 $g $g \
    || fail "re-saved $g differs after a SIGTERM stop"
done

echo "== a rerun in the same out_dir: another run's checkpoint refused, a longer run resumes, a complete run writes nothing"
snap() { (cd "$1" && find . -type f -exec cksum {} + | sort -k3); }
snap ref > before
kd 1 > again.log 2>&1 || { cat again.log; fail "rerun of a complete run"; }
grep -q "step_00000010.h5 is at step 10 and run%steps = 10: the run is complete" again.log \
  || { cat again.log; fail "a complete run does not say so"; }
snap ref > after
cmp -s before after || { diff before after; fail "rerunning a complete run changed its files"; }
set +e
kd 1 loss%kind="'rkl'" data%train="'$KD_SRCDIR/input/corpus/kjv-valid.txt'" > other.log 2>&1; st=$?
set -e
[ $st -eq 2 ] || { cat other.log; fail "resume of another run's checkpoint: exit $st, expected 2"; }
for needle in "loss%kind 'fkl' -> 'rkl'" "data%train '.*kjv-train.txt' -> '.*kjv-valid.txt'" \
  "checkpoint%resume = 'none'" "checkpoint%resume = '.*step_00000010.h5'"; do
  grep -q "$needle" other.log || { cat other.log; fail "refused resume: message lacks '$needle'"; }
done
snap ref > after
cmp -s before after || { diff before after; fail "a refused resume changed the run's files"; }
cp -r ref ext
kd 1 run%out_dir="'ext'" run%steps=12 > ext.log 2>&1 || { cat ext.log; fail "extending run%steps"; }
grep -q "with changes that extend the run: run%steps 10 -> 12" ext.log || { cat ext.log; fail "no extension line"; }
grep -q "resumed from .*step_00000010.h5 at step 10" ext.log || fail "the extended run did not resume"
[ "$(rows ext/metrics.csv 11 | wc -l)" -eq 2 ] || fail "the extended run did not log steps 11-12"
[ "$(cat ext/checkpoints/latest)" = step_00000012.h5 ] || fail "the extended run ends on no step 12 checkpoint"

echo "== refused checkpoints: exit 2, one message each"
refuse() { what=$1; file=$2; needle=$3; shift 3
  set +e; kd 1 run%out_dir="'bad'" checkpoint%resume="'$file'" "$@" > bad.log 2>&1; st=$?; set -e
  [ $st -eq 2 ] || { cat bad.log; fail "$what: exit $st, expected 2"; }
  grep -q "$needle" bad.log || { cat bad.log; fail "$what: message lacks '$needle'"; }; }
c5=ref/checkpoints/step_00000005.h5
head -c $(($(wc -c < $c5) / 2)) $c5 > trunc.h5
refuse truncated trunc.h5 "damaged or truncated"
cp $c5 flip.h5
off=$(h5dump -p -H -d /optim/exp_avg_sq/model.norm.weight flip.h5 | awk '/OFFSET/ { print $2 }')
[ -n "$off" ] || fail "no dataset offset from h5dump"
printf '\377' | dd of=flip.h5 bs=1 seek=$((off + 9)) conv=notrunc 2>/dev/null
refuse bit-flip flip.h5 "/optim/exp_avg_sq/model.norm.weight fails its checksum"
refuse "wrong model" $c5 "written for a different model" student%card=test-teacher
refuse "weights file" ref/final.h5 "it is a weights file, not a checkpoint"
mkdir empty
refuse "directory without latest" empty "holds no 'latest' file"
echo "== kdconvert: weights file -> Hugging Face directory -> weights file, bit for bit"
conv="${KD_BUILDDIR:-$KD_SRCDIR}/src/tools/kdconvert"
$MPIEXEC -n 1 "$conv" to-hf ref/checkpoints/step_00000010.h5 hf > conv.log 2>&1 || { cat conv.log; fail "to-hf"; }
grep -Eq '"model_type":[[:space:]]*"qwen2"' hf/config.json || fail "config.json lacks model_type"
$MPIEXEC -n 1 "$conv" from-hf hf back.h5 > conv.log 2>&1 || { cat conv.log; fail "from-hf"; }
h5diff ref/checkpoints/step_00000010.h5 back.h5 /params /params || fail "round trip changed /params"
grep -q "num_hidden_layers = 3" back.nml || fail "the converted card lacks num_hidden_layers"
echo "all checkpoint checks passed"
