#!/bin/sh
# Generation with a KV cache (src/generate.c, src/tools/kdgen) against transformers' own
# generate(): random models of seven families written by transformers (Qwen2 with biases,
# Qwen3 with q/k norms, Llama with llama3 RoPE, Mistral with a window of 6 shorter than
# prompt + continuation, Gemma 3 with windows, local RoPE and pad id 0, the mixtures of
# experts Qwen3-MoE (a dense layer among sparse ones) and Mixtral; ref/gen_ref.py),
# three prompts of 5, 11 and 1 ids in one batch:
#  - greedy kdgen gives transformers' greedy ids token for token, on 1 rank and on 2
#    tensor-parallel ranks (the vocabulary split: the row never gathered);
#  - sampling (temperature, top-k, top-p) gives the same ids on 1 and 2 ranks, other ids
#    than greedy, and the same again with the same seed;
#  - an id outside the vocabulary and a continuation beyond max_position_embeddings are
#    refused (exit 2).
set -eu
. "${KD_SRCDIR:?}/validation/lib.sh"
kd_python_or_skip torch transformers safetensors
export OMP_NUM_THREADS=1
conv="$KD_BUILDDIR/src/tools/kdconvert" gen="$KD_BUILDDIR/src/tools/kdgen"
NEW=12
fams="qwen2 qwen3 llama3 mistral_sw gemma3 qwen3_moe mixtral"
"$KD_PYTHON" "$KD_SRCDIR/validation/ref/gen_ref.py" "$PWD" $NEW $fams || fail "reference"
sample="--temperature 0.9 --top-k 20 --top-p 0.9 --seed 3"
for f in $fams; do
  "$conv" from-hf "$f/hf" "$f/m.h5" > "$f/convert.txt" 2>&1 || { cat "$f/convert.txt"; fail "$f: kdconvert"; }
  for np in 1 2; do
    $MPIEXEC -n $np "$gen" "$f/m.h5" --ids "$f/prompts.txt" --max-new-tokens $NEW > "$f/g$np.txt" 2> "$f/g$np.err" \
      || { cat "$f/g$np.err"; fail "$f: kdgen on $np rank(s)"; }
    cmp -s "$f/g$np.txt" "$f/greedy.txt" || { paste -d'|' "$f/g$np.txt" "$f/greedy.txt"; fail "$f: greedy on $np rank(s) is not transformers'"; }
    $MPIEXEC -n $np "$gen" "$f/m.h5" --ids "$f/prompts.txt" --max-new-tokens $NEW $sample > "$f/s$np.txt" 2>/dev/null \
      || fail "$f: sampling on $np rank(s)"
  done
  cmp -s "$f/s1.txt" "$f/s2.txt" || { paste -d'|' "$f/s1.txt" "$f/s2.txt"; fail "$f: sampling differs between 1 and 2 ranks"; }
  ! cmp -s "$f/s1.txt" "$f/greedy.txt" || fail "$f: sampling gave the greedy ids"
  "$gen" "$f/m.h5" --ids "$f/prompts.txt" --max-new-tokens $NEW $sample > "$f/s1b.txt" 2>/dev/null
  cmp -s "$f/s1.txt" "$f/s1b.txt" || fail "$f: the same seed gave other ids"
  echo "ok $f: greedy = transformers on 1 and 2 ranks; sampling the same on both; $(tail -n1 "$f/g1.err")"
done
f=qwen2
echo "999999" > bad.txt
rc=0; "$gen" "$f/m.h5" --ids bad.txt > out.txt 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -q "outside the vocabulary" out.txt || { cat out.txt; fail "bad id: rc $rc"; }
rc=0; "$gen" "$f/m.h5" --ids "$f/prompts.txt" --max-new-tokens 100000 > out.txt 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -q "exceed max_position_embeddings" out.txt || { cat out.txt; fail "too long: rc $rc"; }
echo "ok refusals"
