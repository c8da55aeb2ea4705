#!/bin/sh
# Hostile checkpoints (doc/checkpoint.md, "What is tested"): validation/faults/ckpt_fuzz.py mutates
# every attribute and dataset of a real checkpoint (type, rank, shape/size, delete, rename,
# swap with an equal-shape one) and truncates the file; every mutant must be refused with
# exit 2 or load exactly, with no crash and no sanitizer report.
set -eu
. "$KD_SRCDIR/validation/lib.sh"
kd_python_or_skip h5py numpy
export KDTRAIN_TEST_GEMM_PEAK=1e10 OMP_NUM_THREADS=1
cat > base.nml <<EOF2
&run mode = 'train', steps = 1, seed = 5, out_dir = 'out' /
&student card = 'test-student', init = 'random' /
&parallel micro_batch = 1, global_batch = 2 /
&data train = '$KD_SRCDIR/input/corpus/kjv-train.txt', seq_len = 8 /
&precision compute = 'fp32' /
&checkpoint every = 1, keep = 1 /
EOF2
"$KDTRAIN" base.nml > run.log 2>&1 || { cat run.log; fail "making the checkpoint"; }
"$KD_PYTHON" "$KD_SRCDIR/validation/faults/ckpt_fuzz.py" "$KDTRAIN" base.nml \
  out/checkpoints/step_00000001.h5 "${KD_FUZZ_CASES:-60}"
