#!/bin/sh
# kdtrain --selftest: on a machine with a GPU (CUDA build) every op and two training
# steps must pass (exit 0); without a device or without CUDA support it must say
# "no CUDA device" and exit 2. Any other outcome (1: a comparison failed) fails.
set -u
kd_here=1 # in the tree root: the quickstart input names its data relative to it
. "${KD_SRCDIR:?}/validation/lib.sh"
out=$($MPIEXEC -n 1 "$KDTRAIN" --selftest "$KD_SRCDIR/input/quickstart/teacher.nml" \
  "run%device='cuda'" 2>&1)
rc=$?
echo "$out"
case $rc in
  0) echo "selftest passed on a CUDA device"; exit 0 ;;
  2) echo "$out" | grep -q "no CUDA device" && exit 0
     fail "exit 2 without the 'no CUDA device' message" ;;
  *) fail "kdtrain --selftest exited $rc" ;;
esac
