#!/bin/sh
# The CUDA kernels without a GPU: kdtrain-cuemu (the real src/backend/cuda*.cu on
# the CPU emulation of validation/cuemu) runs `--selftest` with run%device='cuda',
# which compares every op and two training steps with the CPU backend. Once in FP32
# on one rank, once in BF16 (precision%compute) on one rank, and once on two ranks;
# each must print "selftest: passed" and exit 0. Skipped (77; a failure when CI is set)
# when configure found no C++ compiler and kdtrain-cuemu was not built. Not a GPU run:
# see emu_rt.cpp.
set -u
kd_here=1 # in the tree root: the quickstart input names its data relative to it
. "${KD_SRCDIR:?}/validation/lib.sh"
emu=${KD_BUILDDIR:?}/validation/cuemu/kdtrain-cuemu
[ -x "$emu" ] || kd_skip "$emu not built (configure found no C++ compiler)"
nml=$KD_SRCDIR/input/quickstart/teacher.nml

# run_one NRANKS PRECISION: one emulated self-test; fails the script unless it passes
run_one() {
  echo "== kdtrain-cuemu --selftest, $1 rank(s), precision%compute='$2'"
  start=$(date +%s)
  out=$($MPIEXEC -n "$1" "$emu" --selftest "$nml" "run%device='cuda'" \
    "precision%compute='$2'" 2>&1)
  rc=$?
  echo "$out"
  echo "(exit $rc, $(($(date +%s) - start)) s)"
  [ $rc -eq 0 ] || fail "kdtrain-cuemu --selftest ($1 ranks, $2) exited $rc"
  echo "$out" | grep -q "selftest: passed" || fail "no 'selftest: passed' ($1 ranks, $2)"
}

run_one 1 fp32
run_one 1 bf16
run_one 2 fp32
echo "emulated CUDA self-test passed (fp32, bf16, 2 ranks)"
