#!/bin/sh
# Teacher and student with different padded vocabularies (as Qwen2.5-7B's 152064 and
# 0.5B's 151936 ids over one tokenizer): the loss runs over the common ids, whatever
# the layout. A teacher padded larger (test-teacher-pad, 320 ids) distils into the
# byte student (256): the start line says so, and tp=2 x pp=2 (the common ids split
# 128 + 128, the teacher's 64 padding rows on the last TP rank) and tp=2 x dp=2 with
# ZeRO-1 give the one-rank losses and gradient norms within 1e-5 at every step. The
# same for a student padded larger (test-student-pad, 320) than its teacher (256).
# A token id at or above the smaller vocabulary is exit 2 naming the file and the
# token position, even when the larger model has that id. --dry-run predicts the
# per-rank memory of the uneven cut exactly.
set -eu
export OMP_NUM_THREADS=1 # tiny models; up to 4 ranks share the cores
. "${KD_SRCDIR:?}/validation/lib.sh"

cat > base.nml <<EOF2
&run mode = 'distill', steps = 4, seed = 5, out_dir = 'ref' /
&teacher card = 'test-teacher-pad', init = 'tpad/final.h5' /
&student card = 'test-student', init = 'random' /
&parallel micro_batch = 1, global_batch = 4 /
&data format = 'bytes', train = '$KD_SRCDIR/input/corpus/kjv-train.txt', seq_len = 16 /
&loss kind = 'jsd', alpha = 0.7, temperature = 2.0 /
&optim lr = 1e-2, warmup = 1 /
&precision compute = 'fp32' /
EOF2
kd_log=log.txt # kd NP WORD... (validation/lib.sh): its console in log.txt

# loss (column 2) and grad_norm (column 6) of every step row agree within 1e-5 relative
same() { kd_same_metrics "$1" "$2" "$3" 4; }
# plan_exact [overrides]: after a tp=2 pp=2 run (log.txt), --dry-run predicts every
# rank's measured weights .. comm peaks exactly (the uneven vocabulary cut included)
plan_exact() {
  awk '/^memory peaks per rank/ { on = 1; next } on && $1 ~ /^[0-9]+$/ { print $1, $3, $4, $5, $6, $7, $8 }' \
    log.txt > measured.txt
  $MPIEXEC -n 4 "$KDTRAIN" --dry-run --bytes base.nml parallel%tp=2 parallel%pp=2 "$@" > plan.txt 2>&1 ||
    { cat plan.txt; fail "dry run $*"; }
  awk '/^  rank/ { on = 1; next } on && $1 ~ /^[0-9]+$/ { print $1, $2, $3, $4, $5, $6, $7 }' \
    plan.txt > predicted.txt
  [ "$(wc -l < measured.txt)" -eq 4 ] || fail "no per-rank memory table"
  cmp -s measured.txt predicted.txt || { paste measured.txt predicted.txt; fail "plan != peaks: $*"; }
}
# layouts OUT_PREFIX [overrides]: one rank, then tp=2 pp=2 and tp=2 dp=2 zero=1 on 4 ranks
layouts() {
  p=$1; shift
  kd 1 run%out_dir="'${p}1'" "$@"
  cp log.txt "${p}1.log"
  kd 4 parallel%tp=2 parallel%pp=2 run%out_dir="'${p}tp2pp2'" "$@"
  same "${p}1" "${p}tp2pp2" "$p tp=2 pp=2" || fail "$p: tp=2 pp=2 differs from one rank"
  plan_exact "$@"
  kd 4 parallel%tp=2 parallel%dp=2 parallel%zero=1 run%out_dir="'${p}tp2dp2'" "$@"
  same "${p}1" "${p}tp2dp2" "$p tp=2 dp=2" || fail "$p: tp=2 dp=2 zero=1 differs from one rank"
}

echo "== teachers: test-teacher-pad (320 ids) and test-teacher (256), two steps each"
kd 1 run%mode=train student%card=test-teacher-pad run%steps=2 run%out_dir="'tpad'"
kd 1 run%mode=train student%card=test-teacher run%steps=2 run%out_dir="'t256'"

echo "== teacher padded larger: 320 -> 256"
layouts big_t
grep -q "vocabularies differ: teacher 320, student 256: distilling over the 256 common ids" \
  big_t1.log || { cat big_t1.log; fail "start line does not name the differing vocabularies"; }
echo "ok teacher 320, student 256: one rank = tp=2 pp=2 = tp=2 dp=2"

echo "== student padded larger: 256 -> 320 (fkl at temperature 1: CE needs its own stats)"
layouts big_s teacher%card="'test-teacher'" teacher%init="'t256/final.h5'" \
  student%card="'test-student-pad'" loss%kind="'fkl'" loss%temperature=1.0
grep -q "vocabularies differ: teacher 256, student 320: distilling over the 256 common ids" \
  big_s1.log || fail "start line (student larger)"
echo "ok teacher 256, student 320: one rank = tp=2 pp=2 = tp=2 dp=2"

echo "== equal vocabularies say nothing about them"
kd 1 teacher%card="'test-teacher'" teacher%init="'t256/final.h5'" run%steps=1 run%out_dir="'eq'"
! grep -q "vocabularies differ" log.txt || fail "equal vocabularies reported as differing"

echo "== a token at or above the smaller vocabulary: exit 2, file and position"
# u16 tokens: 57 x 'A' (65), then id 290 (< 320, the larger model has it), then 40 x 'A'
{ i=0; while [ $i -lt 57 ]; do printf 'A\000'; i=$((i + 1)); done
  printf '\042\001'
  i=0; while [ $i -lt 40 ]; do printf 'A\000'; i=$((i + 1)); done; } > tok.bin
for side in teacher student; do
  if [ $side = teacher ]; then set -- ; else
    set -- teacher%card="'test-teacher'" teacher%init="'t256/final.h5'" \
      student%card="'test-student-pad'"; fi
  rc=0
  $MPIEXEC -n 2 "$KDTRAIN" base.nml data%train="'tok.bin'" data%format="'u16'" \
    run%out_dir="'bad_$side'" "$@" > log.txt 2>&1 || rc=$?
  cat log.txt
  [ $rc -eq 2 ] || fail "$side larger: exit $rc for token 290, expected 2"
  grep -q "tok.bin: token 290 at token offset 57" log.txt || fail "$side larger: message"
  grep -q "vocab_size 256" log.txt || fail "$side larger: the bound is the smaller vocabulary"
done
echo "all differing-vocabulary checks passed"
