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

cat > base.nml <<EOF2
&run mode = 'distill', steps = 3, seed = 3, out_dir = 'ref' /
&teacher card = 'test-gemma3-teacher', init = 'teacher/final.h5' /
&student card = 'test-gemma3-student', init = 'random' /
&parallel micro_batch = 1, global_batch = 4 /
&data train = '$KD_SRCDIR/input/corpus/kjv-train.txt', seq_len = 16 /
&loss kind = 'fkl', alpha = 0.5, temperature = 2.0 /
&optim lr = 1e-2, warmup = 1 /
&precision compute = 'fp32' /
EOF2
kd_log=log.txt

echo "== a Gemma 3 teacher (2 steps)"
kd 1 run%mode=train student%card=test-gemma3-teacher run%steps=2 run%out_dir="'teacher'"

echo "== layouts: the one-rank losses and gradient norms"
kd 1
for layout in "2 1 0" "1 2 0" "2 2 1"; do
  set -- $layout
  out="l_$1$2_z$3"
  kd $(($1 * $2)) parallel%tp=$1 parallel%pp=$2 parallel%zero=$3 run%out_dir="'$out'"
  kd_same_metrics ref "$out" "tp=$1 pp=$2 zero=$3" 3 || fail "layout tp=$1 pp=$2 zero=$3"
  echo "ok tp=$1 pp=$2 zero=$3"
done

# cols NAME: step, loss and grad_norm of the step rows
cols() { awk -F, 'NR > 1 && $2 != "" { print $1, $2, $6 }' "$1/metrics.csv"; }
bitwise() { # bitwise A B: the same losses and gradient norms, bit for bit as printed
  cols "$1" > a.txt
  cols "$2" > b.txt
  [ -s a.txt ] && cmp -s a.txt b.txt || { paste a.txt b.txt; fail "$2 differs from $1"; }
  echo "ok $2 = $1"
}
# exact NP NAME [overrides]: run, then the plan equals the measured peaks to the byte
exact() {
  np=$1 name=$2; shift 2
  kd "$np" run%out_dir="'$name'" "$@"
  awk '/^memory peaks per rank/ { on = 1; next } on && $1 ~ /^[0-9]+$/ { print $1, $3, $4, $5, $6, $7, $8 }' \
    log.txt > measured.txt
  if [ "$np" -eq 1 ]; then launch=""; else launch="$MPIEXEC -n $np"; fi
  $launch "$KDTRAIN" --dry-run --ranks "$np" base.nml "$@" > plan.txt 2>&1 || { cat plan.txt; fail "dry run $np $*"; }
  awk '/^  rank/ { on = 1; next } on && $1 ~ /^[0-9]+$/ { print $1, $2, $3, $4, $5, $6, $7 }' \
    plan.txt > predicted.txt
  [ "$(wc -l < measured.txt)" -eq "$np" ] || { cat log.txt; fail "$name: no per-rank memory table"; }
  cmp -s measured.txt predicted.txt || { paste measured.txt predicted.txt; fail "$name: plan != peaks"; }
  echo "ok plan = peaks: $name on $np rank(s) $*"
}

echo "== memory policies: the same losses, the plan to the byte"
exact 1 none
exact 1 full memory%recompute="'full'" memory%recompute_every=2
exact 1 sel memory%recompute="'selective'"
exact 1 off memory%offload=.true. memory%recompute="'full'"
for v in full sel off; do bitwise none $v; done
exact 1 bnone precision%compute="'bf16'"
exact 1 bsel precision%compute="'bf16'" memory%recompute="'selective'" memory%offload=.true.
bitwise bnone bsel
exact 2 tpbf16 parallel%tp=2 precision%compute="'bf16'" memory%recompute="'full'"
exact 2 ppsel parallel%pp=2 memory%recompute="'selective'"
exact 2 dpzero parallel%zero=1
exact 4 tpppzero parallel%tp=2 parallel%pp=2 parallel%zero=1 precision%compute="'bf16'"

echo "== the simulated device, bit for bit"
for p in fp32 bf16; do
  kd 2 parallel%tp=2 run%device="'cpu'" precision%compute="'$p'" run%out_dir="'cpu_$p'"
  kd 2 parallel%tp=2 run%device="'devsim'" precision%compute="'$p'" run%out_dir="'sim_$p'"
  grep -q "backend devsim" log.txt || { cat log.txt; fail "the devsim run did not report its backend"; }
  bitwise "cpu_$p" "sim_$p"
  h5diff "cpu_$p/final.h5" "sim_$p/final.h5" /params /params > /dev/null \
    || fail "$p: final weights differ between cpu and devsim"
done
echo "all gemma3 checks passed"
