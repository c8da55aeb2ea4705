#!/bin/sh
# Teacher-cache benchmark (doc/cache.md): for two teacher/student pairs, in one run,
#   * the distill step time with the teacher read from a cache vs the live teacher vs
#     the student alone (mode 'train'), medians over the logged steps after the first;
#   * the cache's bytes per token on disk for k = 8, 32, 128 (topk and sample);
#   * the held-out (valid) loss of students distilled from each cache, next to the
#     live-teacher student and the no-teacher baseline.
# Pairs: mod/qs-teacher.nml -> mod/qs-student.nml (the quickstart pair, 7x) and
# mod/qs-teacher.nml -> mod/cache-student.nml (12x). The teacher is trained first
# (mode 'train', TSTEPS steps) on the same training text; every student run consumes
# exactly the windows of the training file once (STEPS * GB windows of T tokens).
#
#   validation/perf/cache.sh          # from the build tree root; work files in out/perf-cache
#   STEPS=100 TSTEPS=200 KS="32" validation/perf/cache.sh
set -eu
SRC=$(cd "$(dirname "$0")/../.." && pwd)
KDTRAIN=${KDTRAIN:-$PWD/src/kdtrain}
MPIEXEC=${MPIEXEC:-mpiexec}
OUT=${OUT:-$PWD/out/perf-cache}
T=${T:-128}
GB=${GB:-8}
MB=${MB:-4}
STEPS=${STEPS:-60}
TSTEPS=${TSTEPS:-120}
KS=${KS:-"8 32 128"}
PAIRS=${PAIRS:-"qs-student cache-student"}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
mkdir -p "$OUT"
cd "$OUT"
: > cache.log
head -c $((STEPS * GB * T + 1)) "$SRC/input/corpus/kjv-train.txt" > train.txt
cat > base.nml <<EOF
&run mode = 'distill', steps = $STEPS, seed = 2 /
&teacher card = 'qs-teacher', init = 'teacher/final.h5' /
&parallel micro_batch = $MB, global_batch = $GB /
&data train = 'train.txt', valid = '$SRC/input/corpus/kjv-valid.txt', format = 'bytes',
      seq_len = $T, valid_batches = 16 /
&loss kind = 'fkl', temperature = 1.0, alpha = 0.9 /
&optim lr = 3e-3, min_lr = 3e-4, warmup = 10, decay = 'cosine' /
&precision compute = 'fp32' /
&log every = 1 /
EOF
run() {
  echo "== $MPIEXEC -n 1 $KDTRAIN base.nml $*" >> cache.log
  $MPIEXEC -n 1 "$KDTRAIN" base.nml "$@" >> cache.log 2>&1 || { tail -20 cache.log; exit 1; }
}
# median step time (s) of a run's step rows after the first: global tokens / tok_per_s
steptime() {
  awk -F, -v tok=$((GB * T)) 'NR > 2 && $2 != "" && $9 > 0 { print tok / $9 }' "$1/metrics.csv" |
    sort -g | awk '{ v[NR] = $1 } END { printf "%.4f", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
val() { awk -F, 'NR > 1 && $12 != "" { v = $12 } END { printf "%.4f", v }' "$1/metrics.csv"; }

[ -f teacher/final.h5 ] || run run%mode=train student%card=qs-teacher run%steps=$TSTEPS \
  run%out_dir="'teacher'" optim%lr=3e-3 run%seed=1
echo "teacher (qs-teacher, $TSTEPS steps) valid loss $(val teacher)" | tee table.md
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), OMP_NUM_THREADS=$OMP_NUM_THREADS, $(nproc) cores" | tee -a table.md
for k in $KS; do
  for sel in topk sample; do
    run run%mode=cache student%card=qs-student teacher%cache="'c_${sel}_$k.h5'" \
      teacher%cache_k=$k teacher%cache_select="'$sel'" run%out_dir="'mk_${sel}_$k'"
    bpt=$(sed -n 's/.*wrote the teacher cache .* bytes, \([0-9.]*\) bytes\/token.*raw \([0-9.]*\)).*/\1 \2/p' cache.log | tail -1)
    echo "$sel $k $bpt" >> bytes.txt
  done
done
for s in $PAIRS; do
  run student%card="'$s'" run%out_dir="'${s}_live'"
  run run%mode=train student%card="'$s'" run%out_dir="'${s}_base'"
  for k in $KS; do
    for sel in topk sample; do
      run student%card="'$s'" teacher%source=cache teacher%cache="'c_${sel}_$k.h5'" \
        teacher%cache_k=$k teacher%cache_select="'$sel'" run%out_dir="'${s}_${sel}_$k'"
    done
  done
  base=$(steptime "${s}_base")
  live=$(steptime "${s}_live")
  {
    echo
    echo "pair qs-teacher -> $s: step time (s, median) and held-out loss after $STEPS steps"
    echo
    echo "| teacher | k | bytes/token (raw) | step s | vs student-only | vs live | valid loss | vs live |"
    echo "|---|---|---|---|---|---|---|---|"
    lv=$(val "${s}_live")
    echo "| none (mode train) | | | $base | 1.000 | $(awk -v a="$base" -v b="$live" 'BEGIN { printf "%.3f", a / b }') | $(val "${s}_base") | $(awk -v a="$(val "${s}_base")" -v b="$lv" 'BEGIN { printf "%+.2f%%", 100 * (a / b - 1) }') |"
    echo "| live | | | $live | $(awk -v a="$live" -v b="$base" 'BEGIN { printf "%.3f", a / b }') | 1.000 | $lv | |"
    for k in $KS; do
      for sel in topk sample; do
        d="${s}_${sel}_$k"
        st=$(steptime "$d")
        b=$(awk -v s="$sel" -v k="$k" '$1 == s && $2 == k { printf "%s (%s)", $3, $4 }' bytes.txt)
        echo "| cache $sel | $k | $b | $st | $(awk -v a="$st" -v b="$base" 'BEGIN { printf "%.3f", a / b }') | $(awk -v a="$st" -v b="$live" 'BEGIN { printf "%.3f", a / b }') | $(val "$d") | $(awk -v a="$(val "$d")" -v b="$lv" 'BEGIN { printf "%+.2f%%", 100 * (a / b - 1) }') |"
      done
    done
  } | tee -a table.md
done
