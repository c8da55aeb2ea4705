#!/bin/sh
# Generation with a KV cache (src/generate.c, the engine src/tools/kdgen-ids) against
# transformers' own generate(): random models of seven families written by transformers
# (Qwen2 with biases, Qwen3 with q/k norms, Llama with llama3 RoPE, Mistral with a window of
# 6 shorter than prompt + continuation, Gemma 3 with windows, local RoPE and pad id 0, the
# mixtures of experts Qwen3-MoE (a dense layer among sparse ones) and Mixtral;
# ref/gen_ref.py), three prompts of 5, 11 and 1 ids in one batch, 48 new ids each:
#  - greedy gives transformers' greedy ids token for token on 1 rank, 2 tensor-parallel
#    ranks (the vocabulary split: the row never gathered) and 2 pipeline stages;
#  - an end id stops each prompt at its first occurrence and the others go on with
#    transformers' ids (an ended sample leaves the decode batch);
#  - sampling (temperature 0.8, top-p 0.9, a fixed seed) gives the same ids on 1 rank,
#    TP 2, PP 2 and DP 2 (and TP 2 x PP 2 for Qwen2), other ids than greedy, and the same
#    again with the same seed (the dense families; the MoE ones: greedy only);
#  - an id outside the vocabulary, a continuation beyond max_position_embeddings and a
#    layout that does not fit are refused (exit 2).
set -eu
. "${KD_SRCDIR:?}/validation/lib.sh"
kd_python_or_skip torch transformers safetensors
export OMP_NUM_THREADS=1
conv="$KD_BUILDDIR/src/tools/kdconvert" gen="$KD_BUILDDIR/src/tools/kdgen-ids"
NEW=48
fams="qwen2 qwen3 llama3 mistral_sw gemma3 qwen3_moe mixtral"
"$KD_PYTHON" "$KD_SRCDIR/validation/ref/gen_ref.py" "$PWD" $NEW $fams || fail "reference"
sample="--temperature 0.8 --top-p 0.9 --seed 3"
# run FAMILY NAME NP LAYOUT...: kdgen-ids on NP ranks into FAMILY/NAME.txt
run() {
  f=$1 name=$2 np=$3
  shift 3
  if [ "$np" -eq 1 ]; then launch=""; else launch="$MPIEXEC -n $np"; fi
  $launch "$gen" "$f/m.h5" --ids "$f/prompts.txt" --max-new-tokens $NEW "$@" > "$f/$name.txt" \
    2> "$f/$name.err" || { cat "$f/$name.err"; fail "$f: kdgen-ids $name"; }
}
same() { # same FAMILY A B WHAT
  cmp -s "$1/$2.txt" "$1/$3.txt" || { paste -d'|' "$1/$2.txt" "$1/$3.txt"; fail "$1: $4"; }
}
for f in $fams; do
  "$conv" from-hf "$f/hf" "$f/m.h5" > "$f/convert.txt" 2>&1 || { cat "$f/convert.txt"; fail "$f: kdconvert"; }
  run $f g1 1
  run $f gtp 2 --tp 2
  run $f gpp 2 --pp 2
  for g in g1 gtp gpp; do same $f $g greedy "greedy $g is not transformers'"; done
  case $f in *moe | mixtral)
    echo "ok $f: greedy = transformers on 1 rank, tp 2, pp 2; $(tail -n1 "$f/g1.err")"
    continue ;;
  esac
  # the 3rd greedy id of prompt 1 as an end id: every prompt stops at its first one
  eos=$(awk 'NR == 1 { print $3 }' "$f/greedy.txt")
  awk -v e="$eos" '{ s = ""; for (i = 1; i <= NF; i++) { s = s (i > 1 ? " " : "") $i; if ($i == e) break } print s }' \
    "$f/greedy.txt" > "$f/geos_ref.txt"
  run $f geos 2 --pp 2 --eos "$eos"
  same $f geos geos_ref "an end id $eos: not transformers' ids up to it"
  run $f s1 1 $sample
  run $f stp 2 --tp 2 $sample
  run $f spp 2 --pp 2 $sample
  run $f sdp 2 --dp 2 $sample
  for s in stp spp sdp; do same $f s1 $s "sampling on $s differs from 1 rank"; done
  ! cmp -s "$f/s1.txt" "$f/greedy.txt" || fail "$f: sampling gave the greedy ids"
  run $f s1b 1 $sample
  same $f s1 s1b "the same seed gave other ids"
  echo "ok $f: greedy = transformers on 1 rank, tp 2, pp 2 (an end id too); sampling the same on 1, tp 2, pp 2, dp 2; $(tail -n1 "$f/g1.err")"
done
f=qwen2
run $f s4 4 --tp 2 --pp 2 $sample
same $f s1 s4 "sampling on tp 2 x pp 2 differs from 1 rank"
echo "ok $f: sampling the same on tp 2 x pp 2"
echo "999999" > bad.txt
rc=0; "$gen" "$f/m.h5" --ids bad.txt > out.txt 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -q "outside the vocabulary" out.txt || { cat out.txt; fail "bad id: rc $rc"; }
rc=0; "$gen" "$f/m.h5" --ids "$f/prompts.txt" --max-new-tokens 100000 > out.txt 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -q "exceed max_position_embeddings" out.txt || { cat out.txt; fail "too long: rc $rc"; }
rc=0; "$gen" "$f/m.h5" --ids "$f/prompts.txt" --pp 3 > out.txt 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -q "pp=3" out.txt || { cat out.txt; fail "layout: rc $rc"; }
echo "ok refusals"
