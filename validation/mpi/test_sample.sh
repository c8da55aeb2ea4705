#!/bin/sh
# The token sampler of generation against transformers' own logits warpers
# (validation/mpi/test_sample.c: kept ids, draw frequencies, any vocabulary split gives
# the whole row's token), on 1 rank and on 3 (uneven shards).
set -eu
. "${KD_SRCDIR:?}/validation/lib.sh"
kd_python_or_skip torch transformers
"$KD_PYTHON" "$KD_SRCDIR/validation/ref/sample_ref.py" ref.txt || fail "reference rows"
for np in 1 3; do
  echo "== mpiexec -n $np test_sample"
  $MPIEXEC -n $np "$KD_BUILDDIR/validation/mpi/test_sample" ref.txt || fail "$np rank(s)"
done
