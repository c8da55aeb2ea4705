#!/bin/sh
# Mixture-of-experts models (validation/ref/moe_models.py): random Qwen3-MoE (a dense layer
# among sparse ones; norm_topk_prob both ways) and Mixtral (windowed) models written by
# transformers' own classes, per expert and fused -> kdconvert from-hf -> kdlogits within
# 1e-4 of transformers (fp32) -> to-hf -> transformers loads the same tensors and logits;
# config.json values kdtrain does not compute are refused. Needs Python with torch,
# transformers, safetensors, h5py and numpy (KD_PYTHON): skipped (exit 77) where they are
# missing, failed under CI.
set -eu
. "${KD_SRCDIR:?}/validation/lib.sh"
kd_python_or_skip torch transformers safetensors h5py numpy
bin="${KD_BUILDDIR:-$KD_SRCDIR}/src/tools"
OMP_NUM_THREADS=1 "$KD_PYTHON" "$KD_SRCDIR/validation/ref/moe_models.py" "$bin/kdconvert" \
  "$bin/kdlogits" "$PWD"
