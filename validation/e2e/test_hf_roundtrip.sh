#!/bin/sh
# Hugging Face round trip (validation/ref/hf_roundtrip.py): kdconvert both ways with the
# tokenizer, kdtrain's logits against transformers' within 1e-4 in fp32 for Qwen2, Llama
# (bf16, sharded), Mistral, Llama with llama3 and yarn RoPE scaling, Qwen3 (untied and
# tied, head_dim apart from hidden / heads), Mistral with a sliding window shorter than the
# sequence and Qwen2 with use_sliding_window and max_window_layers (some layers windowed),
# Gemma 3 text (windows shorter than the sequence, local and global RoPE, and with a soft
# cap on the logits) and the text model of a multimodal Gemma 3, and the config.json
# refusals. Needs Python with torch,
# transformers, tokenizers, safetensors, h5py and numpy (KD_PYTHON: make check's test
# environment, see validation/python-env.sh): skipped (exit 77) where they are missing,
# failed when CI is set.
set -eu
. "${KD_SRCDIR:?}/validation/lib.sh"
kd_python_or_skip torch transformers tokenizers safetensors h5py numpy
py=$KD_PYTHON
bin="${KD_BUILDDIR:-$KD_SRCDIR}/src/tools"
"$bin/kdconvert" --help | grep -q 'usage: kdconvert from-hf' || { echo "FAIL: --help"; exit 1; }
OMP_NUM_THREADS=1 "$py" "$KD_SRCDIR/validation/ref/hf_roundtrip.py" "$bin/kdconvert" \
  "$bin/kdlogits" "$KD_SRCDIR/input/corpus/kjv-train.txt" "$tmp"
