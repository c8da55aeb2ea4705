#!/bin/sh
# Cross-tokenizer distillation's math (src/uld.h, Check program test_uld): its own cases, then
# against TRL's own GOLD ULDLoss (ref/uld_ref.py): the byte-offset alignment, the vocabulary
# matching of two trained tokenizers, the plain and hybrid losses and their gradients.
set -eu
. "${KD_SRCDIR:?}/validation/lib.sh"
prog="${KD_BUILDDIR:-$KD_SRCDIR}/validation/unit/test_uld"
$MPIEXEC -n 1 "$prog" || fail "test_uld's own cases"
kd_python_or_skip torch transformers tokenizers trl
"$KD_PYTHON" "$KD_SRCDIR/validation/ref/uld_ref.py" . > ref.log 2>&1 || { cat ref.log; fail "reference"; }
$MPIEXEC -n 1 "$prog" . || fail "uld differs from TRL's GOLD"
