#!/bin/sh
# Input paths that are not regular files (doc/checkpoint.md, "Faults and hostile files"):
# a FIFO (its open would block), a directory, a device (/dev/zero: a read never ends)
# given as data%train, data%valid, teacher%init, student%init, checkpoint%resume or a
# model card must end the run at once with exit 2 and a message naming the key and the
# path, before anything is opened. Each run gets 60 s: a blocked open fails the test.
set -eu
. "$KD_SRCDIR/validation/lib.sh"
export KDTRAIN_MOD_PATH="$KD_SRCDIR/mod" OMP_NUM_THREADS=1
mkfifo fifo fifo.nml
mkdir dir
cat > base.nml << EOF2
&run mode = 'distill', steps = 1, out_dir = 'out' /
&teacher card = 'test-teacher' /
&student card = 'test-student' /
&parallel micro_batch = 1, global_batch = 2 /
&data format = 'bytes', train = '$KD_SRCDIR/input/corpus/kjv-train.txt', seq_len = 16 /
EOF2
ncase=0
# case KEY VALUE WORD...: kdtrain base.nml KEY=VALUE exits 2 within 60 s, its message names
# the key and every WORD, and no out_dir appears
case_() {
  key=$1 val=$2; shift 2
  ncase=$((ncase + 1))
  rc=0
  timeout -k 10 60 $MPIEXEC -n 1 "$KDTRAIN" base.nml "$key='$val'" > log 2>&1 || rc=$?
  [ $rc -ne 124 ] && [ $rc -ne 137 ] || { cat log; fail "$key = '$val': still running after 60 s"; }
  [ $rc -eq 2 ] || { cat log; fail "$key = '$val': exit status $rc, expected 2"; }
  grp=${key%%%*} k=${key#*%}
  for w in "&$grp $k" "$val" "$@"; do
    grep -qF -- "$w" log || { cat log; fail "$key = '$val': the message lacks '$w'"; }
  done
  [ ! -e out ] || fail "$key = '$val': out_dir created"
  echo "  $key = '$val': exit 2: $(grep -v '^Abort' log | head -n 1)"
}
case_ data%train fifo "a FIFO"
case_ data%train dir "a directory"
case_ data%train /dev/zero "a character device"
case_ data%valid fifo "a FIFO"
case_ teacher%init fifo "a FIFO"
case_ teacher%init /dev/zero "a character device"
case_ student%init dir "a directory"
case_ checkpoint%resume /dev/zero "a character device"
case_ checkpoint%resume fifo "a FIFO"
case_ student%card ./fifo.nml "a FIFO"
echo "test_hostile_paths: $ncase non-regular input paths, every one exit 2 at once"
