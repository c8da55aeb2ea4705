#!/bin/sh
# The CUDA kernels without a GPU: kdtrain-cuemu (the real src/backend/cuda*.cu on
# the CPU emulation of validation/cuemu) runs `--selftest` with run%device='cuda',
# which compares every op (attention and rope also on packed documents) and two training
# steps with the CPU backend. Once in FP32 on one rank, once in BF16 (precision%compute)
# on one rank, and once on two ranks; each must print "selftest: passed", and pass its
# packed-document lines, and exit 0. Then kdgen's engine on the emulated device
# against the CPU's (below). Skipped (77; a failure when CI is set)
# when configure found no C++ compiler and kdtrain-cuemu was not built. Not a GPU run:
# see emu_rt.cpp.
set -u
kd_here=1 # in the tree root: the quickstart input names its data relative to it
. "${KD_SRCDIR:?}/validation/lib.sh"
emu=${KD_BUILDDIR:?}/validation/cuemu/kdtrain-cuemu
[ -x "$emu" ] || kd_skip "$emu not built (configure found no C++ compiler)"
nml=$KD_SRCDIR/input/quickstart/teacher.nml

# run_one NRANKS PRECISION: one emulated self-test; fails the script unless it passes
run_one() {
  echo "== kdtrain-cuemu --selftest, $1 rank(s), precision%compute='$2'"
  start=$(date +%s)
  out=$($MPIEXEC -n "$1" "$emu" --selftest "$nml" "run%device='cuda'" \
    "precision%compute='$2'" 2>&1)
  rc=$?
  echo "$out"
  echo "(exit $rc, $(($(date +%s) - start)) s)"
  [ $rc -eq 0 ] || fail "kdtrain-cuemu --selftest ($1 ranks, $2) exited $rc"
  echo "$out" | grep -q "selftest: passed" || fail "no 'selftest: passed' ($1 ranks, $2)"
  # the kernels ran on packed documents too (block-diagonal attention, rope at their positions)
  for op in "attention_backward .* docs" "rope_backward (documents)"; do
    echo "$out" | grep -q "$op .*pass" || fail "no passing '$op' line ($1 ranks, $2)"
  done
}

run_one 1 fp32
run_one 1 bf16
run_one 2 fp32
echo "emulated CUDA self-test passed (fp32, bf16, 2 ranks)"

# kdgen's engine on the emulated device (kdgen-ids-cuemu --device cuda: the decode loop of
# src/generate.c on the CUDA backend's ops) gives the CPU engine's ids: greedy in FP32 and
# in BF16 (weights held in BF16) on one rank, sampled (temperature 0.8, top-p 0.9) at tp 2;
# the CPU's BF16 ids are the same at pp 2; a --device word not known is exit 2.
gen=${KD_BUILDDIR}/validation/cuemu/kdgen-ids-cuemu
[ -x "$gen" ] || fail "$gen not built"
ids=$KD_BUILDDIR/src/tools/kdgen-ids
work=$(mktemp -d) || fail "mktemp"
tmp=$work # removed on exit (validation/lib.sh)
echo "== kdgen-ids on the emulated device against the CPU"
# weights that write byte text ("the the ..."; random ones repeat the last prompt byte)
$MPIEXEC -n 1 "$KDTRAIN" "$nml" run%steps=30 run%out_dir="'$work/w'" student%card="'test-teacher'" \
  data%seq_len=32 data%valid="''" parallel%micro_batch=4 parallel%global_batch=4 optim%lr=1e-2 \
  optim%warmup=2 > "$work/train.log" 2>&1 || { cat "$work/train.log"; fail "training the weights"; }
printf '1 2 3 4 5\n10 20 30\n7 8 9 10 11 12 13 14 15 16 17\n' > "$work/p.txt"
# same NAME NP PROGRAM ARGS...: PROGRAM's ids on NP ranks equal $work/NAME.ref
same() {
  name=$1 np=$2 prog=$3; shift 3
  OMP_NUM_THREADS=1 $MPIEXEC -n "$np" "$prog" "$work/w/final.h5" --ids "$work/p.txt" \
    --max-new-tokens 24 "$@" > "$work/$name.out" 2> "$work/$name.err" \
    || { cat "$work/$name.err"; fail "$name: $*"; }
  cmp -s "$work/$name.ref" "$work/$name.out" || { paste "$work/$name.ref" "$work/$name.out"; fail "$name: ids differ"; }
  [ "$(wc -w < "$work/$name.out")" -eq 72 ] || fail "$name: not 72 ids"
  echo "ok $name on $np rank(s): $(tail -1 "$work/$name.err")"
}
"$ids" "$work/w/final.h5" --ids "$work/p.txt" --max-new-tokens 24 --device cpu > "$work/fp32.ref"
[ "$(tr ' ' '\n' < "$work/fp32.ref" | sort -u | wc -l)" -ge 4 ] \
  || { cat "$work/fp32.ref"; fail "the greedy reference has fewer than 4 distinct ids"; }
same fp32 1 "$gen" --device cuda
"$ids" "$work/w/final.h5" --ids "$work/p.txt" --max-new-tokens 24 --device cpu --precision bf16 > "$work/bf16.ref"
same bf16 1 "$gen" --device cuda --precision bf16
cp "$work/bf16.ref" "$work/bf16pp.ref"
same bf16pp 2 "$ids" --device cpu --precision bf16 --pp 2
"$ids" "$work/w/final.h5" --ids "$work/p.txt" --max-new-tokens 24 --temperature 0.8 --top-p 0.9 > "$work/sampled.ref"
same sampled 2 "$gen" --device cuda --tp 2 --temperature 0.8 --top-p 0.9
rc=0
"$ids" "$work/w/final.h5" --ids "$work/p.txt" --device gpu 2> "$work/bad.err" || rc=$?
[ $rc -eq 2 ] && grep -q "expected one of auto, cpu, cuda" "$work/bad.err" || { cat "$work/bad.err"; fail "--device gpu: exit $rc"; }
echo "ok --device gpu: exit 2"
