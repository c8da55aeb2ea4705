#!/bin/sh
# User-facing messages name no source location, and a rank only where more than one runs
# (src/util.c kd_msg_prefix; doc/interface.md "Messages"): the serial tools (kdconvert,
# kdlogits, kdgen-ids, also under mpiexec -n 1) and a 1-rank kdtrain print "PROGRAM:
# message"; a verdict that every rank of a 2-rank run reaches alike names no rank either;
# one rank's own failure on 2 ranks names that rank.
set -eu
. "${KD_SRCDIR:?}/validation/lib.sh"
export KDTRAIN_MOD_PATH="$KD_SRCDIR/mod" OMP_NUM_THREADS=1 KDTRAIN_TEST_GEMM_PEAK=1e11
tools=$KD_BUILDDIR/src/tools
corpus=$KD_SRCDIR/input/corpus/kjv-train.txt
echo "not HDF5" > bad.h5
echo "1 2 3" > ids.txt
# expect STATUS LINE CMD...: CMD exits STATUS, the last line of its stderr is exactly LINE,
# and no line names a source file (nor a rank, unless norank=0)
norank=1
expect() {
  want=$1 line=$2
  shift 2
  rc=0
  "$@" > out.txt 2> err.txt || rc=$?
  got=$(grep -v "^Abort(" err.txt | tail -n 1)
  [ "$rc" -eq "$want" ] && [ "$got" = "$line" ] ||
    { cat err.txt; fail "$*: exit $rc, '$got'; expected $want, '$line'"; }
  ! grep -n "(src/" err.txt || fail "$*: a source location in a user message"
  [ $norank = 0 ] || ! grep -n "rank [0-9]*:" err.txt || fail "$*: a rank in a user message"
  echo "ok: $line"
}
expect 2 "kdconvert: nothere.h5: no such weights file" "$tools/kdconvert" to-hf nothere.h5 hf
expect 2 "kdconvert: bad.h5 is not an HDF5 file (expected a kdtrain weights file)" \
  "$tools/kdconvert" to-hf bad.h5 hf
expect 2 "kdlogits: bad.h5 is not an HDF5 file (expected a kdtrain weights file)" \
  "$tools/kdlogits" bad.h5 ids.txt out.npy
expect 2 "kdgen-ids: bad.h5 is not an HDF5 file (expected a kdtrain weights file)" \
  "$tools/kdgen-ids" bad.h5 --ids ids.txt
expect 2 "kdgen-ids: bad.h5 is not an HDF5 file (expected a kdtrain weights file)" \
  $MPIEXEC -n 1 "$tools/kdgen-ids" bad.h5 --ids ids.txt
cat > in.nml << EOF2
&run mode = 'train', steps = 1, out_dir = 'out' /
&student card = 'test-student', init = 'random' /
&data format = 'bytes', train = '$corpus', seq_len = 16 /
&parallel micro_batch = 1, global_batch = 2 /
EOF2
# an I/O failure of the run (its checkpoint directory cannot be made): 1 rank names none
mkdir -p ro && touch ro/file
expect 3 "kdtrain: checkpoint at step 1: cannot create checkpoint%dir $PWD/ro/file/ck: Not a directory" \
  $MPIEXEC -n 1 "$KDTRAIN" in.nml checkpoint%dir="'ro/file/ck'" checkpoint%every=1
# a weights file that every rank refuses alike, on 1 and 2 ranks
for np in 1 2; do
  expect 2 "kdtrain: $PWD/bad.h5 is not an HDF5 file (expected a kdtrain weights file)" \
    $MPIEXEC -n $np "$KDTRAIN" in.nml student%init="'bad.h5'"
done
# the same I/O failure on 2 ranks: the rank that met it is named
norank=0
expect 3 "kdtrain: checkpoint at step 1: cannot create checkpoint%dir $PWD/ro/file/ck: Not a directory (rank 0)" \
  $MPIEXEC -n 2 "$KDTRAIN" in.nml checkpoint%dir="'ro/file/ck'" checkpoint%every=1
echo "all message checks passed"
