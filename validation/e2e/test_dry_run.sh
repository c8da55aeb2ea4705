#!/bin/sh
# Planning a job from one process: kdtrain --dry-run --ranks N (doc/user-guide.md).
#  - for N = 1 .. 256 over tp, pp in {1, 2, 4} it never crashes, refuses (exit 2)
#    exactly the layouts the rules refuse (tp * pp divides N, dp divides the global
#    batch, the cards cut: the student has 2 heads and 3 layers, the teacher 2 layers),
#    and ends with the summary (largest rank, per-stage table, total, fit);
#  - 256 ranks are planned in well under a second;
#  - on 1, 2 and 4 ranks the real run and the dry run agree: the same refusal with the
#    same message (the user's FILE:LINE), or, when the run goes, every rank's measured
#    weights .. communication peaks equal the plan to the byte;
#  - --device-mem and memory%budget_mb give the fit verdict;
#  - options, the input and overrides in any order plan the same; the table is in MiB, with
#    --bytes in bytes (the same values); a second input file is exit 2.
set -eu
export OMP_NUM_THREADS=1
. "${KD_SRCDIR:?}/validation/lib.sh"

cat > base.nml <<EOF2
&run mode = 'distill', steps = 1, seed = 3, out_dir = 'o' /
&teacher card = 'test-teacher', init = 't/final.h5' /
&student card = 'test-student', init = 'random' /
&parallel micro_batch = 1, global_batch = 8 /
&data format = 'bytes', train = '$KD_SRCDIR/input/corpus/kjv-train.txt', seq_len = 16 /
&loss kind = 'fkl', alpha = 0.5 /
&optim lr = 1e-2, warmup = 1 /
&precision compute = 'fp32' /
EOF2

echo "== a teacher to distil from"
$MPIEXEC -n 1 "$KDTRAIN" base.nml run%mode=train student%card=test-teacher run%out_dir="'t'" \
  > log.txt 2>&1 || { cat log.txt; fail "teacher"; }

echo "== --dry-run --ranks N, N = 1 .. 256, tp and pp in {1, 2, 4}"
n=0
for N in 1 2 3 4 5 6 7 8 9 10 12 16 24 32 48 64 96 128 192 255 256; do
  for tp in 1 2 4; do
    for pp in 1 2 4; do
      rc=0
      "$KDTRAIN" --dry-run --bytes --ranks "$N" base.nml parallel%tp=$tp parallel%pp=$pp > plan.txt 2> err.txt || rc=$?
      want=0
      if [ $((N % (tp * pp))) -ne 0 ] || [ $((8 % (N / (tp * pp) > 0 ? N / (tp * pp) : 1))) -ne 0 ] \
        || [ "$tp" -gt 2 ] || [ "$pp" -gt 2 ]; then want=2; fi
      [ "$rc" -eq "$want" ] || { cat plan.txt err.txt; fail "N=$N tp=$tp pp=$pp: exit $rc, expected $want"; }
      if [ "$rc" -eq 0 ]; then
        [ "$(awk '$1 ~ /^[0-9]+$/' plan.txt | wc -l)" -eq "$N" ] || fail "N=$N tp=$tp pp=$pp: not one row per rank"
        [ "$(grep -c '^    stage [0-9]*:' plan.txt)" -eq "$pp" ] || fail "N=$N: no per-stage table"
        grep -q "^  largest rank: [0-9]* (stage [0-9]*, tp rank [0-9]*): .* | all $N ranks: " plan.txt \
          || { cat plan.txt; fail "N=$N: no summary line"; }
        grep -q '^  fit: ' plan.txt || fail "N=$N: no fit line"
      else
        grep -Eq "^kdtrain: (command line 'parallel%[a-z]+=[0-9]+'|base.nml:[0-9]+): &parallel " err.txt \
          || { cat err.txt; fail "N=$N tp=$tp pp=$pp: refusal does not name the key"; }
      fi
      n=$((n + 1))
    done
  done
done
echo "ok $n dry runs"

# The process's own CPU time (user + system, from the shell's `times`), not the wall
# clock: make -j2 check runs this beside the 64-rank test_scale.sh on 2 cores, where a
# 20 ms plan waited 1.8 s for a core.  The wall time is printed for the record.
t0=$(date +%s%N)
# (the exit status goes through a file: a pipeline's status is awk's)
cpu=$( ("$KDTRAIN" --dry-run --bytes --ranks 256 base.nml parallel%tp=2 parallel%pp=2 \
  parallel%global_batch=64 > p256.txt; echo $? > p256.rc; times) \
  | awk 'NR == 2 { n = 0; for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); n += a[1] * 60 + a[2] }
                   printf "%d\n", n * 1000 }')
[ "$(cat p256.rc)" -eq 0 ] || { cat p256.txt; fail "planning 256 ranks: exit $(cat p256.rc)"; }
t1=$(date +%s%N)
echo "256 ranks planned in $cpu ms of CPU time ($(((t1 - t0) / 1000000)) ms wall)"
grep -q '^  largest rank: ' p256.txt || { cat p256.txt; fail "256 ranks: no summary"; }
[ "$cpu" -lt 1000 ] || fail "planning 256 ranks took $cpu ms of CPU time"

echo "== fit verdicts"
"$KDTRAIN" --dry-run --bytes --ranks 4 --device-mem 80GiB base.nml parallel%tp=2 > f1.txt
grep -q '^  fit: .* 80.00 GiB: fits$' f1.txt || { cat f1.txt; fail "--device-mem 80GiB"; }
"$KDTRAIN" --dry-run --bytes --ranks 4 base.nml parallel%tp=2 memory%budget_mb=1 > f2.txt
grep -q '^  fit: .*memory%budget_mb 1.0 MiB: fits$' f2.txt || { cat f2.txt; fail "budget_mb=1"; }
"$KDTRAIN" --dry-run --bytes --device-mem 100KiB base.nml > f3.txt
grep -q 'DOES NOT FIT' f3.txt || { cat f3.txt; fail "100KiB should not fit"; }
for bad in "--ranks 0" "--ranks x" "--device-mem 80XB"; do
  rc=0; "$KDTRAIN" --dry-run --bytes $bad base.nml > /dev/null 2>&1 || rc=$?
  [ "$rc" -eq 2 ] || fail "$bad: exit $rc, expected 2"
done
rc=0; "$KDTRAIN" --ranks 4 base.nml > /dev/null 2>&1 || rc=$?
[ "$rc" -eq 2 ] || fail "--ranks without --dry-run: exit $rc"

echo "== options anywhere on the command line; the plan in MiB, --bytes in exact bytes"
"$KDTRAIN" --dry-run --bytes --ranks 2 base.nml parallel%tp=2 > order1.txt
"$KDTRAIN" base.nml parallel%tp=2 --ranks 2 --dry-run --bytes > order2.txt
"$KDTRAIN" parallel%tp=2 --bytes base.nml --dry-run --ranks 2 > order3.txt
cmp -s order1.txt order2.txt && cmp -s order1.txt order3.txt \
  || { diff order1.txt order2.txt; diff order1.txt order3.txt; fail "options after the input plan otherwise"; }
"$KDTRAIN" base.nml --dry-run --ranks 2 parallel%tp=2 > mib.txt
grep -q "predicted per-rank memory (MiB; --bytes for exact integers" mib.txt || { cat mib.txt; fail "no MiB table"; }
# each MiB figure is the exact table's bytes / 2^20, to one decimal
awk '/^  rank/ { on = 1; next } on && $1 ~ /^[0-9]+$/ { print } /^  per pipeline/ { on = 0 }' order1.txt > b.rows
awk '/^  rank/ { on = 1; next } on && $1 ~ /^[0-9]+$/ { print } /^  per pipeline/ { on = 0 }' mib.txt > m.rows
[ "$(wc -l < m.rows)" -eq 2 ] || { cat mib.txt; fail "MiB table rows"; }
paste b.rows m.rows | awk '{ for (k = 2; k <= 9; k++) if (sprintf("%.1f", $k / 1048576) != $(k + 10)) { print "column " k ": " $k " bytes, " $(k + 10) " MiB"; bad = 1 } } END { exit bad }' \
  || fail "the MiB table is not the bytes table"
rc=0; "$KDTRAIN" --dry-run base.nml other.nml > two.txt 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -q "'other.nml': a second input file (the first is 'base.nml')" two.txt \
  || { cat two.txt; fail "two input files: rc $rc"; }

echo "== refused by the run as by the dry run, with the same message"
sed 's|^&parallel micro_batch|\&parallel tp = 3, micro_batch|' base.nml > tp3.nml
refused() { # refused NP INPUT [overrides]: same exit 2 and message from both
  np=$1; shift
  rc=0; $MPIEXEC -n "$np" "$KDTRAIN" "$@" > run.out 2> run.err || rc=$?
  [ "$rc" -eq 2 ] || { cat run.out run.err; fail "run on $np ranks $*: exit $rc, expected 2"; }
  rc=0; "$KDTRAIN" --dry-run --bytes --ranks "$np" "$@" > dry.out 2> dry.err || rc=$?
  [ "$rc" -eq 2 ] || { cat dry.out dry.err; fail "dry run on $np ranks $*: exit $rc, expected 2"; }
  [ "$(grep -c . run.err)" -eq 1 ] || { cat run.err; fail "run $*: not one message"; }
  cmp -s run.err dry.err || { cat run.err dry.err; fail "run and dry run refuse differently: $*"; }
  echo "ok refused on $np ranks: $(cat run.err)"
}
refused 3 tp3.nml
grep -q '^kdtrain: tp3.nml:4: &parallel tp: ' run.err || fail "tp = 3: the message does not name tp3.nml:4"
refused 4 base.nml parallel%pp=4
refused 3 base.nml
refused 4 base.nml parallel%tp=2 parallel%dp=4

echo "== the plan equals the measured peaks (1, 2 and 4 ranks)"
exact() { # exact NP [overrides]
  np=$1; shift
  $MPIEXEC -n "$np" "$KDTRAIN" base.nml "$@" > log.txt 2>&1 || { cat log.txt; fail "run $np $*"; }
  awk '/^memory peaks per rank/ { on = 1; next } on && $1 ~ /^[0-9]+$/ { print $1, $3, $4, $5, $6, $7, $8 }' \
    log.txt > measured.txt
  "$KDTRAIN" --dry-run --bytes --ranks "$np" base.nml "$@" > plan.txt 2>&1 || { cat plan.txt; fail "dry run $np $*"; }
  awk '/^  rank/ { on = 1; next } on && $1 ~ /^[0-9]+$/ { print $1, $2, $3, $4, $5, $6, $7 }' \
    plan.txt > predicted.txt
  [ "$(wc -l < measured.txt)" -eq "$np" ] || { cat log.txt; fail "no per-rank memory table"; }
  cmp -s measured.txt predicted.txt || { paste measured.txt predicted.txt; fail "plan != peaks: $np $*"; }
  echo "ok plan = peaks on $np rank(s) $*"
}
exact 1
exact 2 parallel%pp=2
exact 4 parallel%tp=2 parallel%pp=2 parallel%zero=1
echo "all dry-run checks passed"
