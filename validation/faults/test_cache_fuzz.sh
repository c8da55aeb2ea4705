#!/bin/sh
# Hostile teacher caches (doc/cache.md, "What is tested"): validation/faults/cache_fuzz.py makes
# every root attribute an array, an over-long string (a string one also an over-long Python
# str, h5py's variable-length UTF-8), of the wrong class or missing (and
# some out of range), each dataset missing, half length, flattened or retyped, entries with
# token ids out of range and NaN or infinite log-probabilities (checksums resealed), a
# damaged window, a wrong file checksum, truncated files and a file that is not HDF5; a
# one-step distillation from each must end with exit 2 naming the file and the field, with
# no signal, sanitizer report, hang or silent run. The cache with its string attributes
# rewritten as Python str must train as the original.
set -eu
. "${KD_SRCDIR:?}/validation/lib.sh"
kd_python_or_skip h5py numpy
export KDTRAIN_TEST_GEMM_PEAK=1e10 OMP_NUM_THREADS=1
head -c 600 "$KD_SRCDIR/input/corpus/kjv-train.txt" > train.txt # 37 windows of 16
cat > base.nml <<EOF2
&run mode = 'distill', steps = 1, seed = 3, out_dir = 'out' /
&teacher source = 'cache', cache = 'tc.h5' /
&student card = 'test-student', init = 'random' /
&parallel micro_batch = 1, global_batch = 2 /
&data format = 'bytes', train = 'train.txt', seq_len = 16 /
&precision compute = 'fp32' /
EOF2
kd_log=log.txt
kd 1 run%mode=train student%card=test-teacher run%out_dir="'teacher'"
kd 1 run%mode=cache teacher%init="'teacher/final.h5'" teacher%card=test-teacher teacher%cache_k=8
"$KD_PYTHON" "$KD_SRCDIR/validation/faults/cache_fuzz.py" "$KDTRAIN" base.nml tc.h5
