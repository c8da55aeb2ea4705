#!/bin/sh
# Hugging Face round trip (validation/hf/hf_roundtrip.py): kdconvert both ways and
# kdtrain's logits against transformers' within 1e-4 in fp32. Needs Python with torch,
# transformers, safetensors and numpy (KD_PYTHON, default python3); skipped (exit 77)
# where they are missing, as in CI.
set -eu
: "${KD_SRCDIR:?}"
py=${KD_PYTHON:-python3}
if ! "$py" -c 'import torch, transformers, safetensors, numpy' > /dev/null 2>&1; then
  echo "SKIP: $py cannot import torch, transformers, safetensors and numpy"
  exit 77
fi
bin="${KD_BUILDDIR:-$KD_SRCDIR}/src/tools"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
OMP_NUM_THREADS=1 "$py" "$KD_SRCDIR/validation/hf/hf_roundtrip.py" "$bin/kdconvert" \
  "$bin/kdlogits" "$tmp"
