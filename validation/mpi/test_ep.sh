#!/bin/sh
# The groups and the token exchange of expert parallelism (validation/mpi/test_ep.c) on
# 1, 2 and 4 ranks: every ep dividing the ranks, CPU blocks and staged devsim blocks.
set -eu
. "${KD_SRCDIR:?}/validation/lib.sh"
export OMP_NUM_THREADS=1
for np in 1 2 4; do
  echo "== mpiexec -n $np test_ep"
  $MPIEXEC -n $np "$KD_BUILDDIR/validation/mpi/test_ep" || fail "$np rank(s)"
done
