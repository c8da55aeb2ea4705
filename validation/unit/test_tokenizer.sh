#!/bin/sh
# The C tokenizer (src/tokenizer.h): the Check program test_tokenizer's own cases, then the
# Unicode tables of src/tokenizer_ucd.c against what tokenizers does (ref/tokenizer_ucd.py
# --check), then ids, byte offsets and decodes equal to Hugging Face tokenizers' for test
# tokenizers of every kind, trained on a multilingual corpus (ref/tokenizer_ref.py).
set -eu
. "${KD_SRCDIR:?}/validation/lib.sh"
prog="${KD_BUILDDIR:-$KD_SRCDIR}/validation/unit/test_tokenizer"
$MPIEXEC -n 1 "$prog" || fail "test_tokenizer's own cases"
kd_python_or_skip tokenizers
"$KD_PYTHON" "$KD_SRCDIR/validation/ref/tokenizer_ucd.py" --check "$KD_SRCDIR/src/tokenizer_ucd.c" ||
  fail "src/tokenizer_ucd.c is not what tokenizers gives"
"$KD_PYTHON" "$KD_SRCDIR/validation/ref/tokenizer_ref.py" ref > ref.log 2>&1 || { cat ref.log; fail "reference"; }
$MPIEXEC -n 1 "$prog" ref || fail "the C tokenizer differs from tokenizers"
