#!/bin/sh
# The BLAS kernel without user tuning (src/backend/cpu_hw.c): kdtrain's first start
# line names the CPU, its vector level, the BLAS and the kernel it runs and who chose
# it. Unset OPENBLAS_CORETYPE: never a kernel narrower than the CPU (no WARNING) -- on
# a CPU the library does not know (Debian's OpenBLAS 0.3.21 on family 6 model 207:
# Prescott) kdtrain chose the kernel and re-executed itself, under mpiexec too, with
# the command line intact. A user's OPENBLAS_CORETYPE is respected, and Prescott on a
# CPU with AVX or better is named slow.
set -eu
export OMP_NUM_THREADS=1
. "${KD_SRCDIR:?}/validation/lib.sh"
cat > in.nml <<EOF2
&run mode = 'train', steps = 3, seed = 1, out_dir = 'o' /
&student card = 'test-student', init = 'random' /
&parallel micro_batch = 1, global_batch = 2 /
&data format = 'bytes', train = '$KD_SRCDIR/input/corpus/kjv-train.txt', seq_len = 16 /
&precision compute = 'fp32' /
EOF2
blas_line() { grep '^kdtrain: CPU .* | BLAS ' "$1" || { cat "$1"; fail "no CPU/BLAS start line"; }; }
steps() { [ "$(awk -F, 'NR > 1 && $2 != ""' "$1/metrics.csv" | wc -l)" -eq "$2" ] || fail "$1: not $2 steps"; }

echo "== the default: no kernel narrower than the CPU"
(unset OPENBLAS_CORETYPE; "$KDTRAIN" in.nml run%steps=2 run%out_dir="'a'" > a.log 2>&1) ||
  { cat a.log; fail "default run"; }
line=$(blas_line a.log); echo "$line"
case $line in *WARNING*) fail "the default runs a kernel narrower than the CPU";; esac
case $line in *"chosen by kdtrain"*)
  echo "$line" | grep -q "the library picked [A-Za-z]* (SSE3\|the library picked [A-Za-z]* (AVX" ||
    fail "re-executed without naming the library's own choice";;
esac
steps a 2 # the override run%steps=2 survived a re-execution

echo "== two ranks under mpiexec"
(unset OPENBLAS_CORETYPE; $MPIEXEC -n 2 "$KDTRAIN" in.nml run%out_dir="'b'" > b.log 2>&1) ||
  { cat b.log; fail "two ranks"; }
[ "$(blas_line b.log)" = "$line" ] || fail "two ranks report another kernel than one"
grep -q "2 rank(s)" b.log || fail "not one job of two ranks"
steps b 3

echo "== the user's OPENBLAS_CORETYPE is respected"
OPENBLAS_CORETYPE=Prescott "$KDTRAIN" in.nml run%steps=1 run%out_dir="'c'" > c.log 2>&1 ||
  { cat c.log; fail "Prescott run"; }
pline=$(blas_line c.log); echo "$pline"
echo "$pline" | grep -q "kernel Prescott (SSE3; set by OPENBLAS_CORETYPE=Prescott)" ||
  fail "the user's kernel is not the one run, or not said to be the user's"
case $line in
  *"CPU with SSE3"* | *", SSE3, "*) ;;
  *) echo "$pline" | grep -q "WARNING: SSE3 kernels on a CPU with" || fail "no warning for Prescott";;
esac
steps c 1

echo "== the MFU peak is the hardware's, measured at start, never below the measured GEMM"
# pct_of LOG: the measured GEMM's share of the stated peak (the start line's "(N% of that peak)")
pct_of() { sed -n 's/^kdtrain: MFU peak .*(\([0-9]*\)% of that peak)$/\1/p' "$1"; }
# (the probe's own rate, or on a busy core the GEMM's rate per thread above it)
grep -q "^kdtrain: MFU peak [0-9.]* GFLOP/s per rank: .* cores x [0-9.e+]* GFLOP/s per core (.*: [0-9]* chains of vfmadd" a.log ||
  { cat a.log; fail "no measured hardware peak line"; }
"$KDTRAIN" in.nml run%steps=1 log%peak_tflops=0.5 run%out_dir="'d'" > d.log 2>&1 || fail "peak_tflops"
grep -q "^kdtrain: MFU peak 500 GFLOP/s per rank: log%peak_tflops" d.log || { cat d.log; fail "log%peak_tflops"; }
awk -F, 'NR == 2 { if (!($10 > 0 && $10 < 1)) { print "mfu " $10; exit 1 } }' a/metrics.csv ||
  fail "mfu column not in (0, 1)"
# the probe's peak against the GEMM measured in the run's precision, both precisions, on one
# and two threads: the stated peak is never below the measured product
for prec in fp32 bf16; do
  for t in 1 2; do
    OMP_NUM_THREADS=$t "$KDTRAIN" in.nml run%steps=1 precision%compute="'$prec'" \
      run%out_dir="'p$prec$t'" > "p$prec$t.log" 2>&1 || { cat "p$prec$t.log"; fail "$prec run"; }
    pct=$(pct_of "p$prec$t.log")
    grep "^kdtrain: MFU peak " "p$prec$t.log"
    [ -n "$pct" ] && [ "$pct" -le 100 ] ||
      { cat "p$prec$t.log"; fail "$prec, $t thread(s): the measured GEMM is $pct% of the stated peak"; }
  done
done
grep -q "per core (measured: 16 chains of vdpbf16ps\|per core (measured: .*bf16 runs FP32\|GEMM's rate per thread\|AMX tiles" pbf161.log ||
  { cat pbf161.log; fail "a bf16 run's peak is not the BF16 product's"; }
grep -q "| BF16 GEMM 1536^3 measured" pbf161.log || fail "a bf16 run's GEMM rate is not the BF16 product's"
echo "== a GEMM faster than the probe raises the peak, a slow one never lowers it"
KDTRAIN_TEST_GEMM_PEAK=1e14 "$KDTRAIN" in.nml run%steps=1 run%out_dir="'e'" > e.log 2>&1 || fail "fast gemm"
# (the rank's cores count in the peak; the rate was measured on OMP_NUM_THREADS = 1: 100%
# of the peak on a 1-core machine, 50% on 2)
grep -q "^kdtrain: MFU peak [0-9.e+]* GFLOP/s per rank: .* GFLOP/s per core (the GEMM's rate per thread, above the probe's: .*) | sgemm 1536^3 measured 1e+05 GFLOP/s ([0-9]*% of that peak)" e.log ||
  { cat e.log; fail "the peak did not take the rate the sgemm ran at"; }
pct=$(pct_of e.log)
[ -n "$pct" ] && [ "$pct" -le 100 ] || { cat e.log; fail "the sgemm rate is $pct% of the peak"; }
KDTRAIN_TEST_GEMM_PEAK=1e6 "$KDTRAIN" in.nml run%steps=1 run%out_dir="'s'" > s.log 2>&1 || fail "slow gemm"
grep "^kdtrain: MFU peak " s.log | grep -q "per core (measured: .*) | sgemm 1536^3 measured 0.001 GFLOP/s" ||
  { cat s.log; fail "a slow GEMM changed the peak"; }
echo "BLAS kernel selection and the hardware peak: ok"
