#!/bin/sh
# Compute threads per rank (src/backend/cpu_hw.c kd_threads_init, src/grid.c
# grid_node_setup): MPICH's mpiexec gives every rank the whole machine, and OpenMP then
# starts one thread per CPU in every rank. kdtrain sets each rank's threads to its share
# of the CPUs its node's ranks may use (affinity masks, cgroup limit) over their number.
#  - 2 ranks at tp 2 with no thread variable set (nor OMP_WAIT_POLICY: libgomp's spinning
#    default) run within 1.5x of the same run with OMP_NUM_THREADS=1 (before: 10x slower),
#    and the start line says the threads per rank and where they came from;
#  - a user's OMP_NUM_THREADS or OPENBLAS_NUM_THREADS wins and is named; threads x ranks
#    above the CPUs is a warning with the numbers;
#  - one rank bound to one CPU (taskset) takes 1 thread; OMP_PROC_BIND on ranks mpiexec
#    did not bind (all on the first core) is a warning naming the masks;
#  - kdgen-ids takes its share alike and names it.
set -eu
. "${KD_SRCDIR:?}/validation/lib.sh"
unset OMP_NUM_THREADS OPENBLAS_NUM_THREADS GOTO_NUM_THREADS OMP_WAIT_POLICY GOMP_SPINCOUNT \
  OMP_PROC_BIND OMP_PLACES OMP_DYNAMIC OMP_THREAD_LIMIT
ncpu=$(nproc)
share=$((ncpu / 2))
[ "$share" -ge 1 ] || share=1

cat > base.nml <<EOF2
&run mode = 'train', steps = 8, seed = 3, out_dir = 'o' /
&student card = 'test-teacher', init = 'random' /
&parallel tp = 2, micro_batch = 4, global_batch = 8 /
&data format = 'bytes', train = '$KD_SRCDIR/input/corpus/kjv-train.txt', seq_len = 64 /
&optim lr = 1e-3, warmup = 1 /
&precision compute = 'fp32' /
EOF2
# the start line's thread clause: "threads per rank N (WHY)"
threads() {
  sed -n 's/.*| \(threads per rank [0-9]* ([^)]*)\).*/\1/p' "$1" | head -n 1
}
# secs NAME VAR=VALUE...: wall seconds of the run on 2 ranks into NAME (console NAME.log)
secs() {
  name=$1
  shift
  t0=$(date +%s.%N)
  env "$@" $MPIEXEC -n 2 "$KDTRAIN" base.nml run%out_dir="'$name'" > "$name.log" 2>&1 ||
    { cat "$name.log"; fail "run $name"; }
  t1=$(date +%s.%N)
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }'
}

echo "== 2 ranks at tp 2: no thread variable vs OMP_NUM_THREADS=1"
# the best of three runs each, interleaved: a busy machine slows some runs, not all
d1=$(secs dflt1) && o1=$(secs one1 OMP_NUM_THREADS=1)
d2=$(secs dflt2) && o2=$(secs one2 OMP_NUM_THREADS=1)
d3=$(secs dflt3) && o3=$(secs one3 OMP_NUM_THREADS=1)
min3() { printf '%s\n' "$@" | sort -n | head -n 1; }
d=$(min3 "$d1" "$d2" "$d3")
o=$(min3 "$o1" "$o2" "$o3")
echo "default $d1 $d2 $d3 s, OMP_NUM_THREADS=1 $o1 $o2 $o3 s"
line=$(threads dflt1.log)
echo "start line: $line"
case $line in
  "threads per rank $share ("*" CPUs / 2 ranks on this node)") ;;
  *cgroup*) echo "(a cgroup CPU limit applies here)" ;;
  *) cat dflt1.log; fail "expected 'threads per rank $share (... / 2 ranks on this node)'" ;;
esac
grep -q WARNING dflt1.log && { cat dflt1.log; fail "a warning in the default run"; }
kd_bitwise one1 dflt1
awk -v d="$d" -v o="$o" 'BEGIN { exit !(d <= 1.5 * o) }' ||
  fail "the default run took $d s, more than 1.5 x the $o s of OMP_NUM_THREADS=1"
echo "ok default $d s <= 1.5 x $o s"
case $(threads one1.log) in
  "threads per rank 1 (OMP_NUM_THREADS=1"*) ;;
  *) cat one1.log; fail "OMP_NUM_THREADS=1 not named on the start line" ;;
esac

echo "== the user's variables win; oversubscription is a warning with the numbers"
over=$((ncpu + 1))
env OPENBLAS_NUM_THREADS=1 $MPIEXEC -n 2 "$KDTRAIN" base.nml run%steps=1 run%out_dir="'ob'" \
  > ob.log 2>&1 || { cat ob.log; fail "OPENBLAS_NUM_THREADS=1"; }
case $(threads ob.log) in
  "threads per rank 1 (OPENBLAS_NUM_THREADS=1"*) ;;
  *) cat ob.log; fail "OPENBLAS_NUM_THREADS=1 not named" ;;
esac
env OMP_NUM_THREADS=$over OMP_WAIT_POLICY=passive $MPIEXEC -n 2 "$KDTRAIN" base.nml run%steps=1 \
  run%out_dir="'ov'" > ov.log 2>&1 || { cat ov.log; fail "OMP_NUM_THREADS=$over"; }
case $(threads ov.log) in
  "threads per rank $over (OMP_NUM_THREADS=$over"*) ;;
  *) cat ov.log; fail "OMP_NUM_THREADS=$over not named" ;;
esac
grep -q "WARNING: OMP_NUM_THREADS=$over x 2 ranks on this node = $((2 * over)) threads on $ncpu CPUs" ov.log ||
  { cat ov.log; fail "no oversubscription warning with the numbers"; }
echo "ok $(grep -m1 WARNING ov.log)"

echo "== one rank bound to one CPU takes 1 thread"
if [ "$ncpu" -ge 2 ]; then
  taskset -c 0 $MPIEXEC -n 1 "$KDTRAIN" base.nml parallel%tp=1 run%steps=1 run%out_dir="'ts'" \
    > ts.log 2>&1 || { cat ts.log; fail "taskset -c 0"; }
  case $(threads ts.log) in
    "threads per rank 1 (1 CPU / 1 rank on this node)") ;;
    *) cat ts.log; fail "one CPU: not 1 thread" ;;
  esac
  $MPIEXEC -n 1 "$KDTRAIN" base.nml parallel%tp=1 run%steps=1 run%out_dir="'n1'" \
    > n1.log 2>&1 || { cat n1.log; fail "one rank"; }
  case $(threads n1.log) in
    "threads per rank $ncpu ($ncpu CPUs / 1 rank on this node)" | *cgroup*) ;;
    *) cat n1.log; fail "one rank unbound: not $ncpu threads" ;;
  esac
  echo "ok taskset -c 0: $(threads ts.log); unbound: $(threads n1.log)"
  # OMP_PROC_BIND on ranks mpiexec did not bind: every rank on the first core, named
  env OMP_PROC_BIND=close OMP_PLACES=cores $MPIEXEC -n 2 "$KDTRAIN" base.nml run%steps=1 \
    run%out_dir="'pb'" > pb.log 2>&1 || { cat pb.log; fail "OMP_PROC_BIND=close"; }
  grep -q "WARNING: 2 ranks on this node share 1 CPU .*cover only 1 of its $ncpu CPUs" pb.log ||
    { cat pb.log; fail "OMP_PROC_BIND on unbound ranks: no warning naming the masks"; }
  echo "ok OMP_PROC_BIND=close on unbound ranks: $(threads pb.log), warned"
fi

echo "== kdgen-ids"
printf '1 2 3 4\n5 6 7 8\n' > prompts.txt
$MPIEXEC -n 2 "$KD_BUILDDIR/src/tools/kdgen-ids" dflt1/final.h5 --ids prompts.txt --tp 2 \
  --max-new-tokens 4 > gen.txt 2> gen.err || { cat gen.err; fail "kdgen-ids"; }
grep -q "threads per rank $share (" gen.err || grep -q "threads per rank [0-9]* (.*cgroup" gen.err ||
  { cat gen.err; fail "kdgen-ids does not name its threads per rank"; }
echo "ok $(grep -o 'threads per rank [0-9]* ([^)]*)' gen.err)"
echo "all thread checks passed"
