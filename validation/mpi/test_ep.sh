#!/bin/sh
# Expert parallelism on 1, 2 and 4 ranks, every ep dividing the ranks, CPU blocks and
# staged devsim blocks: the groups, the token exchange and one layer of experts with its
# backward (validation/mpi/test_ep.c); the expert gradients' reduction, norm and ZeRO-1
# shards, and weights files across ep (validation/mpi/test_ep_grads.c).
set -eu
. "${KD_SRCDIR:?}/validation/lib.sh"
export OMP_NUM_THREADS=1
for np in 1 2 4; do
  echo "== mpiexec -n $np test_ep"
  $MPIEXEC -n $np "$KD_BUILDDIR/validation/mpi/test_ep" || fail "$np rank(s)"
  echo "== mpiexec -n $np test_ep_grads"
  $MPIEXEC -n $np "$KD_BUILDDIR/validation/mpi/test_ep_grads" || fail "grads, $np rank(s)"
done
