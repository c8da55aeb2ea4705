#!/bin/sh
# A mixture-of-experts block of the backend's MoE ops against transformers'
# Qwen3MoeSparseMoeBlock and load_balancing_loss_func (validation/unit/test_moe.c).
set -eu
. "${KD_SRCDIR:?}/validation/lib.sh"
kd_python_or_skip torch transformers
"$KD_PYTHON" "$KD_SRCDIR/validation/ref/moe_ref.py" ref.txt 2> ref.err || { cat ref.err; fail "reference"; }
$MPIEXEC -n 1 "$KD_BUILDDIR/validation/unit/test_moe" ref.txt || fail "test_moe"
