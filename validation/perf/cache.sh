#!/bin/sh
# Teacher-cache benchmark (doc/cache.md): for two teacher/student pairs, in one run,
#   * the distill step cost with the teacher read from a cache vs the live teacher vs
#     the student alone (mode 'train'): CPU seconds per step of the single-rank process
#     (OMP_NUM_THREADS=1), from two runs of each kind, STEPS and SHORT steps, so set-up
#     and final validation cancel: (cpu(STEPS) - cpu(SHORT)) / (STEPS - SHORT). CPU time
#     rather than wall time because the machine is shared: wall time swings with the
#     other jobs, CPU time much less;
#   * the cache's bytes per token on disk for k = 8, 32, 128 (topk and sample);
#   * the held-out (valid) loss of students distilled from each cache, next to the
#     live-teacher student and the no-teacher baseline (the STEPS runs).
# Pairs: mod/qs-teacher.nml -> mod/qs-student.nml (the quickstart pair, 7x) and
# mod/qs-teacher.nml -> mod/cache-student.nml (12x). The teacher is trained first
# (mode 'train', TSTEPS steps) on the same training text; every student run of STEPS
# steps consumes exactly the windows of the training file once (STEPS * GB windows).
#
#   validation/perf/cache.sh          # from the build tree root; work files in out/perf-cache
#   STEPS=100 TSTEPS=200 KS="32" validation/perf/cache.sh
set -eu
SRC=$(cd "$(dirname "$0")/../.." && pwd)
KDTRAIN=${KDTRAIN:-$PWD/src/kdtrain}
MPIEXEC=${MPIEXEC:-mpiexec}
OUT=${OUT:-$PWD/out/perf-cache}
T=${T:-64}
GB=${GB:-8}
MB=${MB:-4}
STEPS=${STEPS:-100}
SHORT=${SHORT:-10}
TSTEPS=${TSTEPS:-200}
KS=${KS:-"8 32 128"}
PAIRS=${PAIRS:-"qs-student cache-student"}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
mkdir -p "$OUT"
cd "$OUT"
: > cache.log
: > cpu.txt
: > bytes.txt
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
# kdtrain on one rank without mpiexec (a singleton MPI process), its CPU seconds
# (user + system of the child) appended to cpu.txt under the name $1
run() {
  name=$1; shift
  echo "== $KDTRAIN base.nml $*" >> cache.log
  python3 -c 'import resource, subprocess, sys
rc = subprocess.call(sys.argv[2:], stdout=open("cache.log", "a"), stderr=subprocess.STDOUT)
r = resource.getrusage(resource.RUSAGE_CHILDREN)
open("cpu.txt", "a").write("%s %.3f\n" % (sys.argv[1], r.ru_utime + r.ru_stime))
sys.exit(rc)' "$name" "$KDTRAIN" base.nml "$@" || { tail -20 cache.log; exit 1; }
}
cpu() { awk -v n="$1" '$1 == n { v = $2 } END { print v }' cpu.txt; }
# CPU seconds per step of a variant: its STEPS run minus its SHORT run
steptime() {
  awk -v a="$(cpu "$1")" -v b="$(cpu "$1.short")" -v d=$((STEPS - SHORT)) 'BEGIN { printf "%.4f", (a - b) / d }'
}
val() { awk -F, 'NR > 1 && $12 != "" { v = $12 } END { printf "%.4f", v }' "$1/metrics.csv"; }

# the teacher, reused by a later run with the same sizes
tdir=teacher_T${T}_G${GB}_S${STEPS}_t$TSTEPS
[ -f $tdir/final.h5 ] || run teacher run%mode=train student%card=qs-teacher run%steps=$TSTEPS \
  run%out_dir="'$tdir'" optim%lr=3e-3 run%seed=1
sed -i "s|init = 'teacher/final.h5'|init = '$tdir/final.h5'|" base.nml
echo "teacher (qs-teacher, $TSTEPS steps) valid loss $(val $tdir)" | tee table.md
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), OMP_NUM_THREADS=$OMP_NUM_THREADS, $(getconf _NPROCESSORS_ONLN) cores" | tee -a table.md
for k in $KS; do
  for sel in topk sample; do
    run "mk_${sel}_$k" run%mode=cache student%card=qs-student teacher%cache="'c_${sel}_$k.h5'" \
      teacher%cache_k=$k teacher%cache_select="'$sel'" run%out_dir="'mk_${sel}_$k'"
    bpt=$(sed -n 's/.*wrote the teacher cache .* bytes, \([0-9.]*\) bytes\/token.*raw \([0-9.]*\)).*/\1 \2/p' cache.log | tail -1)
    echo "$sel $k $bpt" >> bytes.txt
  done
done
# compression: the k = 32 topk cache once more without shuffle + deflate; making and
# reading it (CPU s per distill step of the first pair's student)
k32=$(echo $KS | tr ' ' '\n' | grep -x 32 || true)
if [ -n "$k32" ]; then
  s=$(echo $PAIRS | cut -d' ' -f1)
  run mk_raw_32 run%mode=cache student%card=qs-student teacher%cache="'c_raw_32.h5'" \
    teacher%cache_k=32 teacher%cache_compress=.false. run%out_dir="'mk_raw_32'"
  for len in "$STEPS" "$SHORT"; do
    sfx=""; [ "$len" = "$STEPS" ] || sfx=.short
    run "${s}_raw_32$sfx" student%card="'$s'" teacher%source=cache teacher%cache="'c_raw_32.h5'" \
      teacher%cache_k=32 run%out_dir="'${s}_raw_32$sfx'" run%steps=$len
  done
fi
for s in $PAIRS; do
  for len in "$STEPS" "$SHORT"; do
    sfx=""; [ "$len" = "$STEPS" ] || sfx=.short
    run "${s}_live$sfx" student%card="'$s'" run%out_dir="'${s}_live$sfx'" run%steps=$len
    run "${s}_base$sfx" run%mode=train student%card="'$s'" run%out_dir="'${s}_base$sfx'" \
      run%steps=$len
    for k in $KS; do
      for sel in topk sample; do
        run "${s}_${sel}_$k$sfx" student%card="'$s'" teacher%source=cache \
          teacher%cache="'c_${sel}_$k.h5'" teacher%cache_k=$k teacher%cache_select="'$sel'" \
          run%out_dir="'${s}_${sel}_$k$sfx'" run%steps=$len
      done
    done
  done
  base=$(steptime "${s}_base")
  live=$(steptime "${s}_live")
  {
    echo
    echo "pair qs-teacher -> $s: CPU seconds per step and held-out loss after $STEPS steps"
    echo
    echo "| teacher | k | bytes/token (raw) | CPU s/step | vs student-only | vs live | valid loss | vs live |"
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
if [ -n "$k32" ]; then
  s=$(echo $PAIRS | cut -d' ' -f1)
  {
    echo
    echo "compression (topk, k = 32): shuffle + deflate $(awk '$1 == "topk" && $2 == 32 { print $3 }' bytes.txt) bytes/token, made in $(cpu mk_topk_32) CPU s, read at $(steptime "${s}_topk_32") CPU s/step;"
    echo "none $(sed -n 's/.*wrote the teacher cache .* bytes, \([0-9.]*\) bytes\/token.*/\1/p' cache.log | tail -1) bytes/token, made in $(cpu mk_raw_32) CPU s, read at $(steptime "${s}_raw_32") CPU s/step"
  } > compress.txt
  tee -a table.md < compress.txt
fi
