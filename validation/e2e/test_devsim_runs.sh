#!/bin/sh
# The device data path without a GPU: runs on the simulated device
# (run%device='devsim', src/backend/devsim.c: the CPU ops on blocks whose addresses the
# host cannot dereference, MPI staged through host buffers as with an MPI that is not
# CUDA-aware) must reproduce the CPU backend's runs bit for bit: every metrics field
# but the timings, the final weights, and the checkpoints. Any host access to backend
# memory outside the op table faults, so passing runs show that the step, the
# gradient reduction, ZeRO-1, the pipeline messages, the vocabulary-parallel loss,
# activation offload, checkpoint save/resume and weight loading go through the op
# table and the staging in comm.c only.
set -eu
export OMP_NUM_THREADS=1 # tiny models; up to 4 ranks share the cores
. "${KD_SRCDIR:?}/validation/lib.sh"

cat > base.nml <<EOF2
&run mode = 'distill', steps = 4, seed = 5, out_dir = 'ref' /
&teacher card = 'test-teacher', init = 'teacher/final.h5' /
&student card = 'test-student', init = 'random' /
&parallel micro_batch = 1, global_batch = 4 /
&data format = 'bytes', train = '$KD_SRCDIR/input/corpus/kjv-train.txt', seq_len = 16,
      valid = '$KD_SRCDIR/input/corpus/kjv-valid.txt', valid_batches = 2, valid_every = 2 /
&loss kind = 'fkl', alpha = 0.5, temperature = 2.0 /
&optim lr = 1e-2, warmup = 1 /
&precision compute = 'fp32' /
EOF2
kd_log=log.txt # kd NP WORD... (validation/lib.sh): its console in log.txt
# metrics rows of steps >= ${lo:-0} without the timing columns (tok_per_s, mfu)
fields() { cut -d, -f1-8,11,12 "$1/metrics.csv" | awk -F, -v lo="${lo:-0}" 'NR > 1 && $1 >= lo'; }
# $1 and $2 ran the same case on cpu and devsim: identical metrics and final weights
same() {
  fields "$1" > a.csv; fields "$2" > b.csv
  [ "$(wc -l < a.csv)" -ge 3 ] || fail "$3: too few metrics rows"
  cmp -s a.csv b.csv || { diff a.csv b.csv | head; fail "$3: metrics differ between cpu and devsim"; }
  [ ! -f "$1/final.h5" ] || h5diff "$1/final.h5" "$2/final.h5" /params /params > /dev/null \
    || fail "$3: final weights differ between cpu and devsim"
  echo "ok $3"
}
# run the case "$@" on both backends, compare
both() { np=$1; name=$2; shift 2
  kd "$np" run%device="'cpu'" run%out_dir="'${name}_cpu'" "$@"
  kd "$np" run%device="'devsim'" run%out_dir="'${name}_sim'" "$@"
  grep -q "backend devsim (host threads per rank [0-9]* (.*)) | MPI staged through pinned host buffers" log.txt \
    || { cat log.txt; fail "$name: the devsim run did not report its backend and host threads"; }
  same "${name}_cpu" "${name}_sim" "$name ($np ranks: $*)"
}

kd_test_teacher

both 1 single
both 4 tp2pp2 parallel%tp=2 parallel%pp=2
both 4 tp2dp2zero parallel%tp=2 parallel%dp=2 parallel%zero=1
both 4 pp2dp2zero parallel%pp=2 parallel%dp=2 parallel%zero=1
both 2 bf16mem parallel%tp=2 precision%compute="'bf16'" memory%recompute="'full'" \
  memory%offload=.true. memory%tiled_mlp=.true. loss%chunk_tokens=5 loss%kind="'jsd'"
both 2 train run%mode="'train'" parallel%pp=2 memory%recompute="'selective'"

echo "== checkpoint on devsim (2,2,1), resume on devsim (1,1,2) with ZeRO-1, eval"
kd 4 run%device="'devsim'" parallel%tp=2 parallel%pp=2 run%steps=2 run%out_dir="'ck'" \
  checkpoint%every=2
kd 2 run%device="'devsim'" parallel%dp=2 parallel%zero=1 run%out_dir="'ck'" checkpoint%every=2
kd 2 run%device="'cpu'" parallel%dp=2 parallel%zero=1 run%out_dir="'ckc'" checkpoint%every=2 \
  checkpoint%resume="'ck/checkpoints/step_00000002.h5'"
lo=3 same ckc ck "resume from a devsim checkpoint"
h5diff ck/checkpoints/step_00000004.h5 ckc/checkpoints/step_00000004.h5 /optim /optim > /dev/null \
  || fail "resumed devsim and cpu runs wrote different optimizer states"
kd 2 run%device="'devsim'" run%mode="'eval'" parallel%tp=2 student%init="'ck/final.h5'" \
  run%out_dir="'ev'"
grep -q "val_loss" log.txt || { cat log.txt; fail "eval on devsim printed no val_loss"; }
echo "all devsim checks passed"
