#!/bin/sh
# kdprep (src/tools/kdprep.py): text / JSONL / prompt-response / chat JSONL -> Megatron
# indexed datasets read back by an independent reader with the tokenizer's own ids and
# exact response masks (validation/ref/kdprep_check.py). Needs Python with tokenizers,
# transformers, h5py, numpy ($KD_PYTHON, default python3): skipped without them, a failure
# when CI is set.
set -eu
. "${KD_SRCDIR:?}/validation/lib.sh"
py=${KD_PYTHON:-python3}
if ! "$py" -c 'import tokenizers, transformers, h5py, numpy' 2> /dev/null; then
  [ -n "${CI:-}" ] && fail "CI: $py lacks tokenizers/transformers/h5py/numpy"
  echo "SKIP: $py lacks tokenizers/transformers/h5py/numpy"
  exit 77
fi
export KD_SRCDIR
"$py" "$KD_SRCDIR/validation/ref/kdprep_check.py" "$tmp" "$py" "$KD_SRCDIR/src/tools/kdprep.py"
echo "all kdprep checks passed"
