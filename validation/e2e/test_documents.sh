#!/bin/sh
# Conversations, not windows (data%samples, data%pack; src/data_pack.c, the attention kernels'
# document positions): a chat set made by kdprep --chat (conversations of 23 to 292 tokens,
# one to three turns) and random students written by transformers' own classes
# (validation/ref/docs_ref.py):
#  - the validation loss over the whole valid set (valid_batches = 0) with samples =
#    'documents', packed and one document per window, equals transformers' loss of the
#    student on each conversation alone (assistant tokens counted; conversations longer than
#    seq_len + 1 cut there, as kdtrain cuts them) within 1e-5 relative: Qwen2 on 1 rank, tp 2,
#    pp 2, tp 2 x pp 2 and dp 2, and so Mistral with a sliding window of 5 (shorter than every
#    conversation) and Gemma 3 (window 16, soft cap); BF16
#    within 5e-4 of transformers with BF16 weights (measured 7e-6 and 1.2e-5);
#  - the default (samples 'auto', pack .true.) is the documents mode for this masked dataset;
#    samples = 'stream' is not the per-conversation loss (the check can fail);
#  - one distillation step (teacher Mistral, student Qwen2, fkl at temperature 2, alpha 0.5)
#    whose global batch is every window of the set: loss, loss_kd, loss_ce and grad_norm
#    equal PyTorch's step over each conversation alone, within 1e-5 relative, packed and
#    unpacked, on 1 rank and tp 2;
#  - samples = 'documents' on a file without a document index (raw u16) is exit 2 naming it;
#  - on-policy (lambda 1) on a kdprep --chat training set with the default data keys: every
#    row of rollouts.h5 begins with exactly one conversation's prompt (its tokens before the
#    first counted token), the same rows on 1 rank and dp 2;
#  - a packed run resumed at step 3 of 6 on tp 2 continues with the same documents, packing
#    (the docs and pack_eff columns) and losses (1e-5) as the uninterrupted run.
set -eu
. "${KD_SRCDIR:?}/validation/lib.sh"
kd_python_or_skip torch transformers tokenizers numpy
export OMP_NUM_THREADS=1
conv="${KD_BUILDDIR:-$KD_SRCDIR}/src/tools/kdconvert"
T=96
"$KD_PYTHON" "$KD_SRCDIR/validation/ref/docs_ref.py" "$PWD" $T > ref.txt 2>&1 \
  || { cat ref.txt; fail "reference models and losses"; }
grep -v "Loading\|Writing" ref.txt
PATH="$(dirname "$KD_PYTHON"):$PATH" "$KD_PYTHON" "$KD_SRCDIR/src/tools/kdprep.py" \
  --input valid.jsonl --output-prefix valid --tokenizer tok --chat > prep.txt 2>&1 \
  || { cat prep.txt; fail "kdprep --chat"; }
for k in qwen2 mistral_sw gemma3; do
  "$conv" from-hf "hf_$k" "$k.h5" > "conv_$k.txt" 2>&1 || { cat "conv_$k.txt"; fail "from-hf $k"; }
done
cat > base.nml <<EOF
&run mode = 'eval', steps = 1, seed = 3, out_dir = 'ev' /
&student card = 'qwen2.nml', init = 'qwen2.h5' /
&parallel micro_batch = 2, global_batch = 4 /
&data valid = 'valid', format = 'megatron', seq_len = $T, valid_batches = 0 /
&precision compute = 'fp32' /
EOF
kd_log=log.txt
# col DIR N: column N of the last row of DIR/metrics.csv
col() { awk -F, -v c="$2" 'NR > 1 && $c != "" { v = $c } END { print v }' "$1/metrics.csv"; }
# near GOT WANT TOL WHAT: |GOT - WANT| <= TOL |WANT|
near() {
  awk -v g="$1" -v w="$2" -v t="$3" 'BEGIN { d = g - w; if (d < 0) d = -d; exit !(g != "" && d <= t * (w < 0 ? -w : w)) }' \
    || fail "$4: $1, expected $2 (within $3 relative)"
  echo "ok $4: $1 (reference $2)"
}

echo "== validation loss against transformers, each conversation alone"
# evals NP KIND PREC TOL LABEL WORDS...: the whole valid set's loss against want_KIND
evals() {
  np=$1 kind=$2 prec=$3 tol=$4 label=$5; shift 5
  want=$(cut -d' ' -f1 "want_$kind$prec.txt")
  rm -rf ev
  kd "$np" student%card="'$kind.nml'" student%init="'$kind.h5'" "$@"
  near "$(col ev 12)" "$want" "$tol" "$kind $label"
}
evals 1 qwen2 "" 1e-5 "packed, 1 rank" data%samples="'documents'"
nwin=$(sed -n 's/.* \([0-9]*\) windows of 97 tokens (packed).*/\1/p' log.txt | head -1)
grep -q "40 documents, 4355 tokens; document lengths min 23" log.txt && grep -q "valid: [0-9]* windows of 97 tokens (packed), packing efficiency" log.txt \
  || { cat log.txt; fail "no data summary of the packed documents"; }
grep -q "documents longer than a window (seq_len + 1 = 97) are cut" log.txt \
  || { cat log.txt; fail "the cut documents are not reported"; }
evals 1 qwen2 "" 1e-5 "the defaults (auto, packed)"
grep -q "(packed)" log.txt || fail "samples 'auto' did not take documents for a kdprep --chat set"
evals 1 qwen2 "" 1e-5 "one document per window" data%pack=.false.
grep -q "40 windows of 97 tokens (one document each)" log.txt || { cat log.txt; fail "unpacked windows"; }
evals 2 qwen2 "" 1e-5 "packed, tp 2" parallel%tp=2
evals 2 qwen2 "" 1e-5 "packed, pp 2" parallel%pp=2
evals 4 qwen2 "" 1e-5 "packed, tp 2 x pp 2" parallel%tp=2 parallel%pp=2
evals 2 qwen2 "" 1e-5 "packed, dp 2" parallel%dp=2
evals 2 qwen2 "" 1e-5 "unpacked, dp 2" parallel%dp=2 data%pack=.false.
for k in mistral_sw gemma3; do
  evals 1 $k "" 1e-5 "packed"
  evals 1 $k "" 1e-5 "unpacked" data%pack=.false.
  evals 2 $k "" 1e-5 "packed, tp 2" parallel%tp=2
  evals 2 $k "" 1e-5 "packed, pp 2" parallel%pp=2
  evals 4 $k "" 1e-5 "packed, tp 2 x pp 2" parallel%tp=2 parallel%pp=2
  evals 2 $k "" 1e-5 "packed, dp 2" parallel%dp=2
done
evals 1 qwen2 .bf16 5e-4 "bf16, packed" precision%compute="'bf16'"
evals 1 gemma3 .bf16 5e-4 "bf16, packed" precision%compute="'bf16'"
rm -rf ev
kd 1 data%samples="'stream'"
got=$(col ev 12) want=$(cut -d' ' -f1 want_qwen2.txt)
if awk -v g="$got" -v w="$want" 'BEGIN { d = g - w; if (d < 0) d = -d; exit !(d <= 1e-4 * w) }'; then
  fail "stream windows gave the per-conversation loss ($got): the check cannot fail"
fi
echo "ok stream windows differ: $got against $want"

echo "== one distillation step over every conversation against PyTorch"
set -- $(cat want_step.txt)
wl=$1 wkd=$2 wce=$3 wgn=$4
# step NP LABEL WORDS...
step() {
  np=$1 label=$2; shift 2
  rm -rf st
  kd "$np" run%mode="'distill'" run%out_dir="'st'" teacher%card="'mistral_sw.nml'" \
    teacher%init="'mistral_sw.h5'" data%train="'valid'" loss%kind="'fkl'" loss%alpha=0.5 \
    loss%temperature=2.0 parallel%micro_batch=1 "$@"
  near "$(col st 2)" "$wl" 1e-5 "step loss, $label"
  near "$(col st 3)" "$wkd" 1e-5 "step loss_kd, $label"
  near "$(col st 4)" "$wce" 1e-5 "step loss_ce, $label"
  near "$(col st 6)" "$wgn" 1e-5 "step grad_norm, $label"
}
step 1 "one document per window" data%pack=.false. parallel%global_batch=40
step 2 "one document per window, tp 2" data%pack=.false. parallel%global_batch=40 parallel%tp=2
step 1 "packed ($nwin windows)" parallel%global_batch="$nwin"
awk -v e="$(col st 21)" 'BEGIN { exit !(e > 0.9 && e <= 1) }' || fail "pack_eff column: $(col st 21)"
[ "$(col st 20)" = 40 ] || fail "docs column: $(col st 20), expected the 40 documents"
echo "ok metrics: docs 40, pack_eff $(col st 21)"

echo "== a file without a document index"
"$KD_PYTHON" -c "import numpy as np; np.arange(1000, dtype=np.uint16).__mod__(300).astype(np.uint16).tofile('raw.u16')"
st=0
$MPIEXEC -n 1 "$KDTRAIN" base.nml data%valid="'raw.u16'" data%format="'u16'" \
  data%samples="'documents'" > raw.txt 2>&1 || st=$?
[ "$st" = 2 ] && grep -q "raw.u16: has no document index" raw.txt \
  || { cat raw.txt; fail "documents of a raw stream: status $st"; }
echo "ok raw stream with samples 'documents': exit 2 naming the file"
echo "== on-policy with the default data keys: every rollout begins with one conversation's prompt"
PATH="$(dirname "$KD_PYTHON"):$PATH" "$KD_PYTHON" "$KD_SRCDIR/src/tools/kdprep.py" \
  --input train.jsonl --output-prefix train --tokenizer tok --chat > prep.txt 2>&1 \
  || { cat prep.txt; fail "kdprep --chat (train)"; }
cat > onp.nml <<EOF
&run mode = 'distill', steps = 2, seed = 9, out_dir = 'op1' /
&teacher card = 'mistral_sw.nml', init = 'mistral_sw.h5' /
&student card = 'qwen2.nml', init = 'qwen2.h5' /
&parallel micro_batch = 1, global_batch = 4 /
&data train = 'train', format = 'megatron', seq_len = $T /
&loss kind = 'rkl', onpolicy = 1.0 /
&generate max_new_tokens = 12, temperature = 1.0, save = .true. /
&optim lr = 1e-3, warmup = 1 /
&precision compute = 'fp32' /
EOF
kd_nml=onp.nml kd 1
grep -q "train .*train: [0-9]* windows of 97 tokens (packed)" log.txt || fail "on-policy data not packed"
kd_nml=onp.nml kd 2 run%out_dir="'op2'" parallel%dp=2
"$KD_PYTHON" - << 'PY' || fail "rollouts.h5 rows"
import warnings, logging
warnings.simplefilter("ignore"); logging.disable(logging.WARNING)
import h5py, numpy as np
from megatron.core.datasets.indexed_dataset import IndexedDataset
ids, mask = IndexedDataset("train"), IndexedDataset("train_mask")
prompts = set()
for i in range(len(ids)):
    m = np.asarray(mask[i])
    prompts.add(tuple(int(x) for x in np.asarray(ids[i])[: int(np.argmax(m != 0))]))
rows = {}
for run in ("op1", "op2"):
    with h5py.File(f"{run}/rollouts.h5", "r") as f:
        tok, pl = f["tokens"][()], f["prompt_len"][()]
    assert len(tok) == 8, f"{run}: {len(tok)} rows, expected 2 steps x 4"
    for r in range(len(tok)):
        p = tuple(int(x) for x in tok[r, : pl[r]])
        assert p in prompts, f"{run} row {r}: its first {pl[r]} tokens are no conversation's prompt"
    rows[run] = tok
assert (rows["op1"] == rows["op2"]).all(), "1 rank and dp 2 generated different rows"
print(f"ok on-policy: {len(rows['op1'])} rows each on 1 rank and dp 2, identical, every one a "
      f"conversation's prompt ({len(prompts)} conversations) + continuation")
PY

echo "== resume mid-epoch on another layout: the same windows"
cat > res.nml <<EOF
&run mode = 'train', steps = 6, seed = 4, out_dir = 'ra' /
&student card = 'qwen2.nml', init = 'qwen2.h5' /
&parallel micro_batch = 1, global_batch = 4 /
&data train = 'train', format = 'megatron', seq_len = $T /
&optim lr = 1e-3, warmup = 1 /
&precision compute = 'fp32' /
&checkpoint every = 3 /
EOF
kd_nml=res.nml kd 1
cp -r ra rb
rm -f rb/checkpoints/step_00000006.h5 rb/metrics.csv
echo step_00000003.h5 > rb/checkpoints/latest
kd_nml=res.nml kd 2 run%out_dir="'rb'" parallel%tp=2
grep -q "resumed from .*step_00000003.h5 at step 3" log.txt || fail "no resume at step 3"
awk -F, 'NR > 1 && $1 > 3 && $2 != "" { print $1, $2, $20, $21 }' ra/metrics.csv > a.rows
awk -F, 'NR > 1 && $1 > 3 && $2 != "" { print $1, $2, $20, $21 }' rb/metrics.csv > b.rows
[ "$(wc -l < a.rows)" = 3 ] || { cat a.rows; fail "uninterrupted run rows"; }
paste a.rows b.rows | awk '{ d = $2 - $6; if (d < 0) d = -d
  if ($1 != $5 || $3 != $7 || $4 != $8 || d > 1e-5 * $2) { print "step " $1 ": " $0; bad = 1 } }
  END { exit bad }' || fail "resumed on tp 2: other windows or losses"
echo "ok resume at step 3 on tp 2: steps 4-6 the same documents, packing and losses (1e-5)"
echo "== a teacher cache of packed documents: the live step's numbers; other samples refused"
cat > tc.nml <<EOF
&run mode = 'distill', steps = 2, seed = 4, out_dir = 'live' /
&teacher card = 'mistral_sw.nml', init = 'mistral_sw.h5', cache = 'tc.h5', cache_k = 400 /
&student card = 'qwen2.nml', init = 'qwen2.h5' /
&parallel micro_batch = 1, global_batch = 4 /
&data train = 'train', format = 'megatron', seq_len = $T /
&loss kind = 'fkl', temperature = 1.0 /
&optim lr = 1e-3, warmup = 1 /
&precision compute = 'fp32' /
EOF
kd_nml=tc.nml kd 1
kd_nml=tc.nml kd 1 run%mode="'cache'"
h5dump -a samples tc.h5 | grep -q '"documents, packed"' || fail "the cache does not record its samples"
kd_nml=tc.nml kd 1 teacher%source="'cache'" run%out_dir="'cached'"
awk -F, 'NR > 1 && $2 != "" { print $1, $2, $6 }' live/metrics.csv > a.rows
awk -F, 'NR > 1 && $2 != "" { print $1, $2, $6 }' cached/metrics.csv > b.rows
paste a.rows b.rows | awk '{ for (c = 2; c <= 3; c++) { d = $c - $(c + 3); if (d < 0) d = -d
  if (d > 1e-4 * $c) { print "step " $1 ": " $0; bad = 1 } } } END { exit bad }' \
  || fail "distillation from the documents cache differs from the live teacher"
st=0
$MPIEXEC -n 1 "$KDTRAIN" tc.nml teacher%source="'cache'" run%out_dir="'c2'" \
  data%samples="'stream'" > c2.txt 2>&1 || st=$?
[ "$st" = 2 ] && grep -q "field 'samples' is 'documents, packed' in the cache, 'stream' for this run" c2.txt \
  || { cat c2.txt; fail "a stream run on a documents cache: status $st"; }
echo "ok teacher cache: documents recorded, the live losses (1e-4), a stream run refused (exit 2)"
echo "all document checks passed"
