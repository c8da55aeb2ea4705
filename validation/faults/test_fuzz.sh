#!/bin/sh
# Hostile checkpoints (doc/checkpoint.md, "What is tested"): validation/faults/ckpt_fuzz.py mutates
# every attribute and dataset of a real checkpoint (type, rank, shape/size, delete, rename,
# swap with an equal-shape one) and truncates the file; every mutant must be refused with
# exit 2 or load exactly, with no crash and no sanitizer report; then every attribute value and
# scalar dataset changed in place, and the run's namelist replaced by a 300 x 300 uint8 array,
# must be exit 2 naming the object (format 1.2: all inside checksums). The same for three
# changes to a weights file (final.h5).
set -eu
. "$KD_SRCDIR/validation/lib.sh"
kd_python_or_skip h5py numpy
export KDTRAIN_TEST_GEMM_PEAK=1e10 OMP_NUM_THREADS=1
cat > base.nml <<EOF2
&run mode = 'train', steps = 1, seed = 5, out_dir = 'out' /
&student card = 'test-student', init = 'random' /
&parallel micro_batch = 1, global_batch = 2 /
&data format = 'bytes', train = '$KD_SRCDIR/input/corpus/kjv-train.txt', seq_len = 8 /
&precision compute = 'fp32' /
&checkpoint every = 1, keep = 1 /
EOF2
"$KDTRAIN" base.nml > run.log 2>&1 || { cat run.log; fail "making the checkpoint"; }
"$KD_PYTHON" "$KD_SRCDIR/validation/faults/ckpt_fuzz.py" "$KDTRAIN" base.nml \
  out/checkpoints/step_00000001.h5 "${KD_FUZZ_CASES:-60}"

# A weights file (final.h5) whose run namelist is replaced by a 300 x 300 uint8 array, or has
# one character changed, or whose card text is changed (format 1.2: inside checksums): the
# student init that names it is refused with exit 2 naming the object.
weights_case() { # NAME PYTHON-EDIT NEEDLE
  cp out/final.h5 "$1.h5"
  "$KD_PYTHON" -c "import h5py, numpy as np, sys
f = h5py.File(sys.argv[1], 'r+')
$2" "$1.h5"
  st=0
  "$KDTRAIN" base.nml "student%init='$1.h5'" "run%out_dir='w_$1'" \
    "checkpoint%every=0" > "$1.log" 2>&1 || st=$?
  [ "$st" = 2 ] || { cat "$1.log"; fail "weights file $1: exit $st, expected 2"; }
  grep -q "$3" "$1.log" || { cat "$1.log"; fail "weights file $1: no '$3' in the message"; }
}
weights_case namelist_array "del f['config/namelist']
f['config/namelist'] = np.zeros((300, 300), dtype=np.uint8)" \
  "namelist_array.h5: /config/namelist is not a scalar string dataset"
weights_case namelist_text "d = f['config/namelist']; b = bytearray(d[()]); b[5] ^= 1; d[()] = bytes(b)" \
  "/config/namelist fails its checksum"
weights_case card_text "f['config'].attrs.modify('card', np.bytes_(f['config'].attrs['card'][:-1] + b' '))" \
  "/config attribute 'card' fails its checksum"
echo "test_fuzz: 3 changed weights files refused, each naming the object"
