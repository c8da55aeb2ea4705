#!/bin/sh
# Gemma 3 (arch 'gemma3': (1 + w) RMSNorm, the attention and MLP outputs normed before
# their residual adds, q/k norms, GeGLU, the scaled embedding, query_pre_attn_scalar,
# local and global RoPE bases, soft-capped final logits and attention scores) through the
# kdtrain binary, a Gemma 3 teacher distilled into a Gemma 3 student (its single kv head
# replicated under tp = 2, its 3 layers uneven over pp = 2, its tied embedding on both
# ends):
#  - tp 2, pp 2 and tp 2 x pp 2 with ZeRO-1 give the one-rank loss and gradient norm
#    within 1e-5 at each of 3 steps;
#  - recompute full/selective and offload give bitwise the losses of recompute 'none',
#    in fp32 and in bf16;
#  - --dry-run equals the measured peaks to the byte (the two more norms' inputs and rstd,
#    the capped logits of the loss) on 1, 2 and 4 ranks, fp32 and bf16;
#  - the simulated device (run%device = 'devsim') gives the CPU's metrics and final
#    weights bit for bit.
set -eu
export OMP_NUM_THREADS=1 # tiny models; up to 4 ranks share the cores
. "${KD_SRCDIR:?}/validation/lib.sh"

kd_family_nml test-gemma3-teacher test-gemma3-student

echo "== a Gemma 3 teacher (2 steps)"
kd 1 run%mode=train student%card=test-gemma3-teacher run%steps=2 run%out_dir="'teacher'"

echo "== layouts: the one-rank losses and gradient norms"
kd 1
kd_family_layouts

echo "== memory policies: the same losses, the plan to the byte"
kd_family_memory
kd_plan_exact 2 dpzero parallel%zero=1

echo "== the simulated device, bit for bit"
kd_family_devsim
echo "all gemma3 checks passed"
