#!/bin/sh
# kdprep --teacher-tokenizer / --teacher-weights (cross-tokenizer distillation data): the
# student's and the teacher's ids, masks and answer offsets of chat, prompt/response and text
# data, read back with megatron.core, against each test tokenizer's own encoding and TRL's
# GOLD byte offsets; refusals (validation/ref/kdprep_xtok_check.py).
set -eu
. "${KD_SRCDIR:?}/validation/lib.sh"
kd_python_or_skip tokenizers transformers h5py numpy megatron.core trl.experimental.utils
export KD_SRCDIR
"$KD_PYTHON" "$KD_SRCDIR/validation/ref/kdprep_xtok_check.py" "$tmp" "$KD_PYTHON" \
  "$KD_SRCDIR/src/tools/kdprep.py"
echo "all kdprep cross-tokenizer checks passed"
