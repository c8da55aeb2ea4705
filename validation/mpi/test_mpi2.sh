#!/bin/sh
# Check programs that must also pass on two MPI ranks (vocabulary split over
# ranks, hyperslab I/O split over ranks, MPI on backend blocks direct and staged).
set -e
. "${KD_SRCDIR:?}/validation/lib.sh"
for t in mpi/test_loss_tp unit/test_weights mpi/test_comm unit/test_tokfiles; do
  echo "== mpiexec -n 2 $t"
  $MPIEXEC -n 2 "$KD_BUILDDIR/validation/$t"
done
