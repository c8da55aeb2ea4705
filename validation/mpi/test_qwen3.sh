#!/bin/sh
# Qwen3 (arch 'qwen3': per-head q/k norms, head_dim 12 apart from hidden / heads) through
# the kdtrain binary, a Qwen3 teacher distilled into a Qwen3 student (its single kv head
# replicated under tp = 2, its 3 layers uneven over pp = 2, its tied embedding on both
# ends):
#  - tp 2, pp 2 and tp 2 x pp 2 with ZeRO-1 give the one-rank loss and gradient norm
#    within 1e-5 at each of 3 steps (the q/k norms' gradients summed over TP);
#  - recompute full/selective and offload give bitwise the losses of recompute 'none',
#    in fp32 and in bf16;
#  - --dry-run equals the measured peaks to the byte (q/k norms and their activations
#    counted) on 1, 2 and 4 ranks, fp32 and bf16;
#  - a weights file of head_dim 8 loads with a card that implies it (hidden 16 / 2 heads),
#    not with head_dim 12;
#  - the simulated device (run%device = 'devsim': every op through the backend table, as
#    the CUDA backend requires) gives the CPU's metrics and final weights bit for bit.
set -eu
export OMP_NUM_THREADS=1 # tiny models; up to 4 ranks share the cores
. "${KD_SRCDIR:?}/validation/lib.sh"

kd_family_nml test-qwen3-teacher test-qwen3-student

echo "== a Qwen3 teacher (2 steps)"
kd 1 run%mode=train student%card=test-qwen3-teacher run%steps=2 run%out_dir="'teacher'"

echo "== layouts: the one-rank losses and gradient norms"
kd 1
kd_family_layouts

echo "== memory policies: the same losses, the plan to the byte"
kd_family_memory
kd_plan_exact 2 dpzero parallel%zero=1

echo "== the simulated device, bit for bit"
kd_family_devsim
echo "== head_dim given or implied: the same model"
sed 's/^  head_dim = 12$/  head_dim = 8/' "$KD_SRCDIR/mod/test-qwen3-student.nml" > hd8.nml
grep -v '^  head_dim' hd8.nml > hd0.nml
kd 1 run%mode=train student%card="'hd8.nml'" run%steps=1 run%out_dir="'hd8'"
kd 1 run%mode=eval student%card="'hd0.nml'" student%init="'hd8/final.h5'" \
  data%valid="'$KD_SRCDIR/input/corpus/kjv-valid.txt'" run%out_dir="'hd0'"
rc=0
$MPIEXEC -n 1 "$KDTRAIN" base.nml run%mode=eval student%card="'test-qwen3-student'" \
  student%init="'hd8/final.h5'" data%valid="'$KD_SRCDIR/input/corpus/kjv-valid.txt'" \
  run%out_dir="'hd12'" > err.txt 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -q 'head_dim = 8 in its /config but 12' err.txt \
  || { cat err.txt; fail "head_dim 8 loaded as 12: exit $rc"; }
echo "ok head_dim = 8 and head_dim implied (16 / 2) load the same file; 12 is refused"
echo "all qwen3 checks passed"
